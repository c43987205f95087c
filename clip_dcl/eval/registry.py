"""The evaluation task registry: a name on the command line maps to one `EvalTask`, registered at import (a second
registration replaces the first with a warning, as timm's does). Imports nothing else of `clip_dcl.eval`.
"""

from __future__ import annotations

import argparse
import warnings
from dataclasses import dataclass, field
from typing import Callable, Sequence

__all__ = ["EvalTask", "TaskResult", "register_task", "get_task", "registered_tasks", "benchmark_task"]


@dataclass
class TaskResult:
    """One run of a task: flat ``metrics``, the JSON's ``data``, its ``settings``, per-record ``details`` (or None),
    ``facts`` for its CLIP_benchmark writer and ``chance``, each metric against its chance level
    (`metrics.against_chance`; given to the task's ``table`` as ``chance=`` and written to the JSON)."""

    metrics: dict
    data: dict
    settings: dict = field(default_factory=dict)
    details: list | None = None
    facts: dict = field(default_factory=dict)
    chance: dict = field(default_factory=dict)


def _nothing(_) -> None:
    """A task's default ``add_arguments`` and ``check``: no options of its own, nothing to check."""


@dataclass(frozen=True)
class EvalTask:
    """One evaluation, ``clip-dcl eval <name>`` (docs/extending-eval.md). ``help``/``description``: its ``--help``
    lines; ``add_arguments``: its own options; ``metrics``: the names it reports (``{k}``, ``{dataset}`` stand for
    option values); ``benchmark_check(run, settings)``: reads a run's data before any model loads (``ValueError``);
    ``uses_logit_scale``: a model whose scale is not finite is refused, not warned."""

    name: str
    help: str
    description: str
    run: Callable
    add_arguments: Callable[[argparse.ArgumentParser], None] = _nothing
    check: Callable[[argparse.Namespace], None] = _nothing
    metrics: Sequence[str] = ()
    table: Callable | None = None
    benchmark_name: str | None = None
    benchmark_metrics: Callable[[dict], dict] | None = None
    benchmark_documents: Callable | None = None
    benchmark_run: Callable | None = None
    benchmark_check: Callable | None = None
    uses_logit_scale: bool = False

    def __post_init__(self):
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"task name {self.name!r} must be a non-empty word (letters, digits, '-', '_')")
        if self.name == "benchmark":
            raise ValueError("task name 'benchmark' is taken by `clip-dcl eval benchmark`")
        if self.benchmark_name and self.benchmark_metrics is None and self.benchmark_documents is None:
            raise ValueError(
                f"task {self.name!r} names CLIP_benchmark's {self.benchmark_name!r} but declares "
                "neither benchmark_metrics nor benchmark_documents"
            )


_TASKS: dict[str, EvalTask] = {}
#: the shipped tasks, listed first and in this order whichever of their modules a process imported first
BUILTIN_ORDER = ("retrieval", "zeroshot", "fewshot")


def register_task(task: EvalTask) -> EvalTask:
    """Add ``task`` under ``task.name`` and return it; a name registered before is replaced, with a warning."""
    if not isinstance(task, EvalTask):
        raise TypeError(f"register_task takes an EvalTask, got {type(task).__name__}")
    if task.name in _TASKS:
        warnings.warn(f"evaluation task {task.name!r} is registered again; the new one replaces the old", stacklevel=2)
    _TASKS[task.name] = task
    return task


def registered_tasks() -> dict[str, EvalTask]:
    """The tasks registered so far, by name (a copy): `BUILTIN_ORDER` first, then in registration order."""
    first = {name: _TASKS[name] for name in BUILTIN_ORDER if name in _TASKS}
    return {**first, **{name: task for name, task in _TASKS.items() if name not in first}}


def get_task(name: str) -> EvalTask:
    """The task registered as ``name``; ``KeyError`` naming the registered ones otherwise."""
    try:
        return _TASKS[name]
    except KeyError:
        raise KeyError(f"no evaluation task {name!r}; registered: {', '.join(registered_tasks()) or 'none'}") from None


def benchmark_task(benchmark_name: str) -> EvalTask | None:
    """The task whose CLIP_benchmark name is ``benchmark_name``, ``None`` when none is registered."""
    return next((task for task in _TASKS.values() if task.benchmark_name == benchmark_name), None)
