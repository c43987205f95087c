"""``benchmarks/preempt_soak.py``: its plan of faults, and a short soak (2 faults) end to end.

The short soak launches two gloo ranks three times and an uninterrupted run once (a minute or more on a loaded
CPU): marked slow, as the suite's other end-to-end runs. Its faults are the two after which the run must resume
exactly (mid-step, and during a save); a fault in start-up is the subject of startup_stress.py's short run.
"""

from __future__ import annotations

import json

import pytest
from benchmark_script import load

soak = load("preempt_soak")


def test_soak_plan_covers_every_kind_and_is_the_seeds():
    faults = soak.plan_faults(20, 0)
    assert {f.kind for f in faults} == set(soak.KINDS)
    assert {f.signal for f in faults} == set(soak.SIGNALS) and {f.target for f in faults} == set(soak.TARGETS)
    assert soak.plan_faults(20, 0) == faults and soak.plan_faults(20, 1) != faults
    assert all(f.rank == 0 for f in faults if f.kind == "save")  # rank 0 writes the checkpoints
    assert all(1 <= f.step <= 3 for f in faults if f.kind in ("mid-step", "after-resume"))
    assert [f.kind for f in soak.plan_faults(4, 5)] == list(soak.KINDS)  # 4 faults: the 4 kinds


def test_soak_runs_long_enough_for_its_faults():
    assert soak.epochs_for(3) == 4 and soak.epochs_for(20) == 21


def test_soak_refuses_no_faults(capsys):
    with pytest.raises(SystemExit) as stop:
        soak.main(["--faults", "0", "--quick"])
    assert stop.value.code == 2 and "--faults 0: give 1 or more" in capsys.readouterr().err


@pytest.mark.slow
def test_soak_short_two_faults_survived_and_digests_equal(tmp_path, preloaded, monkeypatch):
    from clip_dcl.data.synth import generate

    # torchrun and its ranks start from the preloaded python: this soak's subject is that a run resumes exactly
    # after each fault, not an interpreter's start (test_reliability_startup, startup_stress.py). A SIGKILL to a
    # rank then ends its process, and torchrun sees its shim exit 137 instead of a death by signal.
    monkeypatch.setattr(soak, "PYTHON", preloaded.python)

    data = tmp_path / "data"
    generate(data, quick=True, verbose=False)  # in this process: the data's command line is not what this tests
    # seed 2: SIGTERM to one rank mid-step, SIGKILL to both during a save
    out = tmp_path / "report" / "preempt_soak"
    rc = soak.main(
        ["--faults", "2", "--seed", "2", "--data", str(data), "--work", str(tmp_path / "work"), "--out", str(out)]
    )
    result = json.loads(out.with_suffix(".json").read_text())
    table = [(r["kind"], r["signal"], r["target"], r["where"], r["rc"], r["last_line"]) for r in result["faults"]]
    assert rc == 0, table
    assert result["injected"] == result["survived"] == 2, table
    assert result["kinds"] == ["mid-step", "save"]
    assert result["digests_equal"] and result["digests"]["soak"]["decl_state"], result["digests"]
    by_fault = {r["kind"]: r for r in result["faults"]}
    assert by_fault["mid-step"]["rc"] == 75 and by_fault["mid-step"]["printed_the_resume_command"]
    assert by_fault["save"]["signal"] == "SIGKILL" and by_fault["save"]["target"] == "all"
    assert "Status: complete" in out.with_suffix(".md").read_text()
