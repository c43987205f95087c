"""Checkpoints for downstream use: load what OpenCLIP's trainer writes, export to local-dir, reload.

A module fixture trains clip-dcl-tiny for one epoch with OpenCLIP's own ``main`` (about 5 s on
two cores); hand-made checkpoints cover an unregistered architecture and ``module.`` keys. Only
the check in a fresh interpreter without clip_dcl is marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest
import torch

from clip_dcl.checkpoint import CONFIG_NAME, WEIGHTS_NAME, export, export_main, load_checkpoint
from clip_dcl.models import TINY_MODEL, register_builtin_configs, tiny_config_path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A real checkpoint: one epoch of OpenCLIP's own training loop on synthetic data (CPU)."""
    import open_clip_train.main

    from clip_dcl.train.compat import torch_log_levels_kept

    logs = tmp_path_factory.mktemp("logs")
    register_builtin_configs()
    with torch_log_levels_kept():  # OpenCLIP's own main, unpatched: its logging setup would unmute TorchDynamo
        open_clip_train.main.main(
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
                str(logs),
                "--name",
                "x",
                "--save-frequency",
                "1",
                "--report-to",
                "",
                "--seed",
                "0",
                "--warmup",
                "1",
            ]
        )
    ckpt = logs / "x" / "checkpoints" / "epoch_1.pt"
    assert ckpt.is_file()
    return ckpt


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(3, 3, 64, 64, generator=g), ["a red square", "two blue circles on grey", ""]


@torch.no_grad()
def _embed(model, tokenizer):
    images, texts = _inputs()
    model.eval()
    return model.encode_image(images), model.encode_text(tokenizer(texts))


def test_trainer_checkpoint_is_the_tiny_model(trained):
    """main() really trained clip-dcl-tiny (it falls back to RN50 when --model is not honoured)."""
    params = (trained.parent.parent / "params.txt").read_text()
    assert f"model: {TINY_MODEL}" in params.splitlines()
    ckpt = torch.load(trained, map_location="cpu", weights_only=True)
    assert {"epoch", "name", "state_dict", "optimizer"} <= ckpt.keys()
    assert ckpt["state_dict"]["visual.conv1.weight"].shape == (128, 3, 8, 8)
    assert "clip_dcl" not in ckpt


def test_load_uses_params_txt_and_matches_the_saved_weights(trained):
    import open_clip

    model, preprocess, tokenizer = load_checkpoint(trained)
    assert not model.training and preprocess.transforms[0].size == 64
    ref, _, _ = open_clip.create_model_and_transforms(TINY_MODEL)
    state = torch.load(trained, map_location="cpu", weights_only=True)["state_dict"]
    ref.load_state_dict(state)
    for a, b in zip(_embed(model, tokenizer), _embed(ref, open_clip.get_tokenizer(TINY_MODEL))):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


#: OpenCLIP's own loader of an exported folder (``local-dir:``) came after 2.32, the oldest release supported
needs_local_dir = pytest.mark.skipif(
    not hasattr(__import__("open_clip").factory, "LOCAL_DIR_PREFIX"),
    reason="this OpenCLIP has no local-dir: loader (clip_dcl.load_checkpoint reads the export instead)",
)


@needs_local_dir
def test_export_reloads_through_local_dir_with_same_embeddings(trained, tmp_path):
    import open_clip

    model, _, tokenizer = load_checkpoint(trained)
    out = export(trained, tmp_path / "exported")
    assert sorted(os.listdir(out)) == [CONFIG_NAME, WEIGHTS_NAME]
    doc = json.loads((out / CONFIG_NAME).read_text())
    assert doc["model_cfg"] == json.loads(tiny_config_path().read_text())
    assert doc["preprocess_cfg"]["size"] == [64, 64] and doc["preprocess_cfg"]["interpolation"] == "bicubic"
    name = f"local-dir:{out}"
    reloaded, _, preprocess = open_clip.create_model_and_transforms(name)
    assert preprocess.transforms[0].size == 64
    for a, b in zip(_embed(model, tokenizer), _embed(reloaded, open_clip.get_tokenizer(name))):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # and through our loader, from the folder
    again, _, tok2 = load_checkpoint(out)
    for a, b in zip(_embed(model, tokenizer), _embed(again, tok2)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.slow
@needs_local_dir
def test_exported_folder_loads_without_clip_dcl(trained, tmp_path, preloaded):
    """A fresh interpreter where importing clip_dcl fails still loads the export with OpenCLIP alone."""
    model, _, tokenizer = load_checkpoint(trained)
    out = export(trained, tmp_path / "exported")
    expected = _embed(model, tokenizer)
    torch.save(expected, tmp_path / "expected.pt")
    code = f"""
import sys
sys.modules["clip_dcl"] = None  # any import of clip_dcl now raises
import torch, open_clip
name = "local-dir:{out}"
model, _, _ = open_clip.create_model_and_transforms(name)
model.eval()
g = torch.Generator().manual_seed(0)
images = torch.randn(3, 3, 64, 64, generator=g)
with torch.no_grad():
    got = (model.encode_image(images),
           model.encode_text(open_clip.get_tokenizer(name)(["a red square", "two blue circles on grey", ""])))
exp = torch.load("{tmp_path / "expected.pt"}")
assert all(torch.equal(a, b) for a, b in zip(got, exp))
print("ok")
"""
    # another process (the preloaded python has imported OpenCLIP and torch, never clip_dcl): this one has imported
    # clip_dcl, whose model configs OpenCLIP would then know
    res = subprocess.run([preloaded.python, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-2000:]


def _custom_checkpoint(tmp_path, with_entry=True, prefix="module."):
    """A checkpoint of an architecture OpenCLIP has never heard of, DDP-style keys."""
    import open_clip

    cfg = json.loads(tiny_config_path().read_text())
    cfg["embed_dim"] = 32
    cfg["vision_cfg"]["layers"] = 1
    name = f"clip-dcl-test-{uuid.uuid4().hex[:8]}"
    model = open_clip.CLIP(**cfg)
    ckpt = {
        "epoch": 3,
        "name": "run",
        "state_dict": {prefix + k: v for k, v in model.state_dict().items()},
        "optimizer": {},
    }
    if with_entry:
        ckpt["clip_dcl"] = {"model": name, "model_config": cfg}
    path = tmp_path / "somewhere" / "epoch_3.pt"
    path.parent.mkdir(parents=True)
    torch.save(ckpt, path)
    return path, name, cfg, model


def test_checkpoint_with_clip_dcl_entry_loads_without_model_argument(tmp_path):
    import open_clip

    path, name, cfg, model = _custom_checkpoint(tmp_path)
    assert name not in open_clip.list_models()
    loaded, _, tokenizer = load_checkpoint(path)
    assert loaded.clip_dcl_model_name == name and name in open_clip.list_models()
    for a, b in zip(_embed(loaded, tokenizer), _embed(model, tokenizer)):
        assert a.shape[1] == 32
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    out = export(path, tmp_path / "exp")
    assert json.loads((out / CONFIG_NAME).read_text())["model_cfg"] == cfg
    again, _, tok2 = load_checkpoint(out)  # through local-dir:, or read by clip-dcl where OpenCLIP has none
    local_dir = hasattr(open_clip.factory, "LOCAL_DIR_PREFIX")
    reloaded = open_clip.create_model_and_transforms(f"local-dir:{out}")[0] if local_dir else again
    for a, b, c in zip(_embed(model, tokenizer), _embed(reloaded, tokenizer), _embed(again, tok2)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a, c, rtol=0, atol=0)


def test_missing_model_name_is_a_clear_error(tmp_path):
    path, name, cfg, _ = _custom_checkpoint(tmp_path, with_entry=False, prefix="")
    with pytest.raises(ValueError, match=r"does not name its model .* pass --model NAME"):
        load_checkpoint(path)
    cfg_path = tmp_path / f"{name}.json"
    cfg_path.write_text(json.dumps(cfg))
    model, _, _ = load_checkpoint(path, model_config=cfg_path)
    assert model.clip_dcl_model_name == name
    with pytest.raises(ValueError, match="does not fit model 'clip-dcl-tiny'"):
        load_checkpoint(path, model=TINY_MODEL)
    with pytest.raises(ValueError, match="does not exist"):
        load_checkpoint(tmp_path / "nothere.pt")
    assert export_main([str(tmp_path / "nothere.pt"), str(tmp_path / "o2")]) == 2


def test_checkpoint_of_our_training_loads_from_its_entry(tmp_path):
    """A checkpoint written by ``clip_dcl.train`` (its ``clip_dcl`` entry, loss state beside the
    weights) loads away from its logs folder with no model name, with the trained transform."""
    import shutil

    from clip_dcl.train import main as train_main

    rc = train_main(
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
            str(tmp_path / "logs"),
            "--name",
            "y",
            "--save-frequency",
            "1",
            "--report-to",
            "",
            "--loss",
            "clip",
            "--image-mean",
            "0.5",
            "0.5",
            "0.5",
            "--image-std",
            "0.25",
            "0.25",
            "0.25",
        ]
    )
    assert rc == 0
    src = tmp_path / "logs" / "y" / "checkpoints" / "epoch_1.pt"
    ckpt = torch.load(src, map_location="cpu", weights_only=True)
    assert ckpt["clip_dcl"]["model"] == TINY_MODEL
    moved = tmp_path / "elsewhere" / "ckpt.pt"
    moved.parent.mkdir()
    shutil.copy(src, moved)  # no params.txt two folders up
    model, preprocess, tokenizer = load_checkpoint(moved)
    assert model.clip_dcl_model_name == TINY_MODEL
    assert tuple(preprocess.transforms[-1].mean) == (0.5, 0.5, 0.5)
    assert tuple(preprocess.transforms[-1].std) == (0.25, 0.25, 0.25)
    out = export(moved, tmp_path / "exp")
    assert json.loads((out / CONFIG_NAME).read_text())["preprocess_cfg"]["mean"] == [0.5, 0.5, 0.5]


def test_export_command(trained, tmp_path, capsys):
    assert export_main([str(trained), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / WEIGHTS_NAME).is_file()
    assert "local-dir:" in capsys.readouterr().out
    assert export_main([str(tmp_path / "nothere.pt"), str(tmp_path / "o2")]) == 2
    assert "does not exist" in capsys.readouterr().err


class _CreatesFile:
    """Unpickling this object opens (creates) a file: a stand-in for a pickle that runs code."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_checkpoint_that_would_run_code_is_refused_and_runs_nothing(tmp_path, capsys):
    from clip_dcl.checkpoint import UnsafeCheckpoint, load_checkpoint
    from clip_dcl.eval.cli import main as eval_main

    marker = tmp_path / "pwned"
    crafted = tmp_path / "epoch_1.pt"
    torch.save({"state_dict": {}, "payload": _CreatesFile(marker)}, crafted)
    with pytest.raises(UnsafeCheckpoint, match="--unsafe-pickle"):
        load_checkpoint(crafted, model="clip-dcl-tiny")
    assert export_main([str(crafted), str(tmp_path / "out"), "--model", "clip-dcl-tiny"]) == 2
    assert "can run code" in capsys.readouterr().err
    assert eval_main(["zeroshot", "--checkpoint", str(crafted), "--data", str(tmp_path)]) != 0
    assert not marker.exists() and not (tmp_path / "out").exists()
    # the explicit opt-in does unpickle it (and then finds no model weights in it)
    with pytest.raises(ValueError):
        load_checkpoint(crafted, model="clip-dcl-tiny", allow_unsafe_pickle=True)
    assert marker.exists()


def _val_shards(tmp_path) -> str:
    """Retrieval shards that exist (the data is checked before the checkpoint is read)."""
    from test_train import dense_keys, write_shards

    return write_shards(tmp_path / "val", dense_keys(num_shards=1, per_shard=2))


def test_truncated_checkpoint_is_a_one_line_error_naming_the_file(tmp_path, capsys):
    from clip_dcl.eval.cli import main as eval_main

    path, name, _, _ = _custom_checkpoint(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # a save killed halfway
    with pytest.raises(ValueError, match=r"epoch_3\.pt' cannot be read; it is truncated") as err:
        load_checkpoint(path)
    assert "\n" not in str(err.value)
    assert export_main([str(path), str(tmp_path / "out")]) == 2
    out = capsys.readouterr().err
    assert str(path) in out and "Traceback" not in out and len(out.strip().splitlines()) == 1
    assert eval_main(["retrieval", "--checkpoint", str(path), "--data", _val_shards(tmp_path), "--device", "cpu"]) == 2
    assert "cannot be read" in capsys.readouterr().err


def test_export_refuses_a_non_empty_folder_without_force(tmp_path, capsys):
    path, _, cfg, _ = _custom_checkpoint(tmp_path)
    out = tmp_path / "exp"
    out.mkdir()
    (out / "notes.txt").write_text("a previous export")
    with pytest.raises(ValueError, match=r"not empty \(holds notes.txt\); pass --force"):
        export(path, out)
    assert export_main([str(path), str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert not (out / CONFIG_NAME).exists()
    assert export_main([str(path), str(out), "--force"]) == 0
    assert json.loads((out / CONFIG_NAME).read_text())["model_cfg"] == cfg
    assert (out / "notes.txt").exists()


@needs_local_dir
def test_load_checkpoint_returns_the_eval_model_openclips_preprocess_val_and_the_tokenizer(tmp_path):
    """What the docs say it returns: OpenCLIP's factory gives (model, preprocess_train, preprocess_val);
    load_checkpoint gives (model in eval mode, that preprocess_val, the tokenizer)."""
    import open_clip

    path, _, _, _ = _custom_checkpoint(tmp_path)
    out = export(path, tmp_path / "exp")
    model, preprocess, tokenizer = load_checkpoint(out)
    _, train, val = open_clip.create_model_and_transforms(f"local-dir:{out}")
    assert not model.training and repr(preprocess) == repr(val) != repr(train)
    assert torch.equal(tokenizer(["a red square"]), open_clip.get_tokenizer(f"local-dir:{out}")(["a red square"]))


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_exported_files_have_the_mode_the_umask_gives(tmp_path, umask, mode):
    """A service running as another user reads an export made under umask 022 (safetensors alone
    leaves its file 0600)."""
    import stat

    path, _, _, _ = _custom_checkpoint(tmp_path)
    before = os.umask(umask)
    try:
        out = export(path, tmp_path / "exp")
    finally:
        os.umask(before)
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {
        CONFIG_NAME: mode,
        "open_clip_model.safetensors": mode,
    }


def test_openclip_checkpoint_of_a_custom_config_loads_from_params_txt(tmp_path):
    """OpenCLIP's own layout: logs/NAME/params.txt (model, model_config) and checkpoints/epoch_K.pt."""
    import open_clip

    path, name, cfg, model = _custom_checkpoint(tmp_path, with_entry=False)
    run = tmp_path / "logs" / "run"
    (run / "checkpoints").mkdir(parents=True)
    ckpt = run / "checkpoints" / "epoch_3.pt"
    path.rename(ckpt)
    cfg_path = tmp_path / "configs" / f"{name}.json"
    cfg_path.parent.mkdir()
    cfg_path.write_text(json.dumps(cfg))
    (run / "params.txt").write_text(f"lr: 0.001\nmodel: {name}\nmodel_config: {cfg_path}\nname: run\n")
    assert name not in open_clip.list_models()
    loaded, _, tokenizer = load_checkpoint(ckpt)
    assert loaded.clip_dcl_model_name == name
    for a, b in zip(_embed(loaded, tokenizer), _embed(model, tokenizer)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    cfg_path.unlink()
    with pytest.raises(ValueError, match=r"names --model-config .* which does not exist; pass --model-config"):
        load_checkpoint(ckpt)


def test_the_trainer_writes_the_format_the_reader_defines(tmp_path, monkeypatch):
    """Checkpoint keys are spelled once, in clip_dcl.train.saving; the trainer writes what it says."""
    import argparse

    import clip_dcl.train.saving as fmt
    from clip_dcl.train.flags import TrainConfig
    from clip_dcl.train.run import TrainingRun

    run = TrainingRun(TrainConfig("dcl", {"tau_plus": 0.1}, {"tau_plus": 0.1, "clamp": "clamp"}))
    run.loss = torch.nn.Module()
    run.loss.register_buffer("calls", torch.tensor(7))
    run.args = argparse.Namespace(
        model=TINY_MODEL,
        force_quick_gelu=False,
        force_patch_dropout=None,
        force_image_size=None,
        force_context_length=None,
        force_custom_text=False,
    )
    register_builtin_configs()
    monkeypatch.setattr(fmt, "CKPT_KEY", "renamed_entry")
    monkeypatch.setattr(fmt, "LOSS_STATE_KEY", "renamed_state")
    target = tmp_path / "epoch_1.pt"
    run.save({"epoch": 1, "name": "x", "state_dict": {}, "optimizer": {}}, str(target))
    ckpt = torch.load(target, weights_only=True)
    assert set(ckpt) == {"epoch", "name", "state_dict", "optimizer", "renamed_entry", "renamed_state"}
    assert int(ckpt["renamed_state"]["calls"]) == 7
    assert ckpt["renamed_entry"] == fmt.checkpoint_entry(
        TINY_MODEL, fmt.trained_model_config(run.args), None, "dcl", {"tau_plus": 0.1, "clamp": "clamp"}
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch_1.pt"]


def test_one_module_reads_and_writes_training_checkpoints():
    """Every torch.load and atomic write of clip-dcl is train/saving.py's, and saving imports no module
    that calls it (the loader, the run, the loss state): nothing else builds or parses the files."""
    import ast
    from pathlib import Path

    import clip_dcl

    package = Path(clip_dcl.__file__).parent
    owners = sorted(
        str(p.relative_to(package))
        for p in package.rglob("*.py")
        if "torch.load(" in p.read_text() or "PARTIAL_SUFFIX =" in p.read_text()
    )
    assert owners == ["train/saving.py"]
    imported = set()
    for node in ast.walk(ast.parse((package / "train" / "saving.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.startswith("clip_dcl"):
            imported.add(node.module)
        elif (isinstance(node, ast.ImportFrom) and node.level) or (
            isinstance(node, ast.Import) and any(a.name.startswith("clip_dcl") for a in node.names)
        ):
            imported.add(f"relative or plain import at line {node.lineno}")
    assert imported == {"clip_dcl._version", "clip_dcl.losses.base", "clip_dcl.losses.state"}


def test_a_save_killed_halfway_leaves_no_torn_pt_file(tmp_path, monkeypatch):
    from clip_dcl.train.flags import TrainConfig
    from clip_dcl.train.run import TrainingRun

    def dies_halfway(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half of a zip")
        raise KeyboardInterrupt

    run = TrainingRun(TrainConfig("clip", {}, {}))
    monkeypatch.setattr(torch, "save", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        run.save({"epoch": 2, "state_dict": {}}, str(tmp_path / "epoch_2.pt"))
    assert list(tmp_path.iterdir()) == []


# -- clear last lines: the wrong model, a full disk ------------------------------------------------------
def test_a_checkpoint_loaded_as_another_model_names_the_model_it_was_trained_as(trained, tmp_path, capsys):
    from clip_dcl.checkpoint import register_config_dict
    from clip_dcl.eval.cli import main as eval_main

    path, name, cfg, _ = _custom_checkpoint(tmp_path)  # its clip_dcl entry names the model
    with pytest.raises(ValueError) as err:
        load_checkpoint(path, model=TINY_MODEL)
    msg = str(err.value)
    assert (
        f"was trained as model {name!r} (its 'clip_dcl' entry), not 'clip-dcl-tiny' as --model clip-dcl-tiny "
        "asks" in msg
    )
    assert msg.endswith(f"Drop --model (the checkpoint names its model) or pass --model {name}")
    assert "tensor(s) of another shape (e.g. " in msg and "size mismatch for" not in msg  # one line, not torch's list
    # an OpenCLIP-native checkpoint: its run's params.txt says what it was trained as
    register_config_dict("clip-dcl-test-other", cfg)
    with pytest.raises(
        ValueError,
        match=r"was trained as model 'clip-dcl-tiny' \(the params.txt of its run\), not "
        r"'clip-dcl-test-other'",
    ):
        load_checkpoint(trained, model="clip-dcl-test-other")
    rc = eval_main(
        [
            "retrieval",
            "--checkpoint",
            str(path),
            "--model",
            TINY_MODEL,
            "--data",
            _val_shards(tmp_path),
            "--no-progress",
            "--device",
            "cpu",
        ]
    )
    assert rc == 2 and f"was trained as model {name!r}" in capsys.readouterr().err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_names_the_file_the_space_and_the_intact_previous_checkpoint(tmp_path):
    from clip_dcl.train.saving import CheckpointDiskFull, save_atomically

    save_atomically({"w": torch.zeros(4)}, tmp_path / "epoch_1.pt")
    (tmp_path / "epoch_2.pt.partial").symlink_to("/dev/full")  # every write to it fails with ENOSPC
    with pytest.raises(CheckpointDiskFull) as err:
        save_atomically({"w": torch.zeros(1 << 16)}, tmp_path / "epoch_2.pt")
    msg = str(err.value)
    assert msg.startswith(
        f"cannot write checkpoint {tmp_path / 'epoch_2.pt'}: the disk is full (No space left on "
        "device); it needs about 256.0 KB, "
    )
    assert f"The previous checkpoint, {tmp_path / 'epoch_1.pt'}, is intact (the partial file was removed)" in msg
    assert "--resume latest" in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch_1.pt"]
    assert torch.equal(torch.load(tmp_path / "epoch_1.pt", weights_only=True)["w"], torch.zeros(4))


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_during_training_ends_with_one_clear_line(tmp_path, capsys, monkeypatch):
    from clip_dcl.train import main as train_main
    from clip_dcl.train import saving as ckpt_format

    folder = tmp_path / "logs" / "f" / "checkpoints"
    folder.mkdir(parents=True)
    removes = ckpt_format.remove_stale_partials

    def then_fill(where):  # planted once the run has removed stale partial files (as it starts)
        removed = removes(where)
        (folder / "epoch_2.pt.partial").symlink_to("/dev/full")  # the disk fills up before the second save
        return removed

    monkeypatch.setattr(ckpt_format, "remove_stale_partials", then_fill)
    rc = train_main(
        [
            "--dataset-type",
            "synthetic",
            "--train-num-samples",
            "8",
            "--batch-size",
            "4",
            "--epochs",
            "2",
            "--workers",
            "0",
            "--model",
            TINY_MODEL,
            "--logs",
            str(tmp_path / "logs"),
            "--name",
            "f",
            "--save-frequency",
            "1",
            "--report-to",
            "",
            "--loss",
            "clip",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 1
    assert f"clip-dcl train: error: cannot write checkpoint {folder / 'epoch_2.pt'}: the disk is full" in err
    assert f"The previous checkpoint, {folder / 'epoch_1.pt'}, is intact" in err
    assert "Traceback" not in err and "inline_container" not in err
    assert sorted(p.name for p in folder.iterdir()) == ["epoch_1.pt"]
    load_checkpoint(folder / "epoch_1.pt")  # whole
