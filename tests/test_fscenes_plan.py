"""benchmarks/fscenes_confirmatory_plan.py: the committed plan is the one written from the committed screen and
gate, its reaches carry their margin from the runs, and a reach expected to fall short is powered toward
"does not reach"."""

import benchmark_script
import numpy as np
import pytest


@pytest.fixture(scope="module")
def sp():
    return benchmark_script.load("fscenes_confirmatory_plan")


def test_the_committed_plan_is_the_one_written_from_the_committed_screen_and_gate(sp):
    from clip_dcl.experiment.study.plan import load_plan

    committed = sp.PLAN.read_text()
    plan = load_plan(sp.PLAN)
    text, counts = sp.build(4, 4)
    assert text == committed and counts == [c.seeds for c in plan.comparisons]
    assert sorted(a.name for a in plan.arms) == sorted(
        ["decl-b32", "clip-b32", "tuned-b32", "decl-b64", "clip-b64", "tuned-b64", "clip-b128"]
    )
    reaches = {(c.a, c.b): c.margin_gain for c in plan.comparisons if c.rule == "reaches"}
    assert reaches == {
        ("decl-b32", "clip-b64"): ("clip-b32", "clip-b64", 0.5),
        ("decl-b64", "clip-b128"): ("clip-b64", "clip-b128", 0.5),
    }
    assert '"--seed", "1"' in committed and '"--min-items", "4"' in committed


def test_the_gate_scores_are_fractions_paired_by_seed(sp):
    g = sp.gate_scores(sp.RESULTS / "fscenes_gate.json")
    assert g[("clip-b128", 1)] == pytest.approx(0.208) and g[("clip-b16", 2)] == pytest.approx(0.1385)


@pytest.mark.parametrize("expected,margin", [(-0.011, 0.0086), (-0.004, 0.001)])
def test_a_reach_expected_short_is_powered_toward_does_not_reach(sp, expected, margin):
    from clip_dcl.experiment.stats import t_interval
    from clip_dcl.experiment.study.rule import planned_power

    n, sd = 6, 0.006
    r = {"rule": "reaches", "expected": expected, "margin": margin, "paired_sd": sd}
    d = sp.directed(r)
    assert d["toward"] == "does not reach"
    p = planned_power("reaches", n, sd, sp.CONFIDENCE, d["expected"], margin=margin)
    # Monte Carlo: how often the interval's upper bound falls below -margin
    rng = np.random.default_rng(0)
    hits = [t_interval(x, sp.CONFIDENCE)["hi"] < -margin for x in rng.normal(expected, sd, (4000, n))]
    assert p == pytest.approx(np.mean(hits), abs=0.03)
    assert sp.directed(dict(r, expected=-margin / 2)) == dict(r, expected=-margin / 2)  # expected to reach


def test_the_readmes_inside_the_resolution_sentence_holds_in_the_report():
    """The README says that at B = 64 both same-batch intervals lie inside the plan's resolution and that at
    B = 32 they do not: the report's JSON must say the same."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    report = json.loads((root / "benchmarks" / "results" / "fscenes_confirmatory.json").read_text())
    inside = {
        c["label"]: -report["resolution"] < c["final"]["lo"] and c["final"]["hi"] < report["resolution"]
        for c in report["comparisons"]
        if c["rule"] == "beats"
    }
    assert inside == {
        "decl-b32 beats clip-b32": False,
        "decl-b32 beats tuned-b32": False,
        "decl-b64 beats clip-b64": True,
        "decl-b64 beats tuned-b64": True,
    }
    readme = " ".join((root / "README.md").read_text().split())
    assert "At B = 64 both intervals (against `clip` and the tuned InfoNCE) lie inside the plan's resolution" in readme
