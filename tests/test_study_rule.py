"""The study's rule against a slow, obviously correct recomputation, and its power against simulation and a
textbook table."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from clip_dcl.experiment.stats import t_interval
from clip_dcl.experiment.study.rule import judge, power, reason, seeds_needed, verdict


def slow_interval(diffs, confidence):
    """The t-interval by the textbook formula, with scipy's one-sample t-test for the bounds."""
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    ci = stats.ttest_1samp(diffs, 0.0).confidence_interval(confidence_level=confidence)
    return mean, sd, ci.low, ci.high


def slow_verdict(rule, diffs, confidence, resolution, margin):
    """The rule as docs/studies.md words it, read off the slow interval."""
    mean, _, lo, hi = slow_interval(diffs, confidence)
    if rule == "beats":
        if lo > 0:
            return "beats" if mean >= resolution else "tie"
        if hi < 0:
            return "trails" if -mean >= resolution else "tie"
        return "no verdict"
    if rule == "reaches":
        if lo > -margin:
            return "reaches"
        return "does not reach" if hi < -margin else "no verdict"
    if lo > -margin and hi < margin:
        return "matches"
    return "differs" if lo >= margin or hi <= -margin else "no verdict"


def test_the_interval_and_every_verdict_equal_the_slow_recomputation_on_many_random_inputs():
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(600):
        n = int(rng.integers(2, 12))
        rule = ("beats", "reaches", "matches")[int(rng.integers(3))]
        confidence = float(rng.choice([0.8, 0.9, 0.95, 0.99]))
        diffs = list(rng.normal(rng.normal(0, 0.03), rng.uniform(0.001, 0.05), n))
        margin = None if rule == "beats" else float(rng.uniform(0.002, 0.05))
        resolution = float(rng.choice([0.0, 0.01]))
        got = judge(rule, diffs, confidence, resolution=resolution, margin=margin)
        mean, sd, lo, hi = slow_interval(diffs, confidence)
        assert (got["mean"], got["std"], got["lo"], got["hi"]) == pytest.approx((mean, sd, lo, hi), rel=1e-9, abs=1e-12)
        want = slow_verdict(rule, diffs, confidence, resolution, margin)
        assert got["verdict"] == want, (rule, diffs, confidence, margin)
        seen.add((rule, want))
    # every reading of every rule came up
    assert seen == {("beats", v) for v in ("beats", "trails", "tie", "no verdict")} | {
        ("reaches", v) for v in ("reaches", "does not reach", "no verdict")
    } | {("matches", v) for v in ("matches", "differs", "no verdict")}


def test_edges_a_single_seed_and_a_margin_the_rule_needs():
    assert judge("beats", [0.5], 0.9)["verdict"] == "no verdict"
    assert t_interval([0.5])["n"] == 1 and math.isnan(t_interval([0.5])["lo"])
    with pytest.raises(ValueError, match="needs a margin"):
        verdict("reaches", t_interval([0.1, 0.2]), margin=None)
    with pytest.raises(ValueError, match="needs a margin > 0"):
        verdict("matches", t_interval([0.1, 0.2]), margin=0.0)
    # a margin taken from the runs may be negative: the bar -margin then lies above zero
    assert verdict("reaches", t_interval([0.01, 0.012, 0.011]), margin=-0.005) == "reaches"
    assert verdict("reaches", t_interval([0.001, 0.002, 0.0015]), margin=-0.005) == "does not reach"
    # below min_seeds no verdict, whatever the interval (the batch-size testbed's rule asks three)
    assert verdict("beats", t_interval([0.05, 0.06]), min_seeds=3) == "no verdict"
    assert verdict("beats", t_interval([0.05, 0.06, 0.05]), min_seeds=3) == "beats"


@pytest.mark.parametrize(
    "rule, diffs, margin, said, words",
    [
        ("beats", [0.0, 0.0], None, "no verdict", "the interval crosses zero: the data cannot tell which is better"),
        (
            "beats",
            [0.05, -0.04, 0.02],
            None,
            "no verdict",
            "the interval crosses zero: the data cannot tell which is better",
        ),
        (
            "beats",
            [0.004, 0.005, 0.006],
            None,
            "tie",
            "a tie: the interval lies on one side of zero, but its mean (+0.50) is within the resolution of ±1 point",
        ),
        (
            "beats",
            [0.05, 0.06, 0.04],
            None,
            "beats",
            "the whole interval lies above zero and its mean (+5.00) is past the resolution of ±1 point",
        ),
        ("beats", [-0.05, -0.06, -0.04], None, "trails", "the whole interval lies below zero"),
        (
            "reaches",
            [0.0, -0.01, 0.005],
            0.02,
            "reaches",
            "is above the bar of -2.00 points (minus the margin of 2.00 points): any shortfall is within the margin",
        ),
        ("reaches", [-0.05, -0.06, -0.04], 0.02, "does not reach", "is below the bar of -2.00 points"),
        (
            "reaches",
            [0.0, -0.05, 0.01],
            0.02,
            "no verdict",
            "the interval crosses the bar of -2.00 points (minus the margin of 2.00 points): the data cannot tell",
        ),
        ("matches", [0.0, 0.005, -0.005], 0.03, "matches", "the whole interval lies within ±3.00 points (the margin)"),
        ("matches", [0.1, 0.11, 0.12], 0.03, "differs", "the whole interval lies outside ±3.00 points"),
        ("matches", [0.0, 0.06, -0.01], 0.03, "no verdict", "the interval crosses ±3.00 points (the margin)"),
        ("beats", [0.05], None, "no verdict", "1 paired seed(s): an interval needs 2 or more"),
    ],
)
def test_each_verdict_says_why_in_words(rule, diffs, margin, said, words):
    row = judge(rule, diffs, 0.9, resolution=0.01, margin=margin)
    assert row["verdict"] == said
    assert words in reason(rule, row, 0.01)


def simulated_power(rule, n, sd, confidence, expected, margin, draws=40000, seed=1):
    """P(the positive verdict), counted over simulated studies of ``n`` normal paired differences."""
    rng = np.random.default_rng(seed)
    x = rng.normal(expected, sd, (draws, n))
    mean, s = x.mean(axis=1), x.std(axis=1, ddof=1)
    half = stats.t.ppf((1 + confidence) / 2, n - 1) * s / math.sqrt(n)
    lo, hi = mean - half, mean + half
    if rule == "beats":
        return float(np.mean(lo > 0))
    if rule == "reaches":
        return float(np.mean(lo > -margin))
    return float(np.mean((lo > -margin) & (hi < margin)))


@pytest.mark.parametrize(
    "rule, n, sd, confidence, expected, margin",
    [
        ("beats", 5, 0.02, 0.9, 0.02, None),
        ("beats", 12, 0.04, 0.95, 0.03, None),
        ("reaches", 4, 0.02, 0.9, 0.0, 0.02),
        ("reaches", 8, 0.04, 0.9, -0.01, 0.03),
    ],
)
def test_power_equals_a_simulation_of_the_rule(rule, n, sd, confidence, expected, margin):
    got = power(rule, n, sd, confidence, expected=expected, margin=margin)
    assert got == pytest.approx(simulated_power(rule, n, sd, confidence, expected, margin), abs=0.01)


def test_the_power_of_matches_is_a_lower_bound_tight_at_planned_powers():
    for n in (6, 10, 20):
        got = power("matches", n, 0.02, 0.9, margin=0.025)
        sim = simulated_power("matches", n, 0.02, 0.9, 0.0, 0.025)
        assert got <= sim + 0.01 and (got < 0.5 or sim - got < 0.03), (n, got, sim)


def test_seeds_needed_equal_the_textbook_table():
    # one-sample t-test, two-sided alpha 0.05, effect d = 0.5 (0.8): 34 (15) subjects for power 0.8,
    # 44 for power 0.9 (Cohen 1988; G*Power gives the same)
    assert seeds_needed("beats", 1.0, 0.95, 0.8, expected=0.5) == 34
    assert seeds_needed("beats", 1.0, 0.95, 0.8, expected=0.8) == 15
    assert seeds_needed("beats", 1.0, 0.95, 0.9, expected=0.5) == 44
    n = seeds_needed("reaches", 0.02, 0.9, 0.8, margin=0.02)
    assert power("reaches", n, 0.02, 0.9, margin=0.02) >= 0.8 > power("reaches", n - 1, 0.02, 0.9, margin=0.02)
