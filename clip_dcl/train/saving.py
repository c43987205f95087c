"""Writing and reading training checkpoints: the one module the run, its loss state and preemption save
and load through (the file format is :mod:`clip_dcl.checkpoint`'s).

It adds the loss state and clip-dcl's entry to OpenCLIP's checkpoint dict (:func:`with_entries`),
writes a mid-epoch checkpoint (:func:`save_step_checkpoint`, on a stop signal or a timer), replaces an
epoch's mid-epoch files once the epoch's checkpoint is written (:func:`supersede_step_files`), loads
the checkpoint to resume (:func:`load_resumable`, passing over a torn file on ``--resume latest``) and
restores the loss state (:func:`restore_loss_state`), and keeps the sharded loss state:

**Sharded loss state**: one file per rank beside OpenCLIP's checkpoint.

OpenCLIP's ``main`` saves ``epoch_N.pt`` / ``epoch_latest.pt`` on the master rank only, so a
buffer that is split over the ranks (a :class:`~clip_dcl.losses.base.StatefulLoss` buffer declared
``sharded``, such as DeCL's ``--decl-state sharded`` on more than one rank) cannot
go into that file without gathering it onto one host. Instead, at the end of every epoch that
OpenCLIP will checkpoint, every rank writes its own shard::

    CHECKPOINTS/loss_state/epoch_N/<buffer>.rank00001-of-00008.state

(written to a temporary name and renamed by :func:`clip_dcl.checkpoint.save_loss_shard`, which
owns the files' format as it owns the checkpoint's; ``.state``, not ``.pt``, so that OpenCLIP's
``--resume latest``, which takes the last ``*.pt`` under the folder, never picks one). The master's
checkpoint keeps the loss's small buffers with its loss state and, in its shard index
(:data:`clip_dcl.checkpoint.SHARD_INDEX_KEY`), where the shards are (relative to the checkpoint's
folder), their world size and ``num_samples``.

On resume each rank builds its own shard from the saved ones, for any new world size (or a
replicated buffer), memory-mapping one saved shard at a time (:func:`clip_dcl.losses.state.reshard`),
so no rank ever holds the whole buffer. The folder must be visible to every rank, as OpenCLIP's
resume already requires of the checkpoint itself. Shards of epochs whose checkpoint OpenCLIP does
not keep are deleted one epoch later (the previous epoch's stay until the next checkpoint is safely
written). Which epochs OpenCLIP checkpoints and keeps is its own rule (``--save-frequency``,
``--delete-previous-checkpoint``, ``--save-most-recent``), restated in :func:`checkpointed` and
:func:`_kept`; :mod:`clip_dcl.train.upstream` checks that OpenCLIP's ``main`` still has it.
"""
from __future__ import annotations

import contextlib
import glob
import logging
import os
import pickle
import re
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional

import torch

from clip_dcl import checkpoint as ckpt_format
from clip_dcl.losses.base import stateful
from clip_dcl.losses.state import digest_of_state_dict, reshard, shard_size

#: sub-folder of the checkpoint folder that holds the shards
FOLDER = ckpt_format.SHARD_FOLDER
#: key of the shard index in the checkpoint's ``clip_dcl`` entry (the checkpoint format's)
INDEX_KEY = ckpt_format.SHARD_INDEX_KEY


class LossStateFilesError(RuntimeError):
    """The shard files a checkpoint refers to are missing or do not fit the configured loss."""


def is_sharded(loss) -> bool:
    """Whether ``loss`` keeps a buffer split over the ranks (its :class:`~clip_dcl.losses.base.StatefulLoss`
    layout says so)."""
    owner = stateful(loss)
    return owner is not None and bool(owner.sharded_buffers())


def shard_path(folder: Path, rank: int, world_size: int, name: str) -> Path:
    return Path(folder) / f"{name}.rank{rank:05d}-of-{world_size:05d}.state"


def loss_state_digest(loss) -> str:
    """Digest of a live loss's whole state (collective for a sharded buffer), or of a ``state_dict``.

    The same value for the same state however it is held: see :mod:`clip_dcl.losses.state`.
    """
    if isinstance(loss, dict):
        return digest_of_state_dict(loss)
    owner = stateful(loss)
    return owner.state_digest() if owner is not None else digest_of_state_dict(loss.state_dict())


def epoch_folder(checkpoint_path: str, epoch: int) -> Path:
    return Path(checkpoint_path) / FOLDER / f"epoch_{epoch}"


def checkpointed(args, completed_epoch: int) -> bool:
    """Whether OpenCLIP's ``main`` writes a checkpoint after ``completed_epoch`` (its own conditions)."""
    if not (args.logs and str(args.logs).lower() != "none" and getattr(args, "checkpoint_path", None)):
        return False
    numbered = completed_epoch == args.epochs or (args.save_frequency > 0 and completed_epoch % args.save_frequency == 0)
    return numbered or bool(args.save_most_recent)


def _kept(args, epoch: int) -> bool:
    """Whether OpenCLIP keeps ``epoch_{epoch}.pt`` for good."""
    if args.delete_previous_checkpoint:
        return False
    return epoch == args.epochs or (args.save_frequency > 0 and epoch % args.save_frequency == 0)


def write_shards(loss, args, completed_epoch: int) -> Optional[Path]:
    """Every rank: write this rank's shard for ``completed_epoch`` if OpenCLIP checkpoints it.

    Collective when distributed (a barrier after writing, so that the master's checkpoint is written
    only once every shard is complete). Returns the epoch's folder, or None when nothing is written.
    """
    if not (is_sharded(loss) and checkpointed(args, completed_epoch)):
        return None
    folder = epoch_folder(args.checkpoint_path, completed_epoch)
    _save_shard(loss, folder)
    _prune(args, loss.rank, loss.world_size, completed_epoch)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
    return folder


def _save_shard(loss, folder: Path) -> None:
    """Write this rank's shard of the loss state into ``folder`` (atomically: a temporary file renamed)."""
    folder.mkdir(parents=True, exist_ok=True)
    owner = stateful(loss)
    state = owner.state_dict()
    for buf in owner.sharded_buffers():
        ckpt_format.save_loss_shard(shard_path(folder, owner.rank, owner.world_size, buf.name), buf.name,
                                    state[buf.name], owner.rank, owner.world_size, buf.shape[-1])


def write_step_shards(loss, args, epoch: int, step: int) -> Optional[Path]:
    """Every rank: write this rank's shard for a mid-epoch checkpoint (step ``step`` of ``epoch``).

    Written to ``loss_state/epoch_{epoch}_step_{step}`` (whatever OpenCLIP's epoch-end conditions);
    collective when distributed, as :func:`write_shards`. None when the loss is not sharded.
    """
    if not is_sharded(loss):
        return None
    folder = Path(args.checkpoint_path) / FOLDER / f"epoch_{epoch}_step_{step}"
    _save_shard(loss, folder)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
    return folder


def prune_step_folders(checkpoint_path: str, keep: Optional[str] = None, before_epoch: Optional[int] = None) -> None:
    """Remove the shard folders of mid-epoch checkpoints: all but ``keep`` (a folder name), or only
    those of epochs before ``before_epoch``."""
    import shutil

    for folder in (Path(checkpoint_path) / FOLDER).glob("epoch_*_step_*"):
        m = re.fullmatch(r"epoch_(\d+)_step_(\d+)", folder.name)
        if not m or folder.name == keep or (before_epoch is not None and int(m.group(1)) >= before_epoch):
            continue
        shutil.rmtree(folder, ignore_errors=True)


def _prune(args, rank: int, world_size: int, completed_epoch: int) -> None:
    root = Path(args.checkpoint_path) / FOLDER
    for folder in root.glob("epoch_*"):
        m = re.fullmatch(r"epoch_(\d+)", folder.name)
        if not m or int(m.group(1)) >= completed_epoch - 1 or _kept(args, int(m.group(1))):
            continue
        for path in folder.glob(f"*.rank{rank:05d}-of-{world_size:05d}.state"):
            path.unlink(missing_ok=True)
        try:
            folder.rmdir()  # by whichever rank removes the last shard
        except OSError:
            pass


def shard_index(loss, folder: Path, checkpoint_path: str) -> Dict[str, object]:
    """The shard index (:data:`INDEX_KEY` of the checkpoint's entry) for shards in ``folder``."""
    owner = stateful(loss)
    sharded = owner.sharded_buffers()
    return {"folder": os.path.relpath(folder, Path(checkpoint_path)), "world_size": owner.world_size,
            "num_samples": sharded[0].shape[-1], "buffers": [b.name for b in sharded]}


def small_state(loss) -> Dict[str, torch.Tensor]:
    """The loss state that goes into the master's checkpoint: all but the sharded buffers."""
    owner = stateful(loss)
    sharded = {b.name for b in owner.sharded_buffers()} if owner is not None else set()
    return {k: v for k, v in loss.state_dict().items() if k not in sharded}


def _sources(index: Dict[str, object], ckpt_path: str, name: str) -> List[tuple]:
    folder = Path(ckpt_path).parent / str(index["folder"])
    world = int(index["world_size"])
    paths = [shard_path(folder, r, world, name) for r in range(world)]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise LossStateFilesError(f"{ckpt_path} keeps its loss state in {folder}, but {missing[0]} is missing "
                                  f"({len(missing)} of {world} shard files): copy the folder with the checkpoint")

    def loader(path: Path):
        return lambda: ckpt_format.load_loss_shard(path, name)

    return [(r, world, loader(p)) for r, p in enumerate(paths)]


def restore_sharded(loss, state: Dict[str, torch.Tensor], index: Dict[str, object], ckpt_path: str,
                    grow: bool = False) -> dict:
    """``state`` completed with this rank's part of the saved shards (built one saved shard at a time).

    ``grow`` (``--decl-grow-state``): the saved shards hold fewer ids than the loss; the ids beyond
    them start unvisited (NaN, as a fresh buffer's).
    """
    owner = stateful(loss)
    layout = {b.name: b for b in owner.state_buffers()}
    saved_n = int(index["num_samples"])
    out_state = dict(state)
    for name in index.get("buffers", []):
        buf = layout.get(name)
        if buf is None or not buf.per_sample:
            raise LossStateFilesError(f"{ckpt_path} keeps a sharded buffer {name!r} that this loss does not have")
        num_samples = buf.shape[-1]
        if saved_n != num_samples and not (grow and saved_n < num_samples):
            raise LossStateFilesError(f"{ckpt_path} holds DeCL rates for num_samples={saved_n}, but this run has "
                                      f"--decl-num-samples {num_samples}")
        rank, world = (owner.rank, owner.world_size) if buf.sharded else (0, 1)
        out = torch.full((*buf.shape[:-1], shard_size(num_samples, rank, world)), float("nan"), dtype=buf.dtype)
        # a shard's ids rise with its columns, so the saved ids are its first shard_size(saved_n, ...) columns
        try:
            reshard(_sources(index, ckpt_path, name), saved_n, rank, world, out[:, :shard_size(saved_n, rank, world)])
        except ValueError as e:
            raise LossStateFilesError(f"the loss state files of {ckpt_path}: {e}") from None
        out_state[name] = out
    return out_state


def grown_state(loss, state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """``state`` with its whole per-sample table widened to the loss's ``num_samples`` ids, the new ones
    unvisited (NaN, as a fresh buffer's); the loss then takes its own columns as from any table."""
    owner = stateful(loss)
    buf = owner.per_sample_buffer() if owner is not None else None
    table = state.get(buf.name) if buf is not None else None
    if table is None or table.shape[1] >= buf.shape[-1]:
        return state
    fresh = torch.full((table.shape[0], buf.shape[-1] - table.shape[1]), float("nan"), dtype=table.dtype)
    return {**state, buf.name: torch.cat([table, fresh], dim=1)}


def read_loss_state(ckpt_path: str | os.PathLike) -> Dict[str, torch.Tensor]:
    """The whole loss state of a training checkpoint, with a sharded buffer reassembled.

    ``O(num_samples)`` host memory: for inspection and tests, not for resuming (which never
    assembles it).
    """
    state, entry = ckpt_format.read_training_state(ckpt_path)
    index = entry.get(INDEX_KEY)
    for name in (index or {}).get("buffers", []):
        n = int(index["num_samples"])
        sources = _sources(index, str(ckpt_path), name)
        first = sources[0][2]()
        out = torch.empty(first.shape[0], n, dtype=first.dtype)
        state[name] = reshard(sources, n, 0, 1, out)
    return state



# -- the run's checkpoint files --------------------------------------------------------------------
class Resumable(NamedTuple):
    checkpoint: object
    path: str  #: the file it was read from (an older one when the newest is torn)


def load_resumable(path, map_location, resume_latest: bool, checkpoint_path: Optional[str], pt_load) -> Resumable:
    """OpenCLIP's ``pt_load`` (``pt_load``) of ``path``; on ``--resume latest`` (``resume_latest``), the newest
    checkpoint that loads, from ``path`` down, with a warning for each one passed over.

    A save killed halfway (by OpenCLIP before 3.3's own saves, or another tool) leaves a torn
    ``*.pt`` that OpenCLIP's ``--resume latest`` would pick and die on.

    Raises:
        clip_dcl.checkpoint.CheckpointUnreadable: ``path`` is a folder, or no candidate can be read.
    """
    from open_clip_train.main import natural_key  # the order OpenCLIP's --resume latest picks in

    unreadable = (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError)
    if os.path.isdir(path):  # checked with the flags too; here for callers from Python
        raise ckpt_format.CheckpointUnreadable(
            f"--resume {path} is a folder, not a checkpoint file: give a file in it (epoch_N.pt) or "
            "--resume latest") from None
    try:
        return Resumable(pt_load(path, map_location=map_location), path)
    except unreadable as e:
        if not resume_latest:
            raise ckpt_format.CheckpointUnreadable(
                f"--resume {path}: the checkpoint cannot be read; it is truncated (a save that was "
                f"interrupted?) or not a torch checkpoint ({ckpt_format._first_line(e)})") from None
        failed = [(path, ckpt_format._first_line(e))]
    folder = checkpoint_path or os.path.dirname(path)
    older = sorted(glob.glob(os.path.join(folder, "**", "*.pt"), recursive=True), key=natural_key)
    older = [c for c in older if natural_key(c) < natural_key(path)]
    for candidate in reversed(older):
        logging.warning(f"--resume latest: {failed[-1][0]} cannot be read ({failed[-1][1]}); trying the "
                        f"previous checkpoint, {candidate}.")
        try:
            return Resumable(pt_load(candidate, map_location=map_location), candidate)
        except unreadable as e:
            failed.append((candidate, ckpt_format._first_line(e)))
    raise ckpt_format.CheckpointUnreadable(
        f"--resume latest: no checkpoint under {folder} can be read ("
        f"{'; '.join(f'{p}: {why}' for p, why in failed)}); remove the torn files, or start without --resume")


def supersede_step_files(checkpoint_path: str, completed_epoch: int, keep: Optional[str] = None) -> None:
    """Remove the mid-epoch checkpoints (and their shard folders) that a newer checkpoint supersedes: those
    of epochs before ``completed_epoch``; with ``keep`` (a just-written mid-epoch file), every other one."""
    for old in glob.glob(os.path.join(checkpoint_path, "epoch_*_step_*.pt")):
        m = re.fullmatch(r"epoch_(\d+)_step_\d+\.pt", os.path.basename(old))
        if old != keep and m and (keep is not None or int(m.group(1)) < completed_epoch):
            with contextlib.suppress(OSError):
                os.remove(old)
