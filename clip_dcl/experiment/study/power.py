"""A plan's power, as ``clip-dcl study check`` and the report give it: from a paired spread, the seeds each
comparison needs (one look), and the power its own seeds give."""

from __future__ import annotations

import json
from pathlib import Path

from ..stats import t_interval
from .plan import Plan, PlanError
from .rule import power, seeds_needed


def spread_of(plan: Plan, c) -> tuple:
    """``(sd, where)`` of comparison ``c``'s paired differences: its own, the plan's, or the earlier study's
    (its test split's differences of the same comparison, else its validation split's)."""
    if c.paired_sd is not None:
        return c.paired_sd, "the comparison's paired_sd"
    if plan.paired_sd is not None:
        return plan.paired_sd, "the plan's paired_sd"
    if plan.spread_from:
        path = Path(plan.spread_from)
        if not path.is_absolute() and plan.source:
            path = Path(plan.source).parent / path
        if not path.is_file():
            raise PlanError(f"{plan.source}: spread_from = {plan.spread_from!r}: no such file ({path})")
        doc = json.loads(path.read_text())
        for row in doc.get("comparisons", []):
            if (row["a"], row["b"]) == (c.a, c.b):
                test = row.get("final") or (row["looks"][-1] if row.get("looks") else None)
                if test and test["n"] >= 2:
                    return t_interval(test["diffs"])["std"], f"{path.name}, test split, {test['n']} seeds"
        for row in doc.get("validation", []):
            if row.get("label", "").split(" ")[::2] == [c.a, c.b] and row["n"] >= 2:
                return t_interval(row["diffs"])["std"], f"{path.name}, validation split, {row['n']} seeds"
        return None, f"{path.name} has no paired differences of {c.a} - {c.b}"
    return None, "no paired spread given (paired_sd or spread_from)"


def planned_power(plan: Plan, c) -> dict:
    """Comparison ``c``'s planned power: ``{"n", "sd", "where", "expected", "need", "power", "target", "short"}``
    (``short``: fewer seeds than it needs, `check`'s TOO FEW SEEDS), or ``{"unchecked": why}``."""
    sd, where = spread_of(plan, c)
    if sd is None:
        return {"unchecked": where}
    if c.rule == "beats" and c.expected is None:
        return {"unchecked": "give the comparison's expected difference (beats)"}
    if c.margin is None and c.rule != "beats":
        return {"unchecked": "its margin comes from the runs (margin_gain)"}
    expected = c.expected or 0.0
    need = seeds_needed(c.rule, sd, plan.confidence, plan.power, expected=expected, margin=c.margin)
    n = len(plan.comparison_seeds(c))
    have = power(c.rule, n, sd, plan.confidence, expected=expected, margin=c.margin)
    return {
        "n": n,
        "sd": sd,
        "where": where,
        "expected": expected,
        "need": need,
        "power": have,
        "target": plan.power,
        "short": not (need is not None and need <= n),
    }
