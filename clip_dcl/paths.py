"""Where a command will write, checked before the work that writes there (``--logs``, ``--output``).

Writability is tested by creating a file: permission bits say nothing for root, nor for a read-only mount.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Optional


def _try_write(folder: Path) -> Optional[str]:
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        return f"cannot write in {str(folder)!r} ({e.strerror or e})"
    return None


def folder_problem(folder: str | os.PathLike) -> Optional[str]:
    """Why files cannot be written under ``folder`` (created if missing: the nearest of its parents that
    exists must be a folder one can write in), or None when they can."""
    path = Path(os.path.abspath(folder))
    for candidate in (path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                what = "" if candidate == path else f" (so {str(path)!r} cannot be created)"
                return f"{str(candidate)!r} is a file, not a folder{what}"
            return _try_write(candidate)
    return None  # pragma: no cover (the root exists)


def output_file_problem(path: str | os.PathLike) -> Optional[str]:
    """Why ``path`` cannot be written as a file (its folders created if missing), or None when it can."""
    target = Path(path)
    if target.is_dir():
        return f"{str(target)!r} is a folder; give a file name (e.g. {str(target / 'results.json')!r})"
    if target.exists():
        try:
            with open(target, "ab"):  # opened for appending and closed: the file is not changed
                pass
        except OSError as e:
            return f"cannot write {str(target)!r} ({e.strerror or e})"
        return None
    return folder_problem(target.parent if str(target.parent) else ".")
