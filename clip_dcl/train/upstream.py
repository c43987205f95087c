"""The ``open_clip_train`` surface that clip-dcl's trainer relies on, checked when this module is imported.

Everything here targets open_clip_train 3.3's ``main.py``/``train.py``/``data.py``; upstream 4.x
replaces this surface (training tasks with dict batches). :func:`check_openclip` checks the
installed version and every name patched (by :func:`clip_dcl.train.patch.patched`) or called by the
trainer (and the log line parsed from ``train_one_epoch``), and fails with one message naming the
supported range rather than with an ``AttributeError`` halfway through a run, or a patch that
silently stops taking effect. Then it keeps OpenCLIP's originals of the patched names (the
``OPENCLIP_*`` constants), which the replacements call, and the stand-ins that change one thing
about them (:func:`setup_logging`, :func:`cpu_safe_ddp`, :func:`init_process_group_with_timeout`,
:class:`Overlay`).
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import logging
import types
from typing import Dict, Optional

import open_clip
import torch
from open_clip_train import data as oc_data
from open_clip_train import distributed as oc_distributed
from open_clip_train import main as oc_main
from open_clip_train import params as oc_params
from open_clip_train import train as oc_train

#: The open_clip_torch releases whose ``open_clip_train`` the trainer patches: ``>=`` first, ``<`` second.
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
    ("main", "setup_logging"): ["log_file", "level", "include_host"],
    ("main", "natural_key"): ["string_"],
    ("main", "torch"): None,
    ("main", "os"): None,
    ("main", "LATEST_CHECKPOINT_NAME"): None,
    ("train", "train_one_epoch"): _TRAIN_STEP_ARGS,
    ("train", "AverageMeter"): [],
    ("train", "unwrap_model"): ["model"],
    ("params", "parse_args"): ["args"],
    ("params", "argparse"): None,
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
    ("distributed", "init_distributed_device_so"): ["device", "dist_backend", "dist_url", "horovod",
                                                    "no_set_device_rank"],
    ("distributed", "torch"): None,
}
#: Code the patches rely on: main must look these names up in its own namespace when it runs (so
#: that swapping them takes effect), and train_one_epoch must log the line parsed here and in
#: ``clip_dcl.experiment``.
_SOURCE_NEEDS = {
    ("main", "main"): ["torch.save(", "torch.nn.parallel.DistributedDataParallel(", "pt_load(args.resume",
                       "create_loss(args)", "train_one_epoch(model, data, loss, epoch", "get_latest_checkpoint(",
                       "setup_logging(args.log_path",
                       # the "already exists" check that clip_dcl.train.runfolder.folder_problem replaces
                       "if os.path.exists(args.log_path) and not resume_latest:",
                       # the epochs main checkpoints and keeps, restated by clip_dcl.train.saving.checkpointed / _kept
                       "if args.save_logs:", "completed_epoch == args.epochs or (",
                       "args.save_frequency > 0 and (completed_epoch % args.save_frequency) == 0",
                       "if args.delete_previous_checkpoint:", "if args.save_most_recent:"],
    ("train", "train_one_epoch"): ['f"Train Epoch: {epoch} [', 'f"Data (t): ', 'f"Batch (t): ',
                                   "images, texts = batch", "for i, batch in enumerate(dataloader)",
                                   "scheduler(step)",
                                   # the terms summed into the loss it back-propagates, then logged as Loss
                                   # (LoggedLoss)
                                   "total_loss = sum(losses.values())", 'losses["loss"] = total_loss',
                                   "backward(total_loss, scaler)", "for key, val in losses.items():"],
    # the parser that openclip_parser catches (built and used in one call)
    ("params", "parse_args"): ["parser = argparse.ArgumentParser()", "args = parser.parse_args(args)"],
    ("data", "get_dataset_fn"): ["return get_wds_dataset", "return get_csv_dataset", "return get_synthetic_dataset"],
    # --dist-timeout reaches init_process_group through the module's torch global (see init_process_group)
    ("distributed", "init_distributed_device_so"): ["torch.distributed.init_process_group("],
}


def _installed_modules() -> Dict[str, types.ModuleType]:
    return {"main": oc_main, "train": oc_train, "data": oc_data, "params": oc_params, "distributed": oc_distributed}


def openclip_problems(version: str, modules: Dict[str, types.ModuleType]) -> list:
    """What keeps the patches from working with these ``open_clip_train`` modules (empty: nothing).

    ``modules`` maps ``"main"``, ``"train"``, ``"data"``, ``"params"``, ``"distributed"`` to the modules
    (the installed ones for those it leaves out).
    """
    modules = {**_installed_modules(), **modules}
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
        elif name in ("torch", "os", "argparse"):
            if not isinstance(value, types.ModuleType):
                problems.append(f"open_clip_train.{mod}.{name} is not the {name} module")
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
    modules = modules or _installed_modules()
    problems = openclip_problems(version, modules)
    if problems:
        (a, b), (c, d) = SUPPORTED_OPENCLIP
        raise OpenCLIPMismatch(
            f"clip-dcl's trainer supports open_clip_torch >={a}.{b},<{c}.{d} (its open_clip_train), and the "
            f"installed one does not fit: {'; '.join(problems)}. Install a supported release: "
            f"pip install 'open_clip_torch>={a}.{b},<{c}.{d}'")


# The versions and names must match before anything below looks them up.
check_openclip()

OPENCLIP_CREATE_LOSS = oc_main.create_loss
OPENCLIP_TRAIN_ONE_EPOCH = oc_train.train_one_epoch
OPENCLIP_EVALUATE = oc_train.evaluate
OPENCLIP_GET_WDS_DATASET = oc_data.get_wds_dataset
OPENCLIP_GET_DATASET_FN = oc_data.get_dataset_fn
OPENCLIP_GET_CSV_DATASET = oc_data.get_csv_dataset
OPENCLIP_GET_SYNTHETIC_DATASET = oc_data.get_synthetic_dataset
OPENCLIP_PT_LOAD = oc_main.pt_load
OPENCLIP_SETUP_LOGGING = oc_main.setup_logging


def openclip_parser() -> argparse.ArgumentParser:
    """OpenCLIP's training parser, as ``open_clip_train.params.parse_args`` builds it.

    That function builds the parser and parses with it in one call, and returns only the namespace;
    the parser is caught here at its ``parse_args`` (``argparse`` swapped in the module for the
    call), so that the flags it knows can be listed without parsing anything. OpenCLIP's parser
    allows abbreviations (``--los`` is taken for ``--loss-dist-impl``), which
    :func:`clip_dcl.train.flags.check_spelled_out` refuses with this list.
    """

    class Caught(Exception):
        pass

    class CatchingParser(argparse.ArgumentParser):
        def parse_args(self, args=None, namespace=None):
            raise Caught(self)

    module = oc_params.argparse
    oc_params.argparse = Overlay(argparse, ArgumentParser=CatchingParser)
    try:
        oc_params.parse_args([])
    except Caught as caught:
        return caught.args[0]
    finally:
        oc_params.argparse = module
    raise OpenCLIPMismatch("open_clip_train.params.parse_args returned without calling its parser's parse_args")


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


def setup_logging(log_file, level, include_host=False):
    """OpenCLIP's ``setup_logging``, with PyTorch's own loggers left at their levels (:func:`torch_log_levels_kept`)."""
    with torch_log_levels_kept():
        OPENCLIP_SETUP_LOGGING(log_file, level, include_host=include_host)



def init_process_group_with_timeout(seconds: Optional[float]):
    """``torch.distributed.init_process_group`` with ``timeout=seconds`` (OpenCLIP's
    ``init_distributed_device`` passes none, so a collective waits torch's default, 30 minutes for
    gloo, for a rank that died or hangs); unchanged when ``seconds`` is None."""
    import datetime

    def init_process_group(*args, **kwargs):
        if seconds is not None and kwargs.get("timeout") is None:
            kwargs["timeout"] = datetime.timedelta(seconds=seconds)
        return torch.distributed.init_process_group(*args, **kwargs)

    return init_process_group


def cpu_safe_ddp(module, device_ids=None, **kwargs):
    """``DistributedDataParallel`` without ``device_ids`` for CPU devices (DDP rejects them there)."""
    if device_ids and all(torch.device(d).type == "cpu" for d in device_ids):
        device_ids = None
    return torch.nn.parallel.DistributedDataParallel(module, device_ids=device_ids, **kwargs)


class Overlay(types.ModuleType):
    """A stand-in for a module: the given attributes, and the module's own for everything else."""

    def __init__(self, base: types.ModuleType, **overrides):
        super().__init__(base.__name__, getattr(base, "__doc__", None))
        self._base = base
        self.__dict__.update(overrides)

    def __getattr__(self, name):
        return getattr(self._base, name)


class LoggedLoss(dict):
    """A loss's terms (``output_dict=True``) whose ``"loss"`` entry shows ``logged`` instead of their sum.

    OpenCLIP's ``train_one_epoch`` sums the terms into ``total_loss``, back-propagates that variable,
    and stores it under ``losses["loss"]``, which it logs as ``Loss`` and writes as ``train/loss``
    (checked by :func:`check_openclip`). For a loss whose total is not on InfoNCE's scale
    (:meth:`clip_dcl.losses.base.LossDeclaration.logged_loss`) that entry takes the loss's InfoNCE
    value, so that ``Loss`` compares across runs; the sum that trains is OpenCLIP's variable,
    untouched, and each term keeps its own column.
    """

    def __init__(self, terms: dict, logged: torch.Tensor):
        super().__init__(terms)
        self.logged = logged

    def __setitem__(self, key, value):
        if key == "loss":
            value = self.logged.detach().to(value.dtype) if torch.is_tensor(value) else float(self.logged)
        super().__setitem__(key, value)
