"""``python -m clip_dcl.train.torchrun ARGS``: torchrun (``torch.distributed.run``, same arguments) whose exit on
a signal is the run's: 130 for Ctrl-C, 75 for a stop signal, with one line instead of a traceback.

torchrun exits 1 with a traceback on SIGTERM, which a scheduler that requeues on 75 never sees; any other failure
here exits 1 with one line naming the rank that failed first (:func:`_first_failure`). Before any rank starts,
the training flags are checked as each rank would check them (:func:`precheck`: one line and exit 2).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import List, Optional, Tuple

from ..exitcodes import INTERRUPTED, PREEMPTED


def signal_exit(signum: int) -> Tuple[str, int]:
    """``(the signal's name, the exit code)`` of torchrun stopped by signal ``signum``: 130 for Ctrl-C, else 75."""
    if signum == signal.SIGINT:
        return "SIGINT (Ctrl-C)", INTERRUPTED
    return signal.Signals(signum).name, PREEMPTED


def _stopped_before_the_ranks(signum, frame):
    """SIGTERM or Ctrl-C before torchrun took the signals over: no rank has started; the line, and leave."""
    name, code = signal_exit(signum)
    os.write(
        2,
        (
            f"clip-dcl train: the launcher stopped on {name} before it started any rank: nothing was "
            f"trained; exit code {code}\n"
        ).encode(),
    )
    os._exit(code)


if __name__ == "__main__":  # the launcher itself (not a test importing it): before any other import
    from .signals import stopped_before_the_ranks

    stopped_before_the_ranks(_stopped_before_the_ranks)

import logging  # noqa: E402

from .exits import LAUNCHER_ENV, LAUNCHER_KINDS, exit_flushed  # noqa: E402


def exit_code(failed_codes: List[int]) -> int:
    """The exit code for ranks that failed with ``failed_codes``: 130 or 75 when every one stopped on a signal
    after its save (130 if any took a Ctrl-C), else 1."""
    codes = set(failed_codes)
    if codes and codes <= {PREEMPTED, INTERRUPTED}:
        return INTERRUPTED if INTERRUPTED in codes else PREEMPTED
    return 1


def _int(text) -> Optional[int]:
    try:
        return int(str(text))
    except (TypeError, ValueError):
        return None


def precheck(argv: List[str]) -> Optional[Tuple[str, int]]:
    """``(the line, the exit code)`` when torchrun's command line ``argv`` starts ``-m clip_dcl.train`` with
    training flags that every rank would refuse (with the world size torchrun will give the ranks), else None."""
    import contextlib
    import io

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
    """``extraInfo`` of the error file a rank of ours wrote (:func:`~clip_dcl.train.exits.record_for_launcher`)."""
    data = failure.error_file_data if isinstance(failure.error_file_data, dict) else {}
    info = data.get("message")
    extra = info.get("extraInfo") if isinstance(info, dict) else None
    return extra if isinstance(extra, dict) and "clip_dcl_time" in extra else {}


def _kind(failure) -> str:
    """``error`` (the rank's own error), ``stop`` (75 / 130: stopped on a signal), ``peer`` (a collective failed
    because another rank did) or ``other`` (no line of ours: killed by a signal, or an exception of no known kind)."""
    kind = _ours(failure).get("clip_dcl_kind")
    if kind in LAUNCHER_KINDS:
        return kind
    if failure.exitcode in (PREEMPTED, INTERRUPTED):
        return "stop"
    # killed by SIGTERM with no line: what torchrun sends the others when one fails (or a scheduler sends all)
    return "terminated" if failure.exitcode == -signal.SIGTERM else "other"


def _first_failure(failures):
    """``(global rank, failure)`` of the cause among the failed ranks, by kind: the first rank's own error, else a
    rank that died with no line of ours (SIGABRT last: what a C++ library does when a peer's death fails its
    collective), else the first stopped on a signal, else one SIGTERM killed, else the first failed collective."""

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


#: The signals a rank is started with blocked (:func:`clip_dcl.train.signals.ranks_start_with_stop_signals_blocked`).
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def _trains(argv: List[str]) -> bool:
    """Whether torchrun's command line ``argv`` runs ``-m clip_dcl.train`` (whose ranks unblock ``STOP_SIGNALS``)."""
    from torch.distributed.run import get_args_parser

    try:
        args = get_args_parser().parse_args(list(argv))
    except SystemExit:
        return False
    return bool(args.module and args.training_script == "clip_dcl.train")


def main(argv: Optional[List[str]] = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    argv = list(sys.argv[1:] if argv is None else argv)
    refused = precheck(argv)
    if refused is not None:
        print(refused[0], file=sys.stderr)
        return refused[1]
    os.environ[LAUNCHER_ENV] = "1"  # the ranks' error lines come here (clip_dcl.train.exits.report_error)
    if _trains(argv) and hasattr(signal, "pthread_sigmask"):
        from .signals import ranks_start_with_stop_signals_blocked

        ranks_start_with_stop_signals_blocked(STOP_SIGNALS)
    # torchrun's record() logs an error when it has no error file of its own to copy a rank's into: our line says it
    logging.getLogger("torch.distributed.elastic.multiprocessing.errors.error_handler").setLevel(logging.CRITICAL)
    try:
        try:
            torchrun_main(argv)
        finally:  # the outcome is decided: a late signal must not replace the last line with a traceback
            from .signals import ignore_stop_signals

            ignore_stop_signals()
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
                f"the others with it (exit codes {codes}); exit code {max(first.exitcode, PREEMPTED)}",
                file=sys.stderr,
            )
            return max(first.exitcode, PREEMPTED)
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


if __name__ == "__main__":
    exit_flushed(main(sys.argv[1:]))  # the launcher has nothing left to write
