"""Contrastive objectives for OpenCLIP: ``clip`` (InfoNCE, OpenCLIP's own), ``dcl``, ``decl`` and ``curl``.

A name -> class registry and a factory, in the manner of timm's model registry::

    loss = create_loss("dcl", tau_plus=0.1, rank=rank, world_size=world_size,
                       local_loss=True, gather_with_grad=True)
    terms = loss(image_features, text_features, logit_scale, output_dict=True)

``no_grad_gather=True`` (with ``local_loss=True``) gathers the features without autograd and
still gives every rank the exact gradient (see `clip_dcl.losses.base`), for every loss whose
gradient follows from each anchor's ``(pos, lse_neg)``; the others (``curl``, ``dcl`` with
``beta > 0``, M > 1 captions per image) refuse it with a ``ValueError``.

The registry is the source of truth for the command line: each class declares its flags
(``flags``, a tuple of `LossFlag`) and a one-line ``summary``, and
``clip_dcl.train`` builds ``--loss`` and the loss flags from `LOSSES`. A new objective::

    @register_loss("mine")
    class MyLoss(ContrastiveLoss):
        flags = (LossFlag("--mine-alpha", "alpha", type=float, help="..."),)
        def __init__(self, alpha=1.0, **dist_kwargs): ...

A loss that keeps state across steps derives from `StatefulLoss` and
declares its buffers' layout, its rollback and its digest there; the trainer reads that contract
(docs/extending-losses.md). A loss whose arguments depend on the training data (DeCL's per-sample buffer is as large as the
data, its gamma schedule is given in epochs) completes them in the classmethod
``resolve_data_params(kwargs, data)`` from a `DataFacts`; the trainer
calls it through `resolve_loss_args`, and records what it returns.

Every loss follows OpenCLIP's ``ClipLoss`` contract
``forward(image_features, text_features, logit_scale, logit_bias=None, output_dict=False)``
and also accepts ``sample_ids=`` (ignored unless ``loss.requires_sample_ids``). With
``output_dict=True`` the returned dict holds only terms to be summed; diagnostics are in
``loss.metrics`` after the call.
"""
from __future__ import annotations

import warnings
from typing import Dict, Type

import torch.nn as nn

from .base import (ContrastiveLoss, DataFacts, DataSizeUnknown, LossDeclaration, LossFlag, StateBuffer, StatefulLoss,
                   declared, stateful)
from .clip import InfoNCEFromStats, InfoNCELoss
from .curl import BlockContrastiveLoss
from .dcl import DebiasedClipLoss
from .decl import DeCLLoss

LOSSES: Dict[str, Type[nn.Module]] = {}


def register_loss(name: str):
    """Class decorator adding a loss to `LOSSES` under ``name``; warns when it replaces one.

    Raises:
        TypeError: the class does not derive from `LossDeclaration` (what the
            trainer reads of every loss).
    """

    def wrap(cls):
        if not (isinstance(cls, type) and issubclass(cls, LossDeclaration)):
            raise TypeError(f"register_loss({name!r}): {cls!r} must derive from clip_dcl.losses.base.LossDeclaration "
                            "(ContrastiveLoss or StatefulLoss do)")
        old = LOSSES.get(name)
        if old is not None and old is not cls:
            warnings.warn(f"register_loss({name!r}) replaces {old.__module__}.{old.__qualname__} with "
                          f"{cls.__module__}.{cls.__qualname__}", stacklevel=2)
        LOSSES[name] = cls
        return cls

    return wrap


def unregister_loss(name: str) -> None:
    """Remove the loss registered as ``name`` (for scripts and tests that register one for a while).

    Raises:
        ValueError: no loss is registered as ``name``.
    """
    if name not in LOSSES:
        raise ValueError(f"no loss is registered as {name!r}; registered: {sorted(LOSSES)}")
    del LOSSES[name]


for _name, _cls in (("clip", InfoNCELoss), ("dcl", DebiasedClipLoss), ("decl", DeCLLoss),
                    ("curl", BlockContrastiveLoss)):
    register_loss(_name)(_cls)


def create_loss(name: str, **kwargs) -> nn.Module:
    """Build the loss registered as ``name`` with keyword arguments ``kwargs``.

    Raises:
        ValueError: ``name`` is not in `LOSSES`, or an argument is out of range.
    """
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; expected one of {sorted(LOSSES)}")
    return LOSSES[name].from_args(**kwargs)


def resolve_loss_args(name: str, kwargs: Dict[str, object], data: DataFacts) -> Dict[str, object]:
    """The keyword arguments of the loss registered as ``name``, completed from the training data by its
    class's ``resolve_data_params`` (``kwargs`` unchanged unless the class overrides it).

    Raises:
        ValueError: ``name`` is not in `LOSSES`; or the loss refuses a value (the message names it).
    """
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; expected one of {sorted(LOSSES)}")
    return LOSSES[name].resolve_data_params(dict(kwargs), data)


__all__ = ["LOSSES", "create_loss", "register_loss", "unregister_loss", "resolve_loss_args", "DataFacts",
           "DataSizeUnknown", "InfoNCELoss", "InfoNCEFromStats", "DebiasedClipLoss", "DeCLLoss",
           "BlockContrastiveLoss", "ContrastiveLoss", "LossDeclaration", "LossFlag", "StateBuffer", "StatefulLoss",
           "declared", "stateful"]
