"""What a real run meets: wrong paths, torn checkpoints, a changed objective, bad shards, colliding
sample ids, and an OpenCLIP that is not the one the patches were written for."""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import types

import pytest
import torch

from clip_dcl.train import main
from test_train import dense_keys, write_shards

PY = sys.executable


# -- wrong data paths fail before any work -----------------------------------------------------------
@pytest.mark.parametrize("extra", [["--train-num-samples", "320"], []], ids=["with-num-samples", "without"])
def test_a_missing_shard_is_named_before_any_work(tmp_path, capsys, extra):
    logs = tmp_path / "logs"
    rc = main(["--train-data", "/nonexistent/{00000..00004}.tar", "--dataset-type", "webdataset", "--logs", str(logs),
               "--device", "cpu", *extra])
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

    cfg = parse_train_args(["--train-data", pattern, "--loss", "decl", "--decl-schedule", "constant",
                            "--decl-lambda", "0.5", "--decl-num-samples", "2"])
    assert cfg.loss_kwargs["lam"] == 0.5


# -- resume: the objective, torn checkpoints ---------------------------------------------------------
def _resume_run(loss, tmp_path, latest=False, reset=False):
    from clip_dcl.train.flags import TrainConfig
    from clip_dcl.train.patch import TrainingRun

    run = TrainingRun(TrainConfig(loss, {}, {}, loss_reset=reset))
    run.args = argparse.Namespace(checkpoint_path=str(tmp_path), resume=None)
    run.resume_latest = latest
    return run


def _save(path, epoch, loss="decl", loss_args=None):
    torch.save({"epoch": epoch, "name": "x", "state_dict": {}, "optimizer": {},
                "loss_state": {"calls": torch.tensor(epoch)},
                "clip_dcl": {"model": "m", "loss": loss, "loss_args": loss_args or {}}}, path)


def test_resuming_another_objective_is_refused_with_the_flags_to_add(tmp_path):
    from clip_dcl.train.patch import ObjectiveMismatch

    path = str(tmp_path / "epoch_1.pt")
    _save(path, 1, "decl", {"rate": "index", "schedule": "harmonic", "lam": 5.0, "sample_u": True,
                            "num_samples": 400, "accum_freq": 1, "seed": 0})
    run = _resume_run("clip", tmp_path)
    run.args.resume = path
    with pytest.raises(ObjectiveMismatch) as err:
        run.pt_load(path)
    msg = str(err.value)
    assert "resuming it with --loss clip would change the objective" in msg
    assert ("add: --loss decl --decl-schedule harmonic --decl-lambda 5 --decl-sample-u "
            "--decl-num-samples 400") in msg
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
def test_a_failed_start_removes_its_log_folder_so_the_rerun_works(tmp_path):
    pattern = write_shards(tmp_path / "shards", dense_keys(num_shards=1, per_shard=4))
    cmd = [PY, "-m", "clip_dcl.train", "--model", "no-such-model", "--train-data", pattern, "--dataset-type",
           "webdataset", "--device", "cpu", "--logs", str(tmp_path / "logs"), "--name", "x"]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    for _ in range(2):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode != 0
        assert "no-such-model" in out.stderr
        assert "Experiment already exists" not in out.stdout + out.stderr
        assert "removed" in out.stderr and not (tmp_path / "logs" / "x").exists()


# -- OpenCLIP drift -----------------------------------------------------------------------------------
def _modules(changes=None):
    from open_clip_train import data, main as oc_main, params, train

    modules = {}
    for name, mod in {"main": oc_main, "train": train, "data": data, "params": params}.items():
        copy = types.ModuleType(mod.__name__)
        copy.__dict__.update(mod.__dict__)
        modules[name] = copy
    for (mod, attr), value in (changes or {}).items():
        if value is None:
            delattr(modules[mod], attr)
        else:
            setattr(modules[mod], attr, value)
    return modules


def _main_without_module_lookups(args):
    return None


def _train_step_logging_otherwise(model, data, loss, epoch, optimizer, scaler, scheduler, dist_model, args,
                                  tb_writer=None):
    return None


def test_the_installed_openclip_fits_the_patches():
    from clip_dcl.train.patch import check_openclip, openclip_problems

    check_openclip()
    assert openclip_problems("3.3.0", _modules()) == []


@pytest.mark.parametrize("version, changes, named", [
    ("4.2.0.dev0", {}, "version 4.2.0.dev0"),
    ("3.3.0", {("main", "create_loss"): None}, "open_clip_train.main.create_loss is missing"),
    ("3.3.0", {("main", "pt_load"): None}, "open_clip_train.main.pt_load is missing"),
    ("3.3.0", {("main", "train_one_epoch"): lambda model, data, loss, epoch, task, args: None},
     "open_clip_train.main.train_one_epoch"),
    ("3.3.0", {("data", "_SAMPLE_SHUFFLE_SIZE"): None}, "_SAMPLE_SHUFFLE_SIZE is missing"),
    # main no longer calls torch.save through its module global: the torch stand-in would do nothing
    ("3.3.0", {("main", "main"): _main_without_module_lookups}, "no longer contains 'torch.save('"),
    # the training log line the trainer's hook and clip_dcl.experiment parse
    ("3.3.0", {("train", "train_one_epoch"): _train_step_logging_otherwise}, "'f\"Train Epoch: {epoch} ['"),
])
def test_openclip_drift_fails_with_one_message_naming_the_supported_range(version, changes, named):
    from clip_dcl.train.patch import OpenCLIPMismatch, check_openclip

    with pytest.raises(OpenCLIPMismatch) as err:
        check_openclip(version, _modules(changes))
    assert "supports open_clip_torch >=3.3,<3.4" in str(err.value)
    assert named in str(err.value)


def test_log_parsing_fails_loudly_when_the_training_line_changes(tmp_path):
    from clip_dcl.experiment import parse_step_times, read_curves

    new_format = "2026-01-01,00:00:00 | INFO | Train Epoch: 0 [ 16/64 (25%)] t_data=0.1 t_batch=0.2 loss=4.1\n"
    with pytest.raises(ValueError, match="Train Epoch"):
        parse_step_times(new_format)
    (tmp_path / "out.log").write_text(new_format)
    with pytest.raises(ValueError, match="Train Epoch"):
        read_curves(tmp_path / "out.log")
    assert parse_step_times("nothing of training here\n") == []


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
