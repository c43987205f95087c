"""OpenCLIP sees clip-dcl's models after ``import clip_dcl``: ``open_clip.create_model_and_transforms(
"clip-dcl-tiny", pretrained=...)`` loads our training checkpoints and our exports, in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

SCRIPT = r"""
import json, sys
import clip_dcl
assert "torch" not in sys.modules and "open_clip" not in sys.modules, "import clip_dcl imported torch or OpenCLIP"
import open_clip
import torch
tokenizer = open_clip.get_tokenizer("clip-dcl-tiny")
for pretrained in sys.argv[1:]:
    model, _, preprocess = open_clip.create_model_and_transforms("clip-dcl-tiny", pretrained=pretrained)
    with torch.no_grad():
        text = model.eval().encode_text(tokenizer(["a red square", "two blue circles"]))
    print(json.dumps(text.tolist()))
"""


def _open_clip_features(*pretrained):
    """The text features of each checkpoint as OpenCLIP loads it, in one fresh interpreter."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    # a fresh interpreter, not the preloaded one: the script checks that `import clip_dcl` imports neither torch
    # nor OpenCLIP, which only an interpreter that has not imported them yet can tell
    res = subprocess.run(
        [sys.executable, "-c", SCRIPT, *map(str, pretrained)], capture_output=True, text=True, env=env, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()[-len(pretrained) :]
    return [torch.tensor(json.loads(line)) for line in lines]


def test_open_clip_loads_our_checkpoint_and_export_after_import_clip_dcl(trained_run, tmp_path):
    from clip_dcl.checkpoint import export, load_checkpoint

    ckpt = trained_run("decl") / "checkpoints" / "epoch_1.pt"
    model, _, tokenizer = load_checkpoint(ckpt)
    with torch.no_grad():
        ours = model.encode_text(tokenizer(["a red square", "two blue circles"]))
    folder = export(ckpt, tmp_path / "exported")
    from_checkpoint, from_export = _open_clip_features(ckpt, folder / "open_clip_model.safetensors")
    assert torch.equal(from_checkpoint, ours)  # the trained weights, not a random model
    assert torch.equal(from_export, ours)


def test_registration_waits_for_open_clip_and_happens_once(monkeypatch):
    import open_clip

    from clip_dcl import models

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    models.register_on_open_clip_import()  # OpenCLIP is imported here: registered at once, no hook left
    assert "clip-dcl-tiny" in open_clip.list_models()
    assert not any(isinstance(f, models._OnOpenClipImport) for f in sys.meta_path)
