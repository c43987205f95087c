"""Fine-tuning: ``--pretrained`` from an OpenCLIP checkpoint file, with each objective (docs/training.md).

The pretrained file is a plain OpenCLIP checkpoint (``{"state_dict": ...}``) of the tiny model whose
logit scale was set to 50, far from a fresh model's 1/0.07: the first step's logged scale (a small
warm-up learning rate moves it little) says the weights were loaded, not re-initialised.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from conftest import train_in_process

pytestmark = pytest.mark.slow
SCALE = 50.0


@pytest.fixture(scope="module")
def pretrained_file(trained_run, tmp_path_factory):
    ckpt = torch.load(trained_run("clip") / "checkpoints" / "epoch_1.pt", map_location="cpu", weights_only=True)
    state = {k.removeprefix("module."): v for k, v in ckpt["state_dict"].items()}
    state["logit_scale"] = torch.tensor(math.log(SCALE))
    path = tmp_path_factory.mktemp("pretrained") / "openclip_tiny.pt"
    torch.save({"state_dict": state}, path)
    return path


@pytest.mark.parametrize("loss", ["clip", "dcl", "decl"])
def test_pretrained_checkpoint_file_fine_tunes_with_each_loss(pretrained_file, tmp_path, loss):
    res = train_in_process(
        [
            "--model",
            "clip-dcl-tiny",
            "--pretrained",
            pretrained_file,
            "--dataset-type",
            "synthetic",
            "--train-num-samples",
            "32",
            "--batch-size",
            "16",
            "--epochs",
            "1",
            "--warmup",
            "2",
            "--lr",
            "1e-4",
            "--device",
            "cpu",
            "--precision",
            "fp32",
            "--workers",
            "0",
            "--log-every-n-steps",
            "1",
            "--report-to",
            "",
            "--logs",
            tmp_path,
            "--name",
            loss,
            "--loss",
            loss,
        ]
    )
    assert res.returncode == 0, res.stderr[-3000:]
    log = (tmp_path / loss / "out.log").read_text()
    assert f"Loading full pretrained weights from: {pretrained_file}" in log
    first_scale = float(re.search(r"Logit Scale: ([0-9.]+)", log).group(1))
    assert first_scale == pytest.approx(SCALE, abs=0.01)
    state = torch.load(tmp_path / loss / "checkpoints" / "epoch_1.pt", map_location="cpu", weights_only=True)
    assert state["state_dict"]["logit_scale"].exp().item() == pytest.approx(
        SCALE, rel=0.01
    )  # a small lr moved it little
