"""Every command a message tells to run works when run: each hint is read from the message, added to the same
command, and run.

- the stop on SIGTERM or Ctrl-C: "run the same command with --resume latest (or --resume PATH)";
- a full disk: "Free space, then run the same command with --resume latest (or --resume PATH)";
- a diverged run under --save-most-recent: "the newest, PATH, is what the same command with --resume latest
  resumes", which is true since --resume latest there takes the newest of epoch_latest.pt and epoch_N.pt;
- a folder that holds a run: "run the same command with --resume latest", "give another --name".
"""

from __future__ import annotations

import os
import re
import shlex
import shutil

import pytest
from conftest import train_in_process
from test_reliability_exit import HELPER, _env, _finish, _flags, _launch, nan_after_step, shards  # noqa: F401

SYNTHETIC = [
    "--model",
    "clip-dcl-tiny",
    "--dataset-type",
    "synthetic",
    "--train-num-samples",
    "32",
    "--batch-size",
    "8",
    "--workers",
    "0",
    "--precision",
    "fp32",
    "--device",
    "cpu",
    "--seed",
    "0",
    "--lr",
    "1e-3",
    "--warmup",
    "1",
    "--report-to",
    "",
    "--loss",
    "dcl",
]


def _alternatives(message: str, before: str, after: str):
    """The two commands of "``before`` --resume latest (or --resume PATH)``after``", as flag lists."""
    m = re.search(re.escape(before) + r" (--resume latest) \(or (--resume \S+)\)" + re.escape(after), message)
    assert m, message[-3000:]
    return shlex.split(m.group(1)), shlex.split(m.group(2))


def _with_logs(flags, logs):
    out = list(flags)
    out[out.index("--logs") + 1] = str(logs)
    return out


# -- a stop on a signal -------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "sig, code, choice", [("SIGTERM", 75, 1), ("SIGINT", 130, 0)], ids=["SIGTERM-resume-path", "SIGINT-resume-latest"]
)
def test_hint_of_a_stop_on_a_signal_continues_the_run(shards, tmp_path, preloaded, sig, code, choice):  # noqa: F811
    logs = tmp_path / "logs"
    flags = _flags(shards, logs, "x", "--loss", "dcl", "--epochs", "1", "--train-num-samples", "32")
    # a process of its own (the signal is one it sends itself), started without importing torch again
    proc, _ = _launch([HELPER, *flags], env=_env(PREEMPT_AT_STEP="2", PREEMPT_SIGNAL=sig), python=preloaded.python)
    rc, err, _ = _finish(proc)
    assert rc == code, err[-3000:]
    words = _alternatives(err, "run the same command with", "; it continues at step 2 of epoch 0")[choice]
    res = train_in_process([*flags, *words])  # the same command, in the same folder
    assert res.returncode == 0, (words, res.stderr[-3000:])
    assert "Resumed epoch 0 at step 2 of 4" in res.stderr, (words, res.stderr[-3000:])
    assert (logs / "x" / "checkpoints" / "epoch_1.pt").exists()


# -- a full disk ------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_hint_of_a_full_disk_continues_the_run_once_there_is_space(tmp_path):
    logs = tmp_path / "logs"
    partial = logs / "x" / "checkpoints" / "epoch_2.pt.partial"
    partial.parent.mkdir(parents=True)
    partial.symlink_to("/dev/full")  # every write to it fails with ENOSPC
    flags = [*SYNTHETIC, "--epochs", "2", "--logs", str(logs), "--name", "x"]
    res = train_in_process(flags)
    assert res.returncode == 1, res.stderr[-3000:]
    partial.unlink(missing_ok=True)  # "free space" (the failed save removed its partial file, the link)
    latest, path = _alternatives(res.stderr, "Free space, then run the same command with", ".")
    assert path == ["--resume", str(logs / "x" / "checkpoints" / "epoch_1.pt")]
    copy = tmp_path / "copy"
    shutil.copytree(logs, copy)
    for words, folder in ((path, logs), (latest, copy)):
        again = train_in_process([*_with_logs(flags, folder), *words])
        assert again.returncode == 0, (words, again.stderr[-3000:])
        assert f"=> resuming checkpoint '{folder / 'x' / 'checkpoints' / 'epoch_1.pt'}' (epoch 1)" in again.stderr
        assert (folder / "x" / "checkpoints" / "epoch_2.pt").exists()


# -- --resume latest with --save-most-recent --------------------------------------------------------------------
@pytest.mark.slow
def test_hint_of_a_divergence_names_what_resume_latest_resumes_under_save_most_recent(
    tmp_path,
    nan_after_step,  # noqa: F811
):
    logs = tmp_path / "logs"
    base = [*SYNTHETIC, "--logs", str(logs), "--name", "x"]
    checkpoints = logs / "x" / "checkpoints"
    first = train_in_process([*base, "--epochs", "1"])  # epoch_1.pt, no epoch_latest.pt
    assert first.returncode == 0, first.stderr[-3000:]
    # with the flag, --resume latest continues epoch_1.pt (OpenCLIP looked at epoch_latest.pt alone, started over)
    flags = [*base, "--save-most-recent", "--resume", "latest"]
    second = train_in_process([*flags, "--epochs", "2"])
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"=> resuming checkpoint '{checkpoints / 'epoch_1.pt'}' (epoch 1)" in second.stderr
    assert "Start epoch 0" not in second.stderr
    nan_after_step(1)
    third = train_in_process([*flags, "--epochs", "3"])
    assert third.returncode == 1, third.stderr[-3000:]
    m = re.search(r"the newest, (\S+), is what the same command with --resume latest resumes", third.stderr)
    assert m, third.stderr[-3000:]
    named = m.group(1)
    assert named in (str(checkpoints / "epoch_latest.pt"), str(checkpoints / "epoch_2.pt"))  # both hold epoch 2


@pytest.mark.slow
def test_hint_resume_latest_under_save_most_recent_reaches_the_file_the_message_names(tmp_path):
    """Without the NaN hook of the test above: the same command with --resume latest resumes the file named."""
    logs = tmp_path / "logs"
    flags = [*SYNTHETIC, "--logs", str(logs), "--name", "x", "--epochs", "1"]
    assert train_in_process(flags).returncode == 0
    from clip_dcl.train.runfolder import latest_checkpoint

    named = latest_checkpoint(logs / "x" / "checkpoints", True)  # what the messages name
    res = train_in_process([*flags, "--save-most-recent", "--resume", "latest", "--epochs", "2"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"=> resuming checkpoint '{named}' (epoch 1)" in res.stderr


# -- a folder that holds a run --------------------------------------------------------------------------------------
def test_hint_of_a_folder_that_holds_a_run_both_ways_on_work(tmp_path):
    logs = tmp_path / "logs"
    flags = [*SYNTHETIC, "--logs", str(logs), "--name", "x", "--epochs", "1"]
    assert train_in_process(flags).returncode == 0
    # the same command again: the run has trained every epoch asked for, so no --resume latest is offered
    finished = train_in_process(flags)
    assert finished.returncode == 2
    line = finished.stderr.strip().splitlines()[-1]
    assert line.startswith(f"clip-dcl train: error: {logs / 'x'} holds a finished run (all 1 epochs"), line
    assert "to train it further, raise --epochs above 1 and add --resume latest" in line
    assert "to continue it" not in line
    # with epochs left: continuing is offered
    refused = train_in_process([*flags, "--epochs", "2"])
    assert refused.returncode == 2
    line = refused.stderr.strip().splitlines()[-1]
    assert line.startswith(f"clip-dcl train: error: {logs / 'x'} already holds a run"), refused.stderr[-3000:]
    assert "{}" not in refused.stderr and "Experiment already exists" not in refused.stderr
    assert (logs / "x" / "out.log").read_text().count("Running with a single process") == 1  # nothing appended
    resume = re.search(r"to continue it, run the same command with (--resume latest);", line).group(1)
    name = re.search(r"give another --name \(e\.g\. (--name \S+)\)", line).group(1)
    again = train_in_process([*flags, *resume.split(), "--epochs", "2"])
    assert again.returncode == 0 and "=> resuming checkpoint" in again.stderr, again.stderr[-3000:]
    other = train_in_process([*flags, *name.split()])
    assert other.returncode == 0, other.stderr[-3000:]
    assert (logs / "x-2" / "checkpoints" / "epoch_1.pt").exists()


def test_hint_of_an_unnamed_run_names_it():
    import argparse

    from clip_dcl.train.flags import TrainConfig
    from clip_dcl.train.run import TrainingRun

    run = TrainingRun(TrainConfig("dcl", {}, {}))
    run.args = argparse.Namespace(name="2026_01_01-00_00_00-model_x")
    assert run.rerun("--resume latest") == "the same command with --resume latest"
    run.named = False  # OpenCLIP made the name up: the same command would make up another
    assert run.rerun("--resume latest") == "the same command with --name 2026_01_01-00_00_00-model_x --resume latest"
