"""The one module that patches ``open_clip_train``: OpenCLIP's ``main`` with a clip-dcl objective.

:func:`run_training` calls ``open_clip_train.main.main`` with these names swapped for the
duration of the call (and restored afterwards):

``open_clip_train.main.parse_args``
    OpenCLIP's parser, plus our flags as attributes of ``args`` (so ``params.txt`` lists them).
``open_clip_train.main.create_loss``
    ``--loss clip`` is OpenCLIP's own ``create_loss(args)`` unchanged (one caption per image); the others come from
    ``clip_dcl.losses.create_loss`` with OpenCLIP's distributed arguments. The loss is moved to
    the device and, on ``--resume``, its state is restored from the checkpoint.
``open_clip_train.main.train_one_epoch``
    OpenCLIP's own ``train_one_epoch`` (nothing re-implemented), handed a dataloader and a loss
    that carry the sample ids around it (see :class:`_IdChannel`), plus a log filter that adds
    ``loss.metrics`` to OpenCLIP's training log line and tensorboard/wandb.
``open_clip_train.main.pt_load``
    OpenCLIP's loader; keeps the ``loss_state`` of the checkpoint being resumed, refuses one
    trained with another ``--loss`` (unless ``--loss-reset``), and on ``--resume latest`` passes
    over a checkpoint that does not load (a torn file) to the previous one, with a warning.
``open_clip_train.main.setup_logging``
    OpenCLIP's, leaving PyTorch's own loggers at their levels (it sets every logger to INFO).
``open_clip_train.main.torch``
    ``torch`` itself except for two names that only ``main`` sees: ``torch.save`` adds
    the loss state and clip-dcl's entry to every training checkpoint main writes
    (``epoch_N.pt``, ``epoch_latest.pt``; the format is :mod:`clip_dcl.checkpoint`'s) and writes
    every file under a temporary name first (:func:`clip_dcl.checkpoint.save_atomically`), and ``torch.nn.parallel.DistributedDataParallel``
    drops ``device_ids`` for CPU devices (main passes ``device_ids=[device]`` even on CPU, which
    DDP rejects, so gloo training on CPU would fail).
``open_clip_train.data.get_wds_dataset``
    for training, :func:`clip_dcl.train.pipeline.get_wds_train_dataset` (batches carry ids);
    validation keeps OpenCLIP's.
``open_clip_train.data.get_csv_dataset``, ``get_synthetic_dataset``
    OpenCLIP's, with each training batch extended by the samples' indices (the CSV row, the
    synthetic sample's index) as their ids (:func:`clip_dcl.train.pipeline.with_indices`).

Between optimizer steps (in the dataloader handed to ``train_one_epoch``): a signal of
``--preempt-signals`` (or ``--save-every-minutes``) saves a checkpoint at that step and, for a
signal, ends the run (:mod:`clip_dcl.train.preempt`); a resume from such a checkpoint reads the
epoch's batches already trained on again without training on them and shifts the scheduler's step
by as many steps, so the epoch continues where it stopped.

Also per epoch: the main process's RNGs are seeded from ``(--seed, epoch, rank)``, so that a run
resumed at an epoch boundary repeats an uninterrupted run (the data workers do the same, see
``pipeline.py``); every rank logs a digest of the whole loss state (identical on all ranks, whether
DeCL's buffer is sharded or replicated); a sharded buffer is checkpointed one file per rank (see
``loss_state.py``).

Everything here targets open_clip_train 3.3's ``main.py``/``train.py``/``data.py``; upstream 4.x
replaces this surface (training tasks with dict batches). :func:`check_openclip` runs when this
module is imported: it checks the installed version and every name patched or called here (and
the log line parsed from ``train_one_epoch``), and fails with one message naming the supported
range rather than with an ``AttributeError`` halfway through a run, or a patch that silently
stops taking effect.
"""
from __future__ import annotations

import contextlib
import dataclasses
import glob
import inspect
import logging
import math
import os
import pickle
import random
import re
import shutil
import types
from collections import deque
from typing import Dict, Optional

import numpy as np
import open_clip
import torch
from open_clip_train import data as oc_data
from open_clip_train import main as oc_main
from open_clip_train import params as oc_params
from open_clip_train import train as oc_train

from clip_dcl.losses.decl import SampleIdError
from clip_dcl.losses.state import digest_of_state_dict

from .. import checkpoint as ckpt_format
from . import loss_state as sharded_state
from . import preempt as preemption
from .flags import TrainConfig, full_loss_args, loss_command, openclip_native
from .ids import MissingSampleIds, SampleIdOutOfRange
from .pipeline import get_wds_train_dataset, id_collisions, mix_seed, summary_line, with_indices

#: The open_clip_torch releases whose ``open_clip_train`` this module patches: ``>=`` first, ``<`` second.
SUPPORTED_OPENCLIP = ((3, 3), (3, 4))


class OpenCLIPMismatch(ImportError):
    """The installed ``open_clip_torch`` is not a release whose trainer clip-dcl can patch."""


def _params(fn) -> Optional[list]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def _source(obj) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


_TRAIN_STEP_ARGS = ["model", "data", "loss", "epoch", "optimizer", "scaler", "scheduler", "dist_model", "args",
                    "tb_writer"]
#: ``(module name, attribute) -> expected parameter names`` (None: must exist, not a callable we wrap).
_TARGETS = {
    ("main", "main"): ["args"],
    ("main", "parse_args"): ["args"],
    ("main", "create_loss"): ["args"],
    ("main", "train_one_epoch"): _TRAIN_STEP_ARGS,
    ("main", "pt_load"): ["file_path", "map_location"],
    ("main", "natural_key"): ["string_"],
    ("main", "torch"): None,
    ("main", "LATEST_CHECKPOINT_NAME"): None,
    ("train", "train_one_epoch"): _TRAIN_STEP_ARGS,
    ("train", "AverageMeter"): [],
    ("train", "unwrap_model"): ["model"],
    ("params", "parse_args"): ["args"],
    ("data", "get_wds_dataset"): ["args", "preprocess_img", "is_train", "epoch", "floor", "tokenizer"],
    ("data", "get_csv_dataset"): ["args", "preprocess_fn", "is_train", "epoch", "tokenizer"],
    ("data", "get_synthetic_dataset"): ["args", "preprocess_fn", "is_train", "epoch", "tokenizer"],
    ("data", "get_dataset_fn"): ["data_path", "dataset_type"],
    ("data", "get_dataset_size"): ["shards"],
    ("data", "expand_urls"): ["urls", "weights"],
    ("data", "group_by_keys_nothrow"): ["data", "keys", "lcase", "suffixes", "handler"],
    ("data", "log_and_continue"): ["exn"],
    ("data", "detshuffle2"): ["bufsize", "initial", "seed", "epoch"],
    ("data", "ResampledShards2"): ["urls", "weights", "nshards", "worker_seed", "deterministic", "epoch"],
    ("data", "SharedEpoch"): ["epoch"],
    ("data", "DataInfo"): ["dataloader", "sampler", "shared_epoch"],
    ("data", "_SHARD_SHUFFLE_SIZE"): None,
    ("data", "_SHARD_SHUFFLE_INITIAL"): None,
    ("data", "_SAMPLE_SHUFFLE_SIZE"): None,
    ("data", "_SAMPLE_SHUFFLE_INITIAL"): None,
}
#: Code the patches rely on: main must look these names up in its own namespace when it runs (so
#: that swapping them takes effect), and train_one_epoch must log the line parsed here and in
#: ``clip_dcl.experiment``.
_SOURCE_NEEDS = {
    ("main", "main"): ["torch.save(", "torch.nn.parallel.DistributedDataParallel(", "pt_load(args.resume",
                       "create_loss(args)", "train_one_epoch(model, data, loss, epoch", "get_latest_checkpoint("],
    ("train", "train_one_epoch"): ['f"Train Epoch: {epoch} [', 'f"Data (t): ', 'f"Batch (t): ',
                                   "images, texts = batch", "for i, batch in enumerate(dataloader)",
                                   "scheduler(step)"],
    ("data", "get_dataset_fn"): ["return get_wds_dataset", "return get_csv_dataset", "return get_synthetic_dataset"],
}


def openclip_problems(version: str, modules: Dict[str, types.ModuleType]) -> list:
    """What keeps the patches from working with these ``open_clip_train`` modules (empty: nothing).

    ``modules`` maps ``"main"``, ``"train"``, ``"data"``, ``"params"`` to the modules.
    """
    problems = []
    try:
        major_minor = tuple(int(p) for p in version.split(".")[:2])
    except ValueError:
        major_minor = None
    low, high = SUPPORTED_OPENCLIP
    if major_minor is None or not (low <= major_minor < high):
        problems.append(f"version {version}")
    for (mod, name), expected in _TARGETS.items():
        if not hasattr(modules[mod], name):
            problems.append(f"open_clip_train.{mod}.{name} is missing")
            continue
        value = getattr(modules[mod], name)
        if name.startswith("_SHARD") or name.startswith("_SAMPLE"):
            if not isinstance(value, int):
                problems.append(f"open_clip_train.{mod}.{name} is not an int")
        elif name == "torch":
            if value is not torch and not isinstance(value, types.ModuleType):
                problems.append(f"open_clip_train.{mod}.torch is not the torch module")
        elif expected is not None and _params(value) != expected:
            problems.append(f"open_clip_train.{mod}.{name}{tuple(_params(value) or ())} differs from "
                            f"{name}{tuple(expected)}")
    for (mod, name), needles in _SOURCE_NEEDS.items():
        code = _source(getattr(modules[mod], name, None))
        missing = [n for n in needles if n not in code]
        if missing:
            problems.append(f"open_clip_train.{mod}.{name} no longer contains {', '.join(repr(n) for n in missing)}")
    return problems


def check_openclip(version: Optional[str] = None, modules: Optional[Dict[str, types.ModuleType]] = None) -> None:
    """Raise :class:`OpenCLIPMismatch` unless the installed trainer is one these patches fit."""
    if version is None:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as dist_version

        try:
            version = dist_version("open_clip_torch")
        except PackageNotFoundError:
            version = getattr(open_clip, "__version__", "unknown")
    modules = modules or {"main": oc_main, "train": oc_train, "data": oc_data, "params": oc_params}
    problems = openclip_problems(version, modules)
    if problems:
        (a, b), (c, d) = SUPPORTED_OPENCLIP
        raise OpenCLIPMismatch(
            f"clip-dcl's trainer supports open_clip_torch >={a}.{b},<{c}.{d} (its open_clip_train), and the "
            f"installed one does not fit: {'; '.join(problems)}. Install a supported release: "
            f"pip install 'open_clip_torch>={a}.{b},<{c}.{d}'")


# The versions and names must match before anything below looks them up.
check_openclip()

_OPENCLIP_CREATE_LOSS = oc_main.create_loss
_OPENCLIP_TRAIN_ONE_EPOCH = oc_train.train_one_epoch
_OPENCLIP_GET_WDS_DATASET = oc_data.get_wds_dataset
_OPENCLIP_GET_CSV_DATASET = oc_data.get_csv_dataset
_OPENCLIP_GET_SYNTHETIC_DATASET = oc_data.get_synthetic_dataset
_OPENCLIP_PT_LOAD = oc_main.pt_load
_OPENCLIP_SETUP_LOGGING = oc_main.setup_logging


@contextlib.contextmanager
def torch_log_levels_kept():
    """Give PyTorch's loggers their levels back after the block (OpenCLIP's ``setup_logging`` inside it
    sets every existing logger to INFO, and TorchDynamo then prints its statistics at exit)."""
    torch_loggers = {name: logging.getLogger(name).level for name in list(logging.root.manager.loggerDict)
                     if name == "torch" or name.startswith("torch.")}
    try:
        yield
    finally:
        for name, saved in torch_loggers.items():
            logging.getLogger(name).setLevel(saved)


def _setup_logging(log_file, level, include_host=False):
    """OpenCLIP's ``setup_logging``, with PyTorch's own loggers left at their levels (:func:`torch_log_levels_kept`)."""
    with torch_log_levels_kept():
        _OPENCLIP_SETUP_LOGGING(log_file, level, include_host=include_host)


class LossStateMismatch(RuntimeError):
    """The checkpoint being resumed holds loss state that the configured loss cannot take."""


class ObjectiveMismatch(LossStateMismatch):
    """The checkpoint being resumed was trained with another ``--loss`` than the one configured."""


# -- checkpoint contents ---------------------------------------------------------------------------
def loss_state_digest(loss) -> str:
    """Digest of a live loss's whole state (collective for a sharded DeCL buffer), or of a ``state_dict``.

    The same value for the same state however it is held: see :mod:`clip_dcl.losses.state`.
    """
    if isinstance(loss, dict):
        return digest_of_state_dict(loss)
    if hasattr(loss, "state_digest"):
        return loss.state_digest()
    return digest_of_state_dict(loss.state_dict())


#: Moved to :mod:`clip_dcl.checkpoint`, which owns the checkpoint format.
trained_model_config = ckpt_format.trained_model_config


# -- ids from the dataloader to the loss -----------------------------------------------------------
class _SkippedSteps:
    """Undoes the loss state's update of an optimizer step that AMP's GradScaler skipped.

    GradScaler skips the step and lowers its scale when it finds inf or NaN gradients; the loss
    state (DeCL's rates or queue, its step counter) must then stay as it was, so that the run goes
    on as if the step had not happened. Checked between steps, when the loop asks for the next
    batch: a lower scale than at the previous check means the step just taken was skipped, and
    ``rollback_step()`` of the loss undoes its update. No scaler (fp32, bf16): nothing to check.
    """

    def __init__(self, scaler, loss):
        self.scaler = scaler if scaler is not None and getattr(scaler, "is_enabled", lambda: True)() else None
        self.loss = loss
        self.scale = self.scaler.get_scale() if self.scaler is not None else None
        self.count = 0

    def check(self, epoch: int, step: int) -> None:
        if self.scaler is None or step == 0:
            return
        scale = self.scaler.get_scale()
        if scale < self.scale and callable(getattr(self.loss, "rollback_step", None)) and self.loss.rollback_step():
            self.count += 1
            logging.warning(f"Epoch {epoch}, step {step}: the AMP GradScaler skipped the optimizer step (inf or NaN "
                            "gradients); the loss state's update of that step was undone")
        self.scale = scale


class _IdChannel:
    """Iterates the training dataloader for OpenCLIP's loop, keeping each batch's ids aside.

    OpenCLIP's ``train_one_epoch`` unpacks ``images, texts = batch``, so the ids are held here and
    handed to the loss by :class:`_LossWithIds`. The loop calls the loss after fetching the last
    micro-batch of an optimizer step and before fetching the next one, each time on the
    concatenation of the step's ``accum_freq`` micro-batches in fetch order (micro-batch ``j``'s
    rows recomputed with gradients, the others cached); so the ids of every call are the
    concatenation of the ids of the last ``accum_freq`` batches fetched.

    Two more things happen here, between optimizer steps (a step ends when the loop asks for the
    first micro-batch of the next one): ``skip`` batches are read and dropped at the start of the
    epoch (a mid-epoch resume: the steps the checkpoint already took), then ``resumed()`` is
    called; and before every later step, ``at_boundary(step)`` (steps taken in the epoch) may end
    the epoch here, which ends OpenCLIP's loop after a whole step.
    """

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
            if (self.at_boundary is not None and self.fetched % self.accum_freq == 0
                    and self.fetched < self.num_batches and self.at_boundary(self.fetched // self.accum_freq)):
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


class _LossWithIds:
    """Calls the loss with ``sample_ids`` from the channel when it needs them; keeps its metrics."""

    def __init__(self, loss, channel: _IdChannel, device):
        self.loss = loss
        self.channel = channel
        self.device = device
        self.metrics: Dict[str, torch.Tensor] = {}

    def __call__(self, *args, **kwargs):
        if getattr(self.loss, "requires_sample_ids", False):
            ids = self.channel.ids()
            if ids is None:
                raise MissingSampleIds("--decl-rate index needs sample ids and the training batches carry none: "
                                       "train on webdataset shards, a CSV or --dataset-type synthetic, or use "
                                       "--decl-rate queue / batch (no ids needed)")
            kwargs["sample_ids"] = ids.to(self.device, non_blocking=True)
        try:
            # the loss checks the ids of the whole global batch, so every rank raises together
            out = self.loss(*args, **kwargs)
        except SampleIdError as e:
            hint = ("" if "negative" in str(e) else " (img2dataset keys are shard * 10^k + index, so they can "
                    "exceed the sample count in sizes.json: set --decl-num-samples above the largest key)")
            raise SampleIdOutOfRange(f"{e}{hint}") from None
        # Kept as tensors: reading them (a device sync) waits for OpenCLIP's logging steps.
        self.metrics = dict(getattr(self.loss, "metrics", {}))
        return out


class _TrainLineHook(logging.Filter):
    """Adds the loss's metrics to OpenCLIP's ``Train Epoch:`` log line, tensorboard and wandb.

    OpenCLIP logs on the master rank after the optimizer step of every ``--log-every-n-steps``-th
    step; the metrics are those of the step's last loss call, with the running average over
    logged steps in parentheses, in OpenCLIP's own format. They are logged apart from the loss
    terms because OpenCLIP sums every term the loss returns.
    """

    def __init__(self, wrapped: _LossWithIds, channel: _IdChannel, epoch: int, args, tb_writer):
        super().__init__()
        self.wrapped, self.channel, self.epoch, self.args, self.tb_writer = wrapped, channel, epoch, args, tb_writer
        self.meters: Dict[str, oc_train.AverageMeter] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not (isinstance(record.msg, str) and record.msg.startswith("Train Epoch:") and self.wrapped.metrics):
            return True
        for name, value in self.wrapped.metrics.items():
            self.meters.setdefault(name, oc_train.AverageMeter()).update(float(value))
        record.msg += " " + " ".join(
            f"{name.capitalize()}: {m.val:#.5g} ({m.avg:#.5g})" for name, m in self.meters.items())
        steps_per_epoch = self.channel.num_batches // self.args.accum_freq
        step = steps_per_epoch * self.epoch + (self.channel.fetched - 1) // self.args.accum_freq
        log_data = {f"train/{name}": m.val for name, m in self.meters.items()}
        if self.tb_writer is not None:
            for name, value in log_data.items():
                self.tb_writer.add_scalar(name, value, step)
        if self.args.wandb:
            import wandb

            wandb.log(log_data, step=step)
        return True


# -- the run ---------------------------------------------------------------------------------------
def _seed_main_process(args, epoch: int) -> None:
    seed = mix_seed(args.seed, epoch, args.rank)
    random.seed(seed)
    np.random.seed(seed % 2 ** 32)
    torch.manual_seed(seed)


def _cpu_safe_ddp(module, device_ids=None, **kwargs):
    """``DistributedDataParallel`` without ``device_ids`` for CPU devices (DDP rejects them there)."""
    if device_ids and all(torch.device(d).type == "cpu" for d in device_ids):
        device_ids = None
    return torch.nn.parallel.DistributedDataParallel(module, device_ids=device_ids, **kwargs)


class _Overlay(types.ModuleType):
    """A stand-in for a module: the given attributes, and the module's own for everything else."""

    def __init__(self, base: types.ModuleType, **overrides):
        super().__init__(base.__name__, getattr(base, "__doc__", None))
        self._base = base
        self.__dict__.update(overrides)

    def __getattr__(self, name):
        return getattr(self._base, name)


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
        self.train_data_size: Optional[int] = None  # rows of a CSV / size of synthetic training data
        self.resume_latest = False  # --resume latest (main replaces args.resume with the file it found)
        self.signals: Optional[preemption.StopSignals] = None  # installed by run_training
        self.gate: Optional[preemption.StepGate] = None
        self.resume_position: Optional[dict] = None  # ckpt["clip_dcl"]["resume"] of a mid-epoch checkpoint
        self.last_step_save: Optional[str] = None
        self.epoch_num_batches: Optional[int] = None

    # open_clip_train.main.parse_args
    def parse_args(self, argv):
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
        args.captions_per_image = cfg.captions_per_image
        self.args = args
        return args

    # open_clip_train.main.pt_load
    def pt_load(self, path, map_location="cpu"):
        ckpt = self._load_resumable(path, map_location)
        if isinstance(ckpt, dict) and "epoch" in ckpt:
            path = self.args.resume if self.args is not None and self.args.resume else path
            entry = ckpt.get(ckpt_format.CKPT_KEY)
            self.resume_position = entry.get("resume") if isinstance(entry, dict) else None
            self._check_objective(ckpt, path)
            if self.config.loss_reset:
                logging.info(f"--loss-reset: the {self.config.loss} loss starts with fresh state; {path} keeps "
                             "only the model and optimizer.")
                return ckpt
            self.resumed = {key: ckpt.get(key) for key in (ckpt_format.LOSS_STATE_KEY, ckpt_format.CKPT_KEY)}
            self.resumed_path = path
        return ckpt

    def _load_resumable(self, path, map_location):
        """OpenCLIP's ``pt_load``; on ``--resume latest``, the newest checkpoint that loads, from ``path`` down.

        A save killed halfway (by OpenCLIP before 3.3's own saves, or another tool) leaves a torn
        ``*.pt`` that OpenCLIP's ``--resume latest`` would pick and die on.
        """
        unreadable = (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError)
        try:
            return _OPENCLIP_PT_LOAD(path, map_location=map_location)
        except unreadable as e:
            if not self.resume_latest:
                raise ckpt_format.CheckpointUnreadable(
                    f"--resume {path}: the checkpoint cannot be read; it is truncated (a save that was "
                    f"interrupted?) or not a torch checkpoint ({ckpt_format._first_line(e)})") from None
            failed = [(path, ckpt_format._first_line(e))]
        folder = getattr(self.args, "checkpoint_path", None) or os.path.dirname(path)
        older = sorted(glob.glob(os.path.join(folder, "**", "*.pt"), recursive=True), key=oc_main.natural_key)
        older = [c for c in older if oc_main.natural_key(c) < oc_main.natural_key(path)]
        for candidate in reversed(older):
            logging.warning(f"--resume latest: {failed[-1][0]} cannot be read ({failed[-1][1]}); trying the "
                            f"previous checkpoint, {candidate}.")
            try:
                ckpt = _OPENCLIP_PT_LOAD(candidate, map_location=map_location)
            except unreadable as e:
                failed.append((candidate, ckpt_format._first_line(e)))
                continue
            self.args.resume = candidate  # main logs the file it resumed from args.resume
            return ckpt
        raise ckpt_format.CheckpointUnreadable(
            f"--resume latest: no checkpoint under {folder} can be read ("
            f"{'; '.join(f'{p}: {why}' for p, why in failed)}); remove the torn files, or start without --resume")

    def _check_objective(self, ckpt: dict, path) -> None:
        """Refuse to resume a checkpoint trained with another ``--loss``, unless ``--loss-reset``."""
        entry = ckpt.get(ckpt_format.CKPT_KEY)
        saved = entry.get("loss") if isinstance(entry, dict) else None
        if saved is None or saved == self.config.loss or self.config.loss_reset:
            return
        saved_flags = " ".join(loss_command(saved, entry.get("loss_args") or {}))
        raise ObjectiveMismatch(
            f"{path} was trained with {saved_flags}; resuming it with --loss {self.config.loss} would change the "
            f"objective. To continue the same training, add: {saved_flags}. To train --loss {self.config.loss} from "
            f"this checkpoint on purpose (the saved loss state is dropped), add --loss-reset.")

    # open_clip_train.main.create_loss
    def create_loss(self, args):
        cfg = self.config
        native = openclip_native(cfg.loss)
        if native and not cfg.no_grad_gather and cfg.captions_per_image == 1:
            loss = _OPENCLIP_CREATE_LOSS(args)
        else:
            from clip_dcl.losses import LOSSES, create_loss

            kwargs = self.resolve_loss_args(args)
            # allocated on the device directly: no host copy of a large per-sample buffer
            on_device = {"device": args.device} if "device" in inspect.signature(LOSSES[cfg.loss]).parameters else {}
            if cfg.no_grad_gather:
                on_device["no_grad_gather"] = True
            loss = create_loss(cfg.loss, rank=args.rank, world_size=args.world_size, local_loss=args.local_loss,
                               gather_with_grad=args.gather_with_grad, **kwargs, **on_device)
        loss = loss.to(args.device) if isinstance(loss, torch.nn.Module) else loss
        self._restore(loss)
        self.loss = loss  # the module whose state is checkpointed
        if not native and "coca" in args.model.lower():
            # CoCa: our contrastive term, OpenCLIP's captioning term, both with OpenCLIP's weights
            from clip_dcl.losses.coca import CoCaObjective

            loss = CoCaObjective(loss, caption_loss_weight=args.coca_caption_loss_weight,
                                 contrastive_loss_weight=args.coca_contrastive_loss_weight)
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
        state, meta = self.resumed[ckpt_format.LOSS_STATE_KEY], self.resumed[ckpt_format.CKPT_KEY] or {}
        saved_size = meta.get("train_data_size")
        if saved_size is not None and self.train_data_size is not None and saved_size != self.train_data_size:
            logging.warning(f"{self.resumed_path} was trained on {saved_size} samples of --train-data, which now has "
                            f"{self.train_data_size}: its rows are the sample ids, so rows that moved read the rates "
                            "of other samples (keep the CSV's rows in place between a run and its resume)")
        stateful = isinstance(loss, torch.nn.Module) and len(loss.state_dict()) > 0
        saved_loss = meta.get("loss")
        if saved_loss is not None and saved_loss != self.config.loss:
            if stateful:
                logging.warning(f"{self.resumed_path} was trained with --loss {saved_loss}; --loss "
                                f"{self.config.loss} starts with fresh loss state.")
            return
        if state is None:
            if stateful:
                logging.warning(f"{self.resumed_path} holds no loss state; the {self.config.loss} loss starts fresh.")
            return
        try:
            index = meta.get(ckpt_format.SHARD_INDEX_KEY)
            if index:  # a sharded buffer: in files beside the checkpoint, built into this rank's part
                state = sharded_state.restore_sharded(loss, state, index, self.resumed_path)
            loss.load_state_dict(state)
        except (RuntimeError, KeyError, ValueError) as e:
            raise LossStateMismatch(
                f"cannot restore the {self.config.loss} loss state from {self.resumed_path} (it was trained with "
                f"{meta.get('loss_args')}; now {self.config.loss_args}): {e}") from None
        if stateful:
            logging.info(f"Restored the {self.config.loss} loss state from {self.resumed_path} "
                         f"(digest {loss_state_digest(loss)}).")

    # open_clip_train.main.train_one_epoch
    def train_one_epoch(self, model, data, loss, epoch, optimizer, scaler, scheduler, dist_model, args,
                        tb_writer=None):
        """OpenCLIP's ``train_one_epoch``, called as is, with ids carried around it (see module doc)."""
        if self.preprocess_cfg is None:
            try:
                self.preprocess_cfg = dict(open_clip.get_model_preprocess_cfg(oc_train.unwrap_model(model)))
            except AttributeError:  # not an OpenCLIP model
                self.preprocess_cfg = {}
        _seed_main_process(args, epoch)
        if self.gate is None:
            self.gate = preemption.StepGate(self.config.preempt, self.signals, args.world_size, args.rank,
                                            args.device)
        self.epoch_num_batches = data["train"].dataloader.num_batches
        skip_steps, resumed = self._resume_point(epoch, args, self.epoch_num_batches)

        state_loss = getattr(loss, "contrastive", loss)  # CoCa: the contrastive term holds the state
        skipped = _SkippedSteps(scaler, state_loss)

        def at_boundary(step: int) -> bool:
            skipped.check(epoch, step)
            stop, save = self.gate.poll(step)
            if stop or save:
                self.last_step_save = self.save_step(model, optimizer, scaler, epoch, step, args,
                                                     self.gate.signame if stop else None)
                self.gate.saved()
            return stop

        channel = _IdChannel(data["train"].dataloader, args.accum_freq, skip=skip_steps * args.accum_freq,
                             resumed=resumed, at_boundary=at_boundary)
        data = {**data, "train": dataclasses.replace(data["train"], dataloader=channel)}
        if skip_steps and scheduler is not None:  # OpenCLIP counts the epoch's steps from 0 again
            schedule = scheduler

            def scheduler(step):
                return schedule(step + skip_steps)
        wrapped = _LossWithIds(loss, channel, torch.device(args.device))
        hook = _TrainLineHook(wrapped, channel, epoch, args, tb_writer)
        logging.getLogger().addFilter(hook)
        try:
            _OPENCLIP_TRAIN_ONE_EPOCH(model, data, wrapped, epoch, optimizer, scaler, scheduler, dist_model, args,
                                      tb_writer=tb_writer)
        finally:
            logging.getLogger().removeFilter(hook)
        skipped.check(epoch, channel.fetched // args.accum_freq)  # the epoch's last step
        if channel.stopped_at is not None:
            raise preemption.Preempted(self.gate.signame or "a signal", self.last_step_save, epoch, channel.stopped_at)
        self.log_data_stats(data["train"].dataloader.dataloader, epoch, args)
        loss = getattr(loss, "contrastive", loss)  # CoCa: the contrastive term holds the state
        if isinstance(loss, torch.nn.Module) and len(loss.state_dict()):
            self.shards = sharded_state.write_shards(loss, args, epoch + 1)
            state = loss.state_dict()
            calls = f"calls {int(state['calls'])}, " if "calls" in state else ""
            logging.info(f"Loss state after epoch {epoch} on rank {args.rank}: {calls}"
                         f"digest {loss_state_digest(loss)}")

    def _resume_point(self, epoch: int, args, num_batches: int):
        """``(optimizer steps to skip, callback after the skip)`` for ``epoch``: a mid-epoch checkpoint's
        step in its own epoch, ``(0, None)`` otherwise."""
        pos = self.resume_position
        if not pos or int(pos.get("epoch", -1)) != epoch:
            return 0, None
        self.resume_position = None
        step = int(pos["step"])
        now = {"world_size": args.world_size, "batch_size": args.batch_size, "accum_freq": args.accum_freq,
               "workers": args.workers, "seed": args.seed, "num_batches": num_batches}
        changed = [f"{k} {pos.get(k)} -> {v}" for k, v in now.items() if pos.get(k) != v]
        if changed:
            logging.warning(f"Resuming epoch {epoch} at step {step} with other settings than the stopped run "
                            f"({', '.join(changed)}): the learning-rate schedule continues at the step, but the rest "
                            "of the epoch is another draw of the data than the stopped run would have seen.")
        rng = pos.get("rng") or []

        def resumed():
            if len(rng) == args.world_size:
                preemption.set_rng_state(rng[args.rank])
            logging.info(f"Resumed epoch {epoch} at step {step} of {num_batches // args.accum_freq}: the "
                         f"{step * args.accum_freq} batches of the steps already taken were read again, not trained on.")

        return step, resumed

    def save_step(self, model, optimizer, scaler, epoch: int, step: int, args, signame: Optional[str]):
        """Every rank: save a checkpoint after ``step`` optimizer steps of ``epoch`` (the master writes it).

        The file is ``epoch_latest.pt`` with ``--save-most-recent`` (what ``--resume latest`` reads then),
        else ``epoch_{epoch}_step_{step}.pt`` (after ``epoch_{epoch}.pt`` and before ``epoch_{epoch+1}.pt``
        in ``--resume latest``'s order); an earlier mid-epoch file is removed once it is written.
        ``"epoch"`` is the epochs completed, as OpenCLIP's main reads it, and ``ckpt["clip_dcl"]["resume"]``
        the step, the settings it was taken with and every rank's random state. Returns the path
        (None on other ranks, or without --logs).
        """
        rng = preemption.gather_rng_states(args.world_size)
        if not (args.logs and str(args.logs).lower() != "none"):
            return None
        folder = sharded_state.write_step_shards(self.loss, args, epoch, step) if self.loss is not None else None
        path = None
        if args.save_logs:
            name = oc_main.LATEST_CHECKPOINT_NAME if args.save_most_recent else f"epoch_{epoch}_step_{step}.pt"
            path = os.path.join(args.checkpoint_path, name)
            original = getattr(model, "_orig_mod", model)  # torch.compile's wrapper: save the model's own keys
            ckpt = {"epoch": epoch, "name": args.name, "state_dict": original.state_dict(),
                    "optimizer": optimizer.state_dict()}
            if scaler is not None:
                ckpt["scaler"] = scaler.state_dict()
            resume = {"epoch": epoch, "step": step, "world_size": args.world_size, "batch_size": args.batch_size,
                      "accum_freq": args.accum_freq, "workers": args.workers, "seed": args.seed,
                      "num_batches": self.epoch_num_batches, "rng": rng, "signal": signame}
            ckpt = self._with_entries(ckpt, folder, resume)
            ckpt_format.save_atomically(ckpt, path, self._torch_save)
            for old in glob.glob(os.path.join(args.checkpoint_path, "epoch_*_step_*.pt")):
                if old != path:
                    with contextlib.suppress(OSError):
                        os.remove(old)
            sharded_state.prune_step_folders(args.checkpoint_path, keep=folder.name if folder else None)
            why = f"on {signame}" if signame else f"every {self.config.preempt.save_every_minutes:g} minutes"
            logging.info(f"Saved {path}: step {step} of epoch {epoch} ({why}).")
        if args.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.barrier()  # no rank leaves before the file is whole
        return path

    @staticmethod
    def _torch_save(obj, fh):
        torch.save(obj, fh)

    def log_data_stats(self, dataloader, epoch: int, args) -> None:
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
        why = ("their keys are not numeric, so their ids are hashed into --decl-num-samples rows; give the shards "
               "numeric json keys, or raise --decl-num-samples to share fewer rows"
               if report["counts"]["hashed"] else
               "two samples carry the same key (shards whose keys restart, or a key repeated); give every sample "
               "a unique numeric json 'key'")
        logging.warning(f"Sample ids, epoch {epoch}{where}: {samples} distinct samples but {ids} distinct ids: "
                        f"{samples - ids} samples share a rate row with another ({why}).")

    # open_clip_train.main.torch.save
    def save(self, obj, f, *args, **kwargs):
        training = isinstance(obj, dict) and "state_dict" in obj and "epoch" in obj and self.loss is not None
        if training:
            obj = self._with_entries(obj, self.shards)
        if not isinstance(f, (str, os.PathLike)):
            return torch.save(obj, f, *args, **kwargs)
        ckpt_format.save_atomically(obj, f, lambda o, fh: torch.save(o, fh, *args, **kwargs))
        if training and self.args is not None and getattr(self.args, "checkpoint_path", None):
            # an epoch's checkpoint supersedes the mid-epoch ones of earlier epochs
            completed = int(obj["epoch"])
            for old in glob.glob(os.path.join(self.args.checkpoint_path, "epoch_*_step_*.pt")):
                m = re.fullmatch(r"epoch_(\d+)_step_\d+\.pt", os.path.basename(old))
                if m and int(m.group(1)) < completed:
                    with contextlib.suppress(OSError):
                        os.remove(old)
            sharded_state.prune_step_folders(self.args.checkpoint_path, before_epoch=completed)

    def _with_entries(self, obj: dict, shards, resume: Optional[dict] = None) -> dict:
        """OpenCLIP's checkpoint dict with the loss state and ``ckpt["clip_dcl"]`` added."""
        meta = self.checkpoint_meta()
        if sharded_state.is_sharded(self.loss):  # the shards are in files beside (written by every rank)
            if shards is None:
                raise RuntimeError("OpenCLIP saves a checkpoint for an epoch whose loss-state shards were not "
                                   "written; clip_dcl.train.loss_state.checkpointed() no longer matches its "
                                   "conditions")
            state = sharded_state.small_state(self.loss)
            meta[ckpt_format.SHARD_INDEX_KEY] = sharded_state.shard_index(self.loss, shards, self.args.checkpoint_path)
        else:
            state = self.loss.state_dict() if isinstance(self.loss, torch.nn.Module) else {}
        if resume is not None:
            meta["resume"] = resume
        return ckpt_format.add_training_entries(obj, state, meta)

    def checkpoint_meta(self) -> dict:
        """What a downstream loader needs without the training flags (``ckpt["clip_dcl"]``)."""
        args = self.args
        entry = ckpt_format.checkpoint_entry(args.model, ckpt_format.trained_model_config(args), self.preprocess_cfg,
                                             self.config.loss, self.config.loss_args)
        if self.train_data_size is not None:  # CSV rows / synthetic samples: the ids are their indices
            entry["train_data_size"] = self.train_data_size
        return entry

    # open_clip_train.data.get_wds_dataset
    def get_wds_dataset(self, args, preprocess_img, is_train, epoch=0, floor=False, tokenizer=None):
        if is_train:
            info = get_wds_train_dataset(args, preprocess_img, is_train=True, epoch=epoch, floor=floor,
                                         tokenizer=tokenizer)
            self.train_num_batches = info.dataloader.num_batches
            return info
        return _OPENCLIP_GET_WDS_DATASET(args, preprocess_img, is_train, epoch=epoch, floor=floor,
                                         tokenizer=tokenizer)

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
        return self._map_style(_OPENCLIP_GET_CSV_DATASET, args, preprocess_fn, is_train, epoch, tokenizer)

    def get_synthetic_dataset(self, args, preprocess_fn, is_train, epoch=0, tokenizer=None):
        return self._map_style(_OPENCLIP_GET_SYNTHETIC_DATASET, args, preprocess_fn, is_train, epoch, tokenizer)


@contextlib.contextmanager
def patched(run: TrainingRun):
    """Swap the names listed in the module docstring for ``run``'s, and restore them on exit."""
    targets = {
        (oc_main, "parse_args"): run.parse_args,
        (oc_main, "create_loss"): run.create_loss,
        (oc_main, "train_one_epoch"): run.train_one_epoch,
        (oc_main, "pt_load"): run.pt_load,
        (oc_main, "setup_logging"): _setup_logging,
        (oc_main, "torch"): _Overlay(torch, save=run.save, nn=_Overlay(
            torch.nn, parallel=_Overlay(torch.nn.parallel, DistributedDataParallel=_cpu_safe_ddp))),
        (oc_data, "get_wds_dataset"): run.get_wds_dataset,
        (oc_data, "get_csv_dataset"): run.get_csv_dataset,
        (oc_data, "get_synthetic_dataset"): run.get_synthetic_dataset,
    }
    saved = {key: getattr(*key) for key in targets}
    for (module, name), value in targets.items():
        setattr(module, name, value)
    try:
        yield run
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)


def rewrite_param(params_file: str, name: str, value) -> None:
    """Replace the ``name: value`` line of OpenCLIP's params.txt (its format), when the file exists."""
    if not os.path.isfile(params_file):
        return
    with open(params_file) as f:
        lines = f.read().splitlines(keepends=True)
    with open(params_file, "w") as f:
        f.writelines(f"{name}: {value}\n" if line.startswith(f"{name}: ") else line for line in lines)


def _log_dir(argv) -> Optional[str]:
    """``--logs/--name`` of an OpenCLIP command line, when a name is given (else main makes one up)."""
    args = oc_params.parse_args(list(argv))
    if not args.name or not args.logs or args.logs.lower() == "none":
        return None
    return os.path.join(args.logs, args.name)


def run_training(config: TrainConfig) -> int:
    """Run ``open_clip_train.main.main`` with ``config``'s objective; return an exit code.

    A run that fails before writing any checkpoint removes the ``--logs/--name`` folder it created
    (OpenCLIP would refuse the rerun: "Experiment already exists"); its log went to stderr too.
    """
    run = TrainingRun(config)
    log_dir = _log_dir(config.openclip_argv)
    created = log_dir is not None and not os.path.exists(log_dir)
    result = -1
    if config.preempt.signals:  # before main starts the data workers, which inherit the handlers
        run.signals = preemption.StopSignals(config.preempt.signals).install()
    try:
        with patched(run):
            result = oc_main.main(list(config.openclip_argv))
    except preemption.Preempted as e:
        result = preemption.PREEMPTED_EXIT_CODE
        if e.path:
            how = (f"run the same command with --resume latest (or --resume {e.path}); it continues at step "
                   f"{e.step} of epoch {e.epoch}")
        elif run.args is not None and run.args.rank == 0:
            how = "no checkpoint was written (no --logs)"
        else:
            how = "rank 0 saved the checkpoint"
        logging.warning(f"Stopped on {e.signame} after step {e.step} of epoch {e.epoch}: {how}. Exit code "
                        f"{result}.")
    finally:
        if run.signals is not None:
            run.signals.restore()
        master = run.args is not None and getattr(run.args, "rank", 0) == 0
        if result is not None and created and master and os.path.isdir(log_dir) and not glob.glob(
                os.path.join(log_dir, "checkpoints", "**", "*.pt"), recursive=True):
            shutil.rmtree(log_dir, ignore_errors=True)
            logging.error(f"The run failed before writing a checkpoint; removed {log_dir}, so the same command "
                          "can be run again.")
    # OpenCLIP's main returns None when it finishes and -1 when it refuses to start.
    return 0 if result is None else (1 if result < 0 else int(result))
