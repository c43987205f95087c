"""Write ``benchmarks/studies/fscenes_powered.toml``: decl against clip and the tuned InfoNCE at B = 32 on the
scene testbed, with the seeds the scene confirmatory study's own spreads ask for, once, before it runs.

    python benchmarks/fscenes_powered_plan.py            # prints the numbers, writes the plan
    python benchmarks/fscenes_powered_plan.py --dry-run  # prints them only

Reads the scene confirmatory study (``benchmarks/studies/fscenes_confirmatory.toml``, its published report
``benchmarks/results/fscenes_confirmatory.json``: the ``fscenes4-words`` recipe, data draw 1, seeds 100-103) and
takes from it only what a plan may take: the arms' flags, verbatim, and per comparison the spread of its paired
differences seed by seed on the **validation** split (choices, a seed count among them, are made on validation;
that study's test split gave its verdicts, and its means are not used at all). Each comparison (``a - b``,
paired by seed, rule ``beats``) is powered at a true difference of ``EXPECTED`` (0.5 points, the plan's
resolution): the fewest seeds giving power 0.8 at 90 % (one look), at least ``--min-seeds``.

The data draw is the first that no scene plan in ``benchmarks/studies/`` reads (a plan without a ``--seed`` in its
data command reads the generator's default), and the training seeds start at ``FIRST_SEED``, above every seed
those plans list. It refuses to overwrite an existing plan: a plan is written once, committed, and then only run.
"""

from __future__ import annotations

import statistics
import sys

import plan_writing as pw
import tomllib

from clip_dcl.data.scenes import ScenesConfig
from clip_dcl.experiment.recipes import get_recipe
from clip_dcl.experiment.study.rule import planned_power

STUDIES = pw.STUDIES
EARLIER, PLAN = STUDIES / "fscenes_confirmatory.toml", STUDIES / "fscenes_powered.toml"
REPORT = pw.RESULTS / "fscenes_confirmatory.json"
RULE = pw.Rule(metric="retrieval/mean_R@1", confidence=0.90, resolution=0.005, power=0.8)
METRIC, CONFIDENCE, RESOLUTION, POWER = RULE
TITLE = "Fashion-MNIST scenes: decl against clip and a tuned InfoNCE at B = 32, powered for 0.5 points (confirmatory)"
#: the true difference each comparison is powered for: the resolution
EXPECTED = RESOLUTION
ARMS = ("decl-b32", "clip-b32", "tuned-b32")
COMPARED = (("decl-b32", "clip-b32"), ("decl-b32", "tuned-b32"))
FIRST_SEED = 200


def data_draw(plan: dict) -> int:
    """The data draw a scene plan reads: the ``--seed`` of its ``[data]`` command, else the generator's default."""
    command = plan.get("data", {}).get("command", [])
    return int(command[command.index("--seed") + 1]) if "--seed" in command else ScenesConfig().seed


def earlier_scene_plans() -> dict:
    """``{file name: parsed plan}`` of every scene plan in ``benchmarks/studies/`` but this one."""
    return {
        p.name: tomllib.loads(p.read_text())
        for p in sorted(STUDIES.glob("*.toml"))
        if p != PLAN and tomllib.loads(p.read_text()).get("recipe", "").startswith("fscenes")
    }


def fresh_draw_and_seeds(n: int) -> tuple:
    """The first data draw and ``n`` training seeds from ``FIRST_SEED`` that no earlier scene plan used
    (``SystemExit`` when a seed was)."""
    plans = earlier_scene_plans()
    draws = {data_draw(p) for p in plans.values()}
    used = {s for p in plans.values() for s in p["seeds"]}
    seeds = list(range(FIRST_SEED, FIRST_SEED + n))
    if used & set(seeds):
        raise SystemExit(f"seeds {sorted(used & set(seeds))} were used by an earlier scene plan")
    return min(set(range(len(draws) + 1)) - draws), seeds, sorted(draws), sorted(used)


def comparisons(s: dict) -> list:
    """Per comparison the earlier study's validation differences, their spread, and the seeds it needs."""
    rows = []
    for a, b in COMPARED:
        d = pw.diffs(s, a, b)
        sd = statistics.stdev(d)
        rows.append({"a": a, "b": b, "rule": "beats", "diffs": d, "paired_sd": sd, "expected": EXPECTED})
    return rows


def write(rows: list, counts: list, flags: dict, recipe: str, draw: int, seeds: list, earlier: tuple) -> str:
    draws, used = earlier
    lines = [
        f"#   {r['a']} beats {r['b']}: validation differences "
        + ", ".join(f"{100 * x:+.2f}" for x in r["diffs"])
        + f" (paired sd {100 * r['paired_sd']:.2f}): {pw.seeds_for_power(r, CONFIDENCE, POWER)} seeds for power "
        f"{POWER}; judged on {k}, power {planned_power('beats', k, r['paired_sd'], CONFIDENCE, EXPECTED):.2f}"
        for r, k in zip(rows, counts)
    ]
    runs = sum(max(k for r, k in zip(rows, counts) if arm in (r["a"], r["b"])) for arm in ARMS)
    toml = [
        "# CONFIRMATORY. Written by benchmarks/fscenes_powered_plan.py from the scene confirmatory study",
        "# (benchmarks/results/fscenes_confirmatory.md: data draw 1, seeds 100-103, four seeds, too few for its",
        "# comparisons at B = 32 by its own plan), committed before its first run. On scenes of four real",
        "# Fashion-MNIST photographs, does decl at its defaults beat clip, and InfoNCE with its temperature tuned,",
        "# at B = 32? Metric: retrieval mean R@1 on the 2,000 test scenes (one distinct caption each). Nothing here",
        "# may change once it has run: no seed added, no arm dropped; a failed run is rerun and listed in the report.",
        "#",
        f"# Data: a draw no earlier scene plan used (--seed {draw}; theirs: {', '.join(map(str, draws))}); training",
        f"# seeds {seeds[0]}-{seeds[-1]} (theirs: {', '.join(map(str, used))}). Every run on the CPU (one torch",
        f"# thread, the {recipe} recipe). The three arms' flags are those of the earlier plan, verbatim.",
        "# Seed counts (90 % two-sided t-intervals, one look, power at a true difference of "
        f"{100 * EXPECTED:.1f} points; per",
        "# comparison the spread of the earlier study's paired differences on its validation split, not their mean):",
        *lines,
        "# The power counts an interval above zero; 'beats' also asks that the mean pass the resolution of "
        f"{100 * RESOLUTION:.1f}",
        "# points, which a true difference of exactly that size does about half the time: a 'tie' is then the",
        "# honest reading. Each comparison is judged on the plan's first seeds, as many as it says (`seeds`); an",
        f"# arm trains as many as its comparisons read: {runs} runs of the recipe, two at once on two CPU cores.",
        *pw.plan_footer("fscenes_powered", rows, counts, lambda r: pw.seeds_for_power(r, CONFIDENCE, POWER)),
    ]
    data = list(get_recipe(recipe).data_argv) + ["--seed", str(draw)]
    arms = [(name, 32, flags[name]) for name in ARMS]
    return pw.plan_text(toml, TITLE, recipe, seeds, RULE, data, 10, arms, rows, counts)


def build(min_seeds: int) -> tuple:
    """The plan's text from the earlier plan and its published report, and each comparison's seed count."""
    earlier = tomllib.loads(EARLIER.read_text())
    arms = {a["name"]: a for a in earlier["arms"]}
    if any(arms[n]["batch_size"] != 32 for n in ARMS):
        raise SystemExit(f"{EARLIER}: the arms {ARMS} are expected at B = 32")
    rows = comparisons(pw.validation_scores(METRIC, REPORT))
    counts = [max(min_seeds, pw.seeds_for_power(r, CONFIDENCE, POWER)) for r in rows]
    draw, seeds, *theirs = fresh_draw_and_seeds(max(counts))
    flags = {n: arms[n]["flags"] for n in ARMS}
    return write(rows, counts, flags, earlier["recipe"], draw, seeds, tuple(theirs)), counts


def main(argv=None) -> int:
    args = pw.plan_arguments(__doc__, argv, min_seeds=4)
    text, counts = build(args.min_seeds)
    print("\n".join(x[2:] for x in text.splitlines() if x.startswith("#   ")))
    print(f"seeds: {max(counts)} (per comparison: {counts})")
    return pw.write_once(PLAN, text, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
