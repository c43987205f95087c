"""The state of one training run through OpenCLIP's ``main``: its loss, resume and checkpoint bookkeeping.

:class:`TrainingRun`'s methods replace ``open_clip_train``'s names for one ``main`` call
(:func:`clip_dcl.train.patch.patched` swaps them in).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
from typing import Optional

import open_clip
import torch
from open_clip_train import params as oc_params
from open_clip_train import train as oc_train

from clip_dcl.losses.base import stateful

from . import loss_state, runfolder, saving
from . import preempt as preemption
from .divergence import Diverged, NonFiniteSteps, describe_tensors, nonfinite_tensors
from .exits import watch_loaders
from .flags import TrainConfig, full_loss_args, openclip_native
from .ids import with_indices
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
from .steps import (
    IdChannel,
    LossWithIds,
    SkippedSteps,
    TrainLineHook,
    log_data_stats,
    log_epoch_health,
    seed_main_process,
    train_record,
)
from .upstream import (
    OPENCLIP_CREATE_LOSS,
    OPENCLIP_EVALUATE,
    OPENCLIP_GET_CSV_DATASET,
    OPENCLIP_GET_DATASET_FN,
    OPENCLIP_GET_SYNTHETIC_DATASET,
    OPENCLIP_GET_WDS_DATASET,
    OPENCLIP_PT_LOAD,
    OPENCLIP_TRAIN_ONE_EPOCH,
)
from .upstream import setup_logging as upstream_setup_logging


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

    # open_clip_train.main.parse_args
    def parse_args(self, argv):
        self._startup_point()
        args = oc_params.parse_args(argv)
        cfg = self.config
        args.loss = cfg.loss
        args.loss_args = dict(cfg.loss_args)
        args.model_config = cfg.model_config
        args.no_grad_gather = cfg.no_grad_gather
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

    # open_clip_train.main.setup_logging
    def setup_logging(self, log_file, level, include_host=False):
        """The run claims its folder (:func:`clip_dcl.train.runfolder.claim`), then OpenCLIP's (PyTorch's loggers
        kept), then the master removes the partial files a killed save left (main calls it before any save)."""
        self._startup_point()
        args = self.args
        took = None
        if args is not None:
            self.lock, took = runfolder.claim(args, self.resume_latest)
        upstream_setup_logging(log_file, level, include_host=include_host)
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

    # open_clip_train.main.os.path.exists
    def path_exists(self, path) -> bool:
        """``os.path.exists``, except that OpenCLIP's "Experiment already exists" check sees no log: the
        run's own check (:func:`clip_dcl.train.runfolder.folder_problem`) takes its place in setup_logging."""
        if self.args is not None and path is not None and path == getattr(self.args, "log_path", None):
            return False
        return os.path.exists(path)

    # open_clip_train.main.pt_load
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
            path, map_location, self.resume_latest, getattr(self.args, "checkpoint_path", None), OPENCLIP_PT_LOAD
        )
        if found.path != path:
            self.args.resume = found.path  # main logs the file it resumed from args.resume
        return found.checkpoint

    # open_clip_train.main.create_loss
    def create_loss(self, args):
        self._startup_point()
        cfg = self.config
        native = openclip_native(cfg.loss)
        if native and not cfg.no_grad_gather and cfg.captions_per_image == 1:
            loss = OPENCLIP_CREATE_LOSS(args)
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
        are known; recorded in ``config.loss_args``, ``args.loss_args`` and params.txt (which OpenCLIP
        wrote before it loaded the data)."""
        from clip_dcl.losses import resolve_loss_args

        from .facts import data_facts

        cfg = self.config
        data = dataclasses.replace(cfg.data or data_facts(args), steps_per_epoch=self.epoch_steps(args))
        kwargs = resolve_loss_args(cfg.loss, cfg.loss_kwargs, data)
        resolved = full_loss_args(cfg.loss, kwargs)
        if resolved != cfg.loss_args:
            cfg.loss_args = resolved
            args.loss_args = dict(resolved)
            if args.rank == 0 and args.logs and args.name:
                rewrite_param(os.path.join(args.logs, args.name, "params.txt"), "loss_args", args.loss_args)
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

    # open_clip_train.main.train_one_epoch
    def train_one_epoch(self, model, data, loss, epoch, optimizer, scaler, scheduler, dist_model, args, tb_writer=None):
        """OpenCLIP's ``train_one_epoch``, called as is, with ids carried around it (see module doc)."""
        self._startup_point()
        if self.preprocess_cfg is None:
            try:
                self.preprocess_cfg = dict(open_clip.get_model_preprocess_cfg(oc_train.unwrap_model(model)))
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
        skip_steps, resumed = self._resume_point(epoch, args, self.epoch_num_batches)
        steps_per_epoch = self.epoch_num_batches // args.accum_freq

        skipped = SkippedSteps(scaler, loss)
        ended = [skip_steps]  # steps of the epoch whose loss the count has taken in

        def end_steps(taken: int) -> None:
            if taken > ended[0]:  # one step at each boundary
                self.nonfinite.end_step(steps_per_epoch * epoch + taken - 1)
                ended[0] = taken

        def at_boundary(step: int) -> bool:
            log_step()  # the previous step's record, before anything here may end the epoch
            if self.signals is not None and not self.signals.started:  # the run's first: a signal now saves here
                self._startup_point()
                self.signals.training_started()
            skipped.check(epoch, step)
            end_steps(step)
            stop, save = self.gate.poll(step, diverged=self.nonfinite.tripped)
            if self.gate.diverged:
                raise self._diverged(args)
            if stop or save:
                self.last_step_save = self.save_step(
                    model, optimizer, scaler, epoch, step, args, self.gate.signame if stop else None
                )
                self.gate.saved()
            return stop

        channel = IdChannel(
            data["train"].dataloader,
            args.accum_freq,
            skip=skip_steps * args.accum_freq,
            resumed=resumed,
            at_boundary=at_boundary,
        )
        data = {**data, "train": dataclasses.replace(data["train"], dataloader=channel)}
        if skip_steps and scheduler is not None:  # OpenCLIP counts the epoch's steps from 0 again
            schedule = scheduler

            def scheduler(step):
                return schedule(step + skip_steps)

        wrapped = LossWithIds(loss, channel, torch.device(args.device), on_output=self.nonfinite.record)
        writer = MetricsWriter(metrics_path(args), tb_writer)

        def log_step():
            train_record(writer, wrapped, epoch, skip_steps, steps_per_epoch, channel.num_samples, args)

        hook = TrainLineHook(wrapped)
        logging.getLogger().addFilter(hook)
        if self.signals is not None:
            self.signals.armed = True  # a first Ctrl-C now stops at the next step boundary, with a save
        try:
            OPENCLIP_TRAIN_ONE_EPOCH(
                model, data, wrapped, epoch, optimizer, scaler, scheduler, dist_model, args, tb_writer=writer
            )
        finally:
            logging.getLogger().removeFilter(hook)
            log_step()
            if self.signals is not None:
                self.signals.armed = False
        skipped.check(epoch, channel.fetched // args.accum_freq)  # the epoch's last step
        end_steps(channel.fetched // args.accum_freq)
        self._check_finite(model, epoch, args)  # before main evaluates and saves the epoch
        if channel.stopped_at is not None:
            raise preemption.Preempted(self.gate.signame or "a signal", self.last_step_save, epoch, channel.stopped_at)
        log_epoch_health(loss, wrapped, epoch, args)  # a whole epoch (a preempted one ended above)
        log_data_stats(data["train"].dataloader.dataloader, epoch, args)
        loss = self.loss  # the module whose state is checkpointed (CoCa: its contrastive term)
        if isinstance(loss, torch.nn.Module) and len(loss.state_dict()):
            self.shards = loss_state.write_shards(loss, args, epoch + 1, self.unsaved_shards)
            state = loss.state_dict()
            calls = f"calls {int(state['calls'])}, " if "calls" in state else ""
            logging.info(
                f"Loss state after epoch {epoch} on rank {args.rank}: {calls}digest {saving.loss_state_digest(loss)}"
            )

    # open_clip_train.main.evaluate
    def evaluate(self, model, data, epoch, args, tb_writer=None, tokenizer=None):
        """OpenCLIP's ``evaluate``, its scalars also written as one ``val`` record of ``metrics.jsonl``."""
        writer = MetricsWriter(metrics_path(args), tb_writer)
        for info in data.values():  # before their workers start: they outlive this call
            preemption.quiet_workers(getattr(info, "dataloader", None))
        try:
            return OPENCLIP_EVALUATE(model, data, epoch, args, tb_writer=writer, tokenizer=tokenizer)
        finally:
            per = (self.epoch_num_batches or 0) // max(1, args.accum_freq)
            writer.flush(kind="val", step=per * epoch if per else None, epoch=epoch)

    def _check_finite(self, model, epoch: int, args) -> None:
        """Every rank: stop (:class:`Diverged`) if the weights hold NaN or inf, or the loss was not finite
        for ``--max-nonfinite-steps`` steps in a row, on any rank (one all-reduce)."""
        original = oc_train.unwrap_model(model)
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
        names, count = nonfinite_tensors(oc_train.unwrap_model(self.model).named_parameters())
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

    # open_clip_train.main.torch.save
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

    # open_clip_train.data.get_wds_dataset
    def get_wds_dataset(self, args, preprocess_img, is_train, epoch=0, floor=False, tokenizer=None):
        if is_train:
            info = get_wds_train_dataset(
                args, preprocess_img, is_train=True, epoch=epoch, floor=floor, tokenizer=tokenizer
            )
            self.train_num_batches = info.dataloader.num_batches
            return info
        return OPENCLIP_GET_WDS_DATASET(args, preprocess_img, is_train, epoch=epoch, floor=floor, tokenizer=tokenizer)

    # open_clip_train.data.get_dataset_fn: a packed set (.npz, --dataset-type auto) is ours, the rest OpenCLIP's
    def get_dataset_fn(self, data_path, dataset_type):
        if dataset_type == "auto" and is_packed(data_path):
            return self.get_packed_dataset
        return OPENCLIP_GET_DATASET_FN(data_path, dataset_type)

    def get_packed_dataset(self, args, preprocess_img, is_train, epoch=0, floor=False, tokenizer=None):
        if not is_train:
            raise PackedDataError(f"--val-data {args.val_data}: a packed set is for training; validate on shards")
        info = get_packed_train_dataset(args, preprocess_img, epoch=epoch, tokenizer=tokenizer)
        self.train_num_batches = info.dataloader.num_batches
        return info

    # open_clip_train.data.get_csv_dataset / get_synthetic_dataset
    def _map_style(self, load, args, preprocess_fn, is_train, epoch=0, tokenizer=None):
        info = load(args, preprocess_fn, is_train, epoch=epoch, tokenizer=tokenizer)
        if not is_train:
            return info
        info = with_indices(info)  # the row (CSV) or index (synthetic) is the sample id
        self.train_num_batches = info.dataloader.num_batches
        self.train_data_size = info.dataloader.num_samples
        return info

    def get_csv_dataset(self, args, preprocess_fn, is_train, epoch=0, tokenizer=None):
        return self._map_style(_csv_dataset, args, preprocess_fn, is_train, epoch, tokenizer)

    def get_synthetic_dataset(self, args, preprocess_fn, is_train, epoch=0, tokenizer=None):
        return self._map_style(OPENCLIP_GET_SYNTHETIC_DATASET, args, preprocess_fn, is_train, epoch, tokenizer)


def _csv_dataset(args, preprocess_fn, is_train, epoch=0, tokenizer=None):
    """OpenCLIP's CSV dataset, its relative image paths read beside the CSV as evaluation reads them."""
    from .flag_checks import csv_images_beside

    info = OPENCLIP_GET_CSV_DATASET(args, preprocess_fn, is_train, epoch=epoch, tokenizer=tokenizer)
    csv_images_beside(info.dataloader.dataset, args.train_data if is_train else args.val_data)
    return info


def rewrite_param(params_file: str, name: str, value) -> None:
    """Replace the ``name: value`` line of OpenCLIP's params.txt (its format), when the file exists."""
    if not os.path.isfile(params_file):
        return
    with open(params_file) as f:
        lines = f.read().splitlines(keepends=True)
    with open(params_file, "w") as f:
        f.writelines(f"{name}: {value}\n" if line.startswith(f"{name}: ") else line for line in lines)
