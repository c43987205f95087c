"""Figures of the reports: matplotlib without a display, and one way to write a PNG."""

from __future__ import annotations

import os
from pathlib import Path


def pyplot():
    """``matplotlib.pyplot`` on the file-only ``Agg`` backend: benchmarks run on machines with no
    display, where an interactive backend would fail or open windows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: os.PathLike, title: str = "", title_size=None, dpi: int = 110) -> Path:
    """Title, lay out and write a matplotlib figure as a PNG (folders created), then free it."""
    plt = pyplot()
    if title:
        fig.suptitle(title, fontsize=title_size)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
