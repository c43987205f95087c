"""Contrastive objectives for OpenCLIP: ``clip`` (InfoNCE, OpenCLIP's own), ``dcl``, ``decl`` and ``curl``.

A name -> class registry and a factory, as timm's model registry::

    loss = create_loss("dcl", tau_plus=0.1, rank=rank, world_size=world_size, local_loss=True)
    terms = loss(image_features, text_features, logit_scale, output_dict=True)

Every loss follows OpenCLIP's ``ClipLoss`` call contract and also accepts ``sample_ids=``; with
``output_dict=True`` the dict holds only terms to be summed, diagnostics are in ``loss.metrics``.
Each class declares its ``flags`` and a one-line ``summary``, from which ``clip_dcl.train`` builds
its command line; docs/extending-losses.md adds one.
"""

from __future__ import annotations

import warnings
from typing import Dict, Type

import torch.nn as nn

from .base import (
    ContrastiveLoss,
    DataFacts,
    DataSizeUnknown,
    LossDeclaration,
    LossFlag,
    StateBuffer,
    StatefulLoss,
    declared,
    stateful,
)
from .clip import InfoNCEFromStats, InfoNCELoss
from .curl import BlockContrastiveLoss
from .dcl import DebiasedClipLoss
from .decl import DeCLLoss

LOSSES: Dict[str, Type[nn.Module]] = {}


def register_loss(name: str):
    """Class decorator adding a `LossDeclaration` class to `LOSSES` under ``name``; warns when it replaces one."""

    def wrap(cls):
        if not (isinstance(cls, type) and issubclass(cls, LossDeclaration)):
            raise TypeError(
                f"register_loss({name!r}): {cls!r} must derive from clip_dcl.losses.base.LossDeclaration "
                "(ContrastiveLoss or StatefulLoss do)"
            )
        old = LOSSES.get(name)
        if old is not None and old is not cls:
            warnings.warn(
                f"register_loss({name!r}) replaces {old.__module__}.{old.__qualname__} with "
                f"{cls.__module__}.{cls.__qualname__}",
                stacklevel=2,
            )
        LOSSES[name] = cls
        return cls

    return wrap


def unregister_loss(name: str) -> None:
    """Remove the loss registered as ``name`` (``ValueError`` if none is)."""
    if name not in LOSSES:
        raise ValueError(f"no loss is registered as {name!r}; registered: {sorted(LOSSES)}")
    del LOSSES[name]


for _name, _cls in (
    ("clip", InfoNCELoss),
    ("dcl", DebiasedClipLoss),
    ("decl", DeCLLoss),
    ("curl", BlockContrastiveLoss),
):
    register_loss(_name)(_cls)


def create_loss(name: str, **kwargs) -> nn.Module:
    """Build the loss registered as ``name`` with ``kwargs`` (``ValueError`` for an unknown name or bad value)."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; expected one of {sorted(LOSSES)}")
    return LOSSES[name].from_args(**kwargs)


def resolve_loss_args(name: str, kwargs: Dict[str, object], data: DataFacts) -> Dict[str, object]:
    """The keyword arguments of loss ``name`` completed from the training data (its ``resolve_data_params``)."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; expected one of {sorted(LOSSES)}")
    return LOSSES[name].resolve_data_params(dict(kwargs), data)


__all__ = [
    "LOSSES",
    "create_loss",
    "register_loss",
    "unregister_loss",
    "resolve_loss_args",
    "DataFacts",
    "DataSizeUnknown",
    "InfoNCELoss",
    "InfoNCEFromStats",
    "DebiasedClipLoss",
    "DeCLLoss",
    "BlockContrastiveLoss",
    "ContrastiveLoss",
    "LossDeclaration",
    "LossFlag",
    "StateBuffer",
    "StatefulLoss",
    "declared",
    "stateful",
]
