"""A toy stateful loss added by one class and one registration: it trains, resumes and rolls back through the
real trainer (``clip_dcl.train``), which reads only the :class:`~clip_dcl.losses.base.StatefulLoss` contract."""

import torch
from conftest import train_in_process
from test_train import _train_in_process

from clip_dcl.losses import LOSSES, StateBuffer, StatefulLoss, register_loss, unregister_loss
from clip_dcl.losses.base import contrast_rows
from clip_dcl.losses.state import digest_of_state_dict
from clip_dcl.train.steps import SkippedSteps


class RunningMeanLoss(StatefulLoss):
    """InfoNCE that keeps the running mean of its own value over the optimizer steps (two buffers)."""

    def __init__(self, **dist_kwargs):
        super().__init__(**dist_kwargs)
        self.register_buffer("total", torch.zeros((), dtype=torch.float64))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self._before = None

    def state_buffers(self):
        return (StateBuffer("total", torch.float64, ()), StateBuffer("steps", torch.long, ()))

    def rollback_step(self):
        if self._before is None:
            return False
        self.total.fill_(self._before[0])
        self.steps.fill_(self._before[1])
        self._before = None
        return True

    def compute(self, image_features, text_features, logit_scale, logit_bias, sample_ids):
        st = self.stats(image_features, text_features, logit_scale, logit_bias)
        loss = (contrast_rows(st.image.pos, st.image.lse_neg) + contrast_rows(st.text.pos, st.text.lse_neg)) / 2
        if self.training:
            self._before = (float(self.total), int(self.steps))
            self.total += loss.detach().double()
            self.steps += 1
        return loss, {"running_mean": self.total / self.steps.clamp(min=1)}


def _registered():
    register_loss("running-mean")(RunningMeanLoss)
    return "running-mean"


def test_the_toy_loss_trains_and_resumes_through_the_trainer(tmp_path):
    name = _registered()
    try:
        _, ckpt = _train_in_process(tmp_path, "toy", "--loss", name)
        state = ckpt["loss_state"]
        assert int(state["steps"]) == 4  # 16 samples, batch 4: every optimizer step counted once
        assert torch.isfinite(state["total"]) and float(state["total"]) > 0
        log = (tmp_path / "logs" / "toy" / "out.log").read_text()
        assert f"digest {digest_of_state_dict(state)}" in log  # the rank-agreement digest of the contract
        assert "Running_mean:" in log
        out = train_in_process(
            [
                "--dataset-type",
                "synthetic",
                "--train-num-samples",
                "16",
                "--batch-size",
                "4",
                "--epochs",
                "2",
                "--workers",
                "0",
                "--model",
                "clip-dcl-tiny",
                "--logs",
                tmp_path / "logs",
                "--name",
                "toy",
                "--report-to",
                "",
                "--seed",
                "0",
                "--warmup",
                "1",
                "--device",
                "cpu",
                "--loss",
                name,
                "--resume",
                "latest",
            ]
        )
        assert out.returncode == 0, out.stderr[-3000:]
        again = torch.load(tmp_path / "logs" / "toy" / "checkpoints" / "epoch_2.pt", weights_only=True)
        assert int(again["loss_state"]["steps"]) == 8  # the restored state went on counting
        assert float(again["loss_state"]["total"]) > float(state["total"])
    finally:
        unregister_loss(name)
    assert name not in LOSSES


class _Scaler:
    def __init__(self):
        self.scale = 1024.0

    def is_enabled(self):
        return True

    def get_scale(self):
        return self.scale


def test_a_skipped_step_rolls_the_toy_state_back_through_the_trainers_check():
    loss = RunningMeanLoss()
    scaler = _Scaler()
    skipped = SkippedSteps(scaler, loss)
    f = torch.nn.functional.normalize(torch.randn(6, 8, dtype=torch.float64), dim=1)
    g = torch.nn.functional.normalize(torch.randn(6, 8, dtype=torch.float64), dim=1)
    loss(f, g, torch.tensor(10.0))
    skipped.check(0, 1)  # the scale held: the step was taken
    kept = (float(loss.total), int(loss.steps))
    loss(f, g, torch.tensor(10.0))
    scaler.scale = 512.0  # GradScaler lowered its scale: the step just taken was skipped
    skipped.check(0, 2)
    assert (float(loss.total), int(loss.steps)) == kept and skipped.count == 1
    assert loss.state_digest() == digest_of_state_dict(loss.state_dict())
