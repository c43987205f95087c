"""One run per run folder (``--logs/--name``), and which command may start in a folder that holds a run.

**The lock.** Two processes training in one folder both write its checkpoints and its ``out.log``; a
requeued job that starts while its predecessor is still alive does exactly that. The master rank
holds :class:`RunLock`, the file ``run.lock`` in the folder, from before its log is opened until the
run ends: it is created with ``O_CREAT | O_EXCL`` (atomic, also on NFS v3+) and names its holder
(pid, host, start time). A second process finds it and stops with :class:`RunFolderBusy`, naming the
holder. A lock whose holder is gone is taken over, with a line saying so: on the same host when its
pid no longer exists (or is another process now: its start time differs); on another host (a shared
file system) when its modification time, which a thread of the holder refreshes every
:data:`HEARTBEAT_SECONDS` (a :class:`clip_dcl.train.threads.ForkSafeThread`: stopped while the process
forks its data-loader workers), is older than :data:`STALE_SECONDS`. A taker first renames the lock aside,
which only one of several takers can do, then creates its own, so two takers never both hold it.

**The folder's run.** OpenCLIP refuses to start where ``out.log`` exists unless ``--resume latest``
("Experiment already exists. Use --name {} to specify a new experiment.", with the ``{}`` as
printed); so the hint our own messages give, ``--resume PATH`` of a checkpoint in that folder, was
refused too. :func:`folder_problem` is the check in its place (the patch of ``main`` makes OpenCLIP's
own see no ``out.log``): a folder that holds a run may be continued by ``--resume latest`` or by
``--resume`` of a checkpoint inside it; any other command is refused with the folder's name and the
ways on.
"""

from __future__ import annotations

import glob
import json
import os
import re
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Optional, Tuple

from .threads import ForkSafeThread

#: The lock's file name inside the run folder.
LOCK_NAME = "run.lock"
#: How often the holder refreshes the lock's modification time.
HEARTBEAT_SECONDS = 10.0
#: A lock of another host not refreshed for this long is taken to be a dead process's.
STALE_SECONDS = 120.0


class RunFolderBusy(RuntimeError):
    """Another process holds the run folder's lock: it is training there now."""


class RunFolderTaken(RuntimeError):
    """The run folder holds a run (its ``out.log``) that this command does not continue."""


def _process_start(pid: int) -> Optional[str]:
    """The start time of process ``pid`` in clock ticks since boot (``/proc/PID/stat``), or None where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def holder_gone(holder: dict, mtime: float, now: Optional[float] = None) -> Optional[str]:
    """Why the process that wrote the lock ``holder`` (modified at ``mtime``) is gone, or None while it may live."""
    if holder.get("host") == socket.gethostname():
        pid = int(holder.get("pid", -1))
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return f"no process {pid} on this host"
        except PermissionError:  # it exists, as another user's
            pass
        start = _process_start(pid)
        if holder.get("start") and start is not None and start != holder["start"]:
            return f"process {pid} on this host is another process now"
        return None
    age = (time.time() if now is None else now) - mtime
    if age > STALE_SECONDS:
        return f"its lock was last refreshed {age:.0f} s ago (its holder refreshes it every {HEARTBEAT_SECONDS:g} s)"
    return None


class RunLock:
    """The lock of one run folder (see the module docstring); :meth:`acquire`, then :meth:`release`."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.token = secrets.token_hex(8)
        self.held = False
        self._beat: Optional[ForkSafeThread] = None

    def _mine(self) -> bytes:
        return json.dumps(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": time.time(),
                "start": _process_start(os.getpid()),
                "token": self.token,
            }
        ).encode()

    def acquire(self) -> Optional[str]:
        """Hold the lock; return a line about the dead holder it took over from, if any.

        Raises:
            RunFolderBusy: a live process holds it (the message names it and how to proceed).
        """
        self.folder.mkdir(parents=True, exist_ok=True)
        took = None
        for _ in range(5):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                pass
            else:
                with os.fdopen(fd, "wb") as f:
                    f.write(self._mine())
                    f.flush()
                    os.fsync(f.fileno())
                self.held = True
                self._beat = ForkSafeThread("clip-dcl-run-lock", self._heartbeat).start()
                return took
            try:
                raw, mtime = self.path.read_bytes(), self.path.stat().st_mtime
            except FileNotFoundError:  # released meanwhile
                continue
            try:
                holder = json.loads(raw)
            except ValueError:  # its holder is writing it now, or died doing so
                holder = {}
            gone = (
                holder_gone(holder, mtime)
                if holder
                else ("its lock is empty" if time.time() - mtime > HEARTBEAT_SECONDS else None)
            )
            if gone is None:
                raise RunFolderBusy(self._busy(holder))
            if self._take_over(raw):
                took = (
                    f"Took over {self.path}: its holder (pid {holder.get('pid', '?')} on host "
                    f"{holder.get('host', '?')}, started {_when(holder.get('started', mtime))}) is gone: {gone}."
                )
        raise RunFolderBusy(
            f"{self.folder}: could not take its lock {self.path} (other processes kept taking it); "
            "is another run starting there?"
        )

    def _take_over(self, raw: bytes) -> bool:
        """Move the dead holder's lock (its bytes ``raw``) aside; False when another taker was first."""
        aside = self.path.with_name(f"{LOCK_NAME}.{os.getpid()}.{self.token}.dead")
        try:
            os.rename(self.path, aside)  # one taker wins; the others find no file
        except FileNotFoundError:
            return False
        try:
            if aside.read_bytes() != raw:  # another taker's fresh lock, not the dead one: put it back
                try:
                    os.link(aside, self.path)
                except FileExistsError:
                    pass
                return False
            return True
        finally:
            aside.unlink(missing_ok=True)

    def _busy(self, holder: dict) -> str:
        pid, host = holder.get("pid", "?"), holder.get("host", "?")
        since = f", running since {_when(holder['started'])}" if "started" in holder else ""
        return (
            f"{self.folder} is in use by another run: pid {pid} on host {host}{since} (its lock: {self.path}). "
            "Two runs in one folder would write the same checkpoints and log. Wait for it to end, or stop it "
            f"(kill -TERM {pid} on {host}: it saves its step and exits), then run this command again; or give "
            "another --name"
        )

    def _heartbeat(self, stopping: threading.Event) -> None:
        while not stopping.wait(HEARTBEAT_SECONDS):
            try:
                os.utime(self.path)
            except OSError:
                pass

    def release(self) -> None:
        """Stop refreshing the lock and remove it, if it is still this holder's."""
        if self._beat is not None:
            self._beat.stop()
            self._beat = None
        if not self.held:
            return
        self.held = False
        try:
            if json.loads(self.path.read_bytes()).get("token") == self.token:
                self.path.unlink()
        except (OSError, ValueError):
            pass


def _inside(path, folder) -> bool:
    try:
        return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder))
    except (OSError, ValueError):
        return False


def folder_problem(folder, log_path, resume, resume_latest: bool, name: str) -> Optional[str]:
    """Why this command may not run in ``folder`` (``--logs/--name``) whose log is ``log_path``, or None.

    A folder without a log is free; one with a log holds a run, which ``--resume latest`` or
    ``--resume`` of a checkpoint inside the folder continues; any other command is refused.
    """
    if not log_path or not os.path.exists(log_path):
        return None
    if resume_latest or (resume and _inside(resume, folder)):
        return None
    ways = (
        f"to continue it, run the same command with --resume latest; to start a new run, give another --name "
        f"(e.g. --name {name}-2) or move {folder} away"
    )
    if resume:
        return (
            f"{folder} already holds a run (its log: {log_path}), and --resume {resume} is a checkpoint of "
            f"another folder: continuing it here would mix two runs in one log and one checkpoint folder; to "
            f"continue {resume} in a folder of its own, give another --name (e.g. --name {name}-2); to continue "
            f"the run of {folder}, give --resume latest"
        )
    return f"{folder} already holds a run (its log: {log_path}): {ways}"


def claim(args, resume_latest: bool) -> Tuple[Optional[RunLock], Optional[str]]:
    """Every rank of ``args`` (OpenCLIP's, once main named the run): the master locks the run folder and checks
    that this command may run there (:func:`folder_problem`); all ranks learn the outcome (one broadcast), so
    that all stop together. Returns the master's held lock (None on the other ranks, or without ``--logs``)
    and the line to log about a dead holder it took over from (None when there was none).

    Raises:
        RunFolderBusy: another process trains in the folder.
        RunFolderTaken: the folder holds a run this command does not continue.
    """
    lock, problem, took = None, None, None
    if args.rank == 0 and args.logs and str(args.logs).lower() != "none":
        folder = os.path.join(args.logs, args.name)
        lock = RunLock(folder)
        try:
            took = lock.acquire()
            why = folder_problem(folder, args.log_path, args.resume, resume_latest, args.name)
            if why:
                lock.release()
                problem = RunFolderTaken(why)
        except RunFolderBusy as e:
            problem = e
    if getattr(args, "distributed", False) and getattr(args, "world_size", 1) > 1:
        from open_clip_train.distributed import broadcast_object

        problem = broadcast_object(args, problem)
    if problem is not None:
        raise problem
    return lock, took


#: A mid-epoch checkpoint's file name; ``epoch_N.pt`` is the checkpoint after N epochs.
_STEP_FILE = re.compile(r"epoch_(\d+)_step_(\d+)\.pt")
_EPOCH_FILE = re.compile(r"epoch_(\d+)\.pt")


def _position(path: str) -> Optional[tuple]:
    """``(epochs completed, steps into the next)`` of a checkpoint: from its name, or (``epoch_latest.pt``)
    from its ``epoch`` and mid-epoch position, read memory-mapped; None when it cannot be read."""
    name = os.path.basename(path)
    for pattern in (_STEP_FILE, _EPOCH_FILE):
        m = pattern.fullmatch(name)
        if m:
            return tuple(int(g) for g in m.groups()) + (0,) * (2 - len(m.groups()))
    from . import saving

    try:
        ckpt = saving.read_checkpoint(path, mmap=True)
        return int(ckpt["epoch"]), int((saving.resume_position(ckpt) or {}).get("step", 0))
    except (ValueError, KeyError, TypeError, AttributeError):  # torn, unsafe or foreign: not a candidate
        return None


def latest_checkpoint(checkpoint_path, save_most_recent: bool) -> Optional[str]:
    """The checkpoint ``--resume latest`` resumes in ``checkpoint_path``.

    Without ``--save-most-recent``, OpenCLIP's rule: the last ``*.pt`` under it in natural order
    (``epoch_E_step_K.pt`` after ``epoch_E.pt``). With it, OpenCLIP looks at ``epoch_latest.pt`` alone and
    starts from scratch where only ``epoch_N.pt`` exist (a run that saved without the flag before); here
    the newest of ``epoch_latest.pt``, ``epoch_N.pt`` and ``epoch_E_step_K.pt`` by the position it holds,
    ``epoch_latest.pt`` on a tie.
    """
    from open_clip_train.main import LATEST_CHECKPOINT_NAME, natural_key

    folder = os.fspath(checkpoint_path)
    if not save_most_recent:
        found = sorted(glob.glob(os.path.join(folder, "**", "*.pt"), recursive=True), key=natural_key)
        return found[-1] if found else None
    best, best_at = None, None
    for path in glob.glob(os.path.join(folder, "*.pt")):
        name = os.path.basename(path)
        if name != LATEST_CHECKPOINT_NAME and not (_STEP_FILE.fullmatch(name) or _EPOCH_FILE.fullmatch(name)):
            continue
        at = _position(path)
        if at is not None and (best_at is None or at > best_at or (at == best_at and name == LATEST_CHECKPOINT_NAME)):
            best, best_at = path, at
    return best
