"""A preempted run loses nothing: the signal, the agreement between ranks, the mid-epoch checkpoint,
the resume at its step, and the Slurm script that asks for the signal and requeues.

The end-to-end tests run clip-dcl-tiny through ``tests/distributed/preempt_train.py``, which is
``python -m clip_dcl.train`` plus an optimizer hook that sends the process a real SIGTERM after
its K-th optimizer step (on one chosen rank), so that the stop lands mid-epoch at a known step
whatever the machine's speed.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from test_train_distributed import write_shards

HERE = Path(__file__).resolve().parent
LAUNCH = HERE.parent / "launch"
HELPER = HERE / "distributed" / "preempt_train.py"


# -- flags ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "flags, named",
    [
        (["--preempt-signals", "SIGFOO"], "--preempt-signals SIGFOO: unknown signal"),
        (["--preempt-signals", "KILL"], "--preempt-signals KILL: SIGKILL cannot be caught"),
        (["--preempt-check-every", "0"], "--preempt-check-every must be >= 1, got 0"),
        (["--save-every-minutes", "0"], "--save-every-minutes must be > 0, got 0"),
    ],
)
def test_preempt_flags_with_bad_values_exit_2_naming_them(tmp_path, capsys, flags, named):
    from clip_dcl.train import main

    assert main(["--dataset-type", "synthetic", "--train-num-samples", "8", *flags]) == 2
    assert named in capsys.readouterr().err


def test_preempt_flags_resolve():
    from clip_dcl.train.flags import parse_train_args

    base = ["--dataset-type", "synthetic", "--train-num-samples", "8"]
    assert parse_train_args(base).preempt.signals == ["SIGTERM", "SIGUSR1"]
    cfg = parse_train_args(
        base + ["--preempt-signals", "usr2", "15", "--preempt-check-every", "5", "--save-every-minutes", "30"]
    )
    assert (cfg.preempt.signals, cfg.preempt.check_every, cfg.preempt.save_every_minutes) == (["usr2", "15"], 5, 30)
    assert parse_train_args(base + ["--preempt-signals", "none"]).preempt.signals == []
    assert "--preempt-signals" not in " ".join(cfg.openclip_argv)  # ours, not passed on to OpenCLIP


# -- the signal and the decision ----------------------------------------------------------------------
def test_preempt_signal_sets_a_flag_and_the_old_handler_comes_back():
    from clip_dcl.train.signals import PreemptConfig, StepGate, StopSignals

    before = signal.getsignal(signal.SIGUSR2)
    signals = StopSignals(["USR2"]).install()
    signals.training_started()  # before it, a signal stops at once (test_reliability_startup)
    gate = StepGate(PreemptConfig(check_every=3), signals, world_size=1, rank=0, device="cpu")
    try:
        assert gate.poll(3) == (False, False)
        os.kill(os.getpid(), signal.SIGUSR2)  # the process goes on: only a flag is set
        assert signals.received == "SIGUSR2"
        assert gate.poll(4) == (False, False)  # looked at every 3 steps only
        assert gate.poll(6) == (True, False) and gate.signame == "SIGUSR2"
    finally:
        signals.restore()
    assert signal.getsignal(signal.SIGUSR2) is before


def test_preempt_gate_saves_on_rank_0s_clock():
    from clip_dcl.train.signals import PreemptConfig, StepGate

    gate = StepGate(PreemptConfig(save_every_minutes=1e-9), None, world_size=1, rank=0, device="cpu")
    assert gate.poll(1) == (False, True)
    other = StepGate(PreemptConfig(save_every_minutes=1e-9), None, world_size=1, rank=1, device="cpu")
    assert other.poll(1) == (False, False)  # only rank 0's clock decides (the all-reduce shares it)
    quiet = StepGate(PreemptConfig(save_every_minutes=60), None, world_size=1, rank=0, device="cpu")
    assert quiet.poll(1) == (False, False)


class _Loader:
    def __init__(self, n):
        self.n, self.num_batches, self.num_samples = n, n, n

    def __iter__(self):
        for i in range(self.n):
            yield torch.tensor([i]), torch.tensor([i]), torch.tensor([i])


@pytest.mark.parametrize("accum", [1, 2])
def test_preempt_stops_between_optimizer_steps_and_a_resume_skips_them(accum):
    from clip_dcl.train.loop import StepBatches

    asked = []

    def at_boundary(step):
        asked.append(step)
        return step == 2

    channel = StepBatches(_Loader(8), accum, at_boundary=at_boundary)
    got = [int(images) for _, group in channel for images, _, _ in group]
    assert got == list(range(2 * accum)) and channel.stopped_at == 2
    assert asked == [0, 1, 2]  # once per optimizer step, before its first micro-batch is fetched
    # resumed at step 2: the first 2 x accum batches are read and dropped, then the rest of the epoch
    marks = []
    resumed = StepBatches(
        _Loader(8),
        accum,
        skip=2,
        resumed=lambda: marks.append("resumed"),
        at_boundary=lambda step: marks.append(step) and False,
    )
    got = [int(images) for _, group in resumed for images, _, _ in group]
    assert got == list(range(2 * accum, 8)) and resumed.stopped_at is None
    assert marks == ["resumed"] + list(range(2, 8 // accum))  # no stop asked after the epoch's last step


def test_preempt_checkpoint_names_sort_where_resume_latest_looks(tmp_path):
    from open_clip_train.main import get_latest_checkpoint

    folder = tmp_path / "checkpoints"
    (folder / "loss_state" / "epoch_3_step_7").mkdir(parents=True)
    for name in ("epoch_2.pt", "epoch_3.pt", "epoch_2_step_9.pt", "epoch_3_step_7.pt"):
        (folder / name).write_bytes(b"")
    assert get_latest_checkpoint(str(folder) + "/", remote=False) == str(folder / "epoch_3_step_7.pt")
    (folder / "epoch_4.pt").write_bytes(b"")
    assert get_latest_checkpoint(str(folder) + "/", remote=False) == str(folder / "epoch_4.pt")


# -- the Slurm script -----------------------------------------------------------------------------------
def _slurm(tmp_path, srun_rc, *args, **env):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/srun.args\nexit {srun_rc}\n')
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/scontrol.args\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "DRY_RUN"}
    full_env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="4242", **env)
    return subprocess.run(
        ["bash", str(LAUNCH / "train_slurm.sbatch"), *args], capture_output=True, text=True, env=full_env, timeout=30
    )


def test_preempt_slurm_script_asks_for_the_signal_and_requeues_on_exit_75(tmp_path):
    from clip_dcl.train.exits import PREEMPTED_EXIT_CODE

    text = (LAUNCH / "train_slurm.sbatch").read_text()
    assert "#SBATCH --signal=USR1@120" in text and "#SBATCH --requeue" in text
    assert f"PREEMPTED={PREEMPTED_EXIT_CODE}" in text
    flags = ["--name", "run", "--resume", "latest", "--loss", "decl"]
    out = _slurm(tmp_path, PREEMPTED_EXIT_CODE, *flags)
    assert out.returncode == PREEMPTED_EXIT_CODE, out.stderr
    assert (tmp_path / "scontrol.args").read_text().split() == ["requeue", "4242"]
    assert (tmp_path / "srun.args").read_text().split()[-6:] == flags
    assert "warning" not in out.stderr
    (tmp_path / "scontrol.args").unlink()
    for rc in (0, 1):  # a finished or failed run is not requeued
        assert _slurm(tmp_path, rc, *flags).returncode == rc
        assert not (tmp_path / "scontrol.args").exists()
    assert _slurm(tmp_path, PREEMPTED_EXIT_CODE, *flags, REQUEUE="0").returncode == PREEMPTED_EXIT_CODE
    assert not (tmp_path / "scontrol.args").exists()
    # without a fixed name, a requeued job would start a new run: said before it starts
    assert "--name NAME and --resume latest" in _slurm(tmp_path, 0, "--loss", "decl").stderr


# -- end to end: stop mid-epoch on a signal, resume, and end where the uninterrupted run ends -----------------
def _run(python, tmp_path, name, pattern, nproc, extra=(), env=None):
    """The run through ``python`` (the preloaded one: torchrun, its ranks and the one-process run are processes of
    their own, started without importing torch again; the stop is a signal each sends itself)."""
    launch = (
        [
            python,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(nproc),
            str(HELPER),
            "--",
        ]
        if nproc > 1
        else [python, str(HELPER)]
    )
    cmd = [
        *launch,
        "--model",
        "clip-dcl-tiny",
        "--train-data",
        pattern,
        "--dataset-type",
        "webdataset",
        "--dataset-resampled",
        "--train-num-samples",
        "64",
        "--batch-size",
        "8",
        "--workers",
        "1",
        "--epochs",
        "2",
        "--precision",
        "fp32",
        "--device",
        "cpu",
        "--seed",
        "3",
        "--lr",
        "1e-3",
        "--warmup",
        "2",
        "--log-every-n-steps",
        "1",
        "--logs",
        str(tmp_path / "logs"),
        "--name",
        name,
        "--loss",
        "decl",
        "--decl-rate",
        "index",
        "--decl-num-samples",
        "400",
        *extra,
    ]
    if nproc > 1:
        cmd += ["--local-loss", "--gather-with-grad"]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=full_env)


def _assert_same_end(tmp_path, a, b):
    from clip_dcl.train.saving import read_loss_state

    pa, pb = (tmp_path / "logs" / n / "checkpoints" / "epoch_2.pt" for n in (a, b))
    ca, cb = (torch.load(p, map_location="cpu", weights_only=True) for p in (pa, pb))
    assert ca["state_dict"].keys() == cb["state_dict"].keys()
    for k in ca["state_dict"]:
        assert torch.equal(ca["state_dict"][k], cb["state_dict"][k]), k
    for idx, st in ca["optimizer"]["state"].items():  # AdamW's moments and step counts
        for k, v in st.items():
            assert torch.equal(v, cb["optimizer"]["state"][idx][k]), (idx, k)
    la, lb = read_loss_state(pa), read_loss_state(pb)
    assert la.keys() == lb.keys()
    for k in la:  # rows never visited hold NaN in both
        assert torch.equal(la[k].nan_to_num(7.0), lb[k].nan_to_num(7.0)), k
        assert torch.equal(la[k].isnan(), lb[k].isnan()), k


@pytest.mark.slow
def test_preempt_two_ranks_sigterm_mid_epoch_resumes_to_the_uninterrupted_weights_and_loss_state(tmp_path, preloaded):
    """2 gloo ranks, 4 steps an epoch, 2 epochs; SIGTERM reaches rank 1 only, after its 6th step."""
    pattern = write_shards(tmp_path / "shards", num_shards=2, per_shard=16)
    full = _run(preloaded.python, tmp_path, "full", pattern, 2)
    assert full.returncode == 0, full.stderr[-4000:]
    cut = _run(preloaded.python, tmp_path, "cut", pattern, 2, env={"PREEMPT_AT_STEP": "6", "PREEMPT_RANK": "1"})
    # each rank exits 75; torchrun reports its workers' failure with its own code
    assert cut.returncode != 0 and re.search(r"exitcode\s*: 75", cut.stderr), cut.stderr[-4000:]
    folder = tmp_path / "logs" / "cut" / "checkpoints"
    assert sorted(p.name for p in folder.glob("*.pt")) == ["epoch_1.pt", "epoch_1_step_2.pt"]
    # rank 0 never got the signal: it stopped at the same step because the ranks agree in one collective
    assert (
        "Saved " + str(folder / "epoch_1_step_2.pt") + ": step 2 of epoch 1 (on a signal on another rank)" in cut.stderr
    )
    assert "Stopped on SIGTERM after step 2 of epoch 1" in cut.stderr
    saved = torch.load(folder / "epoch_1_step_2.pt", map_location="cpu", weights_only=True)
    assert saved["epoch"] == 1 and saved["clip_dcl"]["resume"]["step"] == 2
    assert int(saved["loss_state"]["calls"]) == 6  # DeCL's optimizer-step counter: 4 + 2
    assert (folder / "loss_state" / "epoch_1_step_2").is_dir()  # the sharded rates: one file per rank
    resumed = _run(preloaded.python, tmp_path, "cut", pattern, 2, extra=["--resume", "latest"])
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert resumed.stderr.count("Resumed epoch 1 at step 2 of 4") == 2
    _assert_same_end(tmp_path, "full", "cut")
    digests = {
        n: re.findall(r"Loss state after epoch 1 on rank \d: calls 8, digest (\w+)", out.stderr)
        for n, out in (("full", full), ("resumed", resumed))
    }
    assert len(set(digests["full"])) == 1 and digests["full"] == digests["resumed"]
    # the epoch's checkpoint supersedes the mid-epoch one
    assert sorted(p.name for p in folder.glob("*.pt")) == ["epoch_1.pt", "epoch_2.pt"]
    assert not (folder / "loss_state" / "epoch_1_step_2").exists()


@pytest.mark.slow
def test_preempt_one_process_usr1_with_save_most_recent_and_periodic_saves(tmp_path, preloaded):
    """SIGUSR1 (Slurm's --signal) on one process, --save-most-recent (the stop goes to epoch_latest.pt,
    where OpenCLIP's --resume latest looks then) and --save-every-minutes (saves at step boundaries
    that do not stop the run); the resumed run ends where the uninterrupted one does."""
    pattern = write_shards(tmp_path / "shards", num_shards=2, per_shard=16)
    flags = ["--save-most-recent", "--save-every-minutes", "1e-9"]
    full = _run(preloaded.python, tmp_path, "full", pattern, 1, extra=flags)
    assert full.returncode == 0, full.stderr[-4000:]
    assert full.stderr.count("(every 1e-09 minutes)") == 2 * 8  # before steps 0..7 of each 8-step epoch
    cut = _run(
        preloaded.python,
        tmp_path,
        "cut",
        pattern,
        1,
        extra=flags,
        env={"PREEMPT_AT_STEP": "11", "PREEMPT_SIGNAL": "SIGUSR1"},
    )
    assert cut.returncode == 75, cut.stderr[-4000:]
    latest = tmp_path / "logs" / "cut" / "checkpoints" / "epoch_latest.pt"
    assert f"Saved {latest}: step 3 of epoch 1 (on SIGUSR1)" in cut.stderr
    assert not list(latest.parent.glob("epoch_*_step_*.pt"))  # with --save-most-recent, only epoch_latest.pt
    resumed = _run(preloaded.python, tmp_path, "cut", pattern, 1, extra=["--resume", "latest", *flags])
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "Resumed epoch 1 at step 3 of 8" in resumed.stderr
    _assert_same_end(tmp_path, "full", "cut")
