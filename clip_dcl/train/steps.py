"""Around OpenCLIP's own ``train_one_epoch``, between its steps: sample ids, skipped steps, logged metrics.

OpenCLIP's loop calls the loss without ids: :class:`IdChannel` (the dataloader it iterates) keeps each
batch's ids aside and :class:`LossWithIds` (the loss it calls) hands them on.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from typing import Dict, Optional

import numpy as np
import torch
from open_clip_train import train as oc_train

from clip_dcl.losses.base import SampleIdError, declared, stateful

from .ids import MissingSampleIds, SampleIdOutOfRange
from .pipeline import id_collisions, mix_seed, summary_line
from .upstream import LoggedLoss


class SkippedSteps:
    """Undoes the loss state's update of an optimizer step that AMP's GradScaler skipped (inf or NaN
    gradients), so that the run goes on as if the step had not happened: checked between steps, a lower
    scale than at the previous check means the step just taken was skipped."""

    def __init__(self, scaler, loss):
        self.scaler = scaler if scaler is not None and getattr(scaler, "is_enabled", lambda: True)() else None
        self.loss = stateful(loss)  # None: no state to roll back
        self.scale = self.scaler.get_scale() if self.scaler is not None else None
        self.count = 0

    def check(self, epoch: int, step: int) -> None:
        if self.scaler is None or step == 0:
            return
        scale = self.scaler.get_scale()
        if scale < self.scale and self.loss is not None and self.loss.rollback_step():
            self.count += 1
            logging.warning(
                f"Epoch {epoch}, step {step}: the AMP GradScaler skipped the optimizer step (inf or NaN "
                "gradients); the loss state's update of that step was undone"
            )
        self.scale = scale


class IdChannel:
    """Iterates the training dataloader for OpenCLIP's loop (which unpacks ``images, texts = batch``), keeping
    the ids of the last ``accum_freq`` batches (a loss call's) for :class:`LossWithIds`. It drops ``skip``
    batches first (a mid-epoch resume); ``at_boundary(steps taken)`` may end the epoch before any later step."""

    def __init__(self, dataloader, accum_freq: int, skip: int = 0, resumed=None, at_boundary=None):
        self.dataloader = dataloader
        self.num_batches = dataloader.num_batches
        self.num_samples = dataloader.num_samples
        self.accum_freq = accum_freq
        self.recent = deque(maxlen=accum_freq)
        self.fetched = 0
        self.skip, self.resumed, self.at_boundary = skip, resumed, at_boundary
        self.stopped_at: Optional[int] = None  # the step at which at_boundary ended the epoch

    def __iter__(self):
        batches = iter(self.dataloader)
        while self.fetched < self.skip:  # the same batches as before the stop, read and not trained on
            try:
                next(batches)
            except StopIteration:
                return
            self.fetched += 1
        if self.resumed is not None:
            self.resumed()
        while True:
            if (
                self.at_boundary is not None
                and self.fetched % self.accum_freq == 0
                and self.fetched < self.num_batches
                and self.at_boundary(self.fetched // self.accum_freq)
            ):
                self.stopped_at = self.fetched // self.accum_freq
                return
            try:
                batch = next(batches)
            except StopIteration:
                return
            if len(batch) == 3:  # our webdataset pipeline
                images, texts, ids = batch
            else:  # OpenCLIP's csv / synthetic datasets carry no ids
                (images, texts), ids = batch, None
            self.recent.append(ids)
            self.fetched += 1
            yield images, texts

    def ids(self) -> Optional[torch.Tensor]:
        parts = list(self.recent)
        if not parts or any(p is None for p in parts):
            return None
        return torch.cat([torch.as_tensor(p, dtype=torch.long) for p in parts])


class LossWithIds:
    """Calls the loss with ``sample_ids`` from the channel when it needs them; keeps its metrics."""

    def __init__(self, loss, channel: IdChannel, device, on_output=None):
        self.loss = loss
        self.declared = declared(loss)  # None: a loss of OpenCLIP's that declares nothing
        self.channel = channel
        self.device = device
        self.on_output = on_output  # called with every output (the count of non-finite steps)
        self.metrics: Dict[str, torch.Tensor] = {}
        # every call's metrics summed over the epoch, kept as tensors (no device sync per step)
        self.sums: Dict[str, torch.Tensor] = {}
        self.calls = 0

    def epoch_means(self) -> Dict[str, float]:
        """Each metric's mean over the loss calls so far (one synchronisation)."""
        return {name: float(total) / self.calls for name, total in self.sums.items()} if self.calls else {}

    def __call__(self, *args, **kwargs):
        if self.declared is not None and self.declared.requires_sample_ids:
            ids = self.channel.ids()
            if ids is None:
                raise MissingSampleIds(
                    "--decl-rate index needs sample ids and the training batches carry none: "
                    "train on webdataset shards, a CSV or --dataset-type synthetic, or use "
                    "--decl-rate queue / batch (no ids needed)"
                )
            kwargs["sample_ids"] = ids.to(self.device, non_blocking=True)
        try:
            # the loss checks the ids of the whole global batch, so every rank raises together
            out = self.loss(*args, **kwargs)
        except SampleIdError as e:
            hint = (
                ""
                if "negative" in str(e)
                else " (img2dataset keys are shard * 10^k + index, so they can "
                "exceed the sample count in sizes.json: set --decl-num-samples above the largest key)"
            )
            raise SampleIdOutOfRange(f"{e}{hint}") from None
        # Kept as tensors: reading them (a device sync) waits for OpenCLIP's logging steps.
        self.metrics = dict(self.declared.metrics) if self.declared is not None else {}
        logged = self.declared.logged_loss(self.metrics) if self.declared is not None else None
        if logged is not None and isinstance(out, dict):
            out = LoggedLoss(out, logged)  # OpenCLIP's Loss column: the loss's InfoNCE, not its total
        for name, value in self.metrics.items():
            value = value.detach().float() if torch.is_tensor(value) else torch.tensor(float(value))
            if value.numel() != 1:
                continue
            self.sums[name] = self.sums[name] + value if name in self.sums else value
        self.calls += 1
        if self.on_output is not None:
            self.on_output(out)
        return out


def log_epoch_health(loss, wrapped: LossWithIds, epoch: int, args) -> Optional[str]:
    """Rank 0, after a whole epoch: the loss's ``epoch_warning`` of the epoch's mean metrics, logged as one
    warning naming the epoch (returned too); None when the loss has no check or nothing to say."""
    owner = declared(loss)
    if owner is None or args.rank != 0 or not wrapped.calls:
        return None
    message = owner.epoch_warning(wrapped.epoch_means())
    if message:
        logging.warning(f"Epoch {epoch}: {message}")
    return message or None


class TrainLineHook(logging.Filter):
    """Adds the loss's metrics (the step's last call, and their running average) to OpenCLIP's ``Train Epoch:``
    log line, in OpenCLIP's format; the same values reach ``metrics.jsonl`` as data (:func:`train_record`)."""

    def __init__(self, wrapped: LossWithIds):
        super().__init__()
        self.wrapped = wrapped
        self.meters: Dict[str, oc_train.AverageMeter] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not (isinstance(record.msg, str) and record.msg.startswith("Train Epoch:") and self.wrapped.metrics):
            return True
        owner = self.wrapped.declared
        for name, value in owner.logged_metrics(self.wrapped.metrics).items():
            self.meters.setdefault(name, oc_train.AverageMeter()).update(float(value))
        note = owner.step_note()
        record.msg += (
            (" " + note if note else "")
            + " "
            + " ".join(f"{name.capitalize()}: {m.val:#.5g} ({m.avg:#.5g})" for name, m in self.meters.items())
        )
        return True


def loss_columns(wrapped: LossWithIds) -> Dict[str, object]:
    """The loss's own columns of its last call: its logged metrics as numbers and its step note
    (``"Term: loss1"`` -> ``{"term": "loss1"}``)."""
    owner = wrapped.declared
    if owner is None or not wrapped.metrics:
        return {}
    out: Dict[str, object] = {name: float(value) for name, value in owner.logged_metrics(wrapped.metrics).items()}
    note = owner.step_note()
    if note:
        key, _, value = note.partition(": ")
        out[key.lower() if value else "note"] = value or note
    return out


def train_record(
    writer, wrapped: LossWithIds, epoch: int, skip_steps: int, steps_per_epoch: int, samples_per_epoch: int, args
) -> Optional[dict]:
    """Flush one logged step's record into ``metrics.jsonl`` (None when OpenCLIP logged nothing since); the step
    is shifted by ``skip_steps`` (OpenCLIP counts from 0 again after a mid-epoch resume)."""
    if not writer.values:
        return None
    columns = loss_columns(wrapped)
    numbers = {f"train/{k}": v for k, v in columns.items() if not isinstance(v, str)}
    for name, value in numbers.items():
        writer.add_scalar(name, value, writer.step)
    if args.wandb and numbers:
        import wandb

        wandb.log(numbers, step=writer.step)
    for key, value in columns.items():
        if isinstance(value, str):
            writer.values[key] = value
    step = writer.step + skip_steps
    samples = (step - steps_per_epoch * epoch + 1) * args.batch_size * args.accum_freq * args.world_size
    return writer.flush(
        kind="train",
        step=step,
        epoch=epoch,
        samples=min(samples, samples_per_epoch),
        samples_per_epoch=samples_per_epoch,
    )


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
