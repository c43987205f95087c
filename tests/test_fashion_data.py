"""`clip-dcl data fashion-mnist`: the IDX reader, the pixel attributes, the captions and the layout written,
on small IDX files written here (Fashion-MNIST's names gzipped, MNIST-like files plain; never the real set)."""

from __future__ import annotations

import gzip
import json
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest

from clip_dcl.data import fashion
from clip_dcl.data.idx import IdxError, read_idx, read_idx_pair, write_idx


def _images(rng, n, rows=28, cols=28):
    """Grey images with a bright rectangle of random size, place and level on black, as Fashion-MNIST's are."""
    x = np.zeros((n, rows, cols), dtype=np.uint8)
    for i in range(n):
        h, w = rng.integers(4, rows - 2), rng.integers(4, cols - 2)
        top, left = rng.integers(0, rows - h), rng.integers(0, cols - w)
        x[i, top : top + h, left : left + w] = rng.integers(60, 200) + rng.integers(0, rng.integers(1, 56), size=(h, w))
    return x


def _write_set(folder: Path, n_train=240, n_test=60, classes=10, rows=28, cols=28, gz=True, seed=0):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train_images": _images(rng, n_train, rows, cols),
        "train_labels": np.arange(n_train) % classes,
        "test_images": _images(rng, n_test, rows, cols),
        "test_labels": np.arange(n_test) % classes,
    }
    for key, name in fashion.FILES.items():
        write_idx(folder / (name if gz else name[:-3]), arrays[key])
    return arrays


# -- the IDX reader ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["x-idx3-ubyte.gz", "x-idx3-ubyte"])
def test_idx_round_trip_gzipped_or_not_and_any_image_size(tmp_path, name):
    x = np.random.default_rng(1).integers(0, 256, size=(7, 20, 24), dtype=np.uint8)
    write_idx(tmp_path / name, x)
    assert (tmp_path / name).read_bytes()[:2] == (b"\x1f\x8b" if name.endswith(".gz") else b"\x00\x00")
    np.testing.assert_array_equal(read_idx(tmp_path / name), x)


def test_idx_header_is_read_as_the_format_says(tmp_path):
    # written byte by byte here, not with write_idx: magic 0x00000803, then big-endian sizes
    body = (
        bytes([0, 0, 8, 3])
        + (2).to_bytes(4, "big")
        + (2).to_bytes(4, "big")
        + (3).to_bytes(4, "big")
        + bytes(range(12))
    )
    (tmp_path / "a").write_bytes(body)
    np.testing.assert_array_equal(read_idx(tmp_path / "a"), np.arange(12, dtype=np.uint8).reshape(2, 2, 3))


@pytest.mark.parametrize("cut", ["gzip", "plain", "header"])
def test_truncated_idx_is_refused_never_read_as_fewer_images(tmp_path, cut):
    x = np.zeros((10, 28, 28), dtype=np.uint8)
    if cut == "gzip":
        write_idx(tmp_path / "f.gz", x)
        (tmp_path / "f.gz").write_bytes((tmp_path / "f.gz").read_bytes()[:-20])
        path, match = tmp_path / "f.gz", "cut short or damaged"
    else:
        write_idx(tmp_path / "f", x)
        data = (tmp_path / "f").read_bytes()
        (tmp_path / "f").write_bytes(data[:-100] if cut == "plain" else data[:9])
        path, match = tmp_path / "f", "truncated" if cut == "plain" else "header is cut short"
    with pytest.raises(IdxError, match=match) as e:
        read_idx(path)
    assert str(path) in str(e.value)


def test_idx_pair_refuses_other_counts_and_non_idx(tmp_path):
    write_idx(tmp_path / "i", np.zeros((5, 4, 4), np.uint8))
    write_idx(tmp_path / "l", np.zeros(4, np.uint8))
    with pytest.raises(IdxError, match="5 images but .* 4 labels"):
        read_idx_pair(tmp_path / "i", tmp_path / "l")
    (tmp_path / "j").write_bytes(b"PK\x03\x04 not idx")
    with pytest.raises(IdxError, match="not an IDX file"):
        read_idx(tmp_path / "j")


# -- pixels -> attributes -> captions -----------------------------------------------------------------------------
def test_pixel_attributes_match_a_direct_computation():
    rng = np.random.default_rng(2)
    x = _images(rng, 30)
    x[0] = 0  # an empty image
    got = fashion.pixel_attributes(x)
    for i, img in enumerate(x):
        ink = [(r, c, int(img[r, c])) for r in range(28) for c in range(28) if img[r, c] > 32]
        if not ink:
            assert (got["brightness"][i], got["fill"][i], got["aspect"][i], got["texture"][i]) == (0, 0, 1, 0)
            continue
        values = np.array([v for _, _, v in ink], dtype=np.float64)
        rows, cols = [r for r, _, _ in ink], [c for _, c, _ in ink]
        assert got["brightness"][i] == pytest.approx(values.mean(), rel=1e-5)
        assert got["fill"][i] == pytest.approx(len(ink) / 784)
        assert got["aspect"][i] == pytest.approx((max(cols) - min(cols) + 1) / (max(rows) - min(rows) + 1))
        assert got["texture"][i] == pytest.approx(values.std() / values.mean(), abs=1e-5)


def test_attribute_bins_split_at_the_reference_quantiles():
    x = _images(np.random.default_rng(3), 300)
    cuts = fashion.attribute_cuts(x)
    bins = fashion.attribute_bins(x, cuts)
    for name, words in fashion.ATTRIBUTE_WORDS.items():
        counts = np.bincount(bins[name], minlength=len(words))
        assert len(counts) == len(words) and counts.min() > 0, (name, counts)  # every bin used, none beyond


def test_captions_name_the_class_and_at_least_two_measured_attributes():
    rng = np.random.default_rng(4)
    bins = {"brightness": 2, "fill": 0, "aspect": 2, "texture": 1}
    own = {name: set(fashion.ATTRIBUTE_WORDS[name][b]) for name, b in bins.items()}
    others = {
        w for name, b in bins.items() for k, words in enumerate(fashion.ATTRIBUTE_WORDS[name]) if k != b for w in words
    }
    captions = {fashion.make_caption("ankle boot", bins, rng) for _ in range(300)}
    assert len(captions) > 50  # varied, not one string
    for cap in captions:
        assert "ankle boot" in cap
        words = set(re.findall(r"[a-z-]+", cap))
        named = [name for name, ws in own.items() if ws & words]
        assert len(named) >= 2, cap
        assert not (others - {w for ws in own.values() for w in ws}) & words, cap  # no word of another bin


def test_every_word_written_is_one_token_of_the_shipped_fmnist_tokenizer():
    import open_clip

    import clip_dcl  # noqa: F401  (registers the shipped configs)
    from clip_dcl.data.synth import words

    merges = words.learn_merges(fashion.caption_words())
    shipped = gzip.open(Path(clip_dcl.__file__).parent / "model_configs" / "words" / "fmnist-words-bpe.txt.gz").read()
    assert shipped.decode() == words.merges_text(merges)
    tok = open_clip.get_tokenizer("clip-dcl-micro-fmnist")
    assert tok.vocab_size == words.vocab_size(merges)
    rng = np.random.default_rng(5)
    for _ in range(200):
        bins = {name: int(rng.integers(len(ws))) for name, ws in fashion.ATTRIBUTE_WORDS.items()}
        text = fashion.make_caption(fashion.CLASSNAMES[rng.integers(10)], bins, rng)
        pieces = len(re.findall(r"[^\W\d_]+", text)) + len(re.findall(r"[^\w\s]", text))
        assert len(tok.encode(text)) == pieces, text


# -- the layout ---------------------------------------------------------------------------------------------------
def _generate(out, src, **kw):
    opts = dict(val_samples=100, fewshot_train_per_class=5, fewshot_test_per_class=2, shard_size=100, verbose=False)
    return fashion.generate(out, src, **{**opts, **kw})


def test_layout_has_every_split_the_project_reads(tmp_path):
    arrays = _write_set(tmp_path / "src")
    s = _generate(tmp_path / "out", tmp_path / "src", test_samples=40)
    out = tmp_path / "out"
    assert (s["train"]["num_samples"], s["val"]["num_samples"], s["test"]["num_samples"]) == (140, 100, 40)
    assert s["tau_plus"] == pytest.approx(sum((np.bincount(np.arange(240) % 10) / 240) ** 2), abs=0.01)

    # train and validation are disjoint draws of the official training images; test is the official test set
    def keys_and_labels(split):
        rows = []
        for shard in sorted((out / split).glob("*.tar")):
            with tarfile.open(shard) as tar:
                rows += [json.load(tar.extractfile(m)) for m in tar.getmembers() if m.name.endswith(".json")]
        return rows

    train, val, test = (keys_and_labels(k) for k in ("train", "val", "test"))
    assert len(train) == 140 and len(val) == 100
    assert [r["label"] for r in test] == arrays["test_labels"][:40].tolist()
    assert all(len(r["captions"]) == 5 for r in train) and all(len(r["captions"]) == 1 for r in val)
    # the zero-shot trees carry the real class names in label order
    assert (out / "zeroshot" / "classnames.txt").read_text().splitlines() == list(fashion.CLASSNAMES)
    folders = sorted(p.name for p in (out / "zeroshot_test").iterdir() if p.is_dir())
    assert folders == fashion.class_folders(fashion.CLASSNAMES) and folders[0] == "0_t-shirt-top"
    assert sum(1 for _ in (out / "zeroshot_test").rglob("*.png")) == 40
    assert sum(1 for _ in (out / "zeroshot").rglob("*.png")) == 100
    # ELEVATER layout: 5-shot pools from the validation images, test images from the test set
    catalog = json.loads((out / "fewshot" / "catalog.json").read_text())
    assert catalog["fashion-mnist"]["train"] == 50 and catalog["fashion-mnist"]["test"] == 20
    assert (out / "fewshot" / "fashion-mnist" / "train_images.zip").is_file()
    # per class, the number of distinct training captions, counted from the shards
    distinct = {}
    for r in train:
        distinct.setdefault(r["classname"], set()).update(r["captions"])
    assert s["classes"]["distinct_train_captions"] == {k: len(v) for k, v in distinct.items()}
    assert min(s["classes"]["distinct_train_captions"].values()) > 10


def test_images_are_the_source_pixels_centred_losslessly(tmp_path):
    from PIL import Image

    arrays = _write_set(tmp_path / "src")
    _generate(tmp_path / "out", tmp_path / "src", test_samples=20)
    png = sorted((tmp_path / "out" / "zeroshot_test" / "0_t-shirt-top").glob("*.png"))[0]
    img = np.asarray(Image.open(png))
    assert img.shape == (32, 32, 3)
    np.testing.assert_array_equal(img[2:30, 2:30, 0], arrays["test_images"][0])
    assert img[:2].max() == 0 and img[:, :2].max() == 0


def test_draw_changes_the_split_and_the_same_draw_gives_the_same_bytes(tmp_path):
    _write_set(tmp_path / "src")
    _generate(tmp_path / "a", tmp_path / "src", seed=1)
    _generate(tmp_path / "b", tmp_path / "src", seed=1)
    _generate(tmp_path / "c", tmp_path / "src", seed=2)
    read = lambda d: (d / "val" / "00000.tar").read_bytes()  # noqa: E731
    assert read(tmp_path / "a") == read(tmp_path / "b") != read(tmp_path / "c")


def test_mnist_like_plain_files_of_another_size_with_their_class_names(tmp_path):
    _write_set(tmp_path / "mnist", gz=False, rows=20, cols=20, classes=3)
    s = _generate(
        tmp_path / "out", tmp_path / "mnist", classnames=["zero", "one", "two"], image_size=24, val_samples=30
    )
    assert s["classes"]["names"] == ["zero", "one", "two"] and s["source"]["image_shape"] == [20, 20]
    with pytest.raises(ValueError, match="3 class names for labels 0..9"):
        _write_set(tmp_path / "ten")
        _generate(tmp_path / "out2", tmp_path / "ten", classnames=["zero", "one", "two"])


def test_bad_sizes_name_the_flag(tmp_path):
    _write_set(tmp_path / "src")
    with pytest.raises(ValueError, match=r"--val-samples 500: must be within \[1, 239\]"):
        _generate(tmp_path / "out", tmp_path / "src", val_samples=500)
    with pytest.raises(ValueError, match="--fewshot-train-per-class 20: needs 200 held-out images"):
        _generate(tmp_path / "out", tmp_path / "src", fewshot_train_per_class=20)


def test_reuse_keeps_and_overwrite_replaces(tmp_path):
    _write_set(tmp_path / "src")
    _generate(tmp_path / "out", tmp_path / "src")
    with pytest.raises(FileExistsError, match="--overwrite"):
        _generate(tmp_path / "out", tmp_path / "src")
    stamp = (tmp_path / "out" / "summary.json").stat().st_mtime_ns
    _generate(tmp_path / "out", tmp_path / "src", reuse=True)
    assert (tmp_path / "out" / "summary.json").stat().st_mtime_ns == stamp
    _generate(tmp_path / "out", tmp_path / "src", overwrite=True, seed=3)
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["config"]["seed"] == 3


# -- the command --------------------------------------------------------------------------------------------------
def _cli(argv, capsys):
    from clip_dcl.cli import main

    try:
        rc = main(["data", "fashion-mnist", *map(str, argv)])
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr()


def test_command_without_the_files_says_what_to_install_in_one_line(tmp_path, capsys):
    rc, out = _cli([tmp_path / "out", "--from", tmp_path / "nowhere"], capsys)
    lines = out.err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, out.err
    assert "apt-get install dataset-fashion-mnist" in lines[0]
    assert all(name in lines[0] for name in fashion.FILES.values())
    assert not (tmp_path / "out").exists()  # nothing written


def test_command_with_a_truncated_file_names_it_and_the_package(tmp_path, capsys):
    _write_set(tmp_path / "src")
    f = tmp_path / "src" / fashion.FILES["test_labels"]
    f.write_bytes(f.read_bytes()[:-10])
    rc, out = _cli([tmp_path / "out", "--from", tmp_path / "src"], capsys)
    assert rc == 2 and len(out.err.strip().splitlines()) == 1
    assert fashion.FILES["test_labels"] in out.err and "dataset-fashion-mnist" in out.err


def test_command_writes_the_layout_and_the_packed_set(tmp_path, capsys):
    from clip_dcl.data.packed import load_packed

    _write_set(tmp_path / "src")
    rc, out = _cli(
        [
            tmp_path / "out",
            "--from",
            tmp_path / "src",
            "--val-samples",
            "100",
            "--fewshot-train-per-class",
            "5",
            "--fewshot-test-per-class",
            "2",
            "--train-samples",
            "100",
            "--pack",
            "--quiet",
        ],
        capsys,
    )
    assert rc == 0, out.err
    assert f"train_packed {tmp_path / 'out' / 'train.npz'}" in out.out
    packed = load_packed(tmp_path / "out" / "train.npz")
    assert packed["images"].shape == (100, 32, 32, 3)
    assert all(c.endswith(".") for c in packed["captions"])


def test_fmnist_recipe_reads_this_layout():
    from clip_dcl.experiment.recipes import get_recipe

    r = get_recipe("fmnist-words")
    argv = r.train_argv(batch_size=32, seed=1, epochs=10)
    assert argv[argv.index("--model") + 1] == "clip-dcl-micro-fmnist"
    assert r.data_argv[:2] == ("data", "fashion-mnist") and "--pack" in r.data_argv
    assert argv[argv.index("--train-num-samples") + 1] == r.data_argv[r.data_argv.index("--train-samples") + 1]
    assert argv[argv.index("--val-num-samples") + 1] == r.data_argv[r.data_argv.index("--val-samples") + 1]
