"""clip-dcl: debiased (DCL) and decomposable (DeCL) contrastive objectives for OpenCLIP.

Public API::

    from clip_dcl import create_loss, LOSSES, load_checkpoint

Importing ``clip_dcl`` makes its model configs (``clip-dcl-tiny``) visible to OpenCLIP, without importing
torch or OpenCLIP itself (:func:`clip_dcl.models.register_on_open_clip_import`).
"""

from __future__ import annotations

from ._version import __version__
from .models import register_on_open_clip_import

register_on_open_clip_import()

__all__ = ["create_loss", "LOSSES", "load_checkpoint", "__version__"]


def __getattr__(name):
    # Lazy so that `import clip_dcl` does not import torch/open_clip until needed.
    if name in ("create_loss", "LOSSES"):
        from . import losses

        return getattr(losses, name)
    if name == "load_checkpoint":
        from .checkpoint import load_checkpoint

        return load_checkpoint
    raise AttributeError(f"module 'clip_dcl' has no attribute {name!r}")
