"""The study's decision rule on paired differences (docs/studies.md, "The rule"), and the seeds it
needs for a stated power: `power` (noncentral t) and `seeds_needed`.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Sequence

from ..stats import t_interval


def verdict(
    rule: str,
    interval: Dict[str, float],
    *,
    resolution: float = 0.0,
    margin: Optional[float] = None,
    min_seeds: int = 2,
) -> str:
    """The rule's reading of ``interval`` (`t_interval`'s); "no verdict" below ``min_seeds`` differences."""
    n, lo, hi, mean = interval["n"], interval["lo"], interval["hi"], interval["mean"]
    if n < max(2, min_seeds) or not (math.isfinite(lo) and math.isfinite(hi)):
        return "no verdict"
    if rule == "beats":
        if lo <= 0 <= hi:
            return "no verdict"
        if abs(mean) < resolution:
            return "tie"
        return "beats" if lo > 0 else "trails"
    if margin is None or not math.isfinite(margin) or (rule == "matches" and not margin > 0):
        raise ValueError(f"rule {rule!r} needs a margin{' > 0' if rule == 'matches' else ''}, got {margin!r}")
    if rule == "reaches":  # a margin from the runs (margin_gain) may come out <= 0: the bar -margin is then >= 0
        return "reaches" if lo > -margin else "does not reach" if hi < -margin else "no verdict"
    if rule == "matches":
        if -margin < lo and hi < margin:
            return "matches"
        return "differs" if lo >= margin or hi <= -margin else "no verdict"
    raise ValueError(f"unknown rule {rule!r}; choose beats, reaches or matches")


def _pt(x: float, sign: bool = True) -> str:
    value = round(100 * x, 2) + 0.0  # + 0.0: a value that rounds to zero is "+0.00", never "-0.00"
    return f"{value:+.2f}" if sign else f"{value:.2f}"


def _points(x: float) -> str:
    """``x`` (a fraction) in points, with the unit: ``1 point``, ``2.50 points``."""
    return "1 point" if round(100 * x, 2) == 1 else f"{_pt(x, False)} points"


def reason(rule: str, row: Dict[str, object], resolution: float = 0.0) -> str:
    """Why ``row`` got its verdict, in words and points, for a reader who does not know the rule."""
    n, lo, hi, mean = row["n"], row["lo"], row["hi"], row["mean"]
    margin, said = row.get("margin"), row["verdict"]
    if n < 2 or not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{n} paired seed(s): an interval needs 2 or more"
    if rule == "beats":
        if said == "no verdict":
            return "the interval crosses zero: the data cannot tell which is better"
        if said == "tie":
            return (
                f"a tie: the interval lies on one side of zero, but its mean ({_pt(mean)}) is within the "
                f"resolution of ±{_points(resolution)}, too small a difference to count"
            )
        side = "above" if said == "beats" else "below"
        return (
            f"the whole interval lies {side} zero and its mean ({_pt(mean)}) is past the resolution of "
            f"±{_points(resolution)}"
        )
    if margin is None:
        return "no margin to read the interval against"
    bar = f"the bar of {_pt(-margin)} points (minus the margin of {_points(margin)})"
    if rule == "reaches":
        if said == "reaches":
            return f"the interval's low end ({_pt(lo)}) is above {bar}: any shortfall is within the margin"
        if said == "does not reach":
            return f"the interval's high end ({_pt(hi)}) is below {bar}: the shortfall is more than the margin"
        return f"the interval crosses {bar}: the data cannot tell whether the shortfall is within the margin"
    if said == "matches":
        return f"the whole interval lies within ±{_points(margin)} (the margin)"
    if said == "differs":
        return f"the whole interval lies outside ±{_points(margin)} (the margin)"
    return f"the interval crosses ±{_points(margin)} (the margin): the data cannot tell whether they match"


def judge(
    rule: str,
    diffs: Sequence[float],
    confidence: float,
    *,
    resolution: float = 0.0,
    margin: Optional[float] = None,
    min_seeds: int = 2,
) -> Dict[str, object]:
    """`t_interval` of ``diffs`` with the rule's ``verdict`` (and the ``margin`` it read)."""
    st = t_interval(list(diffs), confidence)
    return {
        **st,
        "margin": margin,
        "verdict": verdict(rule, st, resolution=resolution, margin=margin, min_seeds=min_seeds),
    }


def power(
    rule: str,
    n: int,
    sd: float,
    confidence: float,
    *,
    expected: float = 0.0,
    margin: Optional[float] = None,
) -> float:
    """P(the rule's positive verdict) with ``n`` seeds, paired differences ~ Normal(``expected``, ``sd``).

    The bound clears ``c`` when ``(mean - c) / (s / sqrt n) > t_{(1 + confidence) / 2, n - 1}``, a noncentral
    t with noncentrality ``(expected - c) sqrt(n) / sd``: beats ``c = 0``, reaches ``c = -margin``;
    matches is at least ``1 - P(lo <= -m) - P(hi >= m)`` (two one-sided tests).
    """
    from scipy import stats

    if n < 2:
        return 0.0
    df, tcrit = n - 1, float(stats.t.ppf((1 + confidence) / 2, n - 1))

    def clears(threshold: float, delta: float) -> float:  # P(mean - t* s / sqrt n > threshold)
        return float(stats.nct.sf(tcrit, df, (delta - threshold) * math.sqrt(n) / sd))

    if rule == "beats":
        return clears(0.0, expected)
    if margin is None:
        raise ValueError(f"rule {rule!r} needs a margin for its power")
    if rule == "reaches":
        return clears(-margin, expected)
    if rule == "matches":  # upper bound below m: the mirror image of the lower bound above -m
        return max(0.0, clears(-margin, expected) + clears(-margin, -expected) - 1.0)
    raise ValueError(f"unknown rule {rule!r}")


def planned_power(
    rule: str, n: int, sd: float, confidence: float, expected: float, margin: Optional[float] = None
) -> float:
    """A plan's stated power: for ``beats`` a verdict in the expected direction counts (a plan expecting
    ``a`` to trail plans for trails).
    """
    return power(rule, n, sd, confidence, expected=abs(expected) if rule == "beats" else expected, margin=margin)


def seeds_needed(
    rule: str,
    sd: float,
    confidence: float,
    target: float = 0.8,
    *,
    expected: float = 0.0,
    margin: Optional[float] = None,
    cap: int = 1000,
) -> Optional[int]:
    """The fewest seeds (2 at least) whose `power` reaches ``target``; None when ``cap`` seeds do not."""
    for n in range(2, cap + 1):
        if power(rule, n, sd, confidence, expected=expected, margin=margin) >= target:
            return n
    return None
