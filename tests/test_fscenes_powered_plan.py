"""benchmarks/fscenes_powered_plan.py: the committed plan is the one written from the committed scene
confirmatory study, on a data draw and seeds no earlier scene plan used, with that study's arms verbatim and
seeds enough for its stated power on both comparisons."""

import benchmark_script
import pytest
import tomllib


@pytest.fixture(scope="module")
def pp():
    return benchmark_script.load("fscenes_powered_plan")


def test_the_committed_plan_is_the_one_written_from_the_committed_study(pp):
    from clip_dcl.experiment.study.plan import load_plan

    committed = pp.PLAN.read_text()
    plan = load_plan(pp.PLAN)
    text, counts = pp.build(4)
    assert text == committed and counts == [c.seeds for c in plan.comparisons]
    assert [(c.a, c.b, c.rule) for c in plan.comparisons] == [
        ("decl-b32", "clip-b32", "beats"),
        ("decl-b32", "tuned-b32", "beats"),
    ]
    assert plan.resolution == 0.005 and plan.recipe == "fscenes4-words" and not plan.exploratory


def test_the_arms_are_the_earlier_plans_verbatim(pp):
    earlier = {a["name"]: a for a in tomllib.loads(pp.EARLIER.read_text())["arms"]}
    ours = tomllib.loads(pp.PLAN.read_text())["arms"]
    assert [a["name"] for a in ours] == ["decl-b32", "clip-b32", "tuned-b32"]
    assert all(a == earlier[a["name"]] for a in ours)


def test_its_data_draw_and_seeds_are_fresh(pp):
    plans = pp.earlier_scene_plans()
    assert {"fscenes_screen.toml", "fscenes_gate.toml", "fscenes_gate2.toml", "fscenes_confirmatory.toml"} <= set(plans)
    assert "fscenes_powered.toml" not in plans
    ours = tomllib.loads(pp.PLAN.read_text())
    assert pp.data_draw(ours) not in {pp.data_draw(p) for p in plans.values()}
    assert {pp.data_draw(plans[n]) for n in ("fscenes_screen.toml", "fscenes_confirmatory.toml")} == {0, 1}
    assert not set(ours["seeds"]) & {s for p in plans.values() for s in p["seeds"]}


def test_each_comparison_has_the_seeds_its_power_needs_from_the_validation_spread(pp):
    """Not TOO FEW SEEDS (`study check`'s reading); the spread is that of the earlier study's validation
    differences, whose seeds are the earlier plan's, and the expected difference is the resolution, not a mean."""
    import json
    import statistics

    from clip_dcl.experiment.study.plan import load_plan
    from clip_dcl.experiment.study.power import planned_power

    plan = load_plan(pp.PLAN)
    for c in plan.comparisons:
        p = planned_power(plan, c)
        assert not p["short"] and p["power"] >= 0.8 and c.expected == 0.005
    report = json.loads(pp.REPORT.read_text())
    validation = {r["label"]: r for r in report["validation"]}
    for c in plan.comparisons:
        row = validation[f"{c.a} beats {c.b}"]
        assert row["split"] == "validation" and row["seeds"] == [100, 101, 102, 103]
        assert c.paired_sd == pytest.approx(statistics.stdev(row["diffs"]), abs=5e-5)


def test_it_refuses_to_overwrite_the_plan(pp, capsys):
    assert pp.main([]) == 1
    assert "a plan is written once" in capsys.readouterr().err


def test_the_report_shows_the_plan_committed_before_its_first_run(pp):
    import json

    from clip_dcl.experiment.study.plan import load_plan

    report = json.loads((pp.pw.RESULTS / "fscenes_powered.json").read_text())
    assert report["plan"] == "benchmarks/studies/fscenes_powered.toml" and not report["exploratory"]
    assert report["plan_sha256"] == load_plan(pp.PLAN).sha256
    assert report["plan_committed"] and report["first_run"] and report["plan_committed"] < report["first_run"]
