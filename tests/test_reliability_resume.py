"""Resuming on another number of ranks or with other settings, and bad paths and values that must fail
before the work: a checkpoint of one process resumes on two and back (model, optimizer, loss state);
a setting that changes what the saved loss state means is refused with the flag to add; a data set
that grew is refused with the ways on, and ``--decl-grow-state`` keeps the rates of the ids seen; an
unwritable ``--logs``/``--output``, a bad ``--lr``, a template with an unknown placeholder, a
``--resume`` folder and a partial file of a killed save are each met before any work."""

from __future__ import annotations

import argparse
import os
import re
import subprocess

import pytest
import torch
from conftest import train_in_process

from clip_dcl.train import main

#: the shared decl run's flags (conftest.trained_run): 48 synthetic pairs, batches of 16, one epoch
SHARED = [
    "--model",
    "clip-dcl-tiny",
    "--dataset-type",
    "synthetic",
    "--train-num-samples",
    "48",
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
    "--loss",
    "decl",
]


def _with(flags, **values):
    """``flags`` with the values of the named flags replaced (``train_num_samples=64``)."""
    out = list(flags)
    for name, value in values.items():
        out[out.index("--" + name.replace("_", "-")) + 1] = str(value)
    return out


def _restored_digests(text: str) -> list:
    return re.findall(r"Restored the decl loss state from .*\(digest ([0-9a-f]{64})\)", text)


def _optimizer_steps(ckpt: dict) -> set:
    """AdamW's step count of every parameter: continued from the checkpoint, or restarted at 0."""
    return {int(s["step"]) for s in ckpt["optimizer"]["state"].values()}


# -- any checkpoint on any number of ranks ------------------------------------------------------------
def test_world_size_model_keys_fit_the_model_either_way():
    from clip_dcl.train.flags import TrainConfig
    from clip_dcl.train.run import TrainingRun

    model = torch.nn.Linear(3, 2)
    wrapper = torch.nn.Module()
    wrapper.module = torch.nn.Linear(3, 2)  # DDP's keys: module.weight, module.bias
    one = {"epoch": 1, "state_dict": model.state_dict(), "optimizer": {}}
    many = {"epoch": 1, "state_dict": wrapper.state_dict(), "optimizer": {}}
    for distributed, target in ((True, wrapper), (False, model)):
        run = TrainingRun(TrainConfig("clip", {}, {}))
        run.args = argparse.Namespace(distributed=distributed, horovod=False)
        for ckpt in (one, many):
            fitted = run._fit_model_keys(ckpt)
            target.load_state_dict(fitted["state_dict"])  # strict: every key fits
            assert fitted["epoch"] == 1
        assert set(run._fit_model_keys(dict(model.state_dict()))) == set(target.state_dict())  # a bare state dict
    run.args.distributed, run.args.horovod = True, True  # Horovod does not wrap the model
    assert set(run._fit_model_keys(many)["state_dict"]) == {"weight", "bias"}


@pytest.mark.slow
def test_world_size_1_to_2_to_1_resume(trained_run, tmp_path, preloaded):
    """One process -> two gloo ranks -> one process, each resuming the last one's checkpoint: the model
    loads (strict), AdamW's step counts and the loss's calls continue, and the loss state restored on
    every rank is the saved one (sharded over the two ranks, then gathered from their files)."""
    from clip_dcl.train.saving import loss_state_digest, read_loss_state

    first = trained_run("decl") / "checkpoints" / "epoch_1.pt"  # 3 steps of 16 on one process
    logs = tmp_path / "logs"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    two = subprocess.run(  # torchrun and its ranks from the preloaded python: the subject is the resume
        [
            preloaded.python,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "clip_dcl.train",
            "--",
            *_with(SHARED, workers=0),
            "--batch-size",
            "8",
            "--epochs",
            "2",
            "--logs",
            logs,
            "--name",
            "two",
            "--resume",
            first,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={k: str(v) for k, v in env.items()},
    )
    assert two.returncode == 0, two.stderr[-6000:]
    assert "Missing key" not in two.stderr
    assert _restored_digests(two.stderr) == [loss_state_digest(read_loss_state(first))] * 2  # both ranks
    second = logs / "two" / "checkpoints" / "epoch_2.pt"
    saved = torch.load(second, map_location="cpu", weights_only=True)
    assert all(k.startswith("module.") for k in saved["state_dict"])
    assert _optimizer_steps(saved) == {6} and int(saved["loss_state"]["calls"]) == 6  # 3 + 3 steps of 2 x 8
    assert "log_rate" not in saved["loss_state"]  # sharded: one file per rank beside the checkpoint

    back = train_in_process(
        [
            *_with(SHARED, workers=0),
            "--batch-size",
            "16",
            "--epochs",
            "3",
            "--logs",
            logs,
            "--name",
            "back",
            "--resume",
            second,
        ]
    )
    assert back.returncode == 0, back.stderr[-6000:]
    assert _restored_digests((logs / "back" / "out.log").read_text()) == [loss_state_digest(read_loss_state(second))]
    third = torch.load(logs / "back" / "checkpoints" / "epoch_3.pt", map_location="cpu", weights_only=True)
    assert not any(k.startswith("module.") for k in third["state_dict"])
    assert _optimizer_steps(third) == {9} and int(third["loss_state"]["calls"]) == 9


# -- settings that change what the saved loss state means ---------------------------------------------
def _decl_args(**kw):
    from clip_dcl.train.flags import full_loss_args

    return full_loss_args("decl", {"rate": "index", "num_samples": 400, **kw})


def _resume(tmp_path, saved_args, now_args, reset=False, grow=False, id_block=None):
    """``pt_load`` of a decl checkpoint saved with ``saved_args`` by a run configured with ``now_args``."""
    from clip_dcl.train.flags import TrainConfig
    from clip_dcl.train.run import TrainingRun

    path = str(tmp_path / "epoch_1.pt")
    torch.save(
        {
            "epoch": 1,
            "name": "x",
            "state_dict": {},
            "optimizer": {},
            "loss_state": {"calls": torch.tensor(3), "log_rate": torch.zeros(2, saved_args["num_samples"])},
            "clip_dcl": {"model": "m", "loss": "decl", "loss_args": saved_args},
        },
        path,
    )
    run = TrainingRun(
        TrainConfig(
            "decl",
            {},
            now_args,
            num_samples=now_args.get("num_samples"),
            loss_reset=reset,
            grow_state=grow,
            id_block=id_block,
        )
    )
    run.args = argparse.Namespace(checkpoint_path=str(tmp_path), resume=path, distributed=False, horovod=False)
    return run, path


@pytest.mark.parametrize(
    "saved, now, add",
    [
        ({}, {"estimate": "absolute"}, "--decl-estimate relative"),
        ({}, {"drift_correction": False}, "--decl-drift-correction"),
        ({"drift_correction": False}, {}, "--no-decl-drift-correction"),
        ({}, {"state_dtype": "bfloat16"}, "--decl-state-dtype float32"),
        ({}, {"rate": "queue"}, "--decl-rate index"),
    ],
    ids=["estimate", "drift-correction-off", "drift-correction-on", "state-dtype", "rate"],
)
def test_resume_refuses_changed_state_settings_with_the_flag_to_add(tmp_path, saved, now, add):
    from clip_dcl.train.run import LossSettingMismatch

    run, path = _resume(tmp_path, _decl_args(**saved), _decl_args(**now))
    with pytest.raises(LossSettingMismatch) as err:
        run.pt_load(path)
    msg = str(err.value)
    assert f"{path} was trained with {add};" in msg and f"To continue the same training, add: {add}." in msg
    assert "as another quantity" in msg and "add --loss-reset" in msg
    reset, _ = _resume(tmp_path, _decl_args(**saved), _decl_args(**now), reset=True)
    assert reset.pt_load(path)["epoch"] == 1 and reset.resumed is None  # fresh loss state, model and optimizer kept


@pytest.mark.parametrize(
    "now",
    [
        {"gamma": 0.5},
        {"schedule": "decl"},
        {"first_visit": "mean"},
        {"queue_size": 7},
        {"state": "replicated"},
        {"sample_u": True},
    ],
    ids=["gamma", "schedule", "first-visit", "queue-size-of-index", "layout", "sample-u"],
)
def test_resume_refuses_only_what_the_state_depends_on(tmp_path, now):
    run, path = _resume(tmp_path, _decl_args(), _decl_args(**now))
    assert run.pt_load(path)["epoch"] == 1 and int(run.resumed["loss_state"]["calls"]) == 3
    # the queue's state does not depend on what the index buffer would estimate
    queue, path = _resume(tmp_path, _decl_args(rate="queue"), _decl_args(rate="queue", estimate="absolute"))
    assert queue.pt_load(path)["epoch"] == 1


@pytest.mark.parametrize("saved_tile, now_tile", [(0, 256), (256, 0)])
def test_a_loss_tile_is_recorded_and_never_refuses_a_resume(tmp_path, saved_tile, now_tile):
    """--loss-tile changes how the loss is computed, not what: the record keeps it, a resume takes another."""
    from clip_dcl.train.flags import parse_train_args
    from clip_dcl.train.loss_flags import loss_command

    saved, now = _decl_args(tile=saved_tile), _decl_args(tile=now_tile)
    assert saved["tile"] == saved_tile and now["tile"] == now_tile
    assert "--loss-tile 256" in " ".join(loss_command("decl", _decl_args(tile=256)))
    run, path = _resume(tmp_path, saved, now)
    assert run.pt_load(path)["epoch"] == 1 and int(run.resumed["loss_state"]["calls"]) == 3
    argv = ["--loss", "decl", "--dataset-type", "synthetic", "--train-num-samples", "16"]
    assert parse_train_args(argv + ["--loss-tile", str(now_tile)]).loss_args["tile"] == now_tile
    assert "tile" not in parse_train_args(argv).loss_args  # not given: the device's default, nothing recorded


def test_resume_refuses_nothing_for_another_accum_freq_and_keeps_the_step_count(tmp_path):
    """Doubling the ranks and halving --accum-freq keeps the global batch: DeCL's step counter (loss calls)
    is converted, not refused, so lambda_t and gamma_t continue at the same optimizer step."""
    from clip_dcl.losses import create_loss

    run, path = _resume(tmp_path, _decl_args(accum_freq=2), _decl_args(accum_freq=1))
    assert run.pt_load(path)["epoch"] == 1
    saved = {"calls": torch.tensor(8), "log_rate": torch.zeros(2, 400), "prev_log_rate": torch.zeros(2)}
    for accum, calls in ((1, 4), (2, 8), (4, 16)):
        loss = create_loss("decl", rate="index", num_samples=400, accum_freq=accum)
        state, notes = loss.adapt_saved_state(saved, _decl_args(accum_freq=2))
        loss.load_state_dict(state)
        assert int(loss.calls) == calls and loss.step == 5  # 4 steps taken, the next is the 5th
        assert bool(notes) == (accum != 2)


@pytest.mark.slow
def test_resume_refuses_changed_estimate_before_any_training(trained_run, tmp_path):
    """The issue's case end to end: --decl-estimate absolute on a relative checkpoint used to resume
    silently (its stored rates read as the absolute estimate); now one line and exit 1, nothing left."""
    path = trained_run("decl") / "checkpoints" / "epoch_1.pt"
    logs = tmp_path / "logs"
    res = train_in_process(
        [
            *_with(SHARED, workers=0),
            "--batch-size",
            "16",
            "--epochs",
            "2",
            "--logs",
            logs,
            "--name",
            "r",
            "--resume",
            path,
            "--decl-estimate",
            "absolute",
        ]
    )
    assert res.returncode == 1
    assert (
        f"{path} was trained with --decl-estimate relative; resuming it with --decl-estimate absolute would "
        "read its saved --loss decl state as another quantity"
    ) in res.stderr
    assert "Train Epoch" not in res.stderr and not (logs / "r").exists()


# -- a data set that grew ------------------------------------------------------------------------------
def test_resume_refuses_other_num_samples_with_the_ways_on(tmp_path):
    from clip_dcl.train.run import LossSettingMismatch

    run, path = _resume(tmp_path, _decl_args(num_samples=384), _decl_args(num_samples=512))
    with pytest.raises(LossSettingMismatch) as err:
        run.pt_load(path)
    msg = str(err.value)
    assert "state for 384 sample ids, and this run needs 512" in msg and "the data set grew" in msg
    assert "add --decl-grow-state to keep the learned rates of the 384 ids seen and start the 128 new ids" in msg
    assert "add --loss-reset" in msg and "--decl-num-samples 384" not in msg  # not the advice that led in a circle
    grow, path = _resume(tmp_path, _decl_args(num_samples=384), _decl_args(num_samples=512), grow=True)
    assert grow.pt_load(path)["epoch"] == 1 and grow.grow_from == 384
    # ::-joined sources: source j's ids start at j x block, so a grown block would move the saved rates
    moved, path = _resume(tmp_path, _decl_args(num_samples=384), _decl_args(num_samples=512), grow=True, id_block=256)
    with pytest.raises(LossSettingMismatch, match=r"source j start at j x 256 .* Add --loss-reset instead"):
        moved.pt_load(path)
    added, path = _resume(tmp_path, _decl_args(num_samples=512), _decl_args(num_samples=768), grow=True, id_block=256)
    assert added.pt_load(path)["epoch"] == 1 and added.grow_from == 512  # a third source of the same block
    shrunk, path = _resume(tmp_path, _decl_args(num_samples=512), _decl_args(num_samples=384))
    with pytest.raises(
        LossSettingMismatch,
        match=r"the data set shrank\. Either add --decl-num-samples 512 .* "
        r"or add --loss-reset",
    ):
        shrunk.pt_load(path)


@pytest.mark.parametrize("new_world", [1, 2, 3])
def test_world_size_any_grows_sharded_state_keeping_the_saved_rates(tmp_path, new_world):
    """--decl-grow-state from a checkpoint whose rates are in one file per rank (2 ranks): every rank of the
    new world gets its saved ids' rates and NaN (unvisited) for the new ids, as a fresh buffer holds."""
    from test_loss_state import N, full_table, shard_of, write_run

    from clip_dcl.losses import create_loss
    from clip_dcl.train import loss_state, saving

    table = full_table(2)
    saved = torch.load(write_run(tmp_path, table, 2, 1), weights_only=True)
    ckpt = str(tmp_path / "checkpoints" / "epoch_1.pt")
    grown = torch.cat([table, torch.full((2, 9), float("nan"))], dim=1)
    for rank in range(new_world):
        loss = create_loss("decl", rate="index", num_samples=N + 9, rank=rank, world_size=new_world)
        state = loss_state.restore_sharded(
            loss, saved["loss_state"], saved["clip_dcl"][saving.SHARD_INDEX_KEY], ckpt, grow=True
        )
        loss.load_state_dict(state)
        assert torch.equal(loss.log_rate.nan_to_num(-9), shard_of(grown, rank, new_world).nan_to_num(-9))
        assert int(loss.calls) == 7
    with pytest.raises(saving.LossStateFilesError, match="num_samples=23"):  # never shrinks
        small = create_loss("decl", rate="index", num_samples=N - 1)
        loss_state.restore_sharded(
            small, saved["loss_state"], saved["clip_dcl"][saving.SHARD_INDEX_KEY], ckpt, grow=True
        )


@pytest.mark.slow
def test_resume_refuses_a_grown_data_set_then_decl_grow_state_keeps_the_rates(trained_run, tmp_path):
    """48 -> 64 synthetic samples: refused naming --decl-grow-state and --loss-reset; with --decl-grow-state
    the restored state is the saved one with 16 unvisited columns, and the next epoch visits them."""
    from clip_dcl.losses.state import digest_of_state_dict
    from clip_dcl.train.saving import read_loss_state

    path = trained_run("decl") / "checkpoints" / "epoch_1.pt"
    logs = tmp_path / "logs"
    flags = [
        *_with(SHARED, train_num_samples=64, workers=0),
        "--batch-size",
        "16",
        "--epochs",
        "2",
        "--logs",
        logs,
        "--resume",
        path,
    ]
    refused = train_in_process([*flags, "--name", "refused"])
    assert refused.returncode == 1
    assert "--decl-grow-state" in refused.stderr and "--loss-reset" in refused.stderr
    assert "is outside [0, num_samples" not in refused.stderr  # refused at the resume, not at an id out of range

    res = train_in_process([*flags, "--name", "grown", "--decl-grow-state"])
    assert res.returncode == 0, res.stderr[-6000:]
    saved = read_loss_state(path)
    want = {**saved, "log_rate": torch.cat([saved["log_rate"], torch.full((2, 16), float("nan"))], dim=1)}
    log = (logs / "grown" / "out.log").read_text()
    assert "--decl-grow-state" in log and "the 16 new ids [48, 64) start unvisited" in log
    assert _restored_digests(log) == [digest_of_state_dict(want)]
    after = torch.load(logs / "grown" / "checkpoints" / "epoch_2.pt", map_location="cpu", weights_only=True)
    assert after["loss_state"]["log_rate"].shape == (2, 64)
    assert not torch.isnan(after["loss_state"]["log_rate"]).any()  # 4 steps of 16 visit all 64 ids


def test_resume_refuses_decl_grow_state_without_what_it_needs(tmp_path, capsys):
    base = [
        "--dataset-type",
        "synthetic",
        "--train-num-samples",
        "48",
        "--device",
        "cpu",
        "--logs",
        tmp_path / "l",
        "--decl-grow-state",
    ]
    ckpt = tmp_path / "epoch_1.pt"
    ckpt.write_bytes(b"")
    for extra, named in (
        (["--loss", "decl"], "give --resume"),
        (["--loss", "decl", "--decl-rate", "queue", "--resume", ckpt], "--decl-rate queue"),
        (["--loss", "dcl", "--resume", ckpt], "not --loss dcl"),
        (["--loss", "decl", "--resume", ckpt, "--loss-reset"], "give one of them"),
    ):
        assert main([str(a) for a in base + extra]) == 2
        assert named in capsys.readouterr().err
    assert not (tmp_path / "l").exists()


# -- bad values and paths fail before the work --------------------------------------------------------
@pytest.mark.parametrize(
    "flag, value, named",
    [
        ("--lr", "nan", "--lr nan: must be a finite number > 0"),
        ("--lr", "-1", "--lr -1: must be a finite number > 0"),
        ("--lr", "0", "--lr 0: must be a finite number > 0"),
        ("--wd", "-0.1", "--wd -0.1: must be a finite number >= 0"),
        ("--wd", "inf", "--wd inf: must be a finite number >= 0"),
        ("--beta2", "1", "--beta2 1: must be in [0, 1)"),
        ("--eps", "0", "--eps 0: must be a finite number > 0"),
        ("--warmup", "-5", "--warmup -5: must be an integer >= 0"),
    ],
)
def test_bad_optimizer_values_exit_2_naming_them_before_the_model_is_built(
    tmp_path, capsys, monkeypatch, flag, value, named
):
    import open_clip

    def no_model(*a, **k):
        raise AssertionError("the model was built")

    monkeypatch.setattr(open_clip, "create_model_and_transforms", no_model)
    rc = main(
        [
            "--dataset-type",
            "synthetic",
            "--train-num-samples",
            "16",
            "--device",
            "cpu",
            "--logs",
            str(tmp_path / "logs"),
            flag,
            value,
        ]
    )
    assert rc == 2
    assert f"clip-dcl train: error: {named}" in capsys.readouterr().err
    assert not (tmp_path / "logs").exists()


def _cannot_create_a_file_in(folder) -> bool:
    probe = os.path.join(folder, f".clip-dcl-probe-{os.getpid()}")
    try:
        open(probe, "x").close()
    except OSError:
        return os.path.isdir(folder)
    os.remove(probe)
    return False


def test_unwritable_logs_exit_2_before_any_work(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    base = ["--dataset-type", "synthetic", "--train-num-samples", "16", "--device", "cpu"]
    assert main([*base, "--logs", str(blocker / "logs")]) == 2
    assert f"--logs {blocker / 'logs'}: '{blocker}' is a file, not a folder" in capsys.readouterr().err
    from clip_dcl.paths import folder_problem

    assert folder_problem(tmp_path / "new" / "deeper") is None  # created by OpenCLIP: its parent is writable
    if _cannot_create_a_file_in("/sys"):  # sysfs or a read-only mount: refused even for root
        assert main([*base, "--logs", "/sys/clip-dcl-logs"]) == 2
        assert "--logs /sys/clip-dcl-logs: cannot write in '/sys'" in capsys.readouterr().err
    if os.geteuid() != 0:  # root writes through permission bits
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert main([*base, "--logs", str(locked / "logs")]) == 2
        assert f"cannot write in '{locked}'" in capsys.readouterr().err


def test_resume_of_a_folder_or_a_missing_file_exits_2(tmp_path, capsys):
    base = [
        "--dataset-type",
        "synthetic",
        "--train-num-samples",
        "16",
        "--device",
        "cpu",
        "--logs",
        str(tmp_path / "l"),
    ]
    assert main([*base, "--resume", str(tmp_path)]) == 2
    assert f"--resume {tmp_path} is a folder, not a checkpoint file" in capsys.readouterr().err
    assert main([*base, "--resume", str(tmp_path / "epoch_9.pt")]) == 2
    assert "epoch_9.pt does not exist" in capsys.readouterr().err
    from clip_dcl.checkpoint import CheckpointUnreadable
    from clip_dcl.train.flags import TrainConfig
    from clip_dcl.train.run import TrainingRun

    run = TrainingRun(TrainConfig("clip", {}, {}))  # from Python, past the flags
    with pytest.raises(CheckpointUnreadable, match="is a folder, not a checkpoint file"):
        run.pt_load(str(tmp_path))


def _no_model(monkeypatch):
    from clip_dcl.eval import cli

    def refuse(args):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(cli, "_load_model", refuse)


def test_eval_output_that_cannot_be_written_fails_before_the_evaluation(tmp_path, capsys, monkeypatch):
    from clip_dcl.eval.cli import main as eval_main

    _no_model(monkeypatch)
    base = ["retrieval", "--data", str(tmp_path), "--model", "clip-dcl-tiny", "--device", "cpu"]
    assert eval_main([*base, "--output", str(tmp_path)]) == 2
    assert f"--output {tmp_path}: '{tmp_path}' is a folder; give a file name" in capsys.readouterr().err
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert eval_main([*base, "--output", str(blocker / "r.json")]) == 2
    assert f"'{blocker}' is a file, not a folder" in capsys.readouterr().err
    from clip_dcl.paths import output_file_problem

    assert output_file_problem(tmp_path / "new" / "r.json") is None and not (tmp_path / "new").exists()
    assert output_file_problem(blocker) is None and blocker.read_text() == ""  # an existing file, unchanged


def test_template_placeholders_are_checked_when_the_templates_are_read(tmp_path, capsys, monkeypatch):
    from clip_dcl.data.evalsets.files import read_templates
    from clip_dcl.eval.encoding import normalize_templates

    bad = tmp_path / "templates.txt"
    bad.write_text("a photo of a {c}.\na {c} with {x}.\n")
    with pytest.raises(ValueError, match=r"line 2: 'a \{c\} with \{x\}\.' has the placeholder\(s\) \{x\}"):
        read_templates(bad)
    with pytest.raises(ValueError, match=r"'a \{c' is not a format string"):
        normalize_templates(["a {c"])
    with pytest.raises(ValueError, match=r"has the placeholder\(s\) \{name\}"):
        normalize_templates(["a {name}"])
    good = normalize_templates(["a {c} in {{braces}}.", "a {}."])
    assert [t.format("cat") for t in good] == ["a cat in {braces}.", "a cat."]
    _no_model(monkeypatch)
    from clip_dcl.eval.cli import main as eval_main

    assert (
        eval_main(
            [
                "zeroshot",
                "--data",
                str(tmp_path),
                "--model",
                "clip-dcl-tiny",
                "--device",
                "cpu",
                "--templates",
                str(bad),
            ]
        )
        == 2
    )
    assert "--templates: template file" in capsys.readouterr().err


@pytest.mark.slow
def test_stale_partial_files_are_removed_at_start_with_a_log_line(tmp_path):
    """A SIGKILL during a save leaves ``*.partial`` files (a checkpoint's, a loss-state shard's); the next
    run in that folder removes them as it starts, and says so."""
    checkpoints = tmp_path / "logs" / "p" / "checkpoints"
    stale = [
        checkpoints / "epoch_1.pt.partial",
        checkpoints / "loss_state" / "epoch_1" / "log_rate.rank00000-of-00001.state.partial",
    ]
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"torn")
    keep = checkpoints / "notes.txt"
    keep.write_text("kept")
    link = checkpoints / "epoch_9.pt.partial"  # a link is none of a save's making: left alone
    link.symlink_to(keep)
    res = train_in_process(
        [
            "--model",
            "clip-dcl-tiny",
            "--dataset-type",
            "synthetic",
            "--train-num-samples",
            "16",
            "--batch-size",
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
            "--logs",
            tmp_path / "logs",
            "--name",
            "p",
        ]
    )
    assert res.returncode == 0, res.stderr[-6000:]
    assert not any(p.exists() for p in stale) and keep.read_text() == "kept" and link.is_symlink()
    log = (tmp_path / "logs" / "p" / "out.log").read_text()
    for path in stale:
        assert f"Removed {path}: the partial file of a save that was killed halfway" in log
    assert (checkpoints / "epoch_1.pt").is_file()
