"""Contrastive objectives for OpenCLIP: ``clip`` (InfoNCE, OpenCLIP's own), ``dcl`` and ``decl``.

A name -> class registry and a factory, in the manner of timm's model registry::

    loss = create_loss("dcl", tau_plus=0.1, rank=rank, world_size=world_size,
                       local_loss=True, gather_with_grad=True)
    terms = loss(image_features, text_features, logit_scale, output_dict=True)

``no_grad_gather=True`` (with ``local_loss=True``) gathers the features without autograd and
still gives every rank the exact gradient (see :mod:`clip_dcl.losses.base`), for every loss.

Every loss follows OpenCLIP's ``ClipLoss`` contract
``forward(image_features, text_features, logit_scale, logit_bias=None, output_dict=False)``
and also accepts ``sample_ids=`` (ignored unless ``loss.requires_sample_ids``). With
``output_dict=True`` the returned dict holds only terms to be summed; diagnostics are in
``loss.metrics`` after the call.
"""
from __future__ import annotations

from typing import Dict, Type

import torch.nn as nn

from .clip import InfoNCEFromStats, InfoNCELoss
from .dcl import DebiasedClipLoss
from .decl import DeCLLoss

LOSSES: Dict[str, Type[nn.Module]] = {
    "clip": InfoNCELoss,
    "dcl": DebiasedClipLoss,
    "decl": DeCLLoss,
}


def register_loss(name: str):
    """Class decorator adding a loss to :data:`LOSSES` under ``name``."""

    def wrap(cls):
        LOSSES[name] = cls
        return cls

    return wrap


def create_loss(name: str, **kwargs) -> nn.Module:
    """Build the loss registered as ``name`` with keyword arguments ``kwargs``.

    Raises:
        ValueError: ``name`` is not in :data:`LOSSES`, or an argument is out of range.
    """
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; expected one of {sorted(LOSSES)}")
    if name == "clip" and kwargs.get("no_grad_gather"):  # ClipLoss has no such mode: the same InfoNCE, ours
        return InfoNCEFromStats(**kwargs)
    return LOSSES[name](**kwargs)


__all__ = ["LOSSES", "create_loss", "register_loss", "InfoNCELoss", "InfoNCEFromStats", "DebiasedClipLoss", "DeCLLoss"]
