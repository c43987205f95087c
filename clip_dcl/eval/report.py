"""Readable tables and JSON files for evaluation results.

The JSON an evaluation writes is flat: ``metric -> value`` at the top level, plus the keys
``model`` (name and checkpoint), ``data`` (paths and sizes) and ``settings`` (every option that
changes a number), and for the few-shot probe ``details`` (one record per data set and seed).
NaN (e.g. top-5 with fewer than 5 classes) is written as ``NaN``, which Python's ``json`` reads back.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Iterable, Sequence

RESERVED_KEYS = ("model", "data", "settings", "details")


def _fmt(v) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.4f}"
    return str(v)


def format_table(headers: Sequence[str], rows: Iterable[Sequence]) -> str:
    """A plain monospace table: first column left-aligned, the others right-aligned."""
    rows = [[_fmt(v) for v in r] for r in rows]
    widths = [max([len(str(h))] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = [line([str(h) for h in headers]), "  ".join("-" * w for w in widths)]
    out.extend(line(r) for r in rows)
    return "\n".join(out)


def metrics_table(metrics: dict[str, float]) -> str:
    """Two columns, metric and value, in the dict's order."""
    return format_table(["metric", "value"], [[k, v] for k, v in metrics.items()])


def retrieval_table(metrics: dict[str, float], ks: Sequence[int] = (1, 5, 10)) -> str:
    """Rows image->text and text->image; columns R@k, mean and median rank."""
    rows = []
    for prefix, label in (("image_to_text", "image -> text"), ("text_to_image", "text -> image")):
        rows.append([label] + [metrics[f"{prefix}_R@{k}"] for k in ks]
                    + [metrics[f"{prefix}_mean_rank"], metrics[f"{prefix}_median_rank"]])
    return format_table(["direction"] + [f"R@{k}" for k in ks] + ["mean rank", "median rank"], rows)


FEWSHOT_COLUMNS = ("linear_probe", "linear_probe_last", "linear_probe_toolkit", "mean_classifier", "zeroshot")


def fewshot_table(metrics: dict[str, float]) -> str:
    """One row per data set (and ``average``), one column per score family."""
    names = []
    for key in metrics:
        name = key.rsplit("/", 1)[0]
        if "/" in key and name not in names and name != "average":
            names.append(name)
    names.append("average")
    rows = [[n] + [metrics.get(f"{n}/{c}", float("nan")) for c in FEWSHOT_COLUMNS] for n in names]
    headers = ["data set", "probe", "probe (last)", "probe (best epoch)", "mean classifier", "zero-shot"]
    return format_table(headers, rows)


def result_document(metrics: dict[str, float], model: dict, data: dict, settings: dict,
                    details=None) -> dict:
    """The flat JSON document: metrics at the top level plus the reserved keys."""
    clash = [k for k in metrics if k in RESERVED_KEYS]
    if clash:
        raise ValueError(f"metric names {clash} clash with the reserved keys {RESERVED_KEYS}")
    doc = dict(metrics)
    doc.update(model=model, data=data, settings=settings)
    if details is not None:
        doc["details"] = details
    return doc


def _finite(value):
    """``value`` with every NaN or infinite float replaced by ``None`` (JSON ``null``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy / torch scalars
        return _finite(value.item())
    return value


def write_json(path: str | os.PathLike, document: dict) -> Path:
    """Write ``document`` (see :func:`result_document`) to ``path``, creating folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # NaN and infinities (e.g. acc5 with fewer than 5 classes) are not JSON: strict parsers reject them.
    path.write_text(json.dumps(_finite(document), indent=2, default=str, allow_nan=False) + "\n")
    return path
