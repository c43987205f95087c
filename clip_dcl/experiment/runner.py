"""Running trainings as a user would: ``python -m clip_dcl.train`` in a child process, under a machine-wide lock.

The child is a process group of its own (:mod:`clip_dcl.process`): Ctrl-C (or SIGTERM, under
``stop_on_signals``) reaches this process only, which passes it on once to the child's group, waits for it to
save and exit (``STOP_GRACE_S`` at most) and raises on, so that the caller can say what it kept and nothing it
started outlives it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from ..arguments import flag_words  # noqa: F401 (imported from here too)
from ..process import Stopped, start_group, stop_group
from ..train.metrics import METRICS_FILE, epoch_position, read_metrics, read_new_records

#: The model every demo run trains (registered by clip_dcl.models).
DEFAULT_MODEL = "clip-dcl-tiny"


@dataclass(frozen=True)
class Run:
    """One objective of a comparison: a table label and its ``clip_dcl.train`` flags."""

    name: str
    flags: tuple = ()

    @property
    def slug(self) -> str:
        """A folder name for the run's logs."""
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", self.name).strip("-") or "run"


@dataclass(frozen=True)
class Budget:
    """What every run of a comparison shares; maps one to one onto OpenCLIP's flags."""

    epochs: int = 4
    batch_size: int = 128
    lr: float = 1e-3
    wd: float = 0.1
    warmup: int = 20
    seed: int = 0
    workers: int = 1
    model: str = DEFAULT_MODEL
    log_every_n_steps: int = 5
    #: OpenCLIP flags added verbatim (e.g. ``("--lr-scheduler", "const")``)
    extra: tuple = ()

    def validate(self) -> None:
        for name in ("epochs", "batch_size", "log_every_n_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 1")
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr!r} must be > 0")
        if self.workers < 0 or self.warmup < 0:
            raise ValueError(f"workers={self.workers!r} and warmup={self.warmup!r} must be >= 0")


def default_runs(tau_plus: float) -> List[Run]:
    """The three objectives under their package defaults; ``dcl`` gets the data's own class prior."""
    return [
        Run("clip", ("--loss", "clip")),
        Run("dcl", ("--loss", "dcl", "--tau-plus", f"{tau_plus:.6g}")),
        Run("decl", ("--loss", "decl", "--decl-rate", "index")),
    ]


def train_command(
    run: Run,
    data: dict,
    logs: os.PathLike,
    budget: Budget,
    entry: Optional[Sequence[str]] = None,
    *,
    precision: str = "fp32",
    device: str = "auto",
    num_samples: Optional[int] = None,
    validate: bool = True,
) -> List[str]:
    """The ``python -m clip_dcl.train -- ...`` command line of ``run`` (``data``: a synth summary).

    ``entry`` replaces ``[python, "-m", "clip_dcl.train"]``; ``device=None`` leaves the flag out (a line for
    another machine); ``num_samples``: that many samples drawn with replacement per epoch, for a timing.
    """
    from ..eval.encoding import resolve_device

    every_epoch = "1" if validate else "0"
    options = {
        "--model": budget.model,
        "--train-data": data["train_data"],
        "--val-data": data["val_data"] if validate else None,
        "--dataset-type": data.get("dataset_type", "webdataset"),
        "--dataset-resampled": num_samples is not None,
        "--train-num-samples": data["train"]["num_samples"] if num_samples is None else num_samples,
        "--val-num-samples": data["val"]["num_samples"] if validate else None,
        "--batch-size": budget.batch_size,
        "--epochs": budget.epochs,
        "--lr": repr(budget.lr),
        "--wd": repr(budget.wd),
        "--warmup": budget.warmup,
        "--seed": budget.seed,
        "--workers": budget.workers,
        "--precision": precision,
        "--device": None if device is None else resolve_device(device),
        "--logs": logs,
        "--name": run.slug,
        "--log-every-n-steps": budget.log_every_n_steps,
        "--save-frequency": every_epoch,
        "--zeroshot-frequency": 0,
        "--val-frequency": every_epoch,
        "--delete-previous-checkpoint": True,
        "--report-to": "",
    }
    entry = entry or [sys.executable, "-m", "clip_dcl.train"]
    return [*entry, "--", *flag_words(options), *budget.extra, *run.flags]


@dataclass
class TrainResult:
    run: Run
    checkpoint: Path
    log_dir: Path
    seconds: float
    command: List[str]
    curves: Dict[str, list] = field(default_factory=dict)
    val: List[dict] = field(default_factory=list)


@contextmanager
def machine_lock(echo: Callable[[str], None] = print):
    """Hold a machine-wide ``flock`` (``$CLIP_DCL_TRAIN_LOCK``; empty: none) while a training child runs: two
    trainings sharing a small CPU run several times slower each than one after the other."""
    path = os.environ.get("CLIP_DCL_TRAIN_LOCK", os.path.join(tempfile.gettempdir(), "clip-dcl-train.lock"))
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        path = ""
    if not path:
        yield
        return
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            echo(f"  waiting for another clip-dcl training on this machine to finish (lock {path})")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def train(
    run: Run,
    data: dict,
    logs: os.PathLike,
    budget: Budget,
    *,
    echo: Callable[[str], None] = print,
    env: Optional[dict] = None,
    entry: Optional[Sequence[str]] = None,
    precision: str = "fp32",
    device: str = "auto",
    num_samples: Optional[int] = None,
    validate: bool = True,
    lock: bool = True,
) -> TrainResult:
    """Train ``run`` in a child process; stream its progress through ``echo``; return its results.

    An earlier run of the same name under ``logs`` is replaced (OpenCLIP refuses to reuse a folder); on
    failure the output's tail is raised in a ``RuntimeError``. ``lock=False``: the caller holds the lock.
    """
    from ..eval.encoding import resolve_device

    budget.validate()
    device = resolve_device(device)
    logs = Path(logs)
    log_dir = logs / run.slug
    cmd = train_command(
        run, data, logs, budget, entry, precision=precision, device=device, num_samples=num_samples, validate=validate
    )
    no_gpu = {"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {}
    child_env = {**os.environ, **no_gpu, "PYTHONUNBUFFERED": "1", **(env or {})}
    with machine_lock(echo) if lock else contextlib.nullcontext():
        # Only once it is this run's turn: a run stopped while waiting leaves the earlier one intact.
        if log_dir.exists():
            shutil.rmtree(log_dir)
        logs.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        code, lines = _stream(cmd, child_env, run, budget, echo, start, log_dir / METRICS_FILE)
    seconds = time.perf_counter() - start
    log_dir.mkdir(parents=True, exist_ok=True)  # absent when the child failed before OpenCLIP started
    (log_dir / "stdout.txt").write_text("\n".join(lines) + "\n")
    tail = lines[-60:]
    checkpoint = log_dir / "checkpoints" / f"epoch_{budget.epochs}.pt"
    if code != 0 or not checkpoint.is_file():
        raise RuntimeError(f"training {run.name!r} failed (exit code {code}): {' '.join(cmd)}\n" + "\n".join(tail))
    return TrainResult(
        run, checkpoint, log_dir, seconds, cmd, read_curves(log_dir / METRICS_FILE), read_val(log_dir / METRICS_FILE)
    )


def progress_line(name: str, record: dict, epochs: int, seconds: float) -> str:
    """The echo of one training record of ``metrics.jsonl``: epoch, share, the logged ``loss`` and DeCL's term."""
    pct = round(100 * min(1.0, epoch_position(record) - record["epoch"]))
    term, loss2 = record.get("term"), record.get("loss2")
    extra = (f" ({term} step)" if term else "") + (f", InfoNCE {float(loss2):.4f}" if loss2 is not None else "")
    return (
        f"  [{name}] epoch {record['epoch'] + 1}/{epochs} {pct:3d}%  loss {float(record['loss']):.4f}{extra}  "
        f"({seconds:.0f} s)"
    )


def _val_line(name: str, record: dict) -> str:
    found = {k: v for k, v in record.items() if k.endswith("_R@1") or k == "clip_val_loss"}
    return f"  [{name}] validation: " + ", ".join(f"{k} {float(v):.4f}" for k, v in found.items())


def _stream(cmd, env, run: Run, budget: Budget, echo, start: float, metrics: Path):
    """Run ``cmd``, echoing its progress from ``metrics``; return the exit code and the output's lines."""
    lines: List[str] = []
    last_echo, offset = 0.0, 0

    def echo_new():
        nonlocal last_echo, offset
        records, offset = read_new_records(metrics, offset)
        for record in records:
            now = time.perf_counter()
            if record.get("kind") == "val":
                echo(_val_line(run.name, record))
            elif record.get("kind") == "train" and (
                now - last_echo > 5 or record["samples"] >= record["samples_per_epoch"]
            ):
                echo(progress_line(run.name, record, budget.epochs, now - start))
                last_echo = now

    proc = start_group(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    with proc.stdout:
        try:
            for line in proc.stdout:
                lines.append(line.rstrip())
                echo_new()
        except (KeyboardInterrupt, Stopped) as e:
            stop_group(proc, signal.SIGTERM if isinstance(e, Stopped) else signal.SIGINT, lines)
            raise
    code = proc.wait()
    echo_new()
    return code, lines


def read_curves(metrics: os.PathLike) -> Dict[str, list]:
    """``{"epoch", "loss"}``: the logged training loss against fractional epochs of a run's ``metrics.jsonl``."""
    records = read_metrics(metrics, "train")
    return {"epoch": [epoch_position(r) for r in records], "loss": [r["loss"] for r in records]}


def read_val(metrics: os.PathLike) -> List[dict]:
    """The per-epoch validation records of a run's ``metrics.jsonl``: OpenCLIP's ``evaluate`` metrics."""
    return [{k: v for k, v in r.items() if k not in ("kind", "step", "time")} for r in read_metrics(metrics, "val")]


@dataclass(frozen=True)
class StepTime:
    """One logged training step: epoch, samples done in the epoch, data and step seconds, samples/s."""

    epoch: int
    samples_done: int
    data_seconds: float
    batch_seconds: float
    samples_per_second: float


def read_step_times(metrics: os.PathLike) -> List[StepTime]:
    """The logged training steps of a run's ``metrics.jsonl``, in order."""
    return [
        StepTime(r["epoch"], r["samples"], r["data_time"], r["batch_time"], r["samples_per_second"])
        for r in read_metrics(metrics, "train")
    ]


def packed_training_set(data: dict, verbose: bool = True) -> dict:
    """``data`` (a synth summary) training on its shards packed once into ``OUT_DIR/train.npz``: the same
    samples in the same order, without decoding each image every epoch."""
    from ..data.packed import pack_synth

    return {**data, "train_data": str(pack_synth(data, verbose=verbose)), "dataset_type": "auto"}


def synth_data(out_dir: os.PathLike, *, quick: bool = False, verbose: bool = True, **overrides) -> dict:
    """The synthetic data set under ``out_dir``: reused when written with the same config, else written afresh."""
    from ..data.synth import generate

    try:
        return generate(out_dir, quick=quick, reuse=True, verbose=verbose, **overrides)
    except FileExistsError:
        return generate(out_dir, quick=quick, overwrite=True, verbose=verbose, **overrides)
