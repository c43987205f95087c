"""The trainer's own threads, none of them alive while the process forks.

Beside its main thread the trainer runs two of its own: the reader of the start-up's wakeup pipe
(:class:`clip_dcl.train.preempt.StopSignals`) and the heartbeat of the run folder's lock
(:class:`clip_dcl.train.runfolder.RunLock`). OpenCLIP's data loaders fork their workers (PyTorch's
default on Linux) while both run. A forked child holds only the thread that forked; a lock another
thread held at that moment (the interpreter's, the C library's, a file object's) stays held in the
child for good, and the child's first use of it waits on a futex forever: a data-loader worker stuck
right after its fork, and the ranks waiting on it in a collective.

Of the two ways out, data-loader workers started with ``spawn`` or ``forkserver`` (which inherit no
thread) or no thread of ours alive when the process forks, this module takes the second:
:class:`ForkSafeThread` runs a loop that an :func:`os.register_at_fork` hook stops and joins before
every fork of the process (each loop waits only on its own event, or a pipe the hook writes to, so
this takes well under a millisecond) and starts again in the parent after it; the child starts none.
``spawn`` or ``forkserver`` workers would import torch, OpenCLIP and the data pipeline again in every
worker (seconds each, on every epoch without ``--persistent-workers``), need OpenCLIP's datasets and
transforms to pickle, and change how each of OpenCLIP's loaders runs; stopping two threads of ours
changes nothing else.
"""

from __future__ import annotations

import os
import threading
from typing import Callable, Optional

#: The threads started and not stopped for good: stopped before a fork, started again after it (in the parent).
_RUNNING: set = set()
#: Reentrant: a stop signal's handler may stop a thread (leaving, the run lock's release) while its own thread is
#: in the fork hook that holds it.
_LOCK = threading.RLock()
#: Seconds a fork waits for one thread to stop (a heartbeat in a slow ``utime`` on a network file system).
JOIN_S = 5.0


class ForkSafeThread:
    """A daemon thread running ``loop(stopping)`` until :meth:`stop`, and never across a fork (see the module doc).

    ``loop`` must return soon after the :class:`threading.Event` ``stopping`` is set, and keep what it must not
    lose across a restart outside itself; ``wake`` (optional) is called after setting it, to wake a loop that
    waits elsewhere (a pipe's read)."""

    def __init__(self, name: str, loop: Callable[[threading.Event], None], wake: Optional[Callable[[], None]] = None):
        self.name, self.loop, self.wake = name, loop, wake
        self._thread: Optional[threading.Thread] = None
        self._stopping: Optional[threading.Event] = None

    def start(self) -> "ForkSafeThread":
        with _LOCK:
            _RUNNING.add(self)
            self._start()
        return self

    def stop(self, timeout: float = JOIN_S) -> None:
        """Stop the loop for good and wait for it (at most ``timeout`` seconds)."""
        with _LOCK:
            _RUNNING.discard(self)
            self._halt(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _start(self) -> None:
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self.loop, args=(self._stopping,), daemon=True, name=self.name)
        self._thread.start()

    def _halt(self, timeout: float) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stopping.set()
        if self.wake is not None:
            try:
                self.wake()
            except OSError:
                pass
        if thread is not threading.current_thread():
            thread.join(timeout)


def running() -> list:
    """The names of this process's fork-safe threads that are alive now."""
    return [t.name for t in _RUNNING if t.alive]


def _before_fork() -> None:
    _LOCK.acquire()
    for thread in list(_RUNNING):
        thread._halt(JOIN_S)


def _after_fork_in_parent() -> None:
    try:
        for thread in list(_RUNNING):
            thread._start()
    finally:
        _LOCK.release()


def _after_fork_in_child() -> None:
    global _LOCK
    _RUNNING.clear()  # the parent's: none runs here
    _LOCK = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
