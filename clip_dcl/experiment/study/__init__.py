"""Studies: a comparison of objectives declared in one plan file before it runs, run anywhere, judged once.

A study is one TOML plan (:mod:`.plan`): the data, the common training flags, the arms, the seeds, the metric
and the comparisons with their rule (beats, reaches, matches), confidence and resolution. Stage by stage: the
plan, checked whole; the seal (:mod:`.seal`): its data made and the plan fixed in its work folder (the
folder's layout: :mod:`.work`); the runs' shell lines (:mod:`.lines`), which train through ``python -m
clip_dcl.train`` and score both splits (:mod:`.score`), run by a cluster or here (:mod:`.local`), each start
noted (:mod:`.attempts`); the report (:mod:`.report`), which judges the paired differences by the rule
(:mod:`.rule`) once every planned run has its scores. ``clip-dcl study check|commands|run|report``
(:mod:`.cli`) wraps it; docs/studies.md shows it.
"""

from __future__ import annotations

from .local import run_study
from .plan import METRICS, RULES, Arm, Comparison, Plan, PlanError, load_plan, parse_plan
from .report import build, decisions, write_report
from .rule import judge, power, seeds_needed, verdict
from .seal import check_seal, plan_changes, seal
from .work import StudyError, prepare_data

__all__ = [
    "Plan",
    "Arm",
    "Comparison",
    "PlanError",
    "StudyError",
    "load_plan",
    "parse_plan",
    "plan_changes",
    "METRICS",
    "RULES",
    "seal",
    "check_seal",
    "prepare_data",
    "run_study",
    "build",
    "decisions",
    "write_report",
    "judge",
    "verdict",
    "power",
    "seeds_needed",
]
