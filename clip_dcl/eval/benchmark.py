"""CLIP_benchmark's ``eval`` command line, run locally: ``clip-dcl eval benchmark``, with its flags, defaults, grid
and result files; flags for its downloads, launcher or probe training are refused, naming them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Sequence

from .report import DEFAULT_OUTPUT, output_path, short_name, write_json
from .tasks import benchmark_task, registered_tasks

log = logging.getLogger(__name__)

#: CLIP_benchmark's tasks that no registered task runs here, refused with the reason.
OTHER_TASKS = {
    "captioning": "captioning needs a generative (CoCa) model and is not evaluated here",
    "image_caption_selection": "image_caption_selection (SugarCrepe, Winoground) is not evaluated here",
}
#: CLIP_benchmark's names of retrieval data sets (its ``--task auto`` rule), besides ``dataset_type.txt``.
RETRIEVAL_NAMES = (
    "flickr30k",
    "flickr8k",
    "mscoco_captions",
    "multilingual_mscoco_captions",
    "flickr30k-200",
    "crossmodal3600",
    "xtd10",
    "xtd200",
)
_LINEAR_PROBE = (
    "only CLIP_benchmark's own linear_probe training reads it; here --task linear_probe runs "
    "ELEVATER's few-shot probe, whose sweep chooses its epochs, learning rate and weight decay on the "
    "data set's own train/test split (see `clip-dcl eval fewshot`)"
)
#: CLIP_benchmark ``eval`` flags refused here, with the reason printed.
REFUSED_FLAGS = {
    "--distributed": "it splits the runs across the ranks of a launcher; here the runs go one after another",
    "--wds_cache_dir": "it caches shards streamed from a hub; here shards are read from --dataset_root on disk",
    "--annotation_file": "it feeds CLIP_benchmark's own COCO/Flickr readers; here retrieval data is read in "
    "its webdataset layout (--dataset wds/<name>)",
    "--save_clf": "saving the zero-shot classifier is not supported",
    "--load_clfs": "loading and averaging saved zero-shot classifiers is not supported",
    "--fewshot_epochs": _LINEAR_PROBE,
    "--fewshot_lr": _LINEAR_PROBE,
    "--skip_load": _LINEAR_PROBE,
    "--feature_root": _LINEAR_PROBE,
    "--train_split": _LINEAR_PROBE,
    "--val_split": _LINEAR_PROBE,
    "--val_proportion": _LINEAR_PROBE,
    "--normalize": _LINEAR_PROBE,
}
#: CLIP_benchmark's ``--pretrained_model`` collection names: they list hub weights.
MODEL_COLLECTIONS = ("openai", "openclip_base", "openclip_multilingual", "openclip_all", "openclip_full")
#: ``--pretrained`` values meaning randomly initialised weights.
NO_WEIGHTS = ("none", "None", "")


class _Refuse(argparse.Action):
    """A CLIP_benchmark flag with no meaning here: an error naming it and why."""

    def __init__(self, option_strings, dest, reason: str = "", **kwargs):
        kwargs.update(nargs="*", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.reason = reason

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is not supported by `clip-dcl eval benchmark`: {self.reason}")


def add_benchmark_arguments(p: argparse.ArgumentParser) -> None:
    """CLIP_benchmark 1.6's ``eval`` flags that mean something here, with its defaults; the others refused."""
    g = p.add_argument_group("data (CLIP_benchmark's flags)")
    g.add_argument(
        "--dataset",
        nargs="+",
        required=True,
        help="wds/<name> (CLIP_benchmark's webdataset layout under --dataset_root), a folder, or a text "
        "file with one such name a line",
    )
    g.add_argument(
        "--dataset_root",
        default="root",
        help="the data set's folder; a template with {dataset} (the name without wds/) and "
        "{dataset_cleaned} ('/' made '-'), e.g. /data/wds_{dataset_cleaned} (default root)",
    )
    g.add_argument("--split", "--test_split", dest="split", default="test", help="split folder (default test)")
    g.add_argument(
        "--task",
        dest="bench_task",
        default="auto",
        choices=benchmark_tasks() + list(OTHER_TASKS),
        help="auto (default): zeroshot_retrieval when dataset_type.txt says retrieval, the name is one "
        "of CLIP_benchmark's retrieval sets or the folder holds image-caption .tar shards (what "
        "`clip-dcl data synth` writes in val/), else zeroshot_classification; linear_probe: "
        "ELEVATER's few-shot probe on one few-shot data set folder",
    )
    g.add_argument(
        "--language",
        nargs="+",
        default=["en"],
        help="language(s), recorded in the result and its file name (default en)",
    )
    g.add_argument(
        "--custom_classname_file",
        default=None,
        help="JSON: data set name (wds/<name> or <name>) -> class names, replacing the data's",
    )
    g.add_argument(
        "--custom_template_file",
        default=None,
        help="JSON: data set name (wds/<name>, <name>, else imagenet1k) -> templates (a list with {c}, "
        "or CuPL's class -> prompts)",
    )
    g.add_argument("--dump_classnames", action="store_true", help="write the class names into the result file")
    g.add_argument("--dump_templates", action="store_true", help="write the templates into the result file")
    g = p.add_argument_group("model (CLIP_benchmark's flags)")
    g.add_argument(
        "--model",
        nargs="+",
        default=["ViT-B-32-quickgelu"],
        help="OpenCLIP model name(s), local-dir:FOLDER included (default ViT-B-32-quickgelu)",
    )
    g.add_argument(
        "--pretrained",
        nargs="+",
        default=["laion400m_e32"],
        help="per model: an OpenCLIP tag, a weights file, a clip-dcl trainer checkpoint (epoch_K.pt) or "
        "exported folder, or 'none' for random weights (default laion400m_e32)",
    )
    g.add_argument(
        "--pretrained_model",
        nargs="+",
        default=None,
        help="'MODEL,PRETRAINED' pairs, or a file of such lines; replaces --model/--pretrained",
    )
    g.add_argument("--model_type", default="open_clip", choices=["open_clip"], help="only open_clip")
    g.add_argument("--model_cache_dir", default=None, help="OpenCLIP's cache folder for tagged weights")
    g = p.add_argument_group("run (CLIP_benchmark's flags)")
    g.add_argument("--recall_k", type=int, nargs="+", default=[5], help="k of recall@k for retrieval (default 5)")
    g.add_argument("--batch_size", type=int, default=64, help="images per batch (default 64)")
    g.add_argument("--num_workers", type=int, default=4, help="data-loading processes (default 4)")
    g.add_argument(
        "--no_amp",
        action="store_false",
        dest="amp",
        help="encode in float32; by default the encoders run under torch.autocast (bf16 on CPU, fp16 "
        "on CUDA), as CLIP_benchmark's",
    )
    g.add_argument(
        "--seed",
        type=int,
        default=0,
        help="torch.manual_seed before each run, and linear_probe's k-shot draw (default 0)",
    )
    g.add_argument(
        "--fewshot_k",
        type=int,
        default=5,
        help="linear_probe: images per class (default 5 here; CLIP_benchmark's -1, the whole train "
        "split, is not the few-shot protocol run here)",
    )
    g.add_argument(
        "--fewshot_grid",
        choices=["full", "reduced", "toolkit-exact"],
        default="full",
        help="(ours) linear_probe: the lr x weight-decay sweep of `clip-dcl eval fewshot --grid` (default full)",
    )
    g.add_argument(
        "--output",
        default=DEFAULT_OUTPUT,
        help="result file, a template with {dataset} {pretrained} {pretrained_full_path} {model} "
        f"{{language}} {{task}} (default {DEFAULT_OUTPUT})",
    )
    g.add_argument("--skip_existing", action="store_true", help="skip a run whose result file exists")
    g.add_argument("--quiet", dest="verbose", action="store_false", help="no progress bars and messages")
    g.add_argument(
        "--device",
        default="auto",
        help="(ours) torch device; auto (default): cuda when a GPU is visible, else cpu, as CLIP_benchmark",
    )
    for flag, reason in REFUSED_FLAGS.items():
        p.add_argument(flag, action=_Refuse, reason=reason)


def benchmark_tasks() -> list[str]:
    """``--task`` values run here: ``auto`` and the CLIP_benchmark name of every registered task that has one."""
    return ["auto"] + [
        t.benchmark_name for t in registered_tasks().values() if t.benchmark_name and t.benchmark_run is not None
    ]


def expand_models(
    models: Sequence[str], pretrained: Sequence[str], pretrained_model: Sequence[str] | None = None
) -> list[tuple[str, str]]:
    """(model, pretrained) pairs: CLIP_benchmark's product, or the ``--pretrained_model`` pairs and files."""
    if not pretrained_model:
        return list(product(models, pretrained))
    pairs = []
    for item in pretrained_model:
        if os.path.isfile(item):
            lines = [ln.strip() for ln in Path(item).read_text().splitlines() if ln.strip()]
            pairs.extend(expand_models((), (), lines))
        elif item in MODEL_COLLECTIONS:
            raise ValueError(
                f"--pretrained_model {item!r} is a collection of hub weights; name the pairs "
                "('MODEL,PRETRAINED') whose weights you have"
            )
        elif item.count(",") == 1:
            model, tag = item.split(",")
            pairs.append((model.strip(), tag.strip()))
        else:
            raise ValueError(f"--pretrained_model {item!r}: expected 'MODEL,PRETRAINED' or a file of such lines")
    return pairs


def expand_datasets(datasets: Sequence[str]) -> list[str]:
    """Data set names, a text file (one name a line) expanded as CLIP_benchmark does."""
    out = []
    for name in datasets:
        if os.path.isfile(name) and not name.endswith((".tar", ".csv", ".tsv")):
            out.extend(ln.strip() for ln in Path(name).read_text().splitlines() if ln.strip())
        else:
            out.append(name)
    return out


@dataclass
class BenchmarkRun:
    """One (model, pretrained, dataset, language) run: where its data is and where its result goes."""

    model: str
    pretrained: str
    dataset: str
    language: str
    task: str
    root: Path
    output: Path
    skipped: bool = False
    document: dict = field(default_factory=dict)


def locate_dataset(dataset: str, template: str, split: str = "test") -> Path:
    """``--dataset_root`` formatted for ``dataset`` and checked (``wds/<name>``: CLIP_benchmark's layout)."""
    short = short_name(dataset)
    try:
        root = template.format(dataset=short, dataset_cleaned=short.replace("/", "-"))
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(
            f"--dataset_root {template!r}: unknown or malformed field ({e}); the fields are "
            "{dataset} and {dataset_cleaned}"
        ) from e
    if "://" in root or root.startswith(("hf:", "hf-hub:", "s3:", "gs:", "pipe:")):
        raise ValueError(
            f"--dataset_root {root!r} is a remote location (a hub download); download the shards and "
            "point --dataset_root at the local folder"
        )
    if dataset.startswith("wds/"):
        from ..data.evalsets.benchmark import benchmark_layout_root
        from ..data.evalsets.files import describe_folder

        if not Path(root).exists():
            raise ValueError(f"data set {dataset!r}: --dataset_root {root!r} does not exist")
        if benchmark_layout_root(root, split) is None:
            raise ValueError(
                f"data set {dataset!r}: {root!r} is not in CLIP_benchmark's webdataset layout (no "
                f"{split}/nshards.txt); found {describe_folder(root)}"
            )
        return Path(root)
    if Path(dataset).exists():  # a folder or file named directly
        return Path(dataset)
    if Path(root).exists() and template != "root":
        return Path(root)
    raise ValueError(
        f"data set {dataset!r}: CLIP_benchmark builds it with its own downloader, which is not run "
        f"here; give wds/<name> with --dataset_root pointing at its shards in CLIP_benchmark's "
        f"webdataset layout, or a local folder"
    )


def resolve_task(task: str, dataset: str, root: Path, split: str = "test") -> str:
    """The CLIP_benchmark task of a run; ``auto`` is ``zeroshot_retrieval`` for retrieval data (its
    ``dataset_type.txt``, a retrieval set's name, a CSV/TSV, shards), else ``zeroshot_classification``."""
    if task in OTHER_TASKS:
        raise ValueError(f"--task {task}: {OTHER_TASKS[task]}")
    if task != "auto":
        if task not in benchmark_tasks():
            raise ValueError(f"--task {task!r}: no evaluation task runs it here; expected one of {benchmark_tasks()}")
        return task
    from ..data.evalsets.benchmark import benchmark_layout_root

    found = benchmark_layout_root(root, split)
    if found is not None:
        kind = found[0] / "dataset_type.txt"
        if kind.is_file() and kind.read_text().strip() == "retrieval":
            return "zeroshot_retrieval"
        return "zeroshot_classification"
    if short_name(dataset) in RETRIEVAL_NAMES or (root.is_file() and root.suffix.lower() in (".csv", ".tsv", ".tar")):
        return "zeroshot_retrieval"
    if root.is_dir() and any(root.glob("*.tar")):
        return "zeroshot_retrieval"
    return "zeroshot_classification"


@dataclass
class BenchmarkSettings:
    """The settings of a ``run_benchmark`` call that a task's ``benchmark_run`` reads."""

    options: object
    split: str = "test"
    recall_k: list = field(default_factory=lambda: [5])
    seed: int = 0
    fewshot_k: int = 5
    fewshot_grid: str = "full"
    custom_classname_file: str | None = None
    custom_template_file: str | None = None
    dump_classnames: bool = False
    dump_templates: bool = False

    def classnames(self, run: BenchmarkRun):
        """``--custom_classname_file``'s entry for the run's data set, else None."""
        return _custom(self.custom_classname_file, run.dataset, "classname")

    def templates(self, run: BenchmarkRun):
        """``--custom_template_file``'s entry for the run's data set (or ``imagenet1k``'s), else None."""
        return _custom(self.custom_template_file, run.dataset, "template", ("imagenet1k",))


def _custom(path, dataset: str, what: str, fallback: tuple[str, ...] = ()):
    """A CLIP_benchmark custom class-name / template JSON's entry for ``dataset`` (or ``fallback``), or None."""
    if path is None:
        return None
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--custom_{what}_file {str(path)!r} does not exist")
    try:
        doc = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"--custom_{what}_file {str(path)!r} is not valid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise ValueError(f"--custom_{what}_file {str(path)!r} must map data set names to {what}s")
    for key in (dataset, short_name(dataset)) + fallback:
        if key in doc:
            return doc[key]
    return None


def benchmark_precision(amp: bool, device: str) -> str:
    """Our precision for CLIP_benchmark's ``amp``: ``torch.autocast(device)`` is bf16 on CPU, fp16 on CUDA."""
    if not amp:
        return "fp32"
    return "amp_fp16" if str(device).startswith("cuda") else "amp_bf16"


def load_benchmark_model(model: str, pretrained: str, device: str, cache_dir: str | None = None):
    """(model, preprocess, tokenizer) for a (``--model``, ``--pretrained``) pair; ``local-dir:`` models ignore
    ``pretrained``."""
    import open_clip

    from ..models import register_builtin_configs

    register_builtin_configs()
    if model.startswith("local-dir:") or model.startswith("hf-hub:"):
        net, _, preprocess = open_clip.create_model_and_transforms(model, device=device, cache_dir=cache_dir)
        return net.eval(), preprocess, open_clip.get_tokenizer(model)
    if pretrained in NO_WEIGHTS:
        log.warning("--pretrained %r: evaluating randomly initialised %s", pretrained, model)
        net, _, preprocess = open_clip.create_model_and_transforms(model, device=device)
        return net.eval(), preprocess, open_clip.get_tokenizer(model)
    if os.path.isdir(pretrained) or os.path.isfile(pretrained):
        from ..checkpoint import load_checkpoint

        return load_checkpoint(pretrained, device, model)
    try:
        net, _, preprocess = open_clip.create_model_and_transforms(
            model, pretrained=pretrained, device=device, cache_dir=cache_dir
        )
    except RuntimeError as e:
        raise ValueError(f"--model {model!r} --pretrained {pretrained!r}: {str(e).splitlines()[0]}") from e
    return net.eval(), preprocess, open_clip.get_tokenizer(model)


def plan_runs(
    dataset: Sequence[str],
    dataset_root: str = "root",
    model: Sequence[str] = ("ViT-B-32-quickgelu",),
    pretrained: Sequence[str] = ("laion400m_e32",),
    pretrained_model: Sequence[str] | None = None,
    task: str = "auto",
    language: Sequence[str] = ("en",),
    split: str = "test",
    output: str = DEFAULT_OUTPUT,
) -> list[BenchmarkRun]:
    """Every run of the grid in CLIP_benchmark's order, its data, task and result path checked first."""
    pairs = expand_models(model, pretrained, pretrained_model)
    names = expand_datasets(dataset)
    if not names:
        raise ValueError("--dataset names no data set")
    roots = {n: locate_dataset(n, dataset_root, split) for n in names}
    tasks = {n: resolve_task(task, n, roots[n], split) for n in names}
    runs = []
    for (m, p), n, lang in product(pairs, names, language):
        runs.append(BenchmarkRun(m, p, n, lang, tasks[n], roots[n], output_path(output, n, m, p, lang, tasks[n])))
    return runs


def run_benchmark(
    dataset: Sequence[str],
    dataset_root: str = "root",
    model: Sequence[str] = ("ViT-B-32-quickgelu",),
    pretrained: Sequence[str] = ("laion400m_e32",),
    pretrained_model: Sequence[str] | None = None,
    task: str = "auto",
    language: Sequence[str] = ("en",),
    split: str = "test",
    recall_k: Sequence[int] = (5,),
    batch_size: int = 64,
    num_workers: int = 4,
    amp: bool = True,
    seed: int = 0,
    output: str = DEFAULT_OUTPUT,
    skip_existing: bool = False,
    custom_classname_file: str | None = None,
    custom_template_file: str | None = None,
    dump_classnames: bool = False,
    dump_templates: bool = False,
    model_cache_dir: str | None = None,
    device: str = "auto",
    verbose: bool = True,
    fewshot_k: int = 5,
    fewshot_grid: str = "full",
) -> list[BenchmarkRun]:
    """CLIP_benchmark's ``eval`` over the grid; the runs with their result ``document`` (empty when skipped)."""
    import torch

    from .encoding import EvalOptions, check_logit_scale, device_problem, resolve_device

    if batch_size < 1:
        raise ValueError(f"--batch_size must be >= 1, got {batch_size}")
    if num_workers < 0:
        raise ValueError(f"--num_workers must be >= 0, got {num_workers}")
    if min(recall_k) < 1:
        raise ValueError(f"--recall_k values must be >= 1, got {list(recall_k)}")
    if fewshot_k < 1:
        raise ValueError(
            f"--fewshot_k {fewshot_k}: give K >= 1 images per class; the probe here is ELEVATER's k-shot "
            "protocol (CLIP_benchmark's -1, the whole train split, is not run)"
        )
    if fewshot_grid not in ("full", "reduced", "toolkit-exact"):
        raise ValueError(f"--fewshot_grid must be full, reduced or toolkit-exact, got {fewshot_grid!r}")
    device = resolve_device(device)
    problem = device_problem(device)
    if problem:
        raise ValueError(f"--device {device!r}: {problem}")
    precision = benchmark_precision(amp, device)
    options = EvalOptions(
        batch_size=batch_size, device=device, workers=num_workers, progress=verbose, precision=precision
    )
    runs = plan_runs(dataset, dataset_root, model, pretrained, pretrained_model, task, language, split, output)
    settings = BenchmarkSettings(
        options=options,
        split=split,
        recall_k=list(recall_k),
        seed=seed,
        fewshot_k=fewshot_k,
        fewshot_grid=fewshot_grid,
        custom_classname_file=custom_classname_file,
        custom_template_file=custom_template_file,
        dump_classnames=dump_classnames,
        dump_templates=dump_templates,
    )
    checked = set()  # every data set's data read as far as it can be without a model, before the first one loads
    for run in runs:
        evaluation = benchmark_task(run.task)
        if (
            (run.dataset, run.task) in checked
            or evaluation.benchmark_check is None
            or (skip_existing and run.output.exists())
        ):
            continue
        evaluation.benchmark_check(run, settings)
        checked.add((run.dataset, run.task))
    loaded_key, loaded = None, None
    for run in runs:
        if skip_existing and run.output.exists():
            run.skipped = True
            if verbose:
                print(f"Skip {run.output}, exists already.")
            continue
        if verbose:
            print(
                f"Running '{run.task}' on '{run.dataset}' with the model '{run.model}' / '{run.pretrained}' on "
                f"language '{run.language}'"
            )
        if loaded_key != (run.model, run.pretrained):
            loaded = None  # free the previous model first
            loaded = load_benchmark_model(run.model, run.pretrained, device, model_cache_dir)
            loaded_key = (run.model, run.pretrained)
        net, preprocess, tokenizer = loaded
        torch.manual_seed(seed)
        evaluation = benchmark_task(run.task)
        check_logit_scale(net, evaluation.uses_logit_scale, f"clip-dcl eval benchmark --task {run.task}")
        metrics, extra = evaluation.benchmark_run(net, preprocess, tokenizer, run, settings)
        keep = evaluation.benchmark_metrics(metrics) if evaluation.benchmark_metrics else metrics
        run.document = {
            "dataset": run.dataset,
            "model": run.model,
            "pretrained": run.pretrained,
            "task": run.task,
            "metrics": keep,
            "language": run.language,
            **extra,
            "precision": precision,
        }
        write_json(run.output, run.document)
        if verbose:
            print(json.dumps(keep))
            print(f"Dump results to: {run.output}")
    return runs


def main(args: argparse.Namespace) -> int:
    """``clip-dcl eval benchmark``: `run_benchmark` with the parsed flags."""
    import inspect
    import sys

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    # every parameter of run_benchmark is the flag of its name (--task's dest is bench_task)
    names = inspect.signature(run_benchmark).parameters
    try:
        run_benchmark(**{name: getattr(args, "bench_task" if name == "task" else name) for name in names})
    except ValueError as e:
        print(f"clip-dcl eval benchmark: {e}", file=sys.stderr)
        return 2
    return 0
