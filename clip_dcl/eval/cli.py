"""``clip-dcl eval retrieval|zeroshot|fewshot|benchmark``: thin wrappers over the evaluate_* functions; a bad
invocation is one `FlagError` line naming the flag (exit 2).
"""

from __future__ import annotations

import argparse
import logging
import sys

from ..arguments import FlagParser
from ..errors import FlagError
from .encoding import PRECISIONS, EvalOptions, check_logit_scale, device_problem, resolve_device
from .report import metrics_table

log = logging.getLogger(__name__)


def _add_common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument(
        "--checkpoint", default=None, help="trainer checkpoint (epoch_K.pt) or a folder written by `clip-dcl export`"
    )
    g.add_argument(
        "--model",
        default=None,
        help="OpenCLIP model name; needed when the checkpoint does not record it, or with no checkpoint",
    )
    g.add_argument("--model-config", default=None, help="model config JSON for a custom architecture")
    g.add_argument(
        "--unsafe-pickle",
        action="store_true",
        help="load a --checkpoint that is not weights-only by full unpickling, which can run code from "
        "the file: only for files you trust",
    )
    g.add_argument(
        "--pretrained", default=None, help="OpenCLIP pretrained tag or weights file, used only without --checkpoint"
    )
    g = p.add_argument_group("run")
    g.add_argument("--batch-size", type=int, default=64, help="images per encoder batch (default 64)")
    g.add_argument("--device", default="auto", help="torch device; auto (default): cuda if a GPU is visible, else cpu")
    g.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help="encoder precision (default fp32; CLIP_benchmark runs under autocast unless --no_amp, "
        "compare with amp_bf16/amp_fp16 there). Recorded in the JSON",
    )
    g.add_argument("--workers", type=int, default=0, help="data-loading worker processes (default 0)")
    g.add_argument(
        "--output",
        default=None,
        help="write the results as JSON to this path (checked for writing before the evaluation starts)",
    )
    g.add_argument(
        "--strict",
        action="store_true",
        help="stop at the first sample that would be skipped (no or empty caption, a caption or image "
        "that does not decode, a shard that ends early), naming it (exit 2); by default such "
        'samples are logged, left out and counted by cause in the JSON\'s "skipped"',
    )
    g.add_argument("--no-progress", action="store_true", help="no progress bars")


def _add_benchmark_format(p: argparse.ArgumentParser, task: str) -> None:
    g = p.add_argument_group("CLIP_benchmark output")
    g.add_argument(
        "--format",
        choices=["flat", "clip_benchmark"],
        default="flat",
        help="clip_benchmark: also write CLIP_benchmark's per-task JSON (dataset, model, pretrained, "
        f"task={task}, metrics, language) beside --output (default flat: ours only)",
    )
    g.add_argument(
        "--dataset-name",
        default=None,
        help="data set name in the CLIP_benchmark JSON (default: wds/<name> for its webdataset "
        "layout in a folder wds_<name> or <name>, else the data's file or folder name; fewshot: "
        "the set's name, one file per set)",
    )


def build_parser() -> argparse.ArgumentParser:
    """``clip-dcl eval``: a subcommand per registered task (its options, the shared flags) and ``benchmark``."""
    from .benchmark import add_benchmark_arguments
    from .tasks import registered_tasks

    tasks = registered_tasks()
    parser = FlagParser(prog="clip-dcl eval", description="Evaluate a CLIP model.", allow_abbrev=False)
    sub = parser.add_subparsers(dest="task", required=True, metavar="{" + ",".join([*tasks, "benchmark"]) + "}")
    for task in tasks.values():
        description = task.description
        if task.metrics:
            description += " Metrics: " + ", ".join(task.metrics) + "."
        p = sub.add_parser(task.name, allow_abbrev=False, help=task.help, description=description)
        task.add_arguments(p)
        _add_common(p)
        if task.benchmark_name:
            _add_benchmark_format(p, task.benchmark_name)

    p = sub.add_parser(
        "benchmark",
        allow_abbrev=False,
        help="CLIP_benchmark's `eval` command line (its flags, defaults and result files)",
        description="Run a CLIP_benchmark `clip_benchmark eval ...` command line locally: "
        "zeroshot_classification, zeroshot_retrieval and linear_probe (ELEVATER's "
        "few-shot probe) on its webdataset layout (--dataset wds/<name> --dataset_root "
        "FOLDER) or a local folder, over the model x pretrained x dataset x language grid; "
        "result files as CLIP_benchmark names and writes them.",
    )
    add_benchmark_arguments(p)
    return parser


def _load_model(args):
    """(model, preprocess, tokenizer, model description) from the common flags."""
    import open_clip

    from ..models import model_name_problem, register_builtin_configs, register_model_config

    if args.checkpoint:
        from ..checkpoint import load_checkpoint

        model, preprocess, tokenizer = load_checkpoint(
            args.checkpoint, args.device, args.model, args.model_config, allow_unsafe_pickle=args.unsafe_pickle
        )
        # the model scored, never --model as given (an exported folder loads what its config says)
        info = {"name": model.clip_dcl_model_name, "checkpoint": str(args.checkpoint)}
        if getattr(model, "clip_dcl_exported_model", None):
            info["exported_model"] = model.clip_dcl_exported_model
        return model, preprocess, tokenizer, info
    if not args.model:
        raise ValueError("give --checkpoint, or --model (with --pretrained for weights)")
    register_builtin_configs()
    name = register_model_config(args.model_config) if args.model_config else args.model
    if args.model_config and args.model != name:
        raise ValueError(f"--model {args.model!r} differs from the config file's name {name!r}")
    problem = model_name_problem(name)
    if problem:
        raise ValueError(f"--model {problem}")
    if not args.pretrained:
        log.warning("no --checkpoint or --pretrained: evaluating randomly initialised %s", name)
    model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=args.pretrained, device=args.device)
    return model.eval(), preprocess, open_clip.get_tokenizer(name), {"name": name, "pretrained": args.pretrained}


def _check_common(args) -> None:
    """The flags every task shares, checked before the model loads; `FlagError` naming the bad one."""
    if args.batch_size < 1:
        raise FlagError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.workers < 0:
        raise FlagError(f"--workers must be >= 0, got {args.workers}")
    if getattr(args, "format", "flat") == "clip_benchmark" and not args.output:
        raise FlagError("--format clip_benchmark writes beside --output; give --output FILE.json")
    if args.output:  # written after the whole evaluation: checked before it
        from ..paths import output_file_problem

        problem = output_file_problem(args.output)
        if problem:
            raise FlagError(f"--output {args.output}: {problem}")


def main(argv: list[str] | None = None) -> int:
    """Run ``clip-dcl eval`` with ``argv``; the exit code (2 for a bad invocation or unusable data, 1 for an
    ``--output`` that cannot be written, 130 for Ctrl-C: each with one line)."""
    from .. import exitcodes
    from ..paths import DISK_FULL, NOT_WRITABLE

    args = build_parser().parse_args(argv)
    prog = f"clip-dcl eval {args.task}" if args.task else "clip-dcl eval"
    try:
        return _main(args)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted (Ctrl-C); no --output was written", file=sys.stderr, flush=True)
        return exitcodes.INTERRUPTED
    except OSError as e:
        if e.errno not in DISK_FULL + NOT_WRITABLE:
            raise
        print(
            f"{prog}: cannot write {e.filename or args.output!r} ({e.strerror}): free space or give an --output "
            "you can write; nothing was left half-written",
            file=sys.stderr,
        )
        return exitcodes.FAILED


def _main(args) -> int:
    from .report import benchmark_document, benchmark_output_path, result_document, write_json
    from .tasks import get_task

    if args.task == "benchmark":
        from .benchmark import main as benchmark_main

        return benchmark_main(args)
    task = get_task(args.task)
    for check, prog in ((_check_common, "clip-dcl eval"), (task.check, f"clip-dcl eval {task.name}")):
        try:
            check(args)
        except FlagError as e:
            print(f"{prog}: {e}", file=sys.stderr)
            return 2
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    args.device = resolve_device(args.device)
    device_error = device_problem(args.device)
    if device_error:
        print(f"clip-dcl eval: --device {args.device!r}: {device_error}", file=sys.stderr)
        return 2
    from ..data.skips import SkipCounter

    skips = SkipCounter(strict=args.strict)  # every evaluator counts into it: the JSON's "skipped"
    settings = {key: getattr(args, key) for key in ("batch_size", "device", "workers", "precision")}
    options = EvalOptions(**settings, progress=not args.no_progress, strict=args.strict)
    common = dict(options=options, skips=skips)
    try:
        model, preprocess, tokenizer, model_info = _load_model(args)
        check_logit_scale(model, task.uses_logit_scale, f"clip-dcl eval {task.name}")
        result = task.run(model, preprocess, tokenizer, args, common)
    except ValueError as e:
        print(f"clip-dcl eval {task.name}: {e}", file=sys.stderr)
        return 2
    settings.update(result.settings)
    shown = {"chance": result.chance} if result.chance else {}  # a task that reports chance levels shows them
    print(task.table(result.metrics, args, **shown) if task.table else metrics_table(result.metrics))
    if args.output:
        data = dict(result.data)
        data.pop("skipped", None)
        doc = result_document(result.metrics, model_info, data, settings, result.details)
        doc["skipped"] = skips.as_dict()
        if result.chance:
            doc["chance"] = result.chance
        path = write_json(args.output, doc)
        print(f"wrote {path}")
        if getattr(args, "format", "flat") == "clip_benchmark":
            if task.benchmark_documents is not None:
                benches = task.benchmark_documents(result, model_info, args, args.precision)
            else:
                benches = [
                    benchmark_document(
                        task.benchmark_name,
                        task.benchmark_metrics(result.metrics),
                        model_info,
                        args.data,
                        args.dataset_name,
                        args.precision,
                    )
                ]
            for bench in benches:
                path = write_json(benchmark_output_path(args.output, bench), bench)
                print(f"wrote {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
