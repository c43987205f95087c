"""Statistics of the benchmarks' seeds: mean and spread, and, since seeds share the data and, seed for
seed, the initialisation, paired differences, wins and t-intervals."""

from __future__ import annotations

import math
from typing import Dict, List, Sequence


def mean_std(values: Sequence[float]) -> Dict[str, float]:
    """Mean, sample standard deviation (``ddof = 1``) and count of the finite values (None and NaN left out)."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    n = len(finite)
    if n == 0:
        return {"mean": float("nan"), "std": float("nan"), "n": 0}
    mean = sum(finite) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in finite) / (n - 1)) if n > 1 else float("nan")
    return {"mean": mean, "std": std, "n": n}


def format_mean_std(st: Dict[str, float], scale: float = 100.0, digits: int = 1) -> str:
    """``"m ± s"`` of a `mean_std` record times ``scale``; ``"m"`` below two values, ``"nan"`` for none."""
    cell = f"{scale * st['mean']:.{digits}f}"
    return cell + (f" ± {scale * st['std']:.{digits}f}" if st["n"] > 1 else "")


def summarize(scores: Dict[str, List[Dict[str, float]]], keys: Sequence[str]) -> Dict[str, Dict[str, dict]]:
    """``{run: {metric: mean_std over seeds}}`` for the given metric keys (missing -> nan)."""
    return {
        name: {k: mean_std([s.get(k, float("nan")) for s in per_seed]) for k in keys}
        for name, per_seed in scores.items()
    }


def wins(diffs: Sequence[float]) -> Dict[str, float]:
    """``{"mean", "std", "wins", "losses", "ties", "n"}`` of paired differences (wins: the first higher)."""
    st = mean_std(diffs)
    return {
        "mean": st["mean"],
        "std": st["std"],
        "wins": sum(d > 0 for d in diffs),
        "losses": sum(d < 0 for d in diffs),
        "ties": sum(d == 0 for d in diffs),
        "n": len(diffs),
    }


def paired_differences(
    scores: Dict[str, List[Dict[str, float]]], reference: str, keys: Sequence[str]
) -> Dict[str, Dict[str, dict]]:
    """Per-seed differences ``run - reference`` of each metric, paired by ``"seed"`` where both are finite.

    For each other run and key: ``{"seeds", "diffs", "mean", "std", "wins", "losses", "ties", "n"}``.
    ``ValueError`` for an unknown ``reference`` or a repeated seed.
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
    """``{"mean", "lo", "hi", "std", "n"}``: ``mean -/+ t_{(1 + confidence) / 2, n - 1} * std / sqrt(n)``
    over paired differences; NaN bounds below two values.
    """
    from scipy import stats

    st = mean_std(diffs)
    half = (
        float(stats.t.ppf((1 + confidence) / 2, st["n"] - 1)) * st["std"] / st["n"] ** 0.5
        if st["n"] > 1
        else float("nan")
    )
    return {"mean": st["mean"], "lo": st["mean"] - half, "hi": st["mean"] + half, "std": st["std"], "n": st["n"]}
