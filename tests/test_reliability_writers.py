"""Every writer outside training is finished or visibly unfinished, and each of its faults is one line: the data
writers hold their output (a second writer refused, an interrupted one named as unfinished), every JSON is
written whole, `export` renames a finished folder into place and a folder without weights is refused, and a full
disk, a read-only folder, corrupt or malicious export weights, a decompression bomb and Ctrl-C each end in one
line naming the file or flag and the fix, exit 1, 2 or 130."""

from __future__ import annotations

import ast
import errno
import io
import json
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_reliability_plan_data import read_only

from clip_dcl.checkpoint import CONFIG_NAME, WEIGHTS_NAME, export, export_main, load_checkpoint
from clip_dcl.data import cli as data_cli

MARK = ".clip-dcl-writing"  # what a writer holds while it writes (clip_dcl.data.output)

ROOT = Path(__file__).resolve().parents[1]
#: the smallest synthetic set `data synth` writes (half a second)
TINY = [
    "--quick",
    "--quiet",
    "--train-samples",
    "16",
    "--val-samples",
    "8",
    "--num-classes",
    "4",
    "--zeroshot-per-class",
    "1",
    "--fewshot-train-per-class",
    "5",
    "--fewshot-test-per-class",
    "1",
    "--shard-size",
    "8",
]


def caught(run, *args):
    """``run(*args)``, whose Ctrl-C must end in its exit code: one that escapes fails this test alone."""
    try:
        return run(*args)
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped as an exception instead of ending in exit code 130")


def one_line(err: str) -> str:
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def disk_full_at(monkeypatch, name: str) -> None:
    """Writes of a file called ``name`` fail as on a full disk, after the file was opened (truncated)."""
    real_write, real_write_text = os.write, Path.write_text
    opened = {}

    def write(fd, data):
        path = os.readlink(f"/proc/self/fd/{fd}") if os.path.exists(f"/proc/self/fd/{fd}") else ""
        if f"{name}." in os.path.basename(path) or os.path.basename(path) == name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    def write_text(self, *a, **k):
        if self.name == name:
            open(self, "w").close()
            opened[name] = True
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real_write_text(self, *a, **k)

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(Path, "write_text", write_text)


# -- the data writers --------------------------------------------------------------------------------------------
def test_a_second_writer_into_one_folder_is_refused_in_one_line(tmp_path, capsys):
    """Issue: two `data synth --overwrite` into one folder at once: one exited 0, its summary said seed 0, two
    shards were seed 1's and the rest matched neither."""
    from clip_dcl.data.output import writing

    out = tmp_path / "data"
    with writing(out, "clip-dcl data synth (the first writer)"):
        assert data_cli.main(["synth", str(out), *TINY, "--overwrite", "--seed", "1"]) == 2
        line = one_line(capsys.readouterr().err)
        assert "is being written by another writer (clip-dcl data synth (the first writer)" in line
        assert not (out / "summary.json").exists() and not (out / "train").exists()
    assert data_cli.main(["synth", str(out), *TINY]) == 0  # once the first is done, the folder is free
    assert not (out / MARK).exists()


def test_an_interrupted_writer_leaves_a_folder_the_next_names_as_unfinished(tmp_path, capsys, monkeypatch):
    from clip_dcl.data.synth import layout

    out = tmp_path / "data"

    def stopped(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(layout, "_write_zeroshot", stopped)  # Ctrl-C halfway: shards written, no summary
    assert caught(data_cli.main, ["synth", str(out), *TINY]) == 130
    assert "unfinished" in one_line(capsys.readouterr().err) and (out / "train").is_dir()
    monkeypatch.undo()
    for again in ([], ["--reuse"]):
        assert data_cli.main(["synth", str(out), *TINY, *again]) == 2
        line = one_line(capsys.readouterr().err)
        assert "is unfinished" in line and "--overwrite" in line
    assert data_cli.main(["synth", str(out), *TINY, "--overwrite"]) == 0
    assert json.loads((out / "summary.json").read_text())["train"]["num_samples"] == 16
    assert not (out / MARK).exists()


def test_a_refused_writer_leaves_a_finished_folder_as_it_was(tmp_path, capsys):
    out = tmp_path / "data"
    assert data_cli.main(["synth", str(out), *TINY]) == 0
    with pytest.raises(SystemExit):  # already there, no --overwrite: refused before anything is touched
        data_cli.main(["synth", str(out), *TINY])
    capsys.readouterr()
    assert not (out / MARK).exists() and data_cli.main(["synth", str(out), *TINY, "--reuse"]) == 0


def test_a_full_disk_in_data_synth_is_one_line_and_leaves_no_empty_json(tmp_path, capsys, monkeypatch):
    """Issue: a full disk in `data synth`: a traceback, and a 0-byte summary.json."""
    out = tmp_path / "data"
    disk_full_at(monkeypatch, "summary.json")
    assert data_cli.main(["synth", str(out), *TINY]) == 1
    line = one_line(capsys.readouterr().err)
    assert "No space left on device" in line and "summary.json" in line and "free space" in line
    assert not (out / "summary.json").exists() and not list(out.glob(".summary.json*"))


@pytest.mark.parametrize("writer", ["synth", "shards", "pack"])
def test_a_read_only_folder_is_one_line(tmp_path, capsys, monkeypatch, writer):
    """Issue: a read-only folder for `data synth`, `data shards`, `data pack`: a traceback. (Tests run as root,
    for whom permission bits do not stop a write: the file system's refusal is stood in for.)"""
    shards = tmp_path / "shards"
    write_shard(shards / "0.tar", [("000000000", small_png((1, 2, 3)), "a patch")])
    pairs = tmp_path / "pairs"
    pairs.mkdir()
    for i in range(4):
        Image.new("RGB", (16, 16), (40 * i, 0, 0)).save(pairs / f"img{i}.png")
        (pairs / f"img{i}.txt").write_text(f"a patch of red {i}\n")
    ro = tmp_path / "ro"
    ro.mkdir()
    read_only(monkeypatch, ro)
    argv = {
        "synth": ["synth", str(ro / "data"), *TINY],
        "shards": ["shards", str(pairs), str(ro / "data"), "--quiet"],
        "pack": ["pack", str(shards / "0.tar"), str(ro / "train.npz"), "--quiet"],
    }[writer]
    assert data_cli.main(argv) == 1
    line = one_line(capsys.readouterr().err)
    assert "Read-only file system" in line and str(ro) in line and "write" in line
    assert list(ro.iterdir()) == []


def test_a_decompression_bomb_in_data_pack_is_skipped_and_counted(tmp_path, capsys, monkeypatch, caplog):
    """Issue: `data pack` on a decompression bomb ended in a traceback."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # a 64 x 64 image is then more than twice the limit
    shard = tmp_path / "0.tar"
    write_shard(
        shard,
        [("000000000", small_png((1, 2, 3), 30), "a small patch"), ("000000001", small_png((3, 2, 1), 64), "a bomb")],
    )
    assert data_cli.main(["pack", str(shard), str(tmp_path / "train.npz"), "--quiet"]) == 0
    assert "1 samples" in capsys.readouterr().out
    assert any("undecodable image" in r.getMessage() and "1 sample(s)" in r.getMessage() for r in caplog.records)
    with np.load(tmp_path / "train.npz") as f:
        assert list(f["keys"]) == ["000000000"]


# -- export and its readers ---------------------------------------------------------------------------------------
def custom_checkpoint(tmp_path) -> Path:
    from test_checkpoint import _custom_checkpoint

    return _custom_checkpoint(tmp_path)[0]


def test_an_export_stopped_between_its_writes_leaves_no_folder_and_a_folder_without_weights_is_refused(
    tmp_path, capsys, monkeypatch
):
    """Issue: an `export` stopped between its two writes left open_clip_config.json alone; `eval` on it exited 0
    with a randomly initialised model's numbers and `load_checkpoint` returned that model."""
    import safetensors.torch

    ckpt, out = custom_checkpoint(tmp_path), tmp_path / "exp"

    def stopped(*a, **k):  # the stop lands once the config is written, before the weights
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.torch, "save_file", stopped)
    assert caught(export_main, [str(ckpt), str(out)]) == 130
    assert "as it was" in one_line(capsys.readouterr().err)
    assert not out.exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    monkeypatch.undo()
    export(ckpt, out)
    (out / WEIGHTS_NAME).unlink()  # what the stop left before
    with pytest.raises(ValueError, match="holds no weights.*export the model again"):
        load_checkpoint(out)
    from clip_dcl.eval.cli import main as eval_main

    code = eval_main(["retrieval", "--checkpoint", str(out), *retrieval_argv(tmp_path)[3:]])
    assert code == 2 and "holds no weights" in one_line(capsys.readouterr().err)


def test_corrupt_or_malicious_export_weights_are_refused_in_one_line_and_run_nothing(tmp_path):
    """Issue: a malicious or corrupt export's weights: no code ran, but 40 lines; a file of random bytes was
    told to try --unsafe-pickle."""
    out = export(custom_checkpoint(tmp_path), tmp_path / "exp")
    (out / WEIGHTS_NAME).write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(ValueError) as e:
        load_checkpoint(out)
    assert "is not a safetensors file" in str(e.value) and "unsafe" not in str(e.value)
    assert "\n" not in str(e.value)
    config = (out / CONFIG_NAME).read_text()
    (out / CONFIG_NAME).write_text(config[: len(config) // 2])  # a config cut short
    with pytest.raises(ValueError, match="is not a readable model config.*export the model again"):
        load_checkpoint(out)
    (out / CONFIG_NAME).write_text(config)
    (out / WEIGHTS_NAME).rename(out / "open_clip_pytorch_model.bin")
    with pytest.raises(ValueError) as e:
        load_checkpoint(out)
    assert "is not a checkpoint" in str(e.value) and "unsafe" not in str(e.value)
    marker = tmp_path / "ran"
    with open(out / "open_clip_pytorch_model.bin", "wb") as f:
        pickle.dump(RunsCode(str(marker)), f)
    with pytest.raises(ValueError, match="--unsafe-pickle"):
        load_checkpoint(out)
    assert not marker.exists()


class RunsCode:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_read_only_folder_for_export_is_one_line(tmp_path, capsys, monkeypatch):
    ckpt = custom_checkpoint(tmp_path)
    ro = tmp_path / "ro"
    ro.mkdir()
    read_only(monkeypatch, ro)
    assert export_main([str(ckpt), str(ro / "exp")]) == 1
    line = one_line(capsys.readouterr().err)
    assert "Read-only file system" in line and "OUT_DIR you can write in" in line
    assert list(ro.iterdir()) == []


# -- eval -----------------------------------------------------------------------------------------------------------
def retrieval_argv(tmp_path) -> list:
    """``eval retrieval`` of the tiny model (randomly initialised) on four pairs."""
    folder = tmp_path / "shards"
    write_shard(folder / "0.tar", [(f"{i:09d}", small_png((30 * i, 0, 0)), f"a patch {i}") for i in range(4)])
    return ["retrieval", "--model", "clip-dcl-tiny", "--data", str(folder), "--no-progress", "--device", "cpu"]


def test_a_full_disk_in_eval_output_is_one_line_and_leaves_no_empty_json(tmp_path, capsys, monkeypatch):
    """Issue: a full disk in `eval --output`: a traceback, and a 0-byte JSON left (written in place)."""
    out = tmp_path / "r.json"
    disk_full_at(monkeypatch, "r.json")
    assert eval_main([*retrieval_argv(tmp_path), "--output", str(out)]) == 1
    line = one_line(capsys.readouterr().err)
    assert "No space left on device" in line and str(out) in line
    assert not out.exists() and not list(tmp_path.glob(".r.json*"))


def test_ctrl_c_in_eval_fewshot_is_one_line_and_130(tmp_path, capsys, monkeypatch):
    """Issue: Ctrl-C in `eval fewshot` ended in a traceback."""
    from test_evalsets import colour_split, write_iris

    from clip_dcl.eval import fewshot

    names = ["red", "green", "blue"]
    write_iris(tmp_path / "colours", names, colour_split(names, 5), colour_split(names, 2))

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(fewshot, "run_fewshot", interrupted)
    argv = ["fewshot", "--model", "clip-dcl-tiny", "--data", str(tmp_path), "--datasets", "colours"]
    code = caught(eval_main, [*argv, "--no-progress", "--device", "cpu", "--output", str(tmp_path / "f.json")])
    assert code == 130 and "interrupted (Ctrl-C)" in one_line(capsys.readouterr().err)
    assert not (tmp_path / "f.json").exists()


def eval_main(argv):
    from clip_dcl.eval.cli import main

    return main(argv)


# -- one way to run a child process group -------------------------------------------------------------------------
def test_one_module_starts_signals_and_reaps_child_groups_and_installs_stop_handlers():
    """Outside the trainer, `subprocess.Popen`, `os.killpg` and `signal.signal` are written in clip_dcl/process.py
    only; the study engine and the demo take their exit codes from the table (no literal 130 or 75)."""
    found = {}
    for path in sorted((ROOT / "clip_dcl").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("clip_dcl/train/"):
            continue
        text = path.read_text()
        for name in ("subprocess.Popen(", "os.killpg(", "signal.signal("):
            if name in text:
                found.setdefault(name, []).append(rel)
        if rel == "clip_dcl/demo.py" or rel.startswith("clip_dcl/experiment/"):
            codes = [
                n.lineno for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Constant) and n.value in (75, 130)
            ]
            assert not codes, f"{rel}: the exit code as a number on line(s) {codes}"
    assert found == {name: ["clip_dcl/process.py"] for name in found} and len(found) == 3


def test_a_stop_while_a_child_group_runs_is_passed_to_its_group_and_raised(tmp_path):
    """What the study's data step and the runner rely on: SIGTERM to this process, while a child group runs,
    reaches every process of the group (a grandchild too), and `Stopped` is raised once the group has ended."""
    import signal
    import threading
    import time

    from clip_dcl import process

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("stop handlers are installed from the main thread only")
    pid_file = tmp_path / "pid"
    before = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
    with process.stop_on_signals():
        timer.start()
        with pytest.raises(process.Stopped):
            process.run_group(["bash", "-c", f"sleep 60 & echo $! > {pid_file}; wait"])
    assert signal.getsignal(signal.SIGTERM) is before
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _running(grandchild):
        assert time.monotonic() < deadline, "the grandchild outlived the stop"
        time.sleep(0.05)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


# -- small shards --------------------------------------------------------------------------------------------------
def small_png(rgb, size: int = 16) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), tuple(int(v) % 256 for v in rgb)).save(buf, format="PNG")
    return buf.getvalue()


def write_shard(path: Path, samples) -> None:
    """A .tar shard of ``(key, png bytes, caption)``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tf:
        for key, png, caption in samples:
            for name, data in ((f"{key}.png", png), (f"{key}.txt", caption.encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
