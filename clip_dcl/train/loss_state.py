"""This rank's part of a sharded loss state: written to, and rebuilt from, the shard files of
`clip_dcl.train.saving` (which says why and where), for any world size on resume.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Dict, Optional, Set

import torch

from clip_dcl.losses.base import stateful
from clip_dcl.losses.state import reshard, shard_size

from . import saving


def write_shards(loss, args, completed_epoch: int, fresh: Optional[Set[Path]] = None) -> Optional[Path]:
    """Every rank (collective, so the master's checkpoint follows complete shards): write this rank's shard for
    ``completed_epoch`` if OpenCLIP checkpoints it; the folder (added to ``fresh`` if made here) or None."""
    if not (saving.is_sharded(loss) and saving.checkpointed(args, completed_epoch)):
        return None
    folder = saving.epoch_folder(args.checkpoint_path, completed_epoch)
    _write(loss, folder, fresh)
    saving.prune_epoch_shards(args, loss.rank, loss.world_size, completed_epoch)
    _barrier()
    return folder


def write_step_shards(loss, args, epoch: int, step: int, fresh: Optional[Set[Path]] = None) -> Optional[Path]:
    """Every rank: write this rank's shard for the mid-epoch checkpoint of step ``step`` (collective)."""
    if not saving.is_sharded(loss):
        return None
    folder = saving.step_folder(args.checkpoint_path, epoch, step)
    _write(loss, folder, fresh)
    _barrier()
    return folder


def _write(loss, folder: Path, fresh: Optional[Set[Path]]) -> None:
    if fresh is not None:
        made = not folder.exists()
        _barrier()  # every rank looks before any rank writes
        if made:
            fresh.add(folder)
    _save_shard(loss, folder)


def drop_unsaved(folder: Optional[Path], fresh: Set[Path]) -> None:
    """The master: remove ``folder`` when its checkpoint was not written and this run made it (in ``fresh``)."""
    if folder is None or folder not in fresh:
        return
    fresh.discard(folder)
    shutil.rmtree(folder, ignore_errors=True)
    logging.info(f"Removed {folder}: the loss-state shards of the checkpoint that was not written.")


def _barrier() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def _save_shard(loss, folder: Path) -> None:
    """Write this rank's shard of the loss state into ``folder`` (atomically: a temporary file renamed)."""
    folder.mkdir(parents=True, exist_ok=True)
    owner = stateful(loss)
    state = owner.state_dict()
    for buf in owner.sharded_buffers():
        saving.save_loss_shard(
            saving.shard_path(folder, owner.rank, owner.world_size, buf.name),
            buf.name,
            state[buf.name],
            owner.rank,
            owner.world_size,
            buf.shape[-1],
        )


def restore_sharded(
    loss, state: Dict[str, torch.Tensor], index: Dict[str, object], ckpt_path: str, grow: bool = False
) -> dict:
    """``state`` completed with this rank's part of the saved shards, one at a time (`LossStateFilesError` for a
    missing or unfitting one); with ``grow`` the ids beyond the saved ones start unvisited (NaN)."""
    owner = stateful(loss)
    layout = {b.name: b for b in owner.state_buffers()}
    saved_n = int(index["num_samples"])
    out_state = dict(state)
    for name in index.get("buffers", []):
        buf = layout.get(name)
        if buf is None or not buf.per_sample:
            raise saving.LossStateFilesError(
                f"{ckpt_path} keeps a sharded buffer {name!r} that this loss does not have"
            )
        num_samples = buf.shape[-1]
        if saved_n != num_samples and not (grow and saved_n < num_samples):
            raise saving.LossStateFilesError(
                f"{ckpt_path} holds DeCL rates for num_samples={saved_n}, but this "
                f"run has --decl-num-samples {num_samples}"
            )
        rank, world = (owner.rank, owner.world_size) if buf.sharded else (0, 1)
        out = torch.full((*buf.shape[:-1], shard_size(num_samples, rank, world)), float("nan"), dtype=buf.dtype)
        # a shard's ids rise with its columns, so the saved ids are its first shard_size(saved_n, ...) columns
        try:
            reshard(
                saving.shard_sources(index, ckpt_path, name),
                saved_n,
                rank,
                world,
                out[:, : shard_size(saved_n, rank, world)],
            )
        except ValueError as e:
            raise saving.LossStateFilesError(f"the loss state files of {ckpt_path}: {e}") from None
        out_state[name] = out
    return out_state


def grown_state(loss, state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """``state`` with its per-sample table widened to ``num_samples`` ids, the new ones unvisited (NaN)."""
    owner = stateful(loss)
    buf = owner.per_sample_buffer() if owner is not None else None
    table = state.get(buf.name) if buf is not None else None
    if table is None or table.shape[1] >= buf.shape[-1]:
        return state
    fresh = torch.full((table.shape[0], buf.shape[-1] - table.shape[1]), float("nan"), dtype=table.dtype)
    return {**state, buf.name: torch.cat([table, fresh], dim=1)}
