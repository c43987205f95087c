"""Child process groups and a command's stop signals, in one place.

A child (a training, a study's run, a data writer, a benchmark's launch) runs as the leader of a process group
of its own, so that a signal passed to the group reaches everything it started and a Ctrl-C at the terminal
reaches this process only, which decides what to pass on. A stopped group gets :data:`STOP_GRACE_S` to save and
exit before it is killed. Outside the trainer (``clip_dcl/train``), this is the one module that starts a child
(``subprocess.Popen``), signals a group (``os.killpg``) or installs a signal handler (``signal.signal``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from typing import Callable, List, Optional, Sequence

#: Seconds a stopped child group gets to save and exit before it is killed.
STOP_GRACE_S = 90.0
#: The signals that stop a command: a scheduler's SIGTERM and a user's Ctrl-C.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(Exception):
    """A stop signal (``signame``) raised in the main thread, as Ctrl-C raises KeyboardInterrupt."""

    def __init__(self, signame: str = "SIGTERM"):
        super().__init__(signame)
        self.signame = signame


def said(signame: str) -> str:
    """How a stop signal is named to the user: ``Ctrl-C`` for SIGINT, else its name."""
    return "Ctrl-C" if signame == "SIGINT" else signame


def _default_sigint() -> None:
    # a child started from a background job inherits SIGINT ignored, and Python then installs no Ctrl-C handler
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_group(argv: Sequence[str], *, default_sigint: bool = False, **popen) -> subprocess.Popen:
    """Start ``argv`` as the leader of a new process group (``popen``: `subprocess.Popen`'s other arguments);
    ``default_sigint``: the child starts with SIGINT at its default, as at a terminal."""
    if default_sigint:
        popen["preexec_fn"] = _default_sigint
    return subprocess.Popen(list(argv), start_new_session=True, **popen)


def run_group(argv: Sequence[str], **popen) -> int:
    """Run ``argv`` as a group of its own and return its exit code; a stop of this process meanwhile
    (`Stopped`, KeyboardInterrupt) is passed on to the group, waited for (:func:`stop_group`) and raised on."""
    proc = start_group(argv, **popen)
    try:
        return wait(proc)
    except (Stopped, KeyboardInterrupt) as e:
        stop_group(proc, signal.SIGTERM if isinstance(e, Stopped) else signal.SIGINT)
        raise


def wait(proc: subprocess.Popen) -> int:
    """The exit code of ``proc``, waited for in short steps so that a signal's handler runs between them."""
    while True:
        try:
            return proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            continue


def signal_group(pgid: int, signum: int) -> None:
    """Send ``signum`` to the process group ``pgid``; a group already gone (or not ours) is no error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is still running (a zombie, which nobody may reap here, is not)."""
    try:
        entries = os.listdir("/proc")
    except OSError:  # no /proc: ask the kernel, which counts zombies too
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def stop_group(proc: subprocess.Popen, signum: int, lines: Optional[List[str]] = None) -> int:
    """Pass ``signum`` to the group of ``proc`` (a session leader), read what it still prints while it saves
    (into ``lines``), and return its exit code; the group is killed :data:`STOP_GRACE_S` after the signal. A
    Ctrl-C meanwhile is passed on too (the trainer's second Ctrl-C stops it at once, without saving)."""
    signal_group(proc.pid, signum)
    timer = threading.Timer(STOP_GRACE_S, signal_group, args=(proc.pid, signal.SIGKILL))
    timer.daemon = True
    timer.start()
    try:
        while True:
            try:
                if proc.stdout is not None and not proc.stdout.closed:
                    for line in proc.stdout:
                        if lines is not None:
                            lines.append(line.rstrip())
                return proc.wait()
            except KeyboardInterrupt:
                signal_group(proc.pid, signal.SIGINT)
    finally:
        timer.cancel()


def reap_group(proc: subprocess.Popen, stopped_at: Callable[[], Optional[float]]) -> int:
    """The exit code of ``proc``; once stopped (``stopped_at()``: the monotonic time of the stop, else None),
    also wait for the rest of its group (a child the leader left behind), killing the group
    :data:`STOP_GRACE_S` after the stop."""

    def overdue():
        at = stopped_at()
        if at is not None and time.monotonic() - at > STOP_GRACE_S:
            signal_group(proc.pid, signal.SIGKILL)

    while True:
        try:
            code = proc.wait(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            overdue()
    while stopped_at() is not None and group_alive(proc.pid):
        overdue()
        time.sleep(0.2)
    return code


@contextmanager
def on_stop_signals(handler: Callable[[int, object], None]):
    """Inside (from the main thread only; elsewhere nothing is installed), ``handler(signum, frame)`` handles
    SIGTERM and SIGINT; the handlers before are restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {num: signal.signal(num, handler) for num in STOP_SIGNALS}
    try:
        yield
    finally:
        for num, previous in before.items():
            signal.signal(num, previous)


def _raise_stop(signum, frame):
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Stopped(signal.Signals(signum).name)


@contextmanager
def stop_on_signals():
    """Inside (from the main thread only), SIGTERM raises `Stopped` and SIGINT KeyboardInterrupt, even where
    SIGINT was ignored at start (a shell's background job); the handlers before are restored after."""
    with on_stop_signals(_raise_stop):
        yield
