"""Stopping a run at a step boundary on a signal, and saving it there.

:class:`StopSignals` turns each configured signal into a flag; at every ``--preempt-check-every``-th step
boundary :class:`StepGate` decides by one all-reduce whether to stop, save or end a diverged run, so that
every rank takes the same decision at the same step. Before the first step a signal ends the start-up at once;
a rank waiting at the rendezvous sits in a C++ call where no Python handler runs, so a wakeup pipe's reader
thread ends the process :data:`STARTUP_GRACE_S` later. Each rank's RNG state is saved with a mid-epoch
checkpoint, so that dropout and ``--workers 0`` augmentation continue as if the run had not stopped.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import torch

from .exits import INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE, StartupStop  # noqa: F401
from .signals import (  # noqa: F401 (the run's signals live there; imported from here too)
    DEFAULT_SIGNALS,
    STARTUP_GRACE_S,
    StartupGuard,
    StopSignals,
    chain_worker_init,
    quiet_workers,
    signal_number,
    worker_ignores_stop_signals,
)


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
    mine = rng_state()
    if world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        out: List[Optional[dict]] = [None] * world_size
        torch.distributed.all_gather_object(out, mine)
        return out
    return [mine]
