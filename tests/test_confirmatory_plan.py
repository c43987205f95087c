"""benchmarks/confirmatory_plan.py: the confirmatory plan's numbers come from the spread runs, and the plan it
writes is one `clip-dcl study` accepts, with every number where the spread puts it."""

import statistics
from pathlib import Path

import benchmark_script
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cp():
    return benchmark_script.load("confirmatory_plan")


def _scores():
    base = {
        "clip-b32": 0.28,
        "clip-b64": 0.31,
        "clip-b128": 0.40,
        "decl-b32": 0.31,
        "decl-b64": 0.38,
        "tuned-b32": 0.33,
        "tuned-b64": 0.36,
    }
    wobble = {1: 0.0, 2: 0.01, 3: -0.02}
    s = {(arm, seed): v + wobble[seed] for arm, v in base.items() for seed in (1, 2, 3)}
    for i, key in enumerate(sorted(s)):  # every arm's seeds a little off, so no paired spread is zero
        s[key] += 0.004 * ((i * 7) % 5 - 2)
    s[("decl-b32", 2)] += 0.015
    return s


def test_margins_spreads_and_means_are_the_paired_ones(cp):
    rows = {(r["a"], r["b"]): r for r in cp.comparisons(_scores())}
    assert set(rows) == {
        ("decl-b32", "clip-b32"),
        ("decl-b32", "tuned-b32"),
        ("decl-b32", "clip-b64"),
        ("decl-b64", "clip-b64"),
        ("decl-b64", "tuned-b64"),
        ("decl-b64", "clip-b128"),
    }
    r = rows[("decl-b32", "clip-b64")]
    sc = _scores()
    gain = statistics.mean(sc[("clip-b64", k)] - sc[("clip-b32", k)] for k in (1, 2, 3))
    assert r["rule"] == "reaches" and r["margin"] == pytest.approx(gain / 2)  # half of clip's gain 32 -> 64
    gain = statistics.mean(sc[("clip-b128", k)] - sc[("clip-b64", k)] for k in (1, 2, 3))
    assert rows[("decl-b64", "clip-b128")]["margin"] == pytest.approx(gain / 2)
    sc = _scores()
    d = [sc[("decl-b32", k)] - sc[("clip-b32", k)] for k in (1, 2, 3)]
    r = rows[("decl-b32", "clip-b32")]
    assert r["diffs"] == pytest.approx(d) and r["expected"] == pytest.approx(statistics.mean(d))
    assert r["paired_sd"] == pytest.approx(statistics.stdev(d))


def test_the_written_plan_is_valid_and_carries_the_numbers(cp, tmp_path):
    from clip_dcl.experiment.study.plan import load_plan

    rows = cp.comparisons(_scores())
    tuned = {
        32: ["--loss", "dcl", "--tau-plus", "0.0", "--dcl-temperature", "0.035714"],
        64: ["--loss", "dcl", "--tau-plus", "0.0", "--dcl-temperature", "0.06993"],
    }
    path = tmp_path / "confirmatory.toml"
    path.write_text(cp.write(rows, [7, 7, 7, 3, 3, 3], tuned))
    plan = load_plan(path)
    assert list(plan.seeds) == list(range(300, 307)) and not plan.exploratory
    assert plan.arm_seeds("decl-b32") == tuple(range(300, 307)) and plan.arm_seeds("clip-b128") == (300, 301, 302)
    assert sorted(a.name for a in plan.arms) == sorted(
        ["decl-b32", "clip-b32", "tuned-b32", "decl-b64", "clip-b64", "tuned-b64", "clip-b128"]
    )
    reach = next(c for c in plan.comparisons if c.b == "clip-b128")
    want = next(r for r in rows if r["b"] == "clip-b128")["margin"]
    assert reach.rule == "reaches" and reach.margin == pytest.approx(want, abs=1e-4)
    text = path.read_text()
    assert '"--seed", "3"' in text and '"--pack"' in text
    assert '--dcl-temperature", "0.06993"' in text


def test_the_seed_count_follows_the_spread(cp):
    rows = cp.comparisons(_scores())
    noisy = [{**r, "paired_sd": r["paired_sd"] * 4} for r in rows]
    assert max(cp.needed(r) for r in noisy) > max(cp.needed(r) for r in rows)


def test_seed_counts_floor_cap_and_the_unpowered_comparison(cp):
    rows = [
        {"rule": "beats", "paired_sd": 0.01, "expected": 0.05},
        {"rule": "beats", "paired_sd": 0.04, "expected": 0.01},
        {"rule": "reaches", "paired_sd": 0.034, "expected": -0.005, "margin": 0.0256},
    ]
    need = [cp.needed(r) for r in rows]
    assert need[0] < 6 and need[1] > 20 and 6 < need[2] <= 20
    assert cp.seed_counts(rows, 6, 20) == [6, need[2], need[2]]
