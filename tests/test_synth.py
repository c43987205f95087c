"""Synthetic data: determinism, the class share it claims, OpenCLIP reads the shards, layouts.

Shards are read back with the standard library's ``tarfile`` (not with the writer's code), the
zero-shot tree with torchvision's ``ImageFolder``, few-shot zips with ``zipfile``.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from clip_dcl.data import synth
from clip_dcl.data.cli import main as data_main
from clip_dcl.data.shards import CaptionShardWriter, format_key, img2dataset_key, shard_pattern
from clip_dcl.data.synth import captions as synth_captions
from clip_dcl.data.synth import render as synth_render

QUICK = synth.SynthConfig.quick()
# An even smaller set for the tests that generate twice.
TINY = synth.SynthConfig.quick(
    train_samples=40, val_samples=8, shard_size=16, captions_per_image=3, zeroshot_per_class=2, fewshot_test_per_class=2
)


def read_shards(directory: Path) -> list[dict]:
    """All samples of ``directory/*.tar`` in shard order, each {key, jpg, txt, json, shard}."""
    samples = []
    for shard in sorted(directory.glob("*.tar")):
        grouped: dict[str, dict] = collections.OrderedDict()
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                key, ext = member.name.split(".", 1)
                grouped.setdefault(key, {"key": key, "shard": shard.name})[ext] = tar.extractfile(member).read()
        for sample in grouped.values():
            sample["json"] = json.loads(sample["json"])
            sample["txt"] = sample["txt"].decode("utf-8")
            samples.append(sample)
    return samples


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def quick_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth_quick")
    summary = synth.generate(out, QUICK, verbose=False)
    return out, summary


# ------------------------------------------------------------------------------------------
# Determinism
# ------------------------------------------------------------------------------------------
def _cli_flags(config: synth.SynthConfig) -> list[str]:
    return [f"--{f.name.replace('_', '-')}={getattr(config, f.name)}" for f in dataclasses.fields(config)]


def test_same_seed_same_bytes_different_seed_different(tmp_path):
    a = tree_bytes(Path(synth.generate(tmp_path / "a", TINY, verbose=False)["out_dir"]))
    # The second copy comes from another process with another string-hash seed, through the CLI.
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run(
        [sys.executable, "-m", "clip_dcl.cli", "data", "synth", str(tmp_path / "b"), "--quiet", *_cli_flags(TINY)],
        check=True,
        env=env,
        cwd=tmp_path,
    )
    b = tree_bytes(tmp_path / "b")
    assert a.keys() == b.keys()
    suffixes = {Path(name).suffix for name in a}
    assert {".tar", ".json", ".jpg", ".zip", ".txt"} <= suffixes
    differing = [name for name in a if a[name] != b[name]]
    assert differing == []

    c = tree_bytes(Path(synth.generate(tmp_path / "c", TINY, seed=1, verbose=False)["out_dir"]))
    for name in a:
        if name.endswith(".tar") or name.endswith("_images.zip") and "digits" not in name:
            assert a[name] != c[name], f"{name} did not change with the seed"
    # Labels (not just pixels) depend on the seed.
    labels_a = [s["json"]["label"] for s in read_shards(tmp_path / "a" / "train")]
    labels_c = [s["json"]["label"] for s in read_shards(tmp_path / "c" / "train")]
    assert labels_a != labels_c
    assert sorted(labels_a) == sorted(labels_c)  # same class counts


def test_a_test_split_leaves_the_other_splits_unchanged_and_shares_no_image_with_them(tmp_path):
    plain = tree_bytes(Path(synth.generate(tmp_path / "plain", TINY, verbose=False)["out_dir"]))
    summary = synth.generate(tmp_path / "with", TINY, test_samples=12, verbose=False)
    both = tree_bytes(Path(summary["out_dir"]))
    assert "test_data" not in synth.generate(tmp_path / "plain", TINY, reuse=True, verbose=False)
    # every file of the set without a test split is byte-identical with one (summary.json records the config)
    assert {n: b for n, b in both.items() if n in plain and n != "summary.json"} == {
        n: b for n, b in plain.items() if n != "summary.json"
    }
    test = read_shards(tmp_path / "with" / "test")
    val = read_shards(tmp_path / "with" / "val")
    train = read_shards(tmp_path / "with" / "train")
    assert len(test) == 12 == summary["test"]["num_samples"] and summary["test_data"].endswith(".tar")
    assert len(test[0]["json"]["captions"]) == TINY.val_captions_per_image
    others = {s["jpg"] for s in val + train}
    assert not any(s["jpg"] in others for s in test)
    zs_val = {b for n, b in both.items() if n.startswith("zeroshot/") and n.endswith(".jpg")}
    zs_test = {b for n, b in both.items() if n.startswith("zeroshot_test/") and n.endswith(".jpg")}
    assert len(zs_test) == TINY.num_classes * TINY.zeroshot_per_class and not zs_val & zs_test
    assert (tmp_path / "with" / "zeroshot_test" / "classnames.txt").read_text() == (
        tmp_path / "with" / "zeroshot" / "classnames.txt"
    ).read_text()
    with pytest.raises(ValueError, match="test_samples=-1"):
        synth.SynthConfig(test_samples=-1).validate()


# ------------------------------------------------------------------------------------------
# The class share it claims
# ------------------------------------------------------------------------------------------
def test_tau_plus_equals_same_class_rate_of_written_shards(quick_set):
    out, summary = quick_set
    labels = np.array([s["json"]["label"] for s in read_shards(out / "train")])
    assert len(labels) == QUICK.train_samples
    # Exact rate over all ordered pairs (i, j), i.e. two independent draws from the split.
    same = labels[:, None] == labels[None, :]
    assert summary["tau_plus"] == pytest.approx(same.mean(), abs=1e-12)
    # ... and over pairs of distinct samples.
    off_diagonal = (same.sum() - len(labels)) / (len(labels) * (len(labels) - 1))
    assert summary["same_class_rate_distinct_pairs"] == pytest.approx(off_diagonal, abs=1e-12)
    # Monte Carlo over random pairs agrees within 5 standard errors.
    rng = np.random.default_rng(0)
    n = 200_000
    i, j = rng.integers(len(labels), size=(2, n))
    rate = np.mean(labels[i] == labels[j])
    se = np.sqrt(summary["tau_plus"] * (1 - summary["tau_plus"]) / n)
    assert abs(rate - summary["tau_plus"]) < 5 * se
    # Balanced classes: ~1/C (counts differ by at most one).
    counts = np.bincount(labels, minlength=QUICK.num_classes)
    assert counts.max() - counts.min() <= 1
    assert summary["tau_plus"] == pytest.approx(1 / QUICK.num_classes, abs=1e-3)
    assert json.loads((out / "summary.json").read_text())["tau_plus"] == summary["tau_plus"]


@pytest.mark.parametrize("num_classes,imbalance", [(2, 0.0), (7, 0.0), (10, 1.0), (48, 0.5)])
def test_split_labels_class_shares(num_classes, imbalance):
    n = 997
    labels = synth.split_labels(3, "train", n, num_classes, imbalance)
    counts = np.bincount(labels, minlength=num_classes)
    assert counts.sum() == n
    weights = np.arange(1, num_classes + 1) ** -imbalance
    assert np.abs(counts - n * weights / weights.sum()).max() < 1  # largest remainders
    brute = np.mean(labels[:, None] == labels[None, :])
    assert synth.tau_plus_from_labels(labels) == pytest.approx(brute, abs=1e-12)
    shares = weights / weights.sum()
    assert synth.tau_plus_from_labels(labels) == pytest.approx(np.sum(shares**2), abs=1e-3)
    if imbalance > 0:
        assert synth.tau_plus_from_labels(labels) > 1.2 / num_classes


# ------------------------------------------------------------------------------------------
# OpenCLIP's own loader reads the shards
# ------------------------------------------------------------------------------------------
def test_openclip_get_wds_dataset_reads_shards(quick_set):
    import open_clip
    from open_clip_train.data import get_wds_dataset
    from open_clip_train.params import parse_args

    from clip_dcl.models import TINY_MODEL, register_builtin_configs

    out, summary = quick_set
    register_builtin_configs()
    _, preprocess_train, preprocess_val = open_clip.create_model_and_transforms(TINY_MODEL)
    tokenizer = open_clip.get_tokenizer(TINY_MODEL)
    args = parse_args(
        [
            "--train-data",
            summary["train_data"],
            "--val-data",
            summary["val_data"],
            "--batch-size",
            "16",
            "--workers",
            "0",
            "--seed",
            "0",
            "--dataset-type",
            "webdataset",
        ]
    )
    args.world_size = 1

    train = get_wds_dataset(args, preprocess_train, is_train=True, epoch=0, tokenizer=tokenizer)
    assert train.dataloader.num_samples == QUICK.train_samples  # from sizes.json
    images, texts = next(iter(train.dataloader))
    assert images.shape == (16, 3, 64, 64)
    assert texts.shape == (16, 32)
    assert texts.dtype.is_floating_point is False and (texts[:, 0] > 0).all()

    val = get_wds_dataset(args, preprocess_val, is_train=False, tokenizer=tokenizer)
    seen = sum(len(batch[0]) for batch in val.dataloader)
    assert seen == QUICK.val_samples


# ------------------------------------------------------------------------------------------
# Shard contents
# ------------------------------------------------------------------------------------------
def test_shard_samples_layout_and_labels(quick_set):
    out, summary = quick_set
    grid = synth.class_grid(QUICK.num_classes)
    for split, n, k in (
        ("train", QUICK.train_samples, QUICK.captions_per_image),
        ("val", QUICK.val_samples, QUICK.val_captions_per_image),
    ):
        samples = read_shards(out / split)
        sizes = json.loads((out / split / "sizes.json").read_text())
        assert sizes == dict(collections.Counter(s["shard"] for s in samples))
        assert all(count <= QUICK.shard_size for count in sizes.values())
        # Dense keys, zero-padded to 9 digits, unique across shards.
        assert [s["key"] for s in samples] == [f"{i:09d}" for i in range(n)]
        for s in samples:
            meta = s["json"]
            assert set(s) >= {"jpg", "txt", "json"}
            assert meta["key"] == s["key"] and meta["caption"] == s["txt"] == meta["captions"][0]
            assert len(meta["captions"]) == k
            assert grid[meta["label"]] == (meta["shape"], meta["colour"])
            assert meta["classname"] == f"{meta['colour']} {meta['shape']}"
            assert (meta["position"] == synth.SCATTERED) == (meta["count"] > 1)
            image = Image.open(io.BytesIO(s["jpg"]))
            assert image.format == "JPEG" and image.mode == "RGB" and image.size == (64, 64)
    assert summary["train"]["pattern"] == "train/{00000..00003}.tar"


def test_several_captions_per_image(tmp_path):
    synth.generate(tmp_path, TINY, verbose=False)
    for s in read_shards(tmp_path / "train"):
        captions = s["json"]["captions"]
        assert len(captions) == TINY.captions_per_image
        assert s["txt"] == captions[0]
        assert len(set(captions)) >= 2  # paraphrases, not copies


# ------------------------------------------------------------------------------------------
# Images and captions show the attributes
# ------------------------------------------------------------------------------------------
def _foreground(image: Image.Image) -> np.ndarray:
    pixels = np.asarray(image, dtype=np.float64)
    background = np.median(pixels.reshape(-1, 3), axis=0)  # shapes cover less than half the image
    return np.abs(pixels - background).sum(axis=2) > 60


def test_drawn_image_shows_count_position_size_and_colour():
    from scipy import ndimage

    areas = {"small": [], "large": []}
    for i in range(120):
        rng = np.random.default_rng([7, i])
        shape = synth.SHAPES[i % len(synth.SHAPES)]
        colour = synth.COLOURS[i % len(synth.COLOURS)]
        attrs = synth.sample_attributes(rng, shape, colour)
        image = synth.draw_image(attrs, 64, rng)
        mask = _foreground(image)
        components, count = ndimage.label(mask)
        assert count == attrs["count"], (i, attrs)
        if attrs["count"] == 1:
            cy, cx = np.argwhere(mask).mean(axis=0) / 64
            ex, ey = synth_render._CENTRES[attrs["position"]]
            assert abs(cx - ex) < 0.1 and abs(cy - ey) < 0.1, (i, attrs, cx, cy)
            areas[attrs["size"]].append(mask.sum())
        mean_colour = np.asarray(image, dtype=np.float64)[mask].mean(axis=0)
        nearest = min(synth_render._RGB, key=lambda c: np.sum((np.array(synth_render._RGB[c]) - mean_colour) ** 2))
        assert nearest == colour, (i, attrs, mean_colour)
    assert max(areas["small"]) < min(areas["large"])


def test_captions_name_the_attributes():
    colour_words = {c: set(w) for c, w in synth_captions._COLOUR_WORDS.items()}
    for i in range(300):
        rng = np.random.default_rng([11, i])
        shape = synth.SHAPES[i % len(synth.SHAPES)]
        colour = synth.COLOURS[(i // 6) % len(synth.COLOURS)]
        attrs = synth.sample_attributes(rng, shape, colour)
        caption = synth.make_caption(attrs, rng)
        nouns = [pair[0 if attrs["count"] == 1 else 1] for pair in synth_captions._SHAPE_NOUNS[shape]]
        assert any(re.search(rf"\b{noun}\b", caption) for noun in nouns), caption
        assert any(re.search(rf"\b{w}\b", caption) for w in colour_words[colour]), caption
        others = {w for c, ws in colour_words.items() if c != colour for w in ws}
        assert not any(re.search(rf"\b{w}\b", caption) for w in others), caption
        if attrs["count"] > 1:
            assert any(w in caption for w in synth_captions._COUNT_WORDS[attrs["count"]]), caption
        wrong_sizes = {w for s, ws in synth_captions._SIZE_WORDS.items() if s != attrs["size"] for w in ws}
        assert not any(re.search(rf"\b{w}\b", caption) for w in wrong_sizes), caption
        assert len(caption.split()) <= 24  # well inside the 32-token context


# ------------------------------------------------------------------------------------------
# Zero-shot and few-shot layouts
# ------------------------------------------------------------------------------------------
def test_zeroshot_imagefolder_layout(quick_set):
    from torchvision.datasets import ImageFolder

    out, summary = quick_set
    root = out / "zeroshot"
    dataset = ImageFolder(str(root))
    classnames = (root / "classnames.txt").read_text().splitlines()
    assert dataset.classes == sorted(dataset.classes) == synth.class_folders(QUICK.num_classes)
    assert classnames == synth.class_names(QUICK.num_classes) == summary["classes"]["names"]
    # ImageFolder's index of a folder is the latent label, and the class name matches the folder.
    for folder, index in dataset.class_to_idx.items():
        assert folder.split("_", 1)[1].replace("_", " ") == classnames[index]
    counts = collections.Counter(target for _, target in dataset.samples)
    assert counts == {k: QUICK.zeroshot_per_class for k in range(QUICK.num_classes)}
    image, _ = dataset[0]
    assert image.size == (64, 64)
    templates = (root / "templates.txt").read_text().splitlines()
    assert len(templates) >= 3 and all("{c}" in t for t in templates)


def test_fewshot_iris_layout(quick_set):
    out, _ = quick_set
    root = out / "fewshot"
    catalog = json.loads((root / "catalog.json").read_text())
    assert set(catalog) == {"synth-shape", "synth-colour", "synth-count", "synth-position", "digits"}
    for name, entry in catalog.items():
        folder = root / name
        labels = (folder / "labels.txt").read_text().splitlines()
        assert labels == entry["classes"] and len(labels) == entry["num_classes"]
        assert entry["multilabel"] is False
        assert entry["metric"] == ("mean_per_class" if name == "digits" else "accuracy")
        per_split = {}
        for split in ("train", "test"):
            lines = (folder / f"{split}.txt").read_text().splitlines()
            assert len(lines) == entry[split]
            counts = collections.Counter()
            zips: dict[str, zipfile.ZipFile] = {}
            for line in lines:
                path, label_ids = line.rsplit(" ", 1)
                zip_name, inner = path.split("@", 1)
                label = [int(x) for x in label_ids.split(",")]
                assert len(label) == 1 and 0 <= label[0] < len(labels)
                counts[label[0]] += 1
                if zip_name not in zips:
                    zips[zip_name] = zipfile.ZipFile(folder / zip_name)
                zf = zips[zip_name]
                info = zf.getinfo(inner)
                assert info.compress_type == zipfile.ZIP_STORED
            assert list(zips) == [f"{split}_images.zip"]
            for zf in zips.values():
                assert zf.testzip() is None  # every CRC checks out
                zf.close()
            first = lines[0].rsplit(" ", 1)[0].split("@", 1)
            with zipfile.ZipFile(folder / first[0]) as zf:
                image = Image.open(io.BytesIO(zf.read(first[1])))
                assert image.size == (64, 64) and image.convert("RGB").mode == "RGB"
            per_split[split] = counts
        assert set(per_split["train"]) == set(range(len(labels)))
        assert min(per_split["train"].values()) >= 5
        if name != "digits":
            assert set(per_split["train"].values()) == {QUICK.fewshot_train_per_class}
            assert set(per_split["test"].values()) == {QUICK.fewshot_test_per_class}
    assert catalog["digits"]["train"] + catalog["digits"]["test"] == 1797
    assert catalog["synth-count"]["classes"] == ["one", "two", "three"]


def test_fewshot_tasks_follow_the_class_grid():
    tasks = synth.fewshot_tasks(10)
    assert tasks["synth-shape"] == ["circle", "square"]
    assert tasks["synth-colour"] == ["red", "blue", "green", "yellow", "purple"]
    assert "synth-shape" not in synth.fewshot_tasks(5)  # a single shape is no task


# ------------------------------------------------------------------------------------------
# Class grid, validation, CLI
# ------------------------------------------------------------------------------------------
def test_class_grid_covers_every_class_count():
    for c in range(2, synth.MAX_CLASSES + 1):
        grid = synth.class_grid(c)
        n_shapes, n_colours = synth.grid_shape(c)
        assert len(grid) == len(set(grid)) == c
        assert n_shapes <= len(synth.SHAPES) and n_colours <= len(synth.COLOURS)
        exact = [(s, k) for s in range(1, 7) for k in range(1, 9) if s * k == c]
        if exact:
            assert n_shapes * n_colours == c
        assert {g[0] for g in grid} == set(synth.SHAPES[:n_shapes])
    assert synth.grid_shape(12) == (3, 4) and synth.grid_shape(48) == (6, 8)


@pytest.mark.parametrize(
    "field,value",
    [
        ("num_classes", 49),
        ("num_classes", 1),
        ("image_size", 8),
        ("seed", -1),
        ("train_samples", 3),
        ("fewshot_train_per_class", 4),
        ("fewshot_test_per_class", 500),
        ("jpeg_quality", 0),
        ("shard_size", 0),
        ("captions_per_image", 0),
        ("class_imbalance", -1.0),
        ("num_classes", 2.5),
    ],
)
def test_bad_values_are_named_before_any_work(tmp_path, field, value):
    with pytest.raises(ValueError, match=rf"{field}={value!r}"):
        synth.generate(tmp_path / "out", quick=True, verbose=False, **{field: value})
    assert not (tmp_path / "out").exists()


def test_existing_output_needs_overwrite_or_reuse(tmp_path):
    synth.generate(tmp_path, TINY, verbose=False)
    with pytest.raises(FileExistsError, match="overwrite"):
        synth.generate(tmp_path, TINY, verbose=False)
    before = tree_bytes(tmp_path)
    again = synth.generate(tmp_path, TINY, reuse=True, verbose=False)
    assert again["tau_plus"] == json.loads((tmp_path / "summary.json").read_text())["tau_plus"]
    assert tree_bytes(tmp_path) == before
    with pytest.raises(FileExistsError):  # reuse only with identical settings
        synth.generate(tmp_path, TINY, reuse=True, num_classes=4, verbose=False)
    synth.generate(tmp_path, TINY, overwrite=True, num_classes=4, verbose=False)
    assert len(list((tmp_path / "zeroshot").iterdir())) == 4 + 2  # stale class folders are gone


def test_cli_synth(tmp_path, capsys):
    rc = data_main(
        [
            "synth",
            str(tmp_path),
            "--quick",
            "--train-samples",
            "24",
            "--shard-size",
            "10",
            "--val-samples",
            "4",
            "--num-classes",
            "4",
            "--zeroshot-per-class",
            "1",
            "--fewshot-test-per-class",
            "1",
            "--seed",
            "5",
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert f"tau_plus {summary['tau_plus']:.6f}" in text
    assert summary["config"]["seed"] == 5 and summary["config"]["num_classes"] == 4
    assert json.loads((tmp_path / "train" / "sizes.json").read_text()) == {
        "00000.tar": 10,
        "00001.tar": 10,
        "00002.tar": 4,
    }
    with pytest.raises(SystemExit) as exc:
        data_main(["synth", str(tmp_path / "x"), "--num-classes", "60"])
    assert exc.value.code == 2
    assert "--num-classes" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------
# Shard writer
# ------------------------------------------------------------------------------------------
def test_shard_writer(tmp_path):
    import braceexpand

    def write(directory):
        with CaptionShardWriter(directory, shard_size=3) as w:
            for i in range(7):
                w.write(format_key(i), bytes([i]) * 10, f"caption {i}", {"label": i % 2})
        return w

    w = write(tmp_path / "a")
    assert w.sizes == {"00000.tar": 3, "00001.tar": 3, "00002.tar": 1}
    assert list(braceexpand.braceexpand(w.pattern)) == [str(p) for p in w.shard_paths]
    assert w.pattern == shard_pattern(tmp_path / "a", 3)
    samples = read_shards(tmp_path / "a")
    assert [s["json"] for s in samples][1] == {"key": "000000001", "caption": "caption 1", "label": 1}
    with tarfile.open(tmp_path / "a" / "00000.tar") as tar:
        assert {m.mtime for m in tar.getmembers()} == {0}
    write(tmp_path / "b")
    assert tree_bytes(tmp_path / "a") == tree_bytes(tmp_path / "b")

    with CaptionShardWriter(tmp_path / "c", shard_size=3) as w:
        w.write("000000005", b"x", "c")
        with pytest.raises(ValueError, match="increasing"):
            w.write("000000005", b"x", "c")
        with pytest.raises(ValueError, match="decimal"):
            w.write("abc", b"x", "c")
        with pytest.raises(ValueError, match="contradicts"):
            w.write("000000006", b"x", "c", {"caption": "other"})
    assert img2dataset_key(3, 7, 1000) == 3007 and img2dataset_key(2, 5, 1500) == 20005
