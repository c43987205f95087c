"""``clip-dcl data ...``: the data-set commands (synth, fashion-mnist, fashion-scenes, benchmark, shards, pack),
each a thin wrapper over the Python function its description names."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses

from ..arguments import FlagParser

_SYNTH_HELP = {
    "seed": "random seed; the same seed gives the same bytes",
    "image_size": "image side in pixels",
    "num_classes": "number of latent classes C (shape x colour pairs, 2..48); tau_plus = sum_c p_c^2 ~ 1/C",
    "class_imbalance": "Zipf exponent a of the class frequencies, p_c ~ (c+1)^-a (0 = balanced)",
    "train_samples": "training samples (written to OUT_DIR/train)",
    "val_samples": "validation retrieval samples (written to OUT_DIR/val): the split that choices are made on",
    "test_samples": "test retrieval samples (OUT_DIR/test, and zeroshot_per_class images per class in "
    "OUT_DIR/zeroshot_test), from seed streams of their own: the split quoted numbers come from; "
    "0 writes none, and the other splits are the same either way",
    "shard_size": "samples per .tar shard",
    "captions_per_image": "captions per training image (the first one is the .txt, all are in the json)",
    "val_captions_per_image": "captions per retrieval image (json 'captions')",
    "zeroshot_per_class": "zero-shot images per latent class",
    "fewshot_train_per_class": "few-shot training images per class (>= 5 for 5-shot sampling)",
    "fewshot_test_per_class": "few-shot test images per class",
    "jpeg_quality": "JPEG quality (1..95)",
}


def _add_synth_parser(subparsers) -> None:
    from .synth import SynthConfig

    defaults, quick = SynthConfig(), SynthConfig.quick()
    p = subparsers.add_parser(
        "synth",
        allow_abbrev=False,
        help="generate the synthetic image-caption data with latent classes",
        description="Generate synthetic captioned shapes with latent classes: train/val shards in the "
        "Conceptual Captions layout, a zero-shot ImageFolder set and an ELEVATER-layout few-shot "
        "suite (see clip_dcl.data.synth).",
    )
    p.add_argument("out_dir", metavar="OUT_DIR", help="output folder")
    _add_config_flags(p, defaults, _SYNTH_HELP, quick)
    p.add_argument("--quick", action="store_true", help="a tiny set for tests and smoke runs")
    _add_output_flags(p, "the same settings")
    p.set_defaults(func=_run_synth, parser=p)


def _add_config_flags(p, defaults, helps: dict, quick=None) -> None:
    """One ``--field-name`` flag per field of the config ``defaults`` (default None: the config's own applies), its
    help from ``helps`` with the default (and ``quick``'s, where it differs)."""
    for field in dataclasses.fields(defaults):
        value = getattr(defaults, field.name)
        small = value if quick is None else getattr(quick, field.name)
        text = helps[field.name] + f" (default {value}" + (f"; {small} with --quick)" if small != value else ")")
        p.add_argument("--" + field.name.replace("_", "-"), dest=field.name, type=type(value), default=None, help=text)


def _add_output_flags(p, same: str) -> None:
    """The flags every data writer shares: --overwrite, --reuse (when the summary has ``same``), --quiet, --pack."""
    p.add_argument("--overwrite", action="store_true", help="replace earlier outputs in OUT_DIR")
    p.add_argument(
        "--reuse", action="store_true", help=f"keep earlier outputs in OUT_DIR when their summary.json has {same}"
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument(
        "--pack",
        action="store_true",
        help="also write OUT_DIR/train.npz: the training shards decoded once (see `clip-dcl data pack`)",
    )


def _run_synth(args) -> int:
    from .synth import generate

    return _run_writer(args, generate, _SYNTH_HELP, quick=args.quick)


class WriterStopped(Exception):
    """A writer that ended with its one line said; ``code`` is its exit code."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


@contextlib.contextmanager
def held(args, out, overwrite: bool = False, folder: bool = True):
    """Write ``out`` holding it (`clip_dcl.data.output.writing`); a second writer, an unfinished output, a full
    disk, a read-only folder and Ctrl-C each end in one line naming the output and the fix (`WriterStopped`)."""
    import sys

    from .. import exitcodes
    from ..paths import DISK_FULL, NOT_WRITABLE
    from .output import OutputBusy, OutputUnfinished, writing

    command = f"clip-dcl data {args.command}"

    def said(text: str, code: int):
        print(f"{command}: {text}", file=sys.stderr, flush=True)
        raise WriterStopped(code)

    try:
        with writing(out, command, overwrite=overwrite, folder=folder):
            yield
    except (OutputBusy, OutputUnfinished) as e:
        said(str(e), exitcodes.USAGE)
    except KeyboardInterrupt:
        said(
            f"interrupted (Ctrl-C): {str(out)!r} is unfinished; run the command again with --overwrite",
            exitcodes.INTERRUPTED,
        )
    except OSError as e:
        where = e.filename or out
        if e.errno in DISK_FULL:
            fix = "free space on its disk (or write elsewhere) and run the command again with --overwrite"
        elif e.errno in NOT_WRITABLE:
            fix = "write into a folder you can write in"
        else:
            raise
        said(f"cannot write {str(where)!r} ({e.strerror or e}): {fix}", exitcodes.FAILED)


def _run_writer(args, generate, helps: dict, **kwargs) -> int:
    """Run a data writer with the config flags given, print what it wrote and with --pack pack its training shards;
    missing source files are one line (exit 2), a bad value a usage error."""
    import sys

    from .fashion import DataMissing

    overrides = {f: getattr(args, f) for f in helps if getattr(args, f) is not None}
    try:
        with held(args, args.out_dir, overwrite=args.overwrite):
            summary = generate(
                args.out_dir, overwrite=args.overwrite, reuse=args.reuse, verbose=not args.quiet, **kwargs, **overrides
            )
    except DataMissing as e:
        print(f"clip-dcl data {args.command}: {e}", file=sys.stderr)
        return 2
    except (ValueError, FileExistsError) as e:
        args.parser.error(str(e))
    except WriterStopped as e:
        return e.code
    print(f"tau_plus {summary['tau_plus']:.6f}")
    for key in ("train_data", "val_data", "test_data"):
        if key in summary:
            print(f"{key} {summary[key]}")
    print(f"summary {summary['out_dir']}/summary.json")
    if args.pack:
        from .packed import pack_synth

        # --reuse keeps a packed file written after the shards it was packed from
        print(f"train_packed {pack_synth(summary, reuse=args.reuse, verbose=not args.quiet)}")
    return 0


_FASHION_HELP = {
    "seed": "the data draw: which training images are held out for validation and which train, and the "
    "captions' wording; the test split is the official test set whatever the draw",
    "image_size": "image side in pixels (the 28 px images are centred on a black square; smaller sizes resize)",
    "val_samples": "validation images held out of the official training set (choices are made on them; the "
    "zero-shot tree zeroshot/ and the few-shot pools are made of them)",
    "train_samples": "training images (0: every official training image not held out)",
    "test_samples": "test images, the first of the official test set (0: all of them)",
    "captions_per_image": "captions per training image (the first one is the .txt, all are in the json)",
    "val_captions_per_image": "captions per validation and test image (retrieval's targets)",
    "shard_size": "samples per .tar shard",
    "fewshot_train_per_class": "few-shot training images per class (from the validation images; >= 5)",
    "fewshot_test_per_class": "few-shot test images per class (from the test set)",
}


def _add_source_flags(p) -> None:
    """OUT_DIR and --from DIR, of the writers that read Fashion-MNIST's files."""
    from .fashion import DEBIAN_DIR

    p.add_argument("out_dir", metavar="OUT_DIR", help="output folder")
    p.add_argument(
        "--from",
        dest="source",
        default=DEBIAN_DIR,
        metavar="DIR",
        help=f"folder of the four IDX files (default {DEBIAN_DIR})",
    )


def _add_fashion_parser(subparsers) -> None:
    from .fashion import DEBIAN_DIR, DEBIAN_PACKAGE, FILES, FashionConfig

    defaults = FashionConfig()
    p = subparsers.add_parser(
        "fashion-mnist",
        allow_abbrev=False,
        help="Fashion-MNIST (real photographs) as captioned shards and eval sets",
        description="Write Fashion-MNIST's images with captions measured from their pixels (class name, brightness, "
        "size in the frame, width against height, texture) in the layout the trainer, the evaluators and "
        "`clip-dcl study` read: train/val/test shards, zero-shot trees with the real class names, an "
        "ELEVATER-layout few-shot suite, summary.json (see clip_dcl.data.fashion). It reads the four "
        f"official files ({', '.join(FILES.values())}): `apt-get install {DEBIAN_PACKAGE}` puts them "
        f"in {DEBIAN_DIR}. Any IDX image/label pair of that layout works (MNIST: give --classnames).",
    )
    _add_source_flags(p)
    p.add_argument(
        "--classnames",
        default=None,
        metavar="FILE",
        help="one class name a line, in label order (default: Fashion-MNIST's ten names)",
    )
    _add_config_flags(p, defaults, _FASHION_HELP)
    _add_output_flags(p, "the same settings and files")
    p.set_defaults(func=_run_fashion, parser=p)


_SCENES_HELP = {
    "seed": "the data draw: which training images are held out for validation, the scenes and the captions' wording",
    "image_size": "canvas side in pixels (each photograph is shrunk to one cell: image size / grid)",
    "grid": "cells per side: 2 (top left ... bottom right) or 3 (adds the centre row and column; captions of more "
    "than four items outgrow the 64 tokens clip-dcl-micro-fscenes reads)",
    "min_items": "fewest photographs in a scene (the top-left cell always holds one)",
    "max_items": "most photographs in a scene",
    "min_attributes": "fewest measured attributes named per item",
    "max_attributes": "most measured attributes named per item",
    "holdout": "official training images held out: the validation scenes are made of them only",
    "train_samples": "training scenes (of the training images not held out)",
    "val_samples": "validation scenes (choices are made on them; the zero-shot tree zeroshot/ is made of them)",
    "test_samples": "test scenes (of the official test images)",
    "captions_per_image": "captions per training scene (the first one is the .txt, all are in the json)",
    "val_captions_per_image": "captions per validation and test scene (retrieval's targets; distinct in a split)",
    "shard_size": "samples per .tar shard",
    "fewshot_train_per_class": "few-shot training scenes per class of the top-left item (from the validation scenes; "
    ">= 5)",
    "fewshot_test_per_class": "few-shot test scenes per class (from the test scenes)",
}


def _add_scenes_parser(subparsers) -> None:
    from .fashion import DEBIAN_DIR, DEBIAN_PACKAGE, FILES
    from .scenes import ScenesConfig

    p = subparsers.add_parser(
        "fashion-scenes",
        allow_abbrev=False,
        help="scenes of 2-4 Fashion-MNIST photographs at named places, captioned, in the same layout",
        description="Write scenes of Fashion-MNIST photographs: each image a grid of cells (2 x 2 by default) holding "
        "two to four photographs, its caption naming each item's class, its cell and one or two attributes "
        'measured from its pixels ("a faint coat on the top left and a small sneaker at the bottom '
        'right."); training scenes from the official training images, validation scenes from training '
        "images held out, test scenes from the official test images; the zero-shot class is the item on the "
        "top left (see clip_dcl.data.scenes). Same layout as `clip-dcl data fashion-mnist`; it reads the "
        f"same four files ({', '.join(FILES.values())}; `apt-get install {DEBIAN_PACKAGE}` puts them in "
        f"{DEBIAN_DIR}).",
    )
    _add_source_flags(p)
    _add_config_flags(p, ScenesConfig(), _SCENES_HELP)
    _add_output_flags(p, "the same settings and files")
    p.set_defaults(func=_run_scenes, parser=p)


def _run_scenes(args) -> int:
    from .scenes import generate

    return _run_writer(args, generate, _SCENES_HELP, source=args.source)


def _run_fashion(args) -> int:
    from pathlib import Path

    from .fashion import generate

    classnames = None
    if args.classnames:
        path = Path(args.classnames)
        if not path.is_file():
            args.parser.error(f"--classnames {args.classnames}: no such file")
        classnames = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    return _run_writer(args, generate, _FASHION_HELP, source=args.source, classnames=classnames)


def _add_pack_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "pack",
        allow_abbrev=False,
        help="decode training shards once into one .npz that training holds in memory",
        description="Read the shards of PATTERN once, in order, and write OUT (.npz): the decoded images (one size), "
        "their .txt captions, keys and sample ids. `python -m clip_dcl.train -- --train-data OUT ...` "
        "then trains without decoding or tokenising per epoch (see clip_dcl.train.packed).",
    )
    p.add_argument(
        "pattern", metavar="PATTERN", help="training shards, as --train-data takes them ('train/{00000..00007}.tar')"
    )
    p.add_argument("out", metavar="OUT", help="the packed file to write (.npz)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=_run_pack, parser=p)


def _run_pack(args) -> int:
    from .packed import pack_shards

    try:
        # the file is written whole (renamed into place), so an earlier writer's unfinished mark is no matter
        with held(args, args.out, overwrite=True, folder=False):
            written = pack_shards(args.pattern, args.out, verbose=not args.quiet)
    except ValueError as e:
        args.parser.error(str(e))
    except WriterStopped as e:
        return e.code
    print(f"train_packed {written['path']} {written['num_samples']} samples")
    return 0


def _add_benchmark_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "benchmark",
        allow_abbrev=False,
        help="write shards or an image folder in CLIP_benchmark's webdataset layout",
        description="Write image-caption shards (img2dataset's layout, e.g. synth's val/ or test/) as a CLIP_benchmark "
        "retrieval set, or an ImageFolder tree (e.g. synth's zeroshot/) as a classification set: "
        "OUT_DIR/<split>/nshards.txt, 0.tar ... and the set's metadata. Evaluate it with `clip-dcl eval "
        "benchmark --dataset wds/<name> --dataset_root OUT_DIR` (a folder named wds_<name> is how "
        "CLIP_benchmark publishes <name>).",
    )
    p.add_argument("source", metavar="SOURCE", help="a folder of .tar shards, a shard pattern, or an ImageFolder root")
    p.add_argument("out_dir", metavar="OUT_DIR", help="output folder (its split folder must be absent or empty)")
    p.add_argument(
        "--kind",
        choices=["auto", "retrieval", "classification"],
        default="auto",
        help="auto (default): retrieval for shards, classification for an ImageFolder tree",
    )
    p.add_argument("--split", default="test", help="split folder to write (default test)")
    p.add_argument("--shard-size", type=int, default=1000, help="samples per shard (default 1000)")
    p.add_argument(
        "--classnames",
        default=None,
        help='classification: class-name file, JSON {"folder": "name", ...} or one name a line in '
        "sorted folder order, each line naming its folder (default: SOURCE/classnames.json or "
        "SOURCE/classnames.txt, else ImageNet's names for its synset folders, else the folder names)",
    )
    p.add_argument(
        "--templates", default=None, help="classification: template file (default: SOURCE/templates.txt when present)"
    )
    p.set_defaults(func=_run_benchmark, parser=p)


def _run_benchmark(args) -> int:
    from .evalsets.write_benchmark import write_benchmark_shards

    try:
        written = write_benchmark_shards(
            args.source,
            args.out_dir,
            kind=args.kind,
            split=args.split,
            shard_size=args.shard_size,
            classnames=args.classnames,
            templates=args.templates,
        )
    except ValueError as e:
        args.parser.error(str(e))
    print(f"{written.dataset_type} {len(written.shards)} shards {written.root / written.split}")
    return 0


def _add_shards_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "shards",
        allow_abbrev=False,
        help="your own images and captions (a folder or a CSV) as training shards",
        description="Write your own image-caption pairs as webdataset shards that training and evaluation read: "
        "OUT_DIR/train and OUT_DIR/val (a held-out share), each numbered .tar files with sizes.json, and "
        "OUT_DIR/summary.json. SRC is a folder of image files, each with its caption in a .txt of the "
        "same name (x.jpg + x.txt, sub-folders included), or a CSV/TSV of image paths (relative to its "
        "folder) and captions. A folder of class folders (SRC/<class>/<image>, no .txt: ImageFolder's layout) "
        "gives each image its class name as caption, holds out a share of each class, and also writes the held-out "
        "images as OUT/zeroshot, the zero-shot set `clip-dcl eval zeroshot` reads (classnames.txt from the folder "
        "names, templates.txt). Prints what it wrote and skipped, and the commands to train and evaluate.",
    )
    p.add_argument(
        "source", metavar="SRC", help="a folder of images with .txt captions, a folder of class folders, or a CSV/TSV"
    )
    p.add_argument("out_dir", metavar="OUT_DIR", help="output folder")
    p.add_argument(
        "--val-fraction",
        type=float,
        default=0.1,
        help="share of the pairs held out in OUT_DIR/val for evaluation (default 0.1; 0: none)",
    )
    p.add_argument("--shard-size", type=int, default=1000, help="pairs per .tar shard (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="the shuffle that decides which pairs are held out (default 0)")
    p.add_argument(
        "--img-key",
        default=None,
        help="CSV: the image column (default: the first of filepath, image, image_path, img, path, file, filename)",
    )
    p.add_argument(
        "--caption-key",
        default=None,
        help="CSV: the caption column (default: the first of title, caption, text, captions)",
    )
    p.add_argument(
        "--separator",
        default=None,
        help="CSV: the separator (default: a tab when the header line has one, else a comma)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace earlier outputs in OUT_DIR")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=_run_shards, parser=p)


def _run_shards(args) -> int:
    import sys

    from .pairs import next_commands, write_pairs

    try:
        with held(args, args.out_dir, overwrite=args.overwrite):
            summary = write_pairs(
                args.source,
                args.out_dir,
                val_fraction=args.val_fraction,
                shard_size=args.shard_size,
                seed=args.seed,
                img_key=args.img_key,
                caption_key=args.caption_key,
                sep=args.separator,
                overwrite=args.overwrite,
                verbose=not args.quiet,
            )
    except ValueError as e:
        print(f"clip-dcl data shards: {e}", file=sys.stderr)
        return 2
    except WriterStopped as e:
        return e.code
    for name, split in summary["splits"].items():
        print(f"{name}: {split['pairs']} pairs in {split['shards']} shard(s), {split['folder']}")
    if "zeroshot" in summary:
        zs = summary["zeroshot"]
        left = f" (no image held out of {', '.join(zs['left_out'])})" if zs["left_out"] else ""
        print(f"zeroshot: {zs['images']} images of {zs['classes']} classes, {zs['folder']}{left}")
    skipped = summary["skipped"]
    print(
        f"skipped: {sum(s['count'] for s in skipped.values())}"
        + "".join(f"\n  {cause}: {s['count']} (e.g. {s['examples'][0]})" for cause, s in skipped.items())
    )
    print(f"summary: {args.out_dir}/summary.json")
    print("next (on a GPU: a larger --model, e.g. ViT-B-32, and more --epochs):")
    for command in next_commands(summary, args.out_dir):
        print(f"  {command}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = FlagParser(prog="clip-dcl data", description="Generate or convert data sets.", allow_abbrev=False)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_synth_parser(subparsers)
    _add_fashion_parser(subparsers)
    _add_scenes_parser(subparsers)
    _add_benchmark_parser(subparsers)
    _add_shards_parser(subparsers)
    _add_pack_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``clip-dcl data`` with ``argv`` (the words after ``data``); return the exit code."""
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)
