"""A study's work folder without training: sealing, incompleteness, resuming, reruns, looks, pairing.

Runs are stood in for by their files (``run.json`` and the two splits' scores), written directly or by a
shell line in place of the real one (``clip_dcl.experiment.study.local.shell_line``), so these tests check
the study's bookkeeping; tests/test_study_e2e.py trains for real.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

from clip_dcl.experiment.study import attempts as A
from clip_dcl.experiment.study import cli, load_plan, run_study
from clip_dcl.experiment.study import local as L
from clip_dcl.experiment.study import work as W
from clip_dcl.experiment.study.plan import PlanError
from clip_dcl.experiment.study.seal import seal as seal_plan

PLAN = """
seeds = [0, 1]
metric = "retrieval/mean_R@1"
confidence = 0.9
resolution = 0.01
{extra}
[data]
train = "shards/train/{{0..1}}.tar"
train_samples = 64
validation = "shards/val/0.tar"
validation_samples = 8
test = "shards/test/0.tar"
test_samples = 8

[train]
epochs = 1
batch_size = 16

[[arms]]
name = "clip"
flags = ["--loss", "clip"]

[[arms]]
name = "decl"
flags = ["--loss", "decl"]

[[comparisons]]
a = "decl"
b = "clip"
rule = "beats"
"""
#: each run's mean R@1 on the validation and test splits; decl beats clip by 5 points on the test split
SCORES = {
    ("clip", 0): (0.20, 0.30),
    ("decl", 0): (0.21, 0.35),
    ("clip", 1): (0.22, 0.31),
    ("decl", 1): (0.20, 0.36),
    ("clip", 2): (0.20, 0.30),
    ("decl", 2): (0.22, 0.355),
}
HARDWARE = "cpu X / no GPU / torch 2"


def write_plan(tmp_path, extra="", seeds=None):
    """The plan in ``tmp_path``, with the (empty) shard files its [data] names beside it and their
    ``sizes.json``: a run must find its data (the trainer's flag checks read the sizes), and no stand-in
    line reads it."""
    text = PLAN.format(extra=extra)
    if seeds is not None:
        text = text.replace("seeds = [0, 1]", f"seeds = {seeds}")
    for name in ("train/0.tar", "train/1.tar", "val/0.tar", "test/0.tar"):
        (tmp_path / "shards" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "shards" / name).touch()
    (tmp_path / "shards" / "train" / "sizes.json").write_text('{"0.tar": 32, "1.tar": 32}')
    for split in ("val", "test"):
        (tmp_path / "shards" / split / "sizes.json").write_text('{"0.tar": 8}')
    path = tmp_path / "plan.toml"
    path.write_text(text)
    return path


def files_of(arm, seed, hardware=HARDWARE):
    val, test = SCORES[(arm, seed)]
    return {
        "run.json": {
            "arm": arm,
            "seed": seed,
            "recipe": "custom",
            "commit": "abc",
            "hardware": hardware,
            "started": "2030-01-01 00:00:00",
        },
        "scores-validation.json": {"retrieval/mean_R@1": val},
        "scores-test.json": {"retrieval/mean_R@1": test},
    }


def finish(work, arm, seed, hardware=HARDWARE):
    folder = W.run_dir(work, arm, seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name, doc in files_of(arm, seed, hardware).items():
        (folder / name).write_text(json.dumps(doc))


def stand_in_line(work, log: Path, fail=()):
    """A shell_line stand-in: append ``arm seed`` to ``log``, then write the run's files (or exit 3 for ``fail``)."""

    def line(plan, work_, splits, arm, seed, threads):
        if (arm, seed) in fail:
            return f"echo {arm} {seed} >> {shlex.quote(str(log))}; exit 3"
        folder = W.run_dir(work, arm, seed)
        cmds = [f"echo {arm} {seed} >> {shlex.quote(str(log))}", f"mkdir -p {shlex.quote(str(folder))}"]
        cmds += [
            f"echo {shlex.quote(json.dumps(doc))} > {shlex.quote(str(folder / name))}"
            for name, doc in files_of(arm, seed).items()
        ]
        return " && ".join(cmds)

    return line


def ran(log: Path):
    return [tuple(x.split()) for x in log.read_text().splitlines()] if log.is_file() else []


def test_a_seed_added_after_the_seal_is_refused_by_run_commands_and_report(tmp_path, capsys):
    plan = write_plan(tmp_path)
    work = tmp_path / "work"
    assert cli.main(["commands", str(plan), "--work", str(work)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and all("-m clip_dcl.train --" in x and "study score" in x for x in lines)
    seal = json.loads((work / "SEAL.json").read_text())
    assert seal["plan"]["seeds"] == [0, 1] and seal["plan_text"] == plan.read_text() and seal["commit"]
    write_plan(tmp_path, seeds=[0, 1, 2])
    for command in ("run", "commands", "report"):
        assert cli.main([command, str(plan), "--work", str(work)]) == 2, command
        captured = capsys.readouterr()
        err = captured.err.strip()
        assert "\n" not in err and "seeds: [0, 1] -> [0, 1, 2]" in err and "new --work folder" in err, command
        assert captured.out == ""
    assert not (work / "runs").exists() and not (work / "STUDY.md").exists()
    # a new study in a new folder is fine; the old plan in the old folder still is
    assert cli.main(["commands", str(plan), "--work", str(tmp_path / "new")]) == 0
    write_plan(tmp_path)
    assert cli.main(["commands", str(plan), "--work", str(work)]) == 0


def test_the_seal_and_the_run_records_name_no_path_of_the_machine(tmp_path, monkeypatch):
    from clip_dcl.experiment.study.score import work_relative

    write_plan(tmp_path)
    monkeypatch.chdir(tmp_path)
    seal = seal_plan(load_plan("plan.toml"), Path("work"))
    assert seal["source"] == "plan.toml" and json.loads((tmp_path / "work" / "SEAL.json").read_text()) == seal
    folder = W.run_dir(tmp_path / "work", "clip", 0)  # WORK/runs/<arm>/seed<N>: relative to WORK
    assert work_relative(folder, folder / "checkpoints" / "epoch_2.pt") == "runs/clip/seed0/checkpoints/epoch_2.pt"
    assert work_relative(tmp_path / "elsewhere", tmp_path / "elsewhere" / "c.pt") == "c.pt"


def test_a_margin_moved_or_an_arm_renamed_is_named(tmp_path, capsys):
    plan = write_plan(tmp_path, extra="")
    work = tmp_path / "work"
    seal_plan(load_plan(plan), work)
    plan.write_text(plan.read_text().replace('name = "decl"', 'name = "decl2"').replace('a = "decl"', 'a = "decl2"'))
    assert cli.main(["report", str(plan), "--work", str(work)]) == 2
    assert "arms[1].name: 'decl' -> 'decl2'; comparisons[0].a: 'decl' -> 'decl2'" in capsys.readouterr().err


def test_an_unfinished_study_prints_no_test_split_verdict_and_reads_no_test_score(tmp_path, capsys, monkeypatch):
    plan = write_plan(tmp_path)
    work = tmp_path / "work"
    seal_plan(load_plan(plan), work)
    for run in (("clip", 0), ("decl", 0), ("clip", 1)):
        finish(work, *run)
    read = []
    real = W.read_scores
    monkeypatch.setattr(W, "read_scores", lambda w, a, s, split: read.append(split) or real(w, a, s, split))
    assert cli.main(["report", str(plan), "--work", str(work)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("incomplete: 3 of 4 runs") and "test split" not in out and "->" not in out
    assert "validation split (for choices, no verdict): decl beats clip: +1.00 points over 1 seed(s)" in out
    assert read and "test" not in read
    doc = json.loads((work / "STUDY.json").read_text())
    assert doc["status"] == "incomplete: 3 of 4 runs" and not any("test" in r for r in doc["runs"])
    assert all(not c["looks"] and c["final"] is None for c in doc["comparisons"])
    md = (work / "STUDY.md").read_text()
    assert "## Verdicts" not in md and "## Validation split (for choices; never a verdict)" in md
    assert (work / "STUDY.png").is_file()
    finish(work, "decl", 1)
    read.clear()
    assert cli.main(["report", str(plan), "--work", str(work)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("complete")
    # one look: none named; the numbers in points, the verdict with its reason in words
    assert (
        "  decl beats clip (test split, 2 seeds): mean +5.00 points, 90 % interval [+5.00, +5.00] -> beats: the "
        "whole interval lies above zero and its mean (+5.00) is past the resolution of ±1 point\n" in out
    )
    assert "test" in read
    doc = json.loads((work / "STUDY.json").read_text())
    final = doc["comparisons"][0]["final"]
    assert final["seeds"] == [0, 1] and final["diffs"] == pytest.approx([0.05, 0.05]) and final["verdict"] == "beats"


def test_finished_runs_are_skipped_and_a_failed_run_is_rerun_and_listed(tmp_path, monkeypatch):
    plan = load_plan(write_plan(tmp_path))
    work, log = tmp_path / "work", tmp_path / "ran.txt"
    finish(work, "clip", 0)
    finish(work, "decl", 0)
    monkeypatch.setattr(L, "shell_line", stand_in_line(work, log, fail={("decl", 1)}))
    printed = []
    out = run_study(plan, work, parallel=2, threads=1, echo=printed.append)
    assert sorted(ran(log)) == [("clip", "1"), ("decl", "1")]  # seed 0 was finished: not run again
    assert out["skipped"] == [("clip", 0), ("decl", 0)] and out["failed"] == [("decl", 1)]
    assert any("decl seed 1: FAILED (exit 3)" in p for p in printed)
    assert any("clip seed 0: finished earlier, skipped" in p for p in printed)
    assert A.attempts(work)[-1]["exit"] in (0, 3) and not W.finished(work, "decl", 1)
    assert cli.main(["run", str(plan.source), "--work", str(work)]) == 1  # still failing: exit 1
    monkeypatch.setattr(L, "shell_line", stand_in_line(work, log))
    log.unlink()
    out = run_study(plan, work, parallel=1, threads=1, echo=printed.append)
    assert ran(log) == [("decl", "1")] and out["finished"] == [("decl", 1)] and not out["failed"]
    doc = json.loads((work / "STUDY.json").read_text()) if (work / "STUDY.json").exists() else None
    assert doc is None  # run writes no report
    from clip_dcl.experiment.study.report import write_report

    doc = write_report(plan, work)["doc"]
    assert doc["status"] == "complete"
    assert [(r["arm"], r["seed"], r["exit"]) for r in doc["reruns"]] == [("decl", 1, 3), ("decl", 1, 3)]
    assert "decl seed 1 (failed" in (work / "STUDY.md").read_text()
    log.unlink()
    run_study(plan, work, parallel=1, threads=1, echo=printed.append)
    assert ran(log) == []  # everything finished: nothing runs


def test_a_sequential_plan_stops_at_the_first_look_that_decides_every_comparison(tmp_path, monkeypatch):
    path = write_plan(tmp_path, extra='looks = [2, 3]\nalpha_split = "bonferroni"\n', seeds=[0, 1, 2])
    plan, work, log = load_plan(path), tmp_path / "work", tmp_path / "ran.txt"
    # seeds 0 and 1 both differ by +5 points: beats at the first look's 95 %, so seed 2 never runs
    monkeypatch.setattr(L, "shell_line", stand_in_line(work, log))
    out = run_study(plan, work, parallel=1, threads=1, echo=lambda s: None)
    assert out["stopped_at_look"] == 1 and {s for _, s in ran(log)} == {"0", "1"}
    from clip_dcl.experiment.study.report import write_report

    doc = write_report(plan, work)["doc"]
    final = doc["comparisons"][0]["final"]
    assert final["look"] == 1 and final["verdict"] == "beats" and final["confidence"] == pytest.approx(0.95)
    assert doc["status"].startswith("complete: every comparison decided at a look (4 of 6 runs")
    assert "sequential: 2 looks, at 2, 3 seeds" in (work / "STUDY.md").read_text()


def test_runs_on_different_machines_are_not_paired_unless_the_plan_says_so(tmp_path):
    for extra, verdict in (("", "no verdict"), ('pair_across = ["machines"]', "beats")):
        plan = load_plan(write_plan(tmp_path, extra=extra))
        work = tmp_path / f"work{len(extra)}"
        seal_plan(plan, work)
        for arm, seed in plan.runs():
            finish(work, arm, seed, hardware="other GPU" if (arm, seed) == ("decl", 1) else HARDWARE)
        from clip_dcl.experiment.study.report import build

        final = build(plan, work)["comparisons"][0]["final"]
        if extra:
            assert final["seeds"] == [0, 1] and not final["left_out"]
        else:
            assert final["seeds"] == [0] and "seed 1: machines differ" in final["left_out"][0]
        assert final["verdict"] == verdict


def test_margin_gain_is_the_share_of_the_paired_gain_on_the_judged_split(tmp_path):
    text = PLAN.format(extra="").replace(
        'rule = "beats"', 'rule = "reaches"\nmargin_gain = {from = "clip", to = "decl", share = 0.5}'
    )
    (tmp_path / "p.toml").write_text(text)
    plan = load_plan(tmp_path / "p.toml")
    work = tmp_path / "work"
    seal_plan(plan, work)
    for run in plan.runs():
        finish(work, *run)
    from clip_dcl.experiment.study.report import build

    final = build(plan, work)["comparisons"][0]["final"]
    assert final["margin"] == pytest.approx(0.5 * 0.05)  # half the test split's mean gain decl - clip


def test_the_slurm_script_runs_the_line_of_its_array_task(tmp_path):
    import os
    import subprocess

    script = Path(__file__).resolve().parents[1] / "launch" / "study_slurm.sbatch"
    lines = tmp_path / "lines.sh"
    lines.write_text(
        f"echo first > {tmp_path}/out # clip-dcl study run 1 of 2\n"
        f"echo second > {tmp_path}/out # clip-dcl study run 2 of 2\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    got = subprocess.run(
        ["bash", str(script), str(lines)],
        env={**env, "SLURM_ARRAY_TASK_ID": "2", "DRY_RUN": "1"},
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert got.returncode == 0 and got.stdout.strip() == f"echo second > {tmp_path}/out # clip-dcl study run 2 of 2"
    got = subprocess.run(
        ["bash", str(script), str(lines)],
        env={**env, "SLURM_ARRAY_TASK_ID": "2"},
        capture_output=True,
        text=True,
        cwd="/",
    )
    assert got.returncode == 0 and (tmp_path / "out").read_text() == "second\n"
    got = subprocess.run(
        ["bash", str(script), str(lines)], env={**env, "SLURM_ARRAY_TASK_ID": "3"}, capture_output=True, text=True
    )
    assert got.returncode == 2 and "no line 3" in got.stderr
    assert subprocess.run(["bash", str(script), str(lines)], env=env, capture_output=True).returncode != 0


def test_an_exploratory_study_reads_the_validation_split_only(tmp_path, monkeypatch):
    plan = load_plan(write_plan(tmp_path, extra="exploratory = true"))
    work = tmp_path / "work"
    seal_plan(plan, work)
    for run in plan.runs():
        finish(work, *run)
    read = []
    real = W.read_scores
    monkeypatch.setattr(W, "read_scores", lambda w, a, s, split: read.append(split) or real(w, a, s, split))
    from clip_dcl.experiment.study.report import write_report

    doc = write_report(plan, work)["doc"]
    final = doc["comparisons"][0]["final"]
    assert final["split"] == "validation" and final["diffs"] == pytest.approx([0.01, -0.02])
    assert set(read) == {"validation"} and not any("test" in r for r in doc["runs"])
    assert "## Readings (validation split: an exploratory study chooses" in (work / "STUDY.md").read_text()


def test_a_registered_recipe_brings_its_data_command_and_training_flags(tmp_path):
    from clip_dcl.experiment.recipes import RECIPES
    from clip_dcl.experiment.study.lines import shell_line

    text = (
        PLAN.format(extra='recipe = "micro-bpe"').split("[data]")[0]
        + """
[train]
epochs = 3
device = "cpu"

[[arms]]
name = "clip-b16"
batch_size = 16
flags = ["--loss", "clip"]

[[arms]]
name = "decl-b16"
batch_size = 16
flags = ["--loss", "decl"]

[[comparisons]]
a = "decl-b16"
b = "clip-b16"
rule = "beats"
"""
    )
    (tmp_path / "p.toml").write_text(text)
    plan = load_plan(tmp_path / "p.toml")
    assert plan.data["command"] == list(RECIPES["micro-bpe"].data_argv) and plan.data["from_summary"]
    work = tmp_path / "work"
    splits = {"validation": "/v.tar", "test": "/t.tar"}
    words = shlex.split(shell_line(plan, work, splits, "decl-b16", 1, threads=2).split(" && ")[0])
    argv = words[words.index("--") + 1 :]
    data = str(W.data_dir(work))
    want = RECIPES["micro-bpe"].train_argv(
        batch_size=16, seed=1, epochs=3, name="seed1", objective=("--loss", "decl"), device="cpu"
    )
    assert argv == [
        a.replace("{DATA}", data).replace("{LOGS}", str(W.run_dir(work, "decl-b16", 1).parent)) for a in want
    ] + ["--resume", "latest"]
    with pytest.raises(Exception, match=r"unknown key 'lr' in \[train\]"):
        load_plan((tmp_path / "p.toml").write_text(text.replace("epochs = 3", "lr = 0.1")) and tmp_path / "p.toml")


def test_a_report_published_under_a_name_links_its_own_figure(tmp_path, capsys):
    plan = write_plan(tmp_path)
    work, out = tmp_path / "work", tmp_path / "results"
    seal_plan(load_plan(plan), work)
    for run in (("clip", 0), ("decl", 0), ("clip", 1), ("decl", 1)):
        finish(work, *run)
    assert cli.main(["report", str(plan), "--work", str(work), "--out", str(out), "--name", "my_study"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["my_study.json", "my_study.md", "my_study.png"]
    md = (out / "my_study.md").read_text()
    assert "](my_study.png)" in md and "STUDY.png" not in md
    assert json.loads((out / "my_study.json").read_text())["status"] == "complete"
    assert cli.main(["report", str(plan), "--work", str(work), "--out", str(out), "--name", "../x"]) == 2
    assert "--name must be a plain file name stem, got '../x'" in capsys.readouterr().err


THREE_ARMS = """
[[arms]]
name = "tuned"
flags = ["--loss", "clip", "--init-logit-scale", "28"]

[[comparisons]]
a = "decl"
b = "tuned"
rule = "beats"
seeds = 2
"""


def test_a_comparison_with_fewer_seeds_trains_its_arms_only_on_those_and_is_judged_on_them(
    tmp_path, capsys, monkeypatch
):
    path = write_plan(tmp_path, seeds=[0, 1, 2])
    path.write_text(path.read_text() + THREE_ARMS)
    plan = load_plan(path)
    assert plan.arm_seeds("tuned") == (0, 1) and plan.arm_seeds("decl") == (0, 1, 2)
    assert plan.runs() == [
        ("clip", 0),
        ("decl", 0),
        ("tuned", 0),
        ("clip", 1),
        ("decl", 1),
        ("tuned", 1),
        ("clip", 2),
        ("decl", 2),
    ]
    work = tmp_path / "work"
    seal_plan(plan, work)
    monkeypatch.setitem(SCORES, ("tuned", 0), (0.20, 0.31))
    monkeypatch.setitem(SCORES, ("tuned", 1), (0.21, 0.33))
    for job in plan.runs()[:-1]:
        finish(work, *job)
    assert cli.main(["report", str(path), "--work", str(work)]) == 0
    assert capsys.readouterr().out.startswith("incomplete: 7 of 8 runs")
    finish(work, "decl", 2)
    assert cli.main(["report", str(path), "--work", str(work)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("complete")
    doc = json.loads((work / "STUDY.json").read_text())
    first, second = (c["final"] for c in doc["comparisons"])
    assert first["seeds"] == [0, 1, 2] and second["seeds"] == [0, 1]
    assert second["diffs"] == pytest.approx([0.35 - 0.31, 0.36 - 0.33])


def test_per_comparison_seeds_are_checked_and_sealed(tmp_path, capsys):
    path = write_plan(tmp_path, seeds=[0, 1, 2])
    path.write_text(path.read_text() + THREE_ARMS.replace("seeds = 2", "seeds = 4"))
    with pytest.raises(
        PlanError, match=r"comparisons\[1\].seeds = 4: expected a number of seeds from 2 to the plan's 3"
    ):
        load_plan(path)
    path.write_text(path.read_text().replace("seeds = 4", "seeds = 2") + "\n")
    with_looks = path.read_text().replace(
        "resolution = 0.01", 'resolution = 0.01\nlooks = [2, 3]\nalpha_split = "bonferroni"'
    )
    (tmp_path / "looks.toml").write_text(with_looks)
    with pytest.raises(PlanError, match=r"comparisons\[1\].seeds: a sequential plan"):
        load_plan(tmp_path / "looks.toml")
    work = tmp_path / "work"
    seal_plan(load_plan(path), work)
    path.write_text(path.read_text().replace("seeds = 2", "seeds = 3"))
    assert cli.main(["report", str(path), "--work", str(work)]) == 2
    assert "comparisons[1].seeds: 2 -> 3" in capsys.readouterr().err


def test_a_plan_without_per_comparison_seeds_keeps_its_sealed_form(tmp_path):
    plan = load_plan(write_plan(tmp_path))
    assert all("seeds" not in c for c in plan.canonical()["comparisons"])


def test_a_study_split_across_machines_by_seed_runs_each_share_and_skips_runs_copied_in_meanwhile(
    tmp_path, monkeypatch, capsys
):
    path = write_plan(tmp_path, seeds=[0, 1, 2])
    plan, log = load_plan(path), tmp_path / "ran.txt"
    assert plan.pick_seeds(["2", "0-1"]) == (0, 1, 2) and plan.pick_seeds(["1,2"]) == (1, 2)
    for bad in (["7"], ["5-9"], ["x"]):
        with pytest.raises(PlanError, match=f"--seeds '{bad[0]}'"):
            plan.pick_seeds(bad)
    # machine B takes seed 2 into its own work folder; machine A the rest of the plan into the study's
    other, work = tmp_path / "other", tmp_path / "work"
    monkeypatch.setattr(L, "shell_line", stand_in_line(other, log))
    out = run_study(plan, other, parallel=2, threads=1, echo=lambda s: None, seeds=(2,))
    assert sorted(ran(log)) == [("clip", "2"), ("decl", "2")] and len(out["finished"]) == 2
    # B's runs copied into the study's folder while A's run goes on: A skips them when their turn comes
    monkeypatch.setattr(L, "shell_line", stand_in_line(work, log))
    log.unlink()
    real_one_finish = L.subprocess.Popen

    def copy_in_then_run(*a, **k):
        if a and a[0][:1] == ["bash"] and not W.finished(work, "clip", 2):  # once A's first run has begun
            for arm in ("clip", "decl"):
                shutil.copytree(W.run_dir(other, arm, 2), W.run_dir(work, arm, 2))
        return real_one_finish(*a, **k)

    monkeypatch.setattr(L.subprocess, "Popen", copy_in_then_run)
    printed = []
    out = run_study(plan, work, parallel=1, threads=1, echo=printed.append)
    assert sorted(ran(log)) == [("clip", "0"), ("clip", "1"), ("decl", "0"), ("decl", "1")]
    assert sorted(out["skipped"]) == [("clip", 2), ("decl", 2)]
    assert any("clip seed 2: finished meanwhile, skipped" in p for p in printed), printed
    # a bad --seeds is refused before any work: no seal, no data
    fresh = tmp_path / "fresh"
    assert cli.main(["run", str(path), "--work", str(fresh), "--seeds", "3"]) == 2
    assert "--seeds '3': not among the plan's seeds (0..2)" in capsys.readouterr().err and not fresh.exists()
    assert cli.main(["commands", str(path), "--work", str(fresh), "--seeds", "1-"]) == 2
    assert not fresh.exists()


# -- paths and the seal of a study that never trained ----------------------------------------------------------
def test_data_paths_are_read_from_the_plan_files_folder_wherever_the_study_runs(tmp_path, monkeypatch):
    plans = tmp_path / "plans"
    plans.mkdir()
    path = write_plan(plans)
    # a folder of shards is taken as the pattern of its .tar files, and counted from its sizes.json
    text = path.read_text().replace('train = "shards/train/{0..1}.tar"\ntrain_samples = 64', 'train = "shards/train"')
    (plans / "shards" / "train" / "sizes.json").write_text(json.dumps({"0.tar": 30, "1.tar": 34}))
    path.write_text(text)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    plan = load_plan(Path("..") / "plans" / "plan.toml")  # a relative plan path, read from another folder
    splits = W.prepare_data(plan, tmp_path / "work")
    assert splits["train"] == str(plans.resolve() / "shards" / "train" / "{0..1}.tar")
    assert splits["train_samples"] == 64
    assert splits["test"] == str(plans.resolve() / "shards" / "test" / "0.tar") and splits["test_samples"] == 8


def test_check_names_a_missing_shard_and_a_split_it_cannot_count(tmp_path, capsys):
    path = write_plan(tmp_path)
    assert cli.main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"data: train {tmp_path}/shards/train/{{0..1}}.tar (64 samples);" in out
    (tmp_path / "shards" / "test" / "0.tar").unlink()
    assert cli.main(["check", str(path)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"clip-dcl study: {path}: [data] test: {tmp_path}/shards/test/0.tar does not exist (a relative path is read "
        "from the plan file's folder)"
    )
    (tmp_path / "shards" / "test" / "0.tar").touch()
    path.write_text(path.read_text().replace("test_samples = 8\n", ""))  # no count, no sizes.json
    (tmp_path / "shards" / "test" / "sizes.json").unlink()
    assert cli.main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"clip-dcl study: cannot count the samples of {tmp_path}/shards/test/0.tar") and err.endswith(
        "give [data] test_samples"
    )


def test_a_run_that_fails_before_any_training_leaves_the_work_folder_unsealed(tmp_path, capsys, monkeypatch):
    path = write_plan(tmp_path)
    work = tmp_path / "work"
    (tmp_path / "shards" / "val" / "0.tar").unlink()
    assert cli.main(["run", str(path), "--work", str(work)]) == 2  # its data cannot be read
    assert "[data] validation:" in capsys.readouterr().err
    assert not (work / "SEAL.json").exists()
    (tmp_path / "shards" / "val" / "0.tar").touch()
    # every run fails before a training step: still unsealed, and the corrected plan is taken
    monkeypatch.setattr(
        L,
        "shell_line",
        stand_in_line(work, tmp_path / "ran.txt", fail={(a, s) for a in ("clip", "decl") for s in (0, 1)}),
    )
    assert cli.main(["run", str(path), "--work", str(work)]) == 1
    assert "is left unsealed" in capsys.readouterr().out
    assert not (work / "SEAL.json").exists()
    path.write_text(path.read_text().replace("epochs = 1", "epochs = 2"))

    # one run trained (it left a checkpoint): the folder stays sealed, and a changed plan is refused
    def one_checkpoint(plan, work_, splits, arm, seed, threads):
        folder = W.run_dir(work, arm, seed) / "checkpoints"
        return f"mkdir -p {shlex.quote(str(folder))} && touch {shlex.quote(str(folder / 'epoch_1.pt'))}; exit 1"

    monkeypatch.setattr(L, "shell_line", one_checkpoint)
    assert cli.main(["run", str(path), "--work", str(work)]) == 1
    assert (work / "SEAL.json").exists()
    path.write_text(path.read_text().replace("epochs = 2", "epochs = 3"))
    assert cli.main(["run", str(path), "--work", str(work)]) == 2
    assert "train.epochs: 2 -> 3" in capsys.readouterr().err


def test_the_report_opens_with_its_words_and_draws_every_comparison_on_one_axis(tmp_path, monkeypatch):
    from clip_dcl.experiment.study import report as R

    path = write_plan(tmp_path)
    path.write_text(path.read_text() + '\n[[comparisons]]\na = "decl"\nb = "clip"\nrule = "reaches"\nmargin = 0.02\n')
    plan = load_plan(path)
    work = tmp_path / "work"
    seal_plan(plan, work)  # tmp_path is no git checkout: the plan was not committed
    for arm in ("clip", "decl"):
        for seed in (0, 1):
            finish(work, arm, seed)
    figures = []
    real = R.save_figure
    monkeypatch.setattr(R, "save_figure", lambda fig, p, title="": figures.append(fig) or real(fig, p, title))
    md = R.write_report(plan, work)["markdown"].read_text()
    # the glossary first, before any number
    glossary = md.index("## How to read it")
    assert glossary < md.index("## The plan and its runs") < md.index("## Verdicts")
    for word in ("**points**", "**interval**", "**resolution**", "**margin**", "**look**"):
        assert md.index(word) > glossary
    # the plan's commit: git holds no such file, so no commit or date is the plan's, and nothing came "before"
    assert "the plan was not committed to git" in md and "before its first run" not in md
    # each verdict with its reason
    assert "- decl reaches clip: **reaches**: the interval's low end (+5.00) is above the bar of -2.00 points" in md
    # one forest plot: one axis for both comparisons, zero drawn, the reach's margin at -2 points, seeds as dots
    (fig,) = figures
    (ax,) = fig.axes
    assert [t.get_text().split("\n")[0] for t in ax.get_yticklabels()] == ["decl reaches clip", "decl beats clip"]
    xs = {round(float(line.get_xdata()[0]), 6) for line in ax.get_lines() if len(set(line.get_xdata())) == 1}
    assert {0.0, -2.0} <= xs
    dots = [c for c in ax.collections if c.get_label() == "one seed"]
    assert len(dots) == 1 and dots[0].get_offsets().shape == (2, 2)


def test_a_work_folder_moved_elsewhere_reads_its_data_from_where_it_is_now(tmp_path):
    text = PLAN.format(extra='recipe = "micro-bpe"').split("[data]")[0] + PLAN.split("[train]")[1].join(["[train]", ""])
    (tmp_path / "p.toml").write_text(text)
    plan = load_plan(tmp_path / "p.toml")
    old, work = tmp_path / "old", tmp_path / "moved"
    summary = {
        "train": {"pattern": "train/{0..1}.tar", "num_samples": 64},
        "val": {"pattern": "val/0.tar", "num_samples": 8},
        "test": {"pattern": "test/0.tar", "num_samples": 8},
        "zeroshot": {"dir": "zeroshot"},
        "zeroshot_test": {"dir": "zeroshot_test"},
    }
    (work / "data").mkdir(parents=True)
    (work / "data" / "summary.json").write_text(json.dumps(summary))
    made = {k: str(old / "data" / "val/0.tar") for k in ("train", "validation", "test")}
    (work / "data.json").write_text(json.dumps({"plan_data": plan.data, "splits": made}))  # made in `old`
    splits = W.prepare_data(plan, work, echo=lambda line: pytest.fail(f"the data were made again: {line}"))
    assert splits["validation"] == str(work.resolve() / "data" / "val" / "0.tar")
    assert splits["train"] == str(work.resolve() / "data" / "train" / "{0..1}.tar")
    assert splits["test_zeroshot"] == str(work.resolve() / "data" / "zeroshot_test")
