"""Batch size on a testbed where it matters: does DeCL at batch B reach InfoNCE at 2B?

The DeCL paper's claim is that its decomposed loss, whose minibatch gradient is unbiased, makes a small
batch train like a large one. That needs a testbed where InfoNCE itself gains from a larger batch, trained
to a plateau: the recipe ``micro-bpe`` of :mod:`clip_dcl.experiment.recipes` (48 shape x colour classes at
32 px, 12,000 training pairs, a validation split for every choice and a test split for the verdicts;
``clip-dcl-micro``), 20 epochs at every batch size, retrieval mean R@1 first.

Each stage of the testbed is a study plan in ``benchmarks/studies/`` (:mod:`clip_dcl.experiment.study`),
written by :func:`plans` from the objectives of ``benchmarks/testbed/`` (every loss flag spelled
out) and the committed reports (the margins and spreads the confirmatory plan reads come from the
validation sweep's runs):

=========================  ==========================================================================
``testbed_sweep``          exploratory: ``clip`` at every batch size (the gate), ``dcl`` at 0.05 and the
                           sweep's DeCL variants, seeds 0-2 (the validation sweep)
``testbed_screen``         exploratory: every DeCL variant, ``dcl`` at 0.05 and ``clip`` at B = 16 and 64,
                           seed 0
``testbed_screen16``       exploratory: the B = 16 screen of the package default's settings
``testbed_dcl_screen``     exploratory: the ``dcl`` settings against ``clip`` at B = 64 and 16, seed 0
``testbed_dcl_sweep``      ``dcl --tau-plus 0.01`` against ``clip`` at every batch size, seeds 0-2, test split
``testbed_second_draw``    the decisive comparison at B = 32 on another draw of the data (``--seed 1``)
``testbed_decisive``       the decisive stage restated: ``decl`` at B = 32 and 64 against ``clip`` at B and 2B
                           on a fresh draw with fresh seeds, the seed count from the validation sweep's
                           paired spread and the margin fixed from its gains (not run; the study that
                           decides will be ``benchmarks/studies/confirmatory.toml``)
``testbed_controls``       the temperature controls at B = 32 and 64 on that draw and those seeds
=========================  ==========================================================================

Commands (``.venv/bin/python benchmarks/batch_size.py COMMAND``):

- ``plans``: write the plan files (``--check``: exit 1 when a committed plan differs from its rendering);
- ``run STAGE --work DIR [--recipe NAME] [--parallel N]``: ``clip-dcl study run`` of the stage's plan on the
  recipe ``--recipe`` (default: :data:`clip_dcl.experiment.recipes.DEFAULT_RECIPE`, ``micro-words``; the plans,
  like the committed runs, name ``micro-bpe``, and another recipe is another study: a copy of the plan naming
  it, in the work folder);
- ``report STAGE --work DIR``: the testbed's report (``batch_size.md``-style, ``dcl_screen.md``,
  ``dcl_sweep.md``) from a study's finished runs, besides the study's own ``STUDY.md``;
- ``regenerate OUT``: every committed testbed report written again from its JSON into ``OUT``; the
  verdicts must come out equal (``tests/test_batch_size_bench.py`` checks it).

The README's and docs' generated blocks of these reports (``benchmarks/quotes.py``) are rendered
by the functions re-exported here.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from testbed import objectives as O
from testbed import report as R
from testbed import rule as T

# the renderers of the generated blocks (quotes.py)
from testbed.blocks import (  # noqa: F401
    dcl_default_block,
    dcl_readme_block,
    dcl_sweep_block,
    readme_block,
    which_loss_block,
)

from clip_dcl.experiment.recipes import DEFAULT_RECIPE, RECIPES, get_recipe
from clip_dcl.experiment.runner import Budget
from clip_dcl.experiment.scoring import MEAN_R1, with_mean_r1
from clip_dcl.experiment.study import load_plan, parse_plan, run_study
from clip_dcl.experiment.study import work as W
from clip_dcl.experiment.study.lines import epochs, settings
from clip_dcl.experiment.study.report import progress
from clip_dcl.experiment.study.rule import seeds_needed
from clip_dcl.experiment.study.seal import check_seal
from clip_dcl.train.metrics import read_metrics

HERE = Path(__file__).resolve().parent
STUDIES = HERE / "studies"
RECIPE = "micro-bpe"
#: the committed reports, by stem: what wrote them (the writer and, for the main report, its other draws)
REPORTS = (
    "batch_size",
    "batch_size_draw1",
    "batch_size_validation_sweep",
    "batch_size_5epochs",
    "batch_size_6epochs",
    "dcl_screen",
    "dcl_sweep",
)
#: the confirmatory plan's fresh data draw and first seed (draws 0 and 1, seeds 0-9 were read before)
FRESH_DRAW, FRESH_SEED = 2, 100


# ------------------------------------------------------------------------------------------
# The plans
# ------------------------------------------------------------------------------------------
def arm_name(label: str, b: int) -> str:
    """A plan's arm for objective ``label`` at batch ``b`` (``decl default`` at 32 -> ``decl-default-b32``)."""
    return re.sub(r"[^A-Za-z0-9_.+=-]+", "-", label.replace("'s ", " ")).strip("-") + f"-b{b}"


def _toml(value) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def plan_text(
    head: str,
    arms: Sequence[tuple],
    comparisons: Sequence[dict],
    seeds: Sequence[int],
    *,
    exploratory: bool,
    data_seed: int = 0,
    extra: Sequence[str] = (),
) -> str:
    """One plan: ``arms`` as ``(label, batch)``, ``comparisons`` as the keys of a ``[[comparisons]]``."""
    names = O.objectives()
    lines = [f"# {line}" if line else "#" for line in head.splitlines()]
    lines += [
        "# Written by `python benchmarks/batch_size.py plans` from benchmarks/testbed (edit there).",
        "",
        f'recipe = "{RECIPE}"',
        f"seeds = {_toml(list(seeds))}",
        f'metric = "{MEAN_R1}"',
        f"confidence = {T.CONFIDENCE}",
        f"resolution = {T.RESOLUTION}",
        "threads = 1",
        f"exploratory = {'true' if exploratory else 'false'}",
        *extra,
        "",
    ]
    if data_seed:
        from clip_dcl.experiment.recipes import RECIPES

        lines += ["[data]", f"command = {_toml([*RECIPES[RECIPE].data_argv, '--seed', str(data_seed)])}", ""]
    lines += ["[train]", "epochs = 20", 'device = "cpu"', ""]
    for label, b in dict.fromkeys(arms):
        lines += [
            "[[arms]]",
            f'name = "{arm_name(label, b)}"',
            f"batch_size = {b}",
            f"flags = {_toml(names[label])}",
            "",
        ]
    for c in comparisons:
        lines += ["[[comparisons]]", *[f"{k} = {v if k == 'margin_gain' else _toml(v)}" for k, v in c.items()], ""]
    return "\n".join(lines).rstrip() + "\n"


def _gain(low: str, high: str) -> str:
    return f'{{from = "{low}", to = "{high}", share = 0.5}}'


def _reach_and_beat(label: str, b: int, fixed: Optional[dict] = None) -> List[dict]:
    a, same, double = arm_name(label, b), arm_name("clip", b), arm_name("clip", 2 * b)
    reach = {"a": a, "b": double, "rule": "reaches"}
    reach.update(
        {"margin": round(fixed["margins"][b], 4), "paired_sd": round(fixed["sds"][b], 4)}
        if fixed
        else {"margin_gain": _gain(same, double)}
    )
    return [reach, {"a": a, "b": same, "rule": "beats"}]


def confirmatory_design(power: float = 0.8) -> Dict[str, object]:
    """The decisive plan's margins (half of ``clip``'s mean gain from B to 2B), paired spreads (of decl@B -
    clip@2B) and seed count (the most any reach needs for ``power``), all from the validation sweep's runs."""
    idx = T.per_seed(O.archived_runs(), "metrics")
    margins, sds, seeds = {}, {}, 2
    for b in O.DECISIVE_SIZES:
        common = sorted(
            s
            for (lab, bb, s) in idx
            if (lab, bb) == ("decl default", b) and ("clip", b, s) in idx and ("clip", 2 * b, s) in idx
        )
        margins[b] = sum(idx[("clip", 2 * b, s)] - idx[("clip", b, s)] for s in common) / len(common) / 2
        sds[b] = T.t_interval([idx[("decl default", b, s)] - idx[("clip", 2 * b, s)] for s in common])["std"]
        seeds = max(
            seeds, seeds_needed("reaches", round(sds[b], 4), T.CONFIDENCE, power, margin=round(margins[b], 4)) or 1000
        )
    return {"margins": margins, "sds": sds, "seeds": seeds}


def plans() -> Dict[str, str]:
    """Every stage's plan text, by file stem."""
    sizes, sweep = O.BATCH_SIZES, ("dcl tau+ 0.05", *O.SWEEP_VARIANTS)
    out = {}
    out["testbed_sweep"] = plan_text(
        "The validation sweep: clip at every batch size (the gate: its gain from the smallest to the largest),\n"
        "dcl at 0.05 and the sweep's DeCL variants at every batch size but the largest, seeds 0-2.",
        [("clip", b) for b in sizes] + [(lab, b) for lab in sweep for b in sizes[:-1]],
        [{"a": arm_name("clip", sizes[-1]), "b": arm_name("clip", sizes[0]), "rule": "beats"}]
        + [c for b in sizes[:-1] for c in _reach_and_beat("decl default", b)],
        [0, 1, 2],
        exploratory=True,
    )
    screened = [n for n in O.screen_objectives() if n != "clip"]
    out["testbed_screen"] = plan_text(
        "The DeCL screen: each variant one setting away from the screen's base, dcl at 0.05 and clip,\n"
        "at B = 16 and 64, one seed (the readings are the differences; one seed has no interval).",
        [(lab, b) for b in O.SCREEN_BATCH_SIZES for lab in ("clip", *screened)],
        [
            {"a": arm_name(lab, b), "b": arm_name("clip", b), "rule": "beats"}
            for b in O.SCREEN_BATCH_SIZES
            for lab in screened
        ],
        [0],
        exploratory=True,
    )
    out["testbed_screen16"] = plan_text(
        "The B = 16 screen: settings of the package default's relative estimate, each one setting away.",
        [(lab, 16) for lab in ("decl default", "clip", *O.SCREEN16_VARIANTS)],
        [{"a": arm_name(lab, 16), "b": arm_name("decl default", 16), "rule": "beats"} for lab in O.SCREEN16_VARIANTS],
        [0],
        exploratory=True,
    )
    out["testbed_dcl_screen"] = plan_text(
        "The dcl screen: each dcl setting against clip at the same batch, one seed.",
        [(lab, b) for b in (64, 16) for lab in ("clip", *O.DCL_VARIANTS)],
        [
            {"a": arm_name(lab, b), "b": arm_name("clip", b), "rule": "beats"}
            for b in (64, 16)
            for lab in O.DCL_VARIANTS
        ],
        [0],
        exploratory=True,
    )
    out["testbed_dcl_sweep"] = plan_text(
        "The dcl sweep: the settings through the dcl screen against clip at every batch size, test split.\n"
        "A setting fails where it trails clip (benchmarks/testbed/rule.py, DCL_RULE).",
        [(lab, b) for b in sorted(O.DCL_SWEEP_SIZES, reverse=True) for lab in (*O.DCL_SWEEP_VARIANTS, "clip")],
        [
            {"a": arm_name(lab, b), "b": arm_name("clip", b), "rule": "beats"}
            for lab in O.DCL_SWEEP_VARIANTS
            for b in O.DCL_SWEEP_SIZES
        ],
        [0, 1, 2],
        exploratory=False,
    )
    out["testbed_second_draw"] = plan_text(
        "The decisive comparison at B = 32 on another draw of the data: the same recipe, other images.",
        [("clip", 32), ("decl default", 32), ("clip", 64)],
        _reach_and_beat("decl default", 32),
        [0, 1, 2],
        exploratory=False,
        data_seed=1,
    )
    design = confirmatory_design()
    fresh = list(range(FRESH_SEED, FRESH_SEED + int(design["seeds"])))
    decisive = [(lab, bb) for b in O.DECISIVE_SIZES for lab, bb in (("clip", b), ("decl default", b), ("clip", 2 * b))]
    out["testbed_decisive"] = plan_text(
        f"The decisive stage as a plan on the micro-bpe recipe (not run; the study that decides will be\n"
        f"benchmarks/studies/confirmatory.toml, on the micro-words recipe, with a tuned InfoNCE arm): decl at B = "
        f"{' and '.join(map(str, O.DECISIVE_SIZES))}\nagainst clip at B and 2B, on a data draw ({FRESH_DRAW}) and "
        "seeds no "
        "earlier run used. Margins: half of clip's mean\ngain from B to 2B on the validation sweep; seeds: the most a "
        "reach needs for power 0.8 from the sweep's\npaired spread (`clip-dcl study check`).",
        decisive,
        [c for b in O.DECISIVE_SIZES for c in _reach_and_beat("decl default", b, design)],
        fresh,
        exploratory=False,
        data_seed=FRESH_DRAW,
    )
    controls = [
        (lab, b)
        for b in O.DECISIVE_SIZES
        for lab in ("clip", "decl default", f"clip at decl's scale (B={b})", f"decl at clip's scale (B={b})")
    ]
    out["testbed_controls"] = plan_text(
        "The temperature controls: InfoNCE at decl's final logit scale and decl at clip's, fixed (read from the\n"
        "validation sweep), beside clip and decl at B = 32 and 64, on the confirmatory plan's draw and seeds.",
        controls,
        [
            {"a": arm_name(x, b), "b": arm_name(y, b), "rule": "beats"}
            for b in O.DECISIVE_SIZES
            for x, y in (
                (f"clip at decl's scale (B={b})", "clip"),
                ("decl default", f"clip at decl's scale (B={b})"),
                (f"decl at clip's scale (B={b})", "clip"),
            )
        ],
        fresh,
        exploratory=False,
        data_seed=FRESH_DRAW,
    )
    for name, text in out.items():
        parse_plan(text, name)  # every plan is a valid one
    return out


# ------------------------------------------------------------------------------------------
# A study's runs as the testbed's records
# ------------------------------------------------------------------------------------------
def records_of(plan_path: Path, work: Path) -> List[dict]:
    """The finished runs of a study as the testbed report's records (label, batch, seed, both splits' scores
    (the test split's once every planned run has its scores, or never for an exploratory plan), the commit,
    the validation and logit-scale curves, the late clamp rate, the command)."""
    plan = load_plan(plan_path)
    check_seal(plan, work)
    labels = {arm_name(lab, b): (lab, b) for lab in O.objectives() for b in O.BATCH_SIZES}
    state = progress(plan, work)
    test = state["n_done"] == state["n_planned"] and not plan.exploratory
    out = []
    for arm, seed in sorted(state["done"], key=lambda r: plan.runs().index(r)):
        folder, rec = W.run_dir(work, arm, seed), W.read_record(work, arm, seed)
        label, b = labels.get(arm, (arm, settings(plan, arm).get("batch_size")))
        steps = read_metrics(folder, "train")
        val = [
            with_mean_r1({f"retrieval/{k}": v for k, v in r.items() if isinstance(v, (int, float))})
            for r in read_metrics(folder, "val")
        ]
        out.append(
            {
                "label": label,
                "flags": list(plan.arm(arm).flags),
                "batch_size": b,
                "seed": seed,
                "epochs": epochs(plan, arm),
                "metrics": W.read_scores(work, arm, seed, "validation"),
                "test_metrics": W.read_scores(work, arm, seed, "test") if test else None,
                "commit": rec["commit"],
                "recipe": rec["recipe"],
                "val_r1": [v[MEAN_R1] for v in val],
                "logit_scale": _last_per_epoch(steps, "logit_scale"),
                "clamp_rate": _late_clamp(steps),
                "train_seconds": rec.get("train_seconds") or 0.0,
                "finished": (rec.get("ended") or "")[:16],
            }
        )
    return out


def _last_per_epoch(steps: List[dict], key: str) -> List[float]:
    """The value of ``key`` in each epoch's last training record (``metrics.jsonl``)."""
    last: Dict[int, float] = {r["epoch"]: r[key] for r in steps if key in r}
    return [last[e] for e in sorted(last)]


def _late_clamp(steps: List[dict]) -> Optional[float]:
    """Mean logged ``clamp_rate`` over the last fifth of training (``dcl``: the rows at the floor)."""
    rows = [(r["epoch"], r["clamp_rate"]) for r in steps if "clamp_rate" in r]
    if not rows:
        return None
    last = max(e for e, _ in rows) + 1
    late = [v for e, v in rows if e >= last - max(1, last // 5)]
    return sum(late) / len(late)


def report(stage: str, work: Path, out: Path) -> Path:
    """The testbed's report of a stage's study under ``work`` into ``out``."""
    plan_path = STUDIES / f"{stage}.toml"
    records = records_of(plan_path, work)
    plan = load_plan(plan_path)
    data = json.loads((W.data_dir(work) / "summary.json").read_text())
    budget = get_recipe(plan.recipe).budget(epochs=epochs(plan, plan.arms[0].name))
    command = f"benchmarks/batch_size.py report {stage} --work {work}"
    started = datetime.now(timezone.utc)
    if stage == "testbed_dcl_screen":
        R.write_dcl_screen(R.Inputs(out, records, len(plan.runs()), data, budget, command, started, "dcl_screen"))
        return out / "dcl_screen.md"
    if stage == "testbed_dcl_sweep":
        R.write_dcl_sweep(R.Inputs(out, records, len(plan.runs()), data, budget, command, started, "dcl_sweep"))
        return out / "dcl_sweep.md"
    R.write(out, records, len(plan.runs()), data, budget, command, started, [stage], O.BATCH_SIZES, stage)
    return out / f"{stage}.md"


# ------------------------------------------------------------------------------------------
# Today's reports, written again from their JSON
# ------------------------------------------------------------------------------------------
def _data_of(doc: dict) -> dict:
    """A report's data: its config, and the class prior its training split has (recomputed from the labels)."""
    from clip_dcl.data.synth import split_labels, tau_plus_from_labels

    cfg = doc["data"]
    labels = split_labels(cfg["seed"], "train", cfg["train_samples"], cfg["num_classes"], cfg["class_imbalance"])
    return {"config": cfg, "tau_plus": tau_plus_from_labels(labels, cfg["num_classes"])}


def regenerate(out: Path, results: Path = O.RESULTS) -> Dict[str, dict]:
    """Write every report of :data:`REPORTS` again from its committed JSON into ``out``; the new JSON documents."""
    out.mkdir(parents=True, exist_ok=True)
    draws = {1: json.loads((results / "batch_size_draw1.json").read_text())["runs"]}
    started = datetime.now(timezone.utc)
    written = {}
    for stem in REPORTS:
        doc = json.loads((results / f"{stem}.json").read_text())
        budget = Budget(**{**doc["budget"], "extra": tuple(doc["budget"]["extra"])})
        data, runs, machine = _data_of(doc), doc["runs"], doc["machine"]
        again = R.Inputs(out, runs, len(runs), data, budget, doc["command"], started, stem, machine)
        if stem == "dcl_screen":
            R.write_dcl_screen(again)
        elif stem == "dcl_sweep":
            R.write_dcl_sweep(again, tuple(doc["objectives"]), gathered=len(runs), results=results)
        else:
            R.write(
                out,
                runs,
                len(runs),
                data,
                budget,
                doc["command"],
                started,
                ["report of finished runs"],
                O.BATCH_SIZES,
                stem,
                draws=draws if stem == "batch_size" else None,
                machine=machine,
            )
        written[stem] = json.loads((out / f"{stem}.json").read_text())
    return written


def verdicts_of(doc: dict) -> Dict[str, object]:
    """What a report concludes: its verdict rows, other draws, ``--loss dcl`` check, B = 16 screen, gate, the
    ``dcl`` screen's passing settings and the ``dcl`` sweep's decision (whichever it has)."""

    def rows(items):
        return [(r.get("kind"), r.get("split"), r["batch_size"], r["n"], r["verdict"]) for r in items or []]

    out: Dict[str, object] = {}
    if "verdicts" in doc:
        out.update(
            verdicts=rows(doc["verdicts"]), draws=rows(doc.get("draws")), dcl_default=rows(doc.get("dcl_default"))
        )
    if doc.get("screen16"):
        out["screen16"] = (doc["screen16"]["best"], rows(doc["screen16"]["verdicts"]))
    if "gate" in doc:  # None: not measured yet
        g = doc["gate"]
        out["gate"] = g and (g["small"], g["large"], round(g["gain"], 9), g["separate"], list(g["seeds"]), g["passed"])
    if "passing" in doc:
        out["passing"] = doc["passing"]
    if "decision" in doc:
        out["decision"] = (
            doc["decision"]["default"],
            {k: (v["passes"], v["trails_at"], v["missing"]) for k, v in doc["decision"]["settings"].items()},
        )
        out["readings"] = [(r["label"], r["batch_size"], r["reading"]) for r in doc["rows"]]
    return out


def same_verdicts(new: dict, old: dict) -> bool:
    """Whether a report written again concludes what the committed one did (on what the committed one says:
    the reports of the first calls had no verdict rows, only the gate)."""
    before = verdicts_of(old)
    return bool(before) and {k: v for k, v in verdicts_of(new).items() if k in before} == before


# ------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------
def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="benchmarks/batch_size.py", allow_abbrev=False, description=__doc__.split("\n\n")[0]
    )
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("plans", help="write the stages' plan files")
    a.add_argument("--check", action="store_true", help="write nothing; exit 1 when a committed plan differs")
    for name in ("run", "report"):
        s = sub.add_parser(name, help=f"{name} a stage's study")
        s.add_argument("stage", help="a plan of benchmarks/studies/ (testbed_decisive, testbed_sweep, ...)")
        s.add_argument("--work", required=True, help="the study's folder")
        if name == "run":
            s.add_argument(
                "--recipe",
                default=DEFAULT_RECIPE,
                choices=sorted(RECIPES),
                help=f"the testbed recipe (default {DEFAULT_RECIPE}; the committed runs are {RECIPE}'s: "
                f"--recipe {RECIPE} runs the plan as written)",
            )
            s.add_argument("--parallel", type=int, default=2, help="runs at once (default 2, one thread each)")
        else:
            s.add_argument("--out", default=None, help="report folder (default: the work folder)")
    g = sub.add_parser("regenerate", help="write the committed reports again from their JSON")
    g.add_argument("out", help="folder for the reports")
    args = p.parse_args(argv)
    if args.command == "plans":
        stale = [
            n
            for n, t in plans().items()
            if not (STUDIES / f"{n}.toml").is_file() or (STUDIES / f"{n}.toml").read_text() != t
        ]
        if not args.check:
            for name, text in plans().items():
                (STUDIES / f"{name}.toml").write_text(text)
        print(("differ: " if args.check else "written: ") + (", ".join(stale) or "none"))
        return 1 if args.check and stale else 0
    if args.command == "regenerate":
        written = regenerate(Path(args.out))
        committed = {stem: json.loads((O.RESULTS / f"{stem}.json").read_text()) for stem in written}
        differ = [s for s in written if not same_verdicts(written[s], committed[s])]
        print(
            f"{len(written)} reports written to {args.out}; verdicts differing from the committed ones: "
            + (", ".join(differ) or "none")
        )
        return 1 if differ else 0
    if not (STUDIES / f"{args.stage}.toml").is_file():
        p.error(
            f"stage {args.stage!r}: no {STUDIES / args.stage}.toml; the stages: "
            + ", ".join(sorted(x.stem for x in STUDIES.glob("testbed_*.toml")))
        )
    work = Path(args.work)
    if args.command == "run":
        path = STUDIES / f"{args.stage}.toml"
        if args.recipe != RECIPE:  # another recipe is another study: its own copy of the plan
            work.mkdir(parents=True, exist_ok=True)
            text = path.read_text().replace(f'recipe = "{RECIPE}"', f'recipe = "{args.recipe}"')
            path = work / f"{args.stage}.{args.recipe}.toml"
            path.write_text(text)
        out = run_study(load_plan(path), work, args.parallel, 1)
        return 1 if out["failed"] else 0
    print(report(args.stage, work, Path(args.out) if args.out else work))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
