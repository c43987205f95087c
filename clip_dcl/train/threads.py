"""The trainer's own threads, none of them alive while the process forks.

A lock another thread held at a fork stays held in the child for good (a data-loader worker stuck right after
its fork, and the ranks waiting on it): :class:`ForkSafeThread` stops and joins its loop before every fork
(well under a millisecond) and starts it again in the parent. ``spawn`` workers would avoid it too, at the cost
of importing torch, OpenCLIP and the pipeline again in every worker and of pickling OpenCLIP's datasets.
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
    """A daemon thread running ``loop(stopping)`` until :meth:`stop`, and never across a fork; ``loop`` returns soon
    after ``stopping`` is set and keeps its state outside itself; ``wake`` wakes a loop that waits elsewhere."""

    def __init__(self, name: str, loop: Callable[[threading.Event], None], wake: Optional[Callable[[], None]] = None):
        self.name, self.loop, self.wake = name, loop, wake
        self._thread: Optional[threading.Thread] = None
        self._stopping: Optional[threading.Event] = None

    def start(self) -> "ForkSafeThread":
        with _LOCK:
            _RUNNING.add(self)
            self._start()
        return self

    def stop(self) -> None:
        """Stop the loop for good and wait for it (at most `JOIN_S` seconds)."""
        with _LOCK:
            _RUNNING.discard(self)
            self._halt()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _start(self) -> None:
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self.loop, args=(self._stopping,), daemon=True, name=self.name)
        self._thread.start()

    def _halt(self) -> None:
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
            thread.join(JOIN_S)


def _before_fork() -> None:
    _LOCK.acquire()
    for thread in list(_RUNNING):
        thread._halt()


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
