"""A loss's full ``--loss ...`` flags, written out from the loss registry.

A benchmark that caches its runs by their flags must write every setting out, not only those
that differ from the defaults: otherwise a cached run would silently change meaning when a
package default changes. :func:`loss_flags` reads each registered loss's flag table
(:class:`clip_dcl.losses.base.LossFlag`) and its class signature for the defaults.
"""
from __future__ import annotations

import inspect
from typing import Dict


def loss_defaults(name: str) -> Dict[str, object]:
    """``{kwarg: default}`` of a registered loss's flags, read from its class signature."""
    from ..losses import LOSSES

    cls = LOSSES[name]
    params = inspect.signature(cls).parameters
    return {f.kwarg: params[f.kwarg].default for f in cls.flags if f.kwarg in params}


def defaults_of(flags) -> Dict[str, object]:
    """The package defaults of the loss that ``flags`` (a training command's) name with ``--loss``
    (``clip`` when none is named)."""
    flags = list(flags)
    name = flags[flags.index("--loss") + 1] if "--loss" in flags[:-1] else "clip"
    return loss_defaults(name)


def loss_flags(name: str, **settings) -> tuple:
    """``--loss NAME`` and every flag of the loss's table with its value: the package default unless
    given in ``settings`` (so a cached run keeps its meaning when a default changes). ``None`` values
    and flags of another rate are left out.

    Raises:
        ValueError: a setting that is not a flag of the loss.
    """
    from ..losses import LOSSES

    values = {**loss_defaults(name), **settings}
    if name == "decl" and values.get("include_current") is None:  # the loss's own resolution of None
        values["include_current"] = values.get("rate") == "index"
    unknown = set(settings) - {f.kwarg for f in LOSSES[name].flags}
    if unknown:
        raise ValueError(f"{sorted(unknown)} are not flags of --loss {name}")
    out = ["--loss", name]
    for flag in LOSSES[name].flags:
        value = values.get(flag.kwarg)
        if value is None or flag.kwarg in ("num_samples",):
            continue
        if name == "decl" and not _decl_reads(flag.kwarg, values):
            continue
        if flag.boolean:
            out.append(flag.flag if value else "--no-" + flag.flag[2:])
        else:
            out += [flag.flag, str(value)]
    return tuple(out)


def _decl_reads(kwarg: str, values: Dict[str, object]) -> bool:
    """Whether a DeCL setting is read under ``values`` (the loss refuses some of them otherwise)."""
    rate = values.get("rate")
    if kwarg in ("gamma", "gamma_schedule", "first_visit", "drift_correction", "state", "state_dtype"):
        return rate == "index"
    if kwarg == "include_current":
        return rate != "batch"
    if kwarg == "queue_size":
        return rate == "queue"
    if kwarg == "lam":
        return values.get("schedule") in ("constant", "harmonic")
    if kwarg == "temperature":
        return values.get("temperature_mode") == "fixed"
    if kwarg == "rho":
        return values.get("temperature_mode") == "rgclg"
    return True
