"""What the trainer relies on of OpenCLIP, checked once, by behaviour, when this module is imported.

The trainer calls OpenCLIP as a library (its parser, model factory, tokenizer, data readers, schedulers,
precision, distributed set-up and evaluation) and runs its own loop, so it fits every ``open_clip_torch``
from 2.32 to 3.3. A release that does not fit is refused in one line naming what differs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
from typing import Dict, List, Optional

import open_clip
import torch
from open_clip_train import data as oc_data
from open_clip_train import distributed as oc_distributed
from open_clip_train import file_utils as oc_file_utils
from open_clip_train import logger as oc_logger
from open_clip_train import main as oc_main
from open_clip_train import params as oc_params
from open_clip_train import precision as oc_precision
from open_clip_train import scheduler as oc_scheduler
from open_clip_train import train as oc_train

#: The open_clip_torch releases the trainer supports: ``>=`` first, ``<`` second (as in pyproject.toml).
SUPPORTED_OPENCLIP = ((2, 32), (3, 4))

#: The names the trainer calls, each by module.
CALLED = {
    "open_clip": (open_clip, ["create_model_and_transforms", "get_tokenizer", "create_loss", "get_input_dtype"]),
    "open_clip_train.data": (
        oc_data,
        [
            "get_dataset_fn",
            "get_wds_dataset",
            "get_csv_dataset",
            "get_synthetic_dataset",
            "get_imagenet",
            "get_dataset_size",
            "group_by_keys_nothrow",
            "log_and_continue",
            "detshuffle2",
            "ResampledShards2",
            "SharedEpoch",
            "DataInfo",
        ],
    ),
    "open_clip_train.distributed": (
        oc_distributed,
        ["init_distributed_device", "is_master", "broadcast_object", "world_info_from_env"],
    ),
    "open_clip_train.main": (oc_main, ["random_seed", "get_latest_checkpoint", "copy_codebase"]),
    "open_clip_train.file_utils": (oc_file_utils, ["pt_load", "remote_sync", "start_sync_process"]),
    "open_clip_train.scheduler": (oc_scheduler, ["cosine_lr", "const_lr", "const_lr_cooldown"]),
    "open_clip_train.train": (oc_train, ["evaluate"]),
    "open_clip_train.precision": (oc_precision, ["get_autocast"]),
    "open_clip_train.logger": (oc_logger, ["setup_logging"]),
}
#: OpenCLIP's flags whose values the trainer reads (``args.NAME``), beyond the loss's own.
READ_FLAGS = (
    "train_data", "val_data", "dataset_type", "train_num_samples", "batch_size", "epochs", "lr", "wd", "warmup",
    "beta1", "beta2", "eps", "accum_freq", "grad_clip_norm", "precision", "model", "pretrained", "logs", "name",
    "resume", "save_frequency", "save_most_recent", "delete_previous_checkpoint", "log_every_n_steps", "seed",
    "lock_image", "lock_text", "grad_checkpointing", "distill_model", "distill_pretrained", "report_to",
    "remote_sync", "lr_scheduler", "skip_scheduler", "torchcompile", "val_frequency", "local_loss",
    "gather_with_grad", "horovod", "device", "workers",
)  # fmt: skip


class OpenCLIPMismatch(ImportError):
    """The installed ``open_clip_torch`` is not a release the trainer supports."""


def installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("open_clip_torch")
    except PackageNotFoundError:
        return getattr(open_clip, "__version__", "unknown")


def openclip_problems(version: str, called: Optional[Dict[str, tuple]] = None) -> List[str]:
    """What keeps the trainer from working with OpenCLIP ``version`` and the modules of ``called`` (the
    installed ones by default); empty: nothing."""
    problems = []
    try:
        major_minor = tuple(int(p) for p in version.split(".")[:2])
    except ValueError:
        major_minor = None
    low, high = SUPPORTED_OPENCLIP
    if major_minor is None or not (low <= major_minor < high):
        problems.append(f"version {version}")
    called = called or CALLED
    for module_name, (module, names) in called.items():
        problems += [f"{module_name}.{n} is missing" for n in names if not callable(getattr(module, n, None))]
    if problems:
        return problems
    args = oc_params.parse_args([])  # its defaults: every flag the trainer reads is one of OpenCLIP's
    problems += [f"OpenCLIP's parser has no --{f.replace('_', '-')}" for f in READ_FLAGS if not hasattr(args, f)]
    autocast = called["open_clip_train.precision"][0].get_autocast("amp_bf16", device_type="cpu")
    if not callable(getattr(autocast(), "__enter__", None)):
        problems.append("open_clip_train.precision.get_autocast no longer returns a context manager factory")
    return problems


def check_openclip(version: Optional[str] = None, called: Optional[Dict[str, tuple]] = None) -> None:
    """Raise :class:`OpenCLIPMismatch` unless the installed OpenCLIP (or ``version``, ``called``) fits."""
    version = version or installed_version()
    problems = openclip_problems(version, called)
    if problems:
        (a, b), (c, d) = SUPPORTED_OPENCLIP
        raise OpenCLIPMismatch(
            f"clip-dcl's trainer supports open_clip_torch >={a}.{b},<{c}.{d}, and the installed one does not fit: "
            f"{'; '.join(problems)}. Install a supported release: pip install 'open_clip_torch>={a}.{b},<{c}.{d}'"
        )


def openclip_parser() -> argparse.ArgumentParser:
    """OpenCLIP's training parser, so that its flags can be listed and checked without parsing anything.

    ``open_clip_train.params.parse_args`` builds the parser inside and returns only the namespace: the parser
    is caught at its ``parse_args`` call, with ``argparse.ArgumentParser`` swapped in that module for this call
    alone (no other way reaches it).
    """

    class Caught(Exception):
        pass

    class CatchingParser(argparse.ArgumentParser):
        def parse_args(self, args=None, namespace=None):
            raise Caught(self)

    saved = oc_params.argparse
    oc_params.argparse = argparse.Namespace(**{**vars(argparse), "ArgumentParser": CatchingParser})
    try:
        oc_params.parse_args([])
    except Caught as caught:
        return caught.args[0]
    finally:
        oc_params.argparse = saved
    raise OpenCLIPMismatch("open_clip_train.params.parse_args returned without calling its parser's parse_args")


@contextlib.contextmanager
def torch_log_levels_kept():
    """Give PyTorch's loggers their levels back after the block (OpenCLIP's ``setup_logging`` inside it
    sets every existing logger to INFO, and TorchDynamo then prints its statistics at exit)."""
    torch_loggers = {
        name: logging.getLogger(name).level
        for name in list(logging.root.manager.loggerDict)
        if name == "torch" or name.startswith("torch.")
    }
    try:
        yield
    finally:
        for name, saved in torch_loggers.items():
            logging.getLogger(name).setLevel(saved)


def setup_logging(log_file, level, include_host=False):
    """OpenCLIP's ``setup_logging``, with PyTorch's own loggers left at their levels (:func:`torch_log_levels_kept`)."""
    with torch_log_levels_kept():
        oc_logger.setup_logging(log_file, level, include_host=include_host)


@contextlib.contextmanager
def init_process_group_timeout(seconds: Optional[float]):
    """Within the block, ``torch.distributed.init_process_group`` takes ``timeout=seconds`` when the caller gives
    none. OpenCLIP's ``init_distributed_device`` passes none, so a collective would wait torch's default (30
    minutes for gloo) for a rank that died or hangs; the name is restored when the set-up returns."""
    if seconds is None or not torch.distributed.is_available():
        yield
        return
    init = torch.distributed.init_process_group

    def init_process_group(*args, **kwargs):
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = datetime.timedelta(seconds=seconds)
        return init(*args, **kwargs)

    torch.distributed.init_process_group = init_process_group
    try:
        yield
    finally:
        torch.distributed.init_process_group = init


def cpu_safe_ddp(module, device_ids=None, **kwargs):
    """``DistributedDataParallel`` without ``device_ids`` for CPU devices (DDP rejects them there)."""
    if device_ids and all(torch.device(d).type == "cpu" for d in device_ids):
        device_ids = None
    return torch.nn.parallel.DistributedDataParallel(module, device_ids=device_ids, **kwargs)


# The version, names and behaviour must match before anything uses them.
check_openclip()
