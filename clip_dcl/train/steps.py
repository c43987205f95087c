"""Around each epoch: skipped AMP steps, the epoch's health and data account, the main process's seed."""

from __future__ import annotations

import logging
import random
from typing import Optional

import numpy as np
import torch

from clip_dcl.losses.base import declared, stateful

from .pipeline import id_collisions, mix_seed, summary_line


class SkippedSteps:
    """Undoes the loss state's update of an optimizer step that AMP's GradScaler skipped (inf or NaN
    gradients), so that the run goes on as if the step had not happened: checked between steps, a lower
    scale than at the previous check means the step just taken was skipped."""

    def __init__(self, scaler, loss):
        self.loss = stateful(loss)  # None: no state to roll back, and no scale read (each read syncs the device)
        enabled = scaler is not None and getattr(scaler, "is_enabled", lambda: True)()
        self.scaler = scaler if enabled and self.loss is not None else None
        self.scale = self.scaler.get_scale() if self.scaler is not None else None
        self.count = 0

    def check(self, epoch: int, step: int) -> None:
        if self.scaler is None or step == 0:
            return
        scale = self.scaler.get_scale()
        if scale < self.scale and self.loss.rollback_step():
            self.count += 1
            logging.warning(
                f"Epoch {epoch}, step {step}: the AMP GradScaler skipped the optimizer step (inf or NaN "
                "gradients); the loss state's update of that step was undone"
            )
        self.scale = scale


def log_epoch_health(loss, wrapped, epoch: int, args) -> Optional[str]:
    """Rank 0, after a whole epoch: the loss's ``epoch_warning`` of the epoch's mean metrics, logged as one
    warning naming the epoch (returned too); None when the loss has no check or nothing to say."""
    owner = declared(loss)
    if owner is None or args.rank != 0 or not wrapped.calls:
        return None
    message = owner.epoch_warning(wrapped.epoch_means())
    if message:
        logging.warning(f"Epoch {epoch}: {message}")
    return message or None


def log_data_stats(dataloader, epoch: int, args) -> None:
    """Log the epoch's account of the training data, and in the tracked (first) epoch the sample-id
    collisions (see ``clip_dcl.train.pipeline.DataStats``)."""
    stats = getattr(dataloader, "data_stats", None)
    if stats is None:
        return
    report = stats.collect(epoch)
    logging.info(f"{summary_line(epoch, report)}" + (f" (rank {args.rank})" if args.world_size > 1 else ""))
    if stats.track_epoch != epoch or not len(report["pairs"]):
        return
    samples, ids = id_collisions(report["pairs"])
    where = f" on rank {args.rank}" if args.world_size > 1 else ""
    if samples == ids:
        logging.info(f"Sample ids, epoch {epoch}{where}: {samples} distinct samples, {ids} distinct ids.")
        return
    why = (
        "their keys are not numeric, so their ids are hashed into --decl-num-samples rows; give the shards "
        "numeric json keys, or raise --decl-num-samples to share fewer rows"
        if report["counts"]["hashed"]
        else "two samples carry the same key (shards whose keys restart, or a key repeated); give every sample "
        "a unique numeric json 'key'"
    )
    logging.warning(
        f"Sample ids, epoch {epoch}{where}: {samples} distinct samples but {ids} distinct ids: "
        f"{samples - ids} samples share a rate row with another ({why})."
    )


def seed_main_process(args, epoch: int) -> None:
    """Seed the main process's RNGs from ``(--seed, epoch, rank)``: a run resumed at an epoch boundary
    repeats an uninterrupted one (the data workers do the same: :class:`.pipeline.SeededSampleShuffle`)."""
    seed = mix_seed(args.seed, epoch, args.rank)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
