"""CLIP_benchmark's webdataset layout, names and output: shards written in that layout read as it
reads them (all captions of an image in one .txt, one per line; .cls / .npy labels; classnames and
templates files), the metrics it reports computed its way, CuPL templates, Dataset/DataLoader
inputs, --recall-k, --precision and --format clip_benchmark.

Where CLIP_benchmark is importable (it is not a dependency), its own reader and metric functions
run on the same shards and model and must give the same numbers.
"""

from __future__ import annotations

import io
import json
import math
import tarfile

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_evalsets import COLOURS, ToyCLIP, ToyTokenizer, png_bytes, to_tensor, write_png

from clip_dcl.data import evalsets as es
from clip_dcl.eval.encoding import zeroshot_classifier
from clip_dcl.eval.retrieval import evaluate_retrieval
from clip_dcl.eval.zeroshot import evaluate_zeroshot


# ----------------------------------------------------------------------------------------------
# Writing CLIP_benchmark's layout
# ----------------------------------------------------------------------------------------------
def _add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


def write_benchmark_set(root, samples, dataset_type=None, classnames=None, templates=None, per_shard=5, split="test"):
    """ROOT/<split>/{0..n-1}.tar + nshards.txt (+ dataset_type.txt, classnames.txt, templates), as
    CLIP_benchmark's ``clip_benchmark_export_wds`` lays it out. ``samples``: (rgb, extra files)."""
    (root / split).mkdir(parents=True, exist_ok=True)
    shards = [samples[i : i + per_shard] for i in range(0, len(samples), per_shard)]
    for s, chunk in enumerate(shards):
        with tarfile.open(root / split / f"{s}.tar", "w") as tf:
            for j, (rgb, files) in enumerate(chunk):
                key = f"s{s:04d}{j:04d}"
                _add(tf, f"{key}.webp" if j % 2 else f"{key}.png", png_bytes(rgb, noise=8, seed=s * 100 + j))
                for ext, data in files.items():
                    _add(tf, f"{key}.{ext}", data)
    (root / split / "nshards.txt").write_text(f"{len(shards)}\n")
    if dataset_type:
        (root / "dataset_type.txt").write_text(dataset_type + "\n")
    if classnames:
        (root / "classnames.txt").write_text("\n".join(classnames) + "\n")
    if templates:
        (root / "zeroshot_classification_templates.txt").write_text("\n".join(templates) + "\n")
    return root


def _retrieval_set(root, n=12, captions=3, seed=0):
    """n images of random colours, each with ``captions`` noisy 'rgb R G B' captions in one .txt."""
    rng = np.random.default_rng(seed)
    samples, truth = [], []
    for _ in range(n):
        rgb = tuple(int(v) for v in rng.integers(30, 225, 3))
        caps = [
            f"rgb {' '.join(str(int(np.clip(v + rng.integers(-60, 61), 0, 255))) for v in rgb)}"
            for _ in range(captions)
        ]
        samples.append((rgb, {"txt": "\n".join(caps).encode()}))
        truth.append(caps)
    write_benchmark_set(root, samples, dataset_type="retrieval")
    return truth


def _read_tars_as_benchmark_does(root, split="test"):
    """(images, captions per image) straight from the tars: decode the image, ``str.splitlines`` the txt."""
    from PIL import Image

    n = int((root / split / "nshards.txt").read_text())
    images, captions = [], []
    for s in range(n):
        with tarfile.open(root / split / f"{s}.tar") as tf:
            members = {}
            for m in tf.getmembers():
                key, ext = m.name.split(".", 1)
                members.setdefault(key, {})[ext] = tf.extractfile(m).read()
            for key in members:  # tar order
                f = members[key]
                img = f.get("png") or f.get("webp")
                images.append(to_tensor(Image.open(io.BytesIO(img)).convert("RGB")))
                captions.append(f["txt"].decode().splitlines())
    return torch.stack(images), captions


def _benchmark_recall(images_emb, texts_emb, text_image, k):
    """CLIP_benchmark's definition, from its docs: scores = texts @ images^T; a query is a hit when
    at least one of its positives is among its top-k (image retrieval per text, text retrieval per image)."""
    scores = texts_emb @ images_emb.T
    positive = torch.zeros_like(scores, dtype=torch.bool)
    positive[torch.arange(len(scores)), text_image] = True

    def hits(s, pos):
        top = s.topk(k, dim=1).indices
        return pos.gather(1, top).any(1).double().mean().item()

    return hits(scores, positive), hits(scores.T, positive.T)


# ----------------------------------------------------------------------------------------------
# Retrieval
# ----------------------------------------------------------------------------------------------
def test_retrieval_shards_with_several_captions_per_txt(tmp_path):
    truth = _retrieval_set(tmp_path / "coco", n=12, captions=3)
    model, tok = ToyCLIP(), ToyTokenizer()
    m, info = evaluate_retrieval(
        model, to_tensor, tok, tmp_path / "coco", batch_size=4, progress=False, return_info=True, ks=(1, 2, 5)
    )
    # several captions per image come back as several captions, not one text with newlines
    chance = info.pop("chance")  # the chance levels, tested in tests/test_eval_chance.py
    assert chance["image_retrieval_recall@1"]["queries"] == 36 and chance["text_retrieval_recall@1"]["queries"] == 12
    assert info == {"num_images": 12, "num_texts": 36, "skipped": {}}
    images, captions = _read_tars_as_benchmark_does(tmp_path / "coco")
    assert sorted(map(tuple, captions)) == sorted(map(tuple, truth))
    img = F.normalize(model.encode_image(images), dim=-1)
    texts = [c for caps in captions for c in caps]
    txt = F.normalize(model.encode_text(tok(texts)), dim=-1)
    t2i = torch.tensor([i for i, caps in enumerate(captions) for _ in caps])
    for k in (1, 2, 5):
        image_r, text_r = _benchmark_recall(img, txt, t2i, k)
        assert m[f"image_retrieval_recall@{k}"] == pytest.approx(image_r, abs=1e-8)
        assert m[f"text_retrieval_recall@{k}"] == pytest.approx(text_r, abs=1e-8)
    assert 0 < m["image_retrieval_recall@1"] < 1 and 0 < m["text_retrieval_recall@1"] < 1
    # the split folder itself works too, and a plain glob of the folder's tars reads the same
    assert evaluate_retrieval(model, to_tensor, tok, tmp_path / "coco" / "test", progress=False, ks=(1, 2, 5)) == m


def test_retrieval_equals_clip_benchmark_on_its_own_reader(tmp_path):
    pytest.importorskip("clip_benchmark")
    from clip_benchmark.datasets.builder import build_wds_dataset
    from clip_benchmark.metrics import zeroshot_retrieval

    _retrieval_set(tmp_path / "flickr", n=14, captions=5, seed=3)
    model, tok = ToyCLIP(), ToyTokenizer()
    ds = build_wds_dataset("flickr", to_tensor, split="test", data_dir=str(tmp_path / "flickr"))
    loader = torch.utils.data.DataLoader(ds.batched(4), batch_size=None, shuffle=False, num_workers=0)
    theirs = zeroshot_retrieval.evaluate(model, loader, tok, "cpu", amp=False, recall_k_list=[1, 5, 10])
    ours = evaluate_retrieval(model, to_tensor, tok, tmp_path / "flickr", progress=False, ks=(1, 5, 10))
    # theirs is a float32 mean of hits, ours the exact fraction: equal to float32 rounding
    assert theirs and all(ours[k] == pytest.approx(v, abs=1e-7) for k, v in theirs.items())


def test_blank_caption_lines_are_skipped_and_an_empty_txt_is_named(tmp_path):
    assert es.split_captions("a red thing\n\n   \n a blue thing \r\n") == ["a red thing", "a blue thing"]
    write_benchmark_set(
        tmp_path / "r",
        [((200, 20, 20), {"txt": b"rgb 200 20 20\n\nred\n"}), ((20, 20, 200), {"txt": b"blue\n"})],
        dataset_type="retrieval",
    )
    caps = [c for _, c, _ in es.retrieval_wds(es.expand_shards(tmp_path / "r"), to_tensor)]
    assert caps == [["rgb 200 20 20", "red"], ["blue"]]
    write_benchmark_set(tmp_path / "e", [((200, 20, 20), {"txt": b"\n  \n"})], dataset_type="retrieval")
    # an empty .txt is skipped and counted; nothing left to score is an error that says why
    with pytest.raises(ValueError, match=r"no samples in the shards .*0.tar'\] \(1 skipped \(empty caption 1\)\)"):
        evaluate_retrieval(ToyCLIP(), to_tensor, ToyTokenizer(), tmp_path / "e", progress=False)
    with pytest.raises(ValueError, match=r"sample 's00000000' in .*0.tar: empty caption \(.txt holds no caption\)"):
        evaluate_retrieval(ToyCLIP(), to_tensor, ToyTokenizer(), tmp_path / "e", progress=False, strict=True)


def test_a_folder_in_neither_layout_names_both(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "readme.md").write_text("hi")
    with pytest.raises(
        ValueError,
        match=r"neither layout: no \.tar shards \(img2dataset's layout\) and no "
        r"test/nshards\.txt \(CLIP_benchmark's webdataset layout\); found readme\.md",
    ):
        evaluate_retrieval(ToyCLIP(), to_tensor, ToyTokenizer(), tmp_path / "x", progress=False)
    with pytest.raises(
        ValueError,
        match=r"(?s)neither layout: expected an ImageFolder tree.*CLIP_benchmark's "
        r"webdataset layout.*found readme\.md",
    ):
        evaluate_zeroshot(ToyCLIP(), to_tensor, ToyTokenizer(), tmp_path / "x", progress=False)
    (tmp_path / "y" / "test").mkdir(parents=True)
    (tmp_path / "y" / "test" / "nshards.txt").write_text("2\n")
    with pytest.raises(ValueError, match=r"says 2 shards but .*0\.tar' does not exist"):
        es.read_benchmark_shards(tmp_path / "y")


def test_retrieval_from_a_dataset_or_dataloader(tmp_path):
    truth = _retrieval_set(tmp_path / "r", n=8, captions=2, seed=5)
    images, captions = _read_tars_as_benchmark_does(tmp_path / "r")
    model, tok = ToyCLIP(), ToyTokenizer()
    expected = evaluate_retrieval(model, to_tensor, tok, tmp_path / "r", progress=False)

    class Pairs(torch.utils.data.Dataset):
        def __len__(self):
            return len(images)

        def __getitem__(self, i):  # captions as one string, one a line (CLIP_benchmark's .txt)
            return images[i], "\n".join(captions[i])

    got = evaluate_retrieval(model, None, tok, Pairs(), batch_size=3, progress=False)
    loader = torch.utils.data.DataLoader(
        list(zip(images, captions)),
        batch_size=5,
        collate_fn=lambda b: (torch.stack([x for x, _ in b]), [c for _, c in b]),
    )
    got_loader = evaluate_retrieval(model, None, tok, loader, progress=False)
    for k, v in expected.items():
        assert got[k] == pytest.approx(v, abs=1e-7) and got_loader[k] == pytest.approx(v, abs=1e-7), k
    assert len(truth) == 8


# ----------------------------------------------------------------------------------------------
# Zero-shot classification
# ----------------------------------------------------------------------------------------------
NAMES = ["red", "green", "blue", "yellow", "purple", "cyan"]


def _noisy(rgb, rng, spread=110):
    return tuple(int(np.clip(v + rng.integers(-spread, spread + 1), 0, 255)) for v in rgb)


def _classification_set(root, n_per_class=5, seed=0, tree=None):
    """Colour classes with heavy noise (a real error rate), in CLIP_benchmark's layout and,
    with ``tree``, the same images as an ImageFolder tree."""
    rng = np.random.default_rng(seed)
    samples = []
    for j in range(n_per_class):
        for y, name in enumerate(NAMES):
            rgb = _noisy(COLOURS[name], rng)
            samples.append((rgb, {"cls": str(y).encode()}))
    write_benchmark_set(root, samples, classnames=NAMES, templates=["a photo of a {c}.", "a {c} thing"])
    if tree is not None:
        for i, (rgb, f) in enumerate(samples):
            s, j = divmod(i, 5)
            write_png(tree / NAMES[int(f["cls"])] / f"{i:03d}.png", rgb, noise=8, seed=s * 100 + j)
        (tree / "classnames.txt").write_text("\n".join(sorted(NAMES)) + "\n")
        (tree / "templates.txt").write_text("a photo of a {c}.\na {c} thing\n")
    return samples


def test_zeroshot_on_benchmark_shards_reports_its_keys(tmp_path):
    _classification_set(tmp_path / "wds", tree=tmp_path / "tree")
    model, tok = ToyCLIP(), ToyTokenizer()
    m, info = evaluate_zeroshot(model, to_tensor, tok, tmp_path / "wds", progress=False, return_info=True)
    assert info["layout"] == "clip_benchmark" and info["num_images"] == 30 and info["num_templates"] == 2
    assert m["acc1"] == m["top1"] and m["acc5"] == m["top5"]
    assert 0.3 < m["acc1"] < 1.0  # the noise makes errors
    # webp and png images, .cls labels: the same numbers as the same images in an ImageFolder tree
    tree = evaluate_zeroshot(model, to_tensor, tok, tmp_path / "tree", progress=False)
    for k in ("acc1", "acc5", "mean_per_class_recall"):
        assert m[k] == pytest.approx(tree[k], abs=1e-8), k


def _numpy2_safe_accuracy(output, target, topk=(1,)):
    """CLIP_benchmark 1.6.2's top-k accuracy with its float() of a 1-element array (an error under
    numpy 2) written with .item(); the same formula otherwise."""
    pred = output.topk(max(topk), 1, True, True)[1].t()
    correct = pred.eq(target.view(1, -1).expand_as(pred))
    return [correct[:k].reshape(-1).float().sum().item() / len(target) for k in topk]


def test_zeroshot_equals_clip_benchmark_on_its_own_reader(tmp_path, monkeypatch):
    pytest.importorskip("clip_benchmark")
    from clip_benchmark.datasets.builder import build_wds_dataset
    from clip_benchmark.metrics import zeroshot_classification

    monkeypatch.setattr(zeroshot_classification, "accuracy", _numpy2_safe_accuracy)

    _classification_set(tmp_path / "wds", n_per_class=6, seed=4)
    model, tok = ToyCLIP(), ToyTokenizer()
    ds = build_wds_dataset("toy", to_tensor, split="test", data_dir=str(tmp_path / "wds"))
    loader = torch.utils.data.DataLoader(ds.batched(7), batch_size=None, shuffle=False, num_workers=0)
    loader.dataset.classes = ds.classes
    tmpl = [t for t in ds.templates]
    theirs = zeroshot_classification.evaluate(model, loader, tok, ds.classes, tmpl, "cpu", amp=False)
    ours = evaluate_zeroshot(model, to_tensor, tok, tmp_path / "wds", progress=False)
    assert set(theirs) == {"acc1", "acc5", "mean_per_class_recall"}
    for k, v in theirs.items():
        assert ours[k] == pytest.approx(v, abs=1e-8), k


def _multilabel_set(root, n=24, seed=0):
    rng = np.random.default_rng(seed)
    names = ["red", "green", "blue", "yellow"]
    samples, targets = [], []
    for i in range(n):
        t = np.zeros(len(names), dtype=np.float32)
        y = int(rng.integers(len(names)))
        t[y] = 1
        if i % 3 == 0:
            t[(y + 1) % len(names)] = 1
        buf = io.BytesIO()
        np.save(buf, t)
        samples.append((_noisy(COLOURS[names[y]], rng, 90), {"npy": buf.getvalue()}))
        targets.append(t)
    write_benchmark_set(root, samples, dataset_type="multilabel", classnames=names, templates=["a {c} photo"])
    return names, np.stack(targets)


def test_multilabel_zeroshot_reports_mean_average_precision(tmp_path):
    from sklearn.metrics import average_precision_score

    names, targets = _multilabel_set(tmp_path / "voc")
    model, tok = ToyCLIP(), ToyTokenizer()
    m = evaluate_zeroshot(model, to_tensor, tok, tmp_path / "voc", progress=False)
    assert set(m) == {"mean_average_precision"}
    # reference: per-class scikit-learn AP of the logits, averaged
    feats, labels = _labelled_features(tmp_path / "voc", model, multilabel=True)
    assert np.array_equal(labels.numpy(), targets)
    w = zeroshot_classifier(model, tok, names, ["a {c} photo"])
    logits = (100 * F.normalize(feats, dim=-1) @ w).numpy()
    ref = np.mean([average_precision_score(targets[:, c], logits[:, c]) for c in range(len(names))])
    assert m["mean_average_precision"] == pytest.approx(ref, abs=1e-6)
    assert 0.3 < m["mean_average_precision"] < 1


def _labelled_features(root, model, multilabel):
    ds = es.classification_wds(es.read_benchmark_shards(root).shards, to_tensor, multilabel)
    pairs = list(ds)
    feats = model.encode_image(torch.stack([x for x, _ in pairs]))
    labels = torch.stack([y for _, y in pairs]) if multilabel else torch.tensor([y for _, y in pairs])
    return feats, labels


def test_multilabel_equals_clip_benchmark(tmp_path):
    pytest.importorskip("clip_benchmark")
    from clip_benchmark.datasets.builder import build_wds_dataset
    from clip_benchmark.metrics import zeroshot_classification

    _multilabel_set(tmp_path / "voc", n=30, seed=2)
    model, tok = ToyCLIP(), ToyTokenizer()
    ds = build_wds_dataset("voc", to_tensor, split="test", data_dir=str(tmp_path / "voc"))
    loader = torch.utils.data.DataLoader(ds.batched(8), batch_size=None, shuffle=False, num_workers=0)
    theirs = zeroshot_classification.evaluate(model, loader, tok, ds.classes, list(ds.templates), "cpu", amp=False)
    ours = evaluate_zeroshot(model, to_tensor, tok, tmp_path / "voc", progress=False)
    assert ours["mean_average_precision"] == pytest.approx(theirs["mean_average_precision"], abs=1e-6)


def test_cupl_per_class_prompts_and_a_class_without_prompts(tmp_path):
    model, tok = ToyCLIP(), ToyTokenizer()
    cupl = {"red": ["a red thing", "rgb 250 0 0"], "blue": ["blue"]}
    w = zeroshot_classifier(model, tok, ["red", "blue"], cupl)
    red = F.normalize(F.normalize(model.encode_text(tok(cupl["red"])), dim=-1).mean(0), dim=0)
    torch.testing.assert_close(w[:, 0], red)
    torch.testing.assert_close(w[:, 1], F.normalize(model.encode_text(tok(["blue"]))[0], dim=0))
    with pytest.raises(ValueError, match=r"no prompts for classes \['green'\]"):
        zeroshot_classifier(model, tok, ["red", "green"], cupl)
    with pytest.raises(ValueError, match=r"class 'blue' has no prompts"):
        zeroshot_classifier(model, tok, ["red", "blue"], {"red": ["red"], "blue": []})
    # from a JSON file, on CLIP_benchmark shards
    _classification_set(tmp_path / "wds")
    (tmp_path / "cupl.json").write_text(json.dumps({n: [f"a {n} photo", f"{n}"] for n in NAMES}))
    m, info = evaluate_zeroshot(
        model, to_tensor, tok, tmp_path / "wds", templates=tmp_path / "cupl.json", progress=False, return_info=True
    )
    assert info["templates_source"].endswith("cupl.json") and m["acc1"] > 0.3


def test_zeroshot_from_a_dataset_or_dataloader(tmp_path):
    _classification_set(tmp_path / "wds", seed=7)
    model, tok = ToyCLIP(), ToyTokenizer()
    expected = evaluate_zeroshot(model, to_tensor, tok, tmp_path / "wds", progress=False)
    pairs = list(es.classification_wds(es.read_benchmark_shards(tmp_path / "wds").shards, to_tensor))

    class Colours(torch.utils.data.Dataset):
        classes = NAMES
        templates = ["a photo of a {c}.", "a {c} thing"]

        def __len__(self):
            return len(pairs)

        def __getitem__(self, i):
            return pairs[i]

    got = evaluate_zeroshot(model, None, tok, Colours(), batch_size=4, progress=False)
    got_loader = evaluate_zeroshot(
        model, None, tok, torch.utils.data.DataLoader(Colours(), batch_size=11), progress=False
    )
    for k, v in expected.items():
        assert got[k] == pytest.approx(v, abs=1e-8) or (math.isnan(v) and math.isnan(got[k])), k
        assert got_loader[k] == pytest.approx(v, abs=1e-8) or (math.isnan(v) and math.isnan(got_loader[k])), k
    with pytest.raises(ValueError, match="needs classnames"):
        evaluate_zeroshot(
            model, None, tok, torch.utils.data.TensorDataset(torch.zeros(2, 3, 4, 4), torch.zeros(2)), progress=False
        )


# ----------------------------------------------------------------------------------------------
# Precision and the command line
# ----------------------------------------------------------------------------------------------
def test_precision_runs_the_encoders_under_autocast(tmp_path):
    seen = []

    class Recorder(ToyCLIP):
        def encode_image(self, x, normalize=False):
            seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
            return super().encode_image(x, normalize)

    _classification_set(tmp_path / "wds")
    evaluate_zeroshot(Recorder(), to_tensor, ToyTokenizer(), tmp_path / "wds", progress=False)
    evaluate_zeroshot(Recorder(), to_tensor, ToyTokenizer(), tmp_path / "wds", progress=False, precision="amp_bf16")
    assert seen[0] is None and seen[-1] == torch.bfloat16
    with pytest.raises(ValueError, match=r"precision must be one of .*got 'fp8'"):
        evaluate_zeroshot(Recorder(), to_tensor, ToyTokenizer(), tmp_path / "wds", progress=False, precision="fp8")


def test_cli_recall_k_precision_and_clip_benchmark_format(tmp_path, capsys):
    from clip_dcl.eval.cli import build_parser, main

    assert build_parser().parse_args(["retrieval", "--data", "x"]).device == "auto"  # a GPU when one is visible
    _retrieval_set(tmp_path / "wds_coco", n=8, captions=2)
    out = tmp_path / "res" / "ours.json"
    args = [
        "retrieval",
        "--model",
        "clip-dcl-tiny",
        "--data",
        str(tmp_path / "wds_coco"),
        "--no-progress",
        "--device",
        "cpu",
        "--recall-k",
        "1",
        "3",
        "--precision",
        "amp_bf16",
        "--format",
        "clip_benchmark",
        "--output",
        str(out),
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    header = next(line for line in printed.splitlines() if line.startswith("direction"))
    assert header.split()[1:3] == ["R@1", "R@3"] and "R@5" not in header
    doc = json.loads(out.read_text())
    assert doc["settings"]["precision"] == "amp_bf16" and doc["settings"]["recall_k"] == [1, 3]
    assert doc["data"]["num_texts"] == 16
    # the folder wds_coco is CLIP_benchmark's wds/coco; random weights are pretrained "none"
    bench = json.loads((tmp_path / "res" / "coco_none_clip-dcl-tiny_en_zeroshot_retrieval.json").read_text())
    assert {"dataset", "model", "pretrained", "task", "metrics", "language"} <= bench.keys()
    assert bench["dataset"] == "wds/coco" and bench["task"] == "zeroshot_retrieval" and bench["pretrained"] == "none"
    assert bench["precision"] == "amp_bf16"
    assert bench["metrics"] == {
        k: doc[k]
        for k in (
            "image_retrieval_recall@1",
            "image_retrieval_recall@3",
            "text_retrieval_recall@1",
            "text_retrieval_recall@3",
        )
    }
    assert main(args[:-7] + ["--recall-k", "0"]) == 2
    assert "--recall-k values must be >= 1, got [0]" in capsys.readouterr().err
    assert main(args[:-2]) == 2  # clip_benchmark format without --output

    _classification_set(tmp_path / "cls")
    zout = tmp_path / "z.json"
    assert (
        main(
            [
                "zeroshot",
                "--model",
                "clip-dcl-tiny",
                "--data",
                str(tmp_path / "cls"),
                "--no-progress",
                "--format",
                "clip_benchmark",
                "--dataset-name",
                "wds/toy_colours",
                "--output",
                str(zout),
            ]
        )
        == 0
    )
    z = json.loads((tmp_path / "toy_colours_none_clip-dcl-tiny_en_zeroshot_classification.json").read_text())
    assert set(z["metrics"]) == {"acc1", "acc5", "mean_per_class_recall"} and z["precision"] == "fp32"
    assert json.loads(zout.read_text())["settings"]["precision"] == "fp32"
