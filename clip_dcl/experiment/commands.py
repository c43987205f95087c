"""A loss's full ``--loss ...`` flags, written out from the loss registry: a benchmark that caches its runs
by their flags writes every setting, so that a cached run keeps its meaning when a package default changes.
"""

from __future__ import annotations

from typing import Dict

from ..arguments import flag_words


def loss_defaults(name: str) -> Dict[str, object]:
    """``{kwarg: default}`` of a registered loss's flags (the class's ``defaults()``)."""
    from ..losses import LOSSES

    cls = LOSSES[name]
    defaults = cls.defaults()
    return {f.kwarg: defaults[f.kwarg] for f in cls.flags if f.kwarg in defaults}


def defaults_of(flags) -> Dict[str, object]:
    """The package defaults of the loss that ``flags`` name with ``--loss`` (``clip`` when none)."""
    flags = list(flags)
    name = flags[flags.index("--loss") + 1] if "--loss" in flags[:-1] else "clip"
    return loss_defaults(name)


def loss_flags(name: str, **settings) -> tuple:
    """``--loss NAME`` and every flag of the loss's table with its value, the package default unless given in
    ``settings``; ``None`` values, ``num_samples`` (the data's) and settings the configuration does not read
    are left out. ``ValueError`` for a setting that is not a flag of the loss.
    """
    from ..losses import LOSSES

    cls = LOSSES[name]
    unknown = set(settings) - {f.kwarg for f in cls.flags}
    if unknown:
        raise ValueError(f"{sorted(unknown)} are not flags of --loss {name}")
    values = cls.settings_in_effect({**loss_defaults(name), **settings})
    chosen = {}
    for flag in cls.flags:
        value = values.get(flag.kwarg)
        if value is None or flag.kwarg == "num_samples" or not cls.reads_setting(flag.kwarg, values):
            continue
        chosen[flag.flag] = bool(value) if flag.boolean else value
    return ("--loss", name, *flag_words(chosen, negate=True))
