"""Readable tables and JSON files for evaluation results.

The JSON an evaluation writes is flat: ``metric -> value`` at the top level, plus the keys
``model`` (name and checkpoint), ``data`` (paths and sizes) and ``settings`` (every option that
changes a number), ``skipped`` (the samples left out, counted by cause: ``{"empty caption": 1, ...}``,
empty when none), and for the few-shot probe ``details`` (one record per data set and seed).
NaN (e.g. top-5 with fewer than 5 classes) is written as ``NaN``, which Python's ``json`` reads back.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Iterable, Sequence

RESERVED_KEYS = ("model", "data", "settings", "details", "skipped")


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
    """Rows image->text and text->image; columns R@k for each k of ``ks``, mean and median rank."""
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
    headers = ["data set", "probe", "probe (last epoch)", "probe (best test epoch, as ELEVATER reports)",
               "mean classifier", "zero-shot"]
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


# ----------------------------------------------------------------------------------------------
# CLIP_benchmark's result files
# ----------------------------------------------------------------------------------------------
#: Our subcommand -> CLIP_benchmark's task name and the metric keys it writes.
BENCHMARK_TASKS = {"retrieval": "zeroshot_retrieval", "zeroshot": "zeroshot_classification"}


def _benchmark_metrics(task: str, metrics: dict[str, float]) -> dict[str, float]:
    if task == "retrieval":
        return {k: v for k, v in metrics.items() if k.startswith(("image_retrieval_recall@", "text_retrieval_recall@"))}
    keys = ("mean_average_precision",) if "mean_average_precision" in metrics else \
        ("acc1", "acc5", "mean_per_class_recall")
    return {k: metrics[k] for k in keys}


def benchmark_dataset_name(data) -> str:
    """``wds/<name>`` for a data set in CLIP_benchmark's webdataset layout (its ``--dataset`` form),
    else the data's file or folder name."""
    from ..data.evalsets import benchmark_layout_root

    if isinstance(data, (str, os.PathLike)):
        found = benchmark_layout_root(data)
        if found is not None:
            return f"wds/{found[0].resolve().name}"
        return Path(data).resolve().stem
    return type(data).__name__


def benchmark_document(task: str, metrics: dict[str, float], model: dict, data, dataset_name: str | None = None,
                       precision: str = "fp32", language: str = "en") -> dict:
    """CLIP_benchmark's per-task result JSON (``dataset``, ``model``, ``pretrained``, ``task``,
    ``metrics``, ``language``; what its ``clip_benchmark build`` merges into a CSV) with the metrics
    under its keys, plus ``precision``: CLIP_benchmark encodes under autocast by default, we at
    the precision named here."""
    if task not in BENCHMARK_TASKS:
        raise ValueError(f"CLIP_benchmark's format covers {list(BENCHMARK_TASKS)}, not {task!r}")
    return {
        "dataset": dataset_name or benchmark_dataset_name(data),
        "model": model.get("name"),
        "pretrained": model.get("checkpoint") or model.get("pretrained"),
        "task": BENCHMARK_TASKS[task],
        "metrics": _benchmark_metrics(task, metrics),
        "language": language,
        "precision": precision,
    }


def benchmark_output_path(our_output: str | os.PathLike, doc: dict) -> Path:
    """Beside ``our_output``, CLIP_benchmark's default file name
    ``{dataset}_{pretrained}_{model}_{language}_{task}.json`` ('/' in names made '_', a weights
    path reduced to its file name, as CLIP_benchmark does)."""
    def slug(v) -> str:
        return str(v).replace("/", "_").replace(os.sep, "_")

    pretrained = doc["pretrained"]
    pretrained = Path(str(pretrained).rstrip("/")).name if pretrained and os.path.exists(str(pretrained)) else pretrained
    name = f"{slug(doc['dataset'])}_{slug(pretrained)}_{slug(doc['model'])}_{doc['language']}_{doc['task']}.json"
    return Path(our_output).parent / name
