"""The state of one training run: its flags, folder, loss, data, resume and checkpoints.

:func:`clip_dcl.train.session.train` calls :class:`TrainingRun`'s methods at their points of the set-up, and
:mod:`clip_dcl.train.loop` calls :meth:`TrainingRun.at_boundary` between steps.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import math
import os
from typing import Optional

import open_clip
import torch
from open_clip_train import data as oc_data
from open_clip_train import file_utils as oc_file_utils
from open_clip_train import params as oc_params
from open_clip_train import train as oc_train

from clip_dcl.losses.base import stateful
from clip_dcl.paths import expand_pattern

from . import loss_state, runfolder, saving
from . import signals as preemption
from .compat import setup_logging as openclip_setup_logging
from .csv_data import csv_dataset, csv_train_data
from .divergence import Diverged, NonFiniteSteps, describe_tensors, nonfinite_tensors
from .exits import watch_loaders
from .flags import TrainConfig, full_loss_args, openclip_native
from .ids import with_indices
from .loop import train_one_epoch as train_epoch
from .loop import unwrap
from .metrics import MetricsWriter, metrics_path
from .packed import PackedDataError, get_packed_train_dataset, is_packed
from .pipeline import get_wds_train_dataset
from .resume_checks import (  # noqa: F401 (its errors)
    LossSettingMismatch,
    LossStateMismatch,
    ObjectiveMismatch,
    check_objective,
    check_state_settings,
)
from .steps import SkippedSteps, log_data_stats, log_epoch_health, seed_main_process


class TrainingRun:
    """The state of one ``open_clip_train.main`` call: its loss, and what the patches need."""

    def __init__(self, config: TrainConfig):
        self.config = config
        self.args = None
        self.loss = None
        self.resumed: Optional[dict] = None  # the resumed checkpoint's clip_dcl entries
        self.resumed_path: Optional[str] = None
        self.preprocess_cfg: Optional[dict] = None
        self.train_num_batches: Optional[int] = None  # batches per epoch of the training data
        self.shards = None  # the folder of this epoch's loss-state shards (sharded DeCL state)
        self.unsaved_shards: set = set()  # shard folders this run made whose checkpoint is not written yet
        self.train_data_size: Optional[int] = None  # rows of a CSV / size of synthetic training data
        self.resume_latest = False  # --resume latest (main replaces args.resume with the file it found)
        self.signals: Optional[preemption.StopSignals] = None  # installed by run_training
        self.gate: Optional[preemption.StepGate] = None
        self.resume_position: Optional[dict] = None  # ckpt["clip_dcl"]["resume"] of a mid-epoch checkpoint
        self.last_step_save: Optional[str] = None
        self.epoch_num_batches: Optional[int] = None
        self.grow_from: Optional[int] = None  # --decl-grow-state: the ids the resumed per-sample state holds
        self.nonfinite: Optional[NonFiniteSteps] = None  # the run's count of non-finite steps, across epochs
        self.model = None  # the model being trained (main's), whose parameters a checkpoint must find finite
        self.lock: Optional[runfolder.RunLock] = None  # the master's lock of the run folder, while it runs
        self.named = True  # --name was given (else OpenCLIP names the run after the clock)

    def _startup_point(self) -> None:
        """A point of the start-up where only Python of ours runs: a stop signal recorded since ends the start-up
        here (:class:`clip_dcl.train.exits.StartupStop`; the command line has left from the handler already)."""
        if self.signals is not None:
            self.signals.check_startup()

    def parse_args(self, argv):
        self._startup_point()
        args = oc_params.parse_args(argv)
        cfg = self.config
        args.loss = cfg.loss
        args.loss_args = dict(cfg.loss_args)
        args.model_config = cfg.model_config
        args.no_grad_gather = cfg.no_grad_gather
        args.strict_data = cfg.strict  # read by the shards' pipeline in its workers
        args.decl_num_samples = cfg.num_samples
        args.loss_reset = cfg.loss_reset
        args.decl_id_block = cfg.id_block
        self.resume_latest = args.resume == "latest"
        self.named = args.name is not None
        if self.resume_latest and args.save_most_recent and args.name and args.logs and args.remote_sync is None:
            # OpenCLIP would look at epoch_latest.pt alone (see runfolder.latest_checkpoint)
            args.resume = runfolder.latest_checkpoint(os.path.join(args.logs, args.name, "checkpoints"), True)
        args.captions_per_image = cfg.captions_per_image
        self.args = args
        return args

    def setup_logging(self, log_file, level, include_host=False):
        """The run claims its folder (:func:`clip_dcl.train.runfolder.claim`), then OpenCLIP's (PyTorch's loggers
        kept), then the master removes the partial files a killed save left (main calls it before any save)."""
        self._startup_point()
        args = self.args
        took = None
        if args is not None:
            self.lock, took = runfolder.claim(args, self.resume_latest)
        openclip_setup_logging(log_file, level, include_host=include_host)
        if args is None or getattr(args, "rank", 0) != 0 or not args.logs or str(args.logs).lower() == "none":
            return
        if took:
            logging.warning(took)
        if self.resume_latest and args.save_most_recent and self.named:
            logging.info(
                f"--resume latest with --save-most-recent: {args.resume or 'no checkpoint'} (the newest of "
                "epoch_latest.pt and epoch_N.pt)."
            )
        folder = os.path.join(args.logs, args.name, "checkpoints")
        for path in saving.remove_stale_partials(folder):
            logging.info(
                f"Removed {path}: the partial file of a save that was killed halfway (the checkpoint it "
                "was writing was never completed)."
            )

    def pt_load(self, path, map_location="cpu"):
        self._startup_point()
        ckpt = self._load_resumable(path, map_location)
        ckpt = self._fit_model_keys(ckpt)
        if isinstance(ckpt, dict) and "epoch" in ckpt:
            path = self.args.resume if self.args is not None and self.args.resume else path
            self.resume_position = saving.resume_position(ckpt)
            check_objective(self.config, ckpt, path)
            grow_from = check_state_settings(self.config, ckpt, path)
            if grow_from is not None:
                self.grow_from = grow_from
            if self.config.loss_reset:
                logging.info(
                    f"--loss-reset: the {self.config.loss} loss starts with fresh state; {path} keeps "
                    "only the model and optimizer."
                )
                return ckpt
            self.resumed = saving.entries_of(ckpt)
            self.resumed_path = path
        return ckpt

    def _fit_model_keys(self, ckpt):
        """The checkpoint with DDP's ``module.`` prefix on its model keys as this run's model has it, whatever
        world size saved it."""
        args = self.args
        if args is None or not isinstance(ckpt, dict):
            return ckpt
        # main wraps the model in DDP when distributed, except under Horovod
        wrapped = bool(getattr(args, "distributed", False)) and not getattr(args, "horovod", False)
        if "epoch" in ckpt and isinstance(ckpt.get("state_dict"), dict):
            return {**ckpt, "state_dict": saving.model_keys_for(ckpt["state_dict"], wrapped)}
        if ckpt and all(torch.is_tensor(v) for v in ckpt.values()):  # a bare state dict (fine-tuning)
            return saving.model_keys_for(ckpt, wrapped)
        return ckpt

    def _load_resumable(self, path, map_location):
        found = saving.load_resumable(
            path, map_location, self.resume_latest, getattr(self.args, "checkpoint_path", None), oc_file_utils.pt_load
        )
        if found.path != path:
            self.args.resume = found.path  # main logs the file it resumed from args.resume
        return found.checkpoint

    def create_loss(self, args):
        self._startup_point()
        cfg = self.config
        native = openclip_native(cfg.loss)
        if native and not cfg.no_grad_gather and cfg.captions_per_image == 1 and not cfg.loss_kwargs.get("tile"):
            loss = open_clip.create_loss(args)
        else:
            from clip_dcl.losses import LOSSES, create_loss

            kwargs = self.resolve_loss_args(args)
            # allocated on the device directly: no host copy of a large per-sample buffer
            on_device = {"device": args.device} if "device" in LOSSES[cfg.loss].defaults() else {}
            if cfg.no_grad_gather:
                on_device["no_grad_gather"] = True
            loss = create_loss(
                cfg.loss,
                rank=args.rank,
                world_size=args.world_size,
                local_loss=args.local_loss,
                gather_with_grad=args.gather_with_grad,
                **kwargs,
                **on_device,
            )
        loss = loss.to(args.device) if isinstance(loss, torch.nn.Module) else loss
        self._restore(loss)
        self.loss = loss  # the module whose state is checkpointed
        if not native and "coca" in args.model.lower():
            # CoCa: our contrastive term, OpenCLIP's captioning term, both with OpenCLIP's weights
            from clip_dcl.losses.coca import CoCaObjective

            loss = CoCaObjective(
                loss,
                caption_loss_weight=args.coca_caption_loss_weight,
                contrastive_loss_weight=args.coca_contrastive_loss_weight,
            )
        if args.rank == 0:
            logging.info(f"Loss: {cfg.loss} {cfg.loss_args} -> {loss}")
        return loss

    def resolve_loss_args(self, args) -> dict:
        """The loss's keyword arguments resolved by the loss from the data, now that its batches per epoch
        are known; recorded in ``config.loss_args`` and ``args.loss_args`` (params.txt is written after)."""
        from clip_dcl.losses import resolve_loss_args

        from .facts import data_facts

        cfg = self.config
        data = dataclasses.replace(cfg.data or data_facts(args), steps_per_epoch=self.epoch_steps(args))
        kwargs = resolve_loss_args(cfg.loss, cfg.loss_kwargs, data)
        resolved = full_loss_args(cfg.loss, kwargs)
        if resolved != cfg.loss_args:
            cfg.loss_args = resolved
            args.loss_args = dict(resolved)
        return kwargs

    def epoch_steps(self, args) -> int:
        """Optimizer steps of one epoch: the training data's batches per epoch (as OpenCLIP's scheduler
        counts them) / ``--accum-freq``."""
        batches = self.train_num_batches
        if batches is None:  # not our webdataset pipeline: OpenCLIP's own count of the samples
            batches = math.ceil((args.train_num_samples or 0) / (args.batch_size * args.world_size))
        return batches // args.accum_freq

    def _restore(self, loss) -> None:
        if self.resumed is None:
            return
        state, meta = self.resumed[saving.LOSS_STATE_KEY], self.resumed[saving.CKPT_KEY] or {}
        saved_size = meta.get("train_data_size")
        if saved_size is not None and self.train_data_size is not None and saved_size != self.train_data_size:
            logging.warning(
                f"{self.resumed_path} was trained on {saved_size} samples of --train-data, which now has "
                f"{self.train_data_size}: its rows are the sample ids, so rows that moved read the rates "
                "of other samples (keep the CSV's rows in place between a run and its resume)"
            )
        has_state = isinstance(loss, torch.nn.Module) and len(loss.state_dict()) > 0
        saved_loss = meta.get("loss")
        if saved_loss is not None and saved_loss != self.config.loss:
            if has_state:
                logging.warning(
                    f"{self.resumed_path} was trained with --loss {saved_loss}; --loss "
                    f"{self.config.loss} starts with fresh loss state."
                )
            return
        if state is None:
            if has_state:
                logging.warning(f"{self.resumed_path} holds no loss state; the {self.config.loss} loss starts fresh.")
            return
        owner = stateful(loss)
        if owner is not None:
            state, notes = owner.adapt_saved_state(state, meta.get("loss_args") or {})
            for note in notes:
                logging.info(f"{self.resumed_path}: converted {note}.")
        try:
            index = meta.get(saving.SHARD_INDEX_KEY)
            if index:  # a sharded buffer: in files beside the checkpoint, built into this rank's part
                state = loss_state.restore_sharded(
                    loss, state, index, self.resumed_path, grow=self.grow_from is not None
                )
            elif self.grow_from is not None:  # the whole table, its new ids' columns unvisited
                state = loss_state.grown_state(loss, state)
            loss.load_state_dict(state)
        except (RuntimeError, KeyError, ValueError) as e:
            raise LossStateMismatch(
                f"cannot restore the {self.config.loss} loss state from {self.resumed_path} (it was trained with "
                f"{meta.get('loss_args')}; now {self.config.loss_args}): {e}"
            ) from None
        if has_state:
            logging.info(
                f"Restored the {self.config.loss} loss state from {self.resumed_path} "
                f"(digest {saving.loss_state_digest(loss)})."
            )

    def train_one_epoch(self, model, data, loss, epoch, optimizer, scaler, scheduler, dist_model, args, tb_writer=None):
        """One epoch of :func:`clip_dcl.train.loop.train_one_epoch`, with what the run checks around it: the
        step gate (stop, save, divergence), skipped AMP steps, the loss state written after the epoch."""
        self._startup_point()
        if self.preprocess_cfg is None:
            try:
                self.preprocess_cfg = dict(open_clip.get_model_preprocess_cfg(unwrap(model)))
            except AttributeError:  # not an OpenCLIP model
                self.preprocess_cfg = {}
        seed_main_process(args, epoch)
        if self.gate is None:
            self.gate = preemption.StepGate(self.config.preempt, self.signals, args.world_size, args.rank, args.device)
        self.model = model
        if self.nonfinite is None:
            self.nonfinite = NonFiniteSteps(self.config.max_nonfinite_steps, args.device)
        self.epoch_num_batches = data["train"].dataloader.num_batches
        watch_loaders(info.dataloader for info in data.values() if hasattr(info, "dataloader"))
        self.skip_steps, self._resumed = self._resume_point(epoch, args, self.epoch_num_batches)
        self._skipped = SkippedSteps(scaler, loss)
        self._ended = self.skip_steps  # steps of the epoch whose loss the count has taken in
        self._epoch, self._args, self._optimizer, self._scaler = epoch, args, optimizer, scaler
        writer = MetricsWriter(metrics_path(args), tb_writer)
        if self.signals is not None:
            self.signals.armed = True  # a first Ctrl-C now stops at the next step boundary, with a save
        try:
            stopped_at = train_epoch(
                self, model, data, loss, epoch, optimizer, scaler, scheduler, dist_model, args, writer
            )
        finally:
            if self.signals is not None:
                self.signals.armed = False
        self._check_finite(model, epoch, args)  # before the epoch is evaluated and saved
        if stopped_at is not None:
            raise preemption.Preempted(self.gate.signame or "a signal", self.last_step_save, epoch, stopped_at)
        log_epoch_health(loss, self.loss_call, epoch, args)  # a whole epoch (a preempted one ended above)
        log_data_stats(data["train"].dataloader, epoch, args)
        loss = self.loss  # the module whose state is checkpointed (CoCa: its contrastive term)
        if isinstance(loss, torch.nn.Module) and len(loss.state_dict()):
            self.shards = loss_state.write_shards(loss, args, epoch + 1, self.unsaved_shards)
            state = loss.state_dict()
            calls = f"calls {int(state['calls'])}, " if "calls" in state else ""
            logging.info(
                f"Loss state after epoch {epoch} on rank {args.rank}: {calls}digest {saving.loss_state_digest(loss)}"
            )

    def resumed_epoch(self) -> None:
        """Called by the loop once a mid-epoch resume has read the batches of the steps already taken."""
        if self._resumed is not None:
            self._resumed()

    def record_output(self, total) -> None:
        """Each step's loss, for the count of non-finite steps."""
        self.nonfinite.record(total)

    def _end_steps(self, taken: int) -> None:
        if taken > self._ended:  # one step at each boundary
            steps = self.epoch_num_batches // self._args.accum_freq
            self.nonfinite.end_step(steps * self._epoch + taken - 1)
            self._ended = taken

    def at_boundary(self, step: int, last: bool = False) -> bool:
        """Before step ``step`` of the epoch (``last``: after its last step): account for the step just taken;
        then whether to stop here, saving first when the gate says so (and raise :class:`Diverged`)."""
        epoch, args = self._epoch, self._args
        if self.signals is not None and not self.signals.started:  # the run's first: a signal now saves here
            self._startup_point()
            self.signals.training_started()
        self._skipped.check(epoch, step)
        self._end_steps(step)
        if last:
            return False
        stop, save = self.gate.poll(step, diverged=self.nonfinite.tripped)
        if self.gate.diverged:
            raise self._diverged(args)
        if stop or save:
            self.last_step_save = self.save_step(
                self.model, self._optimizer, self._scaler, epoch, step, args, self.gate.signame if stop else None
            )
            self.gate.saved()
        return stop

    def evaluate(self, model, data, epoch, args, tb_writer=None, tokenizer=None):
        """OpenCLIP's ``evaluate`` (validation loss and retrieval, zero-shot ImageNet); its metrics become one
        ``val`` record of ``metrics.jsonl``."""
        for info in data.values():  # before their workers start: they outlive this call
            preemption.quiet_workers(getattr(info, "dataloader", None))
        metrics = oc_train.evaluate(model, data, epoch, args, tb_writer=tb_writer, tokenizer=tokenizer)
        path = metrics_path(args)
        if metrics and path:
            writer = MetricsWriter(path)
            for name, value in metrics.items():
                if isinstance(value, (int, float)) or torch.is_tensor(value):
                    writer.add_scalar(f"val/{name}", value)
            per = (self.epoch_num_batches or 0) // max(1, args.accum_freq)
            writer.flush(kind="val", step=per * epoch if per else None, epoch=epoch)
        return metrics

    def _check_finite(self, model, epoch: int, args) -> None:
        """Every rank: stop (:class:`Diverged`) if the weights hold NaN or inf, or the loss was not finite
        for ``--max-nonfinite-steps`` steps in a row, on any rank (one all-reduce)."""
        original = unwrap(model)
        names, count = nonfinite_tensors(original.named_parameters())
        tripped = self.nonfinite.tripped(wait=True)
        flags = torch.tensor([int(count > 0), int(tripped)], dtype=torch.int32, device=args.device)
        if args.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
        if not bool(flags.any()):
            return
        if count:
            raise self._diverged(args, f"after epoch {epoch}, {describe_tensors(names, count)}")
        raise self._diverged(args)

    def _diverged(self, args, weights: Optional[str] = None) -> Diverged:
        """The :class:`Diverged` error naming the first bad step and the checkpoint that stays the newest."""
        count = self.nonfinite
        per = (self.epoch_num_batches or 0) // max(1, args.accum_freq)
        first = count.first()
        if weights is not None:
            why = weights + (
                f"; the loss was first NaN or inf at {count.where(per, first)}"
                if first >= 0
                else "; every step's loss was finite"
            )
        elif count.tripped(wait=True):
            why = (
                f"the loss was NaN or inf for {count.limit} optimizer steps in a row (--max-nonfinite-steps "
                f"{count.limit}), from {count.where(per)}"
            )
            if first >= 0 and first != int(count.trip_start):
                why += f" (the first non-finite loss: {count.where(per, first)})"
        else:
            why = "another rank's loss was NaN or inf for --max-nonfinite-steps steps in a row"
        if args.world_size > 1:
            why = f"rank {args.rank}: {why}"
        folder = getattr(args, "checkpoint_path", None)
        newest = runfolder.latest_checkpoint(folder, args.save_most_recent) if folder and args.save_logs else None
        kept = (
            f"no checkpoint of these weights was written; the newest, {newest}, is what "
            f"{self.rerun('--resume latest')} resumes"
            if newest
            else "no checkpoint of these weights was written"
        )
        fp32 = "" if args.precision == "fp32" else ", or train with --precision fp32"
        return Diverged(
            f"training diverged: {why}; {kept}. Lower --lr (or lengthen --warmup), check --wd and "
            f"the other optimizer flags{fp32}"
        )

    def _refuse_nonfinite(self, path) -> None:
        """:class:`Diverged` instead of writing ``path`` when the trained model's parameters are not finite (the
        parameters, not the state dict: a buffer may hold inf on purpose, a causal ``attn_mask``)."""
        if self.model is None:
            return
        names, count = nonfinite_tensors(unwrap(self.model).named_parameters())
        if count:
            raise Diverged(
                f"training diverged: not writing {path}: {describe_tensors(names, count)}; the "
                "previous checkpoints are kept"
            )

    def _resume_point(self, epoch: int, args, num_batches: int):
        """``(optimizer steps to skip, callback after the skip)`` for ``epoch``: a mid-epoch checkpoint's
        step in its own epoch, ``(0, None)`` otherwise."""
        pos = self.resume_position
        if not pos or int(pos.get("epoch", -1)) != epoch:
            return 0, None
        self.resume_position = None
        step = int(pos["step"])
        now = saving.resume_settings(args, num_batches)
        changed = [f"{k} {pos.get(k)} -> {v}" for k, v in now.items() if pos.get(k) != v]
        if changed:
            logging.warning(
                f"Resuming epoch {epoch} at step {step} with other settings than the stopped run "
                f"({', '.join(changed)}): the learning-rate schedule continues at the step, but the rest "
                "of the epoch is another draw of the data than the stopped run would have seen."
            )
        rng = pos.get("rng") or []

        def resumed():
            if len(rng) == args.world_size:
                preemption.set_rng_state(rng[args.rank])
            logging.info(
                f"Resumed epoch {epoch} at step {step} of {num_batches // args.accum_freq}: the "
                f"{step * args.accum_freq} batches of the steps already taken were read again, not trained on."
            )

        return step, resumed

    def save_step(self, model, optimizer, scaler, epoch: int, step: int, args, signame: Optional[str]):
        """Every rank: save a checkpoint after ``step`` optimizer steps of ``epoch`` (the master writes it, with
        the step, its settings and every rank's random state); returns the path (None on other ranks, no --logs)."""
        # every rank (DDP keeps the weights equal on all), before any collective: all stop together
        self._refuse_nonfinite(f"the checkpoint of step {step} of epoch {epoch}")
        rng = preemption.gather_rng_states(args.world_size)
        if not (args.logs and str(args.logs).lower() != "none"):
            return None
        folder = (
            loss_state.write_step_shards(self.loss, args, epoch, step, self.unsaved_shards)
            if self.loss is not None
            else None
        )
        path = None
        if args.save_logs:
            resume = saving.resume_entry(epoch, step, args, self.epoch_num_batches, rng, signame)
            with self._shards_of(folder):
                path = saving.save_step_checkpoint(
                    model,
                    optimizer,
                    scaler,
                    epoch,
                    step,
                    args,
                    self.loss,
                    self.checkpoint_meta(),
                    folder,
                    resume,
                    self._torch_save,
                    self.rerun(),
                )
            why = f"on {signame}" if signame else f"every {self.config.preempt.save_every_minutes:g} minutes"
            logging.info(f"Saved {path}: step {step} of epoch {epoch} ({why}).")
        if args.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.barrier()  # no rank leaves before the file is whole
        return path

    @staticmethod
    def _torch_save(obj, fh):
        torch.save(obj, fh)

    def save(self, obj, f, *args, **kwargs):
        training = isinstance(obj, dict) and "state_dict" in obj and "epoch" in obj and self.loss is not None
        folder = getattr(self.args, "checkpoint_path", None) if self.args is not None else None
        if training:
            self._refuse_nonfinite(f)  # no NaN file over the last good one
            obj = saving.training_checkpoint(obj, self.loss, self.checkpoint_meta(), self.shards, folder)
        with self._shards_of(self.shards if training else None):
            saving.save_checkpoint(
                obj, f, folder, lambda o, fh: torch.save(o, fh, *args, **kwargs), training, self.rerun()
            )

    def rerun(self, flags: Optional[str] = None) -> str:
        """:data:`clip_dcl.train.saving.RERUN`, with this run's ``--name`` when OpenCLIP made it up; with ``flags``,
        filled in: the command a message tells to run."""
        name = "" if self.named or self.args is None else f"--name {self.args.name} "
        template = saving.RERUN.replace("{}", name + "{}")
        return template if flags is None else template.format(flags)

    @contextlib.contextmanager
    def _shards_of(self, folder):
        """Around the master's save of a checkpoint that refers to the shard folder ``folder``: once written,
        the folder is the checkpoint's; if the save fails, a folder this run made goes with it."""
        try:
            yield
        except BaseException:
            loss_state.drop_unsaved(folder, self.unsaved_shards)
            raise
        self.unsaved_shards.discard(folder)

    def checkpoint_meta(self) -> dict:
        """What a downstream loader needs without the training flags (``ckpt["clip_dcl"]``)."""
        args = self.args
        entry = saving.checkpoint_entry(
            args.model, saving.trained_model_config(args), self.preprocess_cfg, self.config.loss, self.config.loss_args
        )
        if self.train_data_size is not None:  # CSV rows / synthetic samples: the ids are their indices
            entry["train_data_size"] = self.train_data_size
        return entry

    def get_data(self, args, preprocess_fns, epoch: int = 0, tokenizer=None) -> dict:
        """OpenCLIP's data sets (``get_data``'s keys), the training set through our readers: webdataset shards
        through :mod:`.pipeline`, a packed ``.npz`` through :mod:`.packed`, a CSV or the synthetic set through
        OpenCLIP's readers with each row's index as its sample id. Every batch is ``(images, texts, ids)``."""
        preprocess_train, preprocess_val = preprocess_fns
        data = {}
        if args.train_data or args.dataset_type == "synthetic":
            info = self._train_data(args, preprocess_train, epoch, tokenizer)
            self.train_num_batches = info.dataloader.num_batches
            data["train"] = info
        if args.val_data:
            if args.dataset_type == "auto" and is_packed(args.val_data):
                raise PackedDataError(f"--val-data {args.val_data}: a packed set is for training; validate on shards")
            read = oc_data.get_dataset_fn(args.val_data, args.dataset_type)
            if read is oc_data.get_csv_dataset:
                read = csv_dataset
            val_args = args
            if read is oc_data.get_wds_dataset:  # its shard paths as a list: OpenCLIP's expansion drops backslashes
                val_args = copy.copy(args)
                val_args.val_data = expand_pattern(args.val_data)
            data["val"] = read(val_args, preprocess_val, is_train=False, tokenizer=tokenizer)
        for key, split in (("imagenet-val", "val"), ("imagenet-v2", "v2")):
            if getattr(args, key.replace("-", "_")) is not None:
                data[key] = oc_data.get_imagenet(args, preprocess_fns, split)
        return data

    def _train_data(self, args, preprocess, epoch, tokenizer):
        if args.dataset_type == "auto" and is_packed(args.train_data):
            return get_packed_train_dataset(args, preprocess, epoch=epoch, tokenizer=tokenizer)
        read = oc_data.get_dataset_fn(args.train_data, args.dataset_type)
        if read is oc_data.get_wds_dataset:
            return get_wds_train_dataset(args, preprocess, is_train=True, epoch=epoch, tokenizer=tokenizer)
        if read is oc_data.get_csv_dataset:
            info = csv_train_data(args, preprocess, epoch, tokenizer)
        else:
            info = with_indices(read(args, preprocess, True, epoch=epoch, tokenizer=tokenizer))
        self.train_data_size = info.dataloader.num_samples  # the row (CSV) or index (synthetic) is the sample id
        return info
