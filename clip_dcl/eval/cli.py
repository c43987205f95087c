"""``clip-dcl eval retrieval|zeroshot|fewshot|benchmark``: thin wrappers over the evaluate_* functions.

Each subcommand loads the model (``--checkpoint`` a trainer ``.pt`` or an exported folder, see
:func:`clip_dcl.checkpoint.load_checkpoint`; or ``--model`` alone with OpenCLIP's
``--pretrained`` tag/file), runs one evaluator, prints a table and, with ``--output``, writes the
flat JSON of :mod:`clip_dcl.eval.report` (with ``--format clip_benchmark``, also CLIP_benchmark's
per-task JSON beside it). ``benchmark`` takes CLIP_benchmark's ``eval`` command line
(:mod:`clip_dcl.eval.benchmark`).

Examples::

    clip-dcl eval retrieval --checkpoint logs/x/checkpoints/epoch_10.pt --data data/val/ --output r.json
    clip-dcl eval retrieval --checkpoint exported/ --data /data/wds_mscoco_captions --recall-k 1 5 10 \
        --precision amp_bf16 --format clip_benchmark --output results/coco.json
    clip-dcl eval zeroshot  --checkpoint exported/ --data /data/imagenet/val
    clip-dcl eval fewshot   --checkpoint exported/ --data /data/elevater --datasets cifar-10 dtd --grid full
    clip-dcl eval benchmark --dataset wds/mscoco_captions --dataset_root '/data/wds_{dataset_cleaned}' \
        --task zeroshot_retrieval --model clip-dcl-tiny --pretrained epoch_10.pt --recall_k 1 5 10
"""
from __future__ import annotations

import argparse
import logging
import sys

from .encoding import PRECISIONS, EvalOptions, device_problem, resolve_device

log = logging.getLogger(__name__)



def _add_common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--checkpoint", default=None,
                   help="trainer checkpoint (epoch_K.pt) or a folder written by `clip-dcl export`")
    g.add_argument("--model", default=None,
                   help="OpenCLIP model name; needed when the checkpoint does not record it, or with no checkpoint")
    g.add_argument("--model-config", default=None, help="model config JSON for a custom architecture")
    g.add_argument("--unsafe-pickle", action="store_true",
                   help="load a --checkpoint that is not weights-only by full unpickling, which can run code from "
                        "the file: only for files you trust")
    g.add_argument("--pretrained", default=None,
                   help="OpenCLIP pretrained tag or weights file, used only without --checkpoint")
    g = p.add_argument_group("run")
    g.add_argument("--batch-size", type=int, default=64, help="images per encoder batch (default 64)")
    g.add_argument("--device", default="auto", help="torch device; auto (default): cuda if a GPU is visible, else cpu")
    g.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="encoder precision (default fp32; CLIP_benchmark runs under autocast unless --no_amp, "
                        "compare with amp_bf16/amp_fp16 there). Recorded in the JSON")
    g.add_argument("--workers", type=int, default=0, help="data-loading worker processes (default 0)")
    g.add_argument("--output", default=None,
                   help="write the results as JSON to this path (checked for writing before the evaluation starts)")
    g.add_argument("--strict", action="store_true",
                   help="stop at the first sample that would be skipped (no or empty caption, a caption or image "
                        "that does not decode, a shard that ends early), naming it (exit 2); by default such "
                        "samples are logged, left out and counted by cause in the JSON's \"skipped\"")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")


def _add_benchmark_format(p: argparse.ArgumentParser, task: str) -> None:
    g = p.add_argument_group("CLIP_benchmark output")
    g.add_argument("--format", choices=["flat", "clip_benchmark"], default="flat",
                   help="clip_benchmark: also write CLIP_benchmark's per-task JSON (dataset, model, pretrained, "
                        f"task={task}, metrics, language) beside --output (default flat: ours only)")
    g.add_argument("--dataset-name", default=None,
                   help="data set name in the CLIP_benchmark JSON (default: wds/<name> for its webdataset "
                        "layout in a folder wds_<name> or <name>, else the data's file or folder name; fewshot: "
                        "the set's name, one file per set)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clip-dcl eval", description="Evaluate a CLIP model.", allow_abbrev=False)
    sub = parser.add_subparsers(dest="task", required=True, metavar="{retrieval,zeroshot,fewshot,benchmark}")

    p = sub.add_parser("retrieval", allow_abbrev=False,
                       help="image<->text recall@k and ranks on val shards or a CSV",
                       description="Image-to-text and text-to-image recall@1/5/10, mean and median rank.")
    p.add_argument("--data", required=True,
                   help="folder of .tar shards, a shard pattern ('val-{000..003}.tar'), or a CSV/TSV of image,caption")
    p.add_argument("--csv-img-key", default=None, help="CSV image-path column (default: filepath/image/...)")
    p.add_argument("--csv-caption-key", default=None, help="CSV caption column (default: title/caption/...)")
    p.add_argument("--csv-separator", default=None, help="CSV separator (default: tab for .tsv, else comma)")
    p.add_argument("--recall-k", type=int, nargs="+", default=[1, 5, 10], metavar="K",
                   help="the k of recall@k, one or more (default 1 5 10)")
    p.add_argument("--chunk-size", type=int, default=1024,
                   help="query rows scored at once; memory ~ chunk x N x 5 bytes (default 1024)")
    _add_common(p)
    _add_benchmark_format(p, "zeroshot_retrieval")

    p = sub.add_parser("zeroshot", allow_abbrev=False,
                       help="zero-shot top-1/top-5/mean per-class recall (or mAP for multi-label data)",
                       description="Zero-shot classification on an ImageFolder tree (ImageNet synset folders use "
                                   "OpenCLIP's class names and templates) or CLIP_benchmark's webdataset layout.")
    p.add_argument("--data", required=True,
                   help="ImageFolder root ROOT/<class>/<images>, or a CLIP_benchmark webdataset data set "
                        "(ROOT/test/nshards.txt, classnames.txt, zeroshot_classification_templates.txt)")
    p.add_argument("--split", default="test", help="split folder of CLIP_benchmark's layout (default test)")
    p.add_argument("--classnames", default=None,
                   help="class-name file (default: the data's classnames.txt, or ImageNet's)")
    p.add_argument("--templates", default=None,
                   help="template file: one per line with {c}, or JSON (a list, or CuPL's class -> prompts) "
                        "(default: the data's templates, or OpenAI's 80)")
    _add_common(p)
    _add_benchmark_format(p, "zeroshot_classification")

    p = sub.add_parser("fewshot", allow_abbrev=False, help="ELEVATER k-shot linear probe (and mean classifier)",
                       description="ELEVATER few-shot linear probe on frozen features.")
    p.add_argument("--data", required=True,
                   help="the ELEVATER toolkit's data root as downloaded (classification/<root_folder>/...), or one "
                        "folder per data set (iris index, COCO json or train/test ImageFolder); optional catalog.json")
    p.add_argument("--datasets", nargs="+", default=None, help="data set names under --data (default: all)")
    p.add_argument("--shots", type=int, default=5, help="images per class (default 5)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="sampling seeds (default 0 1 2)")
    p.add_argument("--grid", choices=["full", "reduced", "toolkit-exact"], default="full",
                   help="lr x weight-decay sweep: the toolkit's full grid (default; pairs with lr*wd >= 3.8 "
                        "skipped), a reduced one for quick runs, or toolkit-exact (the full grid, every pair trained "
                        "and scored as the toolkit does)")
    p.add_argument("--epoch-selection", choices=["last", "toolkit"], default="last",
                   help="the probe column: the final run's last epoch (default), or its best test epoch, which is "
                        "what the toolkit reports; the table shows both")
    p.add_argument("--text-init", action=argparse.BooleanOptionalAction, default=True,
                   help="initialise the head with the zero-shot text classifier (default on)")
    _add_common(p)
    _add_benchmark_format(p, "linear_probe")

    from .benchmark import add_benchmark_arguments

    p = sub.add_parser("benchmark", allow_abbrev=False,
                       help="CLIP_benchmark's `eval` command line (its flags, defaults and result files)",
                       description="Run a CLIP_benchmark `clip_benchmark eval ...` command line locally: "
                                   "zeroshot_classification and zeroshot_retrieval on its webdataset layout "
                                   "(--dataset wds/<name> --dataset_root FOLDER) or a local folder, over the "
                                   "model x pretrained x dataset x language grid; result files as CLIP_benchmark "
                                   "names and writes them.")
    add_benchmark_arguments(p)
    return parser


def _load_model(args):
    """(model, preprocess, tokenizer, model description) from the common flags."""
    import open_clip

    from ..models import register_builtin_configs, register_model_config

    if args.checkpoint:
        from ..checkpoint import load_checkpoint

        model, preprocess, tokenizer = load_checkpoint(args.checkpoint, args.device, args.model, args.model_config,
                                                       allow_unsafe_pickle=args.unsafe_pickle)
        name = getattr(model, "clip_dcl_model_name", args.model or f"local-dir:{args.checkpoint}")
        return model, preprocess, tokenizer, {"name": name, "checkpoint": str(args.checkpoint)}
    if not args.model:
        raise ValueError("give --checkpoint, or --model (with --pretrained for weights)")
    register_builtin_configs()
    name = register_model_config(args.model_config) if args.model_config else args.model
    if args.model_config and args.model != name:
        raise ValueError(f"--model {args.model!r} differs from the config file's name {name!r}")
    if not args.pretrained:
        log.warning("no --checkpoint or --pretrained: evaluating randomly initialised %s", name)
    model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=args.pretrained, device=args.device)
    return model.eval(), preprocess, open_clip.get_tokenizer(name), {"name": name, "pretrained": args.pretrained}


def main(argv: list[str] | None = None) -> int:
    from .report import (benchmark_document, benchmark_output_path, fewshot_benchmark_documents, fewshot_table,
                         metrics_table, result_document, retrieval_table, write_json)

    args = build_parser().parse_args(argv)
    if args.task == "benchmark":
        from .benchmark import main as benchmark_main

        return benchmark_main(args)
    if args.batch_size < 1:
        print(f"clip-dcl eval: --batch-size must be >= 1, got {args.batch_size}", file=sys.stderr)
        return 2
    if args.workers < 0:
        print(f"clip-dcl eval: --workers must be >= 0, got {args.workers}", file=sys.stderr)
        return 2
    if args.task == "retrieval" and min(args.recall_k) < 1:
        print(f"clip-dcl eval: --recall-k values must be >= 1, got {args.recall_k}", file=sys.stderr)
        return 2
    if args.task == "fewshot" and args.dataset_name and len(args.datasets or []) != 1:
        print(f"clip-dcl eval fewshot: --dataset-name {args.dataset_name!r} names one data set; give exactly one "
              f"with --datasets", file=sys.stderr)
        return 2
    if getattr(args, "format", "flat") == "clip_benchmark" and not args.output:
        print("clip-dcl eval: --format clip_benchmark writes beside --output; give --output FILE.json", file=sys.stderr)
        return 2
    if args.output:  # written after the whole evaluation: checked before it
        from ..paths import output_file_problem

        problem = output_file_problem(args.output)
        if problem:
            print(f"clip-dcl eval: --output {args.output}: {problem}", file=sys.stderr)
            return 2
    if args.task == "zeroshot" and args.templates:  # read again by the evaluation; checked before the model loads
        from ..data.evalsets.files import read_templates

        try:
            read_templates(args.templates)
        except ValueError as e:
            print(f"clip-dcl eval zeroshot: --templates: {e}", file=sys.stderr)
            return 2
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    args.device = resolve_device(args.device)
    device_error = device_problem(args.device)
    if device_error:
        print(f"clip-dcl eval: --device {args.device!r}: {device_error}", file=sys.stderr)
        return 2
    progress = not args.no_progress
    from ..data.evalsets.skips import SkipCounter

    skips = SkipCounter(strict=args.strict)  # every evaluator counts into it: the JSON's "skipped"
    common = dict(options=EvalOptions(batch_size=args.batch_size, device=args.device, workers=args.workers,
                                      progress=progress, precision=args.precision, strict=args.strict), skips=skips)
    settings = {"batch_size": args.batch_size, "device": args.device, "workers": args.workers,
                "precision": args.precision}
    details = None
    try:
        model, preprocess, tokenizer, model_info = _load_model(args)
        if args.task == "retrieval":
            from .retrieval import evaluate_retrieval

            metrics, info = evaluate_retrieval(model, preprocess, tokenizer, args.data, chunk_size=args.chunk_size,
                                               csv_img_key=args.csv_img_key, csv_caption_key=args.csv_caption_key,
                                               csv_separator=args.csv_separator, ks=args.recall_k,
                                               return_info=True, **common)
            table = retrieval_table(metrics, args.recall_k)
            settings.update(chunk_size=args.chunk_size, normalize=True, recall_k=args.recall_k)
            data = {"path": str(args.data), **info}
        elif args.task == "zeroshot":
            from .zeroshot import evaluate_zeroshot

            metrics, info = evaluate_zeroshot(model, preprocess, tokenizer, args.data, classnames=args.classnames,
                                              templates=args.templates, split=args.split, return_info=True, **common)
            table = metrics_table(metrics)
            info.pop("classnames")
            info.pop("templates")
            settings.update(classnames=info.pop("classnames_source"), templates=info.pop("templates_source"),
                            num_templates=info.pop("num_templates"))
            data = {"path": str(args.data), **info}
        else:
            from .fewshot import run_fewshot

            report = run_fewshot(model, preprocess, tokenizer, args.data, datasets=args.datasets,
                                 shots=args.shots, seeds=args.seeds, grid=args.grid,
                                 epoch_selection=args.epoch_selection, text_init=args.text_init, **common)
            metrics = report.metrics
            table = fewshot_table(metrics)
            settings.update(report.settings)
            data = {"path": str(args.data), "datasets": report.datasets}
            details = report.to_dict()["probes"]
            fewshot_sets = report.datasets
    except ValueError as e:
        print(f"clip-dcl eval {args.task}: {e}", file=sys.stderr)
        return 2
    print(table)
    if args.output:
        data.pop("skipped", None)
        doc = result_document(metrics, model_info, data, settings, details)
        doc["skipped"] = skips.as_dict()
        path = write_json(args.output, doc)
        print(f"wrote {path}")
        if getattr(args, "format", "flat") == "clip_benchmark":
            if args.task == "fewshot":
                benches = fewshot_benchmark_documents(metrics, model_info, fewshot_sets, settings, details,
                                                      args.precision)
                if args.dataset_name:
                    benches[0]["dataset"] = args.dataset_name
            else:
                benches = [benchmark_document(args.task, metrics, model_info, args.data, args.dataset_name,
                                              args.precision)]
            for bench in benches:
                path = write_json(benchmark_output_path(args.output, bench), bench)
                print(f"wrote {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
