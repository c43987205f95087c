"""benchmarks/loss_speed.py: the report it writes and the flags it refuses (timings themselves are not tested)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import loss_speed  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_precision():
    yield
    loss_speed.PRECISION = "fp32"
    loss_speed.PYTHON = sys.executable


@pytest.mark.slow  # a child process per loss for its peak memory
def test_a_bf16_autocast_run_reports_every_loss_against_clip_on_the_devices_asked(tmp_path, preloaded):
    # the children start from the preloaded python: their memory figures are not what this test reads (a forked
    # child's peak starts at its parent's), the report's rows and columns are
    loss_speed.PYTHON = preloaded.python
    assert (
        loss_speed.main(
            [
                "--devices",
                "cpu",
                "--batches",
                "64",
                "--rounds",
                "1",
                "--precision",
                "amp_bf16",
                "--output",
                str(tmp_path / "ls.md"),
            ]
        )
        == 0
    )
    doc = json.loads((tmp_path / "ls.json").read_text())
    assert doc["precision"] == "amp_bf16" and doc["devices"] == ["cpu"]
    assert [r["loss"] for r in doc["rows"]] == list(loss_speed.LOSSES) and {r["G"] for r in doc["rows"]} == {64}
    assert all(r["seconds"] > 0 and r["saved_bytes"] > 0 for r in doc["rows"])
    md = (tmp_path / "ls.md").read_text()
    assert "precision amp_bf16 (every forward under bfloat16 autocast)" in md
    assert "| cpu | 64 | clip (OpenCLIP ClipLoss) |" in md and "| 1.00x |" in md


def test_the_step_runs_under_bf16_autocast_only_when_asked():
    seen = []

    def loss_fn(f, g, s, sample_ids=None):
        seen.append(torch.is_autocast_enabled("cpu"))
        return (f * g).sum() * s

    inputs = loss_speed.make_inputs(4, torch.device("cpu"))
    loss_speed.step(loss_fn, *inputs)
    loss_speed.PRECISION = "amp_bf16"
    loss_speed.step(loss_fn, *inputs)
    assert seen == [False, True]


def test_cuda_without_a_gpu_is_refused_naming_the_flag(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        loss_speed.main(["--devices", "cuda", "--batches", "64"])
    assert "--devices cuda: torch.cuda.is_available() is False" in capsys.readouterr().err
