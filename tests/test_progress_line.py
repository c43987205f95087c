"""The demo's and benchmarks' echo of OpenCLIP's progress lines."""
from __future__ import annotations

from clip_dcl.experiment import runner

DECL = ("2026-11-25,15:39:50 | INFO | Train Epoch: 0 [ 7808/12032 (65%)] Data (t): 0.013 Batch (t): 3.483, "
        "32.7461/s, 32.7461/s/gpu LR: 0.000969 Logit Scale: 14.445 Decl_loss: 1.0000 (2.0247) Loss: 1.0000 (2.0247) "
        "Term: loss1 Lambda_t: 1.0000 (0.53846) Loss2: 2.4813 (3.3175) Mean_log_rate: -2.4754 (-1.5931)")
CLIP = ("2026-11-25,15:39:50 | INFO | Train Epoch: 1 [ 7808/12032 (65%)] Data (t): 0.013 Batch (t): 3.483, "
        "32.7461/s, 32.7461/s/gpu LR: 0.000969 Logit Scale: 14.445 Contrastive_loss: 2.1000 (2.0247) "
        "Loss: 2.1000 (2.0247)")


def test_a_decl_line_names_its_term_and_the_infonce_it_estimates():
    line = runner.progress_line("decl", runner._PROGRESS.search(DECL), DECL, 4, 12.3)
    assert line == "  [decl] epoch 1/4  65%  loss 1.0000 (loss1 step), InfoNCE 2.4813  (12 s)"


def test_a_clip_line_is_the_loss_alone():
    line = runner.progress_line("clip", runner._PROGRESS.search(CLIP), CLIP, 4, 3.0)
    assert line == "  [clip] epoch 2/4  65%  loss 2.1000  (3 s)"
