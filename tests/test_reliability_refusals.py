"""What must be refused rather than silently accepted: a step of fewer than 2 pairs (every loss, before any
work), an empty caption (counted and skipped like a missing one), the export of non-finite weights, and a
non-finite ``logit_scale`` at evaluation."""

from __future__ import annotations

import pytest

from clip_dcl.train import main

SYNTHETIC = [
    "--model",
    "clip-dcl-tiny",
    "--dataset-type",
    "synthetic",
    "--train-num-samples",
    "16",
    "--epochs",
    "1",
    "--precision",
    "fp32",
    "--device",
    "cpu",
    "--workers",
    "0",
    "--report-to",
    "",
]


# -- a step of fewer than 2 pairs ---------------------------------------------------------------------------
@pytest.mark.parametrize("loss", ["clip", "dcl", "decl"])
def test_batch_of_one_pair_is_refused_for_every_loss_before_any_work(tmp_path, capsys, loss):
    rc = main([*SYNTHETIC, "--batch-size", "1", "--loss", loss, "--logs", str(tmp_path), "--name", "b1"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.strip() == (
        "clip-dcl train: error: --batch-size 1: a contrastive loss needs at least 2 pairs a step, "
        "and --batch-size 1 x --accum-freq 1 x 1 rank(s) gives 1: give --batch-size 2 or more"
    )
    assert not list(tmp_path.iterdir())  # nothing made: no run folder, no log


@pytest.mark.parametrize(
    "extra, env", [(["--accum-freq", "2"], {}), ([], {"WORLD_SIZE": "2"})], ids=["two-micro-batches", "two-ranks"]
)
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
    from test_train import _epoch_batches, _pipeline_args

    from clip_dcl.train.pipeline import get_wds_train_dataset, summary_line

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
    info = get_wds_train_dataset(
        _pipeline_args(str(tmp_path / "shards" / "00000.tar"), workers=0, batch_size=1),
        lambda img: torch.zeros(1),
        tokenizer=lambda text: [torch.tensor(len(text))],
    )
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


# -- non-finite weights: export and evaluation ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Checkpoints of clip-dcl-tiny: ``nan.pt`` (every weight NaN) and ``scale.pt`` (only its logit_scale NaN)."""
    import open_clip
    import torch

    from clip_dcl.models import register_builtin_configs

    root = tmp_path_factory.mktemp("nonfinite")
    register_builtin_configs()
    state = open_clip.create_model("clip-dcl-tiny").state_dict()
    nan = {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in state.items()}
    torch.save({"epoch": 1, "state_dict": nan, "clip_dcl": {"model": "clip-dcl-tiny"}}, root / "nan.pt")
    scale = dict(state, logit_scale=torch.tensor(float("nan")))
    torch.save({"epoch": 1, "state_dict": scale, "clip_dcl": {"model": "clip-dcl-tiny"}}, root / "scale.pt")
    return root


@pytest.mark.parametrize(
    "name, named",
    [
        ("nan.pt", "weight tensor(s) hold NaN or inf ("),
        ("scale.pt", "1 weight tensor(s) hold NaN or inf (logit_scale)"),
    ],
)
def test_export_refuses_non_finite_weights_and_writes_nothing(checkpoints, tmp_path, capsys, name, named):
    from clip_dcl.checkpoint import export_main

    out = tmp_path / "exported"
    assert export_main([str(checkpoints / name), str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        "\n" not in err
        and err.startswith(f"clip-dcl export: checkpoint {str(checkpoints / name)!r} is not a model to export: ")
        and named in err
    ), err
    assert err.endswith("nothing was written")
    assert not out.exists()


def test_eval_warns_on_a_nan_logit_scale_where_the_score_does_not_depend_on_it(checkpoints, tmp_path, capsys, caplog):
    import logging

    from clip_dcl.data.synth import generate
    from clip_dcl.eval.cli import main as eval_main

    synth = generate(tmp_path / "synth", quick=True, verbose=False)["out_dir"]
    caplog.set_level(logging.WARNING)
    rc = eval_main(
        [
            "zeroshot",
            "--data",
            f"{synth}/zeroshot",
            "--checkpoint",
            str(checkpoints / "scale.pt"),
            "--device",
            "cpu",
            "--no-progress",
        ]
    )
    assert rc == 0  # cosine ranks at CLIP's fixed scale 100: scored
    assert "acc1" in capsys.readouterr().out
    warned = [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "logit_scale" in r.getMessage()
    ]
    assert warned == [
        "clip-dcl eval zeroshot: the model's logit_scale is nan (a training that diverged?); the scores "
        "below do not depend on it (cosine similarities, CLIP's fixed logit scale 100), but the "
        "checkpoint's training did not end well"
    ], warned


def test_eval_refuses_a_nan_logit_scale_where_the_score_depends_on_it(checkpoints, capsys, monkeypatch):
    from clip_dcl.eval import registry
    from clip_dcl.eval.cli import main as eval_main

    monkeypatch.setattr(registry, "_TASKS", dict(registry._TASKS))
    registry.register_task(
        registry.EvalTask(
            name="temperature",
            help="the model's learned temperature",
            description="Reads logit_scale.",
            run=lambda model, preprocess, tokenizer, args, common: registry.TaskResult(
                {"scale": float(model.logit_scale.exp())}, {}
            ),
            uses_logit_scale=True,
        )
    )
    rc = eval_main(["temperature", "--checkpoint", str(checkpoints / "scale.pt"), "--device", "cpu"])
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.err.strip() == (
        "clip-dcl eval temperature: the model's logit_scale is nan (a training that "
        "diverged?), and the scores of clip-dcl eval temperature depend on it: nothing is "
        "scored"
    )
    assert "scale" not in captured.out
