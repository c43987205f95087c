"""Model configs shipped with clip-dcl and their registration with OpenCLIP.

OpenCLIP keeps its model registry per process, so every process (every torchrun rank,
every dataloader-free evaluation) must call :func:`register_model_config` before
``open_clip.create_model_and_transforms`` sees a custom name.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

#: Name of the tiny ViT used by the embedded default (64x64 images, 2+2 layers, 64-d embeddings).
TINY_MODEL = "clip-dcl-tiny"
_CONFIG_DIR = Path(__file__).parent / "model_configs"


def tiny_config_path() -> Path:
    """Path of the JSON config of :data:`TINY_MODEL`."""
    return _CONFIG_DIR / f"{TINY_MODEL}.json"


def register_model_config(path: str | os.PathLike) -> str:
    """Register a model config JSON (or a folder of them) with OpenCLIP; return the model name.

    The model name is the file stem, as OpenCLIP names its own configs. A missing file or a
    JSON without ``embed_dim``/``vision_cfg``/``text_cfg`` raises ``ValueError`` naming the path.
    """
    import open_clip

    path = Path(path)
    if not path.exists():
        raise ValueError(f"model config {str(path)!r} does not exist")
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    for f in files:
        try:
            cfg = json.loads(f.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"model config {str(f)!r} is not valid JSON: {e}") from e
        missing = [k for k in ("embed_dim", "vision_cfg", "text_cfg") if k not in cfg]
        if missing:
            raise ValueError(f"model config {str(f)!r} lacks the keys {missing}")
    open_clip.add_model_config(str(path))
    return path.stem


def register_builtin_configs() -> None:
    """Register every config shipped in ``clip_dcl/model_configs`` (idempotent)."""
    register_model_config(_CONFIG_DIR)
