"""Writing and reading training checkpoints; the files' format is defined here.

A checkpoint is OpenCLIP's dict plus `LOSS_STATE_KEY` (the loss's ``state_dict()`` less a sharded
buffer) and `CKPT_KEY` (`checkpoint_entry`), written under a temporary name and renamed. A sharded loss
buffer is written one file per rank (``loss_state/epoch_N/<buffer>.rank00001-of-00008.state``, not
``.pt``, which ``--resume latest`` would pick), not gathered onto one host.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import io
import logging
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional

import torch

from clip_dcl._version import __version__
from clip_dcl.losses.base import stateful
from clip_dcl.losses.state import digest_of_state_dict, reshard

#: Key under which our training stores the model name and config in a checkpoint.
CKPT_KEY = "clip_dcl"
#: Key under which our training stores the loss's ``state_dict()`` in a checkpoint.
LOSS_STATE_KEY = "loss_state"
#: Key of ``ckpt[CKPT_KEY]`` that says where a sharded loss state's files are: their folder, world
#: size, ``num_samples`` and buffers.
SHARD_INDEX_KEY = "loss_state_shards"
#: Key of ``ckpt[CKPT_KEY]`` that holds a mid-epoch checkpoint's position (`resume_entry`).
RESUME_KEY = "resume"
#: Sub-folder of the checkpoint folder that holds the shard files of a sharded loss state.
SHARD_FOLDER = "loss_state"
#: Suffix of a checkpoint being written; not ``.pt``, so OpenCLIP's ``--resume latest`` (which takes
#: the last ``*.pt`` under the checkpoint folder) never picks a half-written file.
PARTIAL_SUFFIX = ".partial"
#: the prefix ``DistributedDataParallel`` gives every key of the ``state_dict`` of the model it wraps
DDP_PREFIX = "module."
#: How a message says to run the stopped run again with more flags (``{}``); a run that OpenCLIP named after
#: the clock (no ``--name``) adds its name, without which ``--resume latest`` would start another run.
RERUN = "the same command with {}"
#: The settings a mid-epoch checkpoint records, which a resume compares with its own.
RESUME_SETTINGS = ("world_size", "batch_size", "accum_freq", "workers", "seed")


class UnsafeCheckpoint(ValueError):
    """A checkpoint that only loads by full unpickling, which can run arbitrary code."""


class CheckpointUnreadable(ValueError):
    """A checkpoint file that cannot be read (truncated by a killed save, or not a torch file)."""


class CheckpointDiskFull(RuntimeError):
    """No space left for a checkpoint; the message names the file, the intact previous one and how to resume."""


class RunFolderGone(RuntimeError):
    """The run's folder was removed (or moved) while it trained: nothing more can be written there."""

    def __init__(self, path: str):
        folder = os.path.dirname(os.path.dirname(path)) if "checkpoints" in path else os.path.dirname(path)
        super().__init__(
            f"the run folder {folder} was removed while the run trained (writing {path}): its checkpoints and logs "
            "there are gone; start the run again, in a folder nothing else removes"
        )


class LossStateFilesError(RuntimeError):
    """The shard files a checkpoint refers to are missing or do not fit the configured loss."""


# -- what a training checkpoint holds ---------------------------------------------------------------
def checkpoint_entry(
    model: str, model_config: Optional[dict], preprocess_cfg: Optional[dict], loss: str, loss_args: dict
) -> dict:
    """The `CKPT_KEY` entry of a training checkpoint: what a loader needs without the flags."""
    return {
        "model": model,
        "model_config": model_config,
        "preprocess_cfg": preprocess_cfg,
        "loss": loss,
        "loss_args": dict(loss_args),
        "version": __version__,
    }


def trained_model_config(args) -> Optional[dict]:
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
    if getattr(args, "force_context_length", None) is not None:  # OpenCLIP 3.x
        cfg["text_cfg"]["context_length"] = args.force_context_length
    if args.force_custom_text:
        cfg["custom_text"] = True
    return cfg


def training_checkpoint(
    obj: dict, loss, entry: dict, shards: Optional[Path], checkpoint_path: Optional[str], resume: Optional[dict] = None
) -> dict:
    """OpenCLIP's checkpoint dict ``obj`` with ``loss``'s state and ``entry`` (a sharded loss: its shard index)."""
    entry = dict(entry)
    if is_sharded(loss):  # the shards are in files beside (written by every rank)
        if shards is None:
            raise RuntimeError(
                "a checkpoint is saved for an epoch whose loss-state shards were not written "
                "(clip_dcl.train.saving.checkpointed() said it would not be)"
            )
        state = small_state(loss)
        entry[SHARD_INDEX_KEY] = shard_index(loss, shards, checkpoint_path)
    else:
        state = loss.state_dict() if isinstance(loss, torch.nn.Module) else {}
    if resume is not None:
        entry[RESUME_KEY] = resume
    out = dict(obj)
    out[LOSS_STATE_KEY] = {k: v.detach().cpu() for k, v in state.items()}
    out[CKPT_KEY] = entry
    return out


def resume_settings(args, num_batches: Optional[int]) -> dict:
    """The settings a mid-epoch position depends on (`RESUME_SETTINGS` and the epoch's batches)."""
    return {**{k: getattr(args, k) for k in RESUME_SETTINGS}, "num_batches": num_batches}


def resume_entry(epoch: int, step: int, args, num_batches: Optional[int], rng: list, signame: Optional[str]) -> dict:
    """A mid-epoch position: ``step`` optimizer steps of ``epoch``, their settings, every rank's RNG state."""
    return {"epoch": epoch, "step": step, **resume_settings(args, num_batches), "rng": rng, "signal": signame}


def entries_of(ckpt: dict) -> dict:
    """The loss state and the clip_dcl entry of a checkpoint, each None when absent."""
    return {key: ckpt.get(key) for key in (LOSS_STATE_KEY, CKPT_KEY)}


def resume_position(ckpt: dict) -> Optional[dict]:
    """A mid-epoch checkpoint's position (`resume_entry`), or None."""
    entry = ckpt.get(CKPT_KEY)
    return entry.get(RESUME_KEY) if isinstance(entry, dict) else None


def model_keys_for(state_dict: dict, wrapped: bool) -> dict:
    """``state_dict`` with DDP's ``module.`` prefix on all keys (``wrapped``) or on none (OpenCLIP's resume strips
    the prefix for one process but never adds it for several)."""
    bare = state_dict
    if state_dict and all(k.startswith(DDP_PREFIX) for k in state_dict):
        bare = {k[len(DDP_PREFIX) :]: v for k, v in state_dict.items()}
    if not wrapped or not bare:
        return bare
    return {DDP_PREFIX + k: v for k, v in bare.items()}


# -- writing -----------------------------------------------------------------------------------------
def save_checkpoint(obj, f, checkpoint_path: Optional[str], save: Callable, training: bool, rerun: str = RERUN) -> None:
    """Write a checkpoint of the run (atomically for a path); after an epoch's checkpoint,
    remove earlier epochs' mid-epoch files and their shard folders."""
    if not isinstance(f, (str, os.PathLike)):
        save(obj, f)
        return
    save_atomically(obj, f, save, rerun)
    if training and checkpoint_path:  # an epoch's checkpoint supersedes the mid-epoch ones of earlier epochs
        completed = int(obj["epoch"])
        supersede_step_files(checkpoint_path, completed)
        prune_step_folders(checkpoint_path, before_epoch=completed)


def save_step_checkpoint(
    model,
    optimizer,
    scaler,
    epoch: int,
    step: int,
    args,
    loss,
    entry: dict,
    shards: Optional[Path],
    resume: dict,
    save: Callable,
    rerun: str = RERUN,
) -> str:
    """The master: write step ``step`` of ``epoch`` as ``epoch_latest.pt`` (``--save-most-recent``) or
    ``epoch_{epoch}_step_{step}.pt``, remove the earlier mid-epoch file, and return the path."""
    name = "epoch_latest.pt" if args.save_most_recent else f"epoch_{epoch}_step_{step}.pt"
    path = os.path.join(args.checkpoint_path, name)
    original = getattr(model, "_orig_mod", model)  # torch.compile's wrapper: save the model's own keys
    ckpt = {"epoch": epoch, "name": args.name, "state_dict": original.state_dict(), "optimizer": optimizer.state_dict()}
    if scaler is not None:
        ckpt["scaler"] = scaler.state_dict()
    ckpt = training_checkpoint(ckpt, loss, entry, shards, args.checkpoint_path, resume)
    save_atomically(ckpt, path, save, rerun)
    supersede_step_files(args.checkpoint_path, epoch, keep=path)
    prune_step_folders(args.checkpoint_path, keep=shards.name if shards else None)
    return path


def save_atomically(obj, path, save=None, rerun: str = RERUN) -> None:
    """``torch.save`` through ``path + PARTIAL_SUFFIX``, flushed, then renamed; the partial file goes on any
    error (`CheckpointDiskFull` for a full disk, a Ctrl-C torch's writer hid re-raised as such)."""
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
        if isinstance(e, FileNotFoundError) and not os.path.isdir(os.path.dirname(path) or "."):
            raise RunFolderGone(path) from None
        no_space = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
        full = next((c for c in _chain(e) if isinstance(c, OSError) and c.errno in no_space), None)
        if full is not None:
            raise CheckpointDiskFull(_disk_full_message(obj, path, full, rerun)) from e
        if not isinstance(e, KeyboardInterrupt) and any(isinstance(c, KeyboardInterrupt) for c in _chain(e)):
            raise KeyboardInterrupt from None
        raise


def remove_stale_partials(folder) -> list:
    """Remove the partial files a killed save left under ``folder`` (not links; only where no save can be
    running) and return their paths."""
    removed = []
    for path in sorted(glob.glob(os.path.join(os.fspath(folder), "**", "*" + PARTIAL_SUFFIX), recursive=True)):
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
            removed.append(path)
    return removed


def _chain(err: Optional[BaseException]):
    """``err`` and the errors it was raised from or during (torch's writer wraps a full disk in a RuntimeError,
    and hides a Ctrl-C)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def _payload_bytes(obj) -> int:
    """The bytes of the tensors in ``obj`` (dicts, lists and tuples walked): about what the file needs."""
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


def _disk_full_message(obj, path: str, err: OSError, rerun: str = RERUN) -> str:
    from open_clip_train.main import natural_key  # the order OpenCLIP's --resume latest picks in

    folder = os.path.dirname(os.path.abspath(path))
    need = _payload_bytes(obj)
    try:
        free = f"{_size(shutil.disk_usage(folder).free)} free"
    except OSError:
        free = "free space unknown"
    needs = f"it needs about {_size(need)}, {free} on that disk" if need else free
    parts = Path(folder).parts  # a shard's folder is under the checkpoints' (CHECKPOINTS/loss_state/epoch_N)
    checkpoints = str(Path(*parts[: parts.index(SHARD_FOLDER)])) if SHARD_FOLDER in parts else folder
    others = sorted(glob.glob(os.path.join(checkpoints, "**", "*.pt"), recursive=True), key=natural_key)
    newest = others[-1] if others else None
    if newest:
        previous = (
            f"the previous checkpoint, {newest}, is intact (the partial file was removed). Free "
            f"space, then run {rerun.format(f'--resume latest (or --resume {newest})')}"
        )
    else:
        previous = (
            "the partial file was removed; there is no earlier checkpoint in that folder, so the run "
            "would start over. Free space (or give --logs another disk) and run it again"
        )
    return (
        f"cannot write checkpoint {path}: the disk is full ({err.strerror or err}); {needs}. "
        f"{previous[0].upper()}{previous[1:]}."
    )


def supersede_step_files(checkpoint_path: str, completed_epoch: int, keep: Optional[str] = None) -> None:
    """Remove the mid-epoch checkpoints of epochs before ``completed_epoch``; with ``keep``, all others."""
    for old in glob.glob(os.path.join(checkpoint_path, "epoch_*_step_*.pt")):
        m = re.fullmatch(r"epoch_(\d+)_step_\d+\.pt", os.path.basename(old))
        if old != keep and m and (keep is not None or int(m.group(1)) < completed_epoch):
            with contextlib.suppress(OSError):
                os.remove(old)


# -- reading -----------------------------------------------------------------------------------------
def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def read_checkpoint(path, allow_unsafe_pickle: bool = False, mmap: bool = False):
    """The object in a checkpoint file, loaded weights-only on the CPU (``mmap``: memory-mapped); raises
    `CheckpointUnreadable`, or `UnsafeCheckpoint` when it needs full unpickling not allowed."""
    try:
        return _torch_load(Path(path), allow_unsafe_pickle, mmap)
    except UnsafeCheckpoint:
        raise
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise CheckpointUnreadable(
            f"checkpoint {str(path)!r} cannot be read; it is truncated (a save that was "
            f"interrupted?) or not a torch checkpoint ({_first_line(e)})"
        ) from None


def asks_for_objects(path) -> bool:
    """Whether ``path`` holds a pickle (torch's zip format or plain pickles) that names Python objects to build,
    read with :mod:`pickletools` (nothing is built or run): such a file earns the ``--unsafe-pickle`` hint, random
    bytes do not."""
    import pickletools
    import zipfile

    named = {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "REDUCE"}
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                pickles = [io.BytesIO(z.read(n)) for n in z.namelist() if n.endswith(".pkl")]
        else:
            pickles = [open(path, "rb")]
    except (OSError, zipfile.BadZipFile):
        return False
    for stream in pickles:
        with stream:
            try:
                while True:  # the consecutive pickles of a file, until one is not a pickle
                    if any(op.name in named for op, _, _ in pickletools.genops(stream)):
                        return True
            except Exception:  # noqa: BLE001 - the end of the pickles (or none at all)
                continue
    return False


def _torch_load(path: Path, allow_unsafe_pickle: bool = False, mmap: bool = False):
    """``torch.load`` weights-only; full unpickling (which can run code) only when ``allow_unsafe_pickle``."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        text = str(e)
        reason = text.splitlines()[0]
        if not asks_for_objects(path):  # bytes that are no pickle of objects: not a checkpoint, nothing to trust
            detail = text.split("WeightsUnpickler error:", 1)[-1].strip().splitlines()[0] if text.strip() else reason
            raise CheckpointUnreadable(f"{str(path)!r} is not a checkpoint (it does not unpickle: {detail})") from None
    if allow_unsafe_pickle:  # the caller's explicit opt-in: the file is trusted
        logging.getLogger(__name__).warning(
            "%s: weights-only load failed (%s); fully unpickling it as asked (allow_unsafe_pickle)", path, reason
        )
        return torch.load(path, map_location="cpu", weights_only=False)
    raise UnsafeCheckpoint(
        f"checkpoint {str(path)!r} does not load as weights only ({reason}); loading it would unpickle "
        "arbitrary objects, which can run code. If you trust the file, pass allow_unsafe_pickle=True "
        "(--unsafe-pickle on the command line)"
    )


class Resumable(NamedTuple):
    checkpoint: object
    path: str  #: the file it was read from (an older one when the newest is torn)


def load_resumable(path, map_location, resume_latest: bool, checkpoint_path: Optional[str], pt_load) -> Resumable:
    """OpenCLIP's ``pt_load`` of ``path``; on ``--resume latest``, the newest checkpoint that loads, with a
    warning for each torn one passed over. Raises `CheckpointUnreadable` when none can be read."""
    from open_clip_train.main import natural_key  # the order OpenCLIP's --resume latest picks in

    unreadable = (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError)
    if os.path.isdir(path):  # checked with the flags too; here for callers from Python
        raise CheckpointUnreadable(
            f"--resume {path} is a folder, not a checkpoint file: give a file in it (epoch_N.pt) or --resume latest"
        ) from None
    try:
        return Resumable(pt_load(path, map_location=map_location), path)
    except unreadable as e:
        if not resume_latest:
            raise CheckpointUnreadable(
                f"--resume {path}: the checkpoint cannot be read; it is truncated (a save that was "
                f"interrupted?) or not a torch checkpoint ({_first_line(e)})"
            ) from None
        failed = [(path, _first_line(e))]
    folder = checkpoint_path or os.path.dirname(path)
    older = sorted(glob.glob(os.path.join(folder, "**", "*.pt"), recursive=True), key=natural_key)
    older = [c for c in older if natural_key(c) < natural_key(path)]
    for candidate in reversed(older):
        logging.warning(
            f"--resume latest: {failed[-1][0]} cannot be read ({failed[-1][1]}); trying the "
            f"previous checkpoint, {candidate}."
        )
        try:
            return Resumable(pt_load(candidate, map_location=map_location), candidate)
        except unreadable as e:
            failed.append((candidate, _first_line(e)))
    raise CheckpointUnreadable(
        f"--resume latest: no checkpoint under {folder} can be read ("
        f"{'; '.join(f'{p}: {why}' for p, why in failed)}); remove the torn files, or start without --resume"
    )


# -- the sharded loss state's files ------------------------------------------------------------------
def is_sharded(loss) -> bool:
    """Whether ``loss`` keeps a buffer split over the ranks."""
    owner = stateful(loss)
    return owner is not None and bool(owner.sharded_buffers())


def small_state(loss) -> Dict[str, torch.Tensor]:
    """The loss state that goes into the master's checkpoint: all but the sharded buffers."""
    owner = stateful(loss)
    sharded = {b.name for b in owner.sharded_buffers()} if owner is not None else set()
    return {k: v for k, v in loss.state_dict().items() if k not in sharded}


def shard_index(loss, folder: Path, checkpoint_path: str) -> Dict[str, object]:
    """The shard index (`SHARD_INDEX_KEY` of the checkpoint's entry) for shards in ``folder``."""
    owner = stateful(loss)
    sharded = owner.sharded_buffers()
    return {
        "folder": os.path.relpath(folder, Path(checkpoint_path)),
        "world_size": owner.world_size,
        "num_samples": sharded[0].shape[-1],
        "buffers": [b.name for b in sharded],
    }


def shard_path(folder: Path, rank: int, world_size: int, name: str) -> Path:
    return Path(folder) / f"{name}.rank{rank:05d}-of-{world_size:05d}.state"


def epoch_folder(checkpoint_path: str, epoch: int) -> Path:
    """The shard folder of the checkpoint OpenCLIP writes after ``epoch`` (1-based) epochs."""
    return Path(checkpoint_path) / SHARD_FOLDER / f"epoch_{epoch}"


def step_folder(checkpoint_path: str, epoch: int, step: int) -> Path:
    """The shard folder of the mid-epoch checkpoint of step ``step`` of ``epoch``."""
    return Path(checkpoint_path) / SHARD_FOLDER / f"epoch_{epoch}_step_{step}"


def save_loss_shard(path, name: str, tensor, rank: int, world_size: int, num_samples: int) -> None:
    """Write one rank's shard of the loss buffer ``name`` atomically, with its rank, world size and size."""
    save_atomically(
        {name: tensor.detach().cpu(), "rank": rank, "world_size": world_size, "num_samples": num_samples}, path
    )


def load_loss_shard(path, name: str):
    """The buffer ``name`` of a shard file, memory-mapped."""
    return torch.load(path, map_location="cpu", mmap=True, weights_only=True)[name]


def numbered(args, completed_epoch: int) -> bool:
    """Whether the run writes ``epoch_{completed_epoch}.pt``: every ``--save-frequency`` epochs, and the last."""
    return completed_epoch == args.epochs or (args.save_frequency > 0 and completed_epoch % args.save_frequency == 0)


def checkpointed(args, completed_epoch: int) -> bool:
    """Whether the run writes a checkpoint after ``completed_epoch`` (numbered, or ``epoch_latest.pt``)."""
    if not (args.logs and str(args.logs).lower() != "none" and getattr(args, "checkpoint_path", None)):
        return False
    return numbered(args, completed_epoch) or bool(args.save_most_recent)


def _kept(args, epoch: int) -> bool:
    """Whether ``epoch_{epoch}.pt`` stays for good."""
    return not args.delete_previous_checkpoint and numbered(args, epoch)


def prune_epoch_shards(args, rank: int, world_size: int, completed_epoch: int) -> None:
    """Remove this rank's shards of epochs before the previous one whose checkpoint OpenCLIP does not keep."""
    for folder in (Path(args.checkpoint_path) / SHARD_FOLDER).glob("epoch_*"):
        m = re.fullmatch(r"epoch_(\d+)", folder.name)
        if not m or int(m.group(1)) >= completed_epoch - 1 or _kept(args, int(m.group(1))):
            continue
        for path in folder.glob(f"*.rank{rank:05d}-of-{world_size:05d}.state"):
            path.unlink(missing_ok=True)
        try:
            folder.rmdir()  # by whichever rank removes the last shard
        except OSError:
            pass


def prune_step_folders(checkpoint_path: str, keep: Optional[str] = None, before_epoch: Optional[int] = None) -> None:
    """Remove mid-epoch shard folders: all but ``keep``, or those of epochs before ``before_epoch``."""
    for folder in (Path(checkpoint_path) / SHARD_FOLDER).glob("epoch_*_step_*"):
        m = re.fullmatch(r"epoch_(\d+)_step_(\d+)", folder.name)
        if not m or folder.name == keep or (before_epoch is not None and int(m.group(1)) >= before_epoch):
            continue
        shutil.rmtree(folder, ignore_errors=True)


def shard_sources(index: Dict[str, object], ckpt_path: str, name: str) -> List[tuple]:
    """``(rank, world_size, load)`` of every saved shard of ``name``; `LossStateFilesError` if one is missing."""
    folder = Path(ckpt_path).parent / str(index["folder"])
    world = int(index["world_size"])
    paths = [shard_path(folder, r, world, name) for r in range(world)]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise LossStateFilesError(
            f"{ckpt_path} keeps its loss state in {folder}, but {missing[0]} is missing "
            f"({len(missing)} of {world} shard files): copy the folder with the checkpoint"
        )

    def loader(path: Path):
        return lambda: load_loss_shard(path, name)

    return [(r, world, loader(p)) for r, p in enumerate(paths)]


def read_loss_state(ckpt_path) -> Dict[str, torch.Tensor]:
    """The whole loss state of a checkpoint, a sharded buffer reassembled (O(num_samples) memory: not for resuming)."""
    ckpt = read_checkpoint(ckpt_path)
    state = dict(ckpt.get(LOSS_STATE_KEY) or {})
    index = dict(ckpt.get(CKPT_KEY) or {}).get(SHARD_INDEX_KEY)
    for name in (index or {}).get("buffers", []):
        n = int(index["num_samples"])
        sources = shard_sources(index, str(ckpt_path), name)
        first = sources[0][2]()
        out = torch.empty(first.shape[0], n, dtype=first.dtype)
        state[name] = reshard(sources, n, 0, 1, out)
    return state


def loss_state_digest(loss) -> str:
    """Digest of a loss's whole state (collective when sharded) or of a ``state_dict``; equal for equal states."""
    if isinstance(loss, dict):
        return digest_of_state_dict(loss)
    owner = stateful(loss)
    return owner.state_digest() if owner is not None else digest_of_state_dict(loss.state_dict())
