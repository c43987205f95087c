"""``benchmarks/startup_stress.py``: its plan of faults, how it judges a launch's end, and a short stress end to end.

The short stress launches two gloo ranks ten times, one fault each in their first seconds (no launch without a
fault: that one trains to the end, the costliest and the least about start-up): marked slow, as the suite's
other end-to-end runs.
"""

from __future__ import annotations

import json

import pytest
from benchmark_script import load

stress = load("startup_stress")


def test_stress_plan_holds_every_kind_in_each_turn_and_is_the_seeds():
    faults = stress.plan_faults(20, 0, 10.0)
    for turn in range(4):
        assert sorted(f.kind for f in faults[5 * turn : 5 * turn + 5]) == sorted(stress.KINDS)
    assert all(0.0 <= f.at <= 10.0 for f in faults) and {f.rank for f in faults} == {0, 1}
    assert stress.plan_faults(20, 0, 10.0) == faults and stress.plan_faults(20, 1, 10.0) != faults
    assert {f.kind for f in stress.plan_faults(6, 0, 1.0, kinds=["rank-SIGKILL"])} == {"rank-SIGKILL"}


def test_stress_judges_the_exit_code_and_the_last_line_by_the_fault():
    judge = stress.judge_blame
    assert (
        judge(
            "launcher-SIGTERM",
            0,
            75,
            "clip-dcl train: the launcher stopped on SIGTERM before it started any "
            "rank: nothing was trained; exit code 75",
            False,
        )
        is None
    )
    assert (
        judge(
            "group-SIGINT",
            0,
            130,
            "clip-dcl train: torchrun stopped on SIGINT (Ctrl-C): its ranks were told "
            "to save their step and stop (their lines above say where); exit code 130",
            False,
        )
        is None
    )
    assert (
        judge(
            "rank-SIGTERM",
            1,
            75,
            "clip-dcl train: the ranks stopped on a signal (exit codes 75, 75); exit code 75",
            False,
        )
        is None
    )
    wrong = (
        "clip-dcl train: rank 0 stopped on a signal first (its line above says whether it saved), the others "
        "with it (exit codes -15, -15); exit code 75"
    )
    assert judge("rank-SIGTERM", 1, 75, wrong, False)  # rank 1 was sent the signal
    assert judge("rank-SIGTERM", 0, 75, wrong, False) is None
    killed = (
        "clip-dcl train: error: rank 1 (local rank 1, pid 7) was killed by SIGKILL first; 1 more rank(s) "
        "stopped after it; its own lines above say why"
    )
    assert judge("rank-SIGKILL", 1, 1, killed, False) is None
    assert judge("rank-SIGKILL", 0, 1, killed, False)
    assert judge("none", 0, 1, killed, False)
    assert judge("rank-SIGTERM", 1, 0, "", True) is None  # it came after the run's training was over


def test_stress_refuses_no_launches_and_unknown_kinds(capsys):
    for argv, what in (
        (["--launches", "0"], "--launches 0: give 1 or more"),
        (["--kinds", "rank-SIGSEGV"], "--kinds: unknown rank-SIGSEGV"),
    ):
        with pytest.raises(SystemExit) as stop:
            stress.main(argv)
        assert stop.value.code == 2 and what in capsys.readouterr().err


@pytest.mark.slow
def test_stress_short_ten_faulted_launches_end_clean(tmp_path):
    out = tmp_path / "report" / "startup_stress"
    kinds = "launcher-SIGTERM,group-SIGINT,rank-SIGTERM,rank-SIGKILL"
    rc = stress.main(
        [
            "--launches",
            "10",
            "--seed",
            "0",
            "--window",
            "4",
            "--kinds",
            kinds,
            "--samples",
            "16",
            "--work",
            str(tmp_path / "work"),
            "--out",
            str(out),
        ]
    )
    result = json.loads(out.with_suffix(".json").read_text())
    table = [
        (r["kind"], r["rank"], r["fired"], r["rc"], r["ended_after_fault"], r["problems"], r["last_line"])
        for r in result["runs"]
    ]
    assert rc == 0, table
    assert result["launches"] == result["clean"] == 10, table
    assert result["hung"] == result["aborted"] == result["tracebacks"] == result["wrong_blame"] == 0, table
    assert sorted(result["faults"]) == sorted(kinds.split(","))
    assert result["slowest_exit_s"] <= result["bound_s"]
    assert "| launches | faults by kind | clean | hung | aborted |" in out.with_suffix(".md").read_text()
