"""The evaluation task registry: a name on the command line maps to one `EvalTask`.

Each task declares, where it is defined, everything the command line, the report and the
CLIP_benchmark writer need: its options, its metric names, its table (the report rows), its
CLIP_benchmark task name and how its metrics map to CLIP_benchmark's keys. A module registers its
task with `register_task` at import; `clip_dcl.eval.tasks` imports the built-in ones.
Registering a name a second time replaces the earlier task with a warning, as timm's model
registry does (``timm/models/_registry.py``).

This module imports nothing else of `clip_dcl.eval`, so that every task module can import it.
"""
from __future__ import annotations

import argparse
import warnings
from dataclasses import dataclass, field
from typing import Callable, Sequence

__all__ = ["EvalTask", "TaskResult", "register_task", "get_task", "registered_tasks", "benchmark_task"]


@dataclass
class TaskResult:
    """What one run of a task gives the report.

    ``metrics``: the flat ``metric -> value`` dict; ``data``: the JSON's ``data`` entry (paths, sizes);
    ``settings``: the task's own settings beside the common ones (batch size, device, ...);
    ``details``: per-record results (the JSON's ``details``), ``None`` when the task has none;
    ``facts``: anything else the task's own CLIP_benchmark writer needs (never written as such).
    """

    metrics: dict
    data: dict
    settings: dict = field(default_factory=dict)
    details: list | None = None
    facts: dict = field(default_factory=dict)


def _no_options(parser: argparse.ArgumentParser) -> None:
    """A task without options of its own."""


def _no_check(args: argparse.Namespace) -> None:
    """A task without checks of its own."""


@dataclass(frozen=True)
class EvalTask:
    """One evaluation: ``clip-dcl eval <name>`` and its report.

    - ``name``: the subcommand; ``help`` its line in ``clip-dcl eval --help``, ``description`` its
      ``--help`` text.
    - ``run(model, preprocess, tokenizer, args, common) -> TaskResult``: the evaluation over the
      parsed flags; ``common`` holds ``options`` (`clip_dcl.eval.encoding.EvalOptions`) and
      ``skips`` (`clip_dcl.data.evalsets.skips.SkipCounter`).
    - ``add_arguments(parser)``: the task's options (``--data`` and the model/run flags every task
      shares are added by the command line).
    - ``check(args)``: refuses a bad invocation before the model loads, raising
      `clip_dcl.train.flags.FlagError` naming the flag and the value.
    - ``metrics``: the metric names it reports (``{k}`` and ``{dataset}`` stand for the values of
      its options), shown in its ``--help``.
    - ``table(metrics, args) -> str``: its report rows, printed after the run.
    - ``benchmark_name``: CLIP_benchmark's task name (``None``: no CLIP_benchmark counterpart);
      ``benchmark_metrics(metrics) -> dict``: CLIP_benchmark's metric keys from ours.
    - ``benchmark_documents(result, model_info, args, precision) -> list[dict]``: CLIP_benchmark
      result files of one run, when one run makes more than one (default: one, built by
      `clip_dcl.eval.report.benchmark_document`).
    - ``benchmark_run(model, preprocess, tokenizer, run, settings) -> (metrics, extra)``: the task
      under ``clip-dcl eval benchmark`` (``run`` a `clip_dcl.eval.benchmark.BenchmarkRun`,
      ``settings`` the parsed CLIP_benchmark settings); ``extra`` is added to the result file.
    - ``benchmark_check(run, settings)``: reads what ``benchmark_run`` will read of a run's data
      (its layout, class names) and raises ``ValueError`` naming what does not fit; ``clip-dcl eval
      benchmark`` calls it for every run before the first model loads.
    - ``uses_logit_scale``: its scores depend on the model's ``logit_scale``, so a model whose scale is
      NaN or inf is refused (exit 2); otherwise it is scored with a warning
      (`clip_dcl.eval.encoding.check_logit_scale`).
    """

    name: str
    help: str
    description: str
    run: Callable
    add_arguments: Callable[[argparse.ArgumentParser], None] = _no_options
    check: Callable[[argparse.Namespace], None] = _no_check
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
            raise ValueError(f"task {self.name!r} names CLIP_benchmark's {self.benchmark_name!r} but declares "
                             "neither benchmark_metrics nor benchmark_documents")


_TASKS: dict[str, EvalTask] = {}
#: the shipped tasks, listed first and in this order whichever of their modules a process imported first
BUILTIN_ORDER = ("retrieval", "zeroshot", "fewshot")


def _ordered() -> dict[str, EvalTask]:
    """The registered tasks: the shipped ones in `BUILTIN_ORDER`, then the others in registration order."""
    first = {name: _TASKS[name] for name in BUILTIN_ORDER if name in _TASKS}
    return {**first, **{name: task for name, task in _TASKS.items() if name not in first}}


def register_task(task: EvalTask) -> EvalTask:
    """Add ``task`` under ``task.name`` and return it; a name registered before is replaced, with a warning."""
    if not isinstance(task, EvalTask):
        raise TypeError(f"register_task takes an EvalTask, got {type(task).__name__}")
    if task.name in _TASKS:
        warnings.warn(f"evaluation task {task.name!r} is registered again; the new one replaces the old",
                      stacklevel=2)
    _TASKS[task.name] = task
    return task


def registered_tasks() -> dict[str, EvalTask]:
    """The tasks registered so far, by name: the shipped ones first (`BUILTIN_ORDER`), then the others in
    registration order (a copy)."""
    return _ordered()


def get_task(name: str) -> EvalTask:
    """The task registered as ``name``; ``KeyError`` naming the registered ones otherwise."""
    try:
        return _TASKS[name]
    except KeyError:
        raise KeyError(f"no evaluation task {name!r}; registered: {', '.join(_ordered()) or 'none'}") from None


def benchmark_task(benchmark_name: str) -> EvalTask | None:
    """The task whose CLIP_benchmark name is ``benchmark_name``, ``None`` when none is registered."""
    for task in _TASKS.values():
        if task.benchmark_name == benchmark_name:
            return task
    return None
