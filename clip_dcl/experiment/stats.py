"""Statistics of the benchmarks' seeds: mean and spread, paired differences, wins, t-intervals.

Training seeds share the data and, seed for seed, the initialisation, so a comparison of two
objectives is read from their per-seed differences (`paired_differences`) as well as from
each one's mean and sample standard deviation (`mean_std`); `t_interval` gives the
Student t-interval of a mean difference that the decision rules read.
"""
from __future__ import annotations

import math
from typing import Dict, List, Sequence


def mean_std(values: Sequence[float]) -> Dict[str, float]:
    """Mean, sample standard deviation (``ddof = 1``; nan for one value) and count of the finite values.

    ``None`` and non-finite values (a run that diverged, a metric a run does not report) are
    left out, so that one of them does not turn a whole row into nan.
    """
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    n = len(finite)
    if n == 0:
        return {"mean": float("nan"), "std": float("nan"), "n": 0}
    mean = sum(finite) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in finite) / (n - 1)) if n > 1 else float("nan")
    return {"mean": mean, "std": std, "n": n}


def format_mean_std(st: Dict[str, float], scale: float = 100.0, digits: int = 1) -> str:
    """``"m ± s"`` of a `mean_std` record times ``scale`` (percent by default); ``"m"`` alone
    below two values, ``"nan"`` for none."""
    cell = f"{scale * st['mean']:.{digits}f}"
    return cell + (f" ± {scale * st['std']:.{digits}f}" if st["n"] > 1 else "")


def summarize(scores: Dict[str, List[Dict[str, float]]], keys: Sequence[str]) -> Dict[str, Dict[str, dict]]:
    """``{run: {metric: mean_std over seeds}}`` for the given metric keys (missing -> nan)."""
    return {name: {k: mean_std([s.get(k, float("nan")) for s in per_seed]) for k in keys}
            for name, per_seed in scores.items()}


def wins(diffs: Sequence[float]) -> Dict[str, float]:
    """Mean and sample std of paired differences, and how many are above, below and at zero.

    ``{"mean", "std", "wins", "losses", "ties", "n"}``: ``wins`` counts the pairs where the first
    of the two scores strictly higher.
    """
    st = mean_std(diffs)
    return {"mean": st["mean"], "std": st["std"], "wins": sum(d > 0 for d in diffs),
            "losses": sum(d < 0 for d in diffs), "ties": sum(d == 0 for d in diffs), "n": len(diffs)}


def paired_differences(scores: Dict[str, List[Dict[str, float]]], reference: str,
                       keys: Sequence[str]) -> Dict[str, Dict[str, dict]]:
    """Per-seed differences ``run - reference`` of each metric, paired by the ``"seed"`` of each record.

    ``scores``: run -> one metrics dict per seed, each with a ``"seed"``. Only seeds present in
    both runs with finite values are paired. For each run other than ``reference`` and each key:
    ``{"seeds", "diffs", "mean", "std", "wins", "losses", "ties", "n"}`` (``wins``: seeds where the
    run scores strictly higher; ``std``: sample std of the differences, nan below two pairs).

    Raises:
        ValueError: ``reference`` not in ``scores``, or a run repeats a seed.
    """
    if reference not in scores:
        raise ValueError(f"reference run {reference!r} not among {list(scores)}")

    def by_seed(name):
        seeds = [s.get("seed") for s in scores[name]]
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"run {name!r} repeats a seed: {seeds}")
        return {s.get("seed"): s for s in scores[name]}

    ref = by_seed(reference)
    out: Dict[str, Dict[str, dict]] = {}
    for name in scores:
        if name == reference:
            continue
        mine = by_seed(name)
        out[name] = {}
        for key in keys:
            seeds, diffs = [], []
            for seed in sorted(set(mine) & set(ref), key=lambda s: (s is None, s)):
                a, b = mine[seed].get(key, float("nan")), ref[seed].get(key, float("nan"))
                if math.isfinite(a) and math.isfinite(b):
                    seeds.append(seed)
                    diffs.append(a - b)
            out[name][key] = {"seeds": seeds, "diffs": diffs, **wins(diffs)}
    return out


def t_interval(diffs: Sequence[float], confidence: float = 0.90) -> Dict[str, float]:
    """Mean of paired differences and its two-sided ``confidence`` Student t-interval over seeds.

    ``{"mean", "lo", "hi", "std", "n"}``: ``mean -/+ t_{(1 + confidence) / 2, n - 1} * std / sqrt(n)``
    with the sample std (scipy's t quantile); nan bounds below two values (one seed has no spread).
    """
    from scipy import stats

    st = mean_std(diffs)
    half = (float(stats.t.ppf((1 + confidence) / 2, st["n"] - 1)) * st["std"] / st["n"] ** 0.5
            if st["n"] > 1 else float("nan"))
    return {"mean": st["mean"], "lo": st["mean"] - half, "hi": st["mean"] + half, "std": st["std"], "n": st["n"]}
