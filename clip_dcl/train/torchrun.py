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

torchrun starts each rank in a session of its own, so a Ctrl-C at the terminal reaches torchrun alone,
which sends it on to the ranks once: they take it as their first Ctrl-C (save the step, exit 130).
"""
from __future__ import annotations

import signal
import sys
from typing import List, Optional, Tuple

from .preempt import INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE


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


def main(argv: Optional[List[str]] = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(list(sys.argv[1:] if argv is None else argv))
    except SignalException as e:
        name, code = signal_exit(e.sigval)
        print(f"clip-dcl train: torchrun stopped on {name}: its ranks were told to save their step and stop (their "
              f"lines above say where); exit code {code}", file=sys.stderr)
        return code
    except ChildFailedError as e:
        failures = sorted(e.failures.items())
        code = exit_code([f.exitcode for _, f in failures])
        if code != 1:
            print(f"clip-dcl train: the ranks stopped on a signal after saving their step (exit codes "
                  f"{', '.join(str(f.exitcode) for _, f in failures)}); exit code {code}", file=sys.stderr)
            return code
        rank, first = failures[0]
        how = (f"was killed by {first.signal_name()}" if first.exitcode < 0 else f"exited with code {first.exitcode}")
        print(f"clip-dcl train: error: rank {rank} (local rank {first.local_rank}, pid {first.pid}) {how}"
              f"{f' and {len(failures) - 1} more rank(s) failed' if len(failures) > 1 else ''}; its own lines above "
              "say why", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
