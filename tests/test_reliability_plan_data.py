"""A study's plan is data, checked before anything runs or is sealed, and its engine survives a stop at any
moment: the flags the study sets itself are refused in arms and [train], a [data] command must be a data writer
that writes into ``{DATA}``, paths keep their backslashes, every attempt that started is noted, the data step
continues after a stop, and an empty or unwritable work folder ends in one line."""

from __future__ import annotations

import errno
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from test_study_flow import PLAN, stand_in_line, write_plan

from clip_dcl.experiment.study import attempts as A
from clip_dcl.experiment.study import cli, load_plan, run_study
from clip_dcl.experiment.study import local as L
from clip_dcl.experiment.study import work as W
from clip_dcl.experiment.study.plan import PlanError, parse_plan

COMMAND_PLAN = PLAN.replace(
    """train = "shards/train/{{0..1}}.tar"
train_samples = 64
validation = "shards/val/0.tar"
validation_samples = 8
test = "shards/test/0.tar"
test_samples = 8""",
    "command = {command}",
)


def command_plan(command) -> str:
    return COMMAND_PLAN.format(extra="", command=json.dumps(command))


@pytest.mark.parametrize(
    "where, flags, setting",
    [
        ("arms[1].flags", '["--loss", "decl", "--logs", "/elsewhere"]', "the run's folder"),
        ("arms[1].flags", '["--loss", "decl", "--seed=3"]', "the plan's seeds"),
        ("arms[1].flags", '["--loss", "decl", "--train-data", "/other/{0..9}.tar"]', "[data] train"),
        ("train.flags", '["--resume", "/x/epoch_1.pt"]', "--resume latest"),
        ("train.flags", '["--name", "mine"]', "the run's folder"),
    ],
)
def test_a_flag_the_study_sets_itself_is_refused_naming_the_plans_own_setting(where, flags, setting):
    """Issue: an arm's --logs /elsewhere came after the study's own and won (the run trained outside the work
    folder and the sealed study could never finish)."""
    text = PLAN.format(extra="")
    if where.startswith("arms"):
        text = text.replace('flags = ["--loss", "decl"]', f"flags = {flags}")
    else:
        text = text.replace("batch_size = 16", f"batch_size = 16\nflags = {flags}")
    with pytest.raises(PlanError) as e:
        parse_plan(text, "plan.toml")
    message = str(e.value)
    assert message.startswith(f"plan.toml: {where} = ") and setting in message and "\n" not in message


@pytest.mark.parametrize(
    "command, problem",
    [
        (["data", "synth", "--quick", "{DATA}/../../x"], "is not {DATA} or a folder inside it"),
        (["data", "shards", "pairs.csv", "{DATA}/.."], "is not {DATA} or a folder inside it"),
        (["train", "--logs", "{DATA}"], "not a data writer"),
        (["data", "benchmark", "x", "{DATA}"], "not a data writer"),
    ],
)
def test_a_data_command_writing_outside_data_or_no_data_writer_is_refused_before_anything_is_written(
    tmp_path, capsys, command, problem
):
    """Issue: a [data] output {DATA}/../../x passed, and `study commands` ran it (with --overwrite it replaced
    another folder's summary.json and shards)."""
    plan = tmp_path / "plan.toml"
    plan.write_text(command_plan(command))
    with pytest.raises(PlanError, match=problem.replace("{", r"\{").replace("}", r"\}")):
        load_plan(plan)
    work = tmp_path / "work"
    assert cli.main(["commands", str(plan), "--work", str(work)]) == 2
    err = capsys.readouterr().err
    assert problem in err and len(err.strip().splitlines()) == 1
    assert not work.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["plan.toml"]
    plan.write_text(command_plan(["data", "synth", "--quick", "{DATA}/sub"]))
    assert load_plan(plan).data["command"][-1] == "{DATA}/sub"  # inside {DATA}: accepted


def test_paths_keep_their_backslashes(tmp_path):
    """Issue: a backslash in a path was dropped (back\\slash was looked for as backslash): brace expansion
    read it as an escape, as did the split of a command written as one string."""
    from clip_dcl.paths import expand_pattern

    folder = tmp_path / "back\\slash"
    folder.mkdir()
    for name in ("0.tar", "1.tar"):
        (folder / name).touch()
    pattern = str(folder / "{0..1}.tar")
    assert expand_pattern(pattern) == [str(folder / "0.tar"), str(folder / "1.tar")]
    (folder / "sizes.json").write_text('{"0.tar": 4, "1.tar": 4}')
    splits = {"train": pattern, "validation": str(folder / "0.tar"), "test": str(folder / "1.tar")}
    assert W.check_splits(splits)["train_samples"] == 8  # found and counted where they are
    text = command_plan("data synth --quick {DATA}/back\\slash")
    assert parse_plan(text, "plan.toml").data["command"] == ["data", "synth", "--quick", "{DATA}/back\\slash"]


def test_study_commands_says_first_that_it_makes_the_data(tmp_path, capsys, monkeypatch):
    """`study commands` reads like a print-only verb: before it runs the plan's [data] command it says so."""
    plan = tmp_path / "plan.toml"
    plan.write_text(command_plan(["data", "synth", "--quick", "{DATA}"]))
    said_before = []

    def no_data(*a, **k):
        said_before.append(capsys.readouterr().err)
        raise W.StudyError("stop here")

    monkeypatch.setattr(W, "prepare_data", no_data)
    assert cli.main(["commands", str(plan), "--work", str(tmp_path / "work")]) == 2
    assert len(said_before) == 1 and "first makes the data" in said_before[0]
    assert str(tmp_path / "work" / "data") in said_before[0]


def test_a_stop_right_between_two_runs_notes_the_attempt_whose_shell_started(tmp_path, monkeypatch):
    """Issue: a SIGTERM to `study run` right between two runs said "no run was running" though the next run's
    shell had just started, and that attempt was missing from attempts.jsonl."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("a study installs its stop handlers from the main thread only")
    plan = load_plan(write_plan(tmp_path))
    work, log = tmp_path / "work", tmp_path / "ran.txt"
    line = stand_in_line(work, log)
    monkeypatch.setattr(L, "shell_line", lambda *a: "sleep 2 && " + line(*a))
    calls = []
    before = A.before_attempt

    def stop_now(*a, **k):  # the second run is being readied: the stop lands now, from outside
        calls.append(a[1:3])
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1.0)  # the main thread's handler runs meanwhile
        return before(*a, **k)

    monkeypatch.setattr(A, "before_attempt", stop_now)
    printed = []
    out = run_study(plan, work, parallel=1, threads=1, echo=printed.append)
    assert out["signal"] == "SIGTERM"
    noted = [(a["arm"], a["seed"]) for a in A.attempts(work)]
    headed = [p.name for p in (work / "logs").glob("*.log") if "$ " in p.read_text()]
    assert len(noted) == len(headed) == 2, (noted, headed)  # every attempt whose shell started is noted
    assert A.attempts(work)[-1]["stopped"] == "SIGTERM" and out["stopped"] == [calls[1]]
    stop_line = next(p for p in printed if "stopped by SIGTERM" in p)
    assert "no run was running" not in stop_line and f"{calls[1][0]} seed {calls[1][1]}" in stop_line


def test_the_data_step_continues_after_a_stop_its_own_unfinished_data_made_again(tmp_path, monkeypatch):
    """Issue: SIGTERM to `study run` during its [data] step printed "continue with: clip-dcl study run ...", and
    that command exited 2 because `data synth` refused the half-made WORK/data."""
    from clip_dcl.data.output import writing

    plan_file = tmp_path / "plan.toml"
    plan_file.write_text(command_plan(["data", "synth", "--quick", "{DATA}"]))
    plan, work = load_plan(plan_file), tmp_path / "work"
    data = W.data_dir(work)
    with pytest.raises(KeyboardInterrupt):  # a writer stopped halfway: its mark stays, nobody holds it
        with writing(data, "clip-dcl data synth"):
            (data / "train").mkdir()
            (data / "train" / "00000.tar").write_bytes(b"half")
            raise KeyboardInterrupt
    ran = []

    def writer(argv, **popen):  # the data writer, here a stand-in that refuses a folder it did not finish
        ran.append(argv)
        folder = Path(argv[-1])
        if folder.exists():
            return 2
        folder.mkdir(parents=True)
        summary = {
            key: {"pattern": "x.tar", "num_samples": 8, "dir": "z"}
            for key in ("train", "val", "test", "zeroshot", "zeroshot_test")
        }
        (folder / "summary.json").write_text(json.dumps(summary))
        return 0

    monkeypatch.setattr(W.process, "run_group", writer)
    monkeypatch.setattr(W, "check_splits", lambda splits, source="": splits)
    said = []
    splits = W.prepare_data(plan, work, said.append)
    assert len(ran) == 1 and splits["train"] == str(data / "x.tar") and not (data / "train").exists()
    assert any("unfinished" in s and "making it again" in s for s in said)
    assert json.loads((work / "data.json").read_text())["splits"] == splits


def test_an_empty_data_json_is_read_as_data_not_made(tmp_path):
    """Issue: an empty WORK/data.json (written in place by a step that was stopped) ended in a traceback."""
    plan = load_plan(write_plan(tmp_path))
    work = tmp_path / "work"
    work.mkdir()
    (work / "data.json").write_text("")
    said = []
    splits = W.prepare_data(plan, work, said.append)
    assert splits["train_samples"] == 64 and json.loads((work / "data.json").read_text())["splits"] == splits
    assert len(said) == 1 and "data.json is unreadable (empty)" in said[0]


def test_a_work_folder_that_cannot_be_written_is_one_line(tmp_path, capsys, monkeypatch):
    """Issue: a read-only folder for `study run --work` ended in a traceback. (Tests run as root, for whom
    permission bits do not stop a write: the file system's refusal is stood in for.)"""
    plan = write_plan(tmp_path)
    ro = tmp_path / "ro"
    ro.mkdir()
    read_only(monkeypatch, ro)
    assert cli.main(["run", str(plan), "--work", str(ro / "work")]) == 2
    err = capsys.readouterr().err.strip()
    assert "Read-only file system" in err and "--work" in err and len(err.splitlines()) == 1
    assert not (ro / "work").exists()


def test_a_full_disk_while_the_study_writes_is_one_line(tmp_path, capsys, monkeypatch):
    plan = write_plan(tmp_path)
    monkeypatch.setattr(L, "shell_line", stand_in_line(tmp_path / "work", tmp_path / "ran.txt"))

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "work" / "data.json"))

    monkeypatch.setattr(W, "write_json", full)
    assert cli.main(["run", str(plan), "--work", str(tmp_path / "work")]) == 1
    err = capsys.readouterr().err.strip()
    assert "No space left on device" in err and "data.json" in err and len(err.splitlines()) == 1


def read_only(monkeypatch, folder: Path) -> None:
    """Make ``folder`` refuse new files and folders as a read-only mount does (EROFS), whoever runs the test."""
    root = str(folder.resolve())
    real_mkdir, real_open = os.mkdir, os.open

    def inside(path) -> bool:
        path = os.path.abspath(os.fspath(path))
        return path == root or path.startswith(root + os.sep)

    def mkdir(path, *a, **k):
        if inside(path) and not os.path.exists(path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))
        return real_mkdir(path, *a, **k)

    def open_(path, flags, *a, **k):
        if inside(path) and flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR | getattr(os, "O_TMPFILE", 0)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(os, "open", open_)
