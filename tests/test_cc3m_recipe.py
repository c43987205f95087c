"""The CC3M recipe (launch/cc3m_rn50x4.sh) runs for real (``DRY_RUN=0``) at tiny size.

Its data paths, sizes and model come from its documented variables and from flags appended after
it (which override the recipe's): 64 synthetic pairs in one shard, the tiny model, one epoch of 4
steps on the CPU through torchrun with one process. The recipe's flags themselves (RN50x4, 30 epochs,
the CC3M buffer size) are checked without running in tests/test_launch.py.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
RECIPE = Path(__file__).resolve().parents[1] / "launch" / "cc3m_rn50x4.sh"
HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


@pytest.fixture(scope="module")
def shards(tmp_path_factory, preloaded):
    out = tmp_path_factory.mktemp("cc3m-synth")
    res = subprocess.run(
        [
            preloaded.python,
            "-m",
            "clip_dcl.cli",
            "data",
            "synth",
            str(out),
            "--quick",
            "--train-samples",
            "64",
            "--shard-size",
            "64",
            "--quiet",
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    return out / "train"


def run_recipe(python, shards, logs, loss, **env):
    """The recipe through bash and torchrun, what this file is about; ``python`` (the preloaded one, which
    torchrun's rank starts from too) saves torch's import in each process."""
    full = {k: v for k, v in os.environ.items() if k not in ("NPROC", "CC3M_TRAIN", "TRAIN_DATA", "DRY_RUN")}
    full.update(
        LOSS=loss,
        CC3M_TRAIN=str(shards),
        NUM_SHARDS="1",
        SAMPLES_PER_SHARD="64",
        BATCH_SIZE="16",
        WORKERS="1",
        PRECISION="fp32",
        LOGS=str(logs),
        NPROC="1",
        PYTHON=python,
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
        DRY_RUN="0",
        **env,
    )
    return subprocess.run(
        [
            "bash",
            str(RECIPE),
            "--model",
            "clip-dcl-tiny",
            "--epochs",
            "1",
            "--warmup",
            "1",
            "--device",
            "cpu",
            "--train-num-samples",
            "64",
        ],
        capture_output=True,
        text=True,
        env=full,
        timeout=300,
    )


@pytest.mark.parametrize("loss", ["decl", "dcl"])
def test_the_recipe_trains_its_first_steps_on_synthetic_shards(preloaded, shards, tmp_path, loss):
    res = run_recipe(preloaded.python, shards, tmp_path, loss, REPORT_TO="tensorboard" if HAS_TENSORBOARD else "")
    assert res.returncode == 0, res.stderr[-4000:]
    run = tmp_path / f"cc3m-rn50x4-{loss}"
    log = (run / "out.log").read_text()
    assert "Train Epoch: 0 [64/64 (100%)]" in log
    assert (run / "checkpoints" / "epoch_1.pt").is_file()
    if loss == "decl":  # the buffer sized NUM_SHARDS x SAMPLES_PER_SHARD, every key a row of it
        assert "'num_samples': 64" in log and "64 distinct samples, 64 distinct ids" in log
    if HAS_TENSORBOARD:
        assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    # without TAU_PLUS, dcl trains InfoNCE exactly, and the run says so in one line
    said = [ln for ln in res.stderr.splitlines() if "InfoNCE exactly" in ln]
    assert len(said) == (1 if loss == "dcl" else 0), said


@pytest.mark.skipif(HAS_TENSORBOARD, reason="tensorboard is installed: the recipe's default logger works")
def test_the_recipes_default_logger_missing_is_refused_naming_the_extra(preloaded, shards, tmp_path):
    res = run_recipe(preloaded.python, shards, tmp_path, "clip")  # REPORT_TO unset: the recipe's default, tensorboard
    assert res.returncode != 0  # torchrun reports the worker's 2 as a failure of its own (1)
    assert "clip-dcl[tensorboard]" in res.stderr and not (tmp_path / "cc3m-rn50x4-clip").exists()
