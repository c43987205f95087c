"""Sharded loss state in training checkpoints: one file per rank beside OpenCLIP's checkpoint.

OpenCLIP's ``main`` saves ``epoch_N.pt`` / ``epoch_latest.pt`` on the master rank only, so a
buffer that is split over the ranks (DeCL's ``--decl-state sharded`` on more than one rank) cannot
go into that file without gathering it onto one host. Instead, at the end of every epoch that
OpenCLIP will checkpoint, every rank writes its own shard::

    CHECKPOINTS/loss_state/epoch_N/log_rate.rank00001-of-00008.state

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
written).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, List, Optional

import torch

from clip_dcl import checkpoint as ckpt_format
from clip_dcl.losses.state import reshard, shard_size

#: sub-folder of the checkpoint folder that holds the shards
FOLDER = ckpt_format.SHARD_FOLDER
#: key of the shard index in the checkpoint's ``clip_dcl`` entry (the checkpoint format's)
INDEX_KEY = ckpt_format.SHARD_INDEX_KEY
#: the sharded buffer (its other buffers are small and stay in the checkpoint)
SHARDED = "log_rate"


class LossStateFilesError(RuntimeError):
    """The shard files a checkpoint refers to are missing or do not fit the configured loss."""


def is_sharded(loss) -> bool:
    return bool(getattr(loss, "sharded", False))


def shard_path(folder: Path, rank: int, world_size: int) -> Path:
    return Path(folder) / f"{SHARDED}.rank{rank:05d}-of-{world_size:05d}.state"


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
    ckpt_format.save_loss_shard(shard_path(folder, loss.rank, loss.world_size), SHARDED, getattr(loss, SHARDED),
                                loss.rank, loss.world_size, loss.num_samples)


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
        shard_path(folder, rank, world_size).unlink(missing_ok=True)
        try:
            folder.rmdir()  # by whichever rank removes the last shard
        except OSError:
            pass


def shard_index(loss, folder: Path, checkpoint_path: str) -> Dict[str, object]:
    """The shard index (:data:`INDEX_KEY` of the checkpoint's entry) for shards in ``folder``."""
    return {"folder": os.path.relpath(folder, Path(checkpoint_path)), "world_size": loss.world_size,
            "num_samples": loss.num_samples, "buffers": [SHARDED]}


def small_state(loss) -> Dict[str, torch.Tensor]:
    """The loss state that goes into the master's checkpoint: all but the sharded buffer."""
    return {k: v for k, v in loss.state_dict().items() if k != SHARDED}


def _sources(index: Dict[str, object], ckpt_path: str) -> List[tuple]:
    folder = Path(ckpt_path).parent / str(index["folder"])
    world = int(index["world_size"])
    paths = [shard_path(folder, r, world) for r in range(world)]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise LossStateFilesError(f"{ckpt_path} keeps its loss state in {folder}, but {missing[0]} is missing "
                                  f"({len(missing)} of {world} shard files): copy the folder with the checkpoint")

    def loader(path: Path):
        return lambda: ckpt_format.load_loss_shard(path, SHARDED)

    return [(r, world, loader(p)) for r, p in enumerate(paths)]


def restore_sharded(loss, state: Dict[str, torch.Tensor], index: Dict[str, object], ckpt_path: str,
                    grow: bool = False) -> dict:
    """``state`` completed with this rank's part of the saved shards (built one saved shard at a time).

    ``grow`` (``--decl-grow-state``): the saved shards hold fewer ids than the loss; the ids beyond
    them start unvisited (NaN, as a fresh buffer's).
    """
    saved_n = int(index["num_samples"])
    if saved_n != loss.num_samples and not (grow and saved_n < loss.num_samples):
        raise LossStateFilesError(f"{ckpt_path} holds DeCL rates for num_samples={saved_n}, but this run has "
                                  f"--decl-num-samples {loss.num_samples}")
    rank, world = (loss.rank, loss.world_size) if is_sharded(loss) else (0, 1)
    dtype = getattr(loss, SHARDED).dtype
    out = torch.full((2, shard_size(loss.num_samples, rank, world)), float("nan"), dtype=dtype)
    # a shard's ids rise with its columns, so the saved ids are its first shard_size(saved_n, ...) columns
    try:
        reshard(_sources(index, ckpt_path), saved_n, rank, world, out[:, :shard_size(saved_n, rank, world)])
    except ValueError as e:
        raise LossStateFilesError(f"the loss state files of {ckpt_path}: {e}") from None
    return {**state, SHARDED: out}


def grown_state(loss, state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """``state`` with its whole ``(2, saved)`` table widened to the loss's ``num_samples`` ids, the new
    ones unvisited (NaN, as a fresh buffer's); the loss then takes its own columns as from any table."""
    table = state.get(SHARDED)
    if table is None or table.shape[1] >= loss.num_samples:
        return state
    fresh = torch.full((table.shape[0], loss.num_samples - table.shape[1]), float("nan"), dtype=table.dtype)
    return {**state, SHARDED: torch.cat([table, fresh], dim=1)}


def read_loss_state(ckpt_path: str | os.PathLike) -> Dict[str, torch.Tensor]:
    """The whole loss state of a training checkpoint, with a sharded buffer reassembled.

    ``O(num_samples)`` host memory: for inspection and tests, not for resuming (which never
    assembles it).
    """
    state, entry = ckpt_format.read_training_state(ckpt_path)
    index = entry.get(INDEX_KEY)
    if index:
        n = int(index["num_samples"])
        sources = _sources(index, str(ckpt_path))
        out = torch.empty(2, n, dtype=sources[0][2]().dtype)
        state[SHARDED] = reshard(sources, n, 0, 1, out)
    return state

