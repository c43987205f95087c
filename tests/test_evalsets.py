"""Readers of the evaluation data: retrieval CSV/shards, ImageFolder, ELEVATER index files (iris, COCO).

Every test writes its own tiny PNGs, zips and tars. The helpers at the top (image writers and a
toy CLIP whose embeddings are the mean colour of an image or the colour a caption names) are
shared with the evaluator tests.
"""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from clip_dcl.data import evalsets as es

# ----------------------------------------------------------------------------------------------
# Shared helpers
# ----------------------------------------------------------------------------------------------
COLOURS = {
    "red": (230, 20, 20),
    "green": (20, 230, 20),
    "blue": (20, 20, 230),
    "yellow": (230, 230, 20),
    "purple": (230, 20, 230),
    "cyan": (20, 230, 230),
}


def png_bytes(rgb, size=8, noise=0, seed=0) -> bytes:
    """A solid-colour PNG, optionally with uniform integer noise of +-noise per pixel."""
    arr = np.empty((size, size, 3), dtype=np.int16)
    arr[:] = rgb
    if noise:
        arr += np.random.default_rng(seed).integers(-noise, noise + 1, arr.shape, dtype=np.int16)
    buf = io.BytesIO()
    Image.fromarray(arr.clip(0, 255).astype(np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def write_png(path: Path, rgb, **kw) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png_bytes(rgb, **kw))
    return path


def to_tensor(img) -> torch.Tensor:
    """Preprocess for the toy model: PIL -> (3, H, W) float in [0, 1]."""
    return torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)


class ToyTokenizer:
    """Maps a text to the colour it names: a COLOURS word, or 'rgb R G B' with 0-255 numbers."""

    def __call__(self, texts):
        if isinstance(texts, str):
            texts = [texts]
        out = []
        for t in texts:
            words = t.replace(",", " ").replace(".", " ").split()
            if "rgb" in words:
                i = words.index("rgb")
                rgb = [float(w) for w in words[i + 1 : i + 4]]
            else:
                rgb = next(COLOURS[w] for w in words if w in COLOURS)
            out.append(torch.tensor(rgb, dtype=torch.float32) / 255.0)
        return torch.stack(out)


class ToyCLIP(torch.nn.Module):
    """encode_image = centred mean colour of the image; encode_text = centred colour the text names."""

    def encode_image(self, x, normalize=False):
        f = x.mean(dim=(2, 3)) - 0.5
        return torch.nn.functional.normalize(f, dim=-1) if normalize else f

    def encode_text(self, tokens, normalize=False):
        f = tokens.float() - 0.5
        return torch.nn.functional.normalize(f, dim=-1) if normalize else f


def write_iris(folder: Path, classes, train, test, zip_name="train_images.zip", in_zip=True):
    """An ELEVATER iris data set: labels.txt, train.txt/test.txt; train images in an uncompressed zip.

    ``train``/``test``: lists of (class index, rgb, seed); test images go to plain files.
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "labels.txt").write_text("\n".join(classes) + "\n")
    lines = []
    if in_zip:
        with zipfile.ZipFile(folder / zip_name, "w", compression=zipfile.ZIP_STORED) as zf:
            for i, (y, rgb, seed) in enumerate(train):
                name = f"img/{i:05d}.png"
                zf.writestr(name, png_bytes(rgb, noise=10, seed=seed))
                lines.append(f"{zip_name}@{name} {y}")
    else:
        for i, (y, rgb, seed) in enumerate(train):
            write_png(folder / "train" / f"{i:05d}.png", rgb, noise=10, seed=seed)
            lines.append(f"train/{i:05d}.png {y}")
    (folder / "train.txt").write_text("\n".join(lines) + "\n")
    lines = []
    for i, (y, rgb, seed) in enumerate(test):
        write_png(folder / "test" / f"{i:05d}.png", rgb, noise=10, seed=1000 + seed)
        lines.append(f"test/{i:05d}.png {y}")
    (folder / "test.txt").write_text("\n".join(lines) + "\n")
    return folder


def colour_split(names, per_class, seed=0):
    """(class index, rgb, seed) items, classes interleaved."""
    return [(c, COLOURS[n], seed * 1000 + c * 100 + j) for j in range(per_class) for c, n in enumerate(names)]


def write_shard(path: Path, samples):
    """A webdataset shard: samples are (key, rgb, txt or None, captions list or None)."""
    with tarfile.open(path, "w") as tf:
        for key, rgb, txt, caps in samples:
            meta = {"key": key}
            if caps is not None:
                meta["captions"] = caps
            files = {f"{key}.png": png_bytes(rgb), f"{key}.json": json.dumps(meta).encode()}
            if txt is not None:
                files[f"{key}.txt"] = txt.encode()
            for name, data in files.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return path


# ----------------------------------------------------------------------------------------------
# Iris index files
# ----------------------------------------------------------------------------------------------
def test_iris_reads_zip_members_in_place(tmp_path):
    names = ["red", "green", "blue"]
    folder = write_iris(tmp_path / "colours", names, colour_split(names, 2), colour_split(names, 1))
    d = es.read_fewshot_dataset(tmp_path, "colours")
    assert d.layout == "iris" and d.classnames == names and not d.multilabel
    assert [y for _, y in d.train] == [[0], [1], [2], [0], [1], [2]]
    assert d.train[4][0] == "train_images.zip@img/00004.png"
    img = d.source.open(d.train[4][0])
    assert img.size == (8, 8)
    assert np.abs(np.asarray(img, dtype=float).mean((0, 1)) - COLOURS["green"]).max() < 3
    assert not any(p.suffix == ".png" for p in folder.iterdir())  # nothing extracted


def test_iris_path_with_spaces_and_multilabel(tmp_path):
    folder = tmp_path / "voc"
    folder.mkdir()
    (folder / "labels.txt").write_text("a\nb\nc\n")
    write_png(folder / "my images" / "x 1.png", (1, 2, 3))
    (folder / "train.txt").write_text("my images/x 1.png 0,2\n\n")
    (folder / "test.txt").write_text("my images/x 1.png 1\n")
    d = es.read_fewshot_dataset(tmp_path, "voc")
    assert d.train == [("my images/x 1.png", [0, 2])]
    assert d.multilabel


@pytest.mark.parametrize(
    "line, message",
    [
        ("img.png x", "not comma-separated integers"),
        ("img.png", "expected '<image_path> <label ids>'"),
        ("img.png 7", "outside [0, 3)"),
    ],
)
def test_malformed_index_line_names_file_and_line(tmp_path, line, message):
    folder = tmp_path / "bad"
    folder.mkdir()
    write_png(folder / "img.png", (1, 2, 3))
    (folder / "labels.txt").write_text("a\nb\nc\n")
    (folder / "train.txt").write_text(f"img.png 0\n{line}\n")
    (folder / "test.txt").write_text("img.png 1\n")
    with pytest.raises(ValueError) as e:
        es.read_fewshot_dataset(tmp_path, "bad")
    assert message in str(e.value) and "train.txt" in str(e.value) and "line 2" in str(e.value)


def test_missing_zip_member_or_zip_is_named(tmp_path):
    names = ["red", "green"]
    folder = write_iris(tmp_path / "c", names, colour_split(names, 2), colour_split(names, 1))
    with open(folder / "train.txt", "a") as f:
        f.write("train_images.zip@img/nothere.png 0\n")
    with pytest.raises(ValueError, match=r"'img/nothere.png' is not in zip file .*train_images.zip"):
        es.read_fewshot_dataset(tmp_path, "c")
    (folder / "train.txt").write_text("other.zip@img/00000.png 0\n")
    with pytest.raises(ValueError, match=r"zip file .*other.zip' does not exist"):
        es.read_fewshot_dataset(tmp_path, "c")
    (folder / "train.txt").write_text("train_images.zip@img/00000.png 0\n")
    (folder / "test" / "00000.png").unlink()
    with pytest.raises(ValueError, match=r"test split: image .*00000.png' does not exist"):
        es.read_fewshot_dataset(tmp_path, "c")


def test_missing_labels_file_and_unknown_layout(tmp_path):
    names = ["red", "green"]
    folder = write_iris(tmp_path / "c", names, colour_split(names, 1), colour_split(names, 1))
    (folder / "labels.txt").unlink()
    with pytest.raises(ValueError, match=r"no class names for .*c': labels.txt is missing"):
        es.read_fewshot_dataset(tmp_path, "c")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.md").write_text("x")
    # neither layout: the message names both and what was found
    with pytest.raises(
        ValueError,
        match=r"(?s)toolkit's download layout.*one folder a data set.*Found in "
        r".*empty': notes.md; in .*: c/, empty/",
    ):
        es.read_fewshot_dataset(tmp_path, "empty")
    assert es.list_fewshot_datasets(tmp_path) == ["c"]


def test_zip_images_read_in_dataloader_workers(tmp_path):
    """Zip handles are per process: two workers reading one zip get the right pixels."""
    from torch.utils.data import DataLoader

    names = ["red", "green", "blue"]
    write_iris(tmp_path / "c", names, colour_split(names, 4), colour_split(names, 1))
    d = es.read_fewshot_dataset(tmp_path, "c")
    d.source.open(d.train[0][0])  # opened in the parent before forking
    ds = es.ImageListDataset([r for r, _ in d.train], d.source, to_tensor)
    got = {}
    for x, idx in DataLoader(ds, batch_size=2, num_workers=2):
        for xi, i in zip(x, idx.tolist()):
            got[i] = xi.mean((1, 2)) * 255
    for i, (_, ys) in enumerate(d.train):
        assert torch.allclose(got[i], torch.tensor(COLOURS[names[ys[0]]], dtype=torch.float32), atol=3)


# ----------------------------------------------------------------------------------------------
# COCO index and ImageFolder trees
# ----------------------------------------------------------------------------------------------
def test_coco_index(tmp_path):
    folder = tmp_path / "memes"
    folder.mkdir()
    with zipfile.ZipFile(folder / "images.zip", "w") as zf:
        zf.writestr("a.png", png_bytes((10, 10, 10)))
        zf.writestr("b.png", png_bytes((200, 10, 10)))
    doc = {
        "images": [
            {"id": 1, "file_name": "a.png", "zip_file": "images.zip"},
            {"id": 2, "file_name": "b.png", "zip_file": "images.zip"},
        ],
        "annotations": [{"image_id": 2, "category_id": 2}, {"image_id": 1, "category_id": 1}],
        "categories": [{"id": 2, "name": "hateful"}, {"id": 1, "name": "benign"}],
    }
    (folder / "train.json").write_text(json.dumps(doc))
    (folder / "test.json").write_text(json.dumps(doc))
    d = es.read_fewshot_dataset(tmp_path, "memes")
    assert d.layout == "coco" and d.classnames == ["benign", "hateful"]
    assert d.train == [("images.zip@a.png", [0]), ("images.zip@b.png", [1])]
    doc["annotations"].append({"image_id": 9, "category_id": 1})
    (folder / "test.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"test.json' is not a valid COCO .*unknown image id 9"):
        es.read_fewshot_dataset(tmp_path, "memes")


def test_imagefolder_fewshot_layout(tmp_path):
    folder = tmp_path / "shapes"
    for split, n in (("train", 3), ("test", 2)):
        for c in ("big_circle", "square"):
            for i in range(n):
                write_png(folder / split / c / f"{i}.png", COLOURS["red"])
    d = es.read_fewshot_dataset(tmp_path, "shapes")
    assert d.layout == "imagefolder" and d.classnames == ["big circle", "square"]
    assert sorted(y[0] for _, y in d.train) == [0, 0, 0, 1, 1, 1] and len(d.test) == 4
    assert d.source.open(d.test[0][0]).size == (8, 8)
    (folder / "labels.txt").write_text("a big circle\n")
    with pytest.raises(ValueError, match="names 1 classes but"):
        es.read_fewshot_dataset(tmp_path, "shapes")
    (folder / "labels.txt").unlink()
    write_png(folder / "test" / "triangle" / "0.png", COLOURS["red"])
    with pytest.raises(ValueError, match=r"class folders \['triangle'\] absent from the train split"):
        es.read_fewshot_dataset(tmp_path, "shapes")


def test_empty_class_folder_is_named(tmp_path):
    write_png(tmp_path / "a" / "0.png", (0, 0, 0))
    (tmp_path / "b").mkdir()
    with pytest.raises(ValueError, match=r"image folder .*: .*\bb\b"):
        es.scan_image_folder(tmp_path)


def test_imagenet_classnames_need_all_sorted_synsets():
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES

    synsets = [f"n{i:08d}" for i in range(1000)]
    assert es.imagenet_classnames_for(synsets) == list(IMAGENET_CLASSNAMES)
    with pytest.raises(ValueError, match="found 999 synset folders"):
        es.imagenet_classnames_for(synsets[:999])
    assert not es.is_imagenet_synsets(["n0144076", "cat"])


def test_templates_file(tmp_path):
    (tmp_path / "t.txt").write_text("a photo of a {c}.\n\n{} again\n")
    assert es.read_templates(tmp_path / "t.txt") == ["a photo of a {}.", "{} again"]
    (tmp_path / "t.txt").write_text("a photo\n")
    with pytest.raises(ValueError, match=r"t.txt' line 1: 'a photo' has no"):
        es.read_templates(tmp_path / "t.txt")


# ----------------------------------------------------------------------------------------------
# Retrieval data
# ----------------------------------------------------------------------------------------------
def test_retrieval_csv_groups_captions_per_image(tmp_path):
    write_png(tmp_path / "img" / "a.png", (1, 1, 1))
    write_png(tmp_path / "img" / "b.png", (2, 2, 2))
    (tmp_path / "pairs.csv").write_text('filepath,title\nimg/b.png,"one, b"\nimg/a.png,a\nimg/b.png,two b\n')
    t = es.read_retrieval_csv(tmp_path / "pairs.csv")
    assert t.images == ["img/b.png", "img/a.png"]
    assert t.captions == [["one, b", "two b"], ["a"]]
    (tmp_path / "pairs.tsv").write_text("image\tcaption\nimg/a.png\tx\nimg/c.png\ty\n")
    # a missing image is skipped and counted, as data shards and training do; --strict refuses it
    from clip_dcl.data.skips import SampleSkipped, SkipCounter

    skips = SkipCounter()
    t = es.read_retrieval_csv(tmp_path / "pairs.tsv", skips=skips)
    assert t.images == ["img/a.png"] and skips.as_dict() == {"image not found": 1}
    with pytest.raises(SampleSkipped, match=r"line 3.*image not found \(img/c.png\)"):
        es.read_retrieval_csv(tmp_path / "pairs.tsv", skips=SkipCounter(strict=True))
    with pytest.raises(ValueError, match="has no column 'url'"):
        es.read_retrieval_csv(tmp_path / "pairs.csv", img_key="url")


def test_shards_expand_and_yield_caption_lists(tmp_path):
    write_shard(
        tmp_path / "val-000.tar",
        [("000000000", (1, 2, 3), "only txt", None), ("000000001", (4, 5, 6), "main", ["main", "second"])],
    )
    write_shard(tmp_path / "val-001.tar", [("000000002", (7, 8, 9), None, ["json only"])])
    shards = es.expand_shards(tmp_path)
    assert [Path(s).name for s in shards] == ["val-000.tar", "val-001.tar"]
    assert es.expand_shards(str(tmp_path / "val-{000..001}.tar")) == shards
    with pytest.raises(ValueError, match=r"shard .*val-002.tar' does not exist"):
        es.expand_shards(str(tmp_path / "val-{000..002}.tar"))
    samples = list(es.retrieval_wds(shards, to_tensor))
    assert [s[2] for s in samples] == ["000000000", "000000001", "000000002"]
    assert [s[1] for s in samples] == [["only txt"], ["main", "second"], ["json only"]]
    assert torch.allclose(samples[1][0].mean((1, 2)) * 255, torch.tensor([4.0, 5.0, 6.0]), atol=1e-3)
    write_shard(tmp_path / "val-002.tar", [("000000003", (1, 1, 1), None, None)])
    assert list(es.retrieval_wds([str(tmp_path / "val-002.tar")], to_tensor)) == []  # skipped (and logged)
    with pytest.raises(es.SampleSkipped, match=r"'000000003' in .*val-002.tar: no caption"):
        list(es.retrieval_wds([str(tmp_path / "val-002.tar")], to_tensor, strict=True))
