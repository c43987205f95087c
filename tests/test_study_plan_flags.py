"""A plan checked against the trainer before anything is sealed: each arm's training command goes through the
trainer's own flag checks in `study check`, `commands` and `run`; a flag the trainer would refuse is named
with its arm and the closest valid flags, no SEAL.json is written and nothing trains. A run that fails says
why in its FAILED line, from its log."""

from __future__ import annotations

import shlex
from pathlib import Path

from test_study_flow import write_plan

from clip_dcl.experiment.study import cli, load_plan, run_study
from clip_dcl.experiment.study import local as L
from clip_dcl.train import main as train_main

ROOT_PLAN_EXAMPLE = Path(__file__).resolve().parents[1] / "benchmarks" / "studies" / "example.toml"


def typo_plan(tmp_path):
    path = write_plan(tmp_path)
    path.write_text(
        path.read_text().replace('flags = ["--loss", "decl"]', 'flags = ["--loss", "decl", "--decl-gama", "0.5"]')
    )
    return path


def never_runs(log):
    def line(plan, work, splits, arm, seed, threads):
        return f"echo {arm} {seed} >> {shlex.quote(str(log))}"

    return line


def test_an_arm_with_a_misspelt_flag_is_refused_by_check_commands_and_run_before_the_seal(
    tmp_path, capsys, monkeypatch
):
    path, work, log = typo_plan(tmp_path), tmp_path / "work", tmp_path / "ran.txt"
    monkeypatch.setattr(L, "shell_line", never_runs(log))
    refusal = (
        "clip-dcl study: arm decl: the trainer refuses its command: --decl-gama is not a flag of clip-dcl or "
        "OpenCLIP; the closest: --decl-gamma"
    )
    assert cli.main(["check", str(path)]) == 2
    assert capsys.readouterr().err.startswith(refusal)
    for command in ("commands", "run"):
        assert cli.main([command, str(path), "--work", str(work)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(refusal) and len(err.strip().splitlines()) == 1, err
        assert not (work / "SEAL.json").exists()
    assert "nothing was sealed or trained" in err
    assert not log.exists() and not (work / "runs").exists()  # nothing ran
    # corrected in the same folder: taken
    path.write_text(path.read_text().replace("--decl-gama", "--decl-gamma"))
    assert cli.main(["check", str(path)]) == 0


def test_a_plan_whose_data_a_command_makes_is_refused_before_the_data_are_made(tmp_path, capsys):
    path = tmp_path / "example.toml"
    path.write_text(
        ROOT_PLAN_EXAMPLE.read_text().replace(
            'flags = ["--loss", "decl"]', 'flags = ["--loss", "decl", "--decl-gama", "0.5"]'
        )
    )
    work = tmp_path / "work"
    assert cli.main(["check", str(path)]) == 2
    assert "arm decl: the trainer refuses its command: --decl-gama is not a flag" in capsys.readouterr().err
    assert cli.main(["run", str(path), "--work", str(work)]) == 2
    assert "--decl-gama" in capsys.readouterr().err
    assert not (work / "SEAL.json").exists() and not (work / "data").exists()


def test_a_failed_run_names_the_error_line_of_its_log(tmp_path, monkeypatch):
    plan = load_plan(write_plan(tmp_path))

    def failing(plan, work, splits, arm, seed, threads):
        return (
            "echo 'Start epoch 0'; echo 'clip-dcl train: error: --train-data x.tar: no such shard' >&2; "
            "echo 'a last word'; exit 2"
        )

    monkeypatch.setattr(L, "shell_line", failing)
    printed = []
    out = run_study(plan, tmp_path / "work", parallel=1, threads=1, echo=printed.append)
    assert len(out["failed"]) == 4
    for line in (p for p in printed if "FAILED" in p):
        assert (
            "FAILED (exit 2) after " in line
            and ": clip-dcl train: error: --train-data x.tar: no such shard; log " in line
        )


def test_a_misspelt_trainer_flag_names_the_closest_ones_and_exits_2_before_any_work(tmp_path, capsys):
    base = ["--dataset-type", "synthetic", "--train-num-samples", "16", "--logs", str(tmp_path), "--name", "typo"]
    assert train_main([*base, "--batchsize", "64"]) == 2
    assert capsys.readouterr().err.strip() == (
        "clip-dcl train: error: --batchsize is not a flag of clip-dcl or OpenCLIP; the closest: --batch-size"
    )
    assert train_main([*base, "--loss", "decl", "--decl-gama", "0.9"]) == 2
    assert "the closest: --decl-gamma" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
