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

The pieces, all importable from here:

* :mod:`~clip_dcl.experiment.runner` runs trainings as a user would: the command line
  (:func:`train_command`), the child process under a machine-wide lock (:func:`train`,
  :func:`machine_lock`) and what OpenCLIP logged (:func:`read_curves`, :func:`read_val`,
  :func:`parse_step_times`), and the synthetic data (:func:`synth_data`);
* :mod:`~clip_dcl.experiment.scoring` evaluates and compares: :func:`evaluate`,
  :func:`train_and_evaluate` (with its cache), :func:`chance_levels`, :func:`headline_metrics`;
* :mod:`~clip_dcl.experiment.reporting` writes tables, JSON and plots (:func:`write_report`,
  :func:`comparison_table`, :func:`plot`, :func:`save_figure`) and names the machine
  (:func:`machine_info`).
"""
from __future__ import annotations

from .reporting import _cell, comparison_table, machine_info, plot, save_figure, write_report
from .runner import (
    _PROGRESS,
    DEFAULT_MODEL,
    Budget,
    Run,
    StepTime,
    TrainResult,
    _stream,
    default_runs,
    machine_lock,
    parse_step_times,
    read_curves,
    read_val,
    synth_data,
    train,
    train_command,
)
from .scoring import EVALUATOR, Outcome, _any_hit_chance, chance_levels, evaluate, headline_metrics, train_and_evaluate

__all__ = [
    "DEFAULT_MODEL", "Run", "Budget", "default_runs", "train_command", "TrainResult", "machine_lock", "train",
    "read_curves", "read_val", "StepTime", "parse_step_times", "synth_data",
    "EVALUATOR", "Outcome", "train_and_evaluate", "evaluate", "chance_levels", "headline_metrics",
    "machine_info", "comparison_table", "plot", "save_figure", "write_report",
]
