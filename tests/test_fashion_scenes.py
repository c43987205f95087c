"""`clip-dcl data fashion-scenes`: scenes, captions, splits and the layout, on small IDX files written here
(never the real set)."""

from __future__ import annotations

import gzip
import io
import json
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest

from clip_dcl.data import fashion, scenes
from clip_dcl.data.idx import write_idx


def _write_set(folder: Path, n_train=240, n_test=80, seed=0):
    """Grey 28 px images, each a bright rectangle of its own size, place and level, labels cycling 0..9."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)

    def images(n):
        x = np.zeros((n, 28, 28), dtype=np.uint8)
        for i in range(n):
            h, w = rng.integers(6, 26, size=2)
            top, left = rng.integers(0, 28 - h), rng.integers(0, 28 - w)
            x[i, top : top + h, left : left + w] = rng.integers(60, 250, size=(h, w))
        return x

    arrays = {
        "train_images": images(n_train),
        "train_labels": np.arange(n_train) % 10,
        "test_images": images(n_test),
        "test_labels": np.arange(n_test) % 10,
    }
    for key, name in fashion.FILES.items():
        write_idx(folder / name, arrays[key])
    return arrays


_SMALL = dict(
    holdout=100,
    train_samples=60,
    val_samples=150,
    test_samples=60,
    shard_size=40,
    fewshot_train_per_class=5,
    fewshot_test_per_class=1,
    verbose=False,
)


def _read_split(out: Path, split: str):
    from PIL import Image

    rows = []
    for shard in sorted((out / split).glob("*.tar")):
        with tarfile.open(shard) as tar:
            files = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
        for name in sorted(n for n in files if n.endswith(".json")):
            key = name[:-5]
            rows.append(
                (
                    np.asarray(Image.open(io.BytesIO(files[key + ".png"])).convert("L")),
                    files[key + ".txt"].decode(),
                    json.loads(files[name]),
                )
            )
    return rows


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("scenes")
    arrays = _write_set(root / "src")
    summary = scenes.generate(root / "out", root / "src", **_SMALL)
    return root / "out", arrays, summary


def test_layout_has_every_split_the_readers_expect(written):
    out, _, s = written
    assert (s["train"]["num_samples"], s["val"]["num_samples"], s["test"]["num_samples"]) == (60, 150, 60)
    for name in (
        "summary.json",
        "zeroshot/classnames.txt",
        "zeroshot/templates.txt",
        "zeroshot_test/classnames.txt",
        "fewshot/catalog.json",
        "fewshot/fashion-scenes",
    ):
        assert (out / name).exists(), name
    # the zero-shot trees hold every validation / test scene, in the folder of its top-left item's class
    assert sum(1 for _ in (out / "zeroshot").rglob("*.png")) == 150
    assert sum(1 for _ in (out / "zeroshot_test").rglob("*.png")) == 60
    for folder, split in (("zeroshot", "val"), ("zeroshot_test", "test")):
        counts = np.bincount([m["label"] for _, _, m in _read_split(out, split)], minlength=10)
        assert [
            len(list(d.glob("*.png"))) for d in sorted(p for p in (out / folder).iterdir() if p.is_dir())
        ] == counts.tolist()
    assert (out / "zeroshot" / "classnames.txt").read_text().split("\n")[:10] == list(fashion.CLASSNAMES)
    assert s["scene_classes"] > 1 and 0 < s["tau_plus"] < 1
    # the study engine reads the splits off the summary
    from clip_dcl.experiment.study.work import _from_summary

    splits = _from_summary(out)
    assert (splits["train_samples"], splits["validation_samples"], splits["test_samples"]) == (60, 150, 60)


def test_scenes_hold_two_to_four_items_top_left_always_and_the_label_is_its_class(written):
    out, _, _ = written
    for split in ("train", "val", "test"):
        for _, _, meta in _read_split(out, split):
            positions = [it["position"] for it in meta["items"]]
            assert 2 <= len(positions) <= 4 and len(set(positions)) == len(positions)
            assert "top left" in positions
            top_left = meta["items"][positions.index("top left")]
            assert meta["label"] == top_left["label"] and meta["classname"] == fashion.CLASSNAMES[meta["label"]]


def test_each_split_draws_its_photographs_from_its_own_pool(written):
    out, arrays, _ = written
    side = 16
    train_cells = scenes.shrink(arrays["train_images"], side)
    test_cells = scenes.shrink(arrays["test_images"], side)
    val_idx, train_idx = fashion.holdout(0, 240, 100)
    found = {"train": set(), "val": set(), "test": set()}
    for split in found:
        pool = test_cells if split == "test" else train_cells
        for image, _, meta in _read_split(out, split):
            assert image.shape == (32, 32)
            occupied = set()
            for item in meta["items"]:
                r, c = divmod(scenes.POSITIONS[2].index(item["position"]), 2)
                occupied.add((r, c))
                cell = image[r * side : (r + 1) * side, c * side : (c + 1) * side]
                match = np.flatnonzero((pool == cell).all(axis=(1, 2)))
                assert len(match), (split, item)  # the cell is one of the split's photographs, shrunk
                labels = arrays["test_labels" if split == "test" else "train_labels"][match]
                assert item["label"] in labels
                found[split].update(match.tolist())
            for r in range(2):
                for c in range(2):
                    if (r, c) not in occupied:
                        assert not image[r * side : (r + 1) * side, c * side : (c + 1) * side].any()
    assert found["val"] <= set(val_idx.tolist())
    assert not found["train"] & set(val_idx.tolist())


def test_captions_name_each_item_its_cell_and_only_its_own_attribute_words(written):
    out, _, s = written
    every = {w for bins in fashion.ATTRIBUTE_WORDS.values() for ws in bins for w in ws}
    for split in ("train", "val", "test"):
        for _, txt, meta in _read_split(out, split):
            assert txt == meta["captions"][0]
            assert len(meta["captions"]) == (5 if split == "train" else 1)
            for cap in meta["captions"]:
                allowed = {
                    w
                    for it in meta["items"]
                    for name, b in it["attributes"].items()
                    for w in fashion.ATTRIBUTE_WORDS[name][b]
                }
                words = set(re.findall(r"[a-z-]+", cap))
                assert not (every - allowed) & words, cap
                for it in meta["items"]:
                    assert re.search(rf"{re.escape(it['classname'])} (on|at) the {it['position']}\b", cap), (cap, it)
    for split in ("val", "test"):  # retrieval's targets: one right answer per query
        caps = [txt for _, txt, _ in _read_split(out, split)]
        assert len(set(caps)) == len(caps)


def test_item_phrase_names_one_or_two_attributes():
    cfg = scenes.ScenesConfig()
    rng = np.random.default_rng(0)
    bins = {"brightness": 0, "fill": 2, "aspect": 1, "texture": 1}
    counts = set()
    for _ in range(200):
        phrase = scenes.item_phrase("ankle boot", bins, "top right", cfg, rng)
        assert phrase.startswith(("a ", "an ")), phrase
        assert phrase.endswith(("ankle boot on the top right", "ankle boot at the top right")), phrase
        counts.add(len(phrase.split()) - 7)  # the article, the class's two words, "on the", the cell's two
    assert counts == {1, 2}


def test_same_draw_same_bytes_other_draw_other_scenes(tmp_path, written):
    out, _, _ = written
    src = out.parent / "src"
    a = scenes.generate(tmp_path / "a", src, **_SMALL)
    b = scenes.generate(tmp_path / "b", src, **{**_SMALL, "seed": 1})
    assert (tmp_path / "a" / "val" / "00000.tar").read_bytes() == (out / "val" / "00000.tar").read_bytes()
    assert a["config"] == json.loads((out / "summary.json").read_text())["config"]
    assert [t for _, t, _ in _read_split(tmp_path / "b", "val")] != [t for _, t, _ in _read_split(out, "val")]
    assert b["config"]["seed"] == 1


def test_every_word_written_is_one_token_of_the_shipped_tokenizer(written):
    import open_clip

    import clip_dcl  # noqa: F401  (registers the shipped configs)
    from clip_dcl.data.synth import words

    merges = words.learn_merges(scenes.scene_words())
    shipped = gzip.open(Path(clip_dcl.__file__).parent / "model_configs" / "words" / "fscenes-words-bpe.txt.gz").read()
    assert shipped.decode() == words.merges_text(merges)
    tok = open_clip.get_tokenizer("clip-dcl-micro-fscenes")
    assert tok.vocab_size == words.vocab_size(merges)
    out, _, _ = written
    texts = [c for split in ("train", "val") for _, _, m in _read_split(out, split) for c in m["captions"]]
    texts += [t.format(c=c) for t in scenes.ZEROSHOT_TEMPLATES + scenes.FEWSHOT_TEMPLATES for c in fashion.CLASSNAMES]
    for text in texts:
        pieces = len(re.findall(r"[^\W\d_]+", text)) + len(re.findall(r"[^\w\s]", text))
        assert len(tok.encode(text)) == pieces, text
        assert pieces + 2 <= tok.context_length, text


def test_command_line_writes_the_layout_and_names_what_is_missing(tmp_path, capsys, written):
    from clip_dcl.data.cli import main

    src = written[0].parent / "src"
    argv = [
        "fashion-scenes",
        str(tmp_path / "o"),
        "--from",
        str(src),
        "--holdout",
        "100",
        "--train-samples",
        "20",
        "--val-samples",
        "150",
        "--test-samples",
        "60",
        "--fewshot-train-per-class",
        "5",
        "--fewshot-test-per-class",
        "1",
        "--quiet",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "train_data " in printed and (tmp_path / "o" / "summary.json").is_file()
    assert main([*argv, "--reuse"]) == 0  # the same settings: kept
    with pytest.raises(SystemExit):
        main([*argv[:-1], "--max-items", "5"])  # a 2 x 2 grid has four cells
    assert "--max-items 5" in capsys.readouterr().err
    assert main(["fashion-scenes", str(tmp_path / "p"), "--from", str(tmp_path / "nowhere"), "--quiet"]) == 2
    assert "apt-get install dataset-fashion-mnist" in capsys.readouterr().err


def test_recipe_reads_the_scenes_with_their_model():
    from clip_dcl.experiment.recipes import get_recipe

    r = get_recipe("fscenes-words")
    assert r.data_argv[:2] == ("data", "fashion-scenes") and "--pack" in r.data_argv
    argv = r.train_argv(batch_size=16, seed=3, epochs=10)
    assert argv[argv.index("--model") + 1] == "clip-dcl-micro-fscenes"
    assert argv[argv.index("--train-num-samples") + 1] == "20000"
    full = get_recipe("fscenes4-words")  # the second gate's scenes: four items, two attributes each, the same model
    assert full.model == r.model and full.data_argv[full.data_argv.index("--min-items") + 1] == "4"
    assert full.data_argv[full.data_argv.index("--min-attributes") + 1] == "2"
