"""clip-dcl's training flags, parsed beside OpenCLIP's and validated before any work starts.

Ours are taken out by a parser with ``allow_abbrev=False`` (else OpenCLIP's ``--model tiny`` would be read as
``--model-config tiny``); the rest is parsed by OpenCLIP's ``parse_args`` here, so that a bad OpenCLIP flag also
fails before anything starts; the loss's values are validated by building it once on ``meta``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional

from ..errors import FlagError
from ..exitcodes import INTERRUPTED, PREEMPTED
from .divergence import DEFAULT_MAX_NONFINITE_STEPS
from .flag_checks import (
    _openclip_objective,
    check_data_paths,
    check_global_batch,
    check_optimizer_values,
    check_output_paths,
    check_packed_flags,
    check_ranks_against_devices,
    check_words,
    check_worker_batches,
    csv_data_flags,
    first_bad_value,
    shard_folders_as_patterns,
)
from .loss_flags import _DIST_KWARGS, OPENCLIP_LOSS_FLAGS, _flag, _loss_defaults, flag_owners
from .signals import DEFAULT_SIGNALS, PreemptConfig, signal_number

if TYPE_CHECKING:
    from clip_dcl.losses.base import DataFacts

#: How the training command is named in its usage and errors when run as ``python -m clip_dcl.train``
#: (or under torchrun); ``clip-dcl train`` names itself so.
PROG = "python -m clip_dcl.train"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The parser of clip-dcl's own training flags; ``--loss`` and the loss flags come from the registry
    (``clip_dcl.losses.LOSSES``), their defaults from the classes' signatures."""
    from clip_dcl.arguments import FlagParser
    from clip_dcl.losses import LOSSES
    from clip_dcl.losses.base import LossDeclaration

    registered = tuple(LOSSES)  # the package's objectives first (registered on import), then any other
    described = "; ".join(f"{n} = {LOSSES[n].summary or LOSSES[n].__name__}" for n in registered)
    default = next((n for n in registered if openclip_native(n)), registered[0])
    multi = ", ".join(n for n in registered if LOSSES[n].supports_captions_per_image)
    about = {  # each flag's --help
        "--loss": f"training objective: {described}; or any other loss registered in clip_dcl.losses.LOSSES "
        f"before this parser is built (default: {default})",
        "--captions-per-image": "captions drawn per training image from the json 'captions' list (or the .txt "
        "lines), repeated in order when an image has fewer; the model encodes B x M texts and the loss takes "
        f"them as M positives of each image (webdataset shards; --loss {multi}) (default: 1)",
        "--strict": "refuse the first training sample a reader would skip (an empty caption, a missing or "
        "undecodable image, a truncated shard), naming it, instead of skipping and counting it",
        "--no-grad-gather": "gather the features without autograd and exchange two numbers per anchor: exact "
        "gradients with no backward collective (needs --local-loss, replaces --gather-with-grad; not with --loss "
        "curl, --hcl-beta > 0, --dcl-temperature or --captions-per-image > 1)",
        "--loss-reset": "with --resume: resume a checkpoint of another --loss, another setting its loss state "
        "depends on, or another number of sample ids; the saved loss state is dropped, the model and optimizer kept",
        "--decl-grow-state": "with --resume and --loss decl --decl-rate index, when the training data grew since "
        "the checkpoint: keep the learned rates of its ids and start the new ids unvisited",
        "--model-config": "a model config JSON (or a folder of them) to register with OpenCLIP; the model name is "
        "the file name without .json, and --model defaults to it",
        "--preempt-signals": "signals on which every rank finishes its step, saves a checkpoint there and exits "
        f"with code {PREEMPTED} (the first Ctrl-C during training steps: the same, code {INTERRUPTED}); "
        f"'none': no handler (default: {' '.join(DEFAULT_SIGNALS)})",
        "--preempt-check-every": "look for a signal (and the --save-every-minutes clock) every N optimizer steps, "
        "one small all-reduce each with several ranks (default: 1)",
        "--save-every-minutes": "also save a mid-epoch checkpoint every M minutes (rank 0's clock), at a step "
        "boundary (default: only at epoch ends and on a signal)",
        "--max-nonfinite-steps": "stop the run (exit code 1) after N consecutive optimizer steps whose loss is NaN "
        "or inf, or at an epoch end or a save whose weights are, without writing them; 0: never stop on a "
        f"non-finite loss (default: {DEFAULT_MAX_NONFINITE_STEPS})",
        "--dist-timeout": "seconds a collective waits for the other ranks before this rank fails, so that a rank "
        "that died or hangs ends the others (init_process_group's timeout; default: torch's)",
        "--init-logit-scale": "the model's learned logit scale starts at S (a temperature of 1/S); the loss's own "
        "fixed temperatures are unaffected (default: the model's, 1/0.07 for CLIP models)",
        "--adamw-impl": "PyTorch's AdamW kernel for OpenCLIP's --opt adamw: the same update in fewer, larger "
        "operations (default: PyTorch's choice: for-loop on CPU, foreach on CUDA)",
    }

    def add(group, flag: str, **kwargs) -> None:
        group.add_argument(flag, help=about[flag], **kwargs)

    parser = FlagParser(
        prog=prog,
        add_help=False,
        allow_abbrev=False,
        description="OpenCLIP's training (open_clip_train.main) with a choice of objective. "
        "Every OpenCLIP flag works as in OpenCLIP; clip-dcl adds these:",
    )
    g = parser.add_argument_group("clip-dcl objective")
    add(g, "--loss", choices=registered, default=default)
    add(g, "--captions-per-image", type=int, default=1, metavar="M")
    defaults = _loss_defaults()
    for name in registered:
        own = defaults.get(name, {})
        for flag in LOSSES[name].flags:
            shown = "" if own.get(flag.kwarg) is None else f" (default: {own[flag.kwarg]})"
            if flag.kwarg not in own and flag.default_text:  # resolved by the loss
                shown = f" (default: {flag.default_text.replace('`', '')})"
            kwargs = dict(help=f"{name}: {flag.help}{shown}")
            if flag.boolean:
                kwargs["action"] = argparse.BooleanOptionalAction
            elif flag.choices is not None:
                kwargs["choices"] = flag.choices
            else:
                kwargs.update(type=flag.type, metavar=flag.metavar or None)
            g.add_argument(flag.flag, **kwargs)
    for flag in LossDeclaration.shared_flags:  # every loss's: declared once, on the base
        shown = f" (default: {flag.default_text})" if flag.default_text else ""
        g.add_argument(flag.flag, type=flag.type, metavar=flag.metavar, help=f"every loss: {flag.help}{shown}")
    for switch in ("--strict", "--no-grad-gather", "--loss-reset", "--decl-grow-state"):
        add(g, switch, action="store_true")
    add(g, "--model-config", metavar="PATH")
    g = parser.add_argument_group("preemption")
    add(g, "--preempt-signals", nargs="+", metavar="SIG")
    add(g, "--preempt-check-every", type=int, default=1, metavar="N")
    add(g, "--save-every-minutes", type=float, metavar="M")
    g = parser.add_argument_group("failures")
    add(g, "--max-nonfinite-steps", type=int, default=DEFAULT_MAX_NONFINITE_STEPS, metavar="N")
    add(g, "--dist-timeout", type=float, metavar="SECONDS")
    add(parser.add_argument_group("model"), "--init-logit-scale", type=float, metavar="S")
    add(parser.add_argument_group("speed"), "--adamw-impl", choices=("foreach", "fused"))  # torch AdamW's keyword
    return parser


@dataclass
class TrainConfig:
    """Everything the training run needs beyond OpenCLIP's own arguments; a field without a comment holds the
    flag of its name (``grow_state``: ``--decl-grow-state``; ``preempt``: the preemption group)."""

    loss: str
    #: what the command line gives the loss: its flags' values, and OpenCLIP's flags that its signature
    #: takes (``OPENCLIP_LOSS_FLAGS``); the input of the loss's ``resolve_data_params``
    loss_kwargs: Dict[str, object]
    #: ``loss_kwargs`` resolved from the data known before it is loaded and completed with the loss's
    #: defaults; resolved again, with the data's batches per epoch, when the loss is built (the values
    #: recorded in params.txt and checkpoints)
    loss_args: Dict[str, object]
    #: OpenCLIP's command line (ours removed; ``--model NAME`` added for ``--model-config``)
    openclip_argv: List[str] = field(default_factory=list)
    model_config: Optional[str] = None
    #: the range ``[0, num_samples)`` of the sample ids, for a loss that needs them (None otherwise)
    num_samples: Optional[int] = None
    #: what the training data tells the loss, as known before the data is loaded (see ``clip_dcl.train.facts``)
    data: Optional["DataFacts"] = None
    no_grad_gather: bool = False
    loss_reset: bool = False
    grow_state: bool = False
    #: ids per source of ``::``-joined ``--train-data`` (None for one source; see clip_dcl.train.ids)
    id_block: Optional[int] = None
    captions_per_image: int = 1
    preempt: PreemptConfig = field(default_factory=PreemptConfig)
    max_nonfinite_steps: int = DEFAULT_MAX_NONFINITE_STEPS
    dist_timeout: Optional[float] = None
    adamw_impl: Optional[str] = None
    init_logit_scale: Optional[float] = None
    strict: bool = False


def same_named(obj, names: Iterable[str]) -> Dict[str, object]:
    """``obj``'s attributes ``names`` as keyword arguments: for a call whose keywords are named as the flags."""
    return {name: getattr(obj, name) for name in names}


def _preempt_config(ours) -> PreemptConfig:
    """The preemption group's flags, each signal name checked."""
    names = list(DEFAULT_SIGNALS if ours.preempt_signals is None else ours.preempt_signals)
    if [n.lower() for n in names] == ["none"]:
        names = []
    for name in names:
        try:
            signal_number(name)
        except ValueError as e:
            raise FlagError(f"--preempt-signals {name}: {e}") from None
    return PreemptConfig(
        signals=names, check_every=ours.preempt_check_every, save_every_minutes=ours.save_every_minutes
    )


def print_help(parser: argparse.ArgumentParser) -> None:
    """Our flags, then OpenCLIP's own ``--help``."""
    from open_clip_train.params import parse_args as openclip_parse_args

    print(parser.format_help() + "\nOpenCLIP's flags (open_clip_train.main), all accepted:\n", flush=True)
    with program_named(parser.prog), contextlib.suppress(SystemExit):
        openclip_parse_args(["--help"])


@contextlib.contextmanager
def program_named(prog: str):
    """``sys.argv[0]`` set to ``prog`` inside: OpenCLIP's parser names ``argv[0]`` in its usage and
    errors, which would otherwise read ``__main__.py`` or ``cli.py``."""
    argv0 = sys.argv[:1]
    sys.argv[:1] = [prog]
    try:
        yield
    finally:
        sys.argv[:1] = argv0


def _explain(err: Exception, loss: str, kwargs: Dict[str, object]) -> str:
    """The loss's own message, plus the flags that set the arguments it names."""
    msg = str(err)
    # a keyword argument named in the message, not a word of a flag the message names itself (``--decl-rate``)
    flags = [
        _flag(dest)
        for dest, (owner, kwarg) in flag_owners().items()
        if owner == loss and re.search(rf"(?<![-\w]){kwarg}\b", msg)
    ]
    flags += [flag for kwarg, flag in OPENCLIP_LOSS_FLAGS.items() if re.search(rf"\b{kwarg}\b", msg)]
    where = f" (set by {', '.join(flags)})" if flags else ""
    return f"--loss {loss}: {msg}{where}"


def full_loss_args(loss: str, kwargs: Dict[str, object]) -> Dict[str, object]:
    """``kwargs`` completed with the defaults of the loss class's signature, and every loss's shared flags
    (``--loss-tile``) where given: recorded so that a run says what it ran with (a tile never changes the math,
    so no resume compares it)."""
    from clip_dcl.losses import LOSSES
    from clip_dcl.losses.base import LossDeclaration

    out = {k: kwargs.get(k, v) for k, v in LOSSES[loss].defaults().items() if k not in _DIST_KWARGS}
    for flag in LossDeclaration.shared_flags:
        if kwargs.get(flag.kwarg) is not None:
            out[flag.kwarg] = kwargs[flag.kwarg]
    return out


def _check_no_grad_gather(oc_args) -> None:
    if not oc_args.local_loss:
        raise FlagError(
            "--no-grad-gather needs --local-loss (each rank scores its own anchors against the gathered features)"
        )
    if oc_args.gather_with_grad:
        raise FlagError(
            "--no-grad-gather replaces --gather-with-grad (the same exact gradients without the "
            "backward collective): drop one of them"
        )
    why = _openclip_objective(oc_args)
    if why:
        raise FlagError(f"--no-grad-gather cannot be combined with {why}: that objective is OpenCLIP's own")


def _require_data(oc_args) -> None:
    """OpenCLIP's main asserts this only after building the model; fail before any work instead."""
    if not (
        oc_args.train_data
        or oc_args.dataset_type == "synthetic"
        or oc_args.val_data
        or oc_args.imagenet_val
        or oc_args.imagenet_v2
    ):
        raise FlagError(
            "nothing to train or evaluate: give --train-data (or --val-data / --imagenet-val to evaluate only)"
        )


def _loss_kwargs_given(ours) -> Dict[str, object]:
    """The loss flags given, as the loss's keyword arguments; :class:`FlagError` for one of another loss."""
    owners = flag_owners()
    given = {dest: getattr(ours, dest) for dest in owners if getattr(ours, dest, None) is not None}
    foreign = [dest for dest in given if owners[dest][0] != ours.loss]
    if foreign:
        losses = " / ".join(sorted({owners[dest][0] for dest in foreign}))
        verb = "applies" if len(foreign) == 1 else "apply"
        raise FlagError(f"{', '.join(map(_flag, foreign))} only {verb} to --loss {losses}, not --loss {ours.loss}")
    return {owners[dest][1]: value for dest, value in given.items()}


def check_flag_words(argv: List[str], prog: str = PROG) -> None:
    """The checks of a training command line that need neither its data nor this machine (both parsers', and
    no loss flag of another loss than ``--loss``): `FlagError`, or ``SystemExit`` once argparse printed why."""
    from open_clip_train.params import parse_args as openclip_parse_args

    parser, ours, rest = _parse_ours(argv, prog)
    with program_named(prog):
        openclip_parse_args(list(rest))
    _loss_kwargs_given(ours)


def _parse_ours(argv: List[str], prog: str):
    """``(our parser, our flags, the words left for OpenCLIP)``, once every word is a flag spelled out in full."""
    from .compat import openclip_parser

    parser = build_parser(prog)
    check_words(argv, [parser, openclip_parser()])
    with program_named(prog):
        ours, rest = parser.parse_known_args(argv)
    return parser, ours, rest


def parse_train_args(argv: List[str], check_files: bool = True, prog: str = PROG) -> Optional[TrainConfig]:
    """Parse and validate a training command line (`FlagError`, or ``SystemExit`` once argparse printed why);
    ``None`` when ``--help`` was printed. Registers clip-dcl's model configs with OpenCLIP in this process.
    ``check_files=False`` skips the checks of the data's files and of this machine (a command for another one)."""
    parser, ours, rest = _parse_ours(argv, prog)
    if "-h" in rest or "--help" in rest:
        print_help(parser)
        return None

    from open_clip_train.params import parse_args as openclip_parse_args

    from clip_dcl.losses import LOSSES, resolve_loss_args
    from clip_dcl.losses.base import LossDeclaration
    from clip_dcl.models import model_name_problem, register_builtin_configs, register_model_config

    from .facts import data_facts
    from .precision import _is_first_rank, settle_machine_flags

    register_builtin_configs()
    if ours.model_config is not None:
        try:
            name = register_model_config(ours.model_config)
        except ValueError as e:
            raise FlagError(f"--model-config: {e}") from None
        if not any(a == "--model" or a.startswith("--model=") for a in rest):
            rest = rest + ["--model", name]
    folders = []
    if check_files:  # a folder of shards is read as the pattern of its .tar files
        rest, folders = shard_folders_as_patterns(rest)
        rest = csv_data_flags(rest)  # the separator and columns evaluation reads, where not given
    machine_notes = io.StringIO()  # printed once every check has passed, so that a refused run prints one line
    with program_named(prog):
        rest = settle_machine_flags(rest, this_machine=check_files, log=machine_notes)  # loggers; fp32 on a CPU
        oc_args = openclip_parse_args(list(rest))
    problem = model_name_problem(oc_args.model) if check_files or not oc_args.model.startswith("local-dir:") else None
    if problem:
        raise FlagError(f"--model {problem}")
    check_optimizer_values(oc_args)
    if check_files:
        check_data_paths(oc_args)
        check_output_paths(oc_args)
    check_packed_flags(oc_args)

    loss = ours.loss
    kwargs = _loss_kwargs_given(ours)
    own = _openclip_objective(oc_args, coca=False)  # CoCa takes our term
    if own and not openclip_native(loss):
        native = " / ".join(f"--loss {n}" for n in LOSSES if openclip_native(n))
        raise FlagError(f"--loss {loss} cannot be combined with {own}: that objective is OpenCLIP's own; use {native}")
    bad = first_bad_value(
        ("--captions-per-image", ours.captions_per_image, lambda v: v >= 1, ">= 1"),
        ("--preempt-check-every", ours.preempt_check_every, lambda v: v >= 1, ">= 1"),
        ("--save-every-minutes", ours.save_every_minutes, lambda v: v > 0, "> 0"),
        ("--max-nonfinite-steps", ours.max_nonfinite_steps, lambda v: v >= 0, ">= 0 (0: never stop)"),
        ("--dist-timeout", ours.dist_timeout, lambda v: v > 0, "a number of seconds > 0"),
        ("--init-logit-scale", ours.init_logit_scale, lambda v: v > 0, "a number > 0"),
    )
    if bad:
        raise FlagError(f"{bad[0]} must be {bad[2]}, got {bad[1]:g}")
    preempt = _preempt_config(ours)
    _check_captions_per_image(ours, oc_args, loss)
    if ours.adamw_impl and getattr(oc_args, "opt", "adamw").lower() != "adamw":
        raise FlagError(f"--adamw-impl {ours.adamw_impl} applies to --opt adamw, not --opt {oc_args.opt}")
    if ours.no_grad_gather:
        _check_no_grad_gather(oc_args)
    shared = {f.kwarg: getattr(ours, f.dest) for f in LossDeclaration.shared_flags if getattr(ours, f.dest) is not None}
    if shared.get("tile") and own:
        raise FlagError(f"--loss-tile applies to the contrastive losses, not to the objective of {own}")
    kwargs.update(shared)
    takes = LOSSES[loss].defaults()
    kwargs.update({kwarg: getattr(oc_args, kwarg) for kwarg in OPENCLIP_LOSS_FLAGS if kwarg in takes})
    data = data_facts(oc_args)
    try:
        resolved = resolve_loss_args(loss, kwargs, data)
    except ValueError as e:
        raise FlagError(_explain(e, loss, kwargs)) from None
    full_args = full_loss_args(loss, resolved)
    notice = LOSSES[loss].start_notice(full_args) if data.training else None
    probe = None
    if not openclip_native(loss) or ours.no_grad_gather:  # OpenCLIP checks its own loss's arguments
        probe = create_loss_checked(loss, resolved, oc_args, no_grad_gather=ours.no_grad_gather)
    _require_data(oc_args)
    if check_files:
        local = os.environ.get("LOCAL_WORLD_SIZE")
        if local and local.isdigit():  # torchrun's ranks on this node
            check_ranks_against_devices(int(local), oc_args.device)
    if check_files and data.training:  # the ranks are this machine's launcher's
        check_global_batch(oc_args)
        check_worker_batches(oc_args)
    num_samples = id_block = None
    per_sample = probe is not None and getattr(probe, "requires_sample_ids", False)
    if per_sample and data.training:
        num_samples = int(probe.num_samples)
        if data.num_sources > 1:  # each source owns a block of the ids (clip_dcl.train.ids)
            id_block = num_samples // data.num_sources
    if ours.decl_grow_state:
        if not oc_args.resume:
            raise FlagError(
                "--decl-grow-state widens the per-sample state of the checkpoint being resumed: give --resume"
            )
        if not per_sample:
            raise FlagError(
                f"--decl-grow-state applies to a loss with per-sample state (--loss decl --decl-rate "
                f"index), not --loss {loss}" + (f" --decl-rate {resolved.get('rate')}" if loss == "decl" else "")
            )
        if ours.loss_reset:
            raise FlagError("--decl-grow-state keeps the saved rates and --loss-reset drops them: give one of them")
    sys.stderr.write(machine_notes.getvalue())
    if check_files and _is_first_rank():  # once every check has passed: a refused run prints one line
        for flag, folder, pattern in folders:
            print(f"clip-dcl train: {flag} {folder} is a folder: reading its shards {pattern}", file=sys.stderr)
        if notice:
            print(f"clip-dcl train: {notice}", file=sys.stderr)
    same = ("loss", "model_config", "no_grad_gather", "loss_reset", "captions_per_image", "strict")
    same += ("max_nonfinite_steps", "dist_timeout", "adamw_impl", "init_logit_scale")
    return TrainConfig(
        loss_kwargs=kwargs,
        loss_args=full_args,
        openclip_argv=list(rest),
        num_samples=num_samples,
        data=data,
        grow_state=ours.decl_grow_state,
        id_block=id_block,
        preempt=preempt,
        **same_named(ours, same),
    )


def openclip_native(loss: str) -> bool:
    """Whether ``loss`` is OpenCLIP's own objective, which OpenCLIP's ``create_loss(args)`` builds."""
    from clip_dcl.losses import LOSSES

    return bool(LOSSES[loss].openclip_native)


def create_loss_checked(loss: str, kwargs: Dict[str, object], oc_args, no_grad_gather: bool = False):
    """Build the loss once with ``world_size=1`` (on ``meta`` when it allocates: no buffer holds values) so it
    checks its arguments; `FlagError` naming the flag that set a rejected one."""
    from clip_dcl.losses import LOSSES, create_loss

    try:
        extra = {"device": "meta"} if "device" in LOSSES[loss].defaults() else {}
        if no_grad_gather:
            extra.update(no_grad_gather=True, local_loss=True, gather_with_grad=False)
        else:
            extra.update(local_loss=oc_args.local_loss, gather_with_grad=oc_args.gather_with_grad)
        probe = create_loss(loss, rank=0, world_size=1, **kwargs, **extra)
    except (ValueError, TypeError) as e:
        msg = _explain(e, loss, kwargs)
        if no_grad_gather and "no_grad_gather" in str(e):
            msg += " (set by --no-grad-gather)"
        raise FlagError(msg) from None
    return probe


def _check_captions_per_image(ours, oc_args, loss: str) -> None:
    """``--captions-per-image`` above 1 only where the pipeline and the loss take it."""
    m = ours.captions_per_image
    if m == 1:
        return
    from clip_dcl.losses import LOSSES

    from .facts import train_data_kind

    if not LOSSES[loss].supports_captions_per_image:
        raise FlagError(f"--captions-per-image {m}: --loss {loss} takes one caption per image")
    if ours.no_grad_gather:
        raise FlagError(
            f"--captions-per-image {m} cannot be combined with --no-grad-gather: with M positives the "
            "column gradient needs more than each anchor's (pos, lse_neg); use --gather-with-grad"
        )
    why = _openclip_objective(oc_args, horovod=False)
    if why:
        raise FlagError(f"--captions-per-image {m} cannot be combined with {why}")
    if oc_args.train_data and train_data_kind(oc_args) != "webdataset":
        raise FlagError(
            f"--captions-per-image {m} reads the captions from webdataset shards (json 'captions' or "
            f".txt lines), but --dataset-type is {oc_args.dataset_type!r} for --train-data "
            f"{oc_args.train_data!r}"
        )
