"""Write ``benchmarks/studies/confirmatory.toml`` from the exploratory spread measurements, once, before it runs.

    python benchmarks/confirmatory_plan.py            # prints the plan's numbers and writes the plan
    python benchmarks/confirmatory_plan.py --dry-run  # prints them only

Reads the published reports of ``spread.toml`` and ``spread_tuned.toml`` (``benchmarks/results/spread.json`` and
``spread_tuned.json``: validation split, micro-words recipe, the default data draw, seeds 1-3) and the tuned
InfoNCE arms' flags from ``spread_tuned.toml``. For each batch size B (32, 64) and each comparison of ``decl`` at B
against ``clip`` at B, the tuned InfoNCE at B and ``clip`` at 2B, it takes the paired differences seed by seed:

- ``paired_sd``: their sample standard deviation; ``expected``: their mean (an exploratory estimate; the seed
  count is planned for a verdict in either direction, so on its size);
- the reach's ``margin``: half of ``clip``'s mean paired gain from B to 2B over the same seeds;
- the seeds, per comparison (the plan's first ones; an arm trains as many as its comparisons read): the fewest
  giving it power 0.8 at 90 % (one look), at least ``--min-seeds`` (a spread from three seeds may be low); a
  comparison that would need more than ``--max-seeds`` cannot be powered here: it is judged on as many seeds
  as the most any powered comparison gets, and the plan states its power there.

The plan's data draw (``--seed 3``) and training seeds (300 on) are ones no earlier run used. It refuses to
overwrite an existing plan: a plan is written once, committed, and then only run.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import plan_writing as pw
import tomllib
from testbed.objectives import loss_flags

from clip_dcl.experiment.study.rule import planned_power

RESULTS, STUDIES = pw.RESULTS, pw.STUDIES
PLAN = STUDIES / "confirmatory.toml"
RULE = pw.Rule(metric="retrieval/mean_R@1", confidence=0.90, resolution=0.01, power=0.8)
METRIC, CONFIDENCE, RESOLUTION, POWER = RULE
TITLE = "decl against clip at B and 2B and against a tuned InfoNCE, B = 32 and 64 (confirmatory)"
SIZES = (32, 64)
DATA_SEED = 3
FIRST_SEED = 300


def scores(*reports: Path) -> dict:
    """``{(arm, seed): validation score}`` over the finished runs of the given study reports."""
    return pw.validation_scores(METRIC, *reports)


def comparisons(s: dict) -> list:
    """Per B: decl against clip at B (beats), the tuned InfoNCE at B (beats), clip at 2B (reaches)."""
    rows = []
    for b in SIZES:
        gain = statistics.mean(pw.diffs(s, f"clip-b{2 * b}", f"clip-b{b}"))
        for other, rule in ((f"clip-b{b}", "beats"), (f"tuned-b{b}", "beats"), (f"clip-b{2 * b}", "reaches")):
            d = pw.diffs(s, f"decl-b{b}", other)
            row = {
                "a": f"decl-b{b}",
                "b": other,
                "rule": rule,
                "diffs": d,
                "expected": statistics.mean(d),
                "paired_sd": statistics.stdev(d),
            }
            if rule == "reaches":
                row["margin"] = gain / 2
                row["gain"] = gain
            rows.append(row)
    return rows


def needed(row: dict) -> int:
    """Seeds for power :data:`POWER` (beats: a verdict in the direction of the expected difference)."""
    return pw.seeds_for_power(row, CONFIDENCE, POWER)


def seed_counts(rows: list, floor: int, cap: int) -> list:
    """Per comparison: its seed count (see the module's text)."""
    return pw.affordable_counts([needed(r) for r in rows], floor, cap)


def write(rows: list, counts: list, tuned: dict) -> str:
    n = max(counts)
    seeds = list(range(FIRST_SEED, FIRST_SEED + n))
    decl = list(loss_flags("decl"))
    arms = []
    for b in SIZES:
        arms += [(f"decl-b{b}", b, decl), (f"clip-b{b}", b, ["--loss", "clip"]), (f"tuned-b{b}", b, tuned[b])]
    arms.append((f"clip-b{2 * SIZES[-1]}", 2 * SIZES[-1], ["--loss", "clip"]))
    lines = []
    for r, k in zip(rows, counts):
        p = planned_power(r["rule"], k, r["paired_sd"], CONFIDENCE, r["expected"], r.get("margin"))
        lines.append(
            f"#   {r['a']} {r['rule']} {r['b']}: paired sd {100 * r['paired_sd']:.2f}, mean "
            f"{100 * r['expected']:+.2f}"
            + (
                f", margin {100 * r['margin']:.2f} (half of clip's gain {100 * r['gain']:+.2f})"
                if "margin" in r
                else ""
            )
            + f": {needed(r) if needed(r) <= 1000 else 'more than 1000'} seeds for power {POWER}; "
            f"judged on {k}, power {p:.2f}"
        )
    toml = [
        "# CONFIRMATORY. Written by benchmarks/confirmatory_plan.py from the exploratory spread measurements",
        "# (benchmarks/results/spread.md, spread_tuned.md; validation split, the default data draw, seeds 1-3) and",
        "# committed before its first run. Does decl beat clip and InfoNCE with its temperature tuned at B = 32 and",
        "# 64, and does it reach clip at twice the batch? Nothing here may change once it has run: no seed added,",
        "# no arm dropped, no margin moved; a failed run is rerun and listed in the report.",
        "#",
        f"# Data: a draw no earlier run used (--seed {DATA_SEED}); training seeds {seeds[0]}-{seeds[-1]}, used by no "
        "earlier run.",
        "# Every run on the CPU (device cpu, one torch thread, the micro-words recipe); GPU runs may not be",
        "# paired with these. The arms' flags are written out in full, so that a later default changes nothing.",
        "# The tuned InfoNCE: the setting temperature_tuning.toml chose at each B (validation split, one seed).",
        "# Margins and seed count (90 % two-sided t-intervals, one look; per comparison: paired spread and mean",
        "# from the exploratory runs; seeds for power 0.8 to a verdict in the direction of that mean):",
        *lines,
        "# Each comparison is judged on the plan's first seeds, as many as it says (`seeds`), at least the floor,",
        "# since a spread from three seeds may be low; an arm trains as many as its comparisons read.",
        *pw.plan_footer("confirmatory", rows, counts, needed),
    ]
    data = "data synth {DATA} --image-size 32 --num-classes 48 --train-samples 12000 --test-samples 1000 --pack".split()
    data += ["--seed", str(DATA_SEED)]
    return pw.plan_text(toml, TITLE, "micro-words", seeds, RULE, data, 20, arms, rows, counts)


def main(argv=None) -> int:
    args = pw.plan_arguments(__doc__, argv, min_seeds=6, max_seeds=20)
    s = scores(RESULTS / "spread.json", RESULTS / "spread_tuned.json")
    rows = comparisons(s)
    counts = seed_counts(rows, args.min_seeds, args.max_seeds)
    tuned_plan = tomllib.loads((STUDIES / "spread_tuned.toml").read_text())
    tuned = {a["batch_size"]: a["flags"] for a in tuned_plan["arms"]}
    text = write(rows, counts, tuned)
    print("\n".join(x[4:] for x in text.splitlines() if x.startswith("#   ") and "seeds for power" in x))
    print(f"seeds: {max(counts)} (per comparison: {counts})")
    return pw.write_once(PLAN, text, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
