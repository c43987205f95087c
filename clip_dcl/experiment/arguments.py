"""The command-line checks that the benchmarks share: each ends the program through ``SystemExit`` with a
message naming the flag and its value, as ``argparse`` does for a bad flag."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple


def plain_text(text: str) -> str:
    """``text`` without its reStructuredText markup, for a docstring that serves as ``--help``: ``a`` and
    :role:`a` become a (a leading dot of a relative name dropped)."""
    text = re.sub(r":[a-z]+:`~?\.?([^`]+)`", r"\1", text)
    return text.replace("``", "")


def parse(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]]) -> Tuple[argparse.Namespace, List[str]]:
    """``parser``'s arguments from ``argv`` (default: the command line) and those words (the report's command)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return parser.parse_args(argv), argv


def flag(name: str) -> str:
    """``num_classes`` -> ``--num-classes``."""
    return "--" + name.replace("_", "-")


def check_at_least(minimum: int, **values: Optional[int]) -> None:
    """Every value given (``None``: left to its default) is ``>= minimum``."""
    for name, value in values.items():
        if value is not None and value < minimum:
            raise SystemExit(f"{flag(name)} must be >= {minimum}, got {value}")


def check_synthetic_data(num_classes: int, train_samples: Optional[int] = None) -> None:
    """A synthetic data set that :func:`clip_dcl.data.synth.generate` can draw: 2 to its
    ``MAX_CLASSES`` classes, and at least one training pair a class."""
    from ..data.synth import MAX_CLASSES

    if not 2 <= num_classes <= MAX_CLASSES:
        raise SystemExit(f"--num-classes must be in [2, {MAX_CLASSES}], got {num_classes}")
    if train_samples is not None and train_samples < num_classes:
        raise SystemExit(f"--train-samples must be >= --num-classes, got {train_samples}")


def check_seeds(seeds: Sequence[int], name: str = "seeds") -> None:
    """Training seeds are distinct (a repeated seed is the same run) and ``>= 0``."""
    if len(set(seeds)) != len(seeds) or any(s < 0 for s in seeds):
        raise SystemExit(f"{flag(name)} must be distinct and >= 0, got {list(seeds)}")


def benchmark_parser(script: str, doc: str) -> argparse.ArgumentParser:
    """The parser of ``benchmarks/<script>``: ``doc``'s first paragraph as the description, defaults shown."""
    from ..arguments import FlagParser

    return FlagParser(
        prog=f"benchmarks/{script}",
        description=doc.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )


def add_comparison_arguments(
    p: argparse.ArgumentParser,
    *,
    quick: str,
    work: str,
    results: str,
    num_classes: int,
    train_samples: Optional[int],
    train_samples_help: str,
    epochs_help: str,
    seeds_help: str,
) -> None:
    """The flags of a benchmark that compares objectives trained on the synthetic data (the arguments: their
    defaults and helps; a smoke run's report goes where :func:`work_and_results` puts it)."""
    p.add_argument("--quick", action="store_true", help=f"smoke run: {quick}; report under --work")
    p.add_argument("--work", default=work, help="folder for the data and the runs")
    p.add_argument("--results", help=f"folder of the report (default: {results}; with --quick: WORK/quick/report)")
    p.add_argument("--num-classes", type=int, default=num_classes, help="latent classes (tau_plus = 1 / classes)")
    p.add_argument("--train-samples", type=int, default=train_samples, help=train_samples_help)
    p.add_argument("--epochs", type=int, help=epochs_help)
    p.add_argument("--seeds", type=int, nargs="+", help=seeds_help)


def work_and_results(args: argparse.Namespace, results: Path) -> Tuple[Path, Path]:
    """The run's folder, ``--work`` plus ``quick`` or ``full`` (a smoke run never reuses a full run's), and the
    report's: ``--results``, else ``<work>/report`` for a smoke run (never the published results), else
    ``results``."""
    work = Path(args.work) / ("quick" if args.quick else "full")
    return work, Path(args.results) if args.results else (work / "report" if args.quick else Path(results))
