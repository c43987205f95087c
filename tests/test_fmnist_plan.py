"""benchmarks/fmnist_confirmatory_plan.py: the choices come from the screen's validation scores, the spreads are
the paired ones (floored at the pooled spread), and the plan it writes is one `clip-dcl study` accepts."""

import math
import statistics
from pathlib import Path

import benchmark_script
import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fp():
    return benchmark_script.load("fmnist_confirmatory_plan")


@pytest.fixture(scope="module")
def arms(fp):
    return {a["name"]: a["flags"] for a in tomllib.loads(fp.SCREEN.read_text())["arms"]}


def _scores(arms, best_debiased="dcl-top0.1-b32", best_infonce={32: "infonce-scale10-b32", 64: "clip-b64"}):
    s = {}
    for i, arm in enumerate(sorted(arms)):
        base = 0.82 + (0.01 if arm == best_debiased else 0) + (0.008 if arm in best_infonce.values() else 0)
        for seed, wobble in ((1, 0.0), (2, 0.004 * ((i * 3) % 5 - 2))):
            s[(arm, seed)] = base + wobble
    return s


def test_choices_are_the_best_mean_of_their_kind(fp, arms):
    chosen = fp.choose(_scores(arms), arms)
    assert chosen == {"debiased": "dcl-top0.1-b32", "tuned": {32: "infonce-scale10-b32", 64: "clip-b64"}}
    other = fp.choose(_scores(arms, best_debiased="dcl-auto-b32"), arms)
    assert other["debiased"] == "dcl-auto-b32"  # auto counts as debiased; InfoNCE at prior 0 never does
    assert not fp.is_debiased(arms["infonce-scale7-b32"]) and fp.is_infonce(arms["infonce-scale7-b32"])
    assert fp.is_debiased(arms["hcl-pos0.1-b32"]) and not fp.is_infonce(arms["decl-b32"])


def test_spreads_are_paired_and_floored_at_the_pooled_one(fp, arms):
    s = _scores(arms)
    chosen = fp.choose(s, arms)
    rows = {(r["a"], r["b"]): r for r in fp.comparisons(s, arms, chosen)}
    # B = 64's tuned InfoNCE is clip itself: compared once
    assert set(rows) == {
        ("debiased-b32", "clip-b32"),
        ("debiased-b32", "tuned-b32"),
        ("decl-b32", "clip-b32"),
        ("decl-b32", "tuned-b32"),
        ("debiased-b64", "clip-b64"),
        ("decl-b64", "clip-b64"),
    }
    d = [s[("decl-b32", k)] - s[("infonce-scale10-b32", k)] for k in (1, 2)]
    r = rows[("decl-b32", "tuned-b32")]
    assert r["diffs"] == pytest.approx(d) and r["expected"] == pytest.approx(statistics.mean(d))
    pooled = fp.pooled_sd(s, arms)
    assert r["paired_sd"] == pytest.approx(max(statistics.stdev(d), pooled))
    # the pooled spread, computed directly: every non-clip arm's two-seed differences against clip at its B
    direct = []
    for arm in arms:
        b = arm.rsplit("-b", 1)[1]
        if arm != f"clip-b{b}":
            x = [s[(arm, k)] - s[(f"clip-b{b}", k)] for k in (1, 2)]
            direct.append((x[0] - x[1]) ** 2 / 2)
    assert pooled == pytest.approx(math.sqrt(statistics.mean(direct)))
    # the debiased arm ran at B = 64 in the screen (dcl-top0.1-b64): its own numbers, not B = 32's
    assert rows[("debiased-b64", "clip-b64")]["screen"] == "dcl-top0.1-b64 - clip-b64"


def test_a_setting_not_screened_at_64_takes_its_32_numbers(fp, arms):
    s = _scores(arms, best_debiased="hcl-top0.1-b32")
    rows = {(r["a"], r["b"]): r for r in fp.comparisons(s, arms, fp.choose(s, arms))}
    assert rows[("debiased-b64", "clip-b64")]["screen"] == "hcl-top0.1-b32 - clip-b32"


def test_the_written_plan_is_valid_and_carries_the_choices(fp, arms, tmp_path):
    from clip_dcl.experiment.study.plan import load_plan

    s = _scores(arms)
    chosen = fp.choose(s, arms)
    rows = fp.comparisons(s, arms, chosen)
    counts = fp.seed_counts(rows, 5, 10)
    path = tmp_path / "fmnist_confirmatory.toml"
    path.write_text(fp.write(rows, counts, chosen, arms, fp.pooled_sd(s, arms), "fmnist-words"))
    plan = load_plan(path)
    assert not plan.exploratory and plan.metric == "zeroshot/top1" and list(plan.seeds)[0] == 100
    names = sorted(a.name for a in plan.arms)
    assert names == sorted(
        ["debiased-b32", "decl-b32", "clip-b32", "tuned-b32", "debiased-b64", "decl-b64", "clip-b64"]
    )
    deb = next(a for a in plan.arms if a.name == "debiased-b64")
    assert list(deb.flags) == arms["dcl-top0.1-b32"]
    decl = next(a for a in plan.arms if a.name == "decl-b32")
    assert "--decl-rate" in decl.flags  # decl's defaults written out in full
    text = path.read_text()
    assert '"fashion-mnist"' in text and '"--seed", "1"' in text
    assert all(5 <= k <= 10 for k in counts)


def test_the_committed_plan_is_the_one_written_from_the_committed_screen(fp, arms):
    s = fp.screen_scores(fp.RESULTS / "fmnist_screen.json")
    chosen = fp.choose(s, arms)
    rows = fp.comparisons(s, arms, chosen)
    plan = tomllib.loads(fp.PLAN.read_text())
    counts = [c["seeds"] for c in plan["comparisons"]]
    text = fp.write(rows, counts, chosen, arms, fp.pooled_sd(s, arms), "fmnist-words")
    assert text == fp.PLAN.read_text()
