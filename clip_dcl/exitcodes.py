"""Every exit code a clip-dcl command leaves with, in one table.

0 and 1 as usual; 2 as argparse gives for a refused command line; 75 (sysexits' EX_TEMPFAIL: a temporary
failure, try again) for a run that stopped on a signal after saving, which ``launch/train_slurm.sbatch``
requeues; 130 (128 + SIGINT, what a shell shows for a process Ctrl-C ended) for Ctrl-C.
"""

from __future__ import annotations

OK = 0
FAILED = 1
USAGE = 2
PREEMPTED = 75
INTERRUPTED = 130


def stop_exit_code(signame: str) -> int:
    """The exit code of a command stopped by ``signame``: 130 for Ctrl-C (SIGINT), else 75."""
    return INTERRUPTED if signame == "SIGINT" else PREEMPTED
