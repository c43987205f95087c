"""What every clip-dcl loss shares: its declaration (flags, data-dependent parameters), the call
contract, the `StatefulLoss` contract of a loss that keeps state, and small numeric helpers.
"""

from __future__ import annotations

import abc
import inspect
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from open_clip.loss import gather_features

from .gather import PairStats, anchor_stats, column_surrogate
from .state import plain_sums, state_digest, table_sums
from .tiled import check_tile, parse_tile, resolve_tile


@dataclass(frozen=True)
class LossFlag:
    """One command-line flag of a loss, declared on its class; its default is that of the keyword ``kwarg``."""

    flag: str  #: e.g. ``"--tau-plus"``
    #: the loss's keyword argument it sets, or a key that the loss's ``resolve_data_params`` turns into them
    kwarg: str
    help: str
    type: Optional[object] = None  #: a callable converting the string (None with ``choices`` or ``boolean``)
    choices: Optional[tuple] = None
    boolean: bool = False  #: ``--x`` / ``--no-x``
    metavar: Optional[str] = None
    #: how the docs state a default the signature cannot (``None`` resolved by the loss)
    default_text: Optional[str] = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


class DataSizeUnknown(ValueError):
    """The training data cannot tell its size: ``reason`` says why, ``remedy`` what would tell it (or None)."""

    def __init__(self, reason: str, remedy: Optional[str] = None):
        super().__init__(reason + (f"; {remedy}" if remedy else ""))
        self.reason, self.remedy = reason, remedy


def _size_unknown() -> Tuple[int, ...]:
    raise DataSizeUnknown("the size of the training data is not known")


@dataclass(frozen=True)
class DataFacts:
    """What the training data tells a loss about the parameters it leaves to the data; given to
    ``resolve_data_params`` when the flags are checked (``steps_per_epoch`` None) and when the loss is built."""

    epochs: int  #: ``--epochs``
    #: optimizer steps per epoch (the training data's batches per epoch / ``--accum-freq``); None
    #: while the flags are checked
    steps_per_epoch: Optional[int] = None
    #: False for a run that only evaluates: the loss is never built
    training: bool = True
    #: where the batches' sample ids come from: ``"keys"`` (webdataset ``__key__``), ``"rows"`` (a
    #: CSV's rows), ``"indices"`` (OpenCLIP's synthetic data); None when the batches carry none
    sample_ids: Optional[str] = None
    #: the training data as the command line names it, for messages
    description: str = ""
    #: ``::``-joined training sources (their sample ids are laid out in one block each)
    num_sources: int = 1
    #: ``() -> (total, per-source sizes)``, the per-source sizes 0 where unknown; raises
    #: `DataSizeUnknown` when the total is unknown
    sizes: Callable[[], Tuple[int, Tuple[int, ...]]] = field(default=_size_unknown, repr=False, compare=False)

    def num_samples(self) -> int:
        """The training data's size (the sum over its sources); raises `DataSizeUnknown`."""
        return self.sizes()[0]

    def source_sizes(self) -> Tuple[int, ...]:
        """The size of each ``::``-joined source, 0 where unknown; raises `DataSizeUnknown`."""
        return self.sizes()[1]


class SampleIdError(ValueError):
    """A sample id that cannot index a loss's per-sample state (negative, or ``>= num_samples``)."""


def check_choice(name: str, value, choices: tuple) -> None:
    """``ValueError`` unless ``value`` is one of ``choices``: the check of a loss's named options."""
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {choices}")


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(x))`` for ``x < 0``, accurate at both ends (Maechler 2012)."""
    return torch.where(x > -math.log(2.0), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def contrast_rows(pos: torch.Tensor, log_ng: torch.Tensor) -> torch.Tensor:
    """Mean of ``-l_iv + log(S_iv + Ng_i)`` over the anchors (and their M positives when ``pos`` is (n, M))."""
    if pos.dim() == 2:
        log_ng = log_ng[:, None]
    return (torch.logaddexp(pos, log_ng) - pos).mean()


#: ``--loss-tile``: every loss's column-tile width (`clip_dcl.losses.tiled`), a keyword of `ContrastiveLoss`
TILE_FLAG = LossFlag(
    "--loss-tile",
    "tile",
    type=parse_tile,
    metavar="N",
    help="compute the loss over column tiles of N logits per anchor, recomputed in backward, so that the "
    "G x G logit matrix is never held (memory linear in the batch, the same loss and gradients); 0: the "
    "whole matrix (with --loss clip, OpenCLIP's ClipLoss)",
    default_text="1024 on the CPU from a global batch of 4096 without --local-loss on several ranks, else 0",
)


class LossDeclaration:
    """What a registered loss class declares, read by the command line, the trainer and the checkpoints."""

    #: the loss's command-line flags (see `LossFlag`)
    flags: tuple = ()
    #: flags every registered loss takes, declared once here (their keywords go to `ContrastiveLoss`)
    shared_flags: tuple = (TILE_FLAG,)
    #: one line for ``--loss``'s help
    summary: str = ""
    #: whether ``forward`` needs ``sample_ids``; such a loss has ``num_samples``, the ids' range
    requires_sample_ids = False
    #: whether the loss takes ``M > 1`` captions per image (``text_features`` of ``B * M`` rows)
    supports_captions_per_image = False
    #: whether OpenCLIP's own ``create_loss(args)`` builds this objective
    openclip_native = False
    #: keyword arguments that give the loss's saved state its meaning: a checkpoint resumed with another
    #: value would have its state read as another quantity, so the trainer refuses it (`state_meaning`)
    state_settings: tuple = ()
    #: diagnostics of the last call, logged apart from the loss terms (an instance sets its own)
    metrics: Mapping[str, object] = MappingProxyType({})

    @classmethod
    def defaults(cls) -> Dict[str, object]:
        """``{keyword: default}`` of the class's constructor: the one place the defaults are read."""
        return {
            p.name: p.default
            for p in inspect.signature(cls).parameters.values()
            if p.default is not inspect.Parameter.empty and p.kind is not p.VAR_KEYWORD
        }

    @classmethod
    def from_args(cls, **kwargs):
        """The loss built from keyword arguments, or a sibling that computes the same objective in a mode it lacks."""
        return cls(**kwargs)

    @classmethod
    def resolve_data_params(cls, kwargs: Dict[str, object], data: DataFacts) -> Dict[str, object]:
        """The loss's keyword arguments (as given) completed from ``data``; a loss whose defaults depend on the
        data overrides it. With ``data.steps_per_epoch`` None (flags checked before the data loads) it must
        return arguments that pass its checks; flag combinations ``__init__`` cannot tell apart: ``ValueError``.
        """
        return dict(kwargs)

    @classmethod
    def settings_in_effect(cls, values: Dict[str, object]) -> Dict[str, object]:
        """``values`` with the ``None`` defaults the loss resolves itself replaced; as given here."""
        return dict(values)

    @classmethod
    def reads_setting(cls, kwarg: str, values: Dict[str, object]) -> bool:
        """Whether ``kwarg`` takes effect under the flags' values ``values``."""
        return True

    @classmethod
    def start_notice(cls, loss_args: Dict[str, object]) -> Optional[str]:
        """One line to show at the start of a run whose objective is not what its name says, or None."""
        return None

    @classmethod
    def state_meaning(cls, loss_args: Dict[str, object]) -> Dict[str, object]:
        """The values of `state_settings` that the state of ``loss_args`` depends on (unequal: not shared)."""
        return {k: loss_args[k] for k in cls.state_settings if k in loss_args}

    def epoch_warning(self, epoch_means: Dict[str, float]) -> Optional[str]:
        """One warning line on an epoch just trained, from each metric's epoch mean (rank 0's), or None."""
        return None

    def logged_metrics(self, metrics: Dict[str, object]) -> Dict[str, object]:
        """The part of ``metrics`` for the training log line; all of it here."""
        return metrics

    def step_note(self) -> str:
        """Words about the last call for the training log line (e.g. which term a schedule optimised)."""
        return ""

    def logged_loss(self, metrics: Dict[str, object]) -> Optional[torch.Tensor]:
        """The value logged as OpenCLIP's ``Loss`` when it should not be the total (None: the total), so that a
        loss whose total is not on InfoNCE's scale logs a value that compares."""
        return None


class ContrastiveLoss(LossDeclaration, nn.Module):
    """Base class: OpenCLIP's distributed arguments and the ``ClipLoss`` call contract. Subclasses implement
    `compute` returning ``(loss, metrics)``; ``metrics`` keeps the last call's detached scalars."""

    #: key of the loss term in the ``output_dict=True`` result
    output_key = "contrastive_loss"
    #: whether the loss reaches the logits only through each anchor's ``(pos, lse_neg)`` with one
    #: positive, which is what the ``no_grad_gather`` column term needs (see `clip_dcl.losses.gather`)
    supports_no_grad_gather = True

    def __init__(
        self,
        local_loss: bool = False,
        gather_with_grad: bool = False,
        cache_labels: bool = False,
        rank: int = 0,
        world_size: int = 1,
        use_horovod: bool = False,
        no_grad_gather: bool = False,
        tile: Optional[int] = None,
    ):
        super().__init__()
        check_tile(tile)
        if use_horovod:
            raise ValueError("use_horovod=True is not supported by clip-dcl losses; use torch.distributed")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} and world_size={world_size} must satisfy 0 <= rank < world_size")
        if no_grad_gather and not local_loss and world_size > 1:
            raise ValueError("no_grad_gather=True needs local_loss=True (each rank scores its own anchors)")
        if no_grad_gather and gather_with_grad:
            raise ValueError(
                "no_grad_gather=True replaces gather_with_grad=True (exact gradients without the "
                "backward collective); pass one of them"
            )
        if no_grad_gather and not self.supports_no_grad_gather:
            raise ValueError(
                f"no_grad_gather=True is not available for {self._no_grad_gather_blocker()}: its gradient "
                "does not follow from each anchor's (pos, lse_neg); use gather_with_grad=True"
            )
        self.local_loss = bool(local_loss)
        self.gather_with_grad = bool(gather_with_grad)
        self.no_grad_gather = bool(no_grad_gather)
        self.rank = int(rank)
        self.world_size = int(world_size)
        #: column-tile width of the statistics (0: the whole matrix; None: `resolve_tile`'s device default)
        self.tile = tile
        self.metrics: dict = {}
        self._pending_stats: List[PairStats] = []

    def _no_grad_gather_blocker(self) -> str:
        """What in this loss's configuration rules out ``no_grad_gather`` (for the error message)."""
        return type(self).__name__

    def gather(self, image_features, text_features) -> tuple:
        """The features of the global batch (OpenCLIP's ``gather_features``), for ``stats(gathered=...)``."""
        if self.world_size <= 1:
            return image_features, text_features
        return gather_features(
            image_features,
            text_features,
            local_loss=self.local_loss,
            gather_with_grad=self.gather_with_grad,
            rank=self.rank,
            world_size=self.world_size,
        )

    def stats(
        self,
        image_features,
        text_features,
        logit_scale,
        logit_bias=None,
        beta: float = 0.0,
        top_share: float = 0.0,
        gathered: Optional[tuple] = None,
    ) -> PairStats:
        st = anchor_stats(
            image_features,
            text_features,
            logit_scale,
            logit_bias,
            rank=self.rank,
            world_size=self.world_size,
            local_loss=self.local_loss,
            gather_with_grad=self.gather_with_grad,
            beta=beta,
            gathered=gathered,
            top_share=top_share,
            tile=self.tile_for(image_features),
        )
        if self.no_grad_gather:
            self._pending_stats.append(st)
        return st

    def tile_for(self, features: torch.Tensor) -> int:
        """The column-tile width in effect for this rank's ``features`` (``tile``, or its device's default for the
        gathered G = B x world_size columns; a B x G matrix under ``local_loss`` on several ranks keeps 0)."""
        square = not (self.local_loss and self.world_size > 1)
        return resolve_tile(self.tile, features.device, features.shape[0] * self.world_size, square)

    def compute(self, image_features, text_features, logit_scale, logit_bias, sample_ids):
        raise NotImplementedError

    def forward(self, image_features, text_features, logit_scale, logit_bias=None, output_dict=False, sample_ids=None):
        if self.no_grad_gather and text_features.shape[0] != image_features.shape[0]:
            raise ValueError(
                f"no_grad_gather=True needs one caption per image; got {text_features.shape[0]} text rows "
                f"for {image_features.shape[0]} images (M > 1 positives change the column gradient): "
                "use gather_with_grad=True"
            )
        loss, metrics = self.compute(image_features, text_features, logit_scale, logit_bias, sample_ids)
        if self.no_grad_gather:
            stats, self._pending_stats = self._pending_stats, []
            if self.world_size > 1 and loss.requires_grad:
                loss = loss + column_surrogate(
                    loss,
                    stats,
                    image_features,
                    text_features,
                    logit_bias,
                    self.rank,
                    self.world_size,
                    tile=self.tile_for(image_features),
                )
        self.metrics = {k: (v.detach() if torch.is_tensor(v) else torch.tensor(float(v))) for k, v in metrics.items()}
        return {self.output_key: loss} if output_dict else loss

    def extra_repr(self) -> str:
        return (
            f"rank={self.rank}, world_size={self.world_size}, local_loss={self.local_loss}, "
            f"gather_with_grad={self.gather_with_grad}" + ("" if self.tile is None else f", tile={self.tile}")
        )


@dataclass(frozen=True)
class StateBuffer:
    """One buffer of a `StatefulLoss`'s state and how it is laid out across ranks."""

    name: str  #: the buffer's name in the loss's ``state_dict``
    dtype: torch.dtype
    shape: Tuple[int, ...]  #: its global shape (the whole buffer, whatever this rank holds)
    #: a table of one column per training sample, ``(rows, num_samples)``, indexed by sample id
    per_sample: bool = False
    #: split over the ranks (rank ``r`` holds the ids ``r, r + W, ...``; `clip_dcl.losses.state`);
    #: otherwise every rank holds all of it, the same on each
    sharded: bool = False


class StatefulLoss(ContrastiveLoss, metaclass=abc.ABCMeta):
    """The contract of a loss that keeps state (its registered buffers) across optimizer steps; the trainer reads
    nothing else (docs/extending-losses.md)."""

    @abc.abstractmethod
    def state_buffers(self) -> Tuple[StateBuffer, ...]:
        """The layout of every buffer of the state (see `StateBuffer`)."""

    @abc.abstractmethod
    def rollback_step(self) -> bool:
        """Undo the last optimizer step's state update; whether there was one to undo."""

    def sharded_buffers(self) -> Tuple[StateBuffer, ...]:
        """The buffers split over the ranks in this configuration."""
        return tuple(b for b in self.state_buffers() if b.sharded)

    def per_sample_buffer(self) -> Optional[StateBuffer]:
        """The per-sample table, if the state has one."""
        return next((b for b in self.state_buffers() if b.per_sample), None)

    def adapt_saved_state(
        self, state: Dict[str, torch.Tensor], saved_args: Dict[str, object]
    ) -> Tuple[Dict[str, torch.Tensor], List[str]]:
        """A saved state converted for a setting that changes its units, and one log line per conversion."""
        return state, []

    def state_digest(self) -> str:
        """Digest of the whole state, equal on every rank and world size (one all-reduce when sharded)."""
        layout = {b.name: b for b in self.state_buffers()}
        entries = []
        for name, buf in self.state_dict().items():
            b = layout.get(name)
            if b is not None and b.per_sample:
                rank, world = (self.rank, self.world_size) if b.sharded else (0, 1)
                sums = table_sums(buf, b.shape[-1], rank, world)
                if b.sharded:
                    dist.all_reduce(sums)
                    sums = torch.remainder(sums, 2**31 - 1)
                entries.append((name, buf.dtype, b.shape, sums))
            else:
                entries.append((name, buf.dtype, buf.shape, plain_sums(buf)))
        return state_digest(entries)


class LossWrapper(nn.Module):
    """A loss whose contrastive term is a registered loss, `contrastive` (CoCa's objective)."""

    contrastive: nn.Module


def declared(loss) -> Optional[LossDeclaration]:
    """The registered loss that ``loss`` is or wraps; None for OpenCLIP's own SigLIP, CoCa or distillation."""
    if isinstance(loss, LossWrapper):
        loss = loss.contrastive
    return loss if isinstance(loss, LossDeclaration) else None


def stateful(loss) -> Optional[StatefulLoss]:
    """The `StatefulLoss` that ``loss`` is or wraps, or None."""
    inner = declared(loss)
    return inner if isinstance(inner, StatefulLoss) else None
