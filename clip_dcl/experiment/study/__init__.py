"""Studies: a comparison of objectives declared in one plan file before it runs, run anywhere, judged once.

A study is one TOML plan (:mod:`.plan`): the data, the common training flags, the arms, the seeds, the metric
and the comparisons with their rule (beats, reaches, matches), confidence and resolution. The plan is sealed
in its work folder, once its data are made, by the first run or commands (:mod:`.seal`, the folder's layout in
:mod:`.work`); its runs are shell lines (:mod:`.lines`) that train through
``python -m clip_dcl.train`` and score both splits (:mod:`.score`), run by a cluster or here (:mod:`.local`);
the report (:mod:`.report`) judges the paired differences by the rule (:mod:`.rule`) once every planned run
has its scores. ``clip-dcl study check|commands|run|report`` (:mod:`.cli`) wraps it; docs/studies.md shows it.
"""

from __future__ import annotations

from .local import run_study
from .plan import METRICS, RULES, Arm, Comparison, Plan, PlanError, load_plan, parse_plan
from .report import build, decisions, write_report
from .rule import judge, power, seeds_needed, verdict
from .work import StudyError, check_seal, plan_changes, prepare_data, seal

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
