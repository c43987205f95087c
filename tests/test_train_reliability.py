"""What a real run meets: wrong paths, torn checkpoints, a changed objective, bad shards, colliding
sample ids, and an OpenCLIP that is not the one the patches were written for."""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import subprocess
import types

import pytest
import torch
from test_train import dense_keys, write_shards

from clip_dcl.train import main


# -- wrong data paths fail before any work -----------------------------------------------------------
@pytest.mark.parametrize("extra", [["--train-num-samples", "320"], []], ids=["with-num-samples", "without"])
def test_a_missing_shard_is_named_before_any_work(tmp_path, capsys, extra):
    logs = tmp_path / "logs"
    rc = main(
        [
            "--train-data",
            "/nonexistent/{00000..00004}.tar",
            "--dataset-type",
            "webdataset",
            "--logs",
            str(logs),
            "--device",
            "cpu",
            *extra,
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "--train-data: '/nonexistent/00000.tar' does not exist (and 4 more of 5)" in err
    assert not logs.exists()


def test_a_missing_val_shard_and_a_missing_source_of_a_join_are_named(tmp_path, capsys):
    pattern = write_shards(tmp_path / "shards", dense_keys(num_shards=2, per_shard=2))
    assert main(["--train-data", pattern, "--val-data", str(tmp_path / "val" / "0.tar"), "--device", "cpu"]) == 2
    assert f"--val-data: '{tmp_path / 'val' / '0.tar'}' does not exist" in capsys.readouterr().err
    joined = f"{pattern}::{tmp_path / 'other' / '00000.tar'}"
    assert main(["--train-data", joined, "--device", "cpu"]) == 2
    assert f"'{tmp_path / 'other' / '00000.tar'}' does not exist" in capsys.readouterr().err


# -- flags that would be ignored ---------------------------------------------------------------------
def test_decl_lambda_with_a_schedule_that_ignores_it_is_refused(tmp_path, capsys):
    pattern = write_shards(tmp_path / "shards", dense_keys(num_shards=1, per_shard=2))
    assert main(["--train-data", pattern, "--loss", "decl", "--decl-lambda", "0.5", "--decl-num-samples", "2"]) == 2
    assert "--decl-lambda 0.5 has no effect with --decl-schedule alternate" in capsys.readouterr().err
    from clip_dcl.train.flags import parse_train_args

    cfg = parse_train_args(
        [
            "--train-data",
            pattern,
            "--loss",
            "decl",
            "--decl-schedule",
            "constant",
            "--decl-lambda",
            "0.5",
            "--decl-num-samples",
            "2",
            "--workers",
            "1",
            "--batch-size",
            "2",
        ]
    )
    assert cfg.loss_kwargs["lam"] == 0.5


# -- resume: the objective, torn checkpoints ---------------------------------------------------------
def _resume_run(loss, tmp_path, latest=False, reset=False):
    from clip_dcl.train.flags import TrainConfig
    from clip_dcl.train.run import TrainingRun

    run = TrainingRun(TrainConfig(loss, {}, {}, loss_reset=reset))
    run.args = argparse.Namespace(checkpoint_path=str(tmp_path), resume=None)
    run.resume_latest = latest
    return run


def _save(path, epoch, loss="decl", loss_args=None):
    torch.save(
        {
            "epoch": epoch,
            "name": "x",
            "state_dict": {},
            "optimizer": {},
            "loss_state": {"calls": torch.tensor(epoch)},
            "clip_dcl": {"model": "m", "loss": loss, "loss_args": loss_args or {}},
        },
        path,
    )


def test_resuming_another_objective_is_refused_with_the_flags_to_add(tmp_path):
    from clip_dcl.train.run import ObjectiveMismatch

    path = str(tmp_path / "epoch_1.pt")
    _save(
        path,
        1,
        "decl",
        {
            "rate": "index",
            "schedule": "harmonic",
            "lam": 5.0,
            "sample_u": True,
            "num_samples": 400,
            "accum_freq": 1,
            "seed": 0,
        },
    )
    run = _resume_run("clip", tmp_path)
    run.args.resume = path
    with pytest.raises(ObjectiveMismatch) as err:
        run.pt_load(path)
    msg = str(err.value)
    assert "resuming it with --loss clip would change the objective" in msg
    assert ("add: --loss decl --decl-schedule harmonic --decl-lambda 5 --decl-sample-u --decl-num-samples 400") in msg
    assert "--loss-reset" in msg
    reset = _resume_run("clip", tmp_path, reset=True)
    assert reset.pt_load(path)["epoch"] == 1 and reset.resumed is None  # the loss state is dropped
    same = _resume_run("decl", tmp_path)
    assert same.pt_load(path)["epoch"] == 1 and int(same.resumed["loss_state"]["calls"]) == 1


def test_resume_latest_passes_over_a_torn_checkpoint(tmp_path, caplog):
    for epoch in (1, 2, 3):
        _save(tmp_path / f"epoch_{epoch}.pt", epoch)
    for epoch in (2, 3):  # the last two saves were killed halfway
        data = (tmp_path / f"epoch_{epoch}.pt").read_bytes()
        (tmp_path / f"epoch_{epoch}.pt").write_bytes(data[: len(data) // 3])
    run = _resume_run("decl", tmp_path, latest=True)
    run.args.resume = str(tmp_path / "epoch_3.pt")  # what OpenCLIP's --resume latest picks
    caplog.set_level(logging.WARNING)
    ckpt = run.pt_load(run.args.resume)
    assert ckpt["epoch"] == 1 and run.args.resume == str(tmp_path / "epoch_1.pt")
    assert int(run.resumed["loss_state"]["calls"]) == 1
    warnings = [r.getMessage() for r in caplog.records]
    assert any(f"{tmp_path / 'epoch_3.pt'} cannot be read" in w and "epoch_2.pt" in w for w in warnings), warnings
    assert any(f"{tmp_path / 'epoch_2.pt'} cannot be read" in w and "epoch_1.pt" in w for w in warnings), warnings


def test_an_unreadable_resume_is_a_clear_error(tmp_path):
    from clip_dcl.checkpoint import CheckpointUnreadable

    torn = tmp_path / "epoch_1.pt"
    torn.write_bytes(b"PK\x03\x04 torn")
    run = _resume_run("decl", tmp_path)
    run.args.resume = str(torn)
    with pytest.raises(CheckpointUnreadable, match=r"--resume .*epoch_1.pt: the checkpoint cannot be read"):
        run.pt_load(str(torn))
    latest = _resume_run("decl", tmp_path, latest=True)
    latest.args.resume = str(torn)
    with pytest.raises(CheckpointUnreadable, match=r"no checkpoint under .* can be read"):
        latest.pt_load(str(torn))


# -- a failed start leaves nothing behind --------------------------------------------------------------
def test_a_failed_start_removes_its_log_folder_so_the_rerun_works(tmp_path, preloaded):
    pattern = write_shards(tmp_path / "shards", dense_keys(num_shards=1, per_shard=4))
    # a config that registers but cannot be built: the run fails in OpenCLIP's main, after making its folder
    from clip_dcl.models import tiny_config_path

    cfg = json.loads(tiny_config_path().read_text())
    cfg["vision_cfg"]["width"] = -5
    (tmp_path / "unbuildable.json").write_text(json.dumps(cfg))
    # processes of their own: what one start leaves behind when its interpreter exits is what the next one meets
    cmd = [
        preloaded.python,
        "-m",
        "clip_dcl.train",
        "--model-config",
        str(tmp_path / "unbuildable.json"),
        "--train-data",
        pattern,
        "--dataset-type",
        "webdataset",
        "--workers",
        "1",
        "--batch-size",
        "4",
        "--device",
        "cpu",
        "--logs",
        str(tmp_path / "logs"),
        "--name",
        "x",
    ]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    for _ in range(2):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode != 0
        assert "negative dimension -5" in out.stderr
        assert "Experiment already exists" not in out.stdout + out.stderr
        assert "removed" in out.stderr and not (tmp_path / "logs" / "x").exists()


# -- OpenCLIP drift -----------------------------------------------------------------------------------
def _called(module_name=None, drop=None, replace=None):
    """The compat check's table of called names, with ``drop`` removed from (or ``replace`` set in) a copy of
    ``module_name``."""
    from clip_dcl.train.compat import CALLED

    table = dict(CALLED)
    if module_name is not None:
        module, names = table[module_name]
        copy = types.ModuleType(module.__name__)
        copy.__dict__.update(module.__dict__)
        if drop:
            delattr(copy, drop)
        for name, value in (replace or {}).items():
            setattr(copy, name, value)
        table[module_name] = (copy, names)
    return table


def test_the_installed_openclip_fits():
    from clip_dcl.train.compat import check_openclip, openclip_problems

    check_openclip()
    assert openclip_problems("3.3.0") == [] and openclip_problems("2.32.0") == []


@pytest.mark.parametrize(
    "version, changes, named",
    [
        ("4.2.0.dev0", {}, "version 4.2.0.dev0"),
        ("2.31.0", {}, "version 2.31.0"),
        ("3.3.0", {"module_name": "open_clip", "drop": "create_loss"}, "open_clip.create_loss is missing"),
        ("3.3.0", {"module_name": "open_clip_train.file_utils", "drop": "pt_load"}, "file_utils.pt_load is missing"),
        (
            "3.3.0",
            {"module_name": "open_clip_train.data", "drop": "get_wds_dataset"},
            "open_clip_train.data.get_wds_dataset is missing",
        ),
        (
            "3.3.0",
            {"module_name": "open_clip_train.precision", "replace": {"get_autocast": lambda *a, **k: lambda: None}},
            "get_autocast no longer returns a context manager factory",
        ),
    ],
)
def test_openclip_drift_fails_with_one_message_naming_the_supported_range(version, changes, named):
    from clip_dcl.train.compat import OpenCLIPMismatch, check_openclip

    with pytest.raises(OpenCLIPMismatch) as err:
        check_openclip(version, _called(**changes))
    assert "supports open_clip_torch >=2.32,<3.4" in str(err.value)
    assert named in str(err.value) and len(str(err.value).splitlines()) == 1


def test_a_parser_without_a_flag_the_trainer_reads_is_refused(monkeypatch):
    from open_clip_train import params

    from clip_dcl.train.compat import openclip_problems

    real = params.parse_args

    def without_accum_freq(argv):
        args = real(argv)
        del args.accum_freq
        return args

    monkeypatch.setattr(params, "parse_args", without_accum_freq)
    assert openclip_problems("3.3.0") == ["OpenCLIP's parser has no --accum-freq"]


def test_the_check_leaves_the_root_logger_as_it_was():
    """The check logs nothing through the root logger; one without a handler must not get basicConfig's."""
    import logging

    from clip_dcl.train.compat import check_openclip

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers = []
    try:
        check_openclip()
        assert root.handlers == [] and root.filters == [] and root.level == level
    finally:
        root.handlers = handlers


def test_the_checks_run_takes_no_optimizer_step_that_global_hooks_see():
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from clip_dcl.train.compat import check_openclip

    steps = []
    handle = register_optimizer_step_post_hook(lambda *a: steps.append(1))
    try:
        check_openclip()
    finally:
        handle.remove()
    assert steps == []


def test_the_readers_read_records_not_log_text(tmp_path):
    """A changed ``Train Epoch:`` line upstream changes nothing read: the readers take ``metrics.jsonl``."""
    from clip_dcl.experiment import read_curves, read_step_times

    (tmp_path / "out.log").write_text("x | INFO | Train Epoch: 0 [ 16/64 (25%)] t_data=0.1 loss=4.1\n")
    assert read_step_times(tmp_path) == [] and read_curves(tmp_path) == {"epoch": [], "loss": []}
    (tmp_path / "metrics.jsonl").write_text(
        '{"kind": "train", "step": 0, "epoch": 0, "samples": 16, '
        '"samples_per_epoch": 64, "loss": 4.1, "data_time": 0.1, '
        '"batch_time": 0.2, "samples_per_second": 80.0}\n'
    )
    assert [s.samples_per_second for s in read_step_times(tmp_path)] == [80.0]
    assert read_curves(tmp_path) == {"epoch": [0.25], "loss": [4.1]}


@pytest.mark.slow
def test_a_checkpoint_written_through_the_patched_main_holds_loss_state(tmp_path):
    """If a patch stops taking effect (OpenCLIP saving through another name), this catches it."""
    from test_train import checkpoint, train

    pattern = write_shards(tmp_path / "shards", dense_keys(num_shards=2, per_shard=16))
    train(tmp_path, "p", pattern, "--epochs", "1", "--workers", "0", "--loss", "decl", "--decl-rate", "index")
    ckpt = checkpoint(tmp_path, "p", 1)
    assert int(ckpt["loss_state"]["calls"]) == 2
    assert ckpt["clip_dcl"]["loss"] == "decl"
    assert [p.name for p in (tmp_path / "logs" / "p" / "checkpoints").iterdir()] == ["epoch_1.pt"]


# -- the training pipeline: bad shards, collisions ----------------------------------------------------
def _pipeline(pattern, workers=0, batch_size=4, num_samples=None, block=None, epoch=0, train_num_samples=None):
    from test_train import _caption_number, _pipeline_args

    from clip_dcl.train.pipeline import get_wds_train_dataset

    args = _pipeline_args(pattern, workers=workers, batch_size=batch_size)
    args.decl_num_samples, args.decl_id_block = num_samples, block
    args.train_num_samples = train_num_samples or args.train_num_samples
    return get_wds_train_dataset(args, lambda img: torch.zeros(1), epoch=epoch, tokenizer=_caption_number)


def _epoch(info, epoch=0):
    info.set_epoch(epoch)
    return torch.cat([ids for _, _, ids in info.dataloader]).tolist()


def _truncate(path, keep):
    data = path.read_bytes()
    path.write_bytes(data[: keep(data)])


def _member_offsets(path):
    import tarfile

    with tarfile.open(path) as tar:
        return [(m.name, m.offset, m.offset_data + m.size) for m in tar.getmembers()]


def test_truncated_shards_are_reported_with_shard_key_and_cause(tmp_path, caplog):
    from clip_dcl.train.pipeline import id_collisions, summary_line

    pattern = write_shards(tmp_path / "shards", dense_keys(num_shards=2, per_shard=8), corrupt_image={12})
    boundary = [
        o for name, o, _ in _member_offsets(tmp_path / "shards" / "00000.tar") if name.startswith("000000005.")
    ][0]
    _truncate(tmp_path / "shards" / "00000.tar", lambda data: boundary)  # samples 0-4 intact, then nothing
    middle = [
        (o, end) for name, o, end in _member_offsets(tmp_path / "shards" / "00001.tar") if name == "000000010.txt"
    ][0]
    _truncate(tmp_path / "shards" / "00001.tar", lambda data: middle[0] + 520)  # inside 10.txt's header+data
    caplog.set_level(logging.INFO)
    info = _pipeline(pattern, batch_size=1, num_samples=64)
    seen = _epoch(info)
    assert set(seen) == {0, 1, 2, 3, 4, 8, 9}
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        "Shard" in m and "00000.tar ended early after 5 samples (no end-of-archive marker" in m for m in messages
    ), messages
    assert any("00001.tar ended early after 2 samples" in m for m in messages), messages
    assert any("Skipping sample '000000010'" in m and "shard ended early" in m for m in messages), messages
    assert not any("no caption" in m for m in messages), messages  # the cut sample is not mistaken for one
    report = info.dataloader.data_stats.collect(0)
    assert report["counts"]["shard ended early"] >= 1 and set(map(os.path.basename, report["ended_early"])) == {
        "00000.tar",
        "00001.tar",
    }
    line = summary_line(0, report)
    assert (
        line.startswith("Training data, epoch 0: ") and "2 shard(s) ended early: 00000.tar (no end-of-archive" in line
    )
    samples, ids = id_collisions(report["pairs"])
    assert samples == ids == 7  # ids tracked in the first epoch: no collision


def test_a_shard_that_disappears_is_skipped_and_no_shard_left_is_an_error_not_a_hang(tmp_path, caplog, monkeypatch):
    import clip_dcl.train.pipeline as pipeline

    monkeypatch.setattr(pipeline, "OPEN_RETRY_SECONDS", 0.01)
    pattern = write_shards(tmp_path / "shards", dense_keys(num_shards=4, per_shard=4))
    info = _pipeline(pattern, batch_size=4)
    (tmp_path / "shards" / "00002.tar").unlink()  # after the run started
    caplog.set_level(logging.WARNING)
    seen = _epoch(info)
    assert len(seen) == 16 and set(seen) == set(range(16)) - {8, 9, 10, 11}
    assert any(
        f"Skipping shard {tmp_path / 'shards' / '00002.tar'}: cannot open it after 3 tries" in r.getMessage()
        for r in caplog.records
    )
    report = info.dataloader.data_stats.collect(0)
    assert list(map(os.path.basename, report["unreadable"])) == ["00002.tar"]
    for name in ("00000.tar", "00001.tar", "00003.tar"):
        (tmp_path / "shards" / name).unlink()
    with pytest.raises(pipeline.TrainingDataError, match="none of the 4 training shards can be opened"):
        _epoch(info, 1)
    few = write_shards(tmp_path / "few", dense_keys(num_shards=1, per_shard=3))
    with pytest.raises(pipeline.TrainingDataError, match=r"yielded no batch of 4: 3 samples read"):
        _epoch(_pipeline(few, batch_size=4))


def _loss_refuses(ids, num_samples, match):
    """The loss, which sees the ids of the whole global batch (so every rank stops together), refuses them."""
    from clip_dcl.losses import create_loss
    from clip_dcl.losses.base import SampleIdError

    f = torch.nn.functional.normalize(torch.randn(len(ids), 4), dim=-1)
    with pytest.raises(SampleIdError, match=match):
        create_loss("decl", rate="index", num_samples=num_samples)(
            f, f, torch.tensor(1.0), sample_ids=torch.tensor(ids)
        )


def test_joined_sources_get_disjoint_ids_and_collisions_are_counted(tmp_path, caplog):
    from clip_dcl.train.flags import parse_train_args
    from clip_dcl.train.pipeline import id_collisions

    a = write_shards(tmp_path / "a", dense_keys(num_shards=2, per_shard=8))  # keys 0..15
    b = write_shards(tmp_path / "b", dense_keys(num_shards=2, per_shard=8))  # keys 0..15 again
    joined = f"{a}::{b}"
    cfg = parse_train_args(["--train-data", joined, "--loss", "decl", "--decl-rate", "index", "--batch-size", "4"])
    assert (cfg.id_block, cfg.num_samples) == (16, 32)  # each source owns 16 ids (its sizes.json), the buffer 2 x 16
    info = _pipeline(joined, batch_size=4, num_samples=cfg.num_samples, block=cfg.id_block)
    seen = _epoch(info)
    assert sorted(seen) == list(range(32))
    assert id_collisions(info.dataloader.data_stats.collect(0)["pairs"]) == (32, 32)
    # without the offsets (one buffer for both), the two sources share every row: counted
    shared = _pipeline(joined, batch_size=4, num_samples=32)
    _epoch(shared)
    assert id_collisions(shared.dataloader.data_stats.collect(0)["pairs"]) == (32, 16)
    # a key beyond the source's range is logged with its shard and key, naming the flag, and given an id
    # outside the buffer, which the loss refuses
    ids = _epoch(_pipeline(joined, batch_size=4, num_samples=20, block=10))
    assert re.search(
        r"key 1[0-5], not below the 10 ids of each of the 2 ::-joined sources .* --decl-num-samples", caplog.text
    )
    assert max(ids) >= 20
    _loss_refuses(ids, 20, r"outside \[0, num_samples=20\)")


def test_a_negative_key_gets_its_own_message(tmp_path, caplog):
    import webdataset as wds

    (tmp_path / "s").mkdir()
    with wds.TarWriter(str(tmp_path / "s" / "00000.tar")) as w:
        for k in (1, -5, 2, 3):
            w.write(
                {"__key__": f"s{k + 10}", "jpg": _jpeg(), "txt": f"sample {k}", "json": json.dumps({"key": k}).encode()}
            )
    with caplog.at_level("ERROR"):
        ids = _epoch(_pipeline(str(tmp_path / "s" / "00000.tar"), batch_size=2, num_samples=100, train_num_samples=4))
    assert re.search(r"sample 's5' in .*00000.tar has the negative key -5: .* cannot help", caplog.text)
    _loss_refuses(ids, 100, r"sample id -5 is negative")


def _jpeg():
    import io

    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


@pytest.mark.slow
def test_hashed_ids_that_collide_are_warned_about_at_the_end_of_the_first_epoch(tmp_path):
    import webdataset as wds
    from test_train import train

    (tmp_path / "s").mkdir()
    for s in range(2):
        with wds.TarWriter(str(tmp_path / "s" / f"{s:05d}.tar")) as w:
            for i in range(16):
                w.write({"__key__": f"img_{s}_{i}", "jpg": _jpeg(), "txt": f"sample {i}"})
    pattern = str(tmp_path / "s" / "{00000..00001}.tar")
    out = train(
        tmp_path,
        "h",
        pattern,
        "--epochs",
        "1",
        "--workers",
        "2",
        "--loss",
        "decl",
        "--decl-rate",
        "index",
        "--decl-num-samples",
        "32",
        "--train-num-samples",
        "32",
    )
    log = (tmp_path / "logs" / "h" / "out.log").read_text()
    assert "Training data, epoch 0: 32 samples read, 0 skipped; 0 shard(s) ended early; 32 sample ids hashed" in log
    import re

    m = re.search(
        r"Sample ids, epoch 0: 32 distinct samples but (\d+) distinct ids: (\d+) samples share a rate row "
        r"with another \(their keys are not numeric",
        log,
    )
    assert m and int(m.group(1)) < 32, log[-3000:] + out.stderr[-2000:]


def test_a_whole_shard_whose_end_marker_is_read_in_two_pieces_is_not_reported_as_truncated(tmp_path, caplog):
    """tarfile stops at the first zero block of the end-of-archive marker; when the reader's last
    read ends there, the marker's second block is still unread, which is not a truncation."""
    import tarfile

    (tmp_path / "s").mkdir()
    shard = tmp_path / "s" / "00000.tar"
    with tarfile.open(shard, "w") as tf:  # 20 samples of 3 members: the marker starts 512 bytes into a record
        for k in range(20):
            for ext, data in (("jpg", _jpeg()), ("txt", f"sample {k}".encode()), ("json", b"{}")):
                info = tarfile.TarInfo(f"{k:09d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    caplog.set_level(logging.WARNING)
    info = _pipeline(str(shard), batch_size=1, train_num_samples=20)
    assert sorted(_epoch(info)) == list(range(20))
    assert info.dataloader.data_stats.collect(0)["ended_early"] == {}
    assert not any("ended early" in r.getMessage() for r in caplog.records)
