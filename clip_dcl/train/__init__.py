"""Training a CLIP model with a clip-dcl objective: our loop over OpenCLIP's parts.

``python -m clip_dcl.train ARGS``, ``torchrun ... -m clip_dcl.train -- ARGS`` and ``clip-dcl train ARGS``
all call :func:`main`: every OpenCLIP training flag, plus ``--loss`` and the loss's flags (see ``--help``).
From Python, ``main([...])`` takes the same words and returns the exit code.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import List, Optional

__all__ = ["main"]


def _without_worker_traceback(e: Exception) -> str:
    """The message of an error raised in a dataloader worker, without the traceback torch adds."""
    text = str(e)
    if "Original Traceback" in text:
        last = text.strip().splitlines()[-1]
        return last.split(": ", 1)[1] if ": " in last else last
    return text


@contextlib.contextmanager
def _run_log_handlers_closed():
    """Remove and close the root-logger handlers a run added (OpenCLIP's ``setup_logging`` adds one
    for stderr and one for ``out.log`` on every call), so that a second ``main`` in the same process
    does not also write into the first run's ``out.log``, nor keep its file open."""
    before = list(logging.root.handlers)
    try:
        yield
    finally:
        for handler in [h for h in logging.root.handlers if h not in before]:
            logging.root.removeHandler(handler)
            handler.close()


def main(argv: Optional[List[str]] = None, prog: Optional[str] = None, exiting: bool = False) -> int:
    """Train from a command line (the words after ``python -m clip_dcl.train``); return the exit code: 0 done (or
    ``--help``); 2 refused before any work (a flag, or a run folder holding another run); 75 stopped on a
    ``--preempt-signals`` signal after saving its step, 130 on Ctrl-C (both also for a stop during start-up, which
    saves nothing); 1 a clear error, logged and on stderr. Any other exception propagates.
    ``exiting``: the caller exits with the code at once, so SIGTERM and Ctrl-C are ignored once the run
    is over (a launcher's SIGTERM to a rank on its way out must not replace its exit code)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:  # torchrun ... -m clip_dcl.train -- ARGS
        argv = argv[1:]
    from .exits import StartupStop, launched_rank, startup_stop_line
    from .signals import StartupGuard

    # SIGTERM and Ctrl-C from here until the run's own handlers (run_training): imports, flags
    guard = StartupGuard(at_once=exiting).install()
    guard.unblock()  # the launcher starts its ranks with them blocked (clip_dcl.train.torchrun): one sent comes now
    proceeding = False
    try:
        from .flags import PROG, FlagError, parse_train_args

        try:
            config = parse_train_args(argv, prog=prog or PROG)
        except FlagError as e:
            guard.check()
            _refuse(f"clip-dcl train: error: {e}")
            return 2
        except SystemExit as e:  # argparse already printed why
            return e.code if isinstance(e.code, int) else 2
        if config is None:  # --help
            return 0

        from .divergence import Diverged
        from .exits import (
            INTERRUPTED_EXIT_CODE,
            PREEMPTED_EXIT_CODE,
            exit_flushed,
            record_for_launcher,
            report_error,
            stop_loader_workers,
        )
        from .ids import MissingSampleIds, SampleIdOutOfRange
        from .pipeline import TrainingDataError
        from .run import LossStateMismatch
        from .runfolder import RunFolderBusy, RunFolderTaken
        from .saving import CheckpointDiskFull, CheckpointUnreadable, RunFolderGone, UnsafeCheckpoint
        from .session import PeerFailure, SetupError, run_training
        from .signals import signal_number

        guard.check()
        proceeding = True
    except StartupStop as e:
        print(startup_stop_line(e.signame, launched_rank()), file=sys.stderr)
        return e.exit_code
    finally:
        if not proceeding:
            guard.remove()
    # the run's handlers (StopSignals) take over the signals they catch from the guard; it keeps none of the others
    taken = (
        {signal_number(s) for s in config.preempt.signals} | {signal_number("SIGINT")}
        if config.preempt.signals
        else set()
    )
    guard.remove(keep=taken)

    code = None
    stopped_in_startup = False
    with _run_log_handlers_closed():
        try:
            code = run_training(config, at_once=exiting)
            if code in (PREEMPTED_EXIT_CODE, INTERRUPTED_EXIT_CODE):  # saved its step: when, for the launcher
                record_for_launcher(
                    f"clip-dcl train: stopped on a signal after saving its step; exit code {code}", "stop"
                )
        except (
            MissingSampleIds,
            SampleIdOutOfRange,
            LossStateMismatch,
            CheckpointUnreadable,
            UnsafeCheckpoint,
            TrainingDataError,
            CheckpointDiskFull,
            Diverged,
            PeerFailure,
            SetupError,
            RunFolderBusy,
            RunFolderGone,
            RunFolderTaken,
        ) as e:
            report_error(
                f"clip-dcl train: error: {_without_worker_traceback(e)}",
                "peer" if isinstance(e, PeerFailure) else "error",
            )
            code = 2 if isinstance(e, RunFolderTaken) else 1  # a taken --name is a refusal, as a bad flag is
        except StartupStop as e:  # a stop signal or Ctrl-C before the first step: nothing to save
            report_error(startup_stop_line(e.signame, launched_rank()), "stop")
            code = e.exit_code
            stopped_in_startup = True
        except KeyboardInterrupt:
            report_error("clip-dcl train: interrupted (Ctrl-C); no checkpoint was saved at this point", "stop")
            code = INTERRUPTED_EXIT_CODE
        finally:
            if exiting:  # the run is over: the process leaves with its code (its workers stop below)
                from .signals import ignore_stop_signals

                ignore_stop_signals()
            else:
                guard.remove()
            # a failed run's workers may not outlive its line; a finished one's would be stopped by the garbage
            # collector, which in a process that goes on meets their queues closed and waits 5 s a worker
            stop_loader_workers()
    if exiting and stopped_in_startup:  # nothing left to write: no teardown of the model and the data
        exit_flushed(code)
    return code


def _refuse(line: str) -> None:
    """A refused command line's error. Under plain torchrun every rank of a node refuses the same flags and files:
    the node's first rank says so (under :mod:`clip_dcl.train.torchrun` the launcher does, once)."""
    from .exits import LAUNCHER_ENV, record_for_launcher

    if record_for_launcher(line):
        return
    if os.environ.get(LAUNCHER_ENV) != "1" and os.environ.get("LOCAL_RANK", "0") != "0":
        return
    print(line, file=sys.stderr)


def command_main(argv: Optional[List[str]] = None) -> int:
    """``clip-dcl train ARGS``: :func:`main`, its usage and errors naming ``clip-dcl train``."""
    return main(argv, prog="clip-dcl train")
