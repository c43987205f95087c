"""Training through OpenCLIP's loop: flags, sample ids, loss state in checkpoints, logs.

The fast tests check the pieces in-process (the training pipeline, the id channel around
OpenCLIP's own ``train_one_epoch``, flag validation); the ``slow`` ones train on tiny shards
written here, on CPU, in the test's process (``clip_dcl.train.main``) and once through
``python -m clip_dcl.train``.
"""

from __future__ import annotations

import io
import json
import logging
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset as wds
from conftest import train_in_process, train_run
from PIL import Image

from clip_dcl.losses.base import LossDeclaration
from clip_dcl.train import main


# -- data written by the tests ----------------------------------------------------------------------
def write_shards(out: Path, keys_per_shard, corrupt_image=(), no_caption=()):
    """img2dataset-style shards: ``{key}.jpg`` (64x64 noise), ``.txt`` ``"sample <key>"``, ``.json``.

    Returns the brace pattern of the shards. ``sizes.json`` counts the samples written.
    """
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    sizes = {}
    for s, keys in enumerate(keys_per_shard):
        name = f"{s:05d}.tar"
        with wds.TarWriter(str(out / name)) as w:
            for k in keys:
                key = f"{k:09d}"
                buf = io.BytesIO()
                Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buf, format="JPEG")
                sample = {
                    "__key__": key,
                    "jpg": buf.getvalue(),
                    "txt": f"sample {k}",
                    "json": json.dumps({"key": key, "caption": f"sample {k}"}).encode(),
                }
                if k in corrupt_image:
                    sample["jpg"] = b"not a jpeg at all"
                if k in no_caption:
                    del sample["txt"]
                w.write(sample)
        sizes[name] = len(keys)
    (out / "sizes.json").write_text(json.dumps(sizes))
    return str(out / f"{{00000..{len(keys_per_shard) - 1:05d}}}.tar")


def dense_keys(num_shards=4, per_shard=16):
    return [list(range(s * per_shard, (s + 1) * per_shard)) for s in range(num_shards)]


def gapped_keys(num_shards=4, per_shard=16):
    """img2dataset's scheme for shards of 100 tried downloads of which ``per_shard`` succeeded."""
    return [[s * 100 + i for i in range(per_shard)] for s in range(num_shards)]


# -- the training pipeline ----------------------------------------------------------------------------
def _pipeline_args(pattern, *extra, workers=2, batch_size=16):
    from open_clip_train.params import parse_args

    args = parse_args(
        [
            "--train-data",
            pattern,
            "--dataset-type",
            "webdataset",
            "--batch-size",
            str(batch_size),
            "--workers",
            str(workers),
            *extra,
        ]
    )
    args.world_size, args.rank, args.decl_num_samples = 1, 0, None
    return args


def _caption_number(text):
    return [torch.tensor(int(text.split()[-1]))]


def _epoch_batches(info, epoch):
    info.set_epoch(epoch)
    return [(images, texts, ids) for images, texts, ids in info.dataloader]


def test_train_pipeline_ids_stay_aligned_across_workers_and_epochs(tmp_path):
    from clip_dcl.train.pipeline import get_wds_train_dataset

    keys_per_shard = gapped_keys()
    pattern = write_shards(tmp_path / "shards", keys_per_shard)
    all_keys = sorted(k for keys in keys_per_shard for k in keys)
    # The "image" is a constant and the "text" is the number in the caption, so texts == ids means aligned rows.
    info = get_wds_train_dataset(
        _pipeline_args(pattern), lambda img: torch.zeros(1), epoch=0, tokenizer=_caption_number
    )
    assert info.dataloader.num_batches == 4
    orders = []
    for epoch in (0, 1):
        batches = _epoch_batches(info, epoch)
        assert len(batches) == 4
        for _, texts, ids in batches:
            assert ids.dtype == torch.long and ids.shape == (16,)
            assert torch.equal(texts, ids)
        seen = torch.cat([ids for _, _, ids in batches]).tolist()
        assert sorted(seen) == all_keys  # every sample once per epoch
        orders.append(seen)
    assert orders[0] != orders[1]  # reshuffled per epoch
    # A fresh pipeline started at epoch 1 (a resumed run) yields the same order as the first one's epoch 1.
    fresh = get_wds_train_dataset(
        _pipeline_args(pattern), lambda img: torch.zeros(1), epoch=1, tokenizer=_caption_number
    )
    assert torch.cat([ids for _, _, ids in _epoch_batches(fresh, 1)]).tolist() == orders[1]


def test_train_pipeline_resampled_ids_stay_aligned(tmp_path):
    from clip_dcl.train.pipeline import get_wds_train_dataset

    keys_per_shard = gapped_keys()
    pattern = write_shards(tmp_path / "shards", keys_per_shard)
    info = get_wds_train_dataset(
        _pipeline_args(pattern, "--dataset-resampled"), lambda img: torch.zeros(1), tokenizer=_caption_number
    )
    batches = _epoch_batches(info, 0)
    assert len(batches) == 4
    for _, texts, ids in batches:
        assert torch.equal(texts, ids)
        assert set(ids.tolist()) <= {k for keys in keys_per_shard for k in keys}


def test_train_pipeline_logs_and_skips_corrupt_samples(tmp_path, caplog):
    from clip_dcl.train.pipeline import get_wds_train_dataset

    keys_per_shard = dense_keys(num_shards=2, per_shard=8)
    pattern = write_shards(tmp_path / "shards", keys_per_shard, corrupt_image={3}, no_caption={10})
    caplog.set_level(logging.WARNING)
    info = get_wds_train_dataset(
        _pipeline_args(pattern, workers=0, batch_size=1), lambda img: torch.zeros(1), tokenizer=_caption_number
    )
    seen = [int(ids) for _, _, ids in _epoch_batches(info, 0)]
    # 16 batches of 1 from 14 good samples: the epoch restarts the shards to fill up, as OpenCLIP's does
    assert len(seen) == 16 and set(seen) == set(range(16)) - {3, 10}
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("'000000010'" in m and "no caption" in m for m in messages), messages
    assert any(
        "'000000003' in" in m and "00000.tar: undecodable image (UnidentifiedImageError" in m for m in messages
    ), messages


# -- ids around OpenCLIP's own train_one_epoch --------------------------------------------------------
class _Toy(torch.nn.Module):
    """Features = inputs (times a trainable 1), so feature column 0 is the sample id put there."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(()))
        self.logit_scale = torch.nn.Parameter(torch.tensor(0.0))

    def forward(self, images, texts):
        return {
            "image_features": images * self.w,
            "text_features": texts.float() * self.w,
            "logit_scale": self.logit_scale.exp(),
        }


class _RecordingLoss(LossDeclaration, torch.nn.Module):
    requires_sample_ids = True
    num_samples = 10_000

    def __init__(self):
        super().__init__()
        self.calls = []
        self.metrics = {}

    def forward(self, image_features, text_features, logit_scale, logit_bias=None, output_dict=False, sample_ids=None):
        self.calls.append((image_features[:, 0].detach().long().clone(), sample_ids.clone()))
        self.metrics = {"rows": torch.tensor(float(len(sample_ids)))}
        value = (image_features * 0).sum() + (text_features * 0).sum() + 1.0
        return {"toy_loss": value} if output_dict else value


class _Loader:
    def __init__(self, batches):
        self.batches, self.num_batches, self.num_samples = batches, len(batches), sum(len(b[2]) for b in batches)

    def __iter__(self):
        return iter(self.batches)


class _Writer:
    def __init__(self):
        self.scalars = []

    def add_scalar(self, name, value, step):
        self.scalars.append((name, value, step))


@pytest.mark.parametrize("accum_freq", [1, 2])
def test_ids_reach_the_loss_aligned_through_openclip_train_one_epoch(accum_freq, caplog):
    from open_clip_train.data import DataInfo
    from open_clip_train.params import parse_args

    from clip_dcl.train.flags import TrainConfig
    from clip_dcl.train.run import TrainingRun

    gen = torch.Generator().manual_seed(0)
    ids = torch.randperm(5000, generator=gen)[:48]
    batches = []
    for b in range(6):
        chunk = ids[b * 8 : (b + 1) * 8]
        images = torch.cat([chunk[:, None].float(), torch.randn(8, 3, generator=gen)], dim=1)
        batches.append((images, torch.zeros(8, 4, dtype=torch.long), chunk))
    args = parse_args(["--accum-freq", str(accum_freq), "--log-every-n-steps", "1", "--batch-size", "8"])
    args.device, args.rank, args.world_size, args.distributed, args.distill, args.wandb = (
        "cpu",
        0,
        1,
        False,
        False,
        False,
    )
    model, loss, writer = _Toy(), _RecordingLoss(), _Writer()
    run = TrainingRun(TrainConfig("decl", {}, {}))
    caplog.set_level(logging.INFO)
    run.train_one_epoch(
        model,
        {"train": DataInfo(_Loader(batches))},
        loss,
        3,
        torch.optim.SGD(model.parameters(), 0.1),
        None,
        lambda step: None,
        None,
        args,
        tb_writer=writer,
    )

    assert len(loss.calls) == 6  # accum_freq calls per step, 6 / accum_freq steps
    for c, (feature_ids, sample_ids) in enumerate(loss.calls):
        step = c // accum_freq
        assert torch.equal(feature_ids, sample_ids)  # rows and ids in the same order
        assert torch.equal(sample_ids, ids[step * 8 * accum_freq : (step + 1) * 8 * accum_freq])
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Train Epoch:")]
    assert len(lines) == 6 // accum_freq
    assert all("Toy_loss:" in line and f"Rows: {8.0 * accum_freq:#.5g}" in line for line in lines)
    openclip_steps = [s for name, _, s in writer.scalars if name == "train/loss"]
    assert [s for name, _, s in writer.scalars if name == "train/rows"] == openclip_steps
    assert openclip_steps == [3 * (6 // accum_freq) + i for i in range(6 // accum_freq)]


class _HostReads(torch.Tensor):
    """A tensor that counts its reads into Python numbers (on a GPU each waits for the device)."""

    reads = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.__float__, torch.Tensor.item, torch.Tensor.tolist):
            cls.reads += 1
        return super().__torch_function__(func, types, args, kwargs or {})


class _ToyCountingScale(_Toy):
    def forward(self, images, texts):
        out = super().forward(images, texts)
        out["logit_scale"] = out["logit_scale"].as_subclass(_HostReads)
        return out


def test_the_loop_reads_the_logit_scale_and_the_amp_scale_on_logged_steps_only():
    """OpenCLIP's loop reads the logit scale on logged steps only; a read every step would sync the GPU every step.
    The GradScaler's scale (a read too) is looked at only for a loss whose state an AMP-skipped step must undo."""
    from open_clip_train.data import DataInfo
    from open_clip_train.params import parse_args

    from clip_dcl.losses import create_loss
    from clip_dcl.train.flags import TrainConfig
    from clip_dcl.train.run import TrainingRun
    from clip_dcl.train.steps import SkippedSteps

    batches = [(torch.randn(8, 4), torch.zeros(8, 4, dtype=torch.long), torch.arange(8) + 8 * b) for b in range(6)]
    args = parse_args(["--log-every-n-steps", "4", "--batch-size", "8"])
    args.device, args.rank, args.world_size, args.distributed, args.distill, args.wandb = (
        "cpu",
        0,
        1,
        False,
        False,
        False,
    )
    model = _ToyCountingScale()
    run = TrainingRun(TrainConfig("decl", {}, {}))
    _HostReads.reads = 0
    run.train_one_epoch(
        model, {"train": DataInfo(_Loader(batches))}, _RecordingLoss(), 0,
        torch.optim.SGD(model.parameters(), 0.1), None, lambda step: None, None, args, tb_writer=_Writer(),
    )  # fmt: skip
    assert _HostReads.reads == 3  # of the 6 steps, 0, 4 and 5 (the last) are logged

    class Scaler:
        reads = 0

        def get_scale(self):
            Scaler.reads += 1
            return 1.0

    skipped = SkippedSteps(Scaler(), create_loss("clip"))  # no state to undo
    for step in range(4):
        skipped.check(0, step)
    assert Scaler.reads == 0
    skipped = SkippedSteps(Scaler(), create_loss("decl", num_samples=16))
    for step in range(4):
        skipped.check(0, step)
    assert Scaler.reads == 4  # at the start, then after each of steps 0, 1 and 2


@pytest.mark.parametrize(
    "bad, message",
    [
        (20_000, r"sample id 20000 is outside \[0, num_samples=10\).*set --decl-num-samples above the largest key"),
        (-3, r"sample id -3 is negative: ids index the per-sample rate buffer \[0, num_samples=10\) and must be >= 0$"),
    ],
)
def test_ids_out_of_range_stop_with_the_flag_to_set(bad, message):
    from clip_dcl.losses import create_loss
    from clip_dcl.train.ids import SampleIdOutOfRange
    from clip_dcl.train.loop import LossCall

    f = torch.nn.functional.normalize(torch.randn(2, 4), dim=-1)
    with pytest.raises(SampleIdOutOfRange, match=message):
        LossCall(create_loss("decl", rate="index", num_samples=10), torch.device("cpu"))(
            {"image_features": f, "text_features": f, "logit_scale": torch.tensor(1.0)}, torch.tensor([5, bad])
        )


# -- flags ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "flags, named",
    [
        (["--loss", "dcl", "--tau-plus", "1.5"], "--tau-plus"),
        (["--loss", "decl", "--decl-gamma", "0"], "--decl-gamma"),
        (["--loss", "decl", "--decl-schedule", "constant", "--decl-lambda", "2"], "--decl-lambda"),
        (["--loss", "decl", "--decl-rate", "queue", "--decl-queue-size", "0"], "--decl-queue-size"),
        (["--loss", "decl", "--decl-num-samples", "0"], "--decl-num-samples"),
        (["--loss", "decl", "--decl-rate", "batch", "--decl-gamma-schedule", "cosine"], "--decl-gamma-schedule"),
        (["--loss", "decl", "--decl-gamma-decay-epochs", "2"], "--decl-gamma-decay-epochs"),
        (
            ["--loss", "decl", "--decl-gamma-schedule", "cosine", "--decl-gamma-decay-epochs", "0"],
            "--decl-gamma-decay-epochs",
        ),
        (["--loss", "decl", "--decl-rate", "batch", "--decl-include-current"], "--decl-include-current"),
        (["--loss", "dcl", "--decl-first-visit", "mean"], "--decl-first-visit"),
        (["--loss", "clip", "--decl-state", "replicated"], "--decl-state"),
        (["--loss", "dcl", "--no-grad-gather"], "--local-loss"),
        (["--loss", "decl", "--no-grad-gather", "--local-loss", "--gather-with-grad"], "--gather-with-grad"),
        (["--loss", "clip", "--no-grad-gather", "--local-loss", "--siglip"], "--siglip"),
        (["--loss", "decl", "--no-grad-gather", "--local-loss", "--model", "coca_ViT-B-32"], "CoCa"),
        (["--loss", "decl", "--decl-state", "everywhere"], "everywhere"),
        (["--loss", "decl", "--decl-state-dtype", "int8"], "int8"),
        (["--loss", "decl", "--tau-plus", "0.1"], "--tau-plus"),
        (["--loss", "dcl", "--siglip"], "--siglip"),
        (["--model-config", "/nonexistent/cfg.json"], "/nonexistent/cfg.json"),
    ],
)
def test_bad_flag_values_fail_before_any_work(tmp_path, capsys, flags, named):
    pattern = write_shards(tmp_path / "shards", dense_keys(num_shards=1, per_shard=2))
    logs = tmp_path / "logs"
    rc = main(["--train-data", pattern, "--logs", str(logs), "--device", "cpu", *flags])
    err = capsys.readouterr().err
    assert rc == 2
    assert named in err
    assert not logs.exists()  # OpenCLIP never started


def test_decl_index_without_buffer_size_names_the_flag(tmp_path, capsys):
    pattern = write_shards(tmp_path / "shards", dense_keys(num_shards=1, per_shard=2))
    (tmp_path / "shards" / "sizes.json").unlink()
    assert main(["--train-data", pattern, "--loss", "decl", "--decl-rate", "index", "--train-num-samples", "2"]) == 2
    assert "--decl-num-samples" in capsys.readouterr().err


def test_argparse_errors_exit_nonzero(capsys):
    assert main(["--loss", "nonsense"]) == 2
    assert "nonsense" in capsys.readouterr().err
    assert main(["--decl-gamma", "high"]) == 2
    assert "high" in capsys.readouterr().err


SYNTHETIC_RUN = [
    "--model",
    "clip-dcl-tiny",
    "--dataset-type",
    "synthetic",
    "--train-num-samples",
    "16",
    "--batch-size",
    "8",
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


@pytest.mark.parametrize(
    "words, line",
    [
        # OpenCLIP's parser would take --los for --loss-dist-impl and train the default loss
        (
            ["--los", "decl"],
            "--los is not a flag (flags are spelled out in full); it could mean --loss, --loss-dist-impl, "
            "--loss-reset, --loss-tile",
        ),
        (["--decl-ra", "index"], "--decl-ra is not a flag (flags are spelled out in full); it could mean --decl-rate"),
        (
            ["--mod=clip-dcl-tiny"],
            "--mod is not a flag (flags are spelled out in full); it could mean --model, --model-config",
        ),
    ],
    ids=["ours-and-openclip", "ours", "with-equals"],
)
def test_a_flag_not_spelled_out_is_refused_naming_what_it_could_mean(tmp_path, capsys, words, line):
    rc = main([*SYNTHETIC_RUN, "--logs", str(tmp_path), "--name", "abbrev", *words])
    assert rc == 2
    assert capsys.readouterr().err.strip() == f"clip-dcl train: error: {line}"
    assert not list(tmp_path.iterdir())  # no run started


def test_a_flag_not_spelled_out_is_refused_by_the_module_command(tmp_path, preloaded):
    res = train_run(
        ["--", *SYNTHETIC_RUN, "--logs", tmp_path, "--name", "abbrev", "--batch-si", "8"],
        cli=preloaded.python,
        timeout=300,
    )
    assert res.returncode == 2
    assert res.stderr.strip() == (
        "clip-dcl train: error: --batch-si is not a flag (flags are spelled out in full); it could mean --batch-size"
    )
    assert not list(tmp_path.iterdir())


def test_openclip_parser_is_caught_whole_and_its_module_left_as_it_was():
    import argparse

    from open_clip_train import params

    from clip_dcl.train.compat import openclip_parser

    parser = openclip_parser()
    assert {"--batch-size", "--loss-dist-impl", "--train-data", "--help"} <= set(parser._option_string_actions)
    assert parser.allow_abbrev  # why the words are checked before it parses them
    assert params.argparse is argparse
    assert params.parse_args(["--batch-size", "3"]).batch_size == 3


def test_flags_resolve_and_pass_openclip_flags_through(tmp_path):
    from clip_dcl.train.flags import parse_train_args

    pattern = write_shards(tmp_path / "shards", dense_keys())
    # --model must reach OpenCLIP whole (with abbreviations it would be taken for --model-config).
    cfg = parse_train_args(
        [
            "--model",
            "clip-dcl-tiny",
            "--train-data",
            pattern,
            "--loss",
            "decl",
            "--accum-freq",
            "2",
            "--seed",
            "7",
            "--decl-schedule",
            "harmonic",
            "--decl-lambda",
            "5",
            "--no-decl-sample-u",
            "--precision",
            "fp32",  # a named precision: no CPU default added
            "--batch-size",
            "16",
        ]
    )
    assert cfg.openclip_argv == [
        "--model",
        "clip-dcl-tiny",
        "--train-data",
        pattern,
        "--accum-freq",
        "2",
        "--seed",
        "7",
        "--precision",
        "fp32",
        "--batch-size",
        "16",
    ]
    assert cfg.num_samples == 64  # sum of sizes.json
    assert cfg.loss_kwargs == {"schedule": "harmonic", "lam": 5.0, "sample_u": False, "accum_freq": 2, "seed": 7}
    assert cfg.loss_args["num_samples"] == 64  # resolved by the loss from the data
    assert cfg.loss_args["rate"] == "index" and cfg.loss_args["lam"] == 5.0  # completed with the loss's defaults
    from clip_dcl.models import tiny_config_path

    custom = tmp_path / "my-model.json"
    custom.write_text(tiny_config_path().read_text())
    cfg = parse_train_args(
        ["--model-config", str(custom), "--train-data", pattern, "--precision", "fp32", "--batch-size", "16"]
    )
    assert cfg.openclip_argv[-2:] == ["--model", "my-model"] and cfg.loss == "clip"
    import open_clip

    assert open_clip.get_model_config("my-model") == json.loads(custom.read_text())


def test_help_lists_openclip_flags_and_ours(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for flag in (
        "--loss",
        "--tau-plus",
        "--decl-rate",
        "--decl-num-samples",
        "--model-config",  # ours
        "--train-data",
        "--accum-freq",
        "--local-loss",
        "--resume",
    ):  # OpenCLIP's
        assert re.search(rf"^\s+{flag}(?:\s|,|$)", out, re.M), flag


def test_cli_dispatches_to_train(capsys):
    from clip_dcl.cli import main as cli_main

    assert cli_main(["train", "--loss", "dcl", "--tau-plus", "-1"]) == 2
    assert "--tau-plus" in capsys.readouterr().err


# -- end to end: shards to checkpoint -------------------------------------------------------------------
def train(tmp_path, name, pattern, *flags, check=True, timeout=300, cli=False):
    """One run on ``pattern``'s shards: in this process, or through ``python -m clip_dcl.train`` with ``cli``
    (conftest's train_run)."""
    argv = [
        "--model",
        "clip-dcl-tiny",
        "--train-data",
        pattern,
        "--dataset-type",
        "webdataset",
        "--batch-size",
        "16",
        "--precision",
        "fp32",
        "--device",
        "cpu",
        "--logs",
        str(tmp_path / "logs"),
        "--name",
        name,
        "--lr",
        "1e-3",
        "--lr-scheduler",
        "const",
        "--warmup",
        "1",
        "--log-every-n-steps",
        "1",
        *flags,
    ]
    out = train_run(argv, cli=cli, timeout=timeout)
    if check:
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    return out


def checkpoint(tmp_path, name, epoch):
    return torch.load(
        tmp_path / "logs" / name / "checkpoints" / f"epoch_{epoch}.pt", map_location="cpu", weights_only=True
    )


def train_lines(tmp_path, name):
    return [line for line in (tmp_path / "logs" / name / "out.log").read_text().splitlines() if "Train Epoch:" in line]


def visited(loss_state):
    """Buffer rows the index rate has written (they start NaN)."""
    return sorted((~torch.isnan(loss_state["log_rate"]).any(0)).nonzero().flatten().tolist())


@pytest.mark.slow
@pytest.mark.parametrize(
    "loss, flags, terms",
    [
        ("clip", [], ["Contrastive_loss:"]),
        ("dcl", ["--tau-plus", "0.1"], ["Dcl_loss:", "Clamp_rate:"]),
        (
            "decl",
            ["--decl-rate", "index", "--workers", "2"],
            ["Decl_loss:", "Term: ", "Lambda_t:", "Mean_log_rate:", "Weight_max:"],
        ),
    ],
)
def test_one_epoch_writes_checkpoint_with_loss_state_and_logs_terms(tmp_path, loss, flags, terms):
    import open_clip

    from clip_dcl.models import register_builtin_configs

    keys_per_shard = dense_keys()
    pattern = write_shards(tmp_path / "shards", keys_per_shard)
    train(tmp_path, loss, pattern, "--epochs", "1", "--loss", loss, *flags)
    ckpt = checkpoint(tmp_path, loss, 1)
    register_builtin_configs()
    assert ckpt["clip_dcl"]["model"] == "clip-dcl-tiny"
    assert ckpt["clip_dcl"]["model_config"] == open_clip.get_model_config("clip-dcl-tiny")
    assert ckpt["clip_dcl"]["loss"] == loss
    assert tuple(ckpt["clip_dcl"]["preprocess_cfg"]["size"]) == (64, 64)
    lines = train_lines(tmp_path, loss)
    assert len(lines) == 4  # 64 samples / batch 16, logged every step
    for term in terms + ["Loss:"]:
        assert all(term in line for line in lines), (term, lines[-1])
    if loss == "dcl":
        assert ckpt["clip_dcl"]["loss_args"] == {
            "tau_plus": 0.1,
            "clamp": "clamp",
            "beta": 0.0,
            "temperature": None,
            "tau_momentum": 0.05,
            "same_class": "positive",
        }
    if loss == "decl":
        state = ckpt["loss_state"]
        assert int(state["calls"]) == 4
        assert ckpt["clip_dcl"]["loss_args"]["num_samples"] == 64 == state["log_rate"].shape[1]  # from sizes.json
        # every row written, exactly once per sample: ids reached the loss from both workers
        assert visited(state) == sorted(k for keys in keys_per_shard for k in keys)
    else:
        assert ckpt["loss_state"] == {}


@pytest.mark.slow
def test_decl_with_accum_freq_2_counts_steps_and_visits_every_key(tmp_path):
    keys_per_shard = gapped_keys()
    pattern = write_shards(tmp_path / "shards", keys_per_shard)
    train(
        tmp_path,
        "accum",
        pattern,
        "--epochs",
        "1",
        "--accum-freq",
        "2",
        "--batch-size",
        "8",
        "--workers",
        "2",
        "--loss",
        "decl",
        "--decl-num-samples",
        "400",
    )
    state = checkpoint(tmp_path, "accum", 1)["loss_state"]
    assert int(state["calls"]) == 8  # 8 micro-batches of 8 -> 4 optimizer steps x 2 loss calls
    assert visited(state) == sorted(k for keys in keys_per_shard for k in keys)
    lines = train_lines(tmp_path, "accum")
    assert len(lines) == 4 and all("Lambda_t:" in line for line in lines)
    # alternate schedule, one lambda per optimizer step: 1, 0, 1, 0
    assert [float(re.search(r"Lambda_t: (\S+)", line).group(1)) for line in lines] == [1.0, 0.0, 1.0, 0.0]
    # the log names the term each step optimised, and leaves out loss1, which update-then-read pins near 1
    assert [re.search(r"Term: (\S+)", line).group(1) for line in lines] == ["loss1", "infonce", "loss1", "infonce"]
    assert not any("Loss1:" in line or "First_visit_rate:" in line for line in lines)


@pytest.mark.slow
@pytest.mark.parametrize(
    "decl_flags",
    [
        [],
        ["--decl-gamma-schedule", "cosine", "--decl-gamma", "0.2", "--decl-first-visit", "mean"],
        [
            "--decl-estimate",
            "relative",
            "--decl-temperature-mode",
            "rgclg",
            "--decl-gamma-schedule",
            "cosine",
            "--decl-gamma",
            "0.2",
        ],
    ],
    ids=["default", "cosine-mean", "relative-rgclg"],
)
def test_resume_continues_decl_state_exactly(tmp_path, decl_flags):
    pattern = write_shards(tmp_path / "shards", gapped_keys())
    common = ["--loss", "decl", "--decl-num-samples", "400", "--workers", "2", *decl_flags]
    train(tmp_path, "straight", pattern, "--epochs", "2", *common)
    train(tmp_path, "resumed", pattern, "--epochs", "1", *common)
    out = train(tmp_path, "resumed", pattern, "--epochs", "2", "--resume", "latest", *common)
    assert "Restored the decl loss state" in out.stderr
    a, b = checkpoint(tmp_path, "straight", 2), checkpoint(tmp_path, "resumed", 2)
    assert int(a["loss_state"]["calls"]) == int(b["loss_state"]["calls"]) == 8
    assert torch.equal(a["loss_state"]["log_rate"].nan_to_num(-1e9), b["loss_state"]["log_rate"].nan_to_num(-1e9))
    # and the first run's epoch-1 state is not already the final one (the test can fail)
    first = checkpoint(tmp_path, "resumed", 1)["loss_state"]
    assert not torch.equal(first["log_rate"].nan_to_num(-1e9), b["loss_state"]["log_rate"].nan_to_num(-1e9))
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    if decl_flags:  # 64 samples / batch 16 = 4 steps an epoch; the decay defaults to half of --epochs 2
        args = a["clip_dcl"]["loss_args"]
        assert args["gamma_decay_steps"] == 4 and args["gamma_hold_steps"] == 4  # gamma 1 through epoch 1
        assert args["gamma_schedule"] == "cosine"
        lines = train_lines(tmp_path, "straight")
        gammas = [float(re.search(r"Gamma_t: (\S+)", line).group(1)) for line in lines]
        assert gammas[:5] == [1.0] * 5 and gammas == sorted(gammas, reverse=True)
        assert gammas[-1] == pytest.approx(0.2 + 0.8 * (1 + math.cos(math.pi * 3 / 4)) / 2, abs=1e-4)
        assert all("Weight_max:" in line and "Weight_mean:" in line for line in lines)


@pytest.mark.slow
def test_corrupt_samples_are_logged_and_skipped_and_the_run_finishes(tmp_path):
    pattern = write_shards(tmp_path / "shards", dense_keys(), corrupt_image={5}, no_caption={20})
    train(tmp_path, "corrupt", pattern, "--epochs", "1", "--workers", "2", "--loss", "decl")
    log = (tmp_path / "logs" / "corrupt" / "out.log").read_text()
    assert "Skipping sample '000000020'" in log and "no caption" in log
    assert "Skipping sample '000000005'" in log and "undecodable" in log
    assert re.search(
        r"Training data, epoch 0: \d+ samples read, \d+ skipped \(no caption \d+, undecodable image \d+\)", log
    )
    state = checkpoint(tmp_path, "corrupt", 1)["loss_state"]
    assert set(visited(state)) <= set(range(64)) - {5, 20}


@pytest.mark.slow
def test_sample_ids_beyond_the_buffer_stop_the_run_naming_the_flag(tmp_path, preloaded):
    pattern = write_shards(tmp_path / "shards", gapped_keys())  # keys up to 315, sizes.json sums to 64
    # through `python -m clip_dcl.train`: the error line and exit code are the command's
    out = train(
        tmp_path,
        "small",
        pattern,
        "--epochs",
        "1",
        "--workers",
        "0",
        "--loss",
        "decl",
        check=False,
        cli=preloaded.python,
    )
    assert out.returncode == 1
    assert "--decl-num-samples" in out.stderr
    assert not (tmp_path / "logs" / "small" / "checkpoints" / "epoch_1.pt").exists()


def test_openclip_logging_setup_leaves_torch_loggers_alone():
    """OpenCLIP's setup_logging sets every logger to INFO: TorchDynamo would print statistics at exit."""
    import logging

    from clip_dcl.train.compat import setup_logging

    dynamo, other = logging.getLogger("torch._dynamo"), logging.getLogger("clip_dcl_test_user_logger")
    before = dynamo.level
    root_handlers = list(logging.root.handlers)
    try:
        setup_logging(None, logging.INFO)
        assert dynamo.level == before and other.level == logging.INFO
    finally:
        for h in logging.root.handlers[len(root_handlers) :]:
            logging.root.removeHandler(h)
        other.setLevel(logging.NOTSET)


def test_batches_without_ids_name_the_rates_that_need_none():
    from clip_dcl.losses import create_loss
    from clip_dcl.train.ids import MissingSampleIds
    from clip_dcl.train.loop import LossCall, _split

    batch = (torch.zeros(2, 4), torch.zeros(2, 4))  # a data path whose batches are (images, texts) only
    ids = _split(batch)[2]
    f = torch.nn.functional.normalize(torch.randn(2, 4), dim=-1)
    with pytest.raises(MissingSampleIds, match="--decl-rate queue / batch"):
        LossCall(create_loss("decl", rate="index", num_samples=10), torch.device("cpu"))(
            {"image_features": f, "text_features": f, "logit_scale": torch.tensor(1.0)}, ids
        )


def test_synthetic_and_csv_data_size_the_decl_buffer(tmp_path):
    from clip_dcl.train.flags import parse_train_args

    cfg = parse_train_args(["--loss", "decl", "--dataset-type", "synthetic", "--train-num-samples", "300"])
    assert cfg.num_samples == 300 and cfg.loss_args["num_samples"] == 300
    csv = tmp_path / "train.csv"
    csv.write_text("filepath\ttitle\n" + "".join(f"x{i}.png\tcaption {i}\n" for i in range(7)))
    cfg = parse_train_args(["--loss", "decl", "--train-data", str(csv)], check_files=False)
    assert cfg.num_samples == 7
    cfg = parse_train_args(
        ["--loss", "dcl", "--model", "coca_ViT-B-32", "--dataset-type", "synthetic", "--train-num-samples", "8"]
    )
    assert cfg.loss == "dcl"  # CoCa takes our contrastive term


def test_docs_loss_flag_table_is_the_registrys():
    """docs/training.md holds the loss flags' table generated from the registry, so help and docs agree."""
    from clip_dcl.train.loss_flags import loss_flags_table

    docs = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text()
    start = docs.index("<!-- loss flags: generated")
    block = docs[docs.index("\n", start) + 1 : docs.index("<!-- end of the generated loss flags -->")].strip()
    assert block == loss_flags_table(), (
        "regenerate the table in docs/training.md with clip_dcl.train.loss_flags.loss_flags_table()"
    )
    assert "| `--decl-sample-u` / `--no-decl-sample-u` | decl |" in block and block.count("| off |") >= 1


# -- losses that take their arguments from the data ---------------------------------------------------
def _train_in_process(tmp_path, name, *flags):
    """One epoch of ``clip_dcl.train`` in this process on 16 synthetic samples (4 steps of 4)."""
    from clip_dcl.models import TINY_MODEL

    out = train_in_process(
        [
            "--dataset-type",
            "synthetic",
            "--train-num-samples",
            "16",
            "--batch-size",
            "4",
            "--epochs",
            "1",
            "--workers",
            "0",
            "--model",
            TINY_MODEL,
            "--logs",
            tmp_path / "logs",
            "--name",
            name,
            "--report-to",
            "",
            "--seed",
            "0",
            "--warmup",
            "1",
            "--device",
            "cpu",
            *flags,
        ]
    )
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "logs" / name
    params = dict(line.split(": ", 1) for line in (run / "params.txt").read_text().splitlines())
    return params, torch.load(run / "checkpoints" / "epoch_1.pt", map_location="cpu", weights_only=True)


def test_params_and_checkpoint_record_the_resolved_decl_arguments(tmp_path):
    params, ckpt = _train_in_process(
        tmp_path, "cosine", "--loss", "decl", "--decl-gamma-schedule", "cosine", "--decl-gamma-decay-epochs", "0.5"
    )
    recorded = ckpt["clip_dcl"]["loss_args"]
    # 16 samples / batch 4 = 4 steps an epoch: gamma 1 through it, then a decay of half an epoch; one id per sample
    assert (recorded["gamma_hold_steps"], recorded["gamma_decay_steps"], recorded["num_samples"]) == (4, 2, 16)
    assert "gamma_decay_epochs" not in recorded  # turned into steps
    assert params["loss_args"] == str(recorded)


class DataSizedLoss(LossDeclaration, torch.nn.Module):
    """A loss registered by a test: InfoNCE that counts each sample's visits in a buffer sized from the data."""

    requires_sample_ids = True

    @classmethod
    def resolve_data_params(cls, kwargs, data):
        # the steps are unknown while the flags are checked (before the data is loaded)
        return {**kwargs, "num_samples": data.num_samples(), "epoch_steps": data.steps_per_epoch or 1}

    def __init__(self, num_samples=None, epoch_steps=None, **dist_kwargs):
        from clip_dcl.losses.clip import InfoNCEFromStats

        super().__init__()
        if num_samples is None or epoch_steps is None:
            raise ValueError(f"num_samples={num_samples} and epoch_steps={epoch_steps} come from the data")
        self.num_samples, self.epoch_steps = num_samples, epoch_steps
        self.infonce = InfoNCEFromStats(**dist_kwargs)
        self.register_buffer("visits", torch.zeros(num_samples, dtype=torch.long))

    def forward(self, image_features, text_features, logit_scale, logit_bias=None, output_dict=False, sample_ids=None):
        if self.training:
            self.visits.index_add_(0, sample_ids, torch.ones_like(sample_ids))
        return self.infonce(image_features, text_features, logit_scale, logit_bias, output_dict=output_dict)


@pytest.fixture
def data_sized_loss():
    from clip_dcl.losses import LOSSES, register_loss, unregister_loss

    register_loss("data-sized")(DataSizedLoss)
    try:
        yield "data-sized"
    finally:
        unregister_loss("data-sized")
    assert "data-sized" not in LOSSES


def test_a_registered_loss_sizes_itself_from_the_data_with_no_trainer_change(tmp_path, data_sized_loss):
    params, ckpt = _train_in_process(tmp_path, "toy", "--loss", data_sized_loss)
    assert ckpt["clip_dcl"]["loss"] == data_sized_loss
    assert ckpt["clip_dcl"]["loss_args"] == {"num_samples": 16, "epoch_steps": 4}  # resolved, not the check's 1
    assert params["loss_args"] == str({"num_samples": 16, "epoch_steps": 4})
    assert ckpt["loss_state"]["visits"].tolist() == [1] * 16  # the synthetic indices reached it, each once


def test_a_second_run_in_the_same_process_writes_only_its_own_log(tmp_path):
    """OpenCLIP adds a stderr and an ``out.log`` handler to the root logger on every run; each run
    removes and closes its own, so the first run's log does not grow with the second's."""
    before = list(logging.root.handlers)
    first, _ = _train_in_process(tmp_path, "first", "--loss", "clip")
    assert logging.root.handlers == before
    size = (tmp_path / "logs" / "first" / "out.log").stat().st_size
    _train_in_process(tmp_path, "second", "--loss", "clip")
    assert logging.root.handlers == before
    assert (tmp_path / "logs" / "first" / "out.log").stat().st_size == size
    assert "Train Epoch:" in (tmp_path / "logs" / "second" / "out.log").read_text()


def test_a_finished_run_leaves_no_data_loader_worker_behind(tmp_path, monkeypatch):
    """The persistent workers of a finished run are shut down when it returns: left to the garbage collector,
    they were found during a later run in the same process with their queues closed, and each cost a 5 s wait
    before it was killed (and PyTorch's 'DataLoader worker exited unexpectedly' at exit)."""
    import gc
    import multiprocessing

    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    from clip_dcl.train import exits

    scans = []  # the run's own loaders are watched: it stops their workers without a scan of the whole heap
    real = gc.get_objects
    monkeypatch.setattr(exits.gc, "get_objects", lambda *a: scans.append(1) or real(*a))
    pattern = write_shards(tmp_path / "shards", gapped_keys())
    train(tmp_path, "x", pattern, "--epochs", "1", "--workers", "2", "--loss", "clip")
    monkeypatch.undo()
    live = [o for o in gc.get_objects() if type(o) is _MultiProcessingDataLoaderIter and not o._shutdown]
    assert live == [], [[w.pid for w in it._workers] for it in live]
    assert multiprocessing.active_children() == [] and scans == []
