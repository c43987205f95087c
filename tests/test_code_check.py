"""benchmarks/code_check.py: what makes two trees' runs the same, and its refusals."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import code_check as cc  # noqa: E402


def child_result(losses=("0.5 (0.6)", "0.4 (0.5)"), r1=0.3, digest="d1", flags=("--loss", "clip")):
    run = {"commit": "x", "flags": list(flags), "validation": {"r1": r1}, "test": {"r1": r1}, "losses": list(losses)}
    return {"data_digest": digest, "data": {"seed": 0}, "runs": {"clip": run}}


def test_identical_needs_the_same_data_losses_scores_and_flags():
    assert cc.compare(child_result(), child_result())["identical"]
    for other in (
        child_result(losses=("0.5 (0.6)", "0.41 (0.5)")),
        child_result(r1=0.31),
        child_result(digest="d2"),
        child_result(flags=("--loss", "dcl")),
    ):
        assert not cc.compare(child_result(), other)["identical"]
    assert not cc.compare(child_result(losses=()), child_result(losses=()))["identical"]  # nothing logged: no proof


def test_logged_losses_are_read_as_written_and_the_digest_ignores_the_summary(tmp_path):
    log = tmp_path / "out.log"  # a tree older than metrics.jsonl
    log.write_text(
        "x | Train Epoch: 1 Contrastive_loss: 0.50041 (0.60401) Loss: 0.50041 (0.60401)\n"
        "x | Train Epoch: 2 Loss: 0.40000 (0.55000) Term: loss1\n"
        "x | Train Epoch: 3 Decl_loss: 1.0000 (0.9000) Loss: 2.7726 (2.7726) Term: loss1\n"
    )
    # the optimised total: a term's column (decl's Loss is its InfoNCE value), else Loss
    old = cc.logged_losses(tmp_path)
    assert old == ["0.50041", "0.40000", "1.0000"]
    records = [
        {"kind": "train", "contrastive_loss": 0.50041, "loss": 0.50041},
        {"kind": "val", "clip_val_loss": 3.0},
        {"kind": "train", "loss": 0.4, "term": "loss1"},
        {"kind": "train", "decl_loss": 1.0, "loss": 2.7726, "loss1": 1.0, "term": "loss1"},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert cc.logged_losses(tmp_path) == old  # the same digits from the records
    (tmp_path / "summary.json").write_text('{"seconds": 1}')
    before = cc.data_digest(tmp_path)
    (tmp_path / "summary.json").write_text('{"seconds": 2}')
    assert cc.data_digest(tmp_path) == before
    log.write_text("changed")
    assert cc.data_digest(tmp_path) != before


def test_bad_arguments_stop_before_any_work(tmp_path):
    with pytest.raises(SystemExit, match="--against COMMIT is required"):
        cc.main(["--results", str(tmp_path)])
    with pytest.raises(SystemExit, match="unknown objective"):
        cc.main(["--against", "HEAD", "--objectives", "nope", "--results", str(tmp_path)])
    with pytest.raises(SystemExit, match="--epochs and --batch-size must be >= 1, got 0"):
        cc.main(["--against", "HEAD", "--epochs", "0", "--results", str(tmp_path)])
    assert not any(tmp_path.iterdir())
