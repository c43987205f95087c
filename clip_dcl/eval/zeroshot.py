"""Zero-shot classification, as OpenCLIP's ``zero_shot.py``, on ImageFolder trees (class names tied to their
folders), CLIP_benchmark's shards, or any (image, label) data.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..data.evalsets.benchmark import benchmark_layout_root, classification_wds, read_benchmark_shards
from ..data.evalsets.files import ImageListDataset, ImageSource, describe_folder, read_templates
from ..data.evalsets.folders import folder_classnames, load_classnames, scan_image_folder
from ..data.skips import Skip, SkipCounter
from .encoding import (
    EvalOptions,
    encode_batches,
    encode_images,
    labelled_batches,
    normalize_templates,
    zeroshot_classifier,
)
from .metrics import against_chance, classification_chance, classification_metrics, mean_average_precision
from .registry import EvalTask, TaskResult, register_task
from .report import chance_footnotes, format_table, marked, metrics_table

log = logging.getLogger(__name__)

#: The layouts a zero-shot data folder may have, for error messages.
ZEROSHOT_LAYOUTS = (
    "an ImageFolder tree ROOT/<class>/<image> (ImageNet's synset folders, or with classnames.txt)",
    "CLIP_benchmark's webdataset layout ROOT/test/nshards.txt + ROOT/test/0.tar ... with "
    "classnames.txt and zeroshot_classification_templates.txt",
)


resolve_classnames = folder_classnames


def resolve_templates(root: str | os.PathLike | None, templates=None, own=None, own_source: str = "") -> tuple:
    """(templates, their source): given, else the data's ``own``, else ``root/templates.*``, else OpenCLIP's 80."""
    if templates is not None:
        if isinstance(templates, (str, os.PathLike)):
            return normalize_templates(read_templates(templates)), str(templates)
        return normalize_templates(templates), "argument"
    if own is not None:
        return normalize_templates(own), own_source
    for name in ("templates.txt", "templates.json"):
        if root is not None and (Path(root) / name).is_file():
            return normalize_templates(read_templates(Path(root) / name)), str(Path(root) / name)
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES

    return list(OPENAI_IMAGENET_TEMPLATES), "open_clip OPENAI_IMAGENET_TEMPLATES"


def zeroshot_metrics(image_features: torch.Tensor, classifier: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Metrics of ``logits = 100 * normalize(image_features) @ classifier``: single-label for (N,) labels,
    ``mean_average_precision`` for (N, C) multi-hot."""
    feats = torch.nn.functional.normalize(image_features.float(), dim=-1)
    logits = 100.0 * feats @ classifier.float()
    if labels.ndim == 2:
        return {"mean_average_precision": mean_average_precision(logits, labels)}
    out = classification_metrics(logits, labels)
    out.update(acc1=out["top1"], acc5=out["top5"])
    return out


def _collate_labelled(batch):
    """``(images or None, labels or None, skips)`` of ``(image, label)`` items and skips."""
    from torch.utils.data import default_collate

    good = [item for item in batch if not isinstance(item, Skip)]
    skips = [item for item in batch if isinstance(item, Skip)]
    if not good:
        return None, None, skips
    images, labels = default_collate(good)
    return images, labels, skips


@torch.no_grad()
def encode_labelled(
    model,
    batches,
    *,
    options: EvalOptions | None = None,
    desc: str = "zero-shot images",
    skips: SkipCounter | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(normalised image features (N, D), labels)`` over batches of (images, labels[, skips])."""
    options = EvalOptions.from_kwargs(options, **kwargs)
    feats, labels = [], []
    skips = SkipCounter(options.strict) if skips is None else skips
    for f, y in encode_batches(model, batches, options, desc, skips):
        feats.append(f)
        labels.append(torch.as_tensor(y).cpu())
    if not feats:
        raise ValueError(f"no {desc} to encode" + (f" ({skips.summary()})" if skips.total else ""))
    return torch.cat(feats), torch.cat(labels)


def _dataset_attr(data, name):
    """A dataset's (or a DataLoader's dataset's) ``classes`` / ``templates``."""
    from torch.utils.data import DataLoader

    ds = data.dataset if isinstance(data, DataLoader) else data
    return getattr(ds, name, None)


@dataclass
class ZeroshotData:
    """What a zero-shot evaluation reads, resolved before any model is needed (`zeroshot_data`)."""

    layout: str  #: ``imagefolder``, ``clip_benchmark`` or ``dataset``
    classnames: list
    classnames_source: str
    templates: object
    templates_source: str
    multilabel: bool | None = None
    samples: list | None = None  #: an ImageFolder tree's ``(path, label)``
    bench: object | None = None  #: CLIP_benchmark's shards (`BenchmarkShards`)


def zeroshot_data(
    root, classnames=None, templates=None, split: str = "test", multilabel: bool | None = None
) -> ZeroshotData:
    """The layout, class names and templates of ``root``, read without the model (bad data: ``ValueError``)."""
    from torch.utils.data import DataLoader, Dataset

    if isinstance(root, (Dataset, DataLoader)):
        own = classnames if classnames is not None else _dataset_attr(root, "classes")
        if own is None:
            raise ValueError("a Dataset/DataLoader needs classnames (or a `classes` attribute)")
        source = (
            str(own)
            if isinstance(own, (str, os.PathLike))
            else ("argument" if classnames is not None else "dataset.classes")
        )
        tmpls, tmpl_source = resolve_templates(None, templates, _dataset_attr(root, "templates"), "dataset.templates")
        return ZeroshotData("dataset", _names_of(own), source, tmpls, tmpl_source, multilabel)
    if benchmark_layout_root(root, split) is not None:
        bench = read_benchmark_shards(root, split)
        if bench.dataset_type == "retrieval":
            raise ValueError(
                f"{str(bench.root)!r} is a retrieval data set (dataset_type.txt); use the retrieval evaluation"
            )
        if classnames is not None:
            names = _names_of(classnames)
            source = str(classnames) if isinstance(classnames, (str, os.PathLike)) else "argument"
        elif bench.classnames is not None:
            names, source = bench.classnames, str(bench.root / "classnames.txt")
        else:
            raise ValueError(f"no class names for {str(bench.root)!r}: classnames.txt is missing; pass classnames")
        tmpls, tmpl_source = resolve_templates(
            None, templates, bench.templates, str(bench.root / "zeroshot_classification_templates.txt")
        )
        if multilabel is None:
            multilabel = bench.dataset_type == "multilabel"
        return ZeroshotData("clip_benchmark", names, source, tmpls, tmpl_source, multilabel, bench=bench)
    if Path(root).is_dir() and any(p.is_dir() for p in Path(root).iterdir()):
        folders, samples = scan_image_folder(root)
        names, source = resolve_classnames(root, folders, classnames)
        tmpls, tmpl_source = resolve_templates(root, templates)
        return ZeroshotData("imagefolder", names, source, tmpls, tmpl_source, multilabel, samples=samples)
    raise ValueError(
        f"zero-shot data {str(root)!r} is in neither layout: expected {ZEROSHOT_LAYOUTS[0]}, or "
        f"{ZEROSHOT_LAYOUTS[1]}; found {_found(root)}"
    )


def _found(root) -> str:
    """What ``root`` is, for the message of data in no zero-shot layout: image-caption pairs get their command."""
    import shlex

    from ..data.evalsets.retrieval import expand_shards
    from ..data.pairs import is_caption_folder

    if is_caption_folder(root):
        return (
            f"images with .txt captions: image-caption pairs, not classes; write shards with `clip-dcl data "
            f"shards {shlex.quote(str(root))} OUT`, then evaluate them with "
            "`clip-dcl eval retrieval --data OUT/val`"
        )
    try:
        shards = expand_shards(str(root))
    except (ValueError, OSError):
        shards = []
    if shards:
        return (
            f"{len(shards)} .tar shard(s) in img2dataset's layout: image-caption pairs, not classes; evaluate "
            f"them with `clip-dcl eval retrieval --data {shlex.quote(str(root))}`"
        )
    return describe_folder(root)


def evaluate_zeroshot(
    model,
    preprocess: Callable,
    tokenizer: Callable,
    root,
    classnames: Sequence[str] | str | os.PathLike | None = None,
    templates=None,
    *,
    options: EvalOptions | None = None,
    return_info: bool = False,
    split: str = "test",
    multilabel: bool | None = None,
    skips: SkipCounter | None = None,
    **kwargs,
):
    """Zero-shot metrics of ``model`` on ``root`` (a tree, CLIP_benchmark's layout, or a ``Dataset`` /
    ``DataLoader`` of ``(image, label or multi-hot)``); with ``return_info`` also a dict of what was used, and
    ``chance``: each single-label metric against its chance level (`against_chance`)."""
    options = EvalOptions.from_kwargs(options, **kwargs)
    skips = SkipCounter(options.strict) if skips is None else skips
    data = zeroshot_data(root, classnames, templates, split=split, multilabel=multilabel)
    names, tmpls, multilabel = data.classnames, data.templates, data.multilabel
    log.info(
        "zero-shot: %d classes (names: %s), %d templates (%s)",
        len(names),
        data.classnames_source,
        len(tmpls),
        data.templates_source,
    )
    if data.layout == "dataset":
        batches = labelled_batches(root, options.batch_size, options.workers)
    elif data.layout == "clip_benchmark":
        batches = labelled_batches(
            classification_wds(data.bench.shards, preprocess, multilabel, markers=True),
            options.batch_size,
            options.workers,
            collate=_collate_labelled,
        )
    classifier = zeroshot_classifier(model, tokenizer, names, tmpls, options=options)
    if data.layout == "imagefolder":
        images = [p for p, _ in data.samples]
        dataset = ImageListDataset(images, ImageSource("/"), preprocess, markers=True, where=str(root))
        feats, kept = encode_images(model, dataset, options=options, desc="zero-shot images", skips=skips)
        labels = torch.tensor([y for _, y in data.samples])[kept]
    else:
        feats, labels = encode_labelled(model, batches, options=options, skips=skips)
    log.info("zero-shot: %d images; %s", feats.shape[0], skips.summary())
    if multilabel and labels.ndim != 2:
        raise ValueError(f"multi-label scoring needs multi-hot labels (N, C), got shape {tuple(labels.shape)}")
    if labels.ndim == 2 and labels.shape[1] != len(names):
        raise ValueError(f"multi-hot labels have {labels.shape[1]} columns but there are {len(names)} class names")
    if labels.ndim == 1 and len(labels) and (labels.min() < 0 or labels.max() >= len(names)):
        raise ValueError(
            f"labels run from {int(labels.min())} to {int(labels.max())}, outside the {len(names)} class names"
        )
    metrics = zeroshot_metrics(feats, classifier, labels)
    if return_info:
        # single-label scores against what a classifier blind to the image scores (mAP has no such level here)
        levels = classification_chance(len(names), len(labels)) if labels.ndim == 1 else {}
        info = {
            "num_images": int(feats.shape[0]),
            "num_classes": len(names),
            "layout": data.layout,
            "classnames_source": data.classnames_source,
            "templates_source": data.templates_source,
            "num_templates": len(tmpls),
            "classnames": list(names),
            "templates": _printable_templates(tmpls),
            "skipped": skips.as_dict(),
            "chance": against_chance(metrics, levels),
        }
        return metrics, info
    return metrics


def _printable_templates(templates):
    """Templates as JSON can hold them (a callable shown as its prompt for ``{c}``)."""
    if isinstance(templates, dict):
        return {k: list(v) for k, v in templates.items()}
    return [t("{c}") if callable(t) else str(t).replace("{}", "{c}") for t in templates]


def _names_of(classnames) -> list[str]:
    """A list of names in label order, or a file of them; a mapping has no order without folders: refused."""
    names = load_classnames(classnames) if isinstance(classnames, (str, os.PathLike)) else classnames
    if isinstance(names, dict):
        raise ValueError(
            f"class names from {classnames if isinstance(classnames, (str, os.PathLike)) else 'argument'}"
            " map folders to names, but these labels are numbers, not class folders; give the names "
            "as a list in label order"
        )
    return list(names)


# The task: `clip-dcl eval zeroshot` and CLIP_benchmark's zeroshot_classification
def _add_arguments(p) -> None:
    p.add_argument(
        "--data",
        required=True,
        help="ImageFolder root ROOT/<class>/<images>, or a CLIP_benchmark webdataset data set "
        "(ROOT/test/nshards.txt, classnames.txt, zeroshot_classification_templates.txt)",
    )
    p.add_argument("--split", default="test", help="split folder of CLIP_benchmark's layout (default test)")
    p.add_argument(
        "--classnames",
        default=None,
        help='class-name file: JSON {"folder": "name", ...} for an ImageFolder tree, or one name a '
        "line in label order (each line must name its folder: sorted folder order); default: the "
        "data's classnames.json or classnames.txt, ImageNet's names for its synset folders, else the "
        "folder names",
    )
    p.add_argument(
        "--templates",
        default=None,
        help="template file: one per line with {c}, or JSON (a list, or CuPL's class -> prompts) "
        "(default: the data's templates, or OpenAI's 80)",
    )


def _check(args) -> None:
    """The data, its class names and templates, read before the model loads (`zeroshot_data`)."""
    from ..errors import FlagError

    if args.templates:  # read again by the evaluation
        try:
            read_templates(args.templates)
        except ValueError as e:
            raise FlagError(f"--templates: {e}") from None
    try:
        zeroshot_data(args.data, args.classnames, args.templates, split=args.split)
    except ValueError as e:
        raise FlagError(str(e)) from None


def _benchmark_check(run, settings) -> None:
    """``clip-dcl eval benchmark``: a run's data and class names, read before any model loads."""
    zeroshot_data(run.root, settings.classnames(run), settings.templates(run), split=settings.split)


def _run(model, preprocess, tokenizer, args, common) -> TaskResult:
    metrics, info = evaluate_zeroshot(
        model,
        preprocess,
        tokenizer,
        args.data,
        classnames=args.classnames,
        templates=args.templates,
        split=args.split,
        return_info=True,
        **common,
    )
    info.pop("classnames")
    info.pop("templates")
    chance = info.pop("chance")
    settings = dict(
        classnames=info.pop("classnames_source"),
        templates=info.pop("templates_source"),
        num_templates=info.pop("num_templates"),
    )
    return TaskResult(metrics, {"path": str(args.data), **info}, settings=settings, chance=chance)


def benchmark_classification_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """CLIP_benchmark's keys of the metrics."""
    keys = (
        ("mean_average_precision",)
        if "mean_average_precision" in metrics
        else ("acc1", "acc5", "mean_per_class_recall")
    )
    return {k: metrics[k] for k in keys}


def _benchmark_run(model, preprocess, tokenizer, run, settings):
    metrics, info = evaluate_zeroshot(
        model,
        preprocess,
        tokenizer,
        run.root,
        classnames=settings.classnames(run),
        templates=settings.templates(run),
        split=settings.split,
        return_info=True,
        options=settings.options,
    )
    dumps = {"classnames": settings.dump_classnames, "templates": settings.dump_templates}
    return metrics, {key: info[key] for key, dump in dumps.items() if dump}


def zeroshot_table(metrics: dict[str, float], args=None, chance: dict | None = None) -> str:
    """The metrics' table, with a line saying why ``top5`` is NaN when it is; with ``chance``
    (`against_chance`) a chance column, marked values and a line for each mark used."""
    if chance:
        rows = [
            [k, marked(v, chance.get(k)), marked(chance[k]["chance"], None) if k in chance else ""]
            for k, v in metrics.items()
        ]
        table = "\n".join([format_table(["metric", "value", "chance"], rows), *chance_footnotes(chance)])
    else:
        table = metrics_table(metrics)
    top5 = metrics.get("top5")
    if isinstance(top5, float) and math.isnan(top5):
        table += (
            "\ntop5 and acc5 are nan: the data have fewer than 5 classes, so the true class is always among "
            "the top 5 and they measure nothing"
        )
    return table


register_task(
    EvalTask(
        name="zeroshot",
        help="zero-shot top-1/top-5/mean per-class recall (or mAP for multi-label data)",
        description="Zero-shot classification on an ImageFolder tree (ImageNet synset folders use OpenCLIP's class "
        "names and templates) or CLIP_benchmark's webdataset layout.",
        add_arguments=_add_arguments,
        check=_check,
        run=_run,
        metrics=("acc1", "acc5", "mean_per_class_recall", "mean_average_precision (multi-label data)"),
        table=zeroshot_table,
        benchmark_name="zeroshot_classification",
        benchmark_metrics=benchmark_classification_metrics,
        benchmark_run=_benchmark_run,
        benchmark_check=_benchmark_check,
    )
)
