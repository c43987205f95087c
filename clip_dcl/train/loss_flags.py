"""The loss flags as command-line words: which loss owns each flag, the words that set a loss's keyword
argument, and the table of every loss's flags that docs/training.md holds (all from the loss registry)."""

from __future__ import annotations

from typing import Dict, List

from clip_dcl.arguments import flag_words


def flag_owners() -> Dict[str, tuple]:
    """Our loss flags' ``dest`` -> (the loss it belongs to, that loss's keyword argument), from each registered
    loss's ``flags``."""
    from clip_dcl.losses import LOSSES

    out = {}
    for name, cls in LOSSES.items():
        for flag in cls.flags:
            if flag.dest in out and out[flag.dest][0] != name:
                raise ValueError(f"{flag.flag} is declared by the losses {out[flag.dest][0]!r} and {name!r}")
            out[flag.dest] = (name, flag.kwarg)
    return out


#: Keyword arguments that OpenCLIP's flags give every loss whose signature takes them.
OPENCLIP_LOSS_FLAGS = {"accum_freq": "--accum-freq", "seed": "--seed"}
_DIST_KWARGS = {
    "rank",
    "world_size",
    "local_loss",
    "gather_with_grad",
    "cache_labels",
    "use_horovod",
    "no_grad_gather",
    "device",
}


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _words(flag: str, value) -> List[str]:
    """The command-line words that give ``flag`` the value ``value``, as a message quotes them back (floats as
    ``:g`` writes them, an unset value as ``None``)."""
    if value is None:
        return [flag, "None"]
    return flag_words({flag: value}, negate=True, floats="g")


def loss_command(loss: str, loss_args: Dict[str, object]) -> List[str]:
    """The command-line words that select ``loss`` with ``loss_args`` (values at their default left out)."""
    words = ["--loss", loss]
    defaults = _loss_defaults().get(loss, {})
    for dest, (owner, kwarg) in flag_owners().items():
        if owner == loss and kwarg in loss_args and loss_args[kwarg] != defaults.get(kwarg, object()):
            words += _words(_flag(dest), loss_args[kwarg])
    for flag in _shared_flags():  # every loss's (--loss-tile): given only when set
        if loss_args.get(flag.kwarg):
            words += _words(_flag(flag.dest), loss_args[flag.kwarg])
    return words


def _shared_flags() -> tuple:
    from clip_dcl.losses.base import LossDeclaration

    return LossDeclaration.shared_flags


def setting_words(loss: str, kwarg: str, value) -> List[str]:
    """The command-line words that give ``loss``'s keyword argument ``kwarg`` the value ``value``."""
    for dest, (owner, name) in flag_owners().items():
        if owner == loss and name == kwarg:
            return _words(_flag(dest), value)
    for flag in _shared_flags():
        if flag.kwarg == kwarg:
            return _words(_flag(flag.dest), value)
    if kwarg in OPENCLIP_LOSS_FLAGS:
        return _words(OPENCLIP_LOSS_FLAGS[kwarg], value)
    return [f"{kwarg}={value!r}"]  # a keyword argument no flag sets (a loss used from Python)


def _loss_defaults() -> Dict[str, Dict[str, object]]:
    """``{loss name: {kwarg: default}}`` read from the loss classes' signatures (for --help)."""
    from clip_dcl.losses import LOSSES

    return {name: cls.defaults() for name, cls in LOSSES.items()}


def _default_text(value) -> str:
    if value is None:
        return "(see meaning)"
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"`{value}`" if isinstance(value, str) else repr(value)


def loss_flags_table() -> str:
    """Markdown rows ``| flag | loss | meaning | default |`` of every registered loss's flags, from
    the registry (the flag's help, the default of the class's signature): docs/training.md holds
    this table verbatim, and a test keeps the two equal."""
    from clip_dcl.losses import LOSSES

    defaults = _loss_defaults()
    rows = []
    shared = [("every", flag) for flag in _shared_flags()]
    for name, flag in shared + [(name, flag) for name, cls in LOSSES.items() for flag in cls.flags]:
        spelled = (
            f"`{flag.flag}` / `--no-{flag.flag[2:]}`"
            if flag.boolean
            else (f"`{flag.flag} {{{','.join(map(str, flag.choices))}}}`" if flag.choices else f"`{flag.flag}`")
        )
        meaning = flag.help.replace("|", "\\|")
        rows.append(
            f"| {spelled} | {name} | {meaning} | "
            f"{flag.default_text or _default_text(defaults.get(name, {}).get(flag.kwarg))} |"
        )
    return "\n".join(rows)
