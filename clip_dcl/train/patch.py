"""The one module that patches ``open_clip_train``: OpenCLIP's ``main`` with a clip-dcl objective.

:func:`patched` swaps names of ``open_clip_train`` (main, data, distributed) for methods of one
:class:`~clip_dcl.train.run.TrainingRun` for the duration of a ``main`` call; the ``open_clip_train``
surface these rely on is checked when :mod:`clip_dcl.train.upstream` is imported.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import logging
import math
import os
import re
import shutil
import warnings
from typing import Optional

import torch
from open_clip_train import data as oc_data
from open_clip_train import distributed as oc_distributed
from open_clip_train import main as oc_main
from open_clip_train import params as oc_params

from . import preempt as preemption
from .exits import stop_exit_code
from .flags import TrainConfig
from .run import TrainingRun
from .upstream import Overlay, cpu_safe_ddp, init_process_group_with_timeout

__all__ = ["patched", "run_training", "PeerFailure", "collective_failed"]


@contextlib.contextmanager
def patched(run: TrainingRun):
    """Swap OpenCLIP's names for ``run``'s, and restore them on exit."""
    targets = {
        (oc_main, "parse_args"): run.parse_args,
        (oc_main, "create_loss"): run.create_loss,
        (oc_main, "train_one_epoch"): run.train_one_epoch,
        (oc_main, "evaluate"): run.evaluate,
        (oc_main, "pt_load"): run.pt_load,
        (oc_main, "setup_logging"): run.setup_logging,
        (oc_main, "os"): Overlay(os, path=Overlay(os.path, exists=run.path_exists)),
        (oc_main, "torch"): Overlay(
            torch,
            save=run.save,
            nn=Overlay(torch.nn, parallel=Overlay(torch.nn.parallel, DistributedDataParallel=cpu_safe_ddp)),
        ),
        (oc_distributed, "torch"): Overlay(
            torch,
            distributed=Overlay(
                torch.distributed, init_process_group=init_process_group_with_timeout(run.config.dist_timeout)
            ),
        ),
        (oc_data, "get_dataset_fn"): run.get_dataset_fn,
        **(
            {
                (oc_main, "create_model_and_transforms"): functools.partial(
                    oc_main.create_model_and_transforms, init_logit_scale=math.log(run.config.init_logit_scale)
                )
            }
            if run.config.init_logit_scale is not None
            else {}
        ),
        **(
            {
                (oc_main, "optim"): Overlay(
                    torch.optim, AdamW=functools.partial(torch.optim.AdamW, **{run.config.adamw_impl: True})
                )
            }
            if run.config.adamw_impl
            else {}
        ),
        (oc_data, "get_wds_dataset"): run.get_wds_dataset,
        (oc_data, "get_csv_dataset"): run.get_csv_dataset,
        (oc_data, "get_synthetic_dataset"): run.get_synthetic_dataset,
    }
    saved = {key: getattr(*key) for key in targets}
    for (module, name), value in targets.items():
        setattr(module, name, value)
    try:
        yield run
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)


def _log_dir(argv) -> Optional[str]:
    """``--logs/--name`` of an OpenCLIP command line, when a name is given (else main makes one up)."""
    args = oc_params.parse_args(list(argv))
    if not args.name or not args.logs or args.logs.lower() == "none":
        return None
    return os.path.join(args.logs, args.name)


class PeerFailure(RuntimeError):
    """A collective with the other ranks failed (a rank died, or ``--dist-timeout`` ran out)."""


#: What the process-group backends say when a peer is gone or a collective timed out (gloo raises a plain
#: RuntimeError; torch's own DistError types are recognised by class).
_COLLECTIVE_FAILURE = re.compile(
    r"Connection (?:closed|reset) by peer|[Tt]imed out|gloo/transport|NCCL error|"
    r"ProcessGroup\w* .*(?:aborted|timeout)|Broken pipe"
)


def collective_failed(err: BaseException) -> bool:
    """Whether ``err`` is a failed collective (a dead or hung peer), not an error of this rank's own."""
    dist = getattr(torch.distributed, "DistError", ())
    if dist and isinstance(err, dist):
        return True
    return isinstance(err, RuntimeError) and bool(_COLLECTIVE_FAILURE.search(str(err)))


def _first_line(err: BaseException) -> str:
    """The error's first line without the backend's source location and advice ("[.../pair.cc:561] ...")."""
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    text = re.sub(r"^\[[^\]]*\]\s*", "", lines[0] if lines else "")
    text = text.split(" This is typically")[0]
    return f"{type(err).__name__}: {text}".rstrip(": ")


def run_training(config: TrainConfig, at_once: bool = False) -> int:
    """Run ``open_clip_train.main.main`` with ``config``'s objective; return an exit code. A run that fails
    before writing any checkpoint removes the ``--logs/--name`` folder it created, so the command can run again."""
    run = TrainingRun(config)
    log_dir = _log_dir(config.openclip_argv)
    created = log_dir is not None and not os.path.exists(log_dir)
    result = -1
    cleaned = []

    def clean_up():  # once: on the way out, or before a stop during start-up ends the process (leave_now)
        if cleaned:
            return
        cleaned.append(True)
        # only the holder of the folder's lock: a run refused there must not remove the folder of the one running
        if (
            result is not None
            and created
            and run.lock is not None
            and os.path.isdir(log_dir)
            and not glob.glob(os.path.join(log_dir, "checkpoints", "**", "*.pt"), recursive=True)
        ):
            shutil.rmtree(log_dir, ignore_errors=True)
            logging.error(
                f"The run failed before writing a checkpoint; removed {log_dir}, so the same command can be run again."
            )
        if run.lock is not None:
            run.lock.release()

    if config.preempt.signals:  # before main starts the data workers, which inherit the handlers
        run.signals = preemption.StopSignals(config.preempt.signals, ctrl_c=True, at_once=at_once)
        run.signals.on_forced_exit = clean_up
        run.signals.install()
    try:
        with patched(run), warnings.catch_warnings():
            # OpenCLIP's loaders ask for pinned memory; without a GPU torch warns once a loader that it is not used
            warnings.filterwarnings("ignore", message=".*'pin_memory' argument is set as true but no accelerator")
            result = oc_main.main(list(config.openclip_argv))
    except preemption.Preempted as e:
        result = stop_exit_code(e.signame)
        if e.path:
            how = (
                f"run {run.rerun(f'--resume latest (or --resume {e.path})')}; it continues at step {e.step} of "
                f"epoch {e.epoch}"
            )
        elif run.args is not None and run.args.rank == 0:
            how = "no checkpoint was written (no --logs)"
        else:
            how = "rank 0 saved the checkpoint"
        logging.warning(f"Stopped on {e.signame} after step {e.step} of epoch {e.epoch}: {how}. Exit code {result}.")
    except RuntimeError as e:
        if not (getattr(run.args, "world_size", 1) > 1 and collective_failed(e)):
            raise
        rank = getattr(run.args, "rank", "?") if run.args is not None else "?"
        raise PeerFailure(
            f"rank {rank}: a collective with the other ranks failed, so this rank stops: "
            f"{_first_line(e)} (another rank died or hangs? its own log says why; --dist-timeout "
            "bounds the wait for a rank that hangs)"
        ) from None
    finally:
        if run.signals is not None:
            run.signals.restore()
        clean_up()
    # OpenCLIP's main returns None when it finishes and -1 when it refuses to start.
    return 0 if result is None else (1 if result < 0 else int(result))
