"""Readable tables and JSON files for evaluation results, and CLIP_benchmark's result files. Our JSON is flat:
``metric -> value`` plus `RESERVED_KEYS`; non-finite values are written as ``null``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Iterable, Sequence

from .. import paths

RESERVED_KEYS = ("model", "data", "settings", "details", "skipped", "chance")


def _fmt(v) -> str:
    return f"{v:.4f}" if isinstance(v, float) else str(v)  # NaN formats as "nan"


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


#: The marks of `metrics.against_chance` in a printed table, and what each means.
CHANCE_MARKS = {
    "near chance": ("*", "within noise of chance: within {se:g} standard errors of what a content-blind model scores"),
    "meaningless": ("!", "meaningless: chance is 1 (k at or above the candidates or classes), every model scores 1"),
}


def marked(value, entry: dict | None) -> str:
    """``value`` formatted, then its chance mark (two characters, blank when unmarked, so that columns align)."""
    mark = CHANCE_MARKS[entry["mark"]][0] if entry and entry["mark"] else ""
    return f"{_fmt(value)} {mark or ' '}"


def chance_footnotes(chance: dict) -> list[str]:
    """A line for each mark used in ``chance`` (`metrics.against_chance`), for below a table."""
    from .metrics import NOISE_SE

    used = {entry["mark"] for entry in chance.values()}
    return [f"{sign} {text.format(se=NOISE_SE)}" for mark, (sign, text) in CHANCE_MARKS.items() if mark in used]


def result_document(metrics: dict[str, float], model: dict, data: dict, settings: dict, details=None) -> dict:
    """The flat JSON document: metrics at the top level plus the reserved keys."""
    clash = [k for k in metrics if k in RESERVED_KEYS]
    if clash:
        raise ValueError(f"metric names {clash} clash with the reserved keys {RESERVED_KEYS}")
    doc = dict(metrics, model=model, data=data, settings=settings)
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
    """Write ``document`` (see `result_document`) to ``path``, creating folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # NaN and infinities (e.g. acc5 with fewer than 5 classes) are not JSON: strict parsers reject them.
    paths.write_json(path, _finite(document), indent=2, default=str, allow_nan=False)
    return path


#: CLIP_benchmark's default ``--output`` template.
DEFAULT_OUTPUT = "{dataset}_{pretrained}_{model}_{language}_{task}.json"


def short_name(dataset: str) -> str:
    """The name without ``wds/`` (what CLIP_benchmark formats ``--dataset_root`` and file names with)."""
    return dataset[len("wds/") :] if dataset.startswith("wds/") else dataset


def name_part(value: str) -> str:
    """``value`` as one piece of a file name: its parts between '/', the path separator and ':' joined by '_',
    without empty, ``.`` and ``..`` parts (``../data/val/`` -> ``data_val``)."""
    parts = str(value).replace(os.sep, "/").replace(":", "/").split("/")
    return "_".join(p for p in parts if p not in ("", ".", "..")) or "_"


def pretrained_slug(pretrained: str) -> str:
    """``{pretrained}`` of a file name: a file's (or folder's) base name, else the tag as is."""
    p = str(pretrained)
    if os.path.isfile(p) or os.path.isdir(p):
        return os.path.basename(os.path.abspath(p)) or p
    return p


def output_path(template: str, dataset: str, model: str, pretrained: str, language: str, task: str) -> Path:
    """``template`` with CLIP_benchmark's fields filled; a '/' inside a model name is made '_' so that the name
    stays one file (CLIP_benchmark inserts it raw)."""
    p = str(pretrained)
    full = os.path.abspath(p).replace(os.sep, "_") if (os.path.isfile(p) or os.path.isdir(p)) else p
    try:
        name = template.format(
            dataset=name_part(short_name(dataset)),
            model=name_part(model),
            pretrained=pretrained_slug(p),
            pretrained_full_path=full,
            language=language,
            task=task,
        )
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(
            f"--output {template!r}: unknown or malformed field ({e}); the fields are {{dataset}} "
            "{pretrained} {pretrained_full_path} {model} {language} {task}"
        ) from e
    return Path(name)


def benchmark_dataset_name(data) -> str:
    """CLIP_benchmark's ``--dataset`` name for ``data``: ``wds/<name>`` for a folder ``wds_<name>`` in its layout,
    else the file or folder name."""
    from ..data.evalsets.benchmark import benchmark_layout_root

    if isinstance(data, (str, os.PathLike)):
        found = benchmark_layout_root(data)
        if found is not None:
            folder = found[0].resolve().name
            return f"wds/{folder[len('wds_') :] if folder.startswith('wds_') and len(folder) > 4 else folder}"
        return Path(data).resolve().stem
    return type(data).__name__


def benchmark_pretrained(model: dict) -> str:
    """``pretrained`` as CLIP_benchmark writes it: the checkpoint, tag, file or ``local-dir`` folder, else ``none``."""
    for key in ("checkpoint", "pretrained"):
        if model.get(key):
            return str(model[key])
    name = str(model.get("name") or "")
    if name.startswith("local-dir:"):
        return name[len("local-dir:") :]
    return "none"


def benchmark_document(
    benchmark_name: str,
    metrics: dict,
    model: dict,
    data,
    dataset_name: str | None = None,
    precision: str = "fp32",
    language: str = "en",
) -> dict:
    """CLIP_benchmark's per-task result JSON for ``benchmark_name``, plus ``precision`` (CLIP_benchmark encodes
    under autocast by default)."""
    return {
        "dataset": dataset_name or benchmark_dataset_name(data),
        "model": model.get("name"),
        "pretrained": benchmark_pretrained(model),
        "task": benchmark_name,
        "metrics": metrics,
        "language": language,
        "precision": precision,
    }


def benchmark_output_path(our_output: str | os.PathLike, doc: dict) -> Path:
    """Beside ``our_output``, CLIP_benchmark's default file name with the rules of `output_path`."""
    name = output_path(DEFAULT_OUTPUT, doc["dataset"], doc["model"], doc["pretrained"], doc["language"], doc["task"])
    return Path(our_output).parent / name
