"""ELEVATER few-shot linear probe (Elevater_Toolkit_IC) on features encoded once per set. The 20 sets' class names
and templates ship as package data and take precedence over a set's label map, as in the toolkit.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..data.evalsets.fewshot import FEWSHOT_LAYOUTS, FewShotData, list_fewshot_datasets, read_fewshot_dataset
from ..data.evalsets.files import ImageListDataset
from ..data.skips import SkipCounter
from .encoding import EvalOptions, encode_images, zeroshot_classifier
from .kshot import VAL_SPLIT, sample_few_shot, shot_plan
from .metrics import ELEVATER_METRICS, elevater_scores
from .probe import BATCH_SIZE, GRIDS, ProbeResult, SweepGrid, default_head_init, labels_to_targets, linear_probe
from .registry import EvalTask, TaskResult, register_task

log = logging.getLogger(__name__)

#: Prompt for a data set outside the catalogue without a templates file.
#: The toolkit's fallback, ``'a photo of a {}'`` (no full stop), as in its ``extract_text_features``.
DEFAULT_TEMPLATES = ("a photo of a {}",)
EPOCH_SELECTIONS = ("last", "toolkit")


def builtin_catalog() -> dict[str, dict]:
    """The 20 ELEVATER data sets (``catalog.json``): name -> metric, classes, layout and the like."""
    return json.loads(Path(__file__).with_name("catalog.json").read_text())["datasets"]


def load_catalog(root: str | os.PathLike | None = None) -> dict[str, dict]:
    """Built-in catalogue, aliases expanded, updated with ``root/catalog.json`` (``ValueError`` if malformed)."""
    cat = {}
    for name, entry in builtin_catalog().items():
        cat[name] = dict(entry, name=name)
        for alias in entry.get("aliases", []):
            cat[alias] = cat[name]
    if root is not None and (Path(root) / "catalog.json").is_file():
        path = Path(root) / "catalog.json"
        try:
            local = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"catalogue {str(path)!r} is not valid JSON: {e}") from e
        if not isinstance(local, dict):
            raise ValueError(f"catalogue {str(path)!r} must map data set names to entries")
        local = local.get("datasets", local)
        for name, entry in local.items():
            if not isinstance(entry, dict) or entry.get("metric") not in ELEVATER_METRICS:
                raise ValueError(
                    f"catalogue {str(path)!r}: entry {name!r} needs a metric in {ELEVATER_METRICS}, got {entry!r}"
                )
            cat[name] = dict(cat.get(name, {}), **entry, name=name)
    return cat


def _check_enough_shots(d, name: str, shots: int) -> None:
    """Refuse ``shots`` above a class's train images: the result would not be k-shot."""
    counts = np.zeros(d.num_classes, dtype=int)
    for _, ys in d.train:
        for y in set(ys):
            counts[y] += 1
    short = [
        (d.classnames[c] if c < len(d.classnames) else str(c), int(counts[c])) for c in np.flatnonzero(counts < shots)
    ]
    if short:
        listed = ", ".join(f"{c!r} {k}" for c, k in short[:5]) + (", ..." if len(short) > 5 else "")
        raise ValueError(
            f"--shots {shots}: data set {name!r} has {len(short)} class(es) with fewer train images "
            f"({listed}); use --shots {int(counts.min())} or less"
        )


def builtin_prompts() -> dict[str, dict]:
    """Class names and templates of the 20 ELEVATER sets (``elevater_prompts.json``)."""
    return json.loads(Path(__file__).with_name("elevater_prompts.json").read_text())["datasets"]


def dataset_prompts(name: str, catalog: dict[str, dict]) -> dict | None:
    """The shipped prompts of a catalogued set (aliases resolved), or None."""
    entry = catalog.get(name)
    if entry is None:
        return None
    return builtin_prompts().get(entry["name"])


@dataclass
class FewShotReport:
    """Everything `run_fewshot` measured: flat metrics, per-(set, seed) records, per-set facts, settings."""

    metrics: dict[str, float]
    probes: list[ProbeResult]
    datasets: dict[str, dict]
    settings: dict
    #: images left out because they do not decode, by cause (empty when none)
    skipped: dict = None

    def to_dict(self) -> dict:
        return {
            "metrics": self.metrics,
            "probes": [dict(asdict(p), last=p.last, toolkit=p.toolkit) for p in self.probes],
            "datasets": self.datasets,
            "settings": self.settings,
            "skipped": dict(self.skipped or {}),
        }


def _square_transform(model, preprocess):
    """Resize to the model's square input without cropping (kitti-distance's ``CENTER_CROP: false``)."""
    from open_clip import image_transform

    cfg = dict(getattr(getattr(model, "visual", None), "preprocess_cfg", {}) or {})
    if "size" not in cfg:
        log.warning("model has no preprocess_cfg; using its own preprocessing for a no-crop data set")
        return preprocess
    return image_transform(
        cfg["size"],
        is_train=False,
        mean=cfg.get("mean"),
        std=cfg.get("std"),
        resize_mode="squash",
        interpolation=cfg.get("interpolation"),
    )


def _dataset_spec(data: FewShotData, catalog: dict) -> dict:
    entry = catalog.get(data.name)
    if entry is None:
        log.info("%s: not in the catalogue; scoring with accuracy", data.name)
        entry = {"metric": "accuracy"}
    if "num_classes" in entry and int(entry["num_classes"]) != data.num_classes:
        raise ValueError(
            f"{data.name}: the catalogue says {entry['num_classes']} classes, its label list has {data.num_classes}"
        )
    multilabel = bool(entry.get("multilabel", data.multilabel))
    metric = entry["metric"]
    if metric == "roc_auc" and data.num_classes != 2:
        raise ValueError(f"{data.name}: roc_auc needs 2 classes, found {data.num_classes}")
    if not multilabel and data.multilabel:
        raise ValueError(f"{data.name}: images carry several labels but the catalogue marks it single-label")
    return {
        "metric": metric,
        "multilabel": multilabel,
        "center_crop": bool(entry.get("center_crop", True)),
        "num_classes": data.num_classes,
        "layout": data.layout,
        "folder": data.folder,
    }


def _read_dataset(root, name: str, catalog: dict) -> tuple[FewShotData, str]:
    """Read one set with the shipped class names of a catalogued set; (data, templates source)."""
    entry = catalog.get(name) or {}
    shipped = dataset_prompts(name, catalog)
    data = read_fewshot_dataset(
        root, name, toolkit=entry.get("toolkit"), classnames=shipped["classnames"] if shipped else None
    )
    if shipped:
        data.classnames_source = "clip_dcl/eval/elevater_prompts.json"
    if data.templates is not None:
        return data, "templates file in " + data.folder
    if shipped:
        data.templates = list(shipped["templates"])
        return data, "clip_dcl/eval/elevater_prompts.json"
    data.templates = list(DEFAULT_TEMPLATES)
    return data, "default"


def run_fewshot(
    model,
    preprocess: Callable,
    tokenizer: Callable,
    root: str | os.PathLike,
    datasets: Sequence[str] | None = None,
    shots: int = 5,
    seeds: Sequence[int] = (0, 1, 2),
    grid: str | SweepGrid = "full",
    epoch_selection: str = "last",
    text_init: bool = True,
    *,
    options: EvalOptions | None = None,
    skips: SkipCounter | None = None,
    **kwargs,
) -> FewShotReport:
    """ELEVATER k-shot linear probe of ``model`` on the data sets under ``root`` (the toolkit's download or one
    folder per set); an image that does not decode is left out (a train image leaves its draw one shot short)."""
    if epoch_selection not in EPOCH_SELECTIONS:
        raise ValueError(f"epoch_selection must be 'last' or 'toolkit', got {epoch_selection!r}")
    if isinstance(grid, str):
        if grid not in GRIDS:
            raise ValueError(f"grid must be one of {list(GRIDS)}, got {grid!r}")
        grid = GRIDS[grid]
    options = EvalOptions.from_kwargs(options, **kwargs)
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds must not be empty")
    draw, merge_final = shot_plan(shots)
    catalog = load_catalog(root)
    toolkit_sets = {n: e["toolkit"] for n, e in catalog.items() if e.get("toolkit") and n == e["name"]}
    available = list_fewshot_datasets(root, toolkit_sets)
    names = (
        [catalog[n]["name"] if n in catalog and n not in available else n for n in datasets] if datasets else available
    )
    missing = [n for n in names if n not in available]
    if missing:
        raise ValueError(
            f"data sets {missing} not found under {str(root)!r} (found: {available}). Expected "
            f"{FEWSHOT_LAYOUTS[0]}; or {FEWSHOT_LAYOUTS[1]}"
        )
    if not names:
        raise ValueError(
            f"no few-shot data sets under {str(root)!r}. Expected {FEWSHOT_LAYOUTS[0]}; or {FEWSHOT_LAYOUTS[1]}"
        )
    data, template_sources = {}, {}
    for n in names:
        data[n], template_sources[n] = _read_dataset(root, n, catalog)
    specs = {n: _dataset_spec(data[n], catalog) for n in names}
    for n in names:
        _check_enough_shots(data[n], n, shots)

    probes: list[ProbeResult] = []
    zeroshot: dict[str, float] = {}
    skips = SkipCounter(options.strict) if skips is None else skips
    per_set_skips: dict[str, dict] = {}
    t0 = time.time()
    for name in names:
        d, spec = data[name], specs[name]
        before = dict(skips.counts)
        c, multilabel, metric = d.num_classes, spec["multilabel"], spec["metric"]
        train_labels = [ys for _, ys in d.train]
        subsets = {s: sample_few_shot(train_labels, c, draw, s) for s in seeds}
        needed = sorted(set().union(*subsets.values()))
        transform = preprocess if spec["center_crop"] else _square_transform(model, preprocess)
        enc = dict(options=options, normalize=False, skips=skips)
        encoded = []
        for split, paths in (("train", [d.train[i][0] for i in needed]), ("test", [r for r, _ in d.test])):
            dataset = ImageListDataset(paths, d.source, transform, markers=True, where=f"{name} ({d.folder})")
            encoded.append(encode_images(model, dataset, desc=f"{name} {split}", **enc))
        (x_train, kept_train), (x_test, kept_test) = encoded
        row = {needed[j]: r for r, j in enumerate(kept_train.tolist())}
        t_test = labels_to_targets([d.test[i][1] for i in kept_test.tolist()], c, multilabel)
        # the zero-shot text classifier, (D, C)
        text_w = zeroshot_classifier(model, tokenizer, d.classnames, d.templates, options=options, progress=False)
        zeroshot[name] = float(elevater_scores(metric, 100.0 * F.normalize(x_test, dim=-1) @ text_w, t_test))
        if text_init:
            init_w, init_b = text_w.T.contiguous(), torch.zeros(c)
        else:
            init_w, init_b = default_head_init(c, x_train.shape[1])
        per_set_skips[name] = {k: v - before.get(k, 0) for k, v in skips.counts.items() if v - before.get(k, 0)}
        for s in seeds:
            drawn = [i for i in subsets[s] if i in row]  # a train image that did not decode is left out
            idx = [row[i] for i in drawn]
            res = linear_probe(
                x_train[idx],
                [train_labels[i] for i in drawn],
                x_test,
                t_test,
                c,
                metric,
                multilabel,
                grid,
                init_w,
                init_b,
                dataset=name,
                seed=s,
                shots=shots,
                merge_final=merge_final,
            )
            probes.append(res)
            log.info(
                "%s seed %d: %s %.4f (last) %.4f (best test epoch), lr %.0e wd %.1e, mean classifier %.4f",
                name,
                s,
                metric,
                res.last,
                res.toolkit,
                res.best_lr,
                res.best_wd,
                res.mean_classifier,
            )
    metrics: dict[str, float] = {}
    for name in names:
        rs = [p for p in probes if p.dataset == name]
        metrics[f"{name}/linear_probe"] = float(np.mean([p.score(epoch_selection) for p in rs]))
        metrics[f"{name}/linear_probe_last"] = float(np.mean([p.last for p in rs]))
        metrics[f"{name}/linear_probe_toolkit"] = float(np.mean([p.toolkit for p in rs]))
        for p in rs:
            metrics[f"{name}/linear_probe_seed{p.seed}"] = p.score(epoch_selection)
        metrics[f"{name}/mean_classifier"] = float(np.mean([p.mean_classifier for p in rs]))
        metrics[f"{name}/zeroshot"] = zeroshot[name]
    for key in FEWSHOT_COLUMNS:
        metrics[f"average/{key}"] = float(np.mean([metrics[f"{n}/{key}"] for n in names]))
    settings = {
        "shots": shots,
        "shots_drawn": draw,
        "final_run_merges_val": merge_final,
        "seeds": seeds,
        "grid": grid.name,
        "learning_rates": list(grid.lrs),
        "sweep_epochs": grid.epochs,
        "final_epochs": grid.final_epochs,
        "refinement_spans": list(grid.spans),
        "trains_unstable_pairs": grid.exact,
        "epoch_selection": epoch_selection,
        "text_init": text_init,
        "val_split": VAL_SPLIT,
        "batch_size_head": BATCH_SIZE,
        "precision": options.precision,
        "seconds": round(time.time() - t0, 1),
    }
    per_set = {
        n: dict(
            specs[n],
            num_train=len(data[n].train),
            num_test=len(data[n].test),
            classnames=data[n].classnames_source,
            templates=template_sources[n],
            num_templates=len(data[n].templates),
            skipped=per_set_skips.get(n, {}),
        )
        for n in names
    }
    return FewShotReport(metrics=metrics, probes=probes, datasets=per_set, settings=settings, skipped=skips.as_dict())


def evaluate_fewshot(model, preprocess: Callable, tokenizer: Callable, root: str | os.PathLike, *args, **kwargs):
    """The flat metrics of `run_fewshot` (same arguments): per set ``{ds}/linear_probe``, ``_last``, ``_toolkit``,
    ``_seed{s}``, ``mean_classifier``, ``zeroshot``, and their ``average/...``."""
    return run_fewshot(model, preprocess, tokenizer, root, *args, **kwargs).metrics


# The task: `clip-dcl eval fewshot` and CLIP_benchmark's linear_probe
#: Score families of the few-shot table, one column each.
FEWSHOT_COLUMNS = ("linear_probe", "linear_probe_last", "linear_probe_toolkit", "mean_classifier", "zeroshot")
#: ELEVATER metric -> the key of a ``linear_probe`` result (CLIP_benchmark's ``lp_`` names where it has one).
LINEAR_PROBE_KEYS = {
    "accuracy": "lp_acc1",
    "mean_per_class": "lp_mean_per_class_recall",
    "11point_mAP": "lp_mean_average_precision_11point",
    "roc_auc": "lp_roc_auc",
}


def _add_arguments(p) -> None:
    import argparse

    p.add_argument(
        "--data",
        required=True,
        help="the ELEVATER toolkit's data root as downloaded (classification/<root_folder>/...), or one "
        "folder per data set (iris index, COCO json or train/test ImageFolder); optional catalog.json",
    )
    p.add_argument("--datasets", nargs="+", default=None, help="data set names under --data (default: all)")
    p.add_argument("--shots", type=int, default=5, help="images per class (default 5)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="sampling seeds (default 0 1 2)")
    p.add_argument(
        "--grid",
        choices=list(GRIDS),
        default="full",
        help="lr x weight-decay sweep: the toolkit's full grid (default; pairs with lr*wd >= 3.8 "
        "skipped), a reduced one for quick runs, or toolkit-exact (the full grid, every pair trained "
        "and scored as the toolkit does)",
    )
    p.add_argument(
        "--epoch-selection",
        choices=list(EPOCH_SELECTIONS),
        default="last",
        help="the probe column: the final run's last epoch (default), or its best test epoch, which is "
        "what the toolkit reports; the table shows both",
    )
    p.add_argument(
        "--text-init",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="initialise the head with the zero-shot text classifier (default on)",
    )


def _check(args) -> None:
    from ..errors import FlagError

    if args.dataset_name and len(args.datasets or []) != 1:
        raise FlagError(f"--dataset-name {args.dataset_name!r} names one data set; give exactly one with --datasets")


def _run(model, preprocess, tokenizer, args, common) -> TaskResult:
    report = run_fewshot(
        model,
        preprocess,
        tokenizer,
        args.data,
        datasets=args.datasets,
        shots=args.shots,
        seeds=args.seeds,
        grid=args.grid,
        epoch_selection=args.epoch_selection,
        text_init=args.text_init,
        **common,
    )
    return TaskResult(
        report.metrics,
        {"path": str(args.data), "datasets": report.datasets},
        settings=dict(report.settings),
        details=report.to_dict()["probes"],
        facts={"datasets": report.datasets},
    )


def fewshot_table(metrics: dict[str, float]) -> str:
    """One row per data set (and ``average``), one column per score family."""
    from .report import format_table

    names = [n for n in dict.fromkeys(key.rsplit("/", 1)[0] for key in metrics if "/" in key) if n != "average"]
    rows = [[n] + [metrics.get(f"{n}/{c}", float("nan")) for c in FEWSHOT_COLUMNS] for n in names + ["average"]]
    headers = [
        "data set",
        "probe",
        "probe (last epoch)",
        "probe (best test epoch, as ELEVATER reports)",
        "mean classifier",
        "zero-shot",
    ]
    return format_table(headers, rows)


def linear_probe_metrics(name: str, metrics: dict[str, float], metric: str, settings: dict, probes: list[dict]) -> dict:
    """CLIP_benchmark ``linear_probe`` metrics of one set: the probe score under `LINEAR_PROBE_KEYS` and the
    settings (the protocol is ELEVATER's, see docs/evaluation.md)."""
    mine = [p for p in probes if p["dataset"] == name]
    return {
        LINEAR_PROBE_KEYS[metric]: metrics[f"{name}/linear_probe"],
        "fewshot_k": settings["shots"],
        "seeds": [p["seed"] for p in mine],
        "epochs": settings["final_epochs"],
        "learning_rate": [p["best_lr"] for p in mine],
        "weight_decay": [p["best_wd"] for p in mine],
        "metric": metric,
        "epoch_selection": settings["epoch_selection"],
    }


def _benchmark_documents(result: TaskResult, model_info: dict, args, precision: str) -> list[dict]:
    """One CLIP_benchmark ``linear_probe`` result per data set (``--dataset-name`` renames a single one)."""
    from .report import benchmark_document

    docs = []
    for name, facts in result.facts["datasets"].items():
        lp = linear_probe_metrics(name, result.metrics, facts["metric"], result.settings, result.details)
        docs.append(benchmark_document("linear_probe", lp, model_info, None, args.dataset_name or name, precision))
    return docs


def _benchmark_check(run, settings) -> None:
    """``--task linear_probe`` needs a few-shot data set folder: checked before any model loads."""
    from ..data.evalsets.fewshot import fewshot_layout

    if not run.root.is_dir() or fewshot_layout(run.root) is None:
        raise ValueError(
            f"--task linear_probe: data set {run.dataset!r} ({str(run.root)!r}) is not a few-shot data "
            f"set folder; expected {FEWSHOT_LAYOUTS[1]}"
        )


def _benchmark_run(model, preprocess, tokenizer, run, settings):
    """CLIP_benchmark's ``--task linear_probe``, run as ELEVATER's probe on one folder (``--dataset``)."""
    folder = run.root
    name = folder.resolve().name
    report = run_fewshot(
        model,
        preprocess,
        tokenizer,
        folder.resolve().parent,
        datasets=[name],
        shots=settings.fewshot_k,
        seeds=[settings.seed],
        grid=settings.fewshot_grid,
        options=settings.options,
    )
    probes = report.to_dict()["probes"]
    return linear_probe_metrics(name, report.metrics, report.datasets[name]["metric"], report.settings, probes), {}


register_task(
    EvalTask(
        name="fewshot",
        help="ELEVATER k-shot linear probe (and mean classifier)",
        description="ELEVATER few-shot linear probe on frozen features.",
        add_arguments=_add_arguments,
        check=_check,
        run=_run,
        metrics=tuple(f"{{dataset}}/{c}" for c in FEWSHOT_COLUMNS)
        + ("{dataset}/linear_probe_seed{s}",)
        + tuple(f"average/{c}" for c in FEWSHOT_COLUMNS),
        table=lambda metrics, args: fewshot_table(metrics),
        benchmark_name="linear_probe",
        benchmark_documents=_benchmark_documents,
        benchmark_run=_benchmark_run,
        benchmark_check=_benchmark_check,
    )
)
