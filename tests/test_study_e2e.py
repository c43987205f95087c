"""The docs' example study end to end: `study run --parallel 2`, and the lines of `study commands` run as a
Slurm array would run them (``sed -n "${i}p"``, from another folder), give the same per-seed differences."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "benchmarks" / "studies" / "example.toml"


def run_study(python, *args, cwd=ROOT):
    """``python -m clip_dcl.cli study ARGS`` in a process of its own: its runs' lines are shell lines, and the
    commands they start (data, trainings, scores) start from ``python`` (the preloaded one) too."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(
        [python, "-m", "clip_dcl.cli", "study", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.slow
def test_the_example_study_gives_the_same_report_run_here_and_through_its_lines(tmp_path, preloaded):
    here, lines_work = tmp_path / "here", tmp_path / "lines"
    study = functools.partial(run_study, preloaded.python)
    got = study("run", PLAN, "--work", here, "--parallel", "2")
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    progress = [x for x in got.stdout.splitlines() if x.startswith("[study] ") and " seed " in x]
    assert len(progress) == 4 and all(": done in " in x for x in progress)

    got = study("commands", PLAN, "--work", lines_work)
    assert got.returncode == 0, got.stderr[-3000:]
    (tmp_path / "lines.sh").write_text(got.stdout)
    assert len(got.stdout.splitlines()) == 4
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    array = (
        'seq 1 4 | xargs -P 2 -I{} bash -c \'line=$(sed -n "{}p" ../lines.sh); '
        'bash -c "$line" > task{}.log 2>&1 || { echo task {} failed; cat task{}.log; exit 1; }\''
    )
    done = subprocess.run(
        ["bash", "-c", array],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=900,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-3000:]

    # finished runs are not run again
    again = study("run", PLAN, "--work", lines_work, "--parallel", "2")
    assert again.returncode == 0 and again.stdout.count("finished earlier, skipped") == 4

    docs = []
    for work in (here, lines_work):
        got = study("report", PLAN, "--work", work)
        assert got.returncode == 0 and got.stdout.startswith("complete"), got.stdout + got.stderr
        assert "decl beats clip (test split, 2 seeds): mean " in got.stdout
        docs.append(json.loads((work / "STUDY.json").read_text()))
        assert (work / "STUDY.md").is_file() and (work / "STUDY.png").is_file()
    a, b = (d["comparisons"][0]["final"] for d in docs)
    assert a["seeds"] == b["seeds"] == [0, 1]
    assert a["diffs"] == b["diffs"] and a["verdict"] == b["verdict"]  # the same bits: one thread, same seeds
    assert docs[0]["validation"][0]["diffs"] == docs[1]["validation"][0]["diffs"]
    record = next(r for r in docs[1]["runs"] if r["arm"] == "decl" and r["seed"] == 1)
    assert record["recipe"] == "custom" and record["commit"] and record["threads"] == 1 and record["started"]
