"""Shared set-up of the suite.

- Under ``pytest -n N`` (pytest-xdist) each worker gets its share of the cores as torch threads,
  set before any test module imports torch and inherited by the processes a test starts, so that N
  workers do not oversubscribe the machine.
- :func:`train_in_process`: ``clip_dcl.train.main`` in the test's own process, for tests of what a
  run does rather than of the command line (starting a fresh interpreter costs more than a tiny
  training). Its result reads like ``subprocess.run``'s, so a test can switch between the two.
- :func:`trained_run`: one tiny run per objective for the whole session, for tests that only need
  *a* trained run (its checkpoint, log and ``params.txt``) and change nothing in it.
- :func:`preloaded`: ``python`` and ``clip-dcl`` commands that start without importing torch and OpenCLIP
  again (tests/preloaded.py), for the tests that run commands through bash, a process each.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _workers)))


@dataclass
class InProcessRun:
    """What ``subprocess.run(..., capture_output=True, text=True)`` of ``python -m clip_dcl.train`` gives."""

    returncode: int
    stdout: str
    stderr: str


#: one epoch of the tiny model on the CPU, in the process's own loader: the flags of a quick training
TINY = ["--epochs", "1", "--model", "clip-dcl-tiny", "--device", "cpu", "--workers", "0"]


def train_in_process(argv) -> InProcessRun:
    """``clip_dcl.train.main(argv)`` here, its stdout and stderr captured (messages its data workers
    print go to the test's own stderr; their log lines still reach ``out.log``)."""
    from clip_dcl.train import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return InProcessRun(rc, out.getvalue(), err.getvalue())


def train_run(argv, cli=False, timeout: int = 600):
    """One training: :func:`train_in_process`, or ``python -m clip_dcl.train`` in a fresh process with
    ``cli`` (one torch thread, no GPU), for tests of the command line or of what one process can hold.
    ``cli`` is True (this interpreter) or the path of a python to start (:func:`preloaded`'s ``.python``)."""
    if not cli:
        return train_in_process(argv)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    python = sys.executable if cli is True else str(cli)
    return subprocess.run(
        [python, "-m", "clip_dcl.train", *map(str, argv)], capture_output=True, text=True, timeout=timeout, env=env
    )


# The shared runs: 48 synthetic pairs, batches of 16, one epoch of the tiny model, a term logged per step.
SHARED_RUN_FLAGS = {"clip": [], "dcl": ["--tau-plus", "0.1"], "decl": []}


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """``trained_run(loss)``: the folder (``--logs/--name``) of a one-epoch run of ``loss``, trained
    once per session and shared: read it, never write to it."""
    runs = {}

    def get(loss: str) -> Path:
        if loss not in runs:
            logs = tmp_path_factory.mktemp(f"shared-{loss}")
            res = train_in_process(
                [
                    "--model",
                    "clip-dcl-tiny",
                    "--dataset-type",
                    "synthetic",
                    "--train-num-samples",
                    "48",
                    "--batch-size",
                    "16",
                    "--epochs",
                    "1",
                    "--precision",
                    "fp32",
                    "--device",
                    "cpu",
                    "--workers",
                    "1",
                    "--lr",
                    "1e-3",
                    "--warmup",
                    "1",
                    "--log-every-n-steps",
                    "1",
                    "--seed",
                    "0",
                    "--report-to",
                    "",
                    "--logs",
                    logs,
                    "--name",
                    loss,
                    "--loss",
                    loss,
                    *SHARED_RUN_FLAGS[loss],
                ]
            )
            assert res.returncode == 0, res.stderr[-5000:]
            runs[loss] = logs / loss
        return runs[loss]

    return get


#: The socket of the preloaded python pytest-xdist's controller started for its workers (in a folder of its own).
SHARED_PRELOADED = "CLIP_DCL_TESTS_PRELOADED"
_shared_key = pytest.StashKey()


def pytest_configure(config):
    """Under pytest-xdist, the controller starts one preloaded python for all its workers (not waited for here:
    the first test that needs it waits), where each worker would import torch and OpenCLIP for a server of its
    own; the workers, started after this hook, find its folder in their environment."""
    if hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("xdist"):
        return
    if not config.getoption("numprocesses", None) or SHARED_PRELOADED in os.environ:
        return
    from preloaded import Preloaded

    folder = tempfile.mkdtemp(prefix="clip-dcl-preloaded-")
    server = Preloaded(folder, os.path.join(folder, "python.sock")).start()
    config.stash[_shared_key] = server
    os.environ[SHARED_PRELOADED] = server.socket


def pytest_unconfigure(config):
    server = config.stash.get(_shared_key, None)
    if server is not None:
        server.stop()
        shutil.rmtree(server.folder, ignore_errors=True)
        os.environ.pop(SHARED_PRELOADED, None)


@pytest.fixture(scope="session")
def preloaded(tmp_path_factory):
    """The session's :class:`preloaded.Preloaded`: ``.python`` (a path, for ``python -c``/``-m`` commands) and
    ``.env(env)`` (``env`` with its ``python`` and ``clip-dcl`` first on the PATH); under pytest-xdist, the one
    the controller started."""
    from preloaded import Preloaded

    if os.environ.get(SHARED_PRELOADED):
        yield Preloaded.attach(os.environ[SHARED_PRELOADED])
        return
    with Preloaded(tmp_path_factory.mktemp("preloaded")) as server:
        yield server


#: The modules that take longest, longest first (wall time in a `make test` on 2 cores with 3 workers:
#: test_reliability_signals.py 124 s down to test_train_log_columns.py 27 s). ``make test`` hands them to its
#: pytest-xdist workers first (``--dist loadfile --no-loadscope-reorder``), so that no long module starts last and
#: runs alone at the end; xdist's own order (modules with the most tests first) started them last.
LONGEST_FIRST = (
    "test_reliability_signals.py",
    "test_reliability_exit.py",
    "test_train.py",
    "test_train_preempt.py",
    "test_startup_stress.py",
    "test_openclip_scenarios.py",
    "test_docs_commands.py",
    "test_reliability_startup.py",
    "test_preempt_soak.py",
    "test_study_e2e.py",
    "test_reliability_hints.py",
    "test_train_distributed.py",
    "test_reliability_lock.py",
    "test_losses_distributed.py",
    "test_study_signals.py",
    "test_losses_distributed_no_grad.py",
    "test_demo.py",
    "test_checkpoint.py",
    "test_train_log_columns.py",
)


def pytest_collection_modifyitems(config, items):
    """The modules of :data:`LONGEST_FIRST` first, in its order; the others after them, as collected."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
