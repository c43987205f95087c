"""What the benchmarks that launch small runs and signal their processes share (``preempt_soak.py``,
``startup_stress.py``): a tiny CPU run's training flags, and a process's children as Linux's ``/proc`` lists
them."""

from __future__ import annotations

import os
from typing import List


def children(pid: int) -> List[int]:
    """The pids of ``pid``'s children over all its threads (``/proc/PID/task/*/children``); none when ``pid`` is
    gone or the kernel does not say."""
    out: List[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def tiny_cpu_flags(epochs: int, warmup: int) -> List[str]:
    """The trainer's flags of a tiny run on the CPU: batches of 8, one loader worker, ``epochs`` epochs in fp32,
    seed 0, learning rate 1e-3 after ``warmup`` steps."""
    return [
        *("--batch-size", "8", "--workers", "1", "--epochs", str(epochs), "--precision", "fp32"),
        *("--device", "cpu", "--seed", "0", "--lr", "1e-3", "--warmup", str(warmup)),
    ]
