"""What the confirmatory-plan writers share (``confirmatory_plan.py``, ``fmnist_confirmatory_plan.py``,
``fscenes_confirmatory_plan.py``, ``fscenes_powered_plan.py``): where the results and plans live, the plan's rule,
the command line, the screens' paired differences, the seed count each comparison needs for a stated power, the
counts a plan can afford, the plan's text, and writing a plan once."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from clip_dcl.experiment.study.rule import seeds_needed

#: the repository's root, the published reports and the plans
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
STUDIES = ROOT / "benchmarks" / "studies"


class Rule(NamedTuple):
    """How a plan reads its runs: the metric, the intervals' confidence, the resolution (a smaller difference is a
    tie) and the power its seeds are planned for."""

    metric: str
    confidence: float
    resolution: float
    power: float


def plan_arguments(
    doc: str,
    argv: Optional[Sequence[str]],
    min_seeds: int,
    max_seeds: Optional[int] = None,
    dry_run: str = "print the numbers; write nothing",
    more: Callable[[argparse.ArgumentParser], None] = lambda p: None,
) -> argparse.Namespace:
    """A plan writer's command line (its description the first line of ``doc``): ``--dry-run``, the arguments
    ``more`` adds, ``--min-seeds`` (default ``min_seeds``) and, unless ``max_seeds`` is None, ``--max-seeds``;
    refused unless 2 <= --min-seeds (<= --max-seeds)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0], allow_abbrev=False)
    p.add_argument("--dry-run", action="store_true", help=dry_run)
    more(p)
    p.add_argument(
        "--min-seeds",
        type=int,
        default=min_seeds,
        help=f"the fewest seeds a comparison is judged on (default {min_seeds})",
    )
    if max_seeds is not None:
        p.add_argument(
            "--max-seeds",
            type=int,
            default=max_seeds,
            help=f"a comparison needing more for power 0.8 is not powered here (default {max_seeds})",
        )
    args = p.parse_args(argv)
    top = args.max_seeds if max_seeds is not None else args.min_seeds
    if not 2 <= args.min_seeds <= top:
        p.error(
            f"expected 2 <= --min-seeds <= --max-seeds, got {args.min_seeds} and {args.max_seeds}"
            if max_seeds is not None
            else f"expected --min-seeds >= 2, got {args.min_seeds}"
        )
    return args


def validation_scores(metric: str, *reports: Path) -> Dict[Tuple[str, int], float]:
    """``{(arm, seed): validation score}`` over the runs of complete study reports (``SystemExit`` otherwise)."""
    out = {}
    for path in reports:
        doc = json.loads(Path(path).read_text())
        if not doc["status"].startswith("complete"):
            raise SystemExit(f"{path}: {doc['status']}: a plan is written from complete studies only")
        for r in doc["runs"]:
            out[(r["arm"], r["seed"])] = r["validation"][metric]
    return out


def diffs(s: dict, a: str, b: str) -> List[float]:
    """``a - b`` on every seed both arms ran, in seed order."""
    seeds = sorted({seed for arm, seed in s if arm == a} & {seed for arm, seed in s if arm == b})
    return [s[(a, seed)] - s[(b, seed)] for seed in seeds]


def seeds_for_power(row: dict, confidence: float, power: float) -> int:
    """Seeds for ``power`` at ``confidence`` (one look); ``beats``: a verdict in the direction of the expected
    difference; 1001 when more than 1000 are needed."""
    expected = abs(row["expected"]) if row["rule"] == "beats" else row["expected"]
    return (
        seeds_needed(
            row["rule"], row["paired_sd"], confidence, power, expected=expected, margin=row.get("margin"), cap=1000
        )
        or 1001
    )


def affordable_counts(need: List[int], floor: int, cap: int) -> List[int]:
    """Per comparison: the seeds it needs, at least ``floor``; one needing more than ``cap`` is judged on the most
    any powered comparison gets (``cap`` when none is powered)."""
    powered = [max(floor, k) for k in need if k <= cap]
    most = max(powered) if powered else cap
    return [max(floor, k) if k <= cap else most for k in need]


def write_once(path: Path, text: str, dry_run: bool, echo: Callable[[str], None] = print) -> int:
    """Write the plan unless ``dry_run``; refuse (exit code 1) to overwrite one: a plan is written once,
    committed, and then only run."""
    if dry_run:
        return 0
    if path.exists():
        print(
            f"{path} exists: a plan is written once (delete it only if it was never committed or run)", file=sys.stderr
        )
        return 1
    path.write_text(text)
    echo(f"wrote {path}")
    return 0


def plan_footer(name: str, rows: List[dict], counts: List[int], need: Callable[[dict], int]) -> List[str]:
    """The plan's last comment lines: each comparison its seeds cannot power (``need(row)`` more than it is judged
    on), and the commands that check, run and report ``benchmarks/studies/<name>.toml``."""
    return [
        *[
            f"# {r['a']} {r['rule']} {r['b']} would need more seeds than this plan can run: judged on {k}, its interval"
            " is reported, and a 'no verdict' there is the expected outcome, not a finding."
            for r, k in zip(rows, counts)
            if need(r) > k
        ],
        "#",
        f"#   clip-dcl study check benchmarks/studies/{name}.toml",
        f"#   clip-dcl study run benchmarks/studies/{name}.toml --work WORK/{name} --parallel 2",
        f"#   clip-dcl study report benchmarks/studies/{name}.toml --work WORK/{name} \\",
        f"#       --out benchmarks/results --name {name}",
        "",
    ]


def plan_text(
    comments: List[str],
    title: str,
    recipe: str,
    seeds: List[int],
    rule: Rule,
    data_command: List[str],
    epochs: int,
    arms: List[tuple],
    rows: List[dict],
    counts: List[int],
) -> str:
    """The plan's text: its ``comments`` (each a line), then the TOML: the study's keys (``rule`` among them),
    [data], [train], one [[arms]] per ``(name, batch, flags)`` and one [[comparisons]] per row with its seed count,
    its ``margin`` (or ``margin_gain``, given as ``(from, to, share)``) and ``expected`` (by its size for
    ``beats``)."""
    metric, confidence, resolution, power = rule
    toml = [
        f'title = "{title}"',
        f'recipe = "{recipe}"',
        "exploratory = false",
        f"seeds = {json.dumps(seeds)}",
        f'metric = "{metric}"',
        f"confidence = {confidence}",
        f"resolution = {resolution}",
        f"power = {power}",
        "threads = 1",
        "",
        "[data]",
        "command = " + json.dumps(data_command),
        "",
        "[train]",
        f"epochs = {epochs}",
        'device = "cpu"',
    ]
    for name, b, flags in arms:
        toml += ["", "[[arms]]", f'name = "{name}"', f"batch_size = {b}", f"flags = {json.dumps(list(flags))}"]
    for r, k in zip(rows, counts):
        toml += ["", "[[comparisons]]", f'a = "{r["a"]}"', f'b = "{r["b"]}"', f'rule = "{r["rule"]}"', f"seeds = {k}"]
        if "margin_gain" in r:
            low, high, share = r["margin_gain"]
            toml.append(f'margin_gain = {{from = "{low}", to = "{high}", share = {share}}}')
        elif "margin" in r:
            toml.append(f"margin = {round(r['margin'], 4)}")
        toml += [
            f"expected = {round(abs(r['expected']) if r['rule'] == 'beats' else r['expected'], 4)}",
            f"paired_sd = {round(r['paired_sd'], 4)}",
        ]
    return "\n".join(comments + toml) + "\n"
