"""Load any checkpoint our training writes, and export it to OpenCLIP's ``local-dir`` layout.

``load_checkpoint(path) -> (model, preprocess, tokenizer)`` reads

* a checkpoint file OpenCLIP's trainer writes (``{"epoch", "name", "state_dict", "optimizer"}``,
  keys prefixed ``module.`` after DDP; a bare state dict also works), or
* an exported folder (``open_clip_config.json`` + weights), loaded through OpenCLIP's
  ``local-dir:`` schema.

The model name is found without any training flag at hand, in this order: the ``model``
argument; the ``clip_dcl`` entry our training stores in every checkpoint
(``{"model": name, "model_config": <config dict>, "preprocess_cfg": ...}``); the ``params.txt``
OpenCLIP writes two folders up (``logs/<name>/params.txt``, line ``model: ViT-B-32``, and
``model_config: PATH`` when the run registered a custom config with ``--model-config``) or beside
the file. A config dict found in the checkpoint (or given as ``model_config``) is registered with
OpenCLIP before the model is built, so custom architectures load in a fresh process; the entry's
``preprocess_cfg`` (mean, std, interpolation, resize mode the model was trained with) sets the
returned transform.

The checkpoint format is defined here, for the reader and for the trainer that writes it
(``clip_dcl.train.saving``): OpenCLIP's ``{"epoch", "name", "state_dict", "optimizer"[, "scaler"]}``
plus :data:`LOSS_STATE_KEY` (the loss's ``state_dict()``) and :data:`CKPT_KEY` (the entry of
:func:`checkpoint_entry`). :func:`save_atomically` writes a file under a temporary name and
renames it, so that a killed save never leaves a torn ``*.pt``.

``export(ckpt, out_dir)`` writes ``open_clip_config.json`` (``model_cfg`` and ``preprocess_cfg``,
what OpenCLIP 3.3's ``create_model`` reads for ``local-dir:``) and ``open_clip_model.safetensors``
(the first name its ``_find_checkpoint_in_dir`` prefers), so that
``open_clip.create_model_and_transforms("local-dir:OUT_DIR")`` loads it without clip-dcl.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

from ._version import __version__

log = logging.getLogger(__name__)

CONFIG_NAME = "open_clip_config.json"
WEIGHTS_NAME = "open_clip_model.safetensors"
#: Key under which our training stores the model name and config in a checkpoint.
CKPT_KEY = "clip_dcl"
#: Key under which our training stores the loss's ``state_dict()`` in a checkpoint.
LOSS_STATE_KEY = "loss_state"
#: Key of ``ckpt[CKPT_KEY]`` that says where a sharded loss state's files are (see
#: :mod:`clip_dcl.train.saving`): their folder, world size, ``num_samples`` and buffers.
SHARD_INDEX_KEY = "loss_state_shards"
#: Sub-folder of the checkpoint folder that holds the shard files of a sharded loss state.
SHARD_FOLDER = "loss_state"
#: Suffix of a checkpoint being written; not ``.pt``, so OpenCLIP's ``--resume latest`` (which takes
#: the last ``*.pt`` under the checkpoint folder) never picks a half-written file.
PARTIAL_SUFFIX = ".partial"


class UnsafeCheckpoint(ValueError):
    """A checkpoint that only loads by full unpickling, which can run arbitrary code."""


class CheckpointUnreadable(ValueError):
    """A checkpoint file that cannot be read (truncated by a killed save, or not a torch file)."""


class CheckpointDiskFull(RuntimeError):
    """A checkpoint could not be written: no space left on the disk (or the quota is reached).

    The message names the file, the space needed and free where known, the previous checkpoint
    (intact: the partial file is removed and nothing was renamed) and how to resume.
    """


def checkpoint_entry(model: str, model_config: dict | None, preprocess_cfg: dict | None, loss: str,
                     loss_args: dict) -> dict:
    """The :data:`CKPT_KEY` entry of a training checkpoint: what a loader needs without the flags."""
    return {"model": model, "model_config": model_config, "preprocess_cfg": preprocess_cfg, "loss": loss,
            "loss_args": dict(loss_args), "version": __version__}


def add_training_entries(ckpt: dict, loss_state: dict, entry: dict) -> dict:
    """A copy of OpenCLIP's checkpoint dict ``ckpt`` with the loss state and the entry added."""
    out = dict(ckpt)
    out[LOSS_STATE_KEY] = {k: v.detach().cpu() for k, v in loss_state.items()}
    out[CKPT_KEY] = entry
    return out



def loss_state_of(ckpt: dict) -> dict:
    """The loss state a training checkpoint holds in the file itself (``{}`` when none): all of it, or the
    small buffers of a sharded one (see :func:`shard_index_of`)."""
    return dict(ckpt.get(LOSS_STATE_KEY) or {})


def shard_index_of(ckpt: dict) -> dict | None:
    """Where a training checkpoint keeps its sharded loss state (:data:`SHARD_INDEX_KEY`), or None."""
    entry = ckpt.get(CKPT_KEY)
    return entry.get(SHARD_INDEX_KEY) if isinstance(entry, dict) else None


def read_training_state(path) -> tuple:
    """``(loss state, clip_dcl entry)`` of a training checkpoint, loaded weights-only on the CPU."""
    ckpt = read_checkpoint(path)
    return loss_state_of(ckpt), dict(ckpt.get(CKPT_KEY) or {})


def save_loss_shard(path, name: str, tensor, rank: int, world_size: int, num_samples: int) -> None:
    """Write one rank's shard ``tensor`` of the loss buffer ``name`` to ``path``, atomically
    (:func:`save_atomically`), with the rank, world size and ``num_samples`` it belongs to."""
    save_atomically({name: tensor.detach().cpu(), "rank": rank, "world_size": world_size,
                     "num_samples": num_samples}, path)


def load_loss_shard(path, name: str):
    """The buffer ``name`` of a shard file written by :func:`save_loss_shard`, memory-mapped (only the
    columns read are paged in)."""
    import torch

    return torch.load(path, map_location="cpu", mmap=True, weights_only=True)[name]

def trained_model_config(args) -> dict | None:
    """OpenCLIP's config of ``args.model`` with the ``--force-*`` overrides main applied to it."""
    import open_clip

    cfg = open_clip.get_model_config(args.model)
    if cfg is None:
        return None
    # The same overrides open_clip.factory.create_model applies, so the config describes the trained model.
    if args.force_quick_gelu:
        cfg["quick_gelu"] = True
    if args.force_patch_dropout is not None:
        cfg["vision_cfg"]["patch_dropout"] = args.force_patch_dropout
    if args.force_image_size is not None:
        size = args.force_image_size
        cfg["vision_cfg"]["image_size"] = size[0] if isinstance(size, (list, tuple)) and len(size) == 1 else size
    if args.force_context_length is not None:
        cfg["text_cfg"]["context_length"] = args.force_context_length
    if args.force_custom_text:
        cfg["custom_text"] = True
    return cfg


def save_atomically(obj, path, save=None) -> None:
    """``torch.save(obj, path)`` through ``path + PARTIAL_SUFFIX``, flushed to disk, then renamed.

    A kill during the save leaves at most the ``.partial`` file, never a truncated ``path``.

    Raises:
        CheckpointDiskFull: the disk is full (``ENOSPC``/``EDQUOT``, however deep in torch's error it
            is); the ``.partial`` file is removed and ``path``, if it existed, is untouched.
    """
    import torch

    save = save or torch.save
    path = os.fspath(path)
    tmp = path + PARTIAL_SUFFIX
    try:
        with open(tmp, "wb") as f:
            save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        full = _disk_full(e)
        if full is not None:
            raise CheckpointDiskFull(_disk_full_message(obj, path, full)) from e
        raise


def remove_stale_partials(folder) -> list:
    """Remove the ``*`` + :data:`PARTIAL_SUFFIX` files under ``folder`` (recursively) and return their paths.

    :func:`save_atomically` removes its partial file on any error, but a process killed during a
    save (SIGKILL, a node lost) leaves it behind, as large as a checkpoint. Call it only where no
    save can be running (before a run's first save). Only regular files go: a link of that name is
    none of :func:`save_atomically`'s making (it writes a fresh file), so it is left as it is.
    """
    import glob as _glob

    removed = []
    for path in sorted(_glob.glob(os.path.join(os.fspath(folder), "**", "*" + PARTIAL_SUFFIX), recursive=True)):
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
            removed.append(path)
    return removed


def _disk_full(err: BaseException) -> OSError | None:
    """The ``ENOSPC`` / ``EDQUOT`` ``OSError`` in ``err``'s chain (torch wraps it in a RuntimeError)."""
    import errno

    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            return err
        err = err.__cause__ or err.__context__
    return None


def _payload_bytes(obj) -> int:
    """The bytes of the tensors in ``obj`` (dicts, lists and tuples walked): about what the file needs."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_payload_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_payload_bytes(v) for v in obj)
    return 0


def _size(n: int) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} bytes"


def _disk_full_message(obj, path: str, err: OSError) -> str:
    import shutil

    folder = os.path.dirname(os.path.abspath(path))
    need = _payload_bytes(obj)
    try:
        free = f"{_size(shutil.disk_usage(folder).free)} free"
    except OSError:
        free = "free space unknown"
    needs = f"it needs about {_size(need)}, {free} on that disk" if need else free
    import glob as _glob

    from open_clip_train.main import natural_key  # the order OpenCLIP's --resume latest picks in

    others = sorted(_glob.glob(os.path.join(folder, "**", "*.pt"), recursive=True), key=natural_key)
    if others:
        previous = (f"the previous checkpoint, {others[-1]}, is intact (the partial file was removed). Free "
                    f"space, then run the same command with --resume latest (or --resume {others[-1]})")
    else:
        previous = ("the partial file was removed; there is no earlier checkpoint in that folder, so the run "
                    "would start over. Free space (or give --logs another disk) and run it again")
    return (f"cannot write checkpoint {path}: the disk is full ({err.strerror or err}); {needs}. "
            f"{previous[0].upper()}{previous[1:]}.")


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def read_checkpoint(path, allow_unsafe_pickle: bool = False):
    """The object in a checkpoint file, loaded weights-only (see :func:`_torch_load`).

    Raises:
        CheckpointUnreadable: a truncated or foreign file (one line naming it).
        UnsafeCheckpoint: the file needs full unpickling and ``allow_unsafe_pickle`` is off.
    """
    try:
        return _torch_load(Path(path), allow_unsafe_pickle)
    except UnsafeCheckpoint:
        raise
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise CheckpointUnreadable(f"checkpoint {str(path)!r} cannot be read; it is truncated (a save that was "
                                   f"interrupted?) or not a torch checkpoint ({_first_line(e)})") from None


def _torch_load(path: Path, allow_unsafe_pickle: bool = False):
    """``torch.load`` with ``weights_only=True``; full unpickling only when ``allow_unsafe_pickle``.

    Checkpoints written by clip-dcl's training hold tensors, numbers, strings and dicts only, so they
    load weights-only. A pickle that needs more can execute code while it loads: it is refused
    unless the caller says it trusts the file.
    """
    import pickle

    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        reason = str(e).splitlines()[0]
    if allow_unsafe_pickle:  # the caller's explicit opt-in: the file is trusted
        log.warning("%s: weights-only load failed (%s); fully unpickling it as asked (allow_unsafe_pickle)",
                    path, reason)
        return torch.load(path, map_location="cpu", weights_only=False)
    raise UnsafeCheckpoint(
        f"checkpoint {str(path)!r} does not load as weights only ({reason}); loading it would unpickle "
        "arbitrary objects, which can run code. If you trust the file, pass allow_unsafe_pickle=True "
        "(--unsafe-pickle on the command line)")


def read_params(ckpt_path: str | os.PathLike) -> dict[str, str]:
    """The ``model`` and ``model_config`` lines of the ``params.txt`` OpenCLIP wrote for a checkpoint.

    Looked for two folders up (``logs/<name>/params.txt`` for ``logs/<name>/checkpoints/epoch_K.pt``),
    then beside the file. Values ``None`` in the file are left out.
    """
    here = Path(ckpt_path).absolute().parent
    for params in (here.parent / "params.txt", here / "params.txt"):
        if params.is_file():
            break
    else:
        return {}
    out = {}
    for line in params.read_text(encoding="utf-8").splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("model", "model_config") and value.strip() not in ("", "None"):
            out[key.strip()] = value.strip()
    return out


def register_config_dict(name: str, config: dict) -> str:
    """Register a model config dict with OpenCLIP under ``name`` (written to a cache JSON)."""
    from .models import register_model_config

    if not isinstance(config, dict):
        raise ValueError(f"model config for {name!r} must be a dict, got {type(config).__name__}")
    text = json.dumps(config, sort_keys=True)
    digest = hashlib.sha1(text.encode()).hexdigest()[:12]
    # One folder per distinct config, so that two configs with the same name never overwrite
    # each other's file; OpenCLIP names the model after the file stem.
    folder = Path(tempfile.gettempdir()) / "clip_dcl_model_configs" / digest
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    if not path.is_file() or path.read_text() != text:
        tmp = folder / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(text)
        os.replace(tmp, path)
    register_model_config(path)
    return name


class _QuietRandomInit(logging.Filter):
    """Drops OpenCLIP's "No pretrained weights loaded ... initialized randomly" warning, which is
    wrong here: the model is built empty and our weights are loaded right after."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "No pretrained weights loaded" not in record.getMessage()


#: ``preprocess_cfg`` keys of a checkpoint's entry -> ``create_model_and_transforms`` arguments
#: (the ``--image-*`` flags OpenCLIP's trainer applies; the size follows the model config).
_PREPROCESS_ARGS = {"mean": "image_mean", "std": "image_std", "interpolation": "image_interpolation",
                    "resize_mode": "image_resize_mode"}


def _create_empty(name: str, preprocess_cfg: dict | None = None):
    import open_clip

    kwargs = {arg: preprocess_cfg[key] for key, arg in _PREPROCESS_ARGS.items()
              if preprocess_cfg and preprocess_cfg.get(key) is not None}
    root = logging.getLogger()
    quiet = _QuietRandomInit()
    root.addFilter(quiet)
    try:
        net, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=None, **kwargs)
    finally:
        root.removeFilter(quiet)
    return net, preprocess


#: the prefix ``DistributedDataParallel`` gives every key of the ``state_dict`` of the model it wraps
DDP_PREFIX = "module."


def _strip_module(state_dict: dict) -> dict:
    if state_dict and all(k.startswith(DDP_PREFIX) for k in state_dict):
        return {k[len(DDP_PREFIX):]: v for k, v in state_dict.items()}
    return state_dict


def model_keys_for(state_dict: dict, wrapped: bool) -> dict:
    """``state_dict`` with the keys of a model that is (``wrapped``) or is not wrapped in DDP.

    A checkpoint saved on several ranks holds DDP's ``module.`` keys and one saved by one process
    holds none; OpenCLIP's resume strips the prefix for one process but never adds it for several,
    so a one-process checkpoint did not resume under torchrun. Either way round, the keys are
    made to fit the model they are loaded into (all keys or none carry the prefix).
    """
    bare = _strip_module(state_dict)
    if not wrapped or not bare:
        return bare
    return {DDP_PREFIX + k: v for k, v in bare.items()}


def resolve_model(path: str | os.PathLike, ckpt: dict, model: str | None = None,
                  model_config: str | os.PathLike | dict | None = None) -> str:
    """The model name for a loaded checkpoint dict, registering any custom config (module docstring)."""
    from .models import register_builtin_configs, register_model_config

    register_builtin_configs()
    entry = ckpt.get(CKPT_KEY) if isinstance(ckpt, dict) else None
    if entry is not None and not isinstance(entry, dict):
        raise ValueError(f"checkpoint {str(path)!r}: {CKPT_KEY!r} entry must be a dict, got {type(entry).__name__}")
    entry = entry or {}
    if model_config is not None:
        if isinstance(model_config, dict):
            name = model or entry.get("model")
            if not name:
                raise ValueError("a model_config dict needs a model name (model=...)")
            return register_config_dict(name, model_config)
        registered = register_model_config(model_config)
        return model or registered
    params = {} if (model or entry.get("model")) else read_params(path)
    name = model or entry.get("model") or params.get("model")
    if not name:
        raise ValueError(
            f"checkpoint {str(path)!r} does not name its model (no {CKPT_KEY!r} entry and no params.txt two "
            f"folders up or beside it); pass --model NAME (and --model-config PATH for a custom architecture), "
            f"or model='<name>' / model_config=... from Python")
    if params.get("model_config") and entry.get("model_config") is None:
        config_path = Path(params["model_config"])
        if not config_path.exists():
            raise ValueError(f"checkpoint {str(path)!r}: its params.txt names --model-config {str(config_path)!r}, "
                             "which does not exist; pass --model-config PATH")
        register_model_config(config_path)
    if entry.get("model_config") is not None and (model is None or model == entry.get("model")):
        register_config_dict(name, entry["model_config"])
    return name


def _mismatch_summary(err: RuntimeError) -> str:
    """torch's ``load_state_dict`` error in one line: counts, and the first size mismatch."""
    import re

    text = str(err)
    sizes = re.findall(r"size mismatch for ([^:]+): copying a param with shape (torch\.Size\(\[[^\]]*\]\)) from "
                       r"checkpoint, the shape in current model is (torch\.Size\(\[[^\]]*\]\))", text)
    missing = re.search(r"Missing key\(s\) in state_dict: (.*?)\.\s*(?:Unexpected|size mismatch|$)", text, re.S)
    unexpected = re.search(r"Unexpected key\(s\) in state_dict: (.*?)\.\s*(?:Missing|size mismatch|$)", text, re.S)
    parts = []
    if sizes:
        k, theirs, ours = sizes[0]
        shape = lambda s: s.replace("torch.Size(", "").rstrip(")")  # noqa: E731
        parts.append(f"{len(sizes)} tensor(s) of another shape (e.g. {k}: {shape(theirs)} in the checkpoint, "
                     f"{shape(ours)} in the model)")
    for what, m in (("missing from the checkpoint", missing), ("not in the model", unexpected)):
        if m:
            keys = re.findall(r'"([^"]+)"', m.group(1))
            parts.append(f"{len(keys)} key(s) {what}" + (f" (e.g. {keys[0]})" if keys else ""))
    return "; ".join(parts) or text.strip().splitlines()[0]


def _mismatch_message(path, ckpt: dict, name: str, asked: str | None, model_config, err: RuntimeError) -> str:
    """Why the weights do not load into ``name``: the model the checkpoint was trained as, when it says."""
    entry = ckpt.get(CKPT_KEY) if isinstance(ckpt.get(CKPT_KEY), dict) else {}
    own, source = entry.get("model"), f"its {CKPT_KEY!r} entry"
    if not own:
        own, source = read_params(path).get("model"), "the params.txt of its run"
    summary = _mismatch_summary(err)
    if own and own != name:
        flag = f"--model {asked}" if asked else f"--model-config {model_config}"
        return (f"checkpoint {str(path)!r} was trained as model {own!r} ({source}), not {name!r} as {flag} asks: "
                f"{summary}. Drop {flag.split()[0]} (the checkpoint names its model) or pass --model {own}")
    if own:
        return (f"checkpoint {str(path)!r} was trained as model {own!r} ({source}) but does not fit its current "
                f"config ({summary}); was the config changed? Pass the config it was trained with "
                f"(--model-config)")
    return (f"checkpoint {str(path)!r} does not fit model {name!r} ({summary}); it does not record the model it was "
            f"trained as: pass that one with --model (and --model-config for a custom architecture)")


def load_checkpoint(path: str | os.PathLike, device: str = "cpu", model: str | None = None,
                    model_config: str | os.PathLike | dict | None = None, allow_unsafe_pickle: bool = False):
    """Load a trained model for downstream use: ``(model, preprocess, tokenizer)``.

    Args:
        path: a trainer checkpoint (``epoch_K.pt``) or an exported folder (:func:`export`).
        device: where the model goes; it is returned in eval mode.
        model: the OpenCLIP model name, when the checkpoint does not say it.
        model_config: a config JSON path or dict for a custom architecture (registered with OpenCLIP).
        allow_unsafe_pickle: load a checkpoint that is not weights-only by full unpickling, which can
            run code from the file; only for files you trust.

    Returns:
        The model, its eval image transform, its tokenizer.

    Raises:
        ValueError: a missing path, or a checkpoint whose model cannot be determined.
        CheckpointUnreadable: (a ValueError) a truncated or foreign file.
        UnsafeCheckpoint: (a ValueError) the file needs full unpickling and ``allow_unsafe_pickle`` is off.
    """
    import open_clip

    path = Path(path)
    if path.is_dir():
        if not (path / CONFIG_NAME).is_file():
            raise ValueError(f"folder {str(path)!r} holds no {CONFIG_NAME} (not an exported model)")
        from .models import register_builtin_configs

        register_builtin_configs()
        name = f"local-dir:{path}"
        net, _, preprocess = open_clip.create_model_and_transforms(name, device=device)
        return net.eval(), preprocess, open_clip.get_tokenizer(name)
    if not path.is_file():
        raise ValueError(f"checkpoint {str(path)!r} does not exist")
    ckpt = read_checkpoint(path, allow_unsafe_pickle)
    if not isinstance(ckpt, dict):
        raise ValueError(f"checkpoint {str(path)!r} holds a {type(ckpt).__name__}, not a dict")
    name = resolve_model(path, ckpt, model, model_config)
    state_dict = ckpt.get("state_dict", ckpt)
    state_dict = _strip_module({k: v for k, v in state_dict.items() if k not in (CKPT_KEY, LOSS_STATE_KEY)})
    entry = ckpt.get(CKPT_KEY) or {}
    # The eval transform the model was trained with (--image-mean/std/interpolation/resize-mode).
    net, preprocess = _create_empty(name, entry.get("preprocess_cfg"))
    try:
        net.load_state_dict(state_dict, strict=True)
    except RuntimeError as e:
        raise ValueError(_mismatch_message(path, ckpt, name, model, model_config, e)) from None
    net = net.to(device).eval()
    # Remember the name: export() writes the config registered under it.
    net.clip_dcl_model_name = name
    return net, preprocess, open_clip.get_tokenizer(name)


def export(ckpt: str | os.PathLike, out_dir: str | os.PathLike, model: str | None = None,
           model_config: str | os.PathLike | dict | None = None, allow_unsafe_pickle: bool = False,
           force: bool = False) -> Path:
    """Write ``ckpt`` as OpenCLIP's ``local-dir`` layout in ``out_dir`` and return ``out_dir``.

    ``open_clip_config.json`` holds ``model_cfg`` (the architecture config), ``preprocess_cfg``
    (size, mean, std, interpolation, resize_mode) and, for provenance only, ``clip_dcl``
    (model name, source checkpoint); ``open_clip_model.safetensors`` holds the weights.

    Raises:
        ValueError: ``out_dir`` exists and is not empty, unless ``force`` (then the two files are
            overwritten); and the errors of :func:`load_checkpoint`.
    """
    import open_clip
    from safetensors.torch import save_file

    out = Path(out_dir)
    if not force and out.exists():
        if not out.is_dir():
            raise ValueError(f"output {str(out)!r} exists and is not a folder")
        held = sorted(p.name for p in out.iterdir())
        if held:
            raise ValueError(f"output folder {str(out)!r} is not empty (holds {', '.join(held[:3])}"
                             f"{', ...' if len(held) > 3 else ''}); pass --force (force=True) to overwrite")
    net, _, _ = load_checkpoint(ckpt, "cpu", model, model_config, allow_unsafe_pickle)
    if Path(ckpt).is_dir():
        cfg_doc = json.loads((Path(ckpt) / CONFIG_NAME).read_text())
        model_cfg, name = cfg_doc["model_cfg"], cfg_doc.get(CKPT_KEY, {}).get("model")
    else:
        name = net.clip_dcl_model_name
        model_cfg = open_clip.get_model_config(name)
        if model_cfg is None:
            raise ValueError(f"no model config registered for {name!r}")
    pp = dict(getattr(net.visual, "preprocess_cfg", {}) or {})
    preprocess_cfg = {k: pp[k] for k in ("size", "mode", "mean", "std", "interpolation", "resize_mode", "fill_color")
                      if k in pp}
    out.mkdir(parents=True, exist_ok=True)
    doc = {"model_cfg": model_cfg, "preprocess_cfg": preprocess_cfg,
           CKPT_KEY: {"model": name, "source": str(Path(ckpt).absolute())}}
    (out / CONFIG_NAME).write_text(json.dumps(doc, indent=2, default=list) + "\n")
    # Clones: safetensors refuses tensors that share storage.
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in net.state_dict().items()}
    save_file(tensors, str(out / WEIGHTS_NAME))
    log.info("exported %s (%s) to %s", ckpt, name, out)
    return out


def export_main(argv: list[str] | None = None) -> int:
    """``clip-dcl export CKPT OUT_DIR [--model NAME] [--model-config PATH]``."""
    parser = argparse.ArgumentParser(
        prog="clip-dcl export", allow_abbrev=False,
        description="Export a checkpoint to OpenCLIP's local-dir layout "
                    "(open_clip.create_model_and_transforms('local-dir:OUT_DIR') loads it).")
    parser.add_argument("checkpoint", help="trainer checkpoint (epoch_K.pt) or an exported folder")
    parser.add_argument("out_dir", help="folder to write open_clip_config.json and open_clip_model.safetensors to")
    parser.add_argument("--model", default=None,
                        help="OpenCLIP model name, when the checkpoint does not record it")
    parser.add_argument("--model-config", default=None, help="model config JSON for a custom architecture")
    parser.add_argument("--unsafe-pickle", action="store_true",
                        help="load a checkpoint that is not weights-only by full unpickling, which can run code "
                             "from the file: only for files you trust")
    parser.add_argument("--force", action="store_true", help="overwrite an export in a non-empty OUT_DIR")
    args = parser.parse_args(argv)
    try:
        out = export(args.checkpoint, args.out_dir, args.model, args.model_config, args.unsafe_pickle, args.force)
    except ValueError as e:
        print(f"clip-dcl export: {e}", file=sys.stderr)
        return 2
    print(f"exported to {out}; load with open_clip.create_model_and_transforms('local-dir:{out}')")
    return 0
