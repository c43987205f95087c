"""Start-up that obeys signals, more ranks than GPUs refused, and one line per failed launch.

``startup``: SIGTERM or Ctrl-C before the first training step ends the process within seconds (75 or 130,
one line saying nothing was trained), also while it waits in C++ for a rank that never comes to the
rendezvous; the launcher's last line then names the rank that failed first, not the signal torchrun sent.

``devices``: on CUDA, more ranks on a node than visible GPUs is refused in one line, before any rank
starts (the GPU count is faked: this CPU has none).

``oneline``: a known bad input under the launcher prints its line once, with no traceback.

Each launch runs in its own process group with a timeout (``test_reliability_exit._finish``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_reliability_exit import HELPER, _env, _flags, _launch, shards  # noqa: F401 (a fixture)
from test_reliability_exit import _finish as _finish_group

ROOT = Path(__file__).resolve().parents[1]
#: A stop during start-up ends the process within this many seconds: 5 s measured on idle cores, with room
#: for cores that other work (a study, the rest of the suite) shares.
STOP_BOUND_S = 10.0
#: Seconds a launch of two ranks may take on a loaded CPU before the test fails (a hang never ends).
LAUNCH_BOUND_S = 300


def _last_line(err: str) -> str:
    return err.strip().splitlines()[-1] if err.strip() else ""


def _wait_for(path: Path, proc, timeout=LAUNCH_BOUND_S):
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"{path.name} never appeared:\n{proc.communicate()[1][-3000:]}")
        time.sleep(0.1)


def _descendants(pid: int) -> list:
    out = []
    for task in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                for child in map(int, f.read().split()):
                    out += [child, *_descendants(child)]
        except OSError:
            pass
    return out


def _finish(proc, timeout=None):
    """``test_reliability_exit._finish``, killing torchrun's ranks too on a timeout (each in a session of its own,
    out of the launcher's process group: left alive, they would wait for its store for half an hour)."""
    timer = threading.Timer((timeout or LAUNCH_BOUND_S) - 1, lambda: [_kill(p) for p in _descendants(proc.pid)])
    timer.start()
    try:
        return _finish_group(proc, timeout=timeout or LAUNCH_BOUND_S)
    finally:
        timer.cancel()


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _ended(pid: int) -> bool:
    """Whether process ``pid`` has exited (gone, or a zombie its parent has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _exit_within(proc, since: float):
    """``(returncode, stderr, seconds from since to the exit)``, polling so that the exit time is the process's."""
    deadline = since + 60
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    took = time.monotonic() - since
    rc, err, _ = _finish(proc, timeout=LAUNCH_BOUND_S)
    return rc, err, took


# -- startup: the handlers ------------------------------------------------------------------------------------
def test_startup_a_stop_signal_before_the_first_step_stops_at_once_and_after_it_waits_for_the_step():
    from clip_dcl.train.signals import StartupStop, StopSignals

    before = signal.getsignal(signal.SIGUSR2)
    signals = StopSignals(["USR2"], ctrl_c=True).install()  # called from Python: no exit from the handler
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.05)  # the handler ran and raised nothing (it may run inside Python that C++ called)
        assert signals.startup_stop == "SIGUSR2"
        with pytest.raises(StartupStop) as stop:  # at the run's next safe point
            signals.check_startup()
        assert stop.value.signame == "SIGUSR2" and stop.value.exit_code == 75
        assert signals.received is None  # nothing for a step boundary to act on
        signals.startup_stop = None
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        with pytest.raises(StartupStop) as stop:
            signals.check_startup()
        assert stop.value.exit_code == 130
        signals.startup_stop = None
        signals.training_started()  # within the wakeup pipe's grace: its reader ends with the start-up
        os.kill(os.getpid(), signal.SIGUSR2)  # training: a flag, the step boundary saves and stops
        assert signals.received == "SIGUSR2"
        signals.check_startup()  # no start-up stop any more
    finally:
        signals.restore()
    assert signal.getsignal(signal.SIGUSR2) is before


def test_startup_the_line_says_nothing_was_trained():
    from clip_dcl.train.exits import startup_stop_line

    assert startup_stop_line("SIGTERM") == (
        "clip-dcl train: stopped on SIGTERM during start-up, before the first "
        "training step: nothing was trained since the last checkpoint; exit "
        "code 75"
    )
    assert startup_stop_line("SIGINT", "1").startswith("clip-dcl train: interrupted (Ctrl-C) (rank 1) during start-up")
    assert startup_stop_line("SIGINT").endswith("exit code 130")


def test_startup_the_launcher_names_the_rank_that_failed_first_not_those_it_stopped():
    from clip_dcl.train.torchrun import _first_failure

    def failure(code, ts, precise=None, kind=None):
        extra = {"clip_dcl_time": repr(precise), "clip_dcl_kind": kind} if precise is not None else {}
        return SimpleNamespace(exitcode=code, timestamp=ts, error_file_data={"message": {"extraInfo": extra}})

    stopped, killed = failure(75, 100, 99.5, "stop"), failure(-9, 101)
    assert _first_failure([(0, stopped), (1, killed)]) == (1, killed)  # 75: torchrun's SIGTERM, not the cause
    a, b = failure(1, 100, 100.7, "error"), failure(1, 100, 100.2, "error")
    assert _first_failure([(0, a), (1, b)]) == (1, b)  # the same second: the finer time decides
    own, peer = failure(75, 100, 100.1, "stop"), failure(1, 100, 100.0, "peer")
    # a SIGTERM to rank 1 alone: rank 0's collective failed because rank 1 left (whatever the clock says)
    assert _first_failure([(0, peer), (1, own)]) == (1, own)
    error, hung = failure(1, 100, 100.3, "error"), failure(-9, 130)
    assert _first_failure([(0, hung), (1, error)]) == (1, error)  # the rank torchrun killed last is not the cause
    c, d = failure(75, 100, 100.5, "stop"), failure(130, 100, 100.2, "stop")
    assert _first_failure([(0, c), (1, d)]) == (1, d)  # all stopped on a signal: the earliest
    # rank 0 stopped on its SIGTERM and saved; torchrun's SIGTERM reached rank 1 on its way out, with no handler
    saved, leaving = failure(75, 100, 100.5, "stop"), failure(-signal.SIGTERM, 101)
    assert _first_failure([(0, saved), (1, leaving)]) == (0, saved)
    # rank 1 killed; rank 0 aborted because its collective failed (a C++ library's terminate): rank 1 is the cause
    aborted, killed = failure(-signal.SIGABRT, 100), failure(-signal.SIGKILL, 100)
    assert _first_failure([(0, aborted), (1, killed)]) == (1, killed)
    assert _first_failure([(0, aborted)]) == (0, aborted)


# -- startup: end to end ----------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 75), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_startup_a_signal_before_the_first_step_ends_the_run_within_5s(shards, tmp_path, sig, code):  # noqa: F811
    marker = tmp_path / "m"
    env = _env(STARTUP_PAUSE="1", PAUSE_FILE=str(marker))
    proc, _ = _launch(
        [HELPER, *_flags(shards, tmp_path / "logs", "s", "--loss", "decl", "--decl-num-samples", "400")], env=env
    )
    _wait_for(Path(str(marker) + ".startup"), proc)  # the model is built, the loss is being built
    sent = time.monotonic()
    os.kill(proc.pid, sig)
    rc, err, took = _exit_within(proc, sent)
    assert rc == code, err[-3000:]
    assert took < STOP_BOUND_S, f"{took:.1f} s"
    what = "stopped on SIGTERM" if sig == signal.SIGTERM else "interrupted (Ctrl-C)"
    assert _last_line(err).endswith(
        f"clip-dcl train: {what} during start-up, before the first training step: "
        f"nothing was trained since the last checkpoint; exit code {code}"
    ), err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert not (tmp_path / "logs" / "s").exists()  # no checkpoint: the folder goes, the same command runs again


@pytest.mark.slow
def test_startup_a_rank_killed_before_the_rendezvous_ends_the_waiting_one_within_5s(shards, tmp_path):  # noqa: F811
    # rank 1 never reaches the rendezvous and is killed; rank 0 waits in C++ (init_process_group) until torchrun's
    # SIGTERM, which its Python handler cannot see there: the wakeup pipe's reader ends it
    marker = tmp_path / "m"
    env = _env(FREEZE_RANK="1", PAUSE_FILE=str(marker))
    flags = _flags(
        shards,
        tmp_path / "logs",
        "r",
        "--loss",
        "decl",
        "--decl-num-samples",
        "400",
        "--local-loss",
        "--gather-with-grad",
    )
    proc, _ = _launch(
        ["-m", "clip_dcl.train.torchrun", "--standalone", "--nproc_per_node", "2", HELPER, "--", *flags], env=env
    )
    _wait_for(Path(str(marker) + ".frozen"), proc)
    _wait_for(Path(str(marker) + ".rdzv.0"), proc)
    time.sleep(1.0)  # rank 0 is in the rendezvous's wait
    frozen = int(Path(str(marker) + ".frozen").read_text())
    waiting = int(Path(str(marker) + ".rdzv.0").read_text())
    killed = time.monotonic()
    os.kill(frozen, signal.SIGKILL)
    while not _ended(waiting) and time.monotonic() - killed < 60:
        time.sleep(0.02)
    took = time.monotonic() - killed  # torchrun's notice of the death, its SIGTERM, rank 0's exit
    rc, err, _ = _finish(proc, timeout=LAUNCH_BOUND_S)
    assert took < STOP_BOUND_S, f"{took:.1f} s:\n{err[-3000:]}"
    assert rc == 1, err[-3000:]
    assert "clip-dcl train: stopped on SIGTERM (rank 0) during start-up, before the first training step" in err
    last = _last_line(err)
    assert last.startswith("clip-dcl train: error: rank 1 ") and "was killed by SIGKILL first" in last, err[-3000:]
    assert "Traceback" not in err, err[-3000:]


# -- devices ---------------------------------------------------------------------------------------------------
def _fake_gpus(monkeypatch, count):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_devices_more_ranks_than_gpus_is_refused_naming_both(monkeypatch):
    from clip_dcl.errors import FlagError
    from clip_dcl.train.flag_checks import check_ranks_against_devices

    _fake_gpus(monkeypatch, 1)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(FlagError, match=r"^2 ranks on this node but 1 GPU visible: one rank per GPU; start 1 "):
        check_ranks_against_devices(2, "cuda")
    check_ranks_against_devices(1, "cuda")  # as many: fine
    check_ranks_against_devices(2, "cpu")  # gloo on the CPU: any number
    _fake_gpus(monkeypatch, 0)
    monkeypatch.setattr(__import__("torch").cuda, "is_available", lambda: False)
    check_ranks_against_devices(4, "cuda")  # no GPU visible: OpenCLIP falls back to the CPU


def test_devices_the_entry_point_under_plain_torchrun_refuses_too(monkeypatch, shards, tmp_path):  # noqa: F811
    from clip_dcl.train import main

    _fake_gpus(monkeypatch, 1)
    for var, value in (("LOCAL_WORLD_SIZE", "2"), ("WORLD_SIZE", "2"), ("RANK", "0"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(var, value)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    flags = [f for f in _flags(shards, tmp_path / "logs", "d") if f not in ("cpu", "--device")]
    capture = []
    monkeypatch.setattr("sys.stderr", SimpleNamespace(write=capture.append, flush=lambda: None))
    assert main(flags + ["--device", "cuda"]) == 2
    text = "".join(capture).strip()
    assert text.startswith("clip-dcl train: error: 2 ranks on this node but 1 GPU visible") and "\n" not in text


_FAKE_ONE_GPU = """\
import torch
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
"""


@pytest.mark.slow
def test_devices_the_launch_script_refuses_2_ranks_on_1_gpu_before_any_rank_starts(shards, tmp_path):  # noqa: F811
    fake = tmp_path / "fake"  # a sitecustomize that makes torch see one GPU, in the launcher only (it starts no rank)
    fake.mkdir()
    (fake / "sitecustomize.py").write_text(_FAKE_ONE_GPU)
    env = _env(PYTHON=sys.executable, NPROC="2")
    env["PYTHONPATH"] = os.pathsep.join([str(fake), env["PYTHONPATH"]])
    env.pop("CUDA_VISIBLE_DEVICES")
    flags = [f for f in _flags(shards, tmp_path / "logs", "g") if f not in ("cpu", "--device")]
    proc = subprocess.run(
        ["bash", str(ROOT / "launch" / "train_single_node.sh"), *flags],
        capture_output=True,
        text=True,
        env=env,
        timeout=LAUNCH_BOUND_S,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("clip-dcl train: error: 2 ranks on this node but 1 GPU visible"), lines
    assert not (tmp_path / "logs").exists()  # no rank started


# -- oneline ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_oneline_too_few_shards_for_two_ranks_is_one_line_before_any_rank_starts(shards, tmp_path):  # noqa: F811
    flags = _flags(shards, tmp_path / "logs", "w", "--loss", "dcl", "--workers", "4")
    flags.remove("--dataset-resampled")
    proc, _ = _launch(
        ["-m", "clip_dcl.train.torchrun", "--standalone", "--nproc_per_node", "2", "-m", "clip_dcl.train", "--", *flags]
    )
    rc, err, _ = _finish(proc, timeout=LAUNCH_BOUND_S)
    assert rc == 2, err[-3000:]
    line = (
        "clip-dcl train: error: --train-data has 4 shard(s) for --workers 4 x 2 ranks: each worker reads shards "
        "of its own, so 8 are needed; give --workers 2 or fewer, more shards, or --dataset-resampled"
    )
    assert err.strip() == line, err[-3000:]  # once, alone: no rank started
    assert not (tmp_path / "logs").exists()


def test_oneline_the_entry_point_refuses_too_few_shards_on_its_world(monkeypatch, shards, tmp_path):  # noqa: F811
    from clip_dcl.errors import FlagError
    from clip_dcl.train.flags import parse_train_args

    flags = _flags(shards, tmp_path / "logs", "w", "--loss", "dcl", "--workers", "3")
    flags.remove("--dataset-resampled")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(FlagError, match=r"^--train-data has 4 shard\(s\) for --workers 3 x 2 ranks"):
        parse_train_args(flags)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert parse_train_args(flags) is not None
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert parse_train_args(flags + ["--dataset-resampled"]) is not None  # resampled: any number of shards


@pytest.mark.slow
def test_oneline_an_error_every_rank_meets_is_printed_once_without_traceback(shards, tmp_path, preloaded):  # noqa: F811
    # keys up to 63 and a buffer of 8 ids: the loss raises on the first step, on both ranks (started from the
    # preloaded python: what is tested is what the ranks and the launcher print, not how they start)
    flags = _flags(shards, tmp_path / "logs", "o", "--loss", "decl", "--decl-num-samples", "8")
    proc, _ = _launch(
        [
            "-m",
            "clip_dcl.train.torchrun",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "clip_dcl.train",
            "--",
            *flags,
        ],
        python=preloaded.python,
    )
    rc, err, _ = _finish(proc, timeout=LAUNCH_BOUND_S)
    assert rc == 1, err[-3000:]
    assert err.count("is outside [0, num_samples=8)") == 1, err[-3000:]
    last = _last_line(err)
    assert last.startswith("clip-dcl train: error: sample id ") and "(rank " in last, err[-3000:]
    assert "Traceback" not in err, err[-3000:]


# -- startup: no exception from a handler -------------------------------------------------------------------------
_SWALLOWING = """\
import os, signal, sys, time
from clip_dcl.train.signals import StartupGuard
StartupGuard(at_once=True).install()
try:  # as torch's C++ does around its import of NumPy: an exception raised in here would be lost
    os.kill(os.getpid(), signal.SIG{sig})
    time.sleep(5)
except BaseException:
    pass
print("went on after the signal", file=sys.stderr)
"""


@pytest.mark.parametrize("sig,code", [("TERM", 75), ("INT", 130)])
def test_startup_the_command_leaves_from_the_handler_whatever_catches_exceptions_around_it(sig, code):
    proc = subprocess.run(
        [sys.executable, "-c", _SWALLOWING.format(sig=sig)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=LAUNCH_BOUND_S,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.returncode == code, proc.stderr
    what = "stopped on SIGTERM" if sig == "TERM" else "interrupted (Ctrl-C)"
    assert proc.stderr.strip() == (
        f"clip-dcl train: {what} during start-up, before the first training step: "
        f"nothing was trained since the last checkpoint; exit code {code}"
    )


def _catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (``SigCgt`` of ``/proc/PID/status``)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(mask >> (int(sig) - 1) & 1)


@pytest.mark.parametrize(
    "sig,code,name",
    [(signal.SIGTERM, 75, "SIGTERM"), (signal.SIGINT, 130, "SIGINT (Ctrl-C)")],
    ids=["SIGTERM", "SIGINT"],
)
def test_startup_the_launcher_stopped_before_it_starts_a_rank_says_so_in_one_line(tmp_path, sig, code, name):
    proc, _ = _launch(
        [
            "-m",
            "clip_dcl.train.torchrun",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "clip_dcl.train",
            "--",
            "--model",
            "clip-dcl-tiny",
            "--dataset-type",
            "synthetic",
            "--device",
            "cpu",
            "--logs",
            str(tmp_path / "logs"),
        ]
    )
    deadline = time.monotonic() + 30
    # its first lines ran (SIGTERM is caught: Python catches SIGINT from its own start), torch is not imported yet
    while not _catches(proc.pid, signal.SIGTERM) and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(proc.pid, sig)
    rc, err, _ = _finish(proc, timeout=LAUNCH_BOUND_S)
    assert rc == code, err[-3000:]
    assert err.strip() == (
        f"clip-dcl train: the launcher stopped on {name} before it started any rank: nothing "
        f"was trained; exit code {code}"
    ), err[-3000:]
    assert not (tmp_path / "logs").exists()


_CTRL_C_AS_RANKS_START = """\
import os, signal, subprocess, sys
if "clip_dcl.train.torchrun" in sys.orig_argv:  # the launcher only, not its ranks
    _init = subprocess.Popen.__init__

    def __init__(self, *args, **kwargs):
        _init(self, *args, **kwargs)
        if "clip_dcl.train" not in map(str, kwargs.get("args", args[0] if args else ())):
            return  # not a rank (torch's import runs ldconfig)
        with open(os.environ["RANK_PIDS"], "a") as f:
            f.write(f"{self.pid}\\n")
        if not getattr(subprocess, "_sent", False):  # Ctrl-C right after the first rank started
            subprocess._sent = True
            os.kill(os.getpid(), signal.SIGINT)

    subprocess.Popen.__init__ = __init__
"""


@pytest.mark.slow
def test_startup_ctrl_c_while_the_launcher_starts_the_ranks_leaves_no_rank_running(tmp_path):
    # torchrun records its ranks once all have started: a Ctrl-C raised between a rank's start and that record left
    # the rank running alone after the launcher exited (waiting at the rendezvous)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_CTRL_C_AS_RANKS_START)
    pids = tmp_path / "pids"
    env = _env(RANK_PIDS=str(pids))
    env["PYTHONPATH"] = os.pathsep.join([str(hook), env["PYTHONPATH"]])
    proc, _ = _launch(
        [
            "-m",
            "clip_dcl.train.torchrun",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "clip_dcl.train",
            "--",
            "--model",
            "clip-dcl-tiny",
            "--dataset-type",
            "synthetic",
            "--train-num-samples",
            "16",
            "--batch-size",
            "8",
            "--device",
            "cpu",
            "--report-to",
            "",
            "--logs",
            str(tmp_path / "logs"),
            "--name",
            "c",
        ],
        env=env,
    )
    deadline = time.monotonic() + LAUNCH_BOUND_S
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    started = [int(p) for p in pids.read_text().split()] if pids.exists() else []
    deadline = time.monotonic() + 30  # after the launcher: a rank left running holds its stderr open
    while any(not _ended(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [p for p in started if not _ended(p)]
    for p in alive:
        _kill(p)
    rc, err, _ = _finish(proc, timeout=60)
    assert len(started) == 2 and not alive, f"ranks left running: {alive}\n{err[-3000:]}"
    assert rc == 130, err[-3000:]
    assert _last_line(err).startswith("clip-dcl train: torchrun stopped on SIGINT (Ctrl-C)"), err[-3000:]
    assert "Traceback" not in err, err[-3000:]
