"""The one module of the trainer that installs signal handlers, and a run's stop at a step boundary.

Handlers from the command's first seconds (:class:`StartupGuard`) through training (:class:`StopSignals`) to its
exit (:func:`ignore_stop_signals`), in its data-loader workers (:func:`worker_ignores_stop_signals`) and in the
ranks that torchrun starts (:func:`ranks_start_with_stop_signals_blocked`). During training a signal is a flag: at
every ``--preempt-check-every``-th step boundary :class:`StepGate` decides by one all-reduce whether to stop, save
or end a diverged run, so that every rank takes the same decision at the same step; each rank's RNG state is saved
with a mid-epoch checkpoint (:func:`rng_state`), so that dropout and ``--workers 0`` augmentation continue as if
the run had not stopped. Before the first step a signal ends the start-up at once; a rank waiting at the
rendezvous sits in a C++ call where no Python handler runs, so a wakeup pipe's reader thread ends the process
:data:`STARTUP_GRACE_S` later. Imports nothing heavy at the top (torch and NumPy inside the functions that use
them): the launcher and the command line install their handlers before torch is imported.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from .exits import StartupStop, leave_now

#: Signals that stop a run, by default.
DEFAULT_SIGNALS = ("SIGTERM", "SIGUSR1")
#: The signals this process stops on, which its data-loader workers (forked after) take from it alone.
_STOP_SIGNALS: List[signal.Signals] = []


def worker_ignores_stop_signals(worker_id: Optional[int] = None) -> None:
    """``worker_init_fn`` of the training data loaders: a stop signal ends the worker only when its parent sends it
    (a scheduler's would fail the run mid-step, but the parent's SIGTERM on its way out must end it), told apart
    by ``sigwaitinfo`` in a daemon thread. Ctrl-C is ignored: the parent decides."""
    if isinstance(getattr(signal.getsignal(signal.SIGINT), "__self__", None), StopSignals):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not _STOP_SIGNALS or not hasattr(signal, "sigwaitinfo"):  # not POSIX: ignore them, as before
        for num in _STOP_SIGNALS:
            signal.signal(num, signal.SIG_IGN)
        return
    numbers = set(_STOP_SIGNALS)
    # blocked in this (the worker's only) thread before any other starts: every thread inherits the mask
    signal.pthread_sigmask(signal.SIG_BLOCK, numbers)
    parent = os.getppid()
    threading.Thread(
        target=_exit_on_parents_signal, args=(numbers, parent), daemon=True, name="clip-dcl-stop-signals"
    ).start()


@contextlib.contextmanager
def workers_born_blocked():
    """Around the start of a data loader's workers (``iter(loader)``): the stop signals blocked in this thread, so the
    workers forked meanwhile are born with them blocked. Else one sent to the whole process group (torchrun stops its
    ranks with ``killpg``) in the moments before a worker's ``worker_init_fn`` meets the SIGTERM handler torch's
    worker loop sets first, which ends a worker on a signal not from its parent and fails the rank's step; blocked,
    it waits for :func:`worker_ignores_stop_signals`. This process receives its own when the block ends."""
    if not _STOP_SIGNALS or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, set(_STOP_SIGNALS))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _exit_on_parents_signal(numbers, parent: int) -> None:
    while True:
        info = signal.sigwaitinfo(numbers)
        if info.si_pid == parent or os.getppid() != parent:
            os._exit(128 + info.si_signo)  # as the signal's default action would end it


def chain_worker_init(fn):
    """A ``worker_init_fn`` that runs :func:`worker_ignores_stop_signals`, then ``fn`` (if any)."""
    if fn is None:
        return worker_ignores_stop_signals
    return _Chained(fn)


def quiet_workers(loader) -> None:
    """Give ``loader``'s workers :func:`worker_ignores_stop_signals` (once), for loaders built by OpenCLIP
    (validation, zero-shot): its validation workers live on between evaluations, and a signal sent to the
    whole job would end them and fail the run's next step."""
    from torch.utils.data import DataLoader

    for stage in getattr(loader, "pipeline", [loader]):  # webdataset's WebLoader holds its DataLoader first
        if isinstance(stage, DataLoader) and stage.num_workers > 0:
            fn = stage.worker_init_fn
            if fn is not worker_ignores_stop_signals and not isinstance(fn, _Chained):
                stage.worker_init_fn = chain_worker_init(fn)


class _Chained:
    def __init__(self, fn):
        self.fn = fn

    def __call__(self, worker_id):
        worker_ignores_stop_signals(worker_id)
        self.fn(worker_id)


#: Seconds the wakeup pipe's reader gives the main thread to leave after a stop signal during start-up, before
#: it ends the process itself (the main thread is then stuck in a C++ call: the rendezvous, a long load).
STARTUP_GRACE_S = 2.5


def signal_number(name: str) -> signal.Signals:
    """``"SIGTERM"``, ``"TERM"`` or ``"15"`` -> ``signal.SIGTERM``; ``ValueError`` naming an unknown one."""
    text = str(name).strip().upper()
    if text.isdigit():
        try:
            return signal.Signals(int(text))
        except ValueError:
            raise ValueError(f"no signal number {text}") from None
    if not text.startswith("SIG"):
        text = "SIG" + text
    if text in ("SIGKILL", "SIGSTOP"):
        raise ValueError(f"{text} cannot be caught")
    try:
        return signal.Signals[text]
    except KeyError:
        raise ValueError(f"unknown signal {name!r} (e.g. SIGTERM, SIGUSR1, USR2)") from None


class StopSignals:
    """Handlers that record the first of ``signals`` received. Until :meth:`training_started` any of them stops the
    start-up (at once with ``at_once``, else at :meth:`check_startup`). With ``ctrl_c``, the first Ctrl-C while
    :attr:`armed` is recorded like a stop signal; any other raises ``KeyboardInterrupt``."""

    def __init__(self, signals: Sequence[str], ctrl_c: bool = False, at_once: bool = False):
        self.numbers = [signal_number(s) for s in signals]
        if ctrl_c and signal.SIGINT not in self.numbers:
            self.numbers.append(signal.SIGINT)
        self.at_once = at_once
        self.received: Optional[str] = None
        self.armed = False
        self.started = False  # the first step boundary was reached: signals wait for a step to save at
        self.startup_stop: Optional[str] = None  # the signal that ended the start-up
        self.on_forced_exit = None  # called before a stop during start-up ends the process (leave_now)
        self._saved: Dict[int, object] = {}
        self._pipe: Optional[tuple] = None
        self._reader: Optional[threading.Thread] = None
        self._stopping = threading.Event()  # the reader is told to end
        self._pid = os.getpid()

    def training_started(self) -> None:
        """From now on a stop signal is a flag, acted on at the next step boundary (with a save)."""
        self.started = True
        self._stop_reader()  # the rendezvous is over: no C++ wait left that a handler cannot leave

    def check_startup(self) -> None:
        """Raise :class:`StartupStop` if a stop signal came before the first step (a run called from Python)."""
        if not self.started and self.startup_stop is not None:
            raise StartupStop(self.startup_stop)

    def _handle(self, signum, frame):  # only sets the flag: the training loop acts on it
        name = signal.Signals(signum).name
        if not self.started:
            if os.getpid() != self._pid:  # a worker forked before its worker_init_fn
                as_forked_child(signum)
                return
            if self.startup_stop is None:
                self.startup_stop = name
            if self.at_once:
                leave_now(self.startup_stop, self.on_forced_exit)
            return
        if signum == signal.SIGINT:
            if self.received is not None or not self.armed:
                raise KeyboardInterrupt
            self.received = "SIGINT"
            logging.warning(
                "Ctrl-C: finishing the current step, then saving a checkpoint and stopping (Ctrl-C "
                "again stops at once, without saving)."
            )
            return
        if self.received is None:
            self.received = name
            logging.warning(
                f"Received {self.received}: finishing the current step, then saving a checkpoint and stopping."
            )

    def install(self) -> "StopSignals":
        for num in self.numbers:
            try:
                self._saved[num] = signal.signal(num, self._handle)
            except ValueError:  # not the main thread of the main interpreter: signals cannot be caught here
                logging.warning(f"cannot catch {num.name} outside the main thread; a preemption will not be saved")
        _STOP_SIGNALS[:] = [num for num in self._saved if num != signal.SIGINT]  # the workers ignore SIGINT
        if self._saved:
            self._watch_wakeup_pipe()
        return self

    def _watch_wakeup_pipe(self) -> None:
        """Have every caught signal written to a pipe, read by a thread that acts when the main thread cannot."""
        if not hasattr(signal, "set_wakeup_fd"):
            return
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except ValueError:  # not the main thread
            old = None
        if old != -1:  # not the main thread, or someone else's (an event loop), which stays
            if old is not None:
                signal.set_wakeup_fd(old)
            os.close(r)
            os.close(w)
            return
        self._pipe = (r, w)
        self._reader = threading.Thread(target=self._read_wakeup_pipe, daemon=True, name="clip-dcl-startup-signals")
        self._reader.start()

    def _stop_reader(self) -> None:
        if self._reader is None:
            return
        self._stopping.set()
        try:
            os.write(self._pipe[1], b"\0")  # not a signal's number: wakes the reader, which sees it is told to end
        except OSError:
            pass
        if self._reader is not threading.current_thread():
            self._reader.join(1.0)
        self._reader = None

    def _read_wakeup_pipe(self) -> None:
        """A plain thread, alive while the data-loader workers fork: it holds no lock a worker could need (it waits
        in ``os.read`` and on its own event), and a worker takes no thread of its parent along."""
        numbers, fd = {int(n) for n in self._saved}, self._pipe[0]
        while not self._stopping.is_set():
            try:
                data = os.read(fd, 64)
            except OSError:
                return
            hit = [b for b in data if b in numbers]
            if not hit or self.started:
                continue
            # the main thread leaves when it runs Python; if it has not within the grace, it is stuck in C++
            if self._stopping.wait(STARTUP_GRACE_S):
                return
            if not self.started or self.startup_stop is not None:  # else it came as training started: a flag
                leave_now(self.startup_stop or signal.Signals(hit[0]).name, self.on_forced_exit)

    def restore(self) -> None:
        if self._pipe is not None:
            signal.set_wakeup_fd(-1)  # none was set before (else it stays, and no pipe of ours was)
        self._stop_reader()
        if self._pipe is not None:
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None
        for num, old in self._saved.items():
            guard = getattr(old, "__self__", None)
            if isinstance(guard, StartupGuard):  # the guard of the command's first seconds: the run is over now
                guard.over = True
            signal.signal(num, old)
        self._saved = {}
        _STOP_SIGNALS[:] = []


class StartupGuard:
    """SIGTERM and Ctrl-C from the command's first seconds (imports, flags) until the run's own handlers take
    over (:class:`StopSignals`). With ``at_once`` (the command line) the handler leaves
    at once (:func:`leave_now`); else it records the signal, and :meth:`check` raises :class:`StartupStop`."""

    def __init__(self, at_once: bool):
        self.at_once = at_once
        self.signame: Optional[str] = None
        self.over = False  # the run's handlers gave the signals back: the run is over, this is no start-up stop
        self._pid = os.getpid()
        self._saved: dict = {}

    def install(self) -> "StartupGuard":
        if threading.current_thread() is threading.main_thread():
            for num in (signal.SIGTERM, signal.SIGINT):
                if signal.getsignal(num) in (signal.SIG_DFL, signal.default_int_handler):
                    self._saved[num] = signal.signal(num, self._handle)
        return self

    def unblock(self) -> None:
        """Unblock SIGTERM and SIGINT in this thread, which :mod:`clip_dcl.train.torchrun` starts a rank with blocked:
        one sent since is handled now, by the handlers just installed."""
        if hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread():
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})

    def _handle(self, signum, frame):
        if os.getpid() != self._pid:
            as_forked_child(signum)
            return
        if self.over:  # the command leaves with the run's own code; called from Python, as without the guard
            if self.at_once:
                return
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if self.signame is None:
            self.signame = signal.Signals(signum).name
        if self.at_once:
            leave_now(self.signame)

    def check(self) -> None:
        """Raise :class:`StartupStop` if a stop signal came."""
        if self.signame is not None:
            raise StartupStop(self.signame)

    def remove(self, keep=()) -> None:
        """Put back the handlers it replaced (those still its own), except for the signals in ``keep``."""
        for num in [n for n in self._saved if n not in keep]:
            old = self._saved.pop(num)
            if signal.getsignal(num) == self._handle:
                signal.signal(num, old)


def as_forked_child(signum: int) -> None:
    """A start-up handler run in a process forked from the one that installed it (a data-loader worker before its
    ``worker_init_fn``): Ctrl-C is its parent's to act on; another signal ends it, as the signal's default would."""
    if signum != signal.SIGINT:
        os._exit(128 + signum)


def ranks_start_with_stop_signals_blocked(stop_signals) -> None:
    """Start every rank with SIGTERM and SIGINT blocked until its handlers are in (:func:`clip_dcl.train.main`); a
    signal to the launcher while torchrun starts the ranks is recorded and sent again once all are recorded (else
    the ranks started before it would run on alone)."""
    from torch.distributed.elastic.multiprocessing.api import SubprocessContext

    start = SubprocessContext._start

    def _start(self):
        got = []
        saved = {num: signal.signal(num, lambda signum, frame: got.append(signum)) for num in stop_signals}
        old = signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)  # what the ranks start with
        try:
            return start(self)
        finally:
            try:
                for num, handler in saved.items():
                    signal.signal(num, handler)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
            if got:
                os.kill(os.getpid(), got[0])

    SubprocessContext._start = _start


def ignore_stop_signals() -> None:
    """SIGTERM and Ctrl-C ignored from here on: the run is over and the process leaves with its own exit code (a
    launcher's SIGTERM to a rank on its way out must not replace it)."""
    for num in (signal.SIGTERM, signal.SIGINT):
        signal.signal(num, signal.SIG_IGN)


def stopped_before_the_ranks(handler) -> None:
    """The launcher's handler for SIGTERM and Ctrl-C until torchrun takes the signals over (none of its own yet)."""
    for num in (signal.SIGINT, signal.SIGTERM):  # SIGTERM last: once it is caught, both are
        if signal.getsignal(num) in (signal.SIG_DFL, signal.default_int_handler):
            signal.signal(num, handler)


# -- the step boundary ----------------------------------------------------------------------------------------
@dataclass
class PreemptConfig:
    """``--preempt-signals``, ``--preempt-check-every``, ``--save-every-minutes``."""

    signals: List[str] = field(default_factory=lambda: list(DEFAULT_SIGNALS))
    check_every: int = 1
    save_every_minutes: Optional[float] = None


class Preempted(Exception):
    """The run stopped on a signal after saving its checkpoint at ``path`` (step ``step`` of ``epoch``)."""

    def __init__(self, signame: str, path: Optional[str], epoch: int, step: int):
        self.signame, self.path, self.epoch, self.step = signame, path, epoch, step
        where = f"saved {path}" if path else "no checkpoint written (no --logs)"
        super().__init__(f"stopped on {signame} after step {step} of epoch {epoch}; {where}")


class StepGate:
    """The decision taken at optimizer-step boundaries: ``(stop, save)``, the same on every rank."""

    def __init__(self, config: PreemptConfig, signals: Optional[StopSignals], world_size: int, rank: int, device):
        import torch

        self.config, self.signals = config, signals
        self.world_size, self.rank = world_size, rank
        self.device = torch.device(device)
        self.last_save = time.monotonic()
        self.signame: Optional[str] = None
        self.diverged = False  # agreed by the last poll: some rank's training diverged
        if world_size > 1 and not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            logging.warning(
                "several ranks without torch.distributed (--horovod): each rank decides alone when to "
                "stop on a signal, so the signal must reach every rank at the same step"
            )

    def _local(self) -> tuple:
        stop = self.signals is not None and self.signals.received is not None
        minutes = self.config.save_every_minutes
        save = bool(minutes) and self.rank == 0 and time.monotonic() - self.last_save >= minutes * 60
        return int(stop), int(save)

    def poll(self, boundary: int, diverged=None) -> tuple:
        """At the ``boundary``-th step boundary of an epoch: whether to stop, whether to save now. ``diverged()``
        (this rank's training diverged) is agreed on in the same all-reduce, into :attr:`diverged`."""
        import torch

        if boundary % max(1, self.config.check_every):
            return False, False
        stop, save = self._local()
        bad = int(bool(diverged())) if diverged is not None else 0
        if self.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            flags = torch.tensor([stop, save, bad], dtype=torch.int32, device=self.device)
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
            stop, save, bad = (int(v) for v in flags.tolist())
        self.diverged = bool(bad)
        if stop:
            self.signame = (
                self.signals.received if self.signals and self.signals.received else "a signal on another rank"
            )
        return bool(stop), bool(save)

    def saved(self) -> None:
        self.last_save = time.monotonic()


# -- the main process's random state ---------------------------------------------------------------
def rng_state() -> Dict[str, object]:
    """This process's Python, NumPy, torch (and CUDA) random state, in weights-only-loadable types."""
    import numpy as np
    import torch

    version, mt, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": [version, list(mt), gauss],
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, object]) -> None:
    import numpy as np
    import torch

    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


def gather_rng_states(world_size: int) -> List[Dict[str, object]]:
    """Every rank's :func:`rng_state`, in rank order (collective when distributed)."""
    import torch

    mine = rng_state()
    if world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        out: List[Optional[dict]] = [None] * world_size
        torch.distributed.all_gather_object(out, mine)
        return out
    return [mine]
