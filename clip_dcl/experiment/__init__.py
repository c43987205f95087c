"""Train several objectives on one data set and compare them: the engine of ``clip-dcl demo``, the benchmarks
and ``clip-dcl study``. Each run trains through ``python -m clip_dcl.train`` in a child process, as a user would
launch it, and is scored beside the chance level of every score.

A test that replaces a piece patches the module that owns it (``clip_dcl.experiment.runner.train``).
"""

from __future__ import annotations

from .budgets import DEMO_BUDGET, DEMO_CLASSES, QUICK_BUDGET
from .commands import loss_defaults, loss_flags
from .figures import save_figure
from .reporting import (
    Report,
    about_lines,
    command_line,
    comparison_table,
    machine_info,
    markdown_table,
    plot,
    run_status,
    utc_date,
    write_json,
    write_report,
)
from .runner import (
    DEFAULT_MODEL,
    Budget,
    Run,
    StepTime,
    TrainResult,
    default_runs,
    machine_lock,
    packed_training_set,
    read_curves,
    read_step_times,
    read_val,
    synth_data,
    train,
    train_command,
)
from .scoring import (
    EVALUATOR,
    MEAN_R1,
    Outcome,
    chance_levels,
    evaluate,
    headline_metrics,
    train_and_evaluate,
    with_mean_r1,
)
from .stats import format_mean_std, mean_std, paired_differences, summarize, wins

__all__ = [
    "DEFAULT_MODEL",
    "Run",
    "Budget",
    "default_runs",
    "train_command",
    "TrainResult",
    "machine_lock",
    "train",
    "read_curves",
    "read_val",
    "StepTime",
    "read_step_times",
    "packed_training_set",
    "synth_data",
    "EVALUATOR",
    "Outcome",
    "train_and_evaluate",
    "evaluate",
    "chance_levels",
    "headline_metrics",
    "MEAN_R1",
    "with_mean_r1",
    "machine_info",
    "comparison_table",
    "plot",
    "save_figure",
    "write_report",
    "command_line",
    "run_status",
    "about_lines",
    "Report",
    "markdown_table",
    "write_json",
    "utc_date",
    "mean_std",
    "format_mean_std",
    "summarize",
    "wins",
    "paired_differences",
    "DEMO_BUDGET",
    "QUICK_BUDGET",
    "DEMO_CLASSES",
    "loss_defaults",
    "loss_flags",
]
