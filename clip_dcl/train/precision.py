"""What a training command line needs on the machine it runs on, settled before any work.

On a CPU OpenCLIP's default ``--precision amp`` runs every matmul under bfloat16 autocast, many times slower
than float32 and no more accurate: a CPU run that names no precision gets ``fp32``. A ``--report-to`` logger
that is not installed would fail only after the model and data are built: it is refused first.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import List, Sequence

#: ``--report-to`` names: each the module OpenCLIP imports for it and the extra that installs it.
LOGGERS = ("tensorboard", "wandb")
#: The precision a CPU run gets when the command line names none.
CPU_PRECISION = "fp32"


def _openclip_args(argv: Sequence[str]):
    from open_clip_train.params import parse_args

    return parse_args(list(argv))


def names_precision(argv: Sequence[str]) -> bool:
    """Whether ``argv`` sets ``--precision`` in any form OpenCLIP accepts (parsed with two defaults in front)."""
    first = _openclip_args(["--precision", "fp32", *argv]).precision
    second = _openclip_args(["--precision", "amp", *argv]).precision
    return first == second


def runs_on_cpu(device: str) -> bool:
    """Whether ``--device`` ends up on the CPU: ``cpu``, or ``cuda[:N]`` with no GPU visible."""
    kind = device.split(":", 1)[0]
    if kind == "cuda":
        import torch

        return not torch.cuda.is_available()
    return kind == "cpu"


def _is_first_rank() -> bool:
    return all(os.environ.get(var, "0") == "0" for var in ("RANK", "SLURM_PROCID"))


def check_loggers(report_to: str, installed: bool = True) -> None:
    """Refuse (`FlagError`) a ``--report-to`` logger that is unknown or, with ``installed``, not installed."""
    from ..errors import FlagError

    names = [n.strip() for n in report_to.split(",") if n.strip()]
    unknown = [n for n in names if n not in LOGGERS and n != "all"]
    if unknown:
        raise FlagError(
            f"--report-to {report_to}: {', '.join(unknown)} is not one of "
            f"{', '.join([*LOGGERS, 'all'])} (comma-separated)"
        )
    if not installed:
        return
    missing = [n for n in (LOGGERS if "all" in names else names) if importlib.util.find_spec(n) is None]
    if missing:
        extras = ",".join(missing)
        raise FlagError(
            f"--report-to {report_to}: the {' and '.join(missing)} package"
            f"{'s are' if len(missing) > 1 else ' is'} not installed; run "
            f"`pip install 'clip-dcl[{extras}]'` (or `pip install {' '.join(missing)}`), "
            "or leave --report-to out"
        )


def settle_machine_flags(argv: Sequence[str], this_machine: bool = True, log=None) -> List[str]:
    """OpenCLIP's words ``argv``, loggers checked (`FlagError`) and ``--precision fp32`` added for a CPU run that
    names none; ``this_machine=False`` checks the logger names only."""
    argv = list(argv)
    args = _openclip_args(argv)
    check_loggers(args.report_to, installed=this_machine)
    if this_machine and runs_on_cpu(args.device) and not names_precision(argv):
        argv += ["--precision", CPU_PRECISION]
        if _is_first_rank():
            typed = any(w == "--device" or w.startswith("--device=") for w in argv)
            why = f"--device {args.device}" if typed else "no GPU visible"
            if typed and args.device != "cpu":
                why += ", no GPU visible"
            print(
                f"clip-dcl train: training on the CPU ({why}) "
                f"with no --precision: using --precision {CPU_PRECISION} instead of OpenCLIP's default "
                f"{args.precision}, which is many times slower on a CPU; name --precision to choose",
                file=log or sys.stderr,
            )
    return argv
