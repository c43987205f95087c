"""``--captions-per-image M`` through the training pipeline and the flags; the new loss flags' errors.

The fast tests run the webdataset pipeline in-process on shards written here and parse flags; the
``slow`` one trains an epoch through ``python -m clip_dcl.train``'s ``main``.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset as wds
from PIL import Image

from clip_dcl.train import main
from clip_dcl.train.pipeline import draw_captions


def write_caption_shards(out: Path, num_shards=2, per_shard=16, txt_only=()):
    """Key ``k`` has ``k % 4 + 1`` captions ``"k c"`` in its json (``txt_only``: in its .txt lines instead)."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    sizes = {}
    for s in range(num_shards):
        name = f"{s:05d}.tar"
        with wds.TarWriter(str(out / name)) as w:
            for k in range(s * per_shard, (s + 1) * per_shard):
                captions = [f"{k} {c}" for c in range(k % 4 + 1)]
                buf = io.BytesIO()
                Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(buf, format="JPEG")
                meta = {"key": f"{k:09d}"}
                if k not in txt_only:
                    meta["captions"] = captions
                w.write(
                    {
                        "__key__": f"{k:09d}",
                        "jpg": buf.getvalue(),
                        "txt": "\n".join(captions) if k in txt_only else captions[0],
                        "json": json.dumps(meta).encode(),
                    }
                )
        sizes[name] = per_shard
    (out / "sizes.json").write_text(json.dumps(sizes))
    return str(out / f"{{00000..{num_shards - 1:05d}}}.tar")


def numbers(texts):
    """A stand-in tokenizer: ``"k c"`` -> ``[k, c]``; a list of M captions -> ``(M, 2)``."""
    if isinstance(texts, str):
        texts = [texts]
    return torch.tensor([[int(x) for x in t.split()] for t in texts])


def pipeline_args(pattern, m, workers=2, batch_size=8, seed=0):
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
            "--seed",
            str(seed),
        ]
    )
    args.world_size, args.rank, args.decl_num_samples, args.captions_per_image = 1, 0, None, m
    return args


def batches(info, epoch):
    info.set_epoch(epoch)
    return [(texts, ids) for _, texts, ids in info.dataloader]


def test_draw_captions_samples_without_repeats_or_repeats_in_order():
    rng = random.Random(0)
    drawn = draw_captions(list("abcde"), 3, rng)
    assert len(set(drawn)) == 3 and set(drawn) <= set("abcde")
    assert draw_captions(["a", "b"], 5, rng) == ["a", "b", "a", "b", "a"]
    assert draw_captions(["a"], 1, rng) == ["a"]
    draws = {tuple(draw_captions(list("abcd"), 2, random.Random(s))) for s in range(40)}
    assert len(draws) > 6  # not always the first two


@pytest.mark.parametrize("m", [1, 3])
def test_pipeline_yields_m_captions_per_image_in_image_order(tmp_path, m):
    from clip_dcl.train.pipeline import get_wds_train_dataset

    pattern = write_caption_shards(tmp_path / "shards", txt_only=(5, 6, 7))
    tok = numbers if m > 1 else (lambda text: numbers(text.splitlines()[0]))  # M = 1: the whole .txt, as before
    info = get_wds_train_dataset(pipeline_args(pattern, m), lambda img: torch.zeros(1), tokenizer=tok)
    seen = []
    for texts, ids in batches(info, 0):
        assert ids.shape == (8,) and texts.shape == (8 * m, 2)  # ids per image, M texts per image
        for i, key in enumerate(ids.tolist()):
            block = texts[i * m : (i + 1) * m]
            assert block[:, 0].tolist() == [key] * m  # the image's own captions, in image order
            have = key % 4 + 1
            if m == 1:
                assert block[0, 1] == 0  # one caption: the .txt (the first line), as before
            elif have >= m:
                assert len(set(block[:, 1].tolist())) == m  # drawn without repeats
            else:
                assert block[:, 1].tolist() == [c % have for c in range(m)]  # repeated in order
        seen += ids.tolist()
    assert sorted(seen) == list(range(32))
    if m > 1:  # the draw is a function of (seed, epoch, id): a fresh pipeline draws the same captions
        again = get_wds_train_dataset(pipeline_args(pattern, m), lambda img: torch.zeros(1), tokenizer=tok)
        first = {int(i): t.tolist() for texts, ids in batches(info, 1) for i, t in zip(ids, texts.reshape(8, m, 2))}
        second = {int(i): t.tolist() for texts, ids in batches(again, 1) for i, t in zip(ids, texts.reshape(8, m, 2))}
        assert first == second


# -- flags ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "flags, named",
    [
        (["--captions-per-image", "0"], "--captions-per-image must be >= 1, got 0"),
        (["--loss", "clip", "--hcl-beta", "0.5"], "--hcl-beta"),
        (["--loss", "curl", "--hcl-beta", "0.5"], "--hcl-beta"),
        (["--loss", "clip", "--tau-plus", "auto"], "--tau-plus"),
        (["--loss", "dcl", "--hcl-beta", "-1"], "--hcl-beta"),
        (["--loss", "dcl", "--tau-plus", "often"], "often"),
        (["--loss", "dcl", "--dcl-temperature", "0"], "--dcl-temperature"),
        (["--loss", "curl", "--curl-link", "softmax"], "softmax"),
        (["--loss", "decl", "--captions-per-image", "2", "--no-grad-gather", "--local-loss"], "--no-grad-gather"),
        (["--loss", "dcl", "--captions-per-image", "2", "--no-grad-gather", "--local-loss"], "--no-grad-gather"),
        (["--loss", "curl", "--no-grad-gather", "--local-loss"], "--no-grad-gather"),
        (["--loss", "dcl", "--hcl-beta", "1", "--no-grad-gather", "--local-loss"], "--hcl-beta"),
        (["--loss", "clip", "--captions-per-image", "2", "--siglip"], "--siglip"),
    ],
)
def test_bad_flag_values_fail_before_any_work(tmp_path, capsys, flags, named):
    pattern = write_caption_shards(tmp_path / "shards", num_shards=1, per_shard=2)
    logs = tmp_path / "logs"
    rc = main(["--train-data", pattern, "--logs", str(logs), "--device", "cpu", *flags])
    err = capsys.readouterr().err
    assert rc == 2
    assert named in err
    assert not logs.exists()


def test_flags_reach_the_loss_and_captions_per_image_the_config(tmp_path):
    from clip_dcl.train.flags import parse_train_args

    pattern = write_caption_shards(tmp_path / "shards")
    small = ["--workers", "1", "--batch-size", "8"]  # what the 2 shards of 16 can fill
    cfg = parse_train_args(
        [
            "--train-data",
            pattern,
            "--loss",
            "dcl",
            "--tau-plus",
            "auto",
            "--hcl-beta",
            "0.5",
            "--captions-per-image",
            "3",
            "--dcl-temperature",
            "0.1",
            *small,
        ]
    )
    assert cfg.captions_per_image == 3
    assert cfg.loss_kwargs == {"tau_plus": "auto", "beta": 0.5, "temperature": 0.1}
    cfg = parse_train_args(["--train-data", pattern, "--loss", "curl", "--curl-link", "hinge", *small])
    assert cfg.loss_kwargs == {"link": "hinge"} and cfg.captions_per_image == 1  # curl with M = 1 is allowed


def test_a_loss_registered_by_a_script_gets_its_flags_without_editing_flags_py(tmp_path):
    from clip_dcl.losses import LOSSES, LossFlag, register_loss
    from clip_dcl.losses.dcl import DebiasedClipLoss
    from clip_dcl.train.flags import build_parser, parse_train_args

    class Tempered(DebiasedClipLoss):
        flags = (LossFlag("--tempered-scale", "temperature", type=float, help="a fixed temperature"),)
        summary = "a test objective"

    saved = dict(LOSSES)
    try:
        register_loss("tempered")(Tempered)
        assert "--tempered-scale" in build_parser().format_help()
        pattern = write_caption_shards(tmp_path / "shards")
        cfg = parse_train_args(
            [
                "--train-data",
                pattern,
                "--loss",
                "tempered",
                "--tempered-scale",
                "0.5",
                "--workers",
                "1",
                "--batch-size",
                "8",
            ]
        )
        assert cfg.loss == "tempered" and cfg.loss_kwargs == {"temperature": 0.5}
    finally:
        LOSSES.clear()
        LOSSES.update(saved)


@pytest.mark.slow
@pytest.mark.parametrize(
    "loss, flags, terms",
    [
        ("dcl", ["--tau-plus", "auto", "--hcl-beta", "0.5"], ["Dcl_loss:", "Tau_plus:", "Clamp_rate:"]),
        ("curl", [], ["Curl_loss:", "Block_size: 3.0000"]),
        ("clip", [], ["Contrastive_loss:"]),
        ("decl", ["--decl-rate", "index", "--no-decl-include-current"], ["Decl_loss:", "Loss1:", "First_visit_rate:"]),
    ],
)
def test_an_epoch_with_three_captions_per_image(tmp_path, loss, flags, terms):
    pattern = write_caption_shards(tmp_path / "shards", num_shards=2, per_shard=16)
    logs = tmp_path / "logs"
    rc = main(
        [
            "--train-data",
            pattern,
            "--logs",
            str(logs),
            "--name",
            loss,
            "--device",
            "cpu",
            "--model",
            "clip-dcl-tiny",
            "--batch-size",
            "8",
            "--workers",
            "1",
            "--epochs",
            "1",
            "--lr",
            "1e-3",
            "--warmup",
            "1",
            "--log-every-n-steps",
            "1",
            "--precision",
            "fp32",
            "--save-frequency",
            "1",
            "--captions-per-image",
            "3",
            "--loss",
            loss,
            *flags,
        ]
    )
    assert rc == 0
    lines = [line for line in (logs / loss / "out.log").read_text().splitlines() if "Train Epoch:" in line]
    assert len(lines) == 4
    for term in terms:
        assert all(term in line for line in lines), (term, lines[-1])
    ckpt = torch.load(logs / loss / "checkpoints" / "epoch_1.pt", map_location="cpu", weights_only=True)
    assert ckpt["clip_dcl"]["loss"] == loss
    if "auto" in flags:
        assert "tau_plus_estimate" in ckpt["loss_state"]
    if loss == "decl":  # one epoch over the 32 ids: every image's rates stored, in both directions
        from clip_dcl.train.saving import read_loss_state

        table = read_loss_state(logs / loss / "checkpoints" / "epoch_1.pt")["log_rate"]
        assert table.shape == (2, 32) and bool(torch.isfinite(table).all())
