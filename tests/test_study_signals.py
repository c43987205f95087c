"""`study run` under SIGTERM and Ctrl-C: every run's process group is stopped and waited for, every attempt
that started is noted with how it ended, one line names what was stopped and the command that goes on, the
exit code is 75 or 130, and the next `study run` continues the stopped runs and says so.

The fast test stands in a small script for the trainer (it starts a helper process of its own, as a trainer
starts its data-loader workers, and saves a "checkpoint" when signalled); the slow one trains for real.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_study_flow import files_of, write_plan

ROOT = Path(__file__).resolve().parents[1]

#: The stand-in trainer: ``FAKE FOLDER ARM SEED PIDS FILES``. While ``PIDS.hold`` exists, a first attempt
#: "trains" until a signal (with a helper process that only a signal to the group ends), saves a checkpoint
#: and exits 75 / 130 as the trainer does; otherwise, or when it finds the checkpoint, it finishes the run
#: (its record and scores).
FAKE_TRAINER = r"""
import json, os, signal, subprocess, sys, time
folder, arm, seed, pids, files = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], json.loads(sys.argv[5])
checkpoints = os.path.join(folder, "checkpoints")
os.makedirs(checkpoints, exist_ok=True)
if os.listdir(checkpoints) or not os.path.exists(pids + ".hold"):
    for name, doc in files.items():
        with open(os.path.join(folder, name), "w") as f:
            json.dump(doc, f)
    sys.exit(0)

def stop(signum, frame):
    open(os.path.join(checkpoints, "epoch_0_step_1.pt"), "w").close()
    sys.exit(75 if signum == signal.SIGTERM else 130)

signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
helper = subprocess.Popen(["sleep", "600"])
with open(os.path.join(folder, "out.log"), "a") as f:
    f.write("Train Epoch: 0 [0/64 (0%)]\n")
with open(pids, "a") as f:
    f.write(f"{os.getpid()} {helper.pid}\n")
while True:
    time.sleep(0.05)
"""

#: ``python -c`` of `study run` with the stand-in trainer as each run's line.
DRIVER = r"""
import json, shlex, sys
from clip_dcl.experiment.study import cli, local
from clip_dcl.experiment.study import work as W
fake, pids, real, files = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])

def line(plan, work, splits, arm, seed, threads):
    folder = W.run_dir(work, arm, seed)
    return " ".join(map(shlex.quote, [real, fake, str(folder), arm, str(seed), pids,
                                      json.dumps(files[f"{arm} {seed}"])]))

local.shell_line = line
sys.exit(cli.main(sys.argv[5:]))
"""


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def start_driver(python, tmp_path, plan, work):
    files = {f"{a} {s}": files_of(a, s) for a in ("clip", "decl") for s in (0, 1)}
    (tmp_path / "fake.py").write_text(FAKE_TRAINER)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.Popen(
        [
            python,
            "-c",
            DRIVER,
            str(tmp_path / "fake.py"),
            str(tmp_path / "pids.txt"),
            sys.executable,
            json.dumps(files),
            "run",
            str(plan),
            "--work",
            str(work),
            "--parallel",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )


def finish(proc, timeout: float = 60):
    """``proc.communicate()``; a study still running after ``timeout`` is stopped (its runs with it) first."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise


def wait_for(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"no {what} after {seconds} s"
        time.sleep(0.1)


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_signal_stops_every_run_and_its_children_notes_each_and_the_next_run_continues_them(
    tmp_path, preloaded, signame
):
    plan, work, pids = write_plan(tmp_path), tmp_path / "work", tmp_path / "pids.txt"
    hold = tmp_path / "pids.txt.hold"
    hold.touch()
    proc = start_driver(preloaded.python, tmp_path, plan, work)
    try:
        wait_for(lambda: pids.is_file() and len(pids.read_text().splitlines()) == 2, 60, "two runs training")
    except AssertionError:
        finish(proc, 0.1)
        raise
    if signame == "SIGTERM":
        proc.send_signal(signal.SIGTERM)
    else:  # a terminal's Ctrl-C: SIGINT to the foreground process group, which holds the study but not its runs
        os.killpg(proc.pid, signal.SIGINT)
    out, err = finish(proc)
    code = {"SIGTERM": 75, "SIGINT": 130}[signame]
    assert proc.returncode == code, out + err
    assert "Traceback" not in out + err
    stopped = [x for x in out.splitlines() if "stopped by" in x]
    said = "Ctrl-C" if signame == "SIGINT" else signame
    assert len(stopped) == 1 and stopped[0].startswith(f"[study] stopped by {said}: ")
    assert stopped[0].count(f"exit {code}; its checkpoint epoch_0_step_1.pt kept") == 2
    assert stopped[0].endswith(f"continue with: clip-dcl study run {plan} --work {work} --parallel 2")
    for pid in (int(p) for x in pids.read_text().splitlines() for p in x.split()):
        assert not alive(pid), f"process {pid} outlived the study"  # the trainers and their helpers
    tried = [json.loads(x) for x in (work / "attempts.jsonl").read_text().splitlines()]
    assert len(tried) == 2 and all(
        a["stopped"] == signame and a["exit"] == code and a["checkpoint"] == "epoch_0_step_1.pt" for a in tried
    )

    hold.unlink()
    again = start_driver(preloaded.python, tmp_path, plan, work)
    out, err = finish(again)
    assert again.returncode == 0, out + err
    assert out.count(": continues from its checkpoint epoch_0_step_1.pt (its last attempt, ") == 2
    assert out.count(f"was stopped by {said})") == 2
    for a, s in ((a["arm"], a["seed"]) for a in tried):
        assert (
            "a new attempt continues this run from checkpoints/epoch_0_step_1.pt"
            in (work / "runs" / a / f"seed{s}" / "out.log").read_text()
        )
    from clip_dcl.experiment.study import load_plan
    from clip_dcl.experiment.study.report import write_report

    doc = write_report(load_plan(plan), work)["doc"]
    assert doc["status"] == "complete"
    assert sum(r.get("stopped") == signame for r in doc["reruns"]) == 2
    assert f"(stopped by {signame} " in (work / "STUDY.md").read_text()


def descendants(pid: int) -> set:
    """``pid`` and every process below it, as /proc shows them now."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        found.add(p)
        todo += children.get(p, [])
    return found


def trainer_of(work: Path, arm: str, seconds: float = 120) -> set:
    """Once run ``arm`` seed 0 logs a training step: its trainer's pid (from its run lock) and its children."""
    folder = work / "runs" / arm / "seed0"
    wait_for(
        lambda: (
            (folder / "run.lock").is_file()
            and (folder / "out.log").is_file()
            and "Train Epoch:" in (folder / "out.log").read_text(errors="replace")
        ),
        seconds,
        f"{arm} training",
    )
    return descendants(int(json.loads((folder / "run.lock").read_text())["pid"]))


@pytest.mark.slow
def test_the_real_trainer_stopped_by_sigterm_then_ctrl_c_is_continued_and_the_study_completes(tmp_path, preloaded):
    plan = tmp_path / "plan.toml"
    plan.write_text(
        (ROOT / "benchmarks" / "studies" / "example.toml")
        .read_text()
        .replace("seeds = [0, 1]", "seeds = [0]")
        .replace('"--train-samples", "128"', '"--train-samples", "320"')
        .replace("log_every_n_steps = 2", "log_every_n_steps = 1")
    )
    work = tmp_path / "work"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}

    def study(*args):
        return subprocess.Popen(
            [preloaded.python, "-m", "clip_dcl.cli", "study", "run", str(plan), "--work", str(work), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )

    first = study()
    trainer = trainer_of(work, "clip")
    first.send_signal(signal.SIGTERM)
    out, err = finish(first, 120)
    assert first.returncode == 75 and "Traceback" not in out + err, out + err
    assert [p for p in trainer if alive(p)] == []  # the trainer and its loader workers
    assert "[study] stopped by SIGTERM: clip seed 0 (exit 75; " in out
    tried = [json.loads(x) for x in (work / "attempts.jsonl").read_text().splitlines()]
    assert [(a["arm"], a["exit"], a["stopped"]) for a in tried] == [("clip", 75, "SIGTERM")]

    second = study()
    trainer = trainer_of(work, "decl")
    os.killpg(second.pid, signal.SIGINT)  # Ctrl-C
    out, err = finish(second, 120)
    assert second.returncode == 130 and "Traceback" not in out + err, out + err
    assert [p for p in trainer if alive(p)] == []
    assert "[study] clip seed 0: continues from its checkpoint " in out or "clip seed 0: reruns from the start" in out
    assert "[study] stopped by Ctrl-C: decl seed 0 (exit 130; " in out

    third = study()
    out, err = finish(third, 300)
    assert third.returncode == 0, out + err
    assert "decl seed 0: continues from its checkpoint" in out or "decl seed 0: reruns from the start" in out
    report = subprocess.run(
        [preloaded.python, "-m", "clip_dcl.cli", "study", "report", str(plan), "--work", str(work)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert report.returncode == 0 and report.stdout.startswith("complete"), report.stdout + report.stderr
    md = (work / "STUDY.md").read_text()
    assert "clip seed 0 (stopped by SIGTERM " in md and "decl seed 0 (stopped by SIGINT " in md


#: ``python -c`` of `study score` whose evaluation waits (a marker file says it started) until a signal comes.
SCORING = r"""
import sys, time
from pathlib import Path
from clip_dcl.experiment import scoring
from clip_dcl.experiment.study import cli

def evaluate(checkpoint, data, split, fewshot, device):
    if split == "test":
        Path(sys.argv[1]).touch()
        time.sleep(600)
    return {"image_retrieval_recall@1": 0.5, "text_retrieval_recall@1": 0.5}

scoring.evaluate = evaluate
sys.exit(cli.main(["score", *sys.argv[2:]]))
"""


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_signal_while_a_run_is_scored_ends_it_as_a_stop_and_leaves_it_unfinished(tmp_path, signame):
    """A study's stop that reaches a run's last step (its scoring) is noted as a stop (75 / 130), not a kill by
    the signal, and leaves no record that would count the run as finished."""
    folder, marker = tmp_path / "runs" / "clip" / "seed0", tmp_path / "scoring"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "epoch_1.pt").touch()
    argv = [str(folder), "--checkpoint", str(folder / "checkpoints" / "epoch_1.pt")]
    argv += ["--validation", "v/{0..1}.tar", "--test", "t/{0..1}.tar"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.Popen(
        [sys.executable, "-c", SCORING, str(marker), *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        wait_for(marker.is_file, 60, "scoring")
    except AssertionError:
        finish(proc, 0.1)
        raise
    proc.send_signal(getattr(signal, signame))
    out, err = finish(proc)
    assert proc.returncode == {"SIGTERM": 75, "SIGINT": 130}[signame], out + err
    assert "Traceback" not in err
    said = "Ctrl-C" if signame == "SIGINT" else signame
    assert err.strip().splitlines() == [
        f"[study] scoring stopped by {said}: the run is not recorded as finished; the next `clip-dcl study run` "
        "scores it"
    ]
    assert not (folder / "run.json").exists() and not (folder / "scores-test.json").exists()
    assert not list(folder.glob("*.partial"))
