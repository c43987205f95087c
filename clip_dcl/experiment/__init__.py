"""Train several objectives on one data set and compare them: the engine of ``clip-dcl demo``.

A comparison is a list of :class:`Run` (a label and the ``--loss ...`` flags of one objective)
trained under the same seed, data, model and budget (:class:`Budget`) through the real training
entry point, ``python -m clip_dcl.train``, in a child process (as a user would launch it), then
evaluated with the package's evaluators on the synthetic data's held-out splits:

* retrieval R@1/5/10 on the validation shards (several captions per image);
* zero-shot top-1/top-5 and mean per-class recall over the latent classes;
* the ELEVATER 5-shot linear probe (reduced grid by default) and the mean classifier over the
  few-shot suite.

Beside every score, :func:`chance_levels` gives what a random embedding would score, worked out
from the data's sizes (not measured). The report is a Markdown table, a JSON document with the
raw numbers and settings, and a PNG with the training curves and the scores
(:func:`write_report`). The benchmarks in ``benchmarks/`` reuse the same pieces with more seeds.

The pieces (their main names also importable from here):

* :mod:`~clip_dcl.experiment.runner` runs trainings as a user would: the command line
  (:func:`train_command`), the child process under a machine-wide lock (:func:`train`,
  :func:`machine_lock`) and what the run logged as data (:func:`read_curves`, :func:`read_val`,
  :func:`read_step_times`), and the synthetic data (:func:`synth_data`);
* :mod:`~clip_dcl.experiment.scoring` evaluates and compares: :func:`evaluate`,
  :func:`train_and_evaluate` (with its cache), :func:`chance_levels`, :func:`headline_metrics`;
* :mod:`~clip_dcl.experiment.reporting`, the benchmarks' reporting kit: a report's files and
  opening lines (:class:`Report`: :func:`command_line`, :func:`utc_date`, :func:`machine_info`,
  :func:`run_status`, :func:`about_lines`), tables (:func:`markdown_table`), JSON
  (:func:`write_json`), and a comparison's whole report (:func:`write_report`,
  :func:`comparison_table`, :func:`plot`);
* :mod:`~clip_dcl.experiment.memory`: a process's peak and current resident memory;
* :mod:`~clip_dcl.experiment.stats`: mean and spread over seeds, paired differences and wins;
* :mod:`~clip_dcl.experiment.figures`: matplotlib without a display, :func:`save_figure`;
* :mod:`~clip_dcl.experiment.budgets`: the demo's budgets, which the quality benchmark shares;
* :mod:`~clip_dcl.experiment.commands`: a loss's full flags from the loss registry;
* :mod:`~clip_dcl.experiment.arguments`: the benchmarks' command-line checks;
* :mod:`~clip_dcl.experiment.torchrun`: a benchmark that launches itself on several gloo ranks;
* :mod:`~clip_dcl.experiment.study`: ``clip-dcl study``, a comparison declared in one plan file, sealed by its
  first run, run as shell lines here or on a cluster, judged once every run has its scores (docs/studies.md).

The generators of the README's and docs' blocks and the archived batch-size testbed are scripts of the
repository, not of the package: ``benchmarks/quotes.py``, ``benchmarks/testbed/``.

Tests that replace a piece (a stand-in for :func:`train`) patch the module that owns it
(``clip_dcl.experiment.runner.train``), which is where the other pieces look it up.
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
