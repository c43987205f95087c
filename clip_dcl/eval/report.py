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
#: Our subcommand -> CLIP_benchmark's task name.
BENCHMARK_TASKS = {"retrieval": "zeroshot_retrieval", "zeroshot": "zeroshot_classification", "fewshot": "linear_probe"}


def _retrieval_keys(metrics: dict[str, float]) -> dict[str, float]:
    """Per k, ``image_retrieval_recall@k`` then ``text_retrieval_recall@k``, CLIP_benchmark's order."""
    ks = [k.split("@", 1)[1] for k in metrics if k.startswith("image_retrieval_recall@")]
    return {f"{d}_retrieval_recall@{k}": metrics[f"{d}_retrieval_recall@{k}"] for k in ks for d in ("image", "text")}


def _classification_keys(metrics: dict[str, float]) -> dict[str, float]:
    keys = ("mean_average_precision",) if "mean_average_precision" in metrics else \
        ("acc1", "acc5", "mean_per_class_recall")
    return {k: metrics[k] for k in keys}


#: CLIP_benchmark task -> the metric keys it writes, taken from our flat metrics.
BENCHMARK_TASK_METRICS = {"zeroshot_retrieval": _retrieval_keys, "zeroshot_classification": _classification_keys}

#: ELEVATER metric -> the key of a ``linear_probe`` result (CLIP_benchmark's ``lp_`` names where it has one).
LINEAR_PROBE_KEYS = {"accuracy": "lp_acc1", "mean_per_class": "lp_mean_per_class_recall",
                     "11point_mAP": "lp_mean_average_precision_11point", "roc_auc": "lp_roc_auc"}


def benchmark_dataset_name(data) -> str:
    """CLIP_benchmark's ``--dataset`` name for ``data``: ``wds/<name>`` for its webdataset layout,
    where a folder ``wds_<name>`` (how its shards are published) is ``wds/<name>``; else the data's
    file or folder name."""
    from ..data.evalsets.benchmark import benchmark_layout_root

    if isinstance(data, (str, os.PathLike)):
        found = benchmark_layout_root(data)
        if found is not None:
            folder = found[0].resolve().name
            return f"wds/{folder[len('wds_'):] if folder.startswith('wds_') and len(folder) > 4 else folder}"
        return Path(data).resolve().stem
    return type(data).__name__


def benchmark_pretrained(model: dict) -> str:
    """``pretrained`` as CLIP_benchmark writes it, never null: the checkpoint path, else the
    OpenCLIP tag or weights file, else the folder of a ``local-dir:`` model, else ``none``
    (randomly initialised weights)."""
    for key in ("checkpoint", "pretrained"):
        if model.get(key):
            return str(model[key])
    name = str(model.get("name") or "")
    if name.startswith("local-dir:"):
        return name[len("local-dir:"):]
    return "none"


def benchmark_document(task: str, metrics: dict[str, float], model: dict, data, dataset_name: str | None = None,
                       precision: str = "fp32", language: str = "en") -> dict:
    """CLIP_benchmark's per-task result JSON (``dataset``, ``model``, ``pretrained``, ``task``,
    ``metrics``, ``language``; what its ``clip_benchmark build`` merges into a CSV) with the metrics
    under its keys, plus ``precision``: CLIP_benchmark encodes under autocast by default, we at
    the precision named here."""
    if task not in ("retrieval", "zeroshot"):
        raise ValueError(f"CLIP_benchmark's format covers retrieval and zeroshot here (fewshot: "
                         f"fewshot_benchmark_documents), not {task!r}")
    name = BENCHMARK_TASKS[task]
    return {
        "dataset": dataset_name or benchmark_dataset_name(data),
        "model": model.get("name"),
        "pretrained": benchmark_pretrained(model),
        "task": name,
        "metrics": BENCHMARK_TASK_METRICS[name](metrics),
        "language": language,
        "precision": precision,
    }


def fewshot_benchmark_documents(metrics: dict[str, float], model: dict, datasets: dict[str, dict], settings: dict,
                                probes: list[dict], precision: str = "fp32", language: str = "en") -> list[dict]:
    """One CLIP_benchmark ``linear_probe`` result per few-shot data set.

    ``metrics``: the probe score (mean over seeds at the run's epoch selection) under
    :data:`LINEAR_PROBE_KEYS` of the set's ELEVATER metric; ``fewshot_k``, ``seeds``, ``epochs`` (of
    the final run), the chosen ``learning_rate`` / ``weight_decay`` per seed, ``metric`` (ELEVATER's)
    and ``epoch_selection``. The protocol is ELEVATER's, not CLIP_benchmark's (see
    docs/evaluation.md)."""
    docs = []
    for name, facts in datasets.items():
        mine = [p for p in probes if p["dataset"] == name]
        docs.append({
            "dataset": name,
            "model": model.get("name"),
            "pretrained": benchmark_pretrained(model),
            "task": "linear_probe",
            "metrics": {
                LINEAR_PROBE_KEYS[facts["metric"]]: metrics[f"{name}/linear_probe"],
                "fewshot_k": settings["shots"],
                "seeds": [p["seed"] for p in mine],
                "epochs": settings["final_epochs"],
                "learning_rate": [p["best_lr"] for p in mine],
                "weight_decay": [p["best_wd"] for p in mine],
                "metric": facts["metric"],
                "epoch_selection": settings["epoch_selection"],
            },
            "language": language,
            "precision": precision,
        })
    return docs


def benchmark_output_path(our_output: str | os.PathLike, doc: dict) -> Path:
    """Beside ``our_output``, CLIP_benchmark's default file name
    ``{dataset}_{pretrained}_{model}_{language}_{task}.json`` with its rules
    (:func:`clip_dcl.eval.benchmark.output_path`): the data set without ``wds/``, a weights path
    reduced to its base name, '/' made '_'."""
    from .benchmark import DEFAULT_OUTPUT, output_path

    name = output_path(DEFAULT_OUTPUT, doc["dataset"], doc["model"], doc["pretrained"], doc["language"], doc["task"])
    return Path(our_output).parent / name
