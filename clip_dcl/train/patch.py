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
    OpenCLIP's loader; keeps the ``loss_state`` of the checkpoint being resumed.
``open_clip_train.main.torch``
    ``torch`` itself except for two names that only ``main`` sees: ``torch.save`` adds
    ``ckpt["loss_state"]`` and ``ckpt["clip_dcl"]`` to every training checkpoint main writes
    (``epoch_N.pt``, ``epoch_latest.pt``), and ``torch.nn.parallel.DistributedDataParallel``
    drops ``device_ids`` for CPU devices (main passes ``device_ids=[device]`` even on CPU, which
    DDP rejects, so gloo training on CPU would fail).
``open_clip_train.data.get_wds_dataset``
    for training, :func:`clip_dcl.train.pipeline.get_wds_train_dataset` (batches carry ids);
    validation keeps OpenCLIP's.

Also per epoch: the main process's RNGs are seeded from ``(--seed, epoch, rank)``, so that a run
resumed at an epoch boundary repeats an uninterrupted run (the data workers do the same, see
``pipeline.py``); every rank logs a digest of the whole loss state (identical on all ranks, whether
DeCL's buffer is sharded or replicated); a sharded buffer is checkpointed one file per rank (see
``loss_state.py``).

Everything here targets open_clip_train 3.3.0's ``main.py``/``train.py``; upstream 4.x replaces
this surface (training tasks with dict batches).
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import math
import random
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

from . import loss_state as sharded_state
from .flags import TrainConfig
from .pipeline import get_wds_train_dataset, mix_seed

_OPENCLIP_CREATE_LOSS = oc_main.create_loss
_OPENCLIP_TRAIN_ONE_EPOCH = oc_train.train_one_epoch
_OPENCLIP_GET_WDS_DATASET = oc_data.get_wds_dataset
_OPENCLIP_PT_LOAD = oc_main.pt_load


class SampleIdOutOfRange(RuntimeError):
    """A sample id does not fit the loss's per-sample buffer (``--decl-num-samples`` is too small)."""


class LossStateMismatch(RuntimeError):
    """The checkpoint being resumed holds loss state that the configured loss cannot take."""


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


def trained_model_config(args) -> Optional[dict]:
    """OpenCLIP's config of ``args.model`` with the ``--force-*`` overrides main applied to it."""
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
    if args.force_context_length is not None:
        cfg["text_cfg"]["context_length"] = args.force_context_length
    if args.force_custom_text:
        cfg["custom_text"] = True
    return cfg


# -- ids from the dataloader to the loss -----------------------------------------------------------
class _IdChannel:
    """Iterates the training dataloader for OpenCLIP's loop, keeping each batch's ids aside.

    OpenCLIP's ``train_one_epoch`` unpacks ``images, texts = batch``, so the ids are held here and
    handed to the loss by :class:`_LossWithIds`. The loop calls the loss after fetching the last
    micro-batch of an optimizer step and before fetching the next one, each time on the
    concatenation of the step's ``accum_freq`` micro-batches in fetch order (micro-batch ``j``'s
    rows recomputed with gradients, the others cached); so the ids of every call are the
    concatenation of the ids of the last ``accum_freq`` batches fetched.
    """

    def __init__(self, dataloader, accum_freq: int):
        self.dataloader = dataloader
        self.num_batches = dataloader.num_batches
        self.num_samples = dataloader.num_samples
        self.recent = deque(maxlen=accum_freq)
        self.fetched = 0

    def __iter__(self):
        for batch in self.dataloader:
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
                raise SampleIdOutOfRange("this loss needs sample ids and the training batches carry none "
                                         "(use webdataset shards: --dataset-type webdataset)")
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

    # open_clip_train.main.parse_args
    def parse_args(self, argv):
        args = oc_params.parse_args(argv)
        cfg = self.config
        args.loss = cfg.loss
        args.loss_args = dict(cfg.loss_args)
        args.model_config = cfg.model_config
        args.no_grad_gather = cfg.no_grad_gather
        args.decl_num_samples = cfg.num_samples
        args.captions_per_image = cfg.captions_per_image
        self.args = args
        return args

    # open_clip_train.main.pt_load
    def pt_load(self, path, map_location="cpu"):
        ckpt = _OPENCLIP_PT_LOAD(path, map_location=map_location)
        if isinstance(ckpt, dict) and "epoch" in ckpt:
            self.resumed = {"loss_state": ckpt.get("loss_state"), "clip_dcl": ckpt.get("clip_dcl")}
            self.resumed_path = path
        return ckpt

    # open_clip_train.main.create_loss
    def create_loss(self, args):
        cfg = self.config
        if cfg.loss == "clip" and not cfg.no_grad_gather and cfg.captions_per_image == 1:
            loss = _OPENCLIP_CREATE_LOSS(args)
        else:
            from clip_dcl.losses import create_loss

            if cfg.gamma_decay_epochs is not None:
                steps = self.gamma_decay_steps(args)
                cfg.loss_kwargs["gamma_decay_steps"] = steps
                cfg.loss_args["gamma_decay_steps"] = steps
            from clip_dcl.losses import LOSSES

            # allocated on the device directly: no host copy of a large per-sample buffer
            on_device = {"device": args.device} if "device" in inspect.signature(LOSSES[cfg.loss]).parameters else {}
            if cfg.no_grad_gather:
                on_device["no_grad_gather"] = True
            loss = create_loss(cfg.loss, rank=args.rank, world_size=args.world_size, local_loss=args.local_loss,
                               gather_with_grad=args.gather_with_grad, **cfg.loss_kwargs, **on_device)
        loss = loss.to(args.device) if isinstance(loss, torch.nn.Module) else loss
        self._restore(loss)
        self.loss = loss
        if args.rank == 0:
            logging.info(f"Loss: {cfg.loss} {cfg.loss_args} -> {loss}")
        return loss

    def gamma_decay_steps(self, args) -> int:
        """``--decl-gamma-decay-epochs`` in optimizer steps: epochs x the training data's batches per epoch
        (as OpenCLIP's scheduler counts them) / ``--accum-freq``, at least 1."""
        batches = self.train_num_batches
        if batches is None:  # not our webdataset pipeline: OpenCLIP's own count of the samples
            batches = math.ceil((args.train_num_samples or 0) / (args.batch_size * args.world_size))
        return max(1, round(self.config.gamma_decay_epochs * (batches // args.accum_freq)))

    def _restore(self, loss) -> None:
        if self.resumed is None:
            return
        state, meta = self.resumed["loss_state"], self.resumed["clip_dcl"] or {}
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
            index = meta.get(sharded_state.INDEX_KEY)
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
        channel = _IdChannel(data["train"].dataloader, args.accum_freq)
        data = {**data, "train": dataclasses.replace(data["train"], dataloader=channel)}
        wrapped = _LossWithIds(loss, channel, torch.device(args.device))
        hook = _TrainLineHook(wrapped, channel, epoch, args, tb_writer)
        logging.getLogger().addFilter(hook)
        try:
            _OPENCLIP_TRAIN_ONE_EPOCH(model, data, wrapped, epoch, optimizer, scaler, scheduler, dist_model, args,
                                      tb_writer=tb_writer)
        finally:
            logging.getLogger().removeFilter(hook)
        if isinstance(loss, torch.nn.Module) and len(loss.state_dict()):
            self.shards = sharded_state.write_shards(loss, args, epoch + 1)
            state = loss.state_dict()
            calls = f"calls {int(state['calls'])}, " if "calls" in state else ""
            logging.info(f"Loss state after epoch {epoch} on rank {args.rank}: {calls}"
                         f"digest {loss_state_digest(loss)}")

    # open_clip_train.main.torch.save
    def save(self, obj, f, *args, **kwargs):
        if isinstance(obj, dict) and "state_dict" in obj and "epoch" in obj and self.loss is not None:
            obj = dict(obj)
            meta = self.checkpoint_meta()
            if sharded_state.is_sharded(self.loss):  # the shards are in files beside (written by every rank)
                if self.shards is None:
                    raise RuntimeError("OpenCLIP saves a checkpoint for an epoch whose loss-state shards were not "
                                       "written; clip_dcl.train.loss_state.checkpointed() no longer matches its "
                                       "conditions")
                obj["loss_state"] = sharded_state.small_state(self.loss)
                meta[sharded_state.INDEX_KEY] = sharded_state.shard_index(self.loss, self.shards,
                                                                          self.args.checkpoint_path)
            else:
                state = self.loss.state_dict() if isinstance(self.loss, torch.nn.Module) else {}
                obj["loss_state"] = {k: v.detach().cpu() for k, v in state.items()}
            obj["clip_dcl"] = meta
        return torch.save(obj, f, *args, **kwargs)

    def checkpoint_meta(self) -> dict:
        """What a downstream loader needs without the training flags (``ckpt["clip_dcl"]``)."""
        from clip_dcl import __version__

        args = self.args
        return {
            "model": args.model,
            "model_config": trained_model_config(args),
            "preprocess_cfg": self.preprocess_cfg,
            "loss": self.config.loss,
            "loss_args": dict(self.config.loss_args),
            "version": __version__,
        }

    # open_clip_train.data.get_wds_dataset
    def get_wds_dataset(self, args, preprocess_img, is_train, epoch=0, floor=False, tokenizer=None):
        if is_train:
            info = get_wds_train_dataset(args, preprocess_img, is_train=True, epoch=epoch, floor=floor,
                                         tokenizer=tokenizer)
            self.train_num_batches = info.dataloader.num_batches
            return info
        return _OPENCLIP_GET_WDS_DATASET(args, preprocess_img, is_train, epoch=epoch, floor=floor,
                                         tokenizer=tokenizer)


@contextlib.contextmanager
def patched(run: TrainingRun):
    """Swap the names listed in the module docstring for ``run``'s, and restore them on exit."""
    targets = {
        (oc_main, "parse_args"): run.parse_args,
        (oc_main, "create_loss"): run.create_loss,
        (oc_main, "train_one_epoch"): run.train_one_epoch,
        (oc_main, "pt_load"): run.pt_load,
        (oc_main, "torch"): _Overlay(torch, save=run.save, nn=_Overlay(
            torch.nn, parallel=_Overlay(torch.nn.parallel, DistributedDataParallel=_cpu_safe_ddp))),
        (oc_data, "get_wds_dataset"): run.get_wds_dataset,
    }
    saved = {key: getattr(*key) for key in targets}
    for (module, name), value in targets.items():
        setattr(module, name, value)
    try:
        yield run
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)


def run_training(config: TrainConfig) -> int:
    """Run ``open_clip_train.main.main`` with ``config``'s objective; return an exit code."""
    run = TrainingRun(config)
    with patched(run):
        result = oc_main.main(list(config.openclip_argv))
    # OpenCLIP's main returns None when it finishes and -1 when it refuses to start.
    return 0 if result is None else (1 if result < 0 else int(result))
