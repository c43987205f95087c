"""Stopping a run whose loss or weights are no longer finite, before it writes them over a good checkpoint.

After a NaN loss every later step is NaN and each epoch end would write a NaN checkpoint that
``--resume latest`` picks. `NonFiniteSteps` counts consecutive bad steps on the device (under fp16 a
single one can be an overflow GradScaler skips); the ranks stop at the same step with `Diverged`.
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Tuple

import torch

#: ``--max-nonfinite-steps`` by default: long enough for AMP's GradScaler to ride out an overflow
#: (it skips those steps and halves its scale), short of training on for epochs of NaN.
DEFAULT_MAX_NONFINITE_STEPS = 10


class Diverged(RuntimeError):
    """The run stopped because its loss or its weights are no longer finite; nothing was saved."""


def _terms(out) -> Iterable[torch.Tensor]:
    """The loss tensors of a loss call's output (a tensor, or OpenCLIP's dict of named terms)."""
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, dict):
        for value in out.values():
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                yield value
    elif isinstance(out, (tuple, list)):
        for value in out:
            yield from _terms(value)


def nonfinite_tensors(named: Iterable[Tuple[str, torch.Tensor]], limit: int = 3) -> Tuple[List[str], int]:
    """``(the first `limit` names, how many)`` of the floating-point tensors holding NaN or inf (one host sync)."""
    names, flags = [], []
    for name, t in named:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
            names.append(name)
            flags.append(torch.isfinite(t.detach()).all())
    if not flags:
        return [], 0
    finite = torch.stack([f.to(flags[0].device) for f in flags]).tolist()
    bad = [name for name, ok in zip(names, finite) if not ok]
    return bad[:limit], len(bad)


def describe_tensors(names: List[str], count: int) -> str:
    more = f" and {count - len(names)} more" if count > len(names) else ""
    return f"{count} weight tensor(s) hold NaN or inf ({', '.join(names)}{more})"


class NonFiniteSteps:
    """Consecutive optimizer steps with a non-finite loss, counted on ``device`` without a sync: `record` takes
    every loss output of a step, `end_step` its global step number."""

    def __init__(self, limit: int, device):
        self.limit = int(limit)
        device = torch.device(device)
        self.bad_now = torch.zeros((), dtype=torch.bool, device=device)  # this step so far
        self.run = torch.zeros((), dtype=torch.long, device=device)  # bad steps in a row
        self.run_start = torch.full((), -1, dtype=torch.long, device=device)  # first step of that run
        self.trip_start = torch.full((), -1, dtype=torch.long, device=device)  # run_start of the first run of limit
        self.first_bad = torch.full((), -1, dtype=torch.long, device=device)  # the first bad step of all
        # On CUDA, tripped() reads a copy made after each step without waiting for it (an event says when
        # it has landed): the step boundary asks every step, and a sync there would stall the GPU queue.
        self._event = torch.cuda.Event() if device.type == "cuda" else None
        self._host = torch.full((), -1, dtype=torch.long, pin_memory=self._event is not None)
        self._seen = -1

    def record(self, out) -> None:
        for term in _terms(out):
            self.bad_now |= ~torch.isfinite(term.detach()).all()

    def end_step(self, step: int) -> None:
        bad = self.bad_now  # ``step`` stays a Python number: a tensor made of it is a host-to-device copy, a sync
        self.run = torch.where(bad, self.run + 1, torch.zeros_like(self.run))
        self.run_start = torch.where(bad & (self.run == 1), step, torch.where(bad, self.run_start, -1))
        self.first_bad = torch.where(bad & (self.first_bad < 0), step, self.first_bad)
        if self.limit > 0:
            self.trip_start = torch.where(
                (self.run >= self.limit) & (self.trip_start < 0), self.run_start, self.trip_start
            )
        self.bad_now = torch.zeros_like(self.bad_now)
        if self._event is not None and self.limit > 0:
            self._host.copy_(self.trip_start, non_blocking=True)
            self._event.record()

    def tripped(self, wait: bool = False) -> bool:
        """Whether ``limit`` bad steps in a row happened (on CUDA, from the last copy landed, unless ``wait``)."""
        if self.limit <= 0:
            return False
        if self._event is None or wait:
            return int(self.trip_start) >= 0
        if self._event.query():
            self._seen = int(self._host)
        return self._seen >= 0

    def where(self, steps_per_epoch: int, which: Optional[int] = None) -> str:
        """``"step K of epoch E"`` of the first step of the tripping run (or of ``which``, a global step)."""
        step = int(self.trip_start) if which is None else which
        if step < 0:
            return "no step"
        per = max(1, steps_per_epoch)
        return f"step {step % per} of epoch {step // per}"

    def first(self) -> int:
        return int(self.first_bad)
