"""The training log's per-epoch floor warning: a loss's ``epoch_warning`` over the epoch's mean metrics.

Driven directly through the trainer's loss call (:class:`clip_dcl.train.loop.LossCall` and
:func:`clip_dcl.train.steps.log_epoch_health`), and once through a tiny training.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from conftest import train_in_process
from open_clip.loss import ClipLoss
from test_dcl_same_class import features, paired

from clip_dcl.losses import create_loss
from clip_dcl.train.loop import LossCall
from clip_dcl.train.steps import log_epoch_health

MASTER = SimpleNamespace(rank=0)


def epoch(loss, batches, caplog, args=MASTER, number=4):
    """Call ``loss`` on each ``(f, g)`` as one epoch's training calls; return (message, warning lines)."""
    wrapped = LossCall(loss, device=torch.device("cpu"))
    for f, g in batches:
        wrapped({"image_features": f, "text_features": g, "logit_scale": torch.tensor(30.0)}, None)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        message = log_epoch_health(loss, wrapped, number, args)
    return message, [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def floored():
    return paired(64, dtype=torch.float32)  # the paper's estimate floors every row here (tau_plus 0.05)


def clean():
    return features(64, d=256, dtype=torch.float32)  # random features: no row floored at tau_plus 0.05


def test_a_floored_epoch_logs_one_line_naming_the_epoch_the_fraction_and_the_settings(caplog):
    message, lines = epoch(create_loss("dcl", tau_plus=0.05), [floored()] * 3, caplog)
    assert lines == [f"Epoch 4: {message}"]
    assert "100.0% of the anchor rows" in message
    for setting in ("--dcl-same-class top", "a smaller --tau-plus (now 0.05)", "--dcl-clamp biased"):
        assert setting in message


def test_the_fraction_is_the_mean_over_the_whole_epoch(caplog):
    """3 of 4 calls floored: 75 % warns; 2 of 4 (half, not more) does not."""
    loss = create_loss("dcl", tau_plus=0.05)
    clean_rate = float((loss(*clean(), torch.tensor(30.0)), loss.metrics["clamp_rate"])[1])
    assert clean_rate == 0.0
    message, lines = epoch(loss, [floored(), clean(), floored(), floored()], caplog)
    assert len(lines) == 1 and "75.0% of the anchor rows" in message
    assert epoch(loss, [floored(), clean(), clean(), floored()], caplog) == (None, [])


def test_no_warning_for_top_other_ranks_or_losses_without_a_check(caplog):
    assert epoch(create_loss("dcl", tau_plus=0.05, same_class="top"), [floored()] * 2, caplog) == (None, [])
    assert epoch(create_loss("dcl", tau_plus=0.05), [floored()], caplog, SimpleNamespace(rank=1)) == (None, [])
    assert epoch(ClipLoss(), [floored()], caplog) == (None, [])
    assert epoch(create_loss("decl", rate="batch"), [floored()], caplog) == (None, [])


def test_the_settings_named_are_the_ones_not_in_use():
    message = create_loss("dcl", tau_plus=0.05, same_class="top", clamp="biased").epoch_warning({"clamp_rate": 0.9})
    assert "a smaller --tau-plus (now 0.05)" in message and "fell back to InfoNCE" in message
    assert "--dcl-same-class top" not in message and "--dcl-clamp biased" not in message
    auto = create_loss("dcl", tau_plus="auto").epoch_warning({"clamp_rate": 0.6})
    assert "a smaller --tau-plus," in auto and "--dcl-same-class top" in auto
    assert create_loss("dcl").epoch_warning({"clamp_rate": 0.5}) is None
    assert create_loss("dcl").epoch_warning({}) is None


@pytest.mark.slow
def test_a_training_logs_the_warning_once_per_epoch(tmp_path, monkeypatch):
    """Two epochs of the tiny model with a threshold every epoch exceeds: one line each, after the epoch."""
    import clip_dcl.losses.dcl as dcl

    monkeypatch.setattr(dcl, "FLOOR_WARNING_RATE", -1.0)
    res = train_in_process(
        [
            "--model",
            "clip-dcl-tiny",
            "--dataset-type",
            "synthetic",
            "--train-num-samples",
            "32",
            "--batch-size",
            "16",
            "--epochs",
            "2",
            "--precision",
            "fp32",
            "--device",
            "cpu",
            "--workers",
            "1",
            "--lr",
            "1e-3",
            "--warmup",
            "1",
            "--log-every-n-steps",
            "1",
            "--seed",
            "0",
            "--report-to",
            "",
            "--logs",
            tmp_path,
            "--name",
            "floor",
            "--loss",
            "dcl",
            "--tau-plus",
            "0.05",
        ]
    )
    assert res.returncode == 0, res.stderr[-5000:]
    log = (tmp_path / "floor" / "out.log").read_text().splitlines()
    warnings = [line for line in log if "of the anchor rows sat at the floor" in line]
    assert [("Epoch 0: dcl:" in w, "Epoch 1: dcl:" in w) for w in warnings] == [(True, False), (False, True)]
    # logged after the epoch's last step
    assert log.index(warnings[0]) > max(i for i, line in enumerate(log) if "Train Epoch: 0" in line)
