"""One run per run folder: a second process in a folder where a run is training stops within seconds with one
line naming it; the lock of a process that died (on this host, or on another one of a shared file system) is
taken over with a line saying so; a folder that holds a run takes only a command that continues it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from test_reliability_exit import HELPER, _env, _finish, _flags, _launch, shards  # noqa: F401 (a fixture)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid  # gone (and, this soon, not reused)


def _write_lock(folder, **holder):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "run.lock"
    path.write_text(
        json.dumps({"pid": 1, "host": socket.gethostname(), "started": time.time(), "token": "x", **holder})
    )
    return path


# -- the lock ----------------------------------------------------------------------------------------------
def test_lock_a_second_holder_is_refused_with_the_first_ones_pid_and_host(tmp_path):
    from clip_dcl.train.runfolder import RunFolderBusy, RunLock

    first = RunLock(tmp_path / "run")
    assert first.acquire() is None and first.held
    second = RunLock(tmp_path / "run")
    with pytest.raises(
        RunFolderBusy,
        match=rf"is in use by another run: pid {os.getpid()} on host "
        rf"{socket.gethostname()}, running since .*kill -TERM {os.getpid()}",
    ):
        second.acquire()
    first.release()
    assert not (tmp_path / "run" / "run.lock").exists()
    assert second.acquire() is None  # free again
    second.release()


def test_lock_of_a_dead_process_on_this_host_is_taken_over(tmp_path):
    from clip_dcl.train.runfolder import RunLock

    pid = _dead_pid()
    _write_lock(tmp_path / "run", pid=pid)
    lock = RunLock(tmp_path / "run")
    took = lock.acquire()
    assert took.startswith(f"Took over {tmp_path / 'run' / 'run.lock'}: its holder (pid {pid} on host ")
    assert took.endswith(f"is gone: no process {pid} on this host.")
    assert json.loads((tmp_path / "run" / "run.lock").read_text())["pid"] == os.getpid()
    lock.release()


def test_lock_of_a_reused_pid_is_taken_over(tmp_path):
    from clip_dcl.train.runfolder import RunLock

    _write_lock(tmp_path / "run", pid=os.getpid(), start="1")  # this pid, but a process that started at tick 1
    lock = RunLock(tmp_path / "run")
    assert "is another process now" in lock.acquire()
    lock.release()


def test_lock_of_another_host_is_taken_over_only_when_its_heartbeat_stopped(tmp_path):
    from clip_dcl.train.runfolder import STALE_SECONDS, RunFolderBusy, RunLock

    path = _write_lock(tmp_path / "run", host="node-elsewhere", pid=4242)
    with pytest.raises(RunFolderBusy, match="pid 4242 on host node-elsewhere"):
        RunLock(tmp_path / "run").acquire()  # refreshed just now: alive
    old = time.time() - STALE_SECONDS - 60
    os.utime(path, (old, old))
    lock = RunLock(tmp_path / "run")
    took = lock.acquire()
    assert "(pid 4242 on host node-elsewhere" in took and "its lock was last refreshed" in took
    lock.release()


def test_lock_heartbeat_refreshes_it_and_release_leaves_anothers(tmp_path, monkeypatch):
    from clip_dcl.train import runfolder

    monkeypatch.setattr(runfolder, "HEARTBEAT_SECONDS", 0.05)
    lock = runfolder.RunLock(tmp_path / "run")
    lock.acquire()
    old = time.time() - 1000
    os.utime(lock.path, (old, old))
    deadline = time.monotonic() + 10
    while lock.path.stat().st_mtime < old + 500 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lock.path.stat().st_mtime > old + 500  # refreshed by the holder's thread
    lock.path.write_text(json.dumps({"pid": 1, "host": "x", "token": "someone else's"}))
    lock.release()
    assert lock.path.exists()  # not this holder's any more: left alone


def _holder_process(folder, fork_child: bool = False):
    """Another process holding the run lock of ``folder`` (and, with ``fork_child``, a forked child of it that
    outlives it, as a data-loader worker would); returns it once it holds."""
    code = (
        "import os, sys, time\n"
        "from clip_dcl.train.runfolder import RunLock\n"
        f"lock = RunLock({str(folder)!r}); lock.acquire()\n"
        f"if {fork_child} and os.fork() == 0:\n"
        "    lock.release(); time.sleep(60); os._exit(0)\n"
        "print('held', flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_lock_held_by_another_live_process_is_refused_even_if_its_record_names_a_dead_one(tmp_path):
    from clip_dcl.train.runfolder import RunFolderBusy, RunLock

    holder = _holder_process(tmp_path / "run")
    try:
        with pytest.raises(RunFolderBusy, match=f"pid {holder.pid} on host {socket.gethostname()}, running since"):
            RunLock(tmp_path / "run").acquire()
        # the kernel lock decides on this host, not the record: one naming a dead process does not free it
        _write_lock(tmp_path / "run", pid=_dead_pid())
        with pytest.raises(RunFolderBusy):
            RunLock(tmp_path / "run").acquire()
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()


@pytest.mark.parametrize("fork_child", [False, True])
def test_lock_of_a_holder_killed_with_sigkill_is_taken_over(tmp_path, fork_child):
    from clip_dcl.train.runfolder import RunLock

    holder = _holder_process(tmp_path / "run", fork_child)
    os.kill(holder.pid, signal.SIGKILL)  # its forked child (a data-loader worker) lives on, holding nothing
    holder.wait()
    try:
        assert json.loads((tmp_path / "run" / "run.lock").read_text())["pid"] == holder.pid  # left behind
        lock = RunLock(tmp_path / "run")
        took = lock.acquire()
        assert took is not None and took.endswith(f"is gone: no process {holder.pid} on this host.")
        lock.release()
        assert not (tmp_path / "run" / "run.lock").exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(holder.pid, signal.SIGKILL)


def test_lock_without_flock_on_the_file_system_is_its_record(tmp_path, monkeypatch):
    import errno

    import filelock._native._unix as unix

    from clip_dcl.train.runfolder import RunFolderBusy, RunLock

    def no_flock(fd):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(unix, "lock_fd_nonblocking", no_flock)
    first = RunLock(tmp_path / "run")
    assert first.acquire() is None
    with pytest.raises(RunFolderBusy, match=f"pid {os.getpid()} on host"):
        RunLock(tmp_path / "run").acquire()  # the record names a live process of this host
    first.release()
    assert not (tmp_path / "run" / "run.lock").exists()
    _write_lock(tmp_path / "run", host="node-elsewhere", pid=4242)
    with pytest.raises(RunFolderBusy, match="pid 4242 on host node-elsewhere"):
        RunLock(tmp_path / "run").acquire()
    pid = _dead_pid()
    _write_lock(tmp_path / "run", pid=pid)
    lock = RunLock(tmp_path / "run")
    assert lock.acquire().endswith(f"is gone: no process {pid} on this host.")
    lock.release()


# -- which command may run in a folder that holds a run ----------------------------------------------------
def test_folder_a_run_folder_takes_only_a_command_that_continues_it(tmp_path):
    from clip_dcl.train.runfolder import folder_problem

    folder = tmp_path / "logs" / "x"
    log = folder / "out.log"
    assert folder_problem(folder, log, None, False, "x") is None  # no run yet
    folder.mkdir(parents=True)
    log.write_text("a run\n")
    refused = folder_problem(folder, log, None, False, "x")
    assert refused == (
        f"{folder} already holds a run (its log: {log}): to continue it, run the same command with "
        f"--resume latest; to start a new run, give another --name (e.g. --name x-2) or move {folder} "
        "away"
    )
    assert "{}" not in refused
    assert folder_problem(folder, log, None, True, "x") is None  # --resume latest
    assert folder_problem(folder, log, str(folder / "checkpoints" / "epoch_1.pt"), False, "x") is None
    other = folder_problem(folder, log, str(tmp_path / "y" / "epoch_1.pt"), False, "x")
    assert "is a checkpoint of another folder" in other and "--name x-2" in other


def test_latest_checkpoint_under_save_most_recent_is_the_newest_of_latest_and_numbered(tmp_path):
    import torch

    from clip_dcl.train.runfolder import latest_checkpoint

    for name in ("epoch_1.pt", "epoch_3.pt", "epoch_2_step_5.pt"):
        (tmp_path / name).write_bytes(b"named: read by name, not opened")
    assert latest_checkpoint(tmp_path, True) == str(tmp_path / "epoch_3.pt")  # no epoch_latest.pt: OpenCLIP's None
    torch.save({"epoch": 2}, tmp_path / "epoch_latest.pt")
    assert latest_checkpoint(tmp_path, True) == str(tmp_path / "epoch_3.pt")  # epoch_latest.pt is older
    torch.save({"epoch": 3, "clip_dcl": {"resume": {"step": 4}}}, tmp_path / "epoch_latest.pt")
    assert latest_checkpoint(tmp_path, True) == str(tmp_path / "epoch_latest.pt")  # 4 steps further
    torch.save({"epoch": 3}, tmp_path / "epoch_latest.pt")
    assert latest_checkpoint(tmp_path, True) == str(tmp_path / "epoch_latest.pt")  # a tie: OpenCLIP's file
    (tmp_path / "epoch_latest.pt").write_bytes(b"torn")
    assert latest_checkpoint(tmp_path, True) == str(tmp_path / "epoch_3.pt")
    assert latest_checkpoint(tmp_path, False) == str(tmp_path / "epoch_latest.pt")  # OpenCLIP's natural order


# -- end to end: two processes --------------------------------------------------------------------------------
def _run_flags(shards, logs, *extra):  # noqa: F811
    """2 epochs of 4 steps, dcl, --resume latest (the requeued job's command)."""
    return _flags(shards, logs, "x", "--loss", "dcl", "--resume", "latest", "--train-num-samples", "32", *extra)


def _held_run(shards, logs, release):  # noqa: F811
    """A run held after its 2nd step until ``release`` exists; returns it once it holds."""
    proc, _ = _launch([HELPER, *_run_flags(shards, logs)], env=_env(PAUSE_AT_STEP="2", PAUSE_FILE=str(release)))
    deadline = time.monotonic() + 90
    while not os.path.exists(f"{release}.paused"):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    return proc


@pytest.mark.slow
def test_two_processes_the_second_stops_at_once_naming_the_first(shards, tmp_path, preloaded):  # noqa: F811
    logs, release = tmp_path / "logs", tmp_path / "release"
    first = _held_run(shards, logs, release)
    try:
        # the requeued job's case: the same command, --resume latest, while the first still trains (the second and
        # the third start from the preloaded python; the first, whose pid the refusal names, from this one)
        second, _ = _launch(["-m", "clip_dcl.train", *_run_flags(shards, logs)], python=preloaded.python)
        rc, err, took = _finish(second, timeout=60)
        assert rc == 1, err[-3000:]
        lines = err.strip().splitlines()
        assert lines[-1].startswith(
            f"clip-dcl train: error: {logs / 'x'} is in use by another run: pid {first.pid} on "
            f"host {socket.gethostname()}"
        ), err[-3000:]
        assert "Traceback" not in err
        assert (logs / "x" / "run.lock").exists()  # the first one's, untouched
        log = (logs / "x" / "out.log").read_text()
        assert log.count("Running with a single process") == 1  # the second one wrote nothing into its log
    finally:
        release.touch()
    rc, err, _ = _finish(first)
    assert rc == 0, err[-3000:]
    assert not (logs / "x" / "run.lock").exists()
    # "wait for it to end, then run this command again": the same command now continues the run
    again, _ = _launch(["-m", "clip_dcl.train", *_run_flags(shards, logs)], python=preloaded.python)
    rc, err, _ = _finish(again)
    assert rc == 0, err[-3000:]
    assert f"=> resuming checkpoint '{logs / 'x' / 'checkpoints' / 'epoch_2.pt'}' (epoch 2)" in err


@pytest.mark.slow
def test_two_processes_a_killed_holders_lock_is_taken_over_with_a_line(shards, tmp_path):  # noqa: F811
    logs, release = tmp_path / "logs", tmp_path / "release"
    first = _held_run(shards, logs, release)
    os.killpg(first.pid, signal.SIGKILL)  # the run and its worker, as a lost node: the lock stays behind
    first.communicate()
    assert (logs / "x" / "run.lock").exists()
    second, _ = _launch(["-m", "clip_dcl.train", *_run_flags(shards, logs)])
    rc, err, _ = _finish(second)
    assert rc == 0, err[-3000:]
    assert f"Took over {logs / 'x' / 'run.lock'}: its holder (pid {first.pid} on host" in err
    assert f"is gone: no process {first.pid} on this host." in err
    assert not (logs / "x" / "run.lock").exists()
