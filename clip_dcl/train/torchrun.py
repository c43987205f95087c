"""``python -m clip_dcl.train.torchrun ARGS``: torchrun (``torch.distributed.run``, same arguments) whose exit on
a signal is the run's: 130 for Ctrl-C, 75 for a stop signal, with one line instead of a traceback.

torchrun turns SIGTERM and SIGINT into a ``SignalException``, sends the signal on to its ranks, waits up
to 30 s for them, then exits 1 with that exception's traceback, whatever the ranks did; the ranks stop
at their next step, save it and exit 75 (130 for Ctrl-C), and a scheduler that requeues on 75 never sees
it. Here:

- a ``SignalException`` (the ranks were told, and had the 30 s to save) exits
  :data:`~clip_dcl.train.preempt.PREEMPTED_EXIT_CODE`, or
  :data:`~clip_dcl.train.preempt.INTERRUPTED_EXIT_CODE` for Ctrl-C;
- ranks that stopped on their own signal (a scheduler signals every process of a job, ranks included)
  fail torchrun with their exit codes: 75 or 130 on every failed rank passes through;
- any other failure of a rank exits 1 with one line naming it (its own error line is above).

Before any rank starts, the training command line (``-m clip_dcl.train -- ARGS``) is checked here as each rank
would check it, with the world size and the ranks of this node torchrun will start: a bad flag, a missing
shard, fewer shards than workers x ranks, more ranks than visible GPUs is one line and exit 2, with no rank
started. A rank that fails on a known bad input later writes its line to torchrun's error file instead of
stderr (:func:`clip_dcl.train.exits.report_error`); the launcher prints the line of the rank that failed
first, once. Ranks that torchrun stopped because another failed (75 or 130, a stop during start-up) are not
the cause: the last line names the first rank that failed otherwise, and why.

torchrun starts each rank in a session of its own, so a Ctrl-C at the terminal reaches torchrun alone,
which sends it on to the ranks once: they take it as their first Ctrl-C (save the step, exit 130).

SIGTERM and Ctrl-C are handled from the launcher's first line, before it imports torch (seconds on a
busy machine): until torchrun installs its own handlers, just before it starts the first rank, the
launcher leaves at once with its line, 75 or 130 (from the handler, with ``os._exit``: nothing is
raised inside torch's import, see :mod:`clip_dcl.train.exits`). Once torchrun is done, both are
ignored while the last line is written.
"""

from __future__ import annotations

import os
import signal
import sys


def _stopped_before_the_ranks(signum, frame):
    """SIGTERM or Ctrl-C before torchrun took the signals over: no rank has started; the line, and leave."""
    name, code = ("SIGINT (Ctrl-C)", 130) if signum == signal.SIGINT else (signal.Signals(signum).name, 75)
    os.write(
        2,
        (
            f"clip-dcl train: the launcher stopped on {name} before it started any rank: nothing was "
            f"trained; exit code {code}\n"
        ).encode(),
    )
    os._exit(code)


if __name__ == "__main__":  # the launcher itself (not a test importing it): before any other import
    for _num in (signal.SIGINT, signal.SIGTERM):  # SIGTERM last: once it is caught, both are
        if signal.getsignal(_num) in (signal.SIG_DFL, signal.default_int_handler):
            signal.signal(_num, _stopped_before_the_ranks)

import logging  # noqa: E402
from typing import List, Optional, Tuple  # noqa: E402

from .exits import INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE  # noqa: E402


def exit_code(failed_codes: List[int]) -> int:
    """The exit code for ranks that failed with ``failed_codes``: 130 or 75 when every one stopped on a signal
    after its save (130 if any took a Ctrl-C), else 1."""
    codes = set(failed_codes)
    if codes and codes <= {PREEMPTED_EXIT_CODE, INTERRUPTED_EXIT_CODE}:
        return INTERRUPTED_EXIT_CODE if INTERRUPTED_EXIT_CODE in codes else PREEMPTED_EXIT_CODE
    return 1


def signal_exit(signum: int) -> Tuple[str, int]:
    """``(the signal's name, the exit code)`` of torchrun stopped by signal ``signum``: 130 for Ctrl-C, else 75."""
    if signum == signal.SIGINT:
        return "SIGINT (Ctrl-C)", INTERRUPTED_EXIT_CODE
    return signal.Signals(signum).name, PREEMPTED_EXIT_CODE


def _int(text) -> Optional[int]:
    try:
        return int(str(text))
    except (TypeError, ValueError):
        return None


def precheck(argv: List[str]) -> Optional[Tuple[str, int]]:
    """``(the line, the exit code)`` when torchrun's command line ``argv`` starts ``-m clip_dcl.train`` with
    training flags that every rank would refuse, else None: the checks of ``clip_dcl.train``'s parser that
    need only the flags and the files, with the world size torchrun will give the ranks, and the ranks of
    this node against the GPUs it sees."""
    import contextlib
    import io
    import os

    from torch.distributed.run import get_args_parser

    from ..arguments import misspelt_flag

    parser = get_args_parser()
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            args, unknown = parser.parse_known_args(list(argv))
        except SystemExit:
            return None  # torchrun's own usage error: torchrun says it
    found = misspelt_flag(unknown, parser._option_string_actions)  # words before the script: torchrun's
    if found:
        return f"clip-dcl train: error: {found[0]} is not a flag of torchrun; the closest: {', '.join(found[1])}", 2
    if unknown:
        return None  # torchrun says it
    if not (args.module and args.training_script == "clip_dcl.train"):
        return None
    train_argv = list(args.training_script_args)
    if train_argv[:1] == ["--"]:
        train_argv = train_argv[1:]
    nproc = _int(args.nproc_per_node)
    nnodes = _int(str(args.nnodes).split(":")[0])
    if nproc is None or nnodes is None:  # "gpu", "auto", an elastic range: torchrun decides
        return None

    from ..errors import FlagError
    from .flags import parse_train_args

    env = {"WORLD_SIZE": str(nproc * nnodes), "LOCAL_WORLD_SIZE": str(nproc), "RANK": "0", "LOCAL_RANK": "0"}
    before = {k: os.environ.get(k) for k in env}
    out, err = io.StringIO(), io.StringIO()
    try:
        os.environ.update(env)
        # as in a rank (LOCAL_WORLD_SIZE: the ranks against the GPUs); the ranks print the notices, not this
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            parse_train_args(train_argv)
    except FlagError as e:
        return f"clip-dcl train: error: {e}", 2
    except SystemExit as e:  # argparse's usage error, printed into err
        text = err.getvalue().strip()
        return (text.splitlines()[-1] if text else "clip-dcl train: error: bad flags"), (
            e.code if isinstance(e.code, int) else 2
        )
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return None


def _ours(failure) -> dict:
    """``extraInfo`` of the error file a rank of ours wrote (:func:`clip_dcl.train.exits.record_for_launcher`),
    else ``{}``."""
    data = failure.error_file_data if isinstance(failure.error_file_data, dict) else {}
    info = data.get("message")
    extra = info.get("extraInfo") if isinstance(info, dict) else None
    return extra if isinstance(extra, dict) and "clip_dcl_time" in extra else {}


def _kind(failure) -> str:
    """``error`` (the rank's own error), ``stop`` (75 / 130: stopped on a signal), ``peer`` (a collective failed
    because another rank did) or ``other`` (no line of ours: killed by a signal, or an exception of no known kind)."""
    kind = _ours(failure).get("clip_dcl_kind")
    if kind in ("error", "stop", "peer"):
        return kind
    if failure.exitcode in (PREEMPTED_EXIT_CODE, INTERRUPTED_EXIT_CODE):
        return "stop"
    # killed by SIGTERM with no line: what torchrun sends the others when one fails (or a scheduler sends all)
    return "terminated" if failure.exitcode == -signal.SIGTERM else "other"


def _first_failure(failures):
    """``(global rank, failure)`` of the cause among the failed ranks: a rank's own error (the first, by the time
    it wrote its line), else a rank that died with no line of ours (the lowest rank) of another signal than
    SIGTERM, one that aborted (SIGABRT: what a C++ library does when a peer's death fails its collective) after
    the others, else the first that stopped on a signal, else one SIGTERM killed, else the first whose collective
    failed. Ranks that torchrun stopped when the cause failed (75 / 130, or SIGTERM on their way out), or whose
    collective failed then, come after it."""

    def when(item):
        rank, f = item
        try:
            return float(_ours(f).get("clip_dcl_time", f.timestamp)), rank
        except (TypeError, ValueError):
            return float(f.timestamp), rank

    for kind in ("error", "other", "stop", "terminated", "peer"):
        found = [item for item in failures if _kind(item[1]) == kind]
        if found:
            return (
                min(found, key=when)
                if kind != "other"
                else min(found, key=lambda item: (item[1].exitcode == -signal.SIGABRT, item[0]))
            )
    return min(failures, key=when)


def _rank_line(failure) -> Optional[str]:
    """The error line a rank of ours wrote to its error file, if any."""
    if not _ours(failure):
        return None
    return str(failure.error_file_data["message"].get("message", "")) or None


#: The signals a rank is started with blocked (:func:`_ranks_start_with_stop_signals_blocked`).
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def _trains(argv: List[str]) -> bool:
    """Whether torchrun's command line ``argv`` runs ``-m clip_dcl.train`` (whose ranks unblock
    ``STOP_SIGNALS``)."""
    from torch.distributed.run import get_args_parser

    try:
        args = get_args_parser().parse_args(list(argv))
    except SystemExit:
        return False
    return bool(args.module and args.training_script == "clip_dcl.train")


def _ranks_start_with_stop_signals_blocked() -> None:
    """torchrun starts its ranks with SIGTERM and SIGINT blocked in the launcher, and each rank with them blocked;
    the rank unblocks them once its handlers are in (:func:`clip_dcl.train.main`), and one sent before then is
    handled there.

    A rank's first instructions (the interpreter's start, its first imports) run with no handler of ours: a
    SIGTERM then (a scheduler's, or torchrun's when another rank failed first) killed it with no line, and the
    launcher could not tell the rank it was sent to from the ranks it stopped because of it. In the launcher, a
    signal while torchrun starts the ranks raised its ``SignalException`` between a rank's start and torchrun's
    record of it (the ranks are recorded together, once all have started): torchrun then stopped the ranks it
    had recorded, none, and exited; the others ran on, alone, waiting at the rendezvous. So while the ranks
    start, a signal is only recorded (by a Python handler: other threads of the launcher, the rendezvous store's,
    may take a process's signal whatever this thread blocks), and sent again once all are recorded, to
    torchrun's own handler, which stops them all."""
    from torch.distributed.elastic.multiprocessing.api import SubprocessContext

    start = SubprocessContext._start

    def _start(self):
        got = []
        saved = {num: signal.signal(num, lambda signum, frame: got.append(signum)) for num in STOP_SIGNALS}
        old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # what the ranks start with
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


def main(argv: Optional[List[str]] = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    from .exits import LAUNCHER_ENV

    argv = list(sys.argv[1:] if argv is None else argv)
    refused = precheck(argv)
    if refused is not None:
        print(refused[0], file=sys.stderr)
        return refused[1]
    os.environ[LAUNCHER_ENV] = "1"  # the ranks' error lines come here (clip_dcl.train.exits.report_error)
    if _trains(argv) and hasattr(signal, "pthread_sigmask"):
        _ranks_start_with_stop_signals_blocked()
    # torchrun's record() logs an error when it has no error file of its own to copy a rank's into: our line says it
    logging.getLogger("torch.distributed.elastic.multiprocessing.errors.error_handler").setLevel(logging.CRITICAL)
    try:
        try:
            torchrun_main(argv)
        finally:  # the outcome is decided: a late signal must not replace the last line with a traceback
            for num in (signal.SIGTERM, signal.SIGINT):
                signal.signal(num, signal.SIG_IGN)
    except SignalException as e:
        name, code = signal_exit(e.sigval)
        print(
            f"clip-dcl train: torchrun stopped on {name}: its ranks were told to save their step and stop (their "
            f"lines above say where); exit code {code}",
            file=sys.stderr,
        )
        return code
    except ChildFailedError as e:
        failures = sorted(e.failures.items())
        codes = ", ".join(str(f.exitcode) for _, f in failures)
        code = exit_code([f.exitcode for _, f in failures])
        if code != 1:
            print(
                f"clip-dcl train: the ranks stopped on a signal (exit codes {codes}); exit code {code}", file=sys.stderr
            )
            return code
        rank, first = _first_failure(failures)
        others = f"; {len(failures) - 1} more rank(s) stopped after it" if len(failures) > 1 else ""
        kind = _kind(first)
        if kind == "stop" or kind == "terminated":  # a signal stopped one rank first; the others with it
            print(
                f"clip-dcl train: rank {rank} stopped on a signal first (its line above says whether it saved), "
                f"the others with it (exit codes {codes}); exit code {max(first.exitcode, PREEMPTED_EXIT_CODE)}",
                file=sys.stderr,
            )
            return max(first.exitcode, PREEMPTED_EXIT_CODE)
        line = _rank_line(first)
        if line is not None and kind == "error":  # the rank's own line, printed once (the others' are in their logs)
            print(f"{line} (rank {rank}{others})", file=sys.stderr)
            return first.exitcode if first.exitcode > 0 else 1
        how = f"was killed by {first.signal_name()}" if first.exitcode < 0 else f"exited with code {first.exitcode}"
        print(
            f"clip-dcl train: error: rank {rank} (local rank {first.local_rank}, pid {first.pid}) {how} first"
            f"{others}; its own lines above say why",
            file=sys.stderr,
        )
        return 1
    return 0


def _leave(code: int) -> None:
    """Exit with ``code`` once the last line is out, without the interpreter's teardown of torch (seconds on a busy
    machine, during which the job still looks alive): the launcher has nothing left to write."""
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001 - leaving anyway
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _leave(main(sys.argv[1:]))
