"""What must be refused rather than silently accepted: a step of fewer than 2 pairs (every loss, before any
work), an empty caption (counted and skipped like a missing one), the export of non-finite weights, and a
non-finite ``logit_scale`` at evaluation."""
from __future__ import annotations

import pytest

from clip_dcl.train import main

SYNTHETIC = ["--model", "clip-dcl-tiny", "--dataset-type", "synthetic", "--train-num-samples", "16", "--epochs", "1",
             "--precision", "fp32", "--device", "cpu", "--workers", "0", "--report-to", ""]


# -- a step of fewer than 2 pairs ---------------------------------------------------------------------------
@pytest.mark.parametrize("loss", ["clip", "dcl", "decl"])
def test_batch_of_one_pair_is_refused_for_every_loss_before_any_work(tmp_path, capsys, loss):
    rc = main([*SYNTHETIC, "--batch-size", "1", "--loss", loss, "--logs", str(tmp_path), "--name", "b1"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.strip() == ("clip-dcl train: error: --batch-size 1: a contrastive loss needs at least 2 pairs a step, "
                           "and --batch-size 1 x --accum-freq 1 x 1 rank(s) gives 1: give --batch-size 2 or more")
    assert not list(tmp_path.iterdir())  # nothing made: no run folder, no log


@pytest.mark.parametrize("extra, env", [(["--accum-freq", "2"], {}), ([], {"WORLD_SIZE": "2"})],
                         ids=["two-micro-batches", "two-ranks"])
def test_one_pair_per_batch_is_enough_when_the_step_scores_two(monkeypatch, extra, env):
    from clip_dcl.train.flags import parse_train_args

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    config = parse_train_args([*SYNTHETIC, "--batch-size", "1", "--loss", "clip", *extra])
    assert config is not None and config.loss == "clip"


def test_evaluation_alone_takes_any_batch_size(tmp_path):
    from clip_dcl.train.flags import parse_train_args

    val = tmp_path / "val.csv"
    val.write_text("filepath\ttitle\n")
    assert parse_train_args(["--val-data", str(val), "--dataset-type", "csv", "--batch-size", "1"]) is not None
