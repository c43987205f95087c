"""Model configs shipped with clip-dcl and their registration with OpenCLIP's per-process registry.

``import clip_dcl`` registers the shipped ones through a one-shot import hook that waits for OpenCLIP's import:
importing it (and torch) there would cost seconds and keep the launcher from handling signals before torch loads.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
from pathlib import Path

#: Name of the tiny ViT used by the embedded default (64x64 images, 2+2 layers, 64-d embeddings).
TINY_MODEL = "clip-dcl-tiny"
_CONFIG_DIR = Path(__file__).parent / "model_configs"


def tiny_config_path() -> Path:
    """Path of the JSON config of `TINY_MODEL`."""
    return _CONFIG_DIR / f"{TINY_MODEL}.json"


def register_model_config(path: str | os.PathLike) -> str:
    """Register a model config JSON (or a folder of them) with OpenCLIP; return the model name (the stem).

    A missing file or one without ``embed_dim``/``vision_cfg``/``text_cfg`` raises ``ValueError``.
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


#: configs whose tokenizer reads a merges file shipped beside them (``text_cfg.tokenizer_kwargs.bpe_path``)
_WORDS_DIR = _CONFIG_DIR / "words"


def register_word_configs() -> None:
    """Register the ``model_configs/words`` configs with their ``bpe_path`` made absolute (idempotent).

    OpenCLIP hands ``tokenizer_kwargs`` to ``SimpleTokenizer`` as they are and re-reads a config file at
    every registration, so these go into its registry directly with the path resolved.
    """
    from open_clip import factory

    registry = getattr(factory, "_MODEL_CONFIGS", None)
    if not isinstance(registry, dict):
        raise RuntimeError(
            "open_clip.factory._MODEL_CONFIGS is not a dict in this OpenCLIP version: the "
            f"models of {_WORDS_DIR} cannot be registered"
        )
    for f in sorted(_WORDS_DIR.glob("*.json")):
        cfg = json.loads(f.read_text())
        kwargs = cfg["text_cfg"].get("tokenizer_kwargs") or {}
        if "bpe_path" in kwargs:
            kwargs["bpe_path"] = str((_WORDS_DIR / kwargs["bpe_path"]).resolve())
        registry[f.stem] = cfg


def register_builtin_configs() -> None:
    """Register every config shipped in ``clip_dcl/model_configs`` (idempotent)."""
    register_model_config(_CONFIG_DIR)
    register_word_configs()


class _Registering(importlib.abc.Loader):
    """OpenCLIP's own loader, then `register_builtin_configs` once its module has run."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        module.__loader__ = module.__spec__.loader = self.loader  # the module as OpenCLIP's loader leaves it
        register_builtin_configs()

    def __getattr__(self, name):  # resources and the like: OpenCLIP's loader answers
        return getattr(self.loader, name)


class _OnOpenClipImport(importlib.abc.MetaPathFinder):
    """Finds ``open_clip`` as the other finders do, with its loader wrapped in `_Registering`; once."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "open_clip":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _Registering(spec.loader)
        return spec


def register_on_open_clip_import() -> None:
    """Register the shipped configs now if ``open_clip`` is imported, else when it is (a one-shot
    ``sys.meta_path`` hook, so that ``import clip_dcl`` stays free of torch). Idempotent.
    """
    module = sys.modules.get("open_clip")
    if module is not None and hasattr(module, "add_model_config"):
        register_builtin_configs()
    elif not any(isinstance(f, _OnOpenClipImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _OnOpenClipImport())


def model_name_problem(name: str) -> str | None:
    """Why OpenCLIP's ``create_model`` would not find ``name``, with the closest names, or None.

    OpenCLIP raises only after printing every name it knows; ``hf-hub:`` names are left to it.
    """
    import difflib

    import open_clip

    if name.startswith("hf-hub:"):
        return None
    if name.startswith("local-dir:"):
        folder = Path(name[len("local-dir:") :])
        if not (folder / "open_clip_config.json").is_file():
            return f"{name!r}: the folder {str(folder)!r} holds no open_clip_config.json"
        return None
    known = open_clip.list_models()
    if name.replace("/", "-") in known:
        return None
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f"the closest are {', '.join(close)}" if close else "open_clip.list_models() lists them"
    return f"{name!r} is not a model OpenCLIP knows ({hint})"
