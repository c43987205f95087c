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


# -- an empty caption -------------------------------------------------------------------------------------------
def test_empty_captions_are_counted_and_skipped_like_missing_ones(tmp_path, caplog):
    import io
    import json
    import logging

    import numpy as np
    import torch
    import webdataset as wds
    from PIL import Image

    from clip_dcl.train.pipeline import get_wds_train_dataset, summary_line
    from test_train import _epoch_batches, _pipeline_args

    (tmp_path / "shards").mkdir()
    captions = {0: "sample 0", 1: "", 2: "  \n ", 3: None, 4: "sample 4", 5: "sample 5"}  # None: no .txt at all
    with wds.TarWriter(str(tmp_path / "shards" / "00000.tar")) as w:
        for k, caption in captions.items():
            buf = io.BytesIO()
            Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(buf, format="PNG")
            sample = {"__key__": f"{k:09d}", "png": buf.getvalue(), "json": json.dumps({"key": f"{k:09d}"}).encode()}
            if caption is not None:
                sample["txt"] = caption
            w.write(sample)
    (tmp_path / "shards" / "sizes.json").write_text(json.dumps({"00000.tar": len(captions)}))
    caplog.set_level(logging.WARNING)
    info = get_wds_train_dataset(_pipeline_args(str(tmp_path / "shards" / "00000.tar"), workers=0, batch_size=1),
                                 lambda img: torch.zeros(1), tokenizer=lambda text: [torch.tensor(len(text))])
    seen = {int(ids) for _, _, ids in _epoch_batches(info, 0)}
    assert seen == {0, 4, 5}  # never trained on an empty string
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for k in (1, 2):
        assert any(f"'{k:09d}'" in m and "empty caption (.txt holds no caption)" in m for m in warnings), warnings
    assert any("'000000003'" in m and "no caption (.txt)" in m for m in warnings), warnings
    report = info.dataloader.data_stats.collect(0)
    assert report["counts"]["empty caption"] >= 2 and report["counts"]["no caption"] >= 1
    line = summary_line(0, report)
    assert "empty caption" in line and "no caption" in line, line
