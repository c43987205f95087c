"""The epoch loop: where a batch meets the loss.

Each batch arrives as ``(images, texts, sample_ids)`` (ids are None where the data carry none) and the ids go
to the loss as an argument. At each optimizer-step boundary the loop asks the run, by plain calls, whether to
stop, save or give up on a diverged loss; it writes the step line and the step's ``metrics.jsonl`` record
itself. The step follows OpenCLIP's ``train_one_epoch``: its learning-rate schedule, ``--accum-freq``
(features cached without gradients, each micro-batch's forward redone against them), ``--distill-*``,
GradScaler, ``--grad-clip-norm`` and the logit-scale clamp at ln(100).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Dict, Optional

import torch
from open_clip import get_input_dtype
from open_clip_train.precision import get_autocast

from clip_dcl.losses.base import SampleIdError, declared

from .ids import MissingSampleIds, SampleIdOutOfRange
from .signals import workers_born_blocked


def unwrap(model):
    """The model inside DDP (and torch.compile's wrapper)."""
    model = getattr(model, "module", model)
    return getattr(model, "_orig_mod", model)


class LossCall:
    """Calls the loss with the batch's ``sample_ids`` when it declares it needs them; keeps its metrics (as
    tensors: reading them syncs the device, which only the logged steps do) and their sums over the epoch."""

    def __init__(self, loss, device):
        self.loss = loss
        self.declared = declared(loss)  # None: a loss of OpenCLIP's that declares nothing
        self.device = device
        self.metrics: Dict[str, torch.Tensor] = {}
        self.sums: Dict[str, torch.Tensor] = {}
        self.calls = 0

    def epoch_means(self) -> Dict[str, float]:
        """Each metric's mean over the loss calls so far (one synchronisation)."""
        return {name: float(total) / self.calls for name, total in self.sums.items()} if self.calls else {}

    def __call__(self, model_out: dict, sample_ids: Optional[torch.Tensor]) -> Dict[str, torch.Tensor]:
        kwargs = {}
        if self.declared is not None and self.declared.requires_sample_ids:
            if sample_ids is None:
                raise MissingSampleIds(
                    "--decl-rate index needs sample ids and the training batches carry none: "
                    "train on webdataset shards, a CSV or --dataset-type synthetic, or use "
                    "--decl-rate queue / batch (no ids needed)"
                )
            kwargs["sample_ids"] = sample_ids.to(self.device, non_blocking=True)
        try:  # the loss checks the ids of the whole global batch, so every rank raises together
            losses = self.loss(**model_out, output_dict=True, **kwargs)
        except SampleIdError as e:
            hint = (
                ""
                if "negative" in str(e)
                else " (img2dataset keys are shard * 10^k + index, so they can exceed the sample count in "
                "sizes.json: set --decl-num-samples above the largest key)"
            )
            raise SampleIdOutOfRange(f"{e}{hint}") from None
        self.metrics = dict(self.declared.metrics) if self.declared is not None else {}
        for name, value in self.metrics.items():
            value = value.detach().float() if torch.is_tensor(value) else torch.tensor(float(value))
            if value.numel() == 1:
                self.sums[name] = self.sums[name] + value if name in self.sums else value
        self.calls += 1
        return losses

    def shown_loss(self, total: torch.Tensor) -> torch.Tensor:
        """The ``Loss`` of the step line: the loss's own (InfoNCE-scale, comparable across runs) where it
        declares one, else the optimized total."""
        logged = self.declared.logged_loss(self.metrics) if self.declared is not None else None
        return total if logged is None else logged.detach()

    def columns(self) -> Dict[str, object]:
        """The loss's own columns of its last call: logged metrics as numbers, its step note as text
        (``"Term: loss1"`` -> ``{"term": "loss1"}``)."""
        owner = self.declared
        if owner is None or not self.metrics:
            return {}
        out: Dict[str, object] = {name: float(v) for name, v in owner.logged_metrics(self.metrics).items()}
        note = owner.step_note()
        if note:
            key, _, value = note.partition(": ")
            out[key.lower() if value else "note"] = value or note
        return out


def _split(batch):
    """``(images, texts, ids)`` of a batch; ids None for a loader that carries none (OpenCLIP's validation)."""
    if len(batch) == 3:
        return batch
    images, texts = batch
    return images, texts, None


def _clock(seconds: float) -> str:
    seconds = int(round(max(0.0, seconds)))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def train_one_epoch(run, model, data, loss, epoch, optimizer, scaler, scheduler, dist_model, args, writer):
    """Train ``epoch``; return the step at which the run asked to stop (None: the whole epoch ran).

    ``run`` answers at each step boundary: ``run.at_boundary(step)`` (True: stop here), and records each
    step's output (``run.record_output``); ``writer`` takes the logged scalars (:class:`.metrics.MetricsWriter`).
    """
    device = torch.device(args.device)
    autocast = get_autocast(args.precision, device_type=device.type)
    input_dtype = get_input_dtype(args.precision)
    model.train()
    if args.distill:
        dist_model.eval()

    data["train"].set_epoch(epoch)
    dataloader = data["train"].dataloader
    accum = args.accum_freq
    steps = dataloader.num_batches // accum
    samples_per_epoch = dataloader.num_samples
    call = LossCall(loss, device)
    run.loss_call = call
    skip = run.skip_steps
    batches = StepBatches(dataloader, accum, skip, run.at_boundary, run.resumed_epoch)
    shown: Dict[str, list] = {}  # name -> [value, sum, count] of the logged steps
    started = end = time.time()
    data_time = batch_time = 0.0
    timed = 0
    for step, group in batches:
        global_step = steps * epoch + step
        if not args.skip_scheduler:
            scheduler(global_step)
        data_time += time.time() - end
        group = [
            (i.to(device=device, dtype=input_dtype, non_blocking=True), t.to(device=device, non_blocking=True), ids)
            for i, t, ids in group
        ]
        optimizer.zero_grad()
        losses, total, logit_scale = _step(call, model, dist_model, group, autocast, scaler, args)
        _optimizer_step(model, optimizer, scaler, args)
        with torch.no_grad():  # as OpenCLIP and the CLIP paper: the logit scale at most 100
            unwrap(model).logit_scale.clamp_(0, math.log(100))
        run.record_output(total)

        batch_time += time.time() - end
        timed += 1
        end = time.time()
        done = step + 1
        if args.rank == 0 and (step % args.log_every_n_steps == 0 or done == steps):
            terms = {**losses, "loss": call.shown_loss(total)}
            columns = call.columns()
            for name, value in [*terms.items(), *((k, v) for k, v in columns.items() if not isinstance(v, str))]:
                m = shown.setdefault(name, [0.0, 0.0, 0])
                m[0] = float(value.detach()) if torch.is_tensor(value) else float(value)
                m[1] += m[0]
                m[2] += 1
            rate = accum * args.batch_size * args.world_size / (batch_time / timed)
            elapsed = time.time() - started
            per_step = elapsed / (done - skip)
            left = per_step * (steps - done)
            run_left = left + per_step * steps * (args.epochs - epoch - 1)
            samples = min(done * args.batch_size * accum * args.world_size, samples_per_epoch)
            lr = optimizer.param_groups[0]["lr"]
            logit_scale = float(logit_scale)
            note = call.declared.step_note() if call.declared is not None and call.metrics else ""

            def show(names):
                return "".join(
                    f" {k.capitalize()}: {shown[k][0]:#.5g} ({shown[k][1] / shown[k][2]:#.5g})" for k in names
                )

            logging.info(
                f"Train Epoch: {epoch} [{samples:>{len(str(samples_per_epoch))}}/{samples_per_epoch} "
                f"({100.0 * done / steps:.0f}%)] Data (t): {data_time / timed:.3f} "
                f"Batch (t): {batch_time / timed:.3f}, {rate:#g}/s, {rate / args.world_size:#g}/s/gpu "
                f"Elapsed: {_clock(elapsed)}, left {_clock(left)} (run {_clock(run_left)}) "
                f"LR: {lr:5f} Logit Scale: {logit_scale:.3f}"
                + show(terms)
                + (f" {note}" if note else "")
                + show(k for k, v in columns.items() if not isinstance(v, str))
            )
            scalars = {
                "data_time": data_time / timed,
                "batch_time": batch_time / timed,
                "samples_per_second": rate,
                "samples_per_second_per_gpu": rate / args.world_size,
                "scale": logit_scale,
                "lr": lr,
                **{k: v[0] for k, v in shown.items()},
            }
            for name, value in scalars.items():
                writer.add_scalar(f"train/{name}", value, global_step)
            for key, value in columns.items():
                if isinstance(value, str):
                    writer.values[key] = value
            if args.wandb:
                import wandb

                wandb.log({f"train/{k}": v for k, v in scalars.items()} | {"step": global_step}, step=global_step)
            writer.flush(
                kind="train", step=global_step, epoch=epoch, samples=samples, samples_per_epoch=samples_per_epoch
            )
            data_time = batch_time = 0.0
            timed = 0
    if batches.stopped_at is None:
        run.at_boundary(batches.taken, last=True)
    return batches.stopped_at


class StepBatches:
    """The epoch's batches, ``accum`` at a time: ``(step, [(images, texts, ids), ...])`` for each optimizer
    step. A mid-epoch resume first reads the ``skip`` steps' batches again without yielding them, then calls
    ``resumed()``; before each step ``at_boundary(step)`` may end the epoch (:attr:`stopped_at`)."""

    def __init__(self, dataloader, accum: int, skip: int = 0, at_boundary=None, resumed=None):
        self.dataloader, self.accum, self.skip = dataloader, accum, skip
        self.at_boundary, self.resumed = at_boundary, resumed
        self.steps = dataloader.num_batches // accum
        self.stopped_at: Optional[int] = None
        self.taken = skip  # the steps of the epoch yielded so far

    def __iter__(self):
        with workers_born_blocked():  # the loader's workers start here
            batches = iter(self.dataloader)
        for _ in range(self.skip * self.accum):  # the batches of the steps already taken: read, not trained on
            if next(batches, None) is None:
                return
        if self.resumed is not None:
            self.resumed()
        for step in range(self.skip, self.steps):
            if self.at_boundary is not None and self.at_boundary(step):
                self.stopped_at = step
                return
            group = []
            for _ in range(self.accum):
                batch = next(batches, None)
                if batch is None:
                    return
                group.append(_split(batch))
            self.taken = step + 1
            yield step, group


def _step(call: LossCall, model, dist_model, group, autocast, scaler, args):
    """Forward and backward of one optimizer step over ``group`` (``--accum-freq`` micro-batches); returns the
    last loss call's terms, its total and the logit scale, as tensors (read on logged steps only: a read syncs)."""
    if len(group) == 1:
        images, texts, ids = group[0]
        with autocast():
            model_out = model(images, texts)
            if args.distill:
                with torch.no_grad():
                    model_out.update({f"dist_{k}": v for k, v in dist_model(images, texts).items()})
            losses = call(model_out, ids)
            total = sum(losses.values())
        _backward(total, scaler)
        return losses, total.detach(), model_out["logit_scale"].detach()
    # --accum-freq: every micro-batch's features without gradients, then each forward again with gradients
    # against the others' cached features (the whole step's batch as negatives), one backward each
    cached: Dict[str, list] = {}
    with torch.no_grad(), autocast():
        for images, texts, _ in group:
            out = model(images, texts)
            for key, value in out.items():
                if key not in ("logit_scale", "logit_bias"):
                    cached.setdefault(key, []).append(value)
    ids = None if any(g[2] is None for g in group) else torch.cat([torch.as_tensor(g[2]) for g in group])
    for j, (images, texts, _) in enumerate(group):
        with autocast():
            out = model(images, texts)
            fixed = {k: out.pop(k) for k in ("logit_scale", "logit_bias") if k in out}
            inputs = {k: torch.cat(v[:j] + [out[k]] + v[j + 1 :]) for k, v in cached.items()}
            losses = call({**inputs, **fixed}, ids)
            total = sum(losses.values())
        _backward(total, scaler)
    return losses, total.detach(), fixed["logit_scale"].detach()


def _backward(total, scaler) -> None:
    (scaler.scale(total) if scaler is not None else total).backward()


def _optimizer_step(model, optimizer, scaler, args) -> None:
    clip = args.grad_clip_norm
    if scaler is None:
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip, norm_type=2.0)
        optimizer.step()
        return
    if args.horovod:
        optimizer.synchronize()
        scaler.unscale_(optimizer)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip, norm_type=2.0)
        with optimizer.skip_synchronize():
            scaler.step(optimizer)
    else:
        if clip is not None:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip, norm_type=2.0)
        scaler.step(optimizer)
    scaler.update()
