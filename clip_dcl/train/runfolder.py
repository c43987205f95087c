"""One run per run folder (``--logs/--name``), and which command may start in a folder that holds a run.

The master holds :class:`RunLock` (``run.lock``, a ``flock`` the kernel releases however its holder dies)
while the run lasts, so that a requeued job cannot train beside its live predecessor. ``flock`` does not
reach other hosts on every shared file system and names no holder, so the holder's record in the file
(pid, host, start time) is checked too, and a thread refreshes its modification time (a plain one: it waits on
its own event and calls ``utime``, nothing a data-loader worker forked meanwhile could need). :func:`folder_problem`
replaces OpenCLIP's "Experiment already exists" check, which also refused ``--resume PATH`` of the folder.
"""

from __future__ import annotations

import errno
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

import filelock

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


def holder_gone(holder: dict, mtime: float) -> Optional[str]:
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
    age = time.time() - mtime
    if age > STALE_SECONDS:
        return f"its lock was last refreshed {age:.0f} s ago (its holder refreshes it every {HEARTBEAT_SECONDS:g} s)"
    return None


def _holder(raw: bytes) -> dict:
    """The holder a lock file's bytes name; empty while its holder writes them (or died doing so)."""
    try:
        holder = json.loads(raw)
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


class _Replaced(Exception):
    """The file locked is no longer the one at the lock's path (its holder removed it on release): try again."""


class RunLock:
    """The lock of one run folder (see the module docstring)."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.token = secrets.token_hex(8)
        self.held = False
        self._pid = os.getpid()
        self._lock = filelock.FileLock(self.path, mode=0o644, thread_local=False, on_acquired=self._claim)
        self._existed = False
        self._took: Optional[str] = None
        self._stopping = threading.Event()  # the heartbeat is told to end

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

    def _read(self) -> Tuple[dict, float]:
        """The holder the lock file names (empty when it names none) and its modification time."""
        try:
            return _holder(self.path.read_bytes()), self.path.stat().st_mtime
        except OSError:  # removed meanwhile
            return {}, time.time()

    def acquire(self) -> Optional[str]:
        """Hold the lock; return a line about the dead holder it took over from, if any (RunFolderBusy if it lives)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for attempt in range(10):
            self._existed, self._took = self.path.exists(), None
            try:
                self._lock.acquire(blocking=False)
            except filelock.Timeout:  # its kernel lock is held: a live process
                holder, mtime = self._read()
                if attempt == 9 or (holder and holder_gone(holder, mtime) is None):
                    raise RunFolderBusy(self._busy(holder)) from None
                time.sleep(0.1)  # it holds the lock and is writing its name into it now
                continue
            except _Replaced:
                continue
            except OSError as e:  # no flock on this file system: the record and its heartbeat are the whole lock
                if e.errno != errno.ENOSYS:
                    raise
                if not self._claim_unlocked():
                    continue
            self.held = True
            self._stopping = threading.Event()
            threading.Thread(target=self._heartbeat, daemon=True, name="clip-dcl-run-lock").start()
            return self._took
        raise RunFolderBusy(
            f"{self.folder}: could not take its lock {self.path} (other processes kept taking it); "
            "is another run starting there?"
        )

    def _claim_unlocked(self) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self._claim(fd)
            return True
        except _Replaced:
            return False
        finally:
            os.close(fd)

    def _claim(self, fd: int) -> None:
        """With the file ``fd`` locked: refuse a live holder it names, else write this holder's record into it."""
        st = os.fstat(fd)
        try:
            if not os.path.samestat(os.stat(self.path), st):
                raise _Replaced
        except FileNotFoundError:
            raise _Replaced from None
        raw = os.pread(fd, 1 << 16, 0)
        holder = _holder(raw)
        if holder:
            gone = holder_gone(holder, st.st_mtime)
        elif raw or self._existed:  # being written on a host the flock does not reach, or its writer died doing so
            gone = "its lock is empty" if time.time() - st.st_mtime > HEARTBEAT_SECONDS else None
        else:  # created just now by this acquire
            gone = ""
        if gone is None:
            raise RunFolderBusy(self._busy(holder))
        if gone:
            self._took = (
                f"Took over {self.path}: its holder (pid {holder.get('pid', '?')} on host "
                f"{holder.get('host', '?')}, started {_when(holder.get('started', st.st_mtime))}) is gone: {gone}."
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, self._mine(), 0)
        os.fsync(fd)

    def _busy(self, holder: dict) -> str:
        pid, host = holder.get("pid", "?"), holder.get("host", "?")
        since = f", running since {_when(holder['started'])}" if "started" in holder else ""
        return (
            f"{self.folder} is in use by another run: pid {pid} on host {host}{since} (its lock: {self.path}). "
            "Two runs in one folder would write the same checkpoints and log. Wait for it to end, or stop it "
            f"(kill -TERM {pid} on {host}: it saves its step and exits), then run this command again; or give "
            "another --name"
        )

    def _heartbeat(self) -> None:
        while not self._stopping.wait(HEARTBEAT_SECONDS):
            try:
                os.utime(self.path)
            except OSError:
                pass

    def release(self) -> None:
        """Stop refreshing the lock, remove it if it is still this holder's, and unlock it."""
        self._stopping.set()
        if not self.held or os.getpid() != self._pid:  # a forked child holds nothing
            return
        self.held = False
        try:  # removed while still locked: a process waiting on the file finds it unlinked and opens the next one
            if _holder(self.path.read_bytes()).get("token") == self.token:
                self.path.unlink()
        except OSError:
            pass
        finally:
            self._lock.release()


def _inside(path, folder) -> bool:
    try:
        return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder))
    except (OSError, ValueError):
        return False


def folder_problem(
    folder, log_path, resume, resume_latest: bool, name: str, epochs: Optional[int] = None
) -> Optional[str]:
    """Why this command may not run in ``folder`` whose log is ``log_path``, or None: a folder with a log is
    continued only by ``--resume latest`` or ``--resume`` of a checkpoint inside it (offered only while the
    command's ``epochs`` are not all trained there)."""
    if not log_path or not os.path.exists(log_path):
        return None
    if resume_latest or (resume and _inside(resume, folder)):
        return None
    new = f"give another --name (e.g. --name {_free_name(folder, name)}) or move {folder} away"
    newest = latest_checkpoint(os.path.join(folder, "checkpoints"), False)
    done = _position(newest) if newest else None
    if not resume and epochs is not None and done is not None and done[0] >= epochs and not done[1]:
        return (
            f"{folder} holds a finished run (all {done[0]} epochs, the last in {newest}): to start a new run, "
            f"{new}; to train it further, raise --epochs above {done[0]} and add --resume latest"
        )
    ways = f"to continue it, run the same command with --resume latest; to start a new run, {new}"
    if resume:
        return (
            f"{folder} already holds a run (its log: {log_path}), and --resume {resume} is a checkpoint of "
            f"another folder: continuing it here would mix two runs in one log and one checkpoint folder; to "
            f"continue {resume} in a folder of its own, give another --name (e.g. --name {_free_name(folder, name)}); "
            "to continue "
            f"the run of {folder}, give --resume latest"
        )
    return f"{folder} already holds a run (its log: {log_path}): {ways}"


def _free_name(folder, name: str) -> str:
    """``name-2``, ``name-3``, ...: the first run name beside ``folder`` that no folder has yet."""
    parent = os.path.dirname(os.fspath(folder))
    n = 2
    while os.path.exists(os.path.join(parent, f"{name}-{n}")):
        n += 1
    return f"{name}-{n}"


def claim(args, resume_latest: bool) -> Tuple[Optional[RunLock], Optional[str]]:
    """Every rank: the master locks the run folder and checks it (:func:`folder_problem`), and all ranks raise
    its RunFolderBusy / RunFolderTaken together (one broadcast). Returns the master's held lock (else None) and
    the line to log about a dead holder it took over from (or None)."""
    lock, problem, took = None, None, None
    if args.rank == 0 and args.logs and str(args.logs).lower() != "none":
        folder = os.path.join(args.logs, args.name)
        lock = RunLock(folder)
        try:
            took = lock.acquire()
            why = folder_problem(folder, args.log_path, args.resume, resume_latest, args.name, args.epochs)
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
    """The checkpoint ``--resume latest`` resumes in ``checkpoint_path``: OpenCLIP's last ``*.pt`` in natural order;
    with ``--save-most-recent`` (where OpenCLIP looks at ``epoch_latest.pt`` alone) the newest by the position
    it holds of ``epoch_latest.pt``, ``epoch_N.pt`` and ``epoch_E_step_K.pt``, ``epoch_latest.pt`` on a tie."""
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
