"""The demo's and benchmarks' echo of a run's training records (``metrics.jsonl``)."""

from __future__ import annotations

from clip_dcl.experiment import runner

DECL = {
    "kind": "train",
    "step": 60,
    "epoch": 0,
    "samples": 7808,
    "samples_per_epoch": 12032,
    "decl_loss": 1.0,
    "loss": 1.0,
    "term": "loss1",
    "lambda_t": 1.0,
    "loss2": 2.4813,
    "mean_log_rate": -2.4754,
}
CLIP = {
    "kind": "train",
    "step": 154,
    "epoch": 1,
    "samples": 7808,
    "samples_per_epoch": 12032,
    "contrastive_loss": 2.1,
    "loss": 2.1,
}


def test_a_decl_record_names_its_term_and_the_infonce_it_estimates():
    line = runner.progress_line("decl", DECL, 4, 12.3)
    assert line == "  [decl] epoch 1/4  65%  loss 1.0000 (loss1 step), InfoNCE 2.4813  (12 s)"


def test_a_clip_record_is_the_loss_alone():
    line = runner.progress_line("clip", CLIP, 4, 3.0)
    assert line == "  [clip] epoch 2/4  65%  loss 2.1000  (3 s)"
