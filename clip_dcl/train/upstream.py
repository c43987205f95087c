"""The ``open_clip_train`` surface that clip-dcl's trainer relies on, checked when this module is imported.

It targets open_clip_train 3.3 (4.x replaces this surface). :func:`check_openclip` checks the version, the
signatures of the names patched or called, the globals the patched functions look up (from their bytecode)
and what they do on a stand-in model (milliseconds), so that a release that behaves otherwise fails with one
message naming what changed, not halfway through a run. Then it keeps OpenCLIP's originals (``OPENCLIP_*``).
"""

from __future__ import annotations

import argparse
import contextlib
import dis
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


_TRAIN_STEP_ARGS = [
    "model",
    "data",
    "loss",
    "epoch",
    "optimizer",
    "scaler",
    "scheduler",
    "dist_model",
    "args",
    "tb_writer",
]
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
    ("main", "evaluate"): ["model", "data", "epoch", "args", "tb_writer", "tokenizer"],
    ("train", "train_one_epoch"): _TRAIN_STEP_ARGS,
    ("train", "evaluate"): ["model", "data", "epoch", "args", "tb_writer", "tokenizer"],
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
    ("distributed", "init_distributed_device_so"): [
        "device",
        "dist_backend",
        "dist_url",
        "horovod",
        "no_set_device_rank",
    ],
    ("distributed", "torch"): None,
}
#: The module globals each function must look up when it runs (with the attributes read from them), so that
#: swapping them (:func:`clip_dcl.train.patch.patched`) takes effect; read from the bytecode (:func:`global_lookups`).
_LOOKS_UP = {
    ("main", "main"): [
        "parse_args",
        "create_loss",
        "train_one_epoch",
        "evaluate",
        "pt_load",
        "setup_logging",
        "get_latest_checkpoint",
        "create_model_and_transforms",
        "optim.AdamW",
        "os.path.exists",
        "torch.save",
        "torch.nn.parallel.DistributedDataParallel",
    ],
    ("distributed", "init_distributed_device_so"): ["torch.distributed.init_process_group"],
    ("params", "parse_args"): ["argparse.ArgumentParser"],
}
#: Attributes of ``args`` main reads: the "already exists" check that clip_dcl.train.runfolder.folder_problem
#: replaces, and the epochs it checkpoints and keeps, restated by clip_dcl.train.saving.checkpointed / _kept.
_READS = {
    ("main", "main"): [
        "log_path",
        "save_logs",
        "save_frequency",
        "delete_previous_checkpoint",
        "save_most_recent",
        "epochs",
    ]
}


def global_lookups(code: types.CodeType) -> set:
    """The module globals ``code`` and the functions defined in it look up, each also with the attributes
    read from it (``torch``, ``torch.save``). From the bytecode, so formatting changes nothing."""
    found = set()
    ops = list(dis.get_instructions(code))
    for i, op in enumerate(ops):
        if op.opname == "LOAD_GLOBAL":
            chain = [op.argval]
            for nxt in ops[i + 1 :]:
                if nxt.opname not in ("LOAD_ATTR", "LOAD_METHOD"):
                    break
                chain.append(nxt.argval)
            found.update(".".join(chain[:k]) for k in range(1, len(chain) + 1))
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= global_lookups(const)
    return found


def _all_names(code: types.CodeType) -> set:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _all_names(const)
    return names


def _installed_modules() -> Dict[str, types.ModuleType]:
    return {"main": oc_main, "train": oc_train, "data": oc_data, "params": oc_params, "distributed": oc_distributed}


def openclip_problems(version: str, modules: Dict[str, types.ModuleType]) -> list:
    """What keeps the patches from working with these ``open_clip_train`` modules (``"main"``, ``"train"``,
    ``"data"``, ``"params"``, ``"distributed"``; the installed ones for those left out); empty: nothing."""
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
            problems.append(
                f"open_clip_train.{mod}.{name}{tuple(_params(value) or ())} differs from {name}{tuple(expected)}"
            )
    for table, names_in, what, sep in (
        (_LOOKS_UP, global_lookups, "looks up {} through its module's globals", ", "),
        (_READS, _all_names, "reads args.{}", ", args."),
    ):
        for (mod, name), needed in table.items():
            code = getattr(getattr(modules[mod], name, None), "__code__", None)
            found = names_in(code) if code is not None else set()
            missing = [n for n in needed if n not in found]
            if missing:
                problems.append(f"open_clip_train.{mod}.{name} no longer {what.format(sep.join(missing))}")
    if not problems:  # the names are there: what the patched functions do with them
        problems += behaviour_problems(modules)
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
            f"pip install 'open_clip_torch>={a}.{b},<{c}.{d}'"
        )


def openclip_parser() -> argparse.ArgumentParser:
    """OpenCLIP's training parser, caught at its ``parse_args`` (``open_clip_train.params.parse_args`` returns
    only the namespace), so that its flags can be listed without parsing anything."""
    parser = _caught_parser(oc_params.parse_args)
    if parser is None:
        raise OpenCLIPMismatch("open_clip_train.params.parse_args returned without calling its parser's parse_args")
    return parser


def _caught_parser(parse_args) -> Optional[argparse.ArgumentParser]:
    """The parser ``parse_args`` builds, caught at its ``parse_args`` (``argparse`` swapped in the function's
    globals for the call); None when it builds none that way."""

    class Caught(Exception):
        pass

    class CatchingParser(argparse.ArgumentParser):
        def parse_args(self, args=None, namespace=None):
            raise Caught(self)

    namespace = parse_args.__globals__
    module = namespace.get("argparse")
    namespace["argparse"] = Overlay(argparse, ArgumentParser=CatchingParser)
    try:
        parse_args([])
    except Caught as caught:
        return caught.args[0]
    except Exception:  # noqa: BLE001 - built otherwise
        return None
    finally:
        namespace["argparse"] = module
    return None


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
        OPENCLIP_SETUP_LOGGING(log_file, level, include_host=include_host)


def init_process_group_with_timeout(seconds: Optional[float]):
    """``torch.distributed.init_process_group`` with ``timeout=seconds`` when not None (OpenCLIP passes none,
    so a collective waits torch's default, 30 minutes for gloo, for a rank that died or hangs)."""
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
    """A loss's terms (``output_dict=True``) whose ``"loss"`` entry, which OpenCLIP logs as ``Loss`` after
    back-propagating the sum, shows ``logged`` instead (InfoNCE-scale, so that ``Loss`` compares across runs)."""

    def __init__(self, terms: dict, logged: torch.Tensor):
        super().__init__(terms)
        self.logged = logged

    def __setitem__(self, key, value):
        if key == "loss":
            value = self.logged.detach().to(value.dtype) if torch.is_tensor(value) else float(self.logged)
        super().__setitem__(key, value)


# -- What the patched functions do, checked on a stand-in model (milliseconds) ----------------------------------
class _ProbeModel(torch.nn.Module):
    """A stand-in CLIP model: features linear in one weight, OpenCLIP's output dict."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
        self.logit_scale = torch.nn.Parameter(torch.tensor(0.0))

    def forward(self, images, texts):
        return {
            "image_features": images * self.weight,
            "text_features": texts * self.weight,
            "logit_scale": self.logit_scale.exp(),
        }


class _ProbeData:
    """OpenCLIP's ``DataInfo`` over a list of batches."""

    def __init__(self, batches):
        self.dataloader = _ProbeLoader(batches)

    def set_epoch(self, epoch):
        pass


class _ProbeLoader(list):
    @property
    def num_batches(self):
        return len(self)

    @property
    def num_samples(self):
        return 2 * len(self)


class _ProbeWriter:
    def __init__(self):
        self.scalars = {}

    def add_scalar(self, name, value, step):
        self.scalars[(name, step)] = float(value)


class _Records(logging.Filter):
    """Keeps the root logger's records and drops them (the probe prints nothing)."""

    def __init__(self):
        super().__init__()
        self.records = []

    def filter(self, record):
        self.records.append(record)
        return False


@contextlib.contextmanager
def _root_records():
    # a handler for the duration: logging.info() on a root logger without one would add a stderr handler for good
    root, records, handler = logging.getLogger(), _Records(), logging.NullHandler()
    level = root.level
    root.setLevel(logging.INFO)
    root.addFilter(records)
    root.addHandler(handler)
    try:
        yield records.records
    finally:
        root.removeHandler(handler)
        root.removeFilter(records)
        root.setLevel(level)


def _probe_args(**more) -> argparse.Namespace:
    return argparse.Namespace(
        device="cpu",
        precision="fp32",
        distill=False,
        accum_freq=1,
        skip_scheduler=False,
        horovod=False,
        grad_clip_norm=None,
        log_every_n_steps=1,
        world_size=1,
        batch_size=2,
        wandb=False,
        rank=0,
        local_rank=0,
        distributed=False,
        **more,
    )


def _train_step_problems(train_one_epoch) -> list:
    """What ``train_one_epoch`` no longer does that the trainer relies on, in two batches of a stand-in model."""
    batches = [
        (torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[0.5, 1.0], [1.5, 2.0]])),
        (torch.tensor([[2.0, 0.0], [1.0, 1.0]]), torch.tensor([[1.0, 3.0], [0.0, 1.0]])),
    ]
    model, writer, steps, calls, sums = _ProbeModel(), _ProbeWriter(), [], [], []

    class Terms(LoggedLoss):  # LoggedLoss's contract: the sum trains, the "loss" entry shows the logged value
        def __setitem__(self, key, value):
            if key == "loss":
                sums.append(float(value.detach()))
            super().__setitem__(key, value)

    def loss(image_features, text_features, logit_scale, output_dict=False):
        calls.append(output_dict)
        return Terms({"a_loss": image_features.sum(), "b_loss": 2 * text_features.sum()}, torch.tensor(-1.0))

    # not a torch optimizer: its global step hooks (e.g. a test's step counter) must not see the probe
    optimizer = types.SimpleNamespace(
        param_groups=[{"lr": 0.0}], step=lambda: None, zero_grad=lambda: model.zero_grad(set_to_none=True)
    )
    name = "open_clip_train.train.train_one_epoch"
    try:
        with _root_records() as records:
            train_one_epoch(
                model,
                {"train": _ProbeData(batches)},
                loss,
                1,
                optimizer,
                None,
                steps.append,
                None,
                _probe_args(),
                tb_writer=writer,
            )
    except Exception as e:  # noqa: BLE001 - any failure is the answer
        return [f"{name} fails on a stand-in model ({type(e).__name__}: {e})"]
    problems = []
    images, texts = batches[-1]
    weight = torch.tensor([1.0, 2.0])  # unchanged: the optimizer steps nothing
    expected = [float((i * weight).sum() + 2 * (t * weight).sum()) for i, t in batches]
    if calls != [True, True]:
        problems.append(f"{name} no longer calls the loss once per batch with output_dict=True")
    if steps != [2, 3]:  # epoch 1 of two steps each
        problems.append(f"{name} no longer calls the scheduler with each step's index ({steps})")
    if len(sums) != 2 or any(abs(a - b) > 1e-4 for a, b in zip(sums, expected)):
        problems.append(f"{name} no longer stores the sum of the loss terms under losses['loss']")
    grad = model.weight.grad
    if grad is None or not torch.allclose(grad, (images.sum(0) + 2 * texts.sum(0)).float()):
        problems.append(f"{name} no longer back-propagates the sum of the loss terms")
    if sum(1 for r in records if r.name == "root" and str(r.msg).startswith("Train Epoch:")) != 2:
        problems.append(f"{name} no longer logs a 'Train Epoch:' line per logged step on the root logger")
    wanted = {(f"train/{k}", s) for k in ("loss", "a_loss", "b_loss", "scale", "lr") for s in (2, 3)}
    if not wanted <= set(writer.scalars) or writer.scalars.get(("train/loss", 3)) != -1.0:
        problems.append(
            f"{name} no longer writes each logged step's loss terms, loss, scale and lr through tb_writer.add_scalar"
        )
    return problems


def _evaluate_problems(evaluate) -> list:
    """What ``evaluate`` no longer does on a stand-in model that the trainer relies on: its metrics through
    ``tb_writer.add_scalar`` as ``val/<name>`` at the epoch."""
    import tempfile

    batches = _ProbeLoader([(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([[1.0, 0.1], [0.1, 1.0]]))])
    writer = _ProbeWriter()
    name = "open_clip_train.train.evaluate"
    try:
        with tempfile.TemporaryDirectory() as folder, _root_records():
            metrics = evaluate(
                _ProbeModel(),
                {"val": _ProbeData(batches)},
                1,
                _probe_args(val_frequency=1, epochs=1, save_logs=True, checkpoint_path=folder, zeroshot_frequency=0),
                tb_writer=writer,
            )
    except Exception as e:  # noqa: BLE001
        return [f"{name} fails on a stand-in model ({type(e).__name__}: {e})"]
    if (
        not metrics
        or "clip_val_loss" not in metrics
        or any(writer.scalars.get((f"val/{k}", 1)) != float(v) for k, v in metrics.items())
    ):
        return [f"{name} no longer writes each of its metrics through tb_writer.add_scalar"]
    return []


def _dataset_fn_problems(get_dataset_fn) -> list:
    """Whether ``get_dataset_fn`` still returns the loaders it finds in its module's globals (the patched ones)."""
    namespace, kinds = (
        get_dataset_fn.__globals__,
        {"webdataset": "get_wds_dataset", "csv": "get_csv_dataset", "synthetic": "get_synthetic_dataset"},
    )
    saved = {fn: namespace.get(fn) for fn in kinds.values()}
    markers = {fn: (lambda *a, **k: None) for fn in kinds.values()}
    namespace.update(markers)
    try:
        wrong = [fn for kind, fn in kinds.items() if get_dataset_fn("x", kind) is not markers[fn]]
    except Exception as e:  # noqa: BLE001
        wrong = [f"({type(e).__name__}: {e})"]
    finally:
        namespace.update(saved)
    return [f"open_clip_train.data.get_dataset_fn no longer returns the module's {', '.join(wrong)}"] if wrong else []


def behaviour_problems(modules: Dict[str, types.ModuleType]) -> list:
    """What the patched functions no longer do, run on stand-ins (empty: nothing)."""
    problems = _train_step_problems(modules["train"].train_one_epoch)
    problems += _evaluate_problems(modules["train"].evaluate)
    problems += _dataset_fn_problems(modules["data"].get_dataset_fn)
    if _caught_parser(modules["params"].parse_args) is None:
        problems.append("open_clip_train.params.parse_args no longer builds its parser with its module's argparse")
    return problems


# The version, names and behaviour must match before anything uses them.
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
