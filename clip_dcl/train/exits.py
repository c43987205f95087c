"""How a failed or stopped run leaves: its one line last, whatever its data-loader workers and saves were doing.

A failed run's loader workers are shut down first (:func:`stop_loader_workers`), else PyTorch's SIGCHLD handler
prints "DataLoader worker ... exited unexpectedly" after the error line. A stop before the first training step
ends the process at once: no handler raises, as during start-up a handler often runs inside Python that C++
called (torch's import of NumPy, ``torch.distributed``'s init), where an exception is swallowed or thrown through
the C++ (SIGABRT); the command line leaves with ``os._exit`` (:func:`leave_now`), a run called from Python
raises :class:`StartupStop` where only Python of ours runs.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import time
from typing import Optional

from ..exitcodes import INTERRUPTED as INTERRUPTED_EXIT_CODE  # noqa: F401 (the trainer's name for it)
from ..exitcodes import PREEMPTED as PREEMPTED_EXIT_CODE  # noqa: F401
from ..exitcodes import stop_exit_code
from ..paths import write_json

#: Set by :mod:`clip_dcl.train.torchrun` for its ranks: a rank's error line goes to torchrun's error file
#: (``TORCHELASTIC_ERROR_FILE``), and the launcher prints the first failed rank's line, once.
LAUNCHER_ENV = "CLIP_DCL_LAUNCHER"

#: The data loaders of this process's runs by id, whose workers :func:`stop_loader_workers` stops.
_WATCHED: dict = {}


def watch_loaders(loaders) -> None:
    """Remember ``loaders`` (DataLoaders, or webdataset's WebLoaders around one) until the run's workers stop."""
    _WATCHED.update((id(loader), loader) for loader in loaders)


def _kept_iterators(loader) -> list:
    """The iterator a DataLoader with persistent workers keeps between epochs (a WebLoader's inner one)."""
    from torch.utils.data import DataLoader

    if isinstance(loader, DataLoader):
        return [loader._iterator] if getattr(loader, "_iterator", None) is not None else []
    return [it for stage in getattr(loader, "pipeline", None) or [] for it in _kept_iterators(stage)]


def stop_loader_workers() -> int:
    """Shut down the worker processes of every multiprocessing data-loader iterator of this process;
    return how many iterators were shut down. Call it only when no loader will be read again."""
    import multiprocessing

    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    def stop(it) -> int:
        if not issubclass(type(it), _MultiProcessingDataLoaderIter) or getattr(it, "_shutdown", True):
            return 0
        try:
            it._shutdown_workers()  # PyTorch's own: tell, join, forget, and terminate a worker that hangs
        except Exception as e:  # noqa: BLE001 - the run has failed already; its line must stay the last
            logging.debug(f"shutting down a data loader's workers failed: {e!r}")
        return 1

    stopped = sum(stop(it) for loader in _WATCHED.values() for it in _kept_iterators(loader))
    _WATCHED.clear()
    if not multiprocessing.active_children():  # loader workers are multiprocessing's children: none is left
        return stopped
    # Workers of a loader nobody watched: found on the heap by ``type()`` (``isinstance`` would ask every object for
    # its ``__class__``, and some warn); a tenth of a second in a large process.
    return stopped + sum(stop(obj) for obj in gc.get_objects() if issubclass(type(obj), _MultiProcessingDataLoaderIter))


# -- a stop before the first training step ------------------------------------------------------------------
class StartupStop(KeyboardInterrupt):
    """A stop signal or Ctrl-C before the run's first training step; a ``KeyboardInterrupt`` so that what cleans up
    after an interruption does so, and no ``except Exception`` takes it for an error to handle."""

    def __init__(self, signame: str):
        self.signame = signame
        super().__init__(signame)

    @property
    def exit_code(self) -> int:
        return stop_exit_code(self.signame)


def launched_rank() -> Optional[str]:
    """This process's rank when a launcher started several (``RANK`` of ``WORLD_SIZE`` > 1), else None."""
    try:
        several = int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        several = False
    return os.environ.get("RANK") if several else None


def startup_stop_line(signame: str, rank: Optional[object] = None) -> str:
    """The one line of a process stopped by ``signame`` before its first training step."""
    what = "interrupted (Ctrl-C)" if signame == "SIGINT" else f"stopped on {signame}"
    who = f" (rank {rank})" if rank is not None else ""
    code = stop_exit_code(signame)
    return (
        f"clip-dcl train: {what}{who} during start-up, before the first training step: nothing was trained "
        f"since the last checkpoint; exit code {code}"
    )


#: Taken by the first thread that leaves (:func:`leave_now`): the main thread's handler, or the wakeup pipe's reader.
_LEAVING = threading.Lock()


def leave_now(signame: str, clean_up=None) -> None:
    """End the process on ``signame`` before the first training step, from a signal handler, without unwinding
    anything (see the module doc): run ``clean_up`` (the run folder a start-up made, its lock), stop this
    process's children (data-loader workers), write the one line, and ``os._exit`` with 75 or 130."""
    if not _LEAVING.acquire(blocking=False):  # another thread is leaving now: it ends the process
        while True:
            time.sleep(1)
    code = stop_exit_code(signame)
    line = startup_stop_line(signame, launched_rank())
    try:
        if clean_up is not None:
            clean_up()
    except Exception as e:  # noqa: BLE001 - the process ends now, whatever its clean-up met
        logging.debug(f"clean-up before a stop during start-up failed: {e!r}")
    try:
        record_for_launcher(line, "stop")
        _stop_children()
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - the line and the exit come first
        pass
    finally:
        try:
            os.write(2, (line + "\n").encode())
        finally:
            os._exit(code)


def exit_flushed(code: int) -> None:
    """End the process with ``code`` once the logs are flushed, without the interpreter's teardown of torch,
    the model and the data (seconds of CPU on a busy machine, while the job still looks alive)."""
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001 - leaving anyway
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _stop_children() -> None:
    """SIGTERM to this process's children: its data-loader workers, which end on their parent's SIGTERM."""
    pid = os.getpid()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children = [int(c) for c in f.read().split()]
        except OSError:
            continue
        for child in children:
            try:
                os.kill(child, signal.SIGTERM)
            except OSError:
                pass


# -- a failed rank's one line ----------------------------------------------------------------------------------
#: What a rank's line in its error file is: its own error, a stop on a signal (75 / 130), or a collective that
#: failed because another rank did (the launcher looks for the cause among the errors first).
LAUNCHER_KINDS = ("error", "stop", "peer")


def record_for_launcher(line: str, kind: str = "error") -> bool:
    """Under :mod:`clip_dcl.train.torchrun`, write ``line`` to this rank's torchrun error file
    (``TORCHELASTIC_ERROR_FILE``); return whether it was written.

    The file is in the layout torch's ``ErrorHandler`` writes and its ``ProcessFailure`` reads in the launcher (the
    launcher's side is torch's own), but written here, not by torch's ``record``: that writes ``Type: message``, a
    traceback and the second, for an exception; the launcher prints this line instead of a traceback, for a stop
    too (no exception), and needs the time to the microsecond (which of two ranks failing in one second failed
    first) and ``kind`` (:data:`LAUNCHER_KINDS`: a rank's own error, not the failed collectives of the others)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if os.environ.get(LAUNCHER_ENV) != "1" or not path:
        return False
    now = time.time()
    extra = {"timestamp": str(int(now)), "clip_dcl_time": repr(now), "clip_dcl_kind": kind}
    try:
        write_json(path, {"message": {"message": line, "extraInfo": extra}}, indent=None)
    except OSError:
        return False
    return True


def report_error(line: str, kind: str = "error") -> None:
    """The run's last line: on stderr (through OpenCLIP's logging once it is set up, so that out.log has it
    too); under :mod:`clip_dcl.train.torchrun`, an error's to the launcher instead of stderr
    (:func:`record_for_launcher`); a stop's or a failed collective's to both (each rank says where it stopped)."""
    to_launcher = record_for_launcher(line, kind) and kind == "error"
    handlers = logging.getLogger().handlers
    to_stderr = [h for h in handlers if type(h) is logging.StreamHandler and h.stream is sys.stderr]
    if not to_stderr:  # OpenCLIP's logging is not set up (other handlers, a harness's, would not show it)
        if not to_launcher:
            print(line, file=sys.stderr)
        return
    if not to_launcher:
        logging.error(line)
        return
    record = logging.getLogger().makeRecord("root", logging.ERROR, __file__, 0, line, None, None)
    for handler in handlers:  # the log file, not the terminal: the launcher prints it once
        if handler not in to_stderr and record.levelno >= handler.level:
            handler.handle(record)
