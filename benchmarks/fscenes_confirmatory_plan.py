"""Write ``benchmarks/studies/fscenes_confirmatory.toml`` from the scene testbed's screen, once, before it runs.

    python benchmarks/fscenes_confirmatory_plan.py            # prints the choices and numbers, writes the plan
    python benchmarks/fscenes_confirmatory_plan.py --dry-run  # prints them only

Reads the screen's published report (``benchmarks/results/fscenes_screen.json``: validation split, the
``fscenes4-words`` recipe, data draw 0, seeds 1-2) and its plan, and the second gate's report
(``benchmarks/results/fscenes_gate.json``, same recipe, draw and split: ``clip`` at B = 128). It chooses the
**tuned InfoNCE** at each B: the best of the screen's InfoNCE arms (``clip``'s learned scale and three fixed
scales) by mean validation retrieval mean R@1 (the first listed on a tie). ``decl`` runs at its defaults as they
stand, written out in full (:func:`clip_dcl.experiment.commands.loss_flags`).

The comparisons (``a - b``, paired by seed): ``decl`` beats ``clip`` and the tuned InfoNCE at B = 32 and 64;
``decl`` at 32 reaches ``clip`` at 64 and ``decl`` at 64 reaches ``clip`` at 128, each within half of ``clip``'s
own gain over the same seeds (``margin_gain``). Per comparison the screen (and the gate, for ``clip`` at 128)
gives the paired differences seed by seed: their mean is the ``expected`` difference and their spread the
``paired_sd``, floored at the pooled spread of every screened arm against ``clip`` at its B (two seeds give a
poor spread on their own). A reach is powered as if its margin were that of the screen's seeds, and toward
"does not reach" where the screen's mean falls short of it. The seed
count is the fewest giving power 0.8 at 90 % (one look), at least ``--min-seeds``; one needing more than
``--max-seeds`` is judged on the most any powered comparison gets, and the plan states its power there.

The data draw (``--seed 1``) and training seeds (100 on) are ones no earlier run on the scenes used. It refuses
to overwrite an existing plan: a plan is written once, committed, and then only run.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import plan_writing as pw
import tomllib
from fmnist_confirmatory_plan import SIZES, is_infonce, mean_of, pooled_sd

from clip_dcl.experiment.commands import loss_flags
from clip_dcl.experiment.recipes import get_recipe
from clip_dcl.experiment.study.rule import planned_power

RESULTS, STUDIES = pw.RESULTS, pw.STUDIES
SCREEN, PLAN = STUDIES / "fscenes_screen.toml", STUDIES / "fscenes_confirmatory.toml"
RULE = pw.Rule(metric="retrieval/mean_R@1", confidence=0.90, resolution=0.01, power=0.8)
METRIC, CONFIDENCE, RESOLUTION, POWER = RULE
DATA_SEED, FIRST_SEED = 1, 100  # the batch sizes (SIZES) are the Fashion-MNIST study's
TITLE = "Fashion-MNIST scenes: decl against clip at B and 2B and against a tuned InfoNCE, B = 32 and 64 (confirmatory)"


def gate_scores(report: Path, gate: int = 2) -> dict:
    """``{(arm, seed): validation score}`` (a fraction, as the study reports give it) of one gate's runs."""
    runs = json.loads(report.read_text())["gates"][gate - 1]["runs"]
    return {(r["arm"], r["seed"]): r["retrieval_mean_R@1"] / 100 for r in runs}


def comparisons(s: dict, arms: dict, tuned: dict) -> list:
    floor = pooled_sd(s, arms)
    rows = []
    for b in SIZES:
        for other in (f"clip-b{b}", tuned[b]):
            d = pw.diffs(s, f"decl-b{b}", other)
            name = "clip" if other == f"clip-b{b}" else "tuned"
            rows.append({"a": f"decl-b{b}", "b": f"{name}-b{b}", "rule": "beats", "diffs": d, "screen": other})
    for b in SIZES:
        gain = statistics.mean(pw.diffs(s, f"clip-b{2 * b}", f"clip-b{b}"))
        d = pw.diffs(s, f"decl-b{b}", f"clip-b{2 * b}")
        rows.append(
            {"a": f"decl-b{b}", "b": f"clip-b{2 * b}", "rule": "reaches", "diffs": d, "screen": f"clip-b{2 * b}"}
        )
        rows[-1].update(margin=gain / 2, gain=gain, margin_gain=(f"clip-b{b}", f"clip-b{2 * b}", 0.5))
    for r in rows:
        r.update(expected=statistics.mean(r["diffs"]), sd_own=statistics.stdev(r["diffs"]))
        r["paired_sd"] = max(r["sd_own"], floor)
    return rows


def directed(r: dict) -> dict:
    """``r`` as the power calculation reads it: a reach expected to fall short is planned for "does not reach"
    (``P(hi < -margin)``, the mirror image of ``P(lo > -margin)`` about ``-margin``)."""
    if r["rule"] == "reaches" and r["expected"] < -r["margin"]:
        return dict(r, expected=-r["expected"] - 2 * r["margin"], toward="does not reach")
    return r


def needed(r: dict) -> int:
    return pw.seeds_for_power(directed(r), CONFIDENCE, POWER)


def write(rows: list, counts: list, tuned: dict, arms: dict, floor: float, recipe: str) -> str:
    n = max(counts)
    seeds = list(range(FIRST_SEED, FIRST_SEED + n))
    out_arms = []
    for b in SIZES:
        out_arms.append((f"decl-b{b}", b, list(loss_flags("decl"))))
        out_arms.append((f"clip-b{b}", b, ["--loss", "clip"]))
        out_arms.append((f"tuned-b{b}", b, arms[tuned[b]]))
    out_arms.append(("clip-b128", 128, ["--loss", "clip"]))
    lines = []
    for r, k in zip(rows, counts):
        need, d = needed(r), directed(r)
        p = planned_power(r["rule"], k, r["paired_sd"], CONFIDENCE, d["expected"], margin=r.get("margin"))
        what = f"{r['a']} {r['rule']} {r['b']} (screen: {r['a']} - {r['screen']})"
        if r["rule"] == "reaches":
            gain = f"half of clip's gain {100 * r['gain']:+.2f} on the screen's seeds"
            what += f", margin {100 * r['margin']:.2f} ({gain})"
        lines.append(
            f"#   {what}: mean {100 * r['expected']:+.2f}, paired sd {100 * r['sd_own']:.2f} (used "
            f"{100 * r['paired_sd']:.2f}): {need if need <= 1000 else 'more than 1000'} seeds for power {POWER}; "
            f"judged on {k}, power {p:.2f}" + (f" (to '{d['toward']}')" if "toward" in d else "")
        )
    data = list(get_recipe(recipe).data_argv) + ["--seed", str(DATA_SEED)]
    toml = [
        "# CONFIRMATORY. Written by benchmarks/fscenes_confirmatory_plan.py from the exploratory scene screen",
        "# (benchmarks/results/fscenes_screen.md; validation split, data draw 0, seeds 1-2) and the second gate",
        "# (benchmarks/results/fscenes_gate.md: clip at B = 128, same draw and seeds), committed before its first run.",
        "# On scenes of four real Fashion-MNIST photographs, where clip's retrieval gained with the batch from 16 to",
        "# 64 in the gate, does decl at its defaults beat clip and InfoNCE with its temperature tuned at B = 32 and",
        "# 64, and does it reach clip at twice the batch? Metric: retrieval mean R@1 on the 2,000 test scenes (one",
        "# distinct caption each). Nothing here may change once it has run: no seed added, no arm dropped, no",
        "# margin moved; a failed run is rerun and listed in the report.",
        "#",
        f"# Data: a draw no earlier run used (--seed {DATA_SEED}: other validation images held out, other scenes,",
        f"# other captions); training seeds {seeds[0]}-{seeds[-1]}, used by no earlier run on the scenes. Every run",
        f"# on the CPU (one torch thread, the {recipe} recipe). The arms' flags are written out in full.",
        "# The tuned InfoNCE (the best InfoNCE arm of the screen at each B by mean validation R@1, over as many",
        "# settings as decl's screen had; the first listed on a tie):",
        *[f"#   B = {b}: {tuned[b]} {' '.join(arms[tuned[b]])}" for b in SIZES],
        "# In the gate clip gained 1.7 points from B = 32 to 64 and none from 64 to 128 (-0.2, 10 epochs either",
        "# way): the reach at 64 is asked as the issue asks it, but its margin (half of clip's gain, from these",
        "# runs) is near zero or below, so it asks in effect whether decl at 64 scores at least clip at 128.",
        "# Seed counts (90 % two-sided t-intervals, one look; per comparison the screen's mean paired difference and",
        f"# spread, the spread floored at the pooled spread of every screened arm against clip, {100 * floor:.2f} "
        "points):",
        *lines,
        "# Each comparison is judged on the plan's first seeds, as many as it says (`seeds`); an arm trains as many",
        f"# as its comparisons read. {len(out_arms) * n} runs of 5-6 minutes, two at once: what two CPU cores run in",
        "# about 80 minutes, which is what this plan could afford.",
        *pw.plan_footer("fscenes_confirmatory", rows, counts, needed),
    ]
    return pw.plan_text(toml, TITLE, recipe, seeds, RULE, data, 10, out_arms, rows, counts)


def build(min_seeds: int, max_seeds: int) -> tuple:
    """The plan's text from the published screen and gate, and each comparison's seed count."""
    screen = tomllib.loads(SCREEN.read_text())
    arms = {a["name"]: a["flags"] for a in screen["arms"]}
    s = pw.validation_scores(METRIC, RESULTS / "fscenes_screen.json")
    gate = gate_scores(RESULTS / "fscenes_gate.json")
    s.update({k: v for k, v in gate.items() if k[0] == "clip-b128" and k[1] in {seed for _, seed in s}})
    tuned = {
        b: max((n for n in arms if n.endswith(f"-b{b}") and is_infonce(arms[n])), key=lambda n: mean_of(s, n))
        for b in SIZES
    }
    rows = comparisons(s, arms, tuned)
    counts = pw.affordable_counts([needed(r) for r in rows], min_seeds, max_seeds)
    text = write(rows, counts, tuned, arms, pooled_sd(s, arms), screen["recipe"])
    return text, counts


def main(argv=None) -> int:
    args = pw.plan_arguments(
        __doc__, argv, min_seeds=4, max_seeds=4, dry_run="print the choices and numbers; write nothing"
    )
    text, counts = build(args.min_seeds, args.max_seeds)
    print("\n".join(x[2:] for x in text.splitlines() if x.startswith("#   ")))
    print(f"seeds: {max(counts)} (per comparison: {counts})")
    return pw.write_once(PLAN, text, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
