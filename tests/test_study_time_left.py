"""`study run`'s progress lines say the time left, estimated from the runs it has finished."""

from __future__ import annotations

import re

from test_study_flow import finish, stand_in_line, write_plan

from clip_dcl.experiment.study import load_plan, run_study
from clip_dcl.experiment.study import local as L


def test_the_time_left_is_the_runs_to_go_at_the_mean_of_the_finished_ones_in_waves_of_parallel():
    assert L.time_left([10, 20], 3, 1) == "; about 45 s left (3 run(s) to go at the mean of the 2 finished here)"
    assert L.time_left([10, 20], 3, 2).startswith("; about 30 s left")  # two waves: 2 at once, then 1
    assert L.time_left([600], 10, 1).startswith("; about 1.7 h left") and L.time_left([400], 10, 1).startswith(
        "; about 67 min"
    )
    assert L.time_left([], 3, 1) == "" and L.time_left([5], 0, 1) == ""


def test_each_finished_run_says_how_long_the_rest_will_take(tmp_path, monkeypatch):
    plan = load_plan(write_plan(tmp_path, seeds=[0, 1, 2]))
    work = tmp_path / "work"
    finish(work, "clip", 0)  # finished earlier: skipped, and no part of the estimate
    monkeypatch.setattr(L, "shell_line", stand_in_line(work, tmp_path / "ran.txt"))
    printed = []
    run_study(plan, work, parallel=1, threads=1, echo=printed.append)
    done = [p for p in printed if ": done in " in p]
    to_go = [re.search(r"left \((\d+) run\(s\) to go at the mean of the (\d+) finished here\)$", p) for p in done]
    assert [m.groups() if m else None for m in to_go] == [("4", "1"), ("3", "2"), ("2", "3"), ("1", "4"), None], done
