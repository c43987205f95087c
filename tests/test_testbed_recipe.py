"""The testbed recipe's pieces: the caption vocabulary, packed training sets, the batched crop, --adamw-impl."""

from __future__ import annotations

import gzip
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset as wds
from conftest import train_run
from PIL import Image

import clip_dcl  # noqa: F401  (registers the shipped model configs with OpenCLIP)
from clip_dcl.data.packed import load_packed, pack_shards
from clip_dcl.data.synth import words
from clip_dcl.experiment.recipes import DEFAULT_RECIPE, RECIPES, fill, get_recipe
from clip_dcl.train.packed import PackedDataError, PackedLoader, crop_boxes, resized_crops, transform_spec

WORDS_DIR = Path(clip_dcl.__file__).parent / "model_configs" / "words"


# -- the vocabulary ----------------------------------------------------------------------------------------------
def _tokenizer(tmp_path, merges):
    from open_clip.tokenizer import SimpleTokenizer

    return SimpleTokenizer(bpe_path=str(words.write_merges(tmp_path / "m.txt.gz", merges)), context_length=24)


def test_learned_merges_make_every_word_one_token_of_openclips_tokenizer(tmp_path):
    rng = np.random.default_rng(3)
    vocab = sorted({"".join(rng.choice(list("abcdefg"), size=rng.integers(1, 9))) for _ in range(300)})
    merges = words.learn_merges(vocab)
    tok = _tokenizer(tmp_path, merges)
    assert tok.vocab_size == words.vocab_size(merges)
    assert tok.eot_token_id == tok.vocab_size - 1  # the text tower pools at the largest id
    assert [w for w in vocab if len(tok.encode(w)) != 1] == []
    # a word outside the vocabulary still tokenises (into pieces), as with any BPE
    assert len(tok.encode("gfedcbagfedcba")) > 1


def test_learn_merges_refuses_non_words():
    with pytest.raises(ValueError, match="runs of letters"):
        words.learn_merges(["red", "top-left"])


def test_shipped_vocabulary_is_the_one_learned_from_the_captions_and_reads_them_word_by_word():
    merges = words.learn_merges(words.caption_words())
    shipped = gzip.open(WORDS_DIR / "synth-words-bpe.txt.gz").read().decode()
    assert shipped == words.merges_text(merges)
    cfg = json.loads((WORDS_DIR / "clip-dcl-micro-words.json").read_text())
    assert cfg["text_cfg"]["vocab_size"] == words.vocab_size(merges)

    import open_clip

    from clip_dcl.data.synth import COLOURS, SHAPES, make_caption, sample_attributes

    tok = open_clip.get_tokenizer("clip-dcl-micro-words")
    assert tok.vocab_size == cfg["text_cfg"]["vocab_size"]
    rng = np.random.default_rng(12345)  # other captions than those the words were collected from
    for _ in range(300):
        attrs = sample_attributes(rng, SHAPES[rng.integers(len(SHAPES))], COLOURS[rng.integers(len(COLOURS))])
        text = make_caption(attrs, rng)
        pieces = len(words._WORD.findall(text)) + text.count(",") + text.count(".")
        assert len(tok.encode(text)) == pieces, text
        assert pieces + 2 <= cfg["text_cfg"]["context_length"], text  # never truncated


def test_words_model_is_registered_with_an_absolute_merges_path_that_survives_a_rescan(tmp_path):
    import open_clip

    cfg = open_clip.get_model_config("clip-dcl-micro-words")
    assert Path(cfg["text_cfg"]["tokenizer_kwargs"]["bpe_path"]).is_absolute()
    other = json.loads((Path(clip_dcl.__file__).parent / "model_configs" / "clip-dcl-micro.json").read_text())
    (tmp_path / "mine.json").write_text(json.dumps(other))
    open_clip.add_model_config(tmp_path / "mine.json")  # OpenCLIP re-reads every config file it knows
    assert open_clip.get_tokenizer("clip-dcl-micro-words").vocab_size == cfg["text_cfg"]["vocab_size"]


# -- the batched crop ----------------------------------------------------------------------------------------
def test_crop_boxes_follow_torchvisions_rules():
    g = torch.Generator().manual_seed(0)
    scale, ratio = (0.3, 1.0), (3 / 4, 4 / 3)
    boxes = crop_boxes(4000, 32, 48, scale, ratio, g)
    top, left, h, w = boxes.unbind(1)
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= 32).all() and (left + w <= 48).all()
    area = h * w / (32 * 48)
    # rounding of w and h moves area and ratio a little past the drawn ones
    assert area.min() >= scale[0] * 0.8 and area.max() <= scale[1] + 1e-6
    assert (w / h).min() >= ratio[0] * 0.8 and (w / h).max() <= ratio[1] * 1.25
    assert area.std() > 0.1 and top.float().std() > 1  # drawn, not fixed
    # the offsets are uniform over the places the box fits: the mean offset is half the slack
    fits = h < 32
    assert fits.sum() > 1000
    assert abs((top[fits] / (32 - h[fits])).mean().item() - 0.5) < 0.03


def test_crop_box_fallback_is_the_central_crop():
    boxes = crop_boxes(5, 10, 100, (0.99, 1.0), (1.0, 1.0), torch.Generator().manual_seed(0))  # no square fits
    assert boxes.tolist() == [[0.0, 45.0, 10.0, 10.0]] * 5


@pytest.mark.parametrize("size, scale", [(32, (0.3, 1.0)), (16, (0.9, 1.0))])
def test_resized_crops_match_torchvision_on_pil_images(size, scale):
    """Against the slow path: torchvision's resized_crop of each PIL image (bicubic), to PIL's 8-bit rounding."""
    import torchvision.transforms.functional as TF
    from torchvision.transforms import InterpolationMode

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (24, 32, 32, 3), dtype=np.uint8)
    images[:12, 8:20, 4:28] = 255  # sharp edges, where the bicubic kernel overshoots
    boxes = crop_boxes(24, 32, 32, scale, (3 / 4, 4 / 3), torch.Generator().manual_seed(1))
    ours = resized_crops(torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255, boxes, (size, size))
    ref = torch.stack(
        [
            TF.to_tensor(
                TF.resized_crop(
                    Image.fromarray(a), int(t), int(left), int(h), int(w), [size, size], InterpolationMode.BICUBIC
                )
            )
            for a, (t, left, h, w) in zip(images, boxes.tolist())
        ]
    )
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() * 255 < 2.5
    assert (ours - ref).abs().mean().item() * 255 < 0.5


def test_transform_spec_reads_openclips_train_transform_and_refuses_what_it_cannot_apply():
    from open_clip.transform import AugmentationCfg, image_transform

    spec = transform_spec(image_transform(32, is_train=True))
    assert spec["size"] == (32, 32) and spec["scale"] == (0.9, 1.0)
    assert len(spec["mean"]) == 3 and len(spec["std"]) == 3
    jitter = image_transform(
        32, is_train=True, aug_cfg=AugmentationCfg(color_jitter_prob=0.5, color_jitter=(0.4, 0.4, 0.4, 0.1))
    )
    with pytest.raises(PackedDataError, match="train on the shards"):
        transform_spec(jitter)


# -- packed sets ---------------------------------------------------------------------------------------------------
def _shards(out: Path, n=40, per_shard=16, empty=(), missing=()):
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    pixels = {}
    for s in range(math.ceil(n / per_shard)):
        with wds.TarWriter(str(out / f"{s:05d}.tar")) as w:
            for k in range(s * per_shard, min(n, (s + 1) * per_shard)):
                buf = io.BytesIO()
                Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(buf, format="JPEG")
                pixels[k] = np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))
                sample = {"__key__": f"{k:09d}", "jpg": buf.getvalue(), "txt": "" if k in empty else f"sample {k}"}
                if k in missing:
                    del sample["txt"]
                w.write(sample)
    return str(out / f"{{00000..{math.ceil(n / per_shard) - 1:05d}}}.tar"), pixels


def test_pack_keeps_pixels_captions_and_ids_and_skips_samples_without_a_caption(tmp_path):
    pattern, pixels = _shards(tmp_path / "shards", empty={3}, missing={7})
    written = pack_shards(pattern, tmp_path / "train.npz", verbose=False)
    assert written["num_samples"] == 38 and written["skipped"] == 2
    arrays = load_packed(tmp_path / "train.npz")
    keys = [int(k) for k in arrays["keys"]]
    assert 3 not in keys and 7 not in keys
    assert arrays["ids"].tolist() == keys  # numeric keys are the ids, as in the webdataset pipeline
    for i, k in enumerate(keys):
        assert np.array_equal(arrays["images"][i], pixels[k])
        assert arrays["captions"][i] == f"sample {k}"


def test_pack_refuses_a_wrong_suffix_and_a_missing_shard(tmp_path):
    pattern, _ = _shards(tmp_path / "shards", n=16)
    with pytest.raises(ValueError, match=r"\.npz"):
        pack_shards(pattern, tmp_path / "train.bin", verbose=False)
    with pytest.raises(ValueError, match="does not exist"):
        pack_shards(str(tmp_path / "shards" / "{00000..00003}.tar"), tmp_path / "t.npz", verbose=False)
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="bad.npz"):
        load_packed(tmp_path / "bad.npz")


def _loader(n, batch, rank, world, seed, epoch):
    from open_clip.transform import image_transform
    from open_clip_train.data import SharedEpoch

    images = torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 3, 8, 8).contiguous()
    return PackedLoader(
        images,
        torch.arange(n).view(n, 1),
        torch.arange(n) + 1000,
        batch,
        rank=rank,
        world_size=world,
        seed=seed,
        shared_epoch=SharedEpoch(epoch),
        spec=transform_spec(image_transform(8, True)),
    )


def test_packed_loader_reads_each_sample_once_an_epoch_split_across_ranks_and_reshuffles_per_epoch():
    epochs = {}
    for epoch in (0, 1):
        seen = []
        for rank in (0, 1):
            for images, texts, ids in _loader(50, 4, rank, 2, seed=7, epoch=epoch):
                assert images.shape == (4, 3, 8, 8) and texts.shape == (4, 1)
                assert (ids == texts[:, 0] + 1000).all()  # images, texts and ids stay aligned
                seen += texts[:, 0].tolist()
        assert len(seen) == len(set(seen)) == 48  # 6 global batches of 8; the last 2 samples dropped
        epochs[epoch] = seen
    assert epochs[0] != epochs[1]
    again = [t for _, texts, _ in _loader(50, 4, 0, 2, seed=7, epoch=1) for t in texts[:, 0].tolist()]
    assert again == [t for t in epochs[1][:24]]  # the same (seed, epoch): the same batches


# -- recipes and training on a packed set -------------------------------------------------------------------------
def test_recipes_fill_their_placeholders_and_name_the_unknown():
    argv = fill(get_recipe(DEFAULT_RECIPE).train_argv(batch_size=64, seed=3), "/d", "/l")
    assert argv[argv.index("--train-data") + 1] == "/d/train.npz"
    assert argv[argv.index("--val-data") + 1] == "/d/val/{00000..00000}.tar"
    assert argv[argv.index("--logs") + 1] == "/l" and argv[argv.index("--batch-size") + 1] == "64"
    assert "--pack" in RECIPES[DEFAULT_RECIPE].data_argv and "--pack" not in RECIPES["micro-bpe"].data_argv
    with pytest.raises(ValueError, match="micro-bpe"):
        get_recipe("nope")


def _packed_argv(tmp_path, data, *flags):
    return [
        "--model",
        "clip-dcl-micro-words",
        "--train-data",
        data,
        "--batch-size",
        "8",
        "--epochs",
        "1",
        "--precision",
        "fp32",
        "--device",
        "cpu",
        "--logs",
        str(tmp_path / "logs"),
        "--name",
        "p",
        "--lr",
        "1e-3",
        "--warmup",
        "1",
        "--log-every-n-steps",
        "1",
        *flags,
    ]


@pytest.mark.slow
def test_training_on_a_packed_set_visits_every_sample_id_with_fused_adamw_and_the_initial_scale(tmp_path):
    pattern, _ = _shards(tmp_path / "shards", n=48)
    pack_shards(pattern, tmp_path / "train.npz", verbose=False)
    out = train_run(
        _packed_argv(
            tmp_path,
            tmp_path / "train.npz",
            "--loss",
            "decl",
            "--decl-rate",
            "index",
            "--adamw-impl",
            "fused",
            "--init-logit-scale",
            "30",
        )
    )
    assert out.returncode == 0, out.stderr[-3000:]
    log = (tmp_path / "logs" / "p" / "out.log").read_text()
    assert "fused: True" in log and "Packed training set" in log
    first = next(line for line in log.splitlines() if "Train Epoch: 0" in line)
    assert "Logit Scale: 30.000" in first  # logged after the first step, at the warm-up's tiny learning rate
    ckpt = torch.load(tmp_path / "logs" / "p" / "checkpoints" / "epoch_1.pt", map_location="cpu", weights_only=True)
    log_rate = ckpt["loss_state"]["log_rate"]  # rows start NaN; the index rate writes each id it sees
    assert log_rate.shape[-1] == 48 and not torch.isnan(log_rate).any(0).any()


def test_packed_set_refuses_flags_it_cannot_honour_before_any_work(tmp_path):
    pattern, _ = _shards(tmp_path / "shards", n=16)
    pack_shards(pattern, tmp_path / "train.npz", verbose=False)
    out = train_run(_packed_argv(tmp_path, tmp_path / "train.npz", "--dataset-resampled"))
    assert out.returncode == 2 and "--dataset-resampled" in out.stderr
    out = train_run(_packed_argv(tmp_path, tmp_path / "train.npz", "--adamw-impl", "fused", "--opt", "timm/adamw"))
    assert out.returncode == 2 and "--adamw-impl fused applies to --opt adamw" in out.stderr
    out = train_run(_packed_argv(tmp_path, tmp_path / "train.npz", "--init-logit-scale", "-3"))
    assert out.returncode == 2 and "--init-logit-scale must be a number > 0, got -3" in out.stderr
    assert not (tmp_path / "logs" / "p").exists()
