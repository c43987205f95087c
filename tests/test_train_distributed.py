"""Two-process training on CPU (gloo) through ``torchrun -m clip_dcl.train -- ARGS``.

Each loss runs 2 optimizer steps with ``--local-loss --gather-with-grad``; for DeCL both ranks
must end with the same state: every rank logs a digest of the whole loss state, and it must be the
digest of the state the checkpoint holds (with its rate buffer in one file per rank when sharded).
A sharded run resumes in one process, from the two shards, with its state restored exactly.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset as wds
from PIL import Image

from clip_dcl.train.saving import loss_state_digest, read_loss_state


def write_shards(out: Path, num_shards=4, per_shard=16):
    """img2dataset-style shards with keys ``shard * 100 + i``; returns the brace pattern."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    sizes = {}
    for s in range(num_shards):
        name = f"{s:05d}.tar"
        with wds.TarWriter(str(out / name)) as w:
            for i in range(per_shard):
                key = f"{s * 100 + i:09d}"
                buf = io.BytesIO()
                Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buf, format="JPEG")
                w.write(
                    {
                        "__key__": key,
                        "jpg": buf.getvalue(),
                        "txt": f"sample {key}",
                        "json": json.dumps({"key": key, "caption": f"sample {key}"}).encode(),
                    }
                )
        sizes[name] = per_shard
    (out / "sizes.json").write_text(json.dumps(sizes))
    return str(out / f"{{00000..{num_shards - 1:05d}}}.tar")


def train(python, tmp_path, pattern, name, loss, flags, nproc=2, epochs=1, extra=(), gather=("--gather-with-grad",)):
    """torchrun's ranks are processes of their own, what this file is about; ``python`` (the preloaded one, which
    torchrun's ranks start from too) saves torch's import in each."""
    launch = (
        [
            python,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(nproc),
            "-m",
            "clip_dcl.train",
            "--",
        ]
        if nproc > 1
        else [python, "-m", "clip_dcl.train"]
    )
    cmd = [
        *launch,
        "--model",
        "clip-dcl-tiny",
        "--train-data",
        pattern,
        "--dataset-type",
        "webdataset",
        "--train-num-samples",
        "32",
        "--batch-size",
        "8",
        "--workers",
        "1",
        "--epochs",
        str(epochs),
        "--precision",
        "fp32",
        "--device",
        "cpu",
        "--local-loss",
        *gather,
        "--lr",
        "1e-3",
        "--warmup",
        "1",
        "--log-every-n-steps",
        "1",
        "--logs",
        str(tmp_path / "logs"),
        "--name",
        name,
        "--loss",
        loss,
        *flags,
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    return out


DECL = ["--decl-rate", "index", "--decl-num-samples", "400"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, loss, flags, term",
    [
        ("clip", "clip", [], "Contrastive_loss:"),
        ("dcl", "dcl", ["--tau-plus", "0.1"], "Dcl_loss:"),
        ("decl", "decl", DECL, "Decl_loss:"),
        ("decl_replicated", "decl", DECL + ["--decl-state", "replicated"], "Decl_loss:"),
        ("clip_no_grad_gather", "clip", ["--no-grad-gather"], "Contrastive_loss:"),
        ("decl_no_grad_gather", "decl", DECL + ["--no-grad-gather"], "Decl_loss:"),
    ],
)
def test_two_ranks_train_and_agree_on_loss_state(tmp_path, preloaded, name, loss, flags, term):
    pattern = write_shards(tmp_path / "shards")
    gather = () if "--no-grad-gather" in flags else ("--gather-with-grad",)
    out = train(preloaded.python, tmp_path, pattern, name, loss, flags, gather=gather)
    log = (tmp_path / "logs" / name / "out.log").read_text()
    lines = [line for line in log.splitlines() if "Train Epoch:" in line]
    assert len(lines) == 2 and all(term in line for line in lines)  # 32 samples / (8 x 2 ranks)
    assert "world_size: 2" in log
    path = tmp_path / "logs" / name / "checkpoints" / "epoch_1.pt"
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    assert ckpt["clip_dcl"]["loss"] == loss
    assert all(k.startswith("module.") for k in ckpt["state_dict"])  # saved from the DDP-wrapped model
    if loss == "decl":
        digests = dict(re.findall(r"Loss state after epoch 0 on rank (\d): calls 2, digest ([0-9a-f]{64})", out.stderr))
        assert set(digests) == {"0", "1"}, out.stderr[-3000:]
        state = read_loss_state(path)
        assert digests["0"] == digests["1"] == loss_state_digest(state)
        sharded = name != "decl_replicated"
        assert ("log_rate" in ckpt["loss_state"]) != sharded  # sharded: in one file per rank, beside
        rows = (~torch.isnan(state["log_rate"]).any(0)).nonzero().flatten().tolist()
        # 2 steps x 16 global rows, all distinct: the saved state holds both ranks' samples
        assert len(rows) == 32 and all(r % 100 < 16 and r // 100 < 4 for r in rows)
        if name == "decl":  # resumed in one process: its state is the two shards', exactly
            resumed = train(
                preloaded.python,
                tmp_path,
                pattern,
                "resumed",
                loss,
                flags,
                nproc=1,
                epochs=2,
                extra=["--resume", str(path)],
            )
            restored = re.findall(r"Restored the decl loss state from .*\(digest ([0-9a-f]{64})\)", resumed.stderr)
            assert restored == [digests["0"]], resumed.stderr[-3000:]
