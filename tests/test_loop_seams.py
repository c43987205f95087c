"""The trainer is a loop of its own over OpenCLIP's parts: while a training runs, none of OpenCLIP's names (nor
``os.path.exists``, ``torch.save``, DDP, ``init_process_group``, AdamW or the root logger's filters) is
replaced. Compared at the loss's backward with before the run."""

from __future__ import annotations

import importlib
import logging
import os
import types

import pytest
import torch
from conftest import train_in_process

MODULES = [
    "open_clip",
    "open_clip.factory",
    "open_clip.loss",
    "open_clip_train.main",
    "open_clip_train.train",
    "open_clip_train.data",
    "open_clip_train.distributed",
    "open_clip_train.params",
    "open_clip_train.file_utils",
    "open_clip_train.scheduler",
    "open_clip_train.precision",
    "open_clip_train.logger",
]


def _names() -> dict:
    out = {}
    for name in MODULES:
        module = importlib.import_module(name)
        # functions, classes and modules: what a seam would replace (registries like _MODEL_CONFIGS change by design)
        out.update(
            {f"{name}.{k}": id(v) for k, v in vars(module).items() if callable(v) or isinstance(v, types.ModuleType)}
        )
    out.update(
        {
            "os.path.exists": id(os.path.exists),
            "torch.save": id(torch.save),
            "torch.nn.parallel.DistributedDataParallel": id(torch.nn.parallel.DistributedDataParallel),
            "torch.distributed.init_process_group": id(torch.distributed.init_process_group),
            "torch.optim.AdamW": id(torch.optim.AdamW),
            "root logger filters": tuple(map(id, logging.getLogger().filters)),
        }
    )
    return out


def test_no_name_is_replaced_while_a_training_runs(tmp_path):
    from clip_dcl.losses import DeCLLoss

    seen = []
    forward = DeCLLoss.forward

    def probing(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        term = next(iter(out.values())) if isinstance(out, dict) else out
        if term.requires_grad and not seen:
            term.register_hook(lambda g: seen.append(_names()) or g)
        return out

    before = _names()
    DeCLLoss.forward = probing
    try:
        res = train_in_process(
            [
                "--loss",
                "decl",
                "--dataset-type",
                "synthetic",
                "--train-num-samples",
                "32",
                "--batch-size",
                "16",
                "--epochs",
                "1",
                "--model",
                "clip-dcl-tiny",
                "--device",
                "cpu",
                "--workers",
                "0",
                "--logs",
                tmp_path,
                "--name",
                "r",
                "--warmup",
                "1",
            ]  # fmt: skip
        )
    finally:
        DeCLLoss.forward = forward
    assert res.returncode == 0, res.stderr
    assert seen, "the loss's backward never ran"
    during = seen[0]
    replaced = sorted(k for k in before.keys() & during.keys() if before[k] != during[k])
    assert replaced == []


def test_the_set_ups_objects_are_frozen_while_the_run_trains_and_given_back_after(tmp_path):
    """A full garbage collection walks every object: the set-up's are frozen (``gc.freeze``) while the steps run,
    so that one costs what the steps made, and given back when the run ends, a failed one too."""
    import gc

    from clip_dcl.losses import DeCLLoss

    frozen = []
    forward = DeCLLoss.forward

    def probing(self, *args, **kwargs):
        frozen.append(gc.get_freeze_count())
        if fail and len(frozen) == 4 + 3:  # the second run's third call (the first run made four)
            raise RuntimeError("a loss that fails at its third call")
        return forward(self, *args, **kwargs)

    argv = ["--loss", "decl", "--dataset-type", "synthetic", "--train-num-samples", "64", "--batch-size", "16",
            "--epochs", "1", "--model", "clip-dcl-tiny", "--device", "cpu", "--workers", "0", "--warmup", "1",
            "--logs", tmp_path]  # fmt: skip
    assert gc.get_freeze_count() == 0
    DeCLLoss.forward = probing
    try:
        fail = False
        done = train_in_process(argv + ["--name", "done"])
        fail = True
        with pytest.raises(RuntimeError, match="a loss that fails at its third call"):  # an error of no known kind
            train_in_process(argv + ["--name", "failed"])
        fail = False
        gc.freeze()  # a caller that froze its own objects: the run leaves them frozen
        callers = gc.get_freeze_count()
        assert train_in_process(argv + ["--name", "caller"]).returncode == 0
        still = gc.get_freeze_count()
        gc.unfreeze()
    finally:
        DeCLLoss.forward = forward
    assert done.returncode == 0, done.stderr
    assert len(frozen) == 4 + 3 + 4 and min(frozen) > 10_000  # every call of the loss: the set-up's objects frozen
    assert gc.get_freeze_count() == 0  # given back, after the finished run and after the failed one
    assert still > callers // 2  # the caller's objects still frozen (those freed meanwhile leave the count)
