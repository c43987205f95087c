"""A trained run folder holds its metrics as data: one ``metrics.jsonl`` line per logged step and per evaluation,
with the same values as the human log's ``Train Epoch:`` line."""

from __future__ import annotations

import json

import pytest
from test_train_log_columns import last_train_line, logged_columns

from clip_dcl.train.metrics import MetricsWriter, read_metrics

OPENCLIP_SCALARS = {"data_time", "batch_time", "samples_per_second", "samples_per_second_per_gpu", "logit_scale", "lr"}


def test_the_writer_passes_scalars_on_and_writes_one_record_per_flush(tmp_path):
    class Board:
        def __init__(self):
            self.seen = []

        def add_scalar(self, name, value, step):
            self.seen.append((name, value, step))

        def close(self):
            return "closed"

    board = Board()
    writer = MetricsWriter(str(tmp_path / "m.jsonl"), board)
    writer.add_scalar("train/scale", 14.0, 3)
    writer.add_scalar("train/loss", pytest.importorskip("numpy").float32(2.5), 3)
    assert writer.flush(kind="train", step=3)["logit_scale"] == 14.0 and writer.flush() is None
    assert board.seen == [("train/scale", 14.0, 3), ("train/loss", 2.5, 3)] and writer.close() == "closed"
    (record,) = read_metrics(tmp_path / "m.jsonl")
    assert (record["kind"], record["step"], record["loss"]) == ("train", 3, 2.5) and "time" in record
    assert MetricsWriter(None).flush() is None


def test_a_resumed_runs_records_replace_those_of_the_steps_it_repeats(tmp_path):
    steps = [{"kind": "train", "step": s} for s in range(4)] + [
        {"kind": "val", "step": 2, "epoch": 1},
        {"kind": "val", "step": 4, "epoch": 2},
    ]
    resumed = [{"kind": "train", "step": 2, "again": True}, {"kind": "train", "step": 3, "again": True}]
    order = sorted(steps, key=lambda r: (r["step"], r["kind"] == "val")) + resumed
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in order))
    kept = read_metrics(tmp_path)
    assert [(r["kind"], r["step"], "again" in r) for r in kept] == [
        ("train", 0, False),
        ("train", 1, False),
        ("val", 2, False),
        ("train", 2, True),
        ("train", 3, True),
    ]


@pytest.mark.slow
def test_a_decl_run_writes_every_logged_step_with_its_terms_scale_lr_and_columns(trained_run):
    run_dir = trained_run("decl")
    records = read_metrics(run_dir)
    assert [r["kind"] for r in records] == ["train"] * 3  # 48 samples in batches of 16, every step logged
    assert [(r["step"], r["epoch"], r["samples"], r["samples_per_epoch"]) for r in records] == [
        (0, 0, 16, 48),
        (1, 0, 32, 48),
        (2, 0, 48, 48),
    ]
    last = records[-1]
    assert OPENCLIP_SCALARS | {"decl_loss", "loss"} <= set(last)
    # the loss's own columns, as the human line shows them (in its order after OpenCLIP's terms)
    line = last_train_line(run_dir)
    columns = [c.lower() for c in logged_columns(line) if c not in ("Decl_loss", "Loss")]
    assert columns and set(columns) <= set(last) and last["term"] == "loss1"
    assert f"Loss: {last['loss']:#.5g} " in line and f"Decl_loss: {last['decl_loss']:#.5g} " in line
    assert f"Logit Scale: {last['logit_scale']:.3f} " in line and f"LR: {last['lr']:5f} " in line


@pytest.mark.slow
def test_a_validated_run_writes_its_evaluations_and_the_runner_reads_them(tmp_path, monkeypatch, preloaded):
    from clip_dcl import experiment as ex
    from clip_dcl.data.synth import generate

    monkeypatch.setenv("CLIP_DCL_TRAIN_LOCK", "")
    data = generate(tmp_path / "data", quick=True, num_classes=3, train_samples=64, verbose=False)
    budget = ex.Budget(epochs=2, batch_size=32, warmup=1, workers=0, log_every_n_steps=1)
    echoed = []
    res = ex.train(
        ex.Run("clip", ("--loss", "clip")),
        data,
        tmp_path / "runs",
        budget,
        echo=echoed.append,
        device="cpu",
        entry=[preloaded.python, "-m", "clip_dcl.train"],
    )
    val = read_metrics(res.log_dir, "val")
    assert [r["epoch"] for r in val] == [1, 2] and all("clip_val_loss" in r for r in val)
    assert [r["step"] for r in val] == [2, 4]  # the optimizer steps taken when each evaluation ran
    results = [json.loads(x) for x in (res.log_dir / "checkpoints" / "results.jsonl").read_text().splitlines()]
    assert res.val == results  # OpenCLIP's own record of the evaluations, value for value
    losses = [r["loss"] for r in read_metrics(res.log_dir, "train")]
    assert res.curves == {"epoch": [0.5, 1.0, 1.5, 2.0], "loss": losses}
    assert any("validation: image_to_text_R@1" in line for line in echoed)
    assert any(line.startswith("  [clip] epoch 2/2 100%  loss ") for line in echoed)
