"""Retrieval metrics (chunked ranks, several captions per image) and the retrieval evaluator."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_evalsets import ToyCLIP, ToyTokenizer, to_tensor, write_png, write_shard

from clip_dcl.eval.metrics import retrieval_metrics, retrieval_ranks
from clip_dcl.eval.retrieval import evaluate_retrieval


def _random_pairs(n_img, captions_per_image, dim, seed, noise=1.0):
    g = torch.Generator().manual_seed(seed)
    img = F.normalize(torch.randn(n_img, dim, generator=g), dim=-1)
    counts = torch.randint(1, captions_per_image + 1, (n_img,), generator=g)
    t2i = torch.repeat_interleave(torch.arange(n_img), counts)
    t2i = t2i[torch.randperm(len(t2i), generator=g)]  # captions not grouped by image
    txt = F.normalize(img[t2i] + noise * torch.randn(len(t2i), dim, generator=g), dim=-1)
    return img, txt, t2i


@pytest.mark.parametrize("n, chunk", [(1, 4), (50, 7), (257, 64), (300, 1024)])
def test_one_to_one_equals_openclip_get_clip_metrics(n, chunk):
    from open_clip_train.train import get_clip_metrics

    img, txt, _ = _random_pairs(n, 1, 16, seed=n)
    txt = F.normalize(img + 1.2 * torch.randn(n, 16, generator=torch.Generator().manual_seed(1)), dim=-1)
    ref = get_clip_metrics(img.double(), txt.double(), torch.tensor(100.0, dtype=torch.double))
    ours = retrieval_metrics(img.double(), txt.double(), chunk_size=chunk)
    assert ref.keys() <= ours.keys()
    for k, v in ref.items():
        assert ours[k] == pytest.approx(float(v), abs=1e-12), k


def _brute_force(img, txt, t2i):
    """Full score matrix; rank of the best true item by sorting; CLIP_benchmark-style hits."""
    s = (img @ txt.T).numpy()
    n_img, n_txt = s.shape
    pos = np.zeros_like(s, dtype=bool)
    pos[t2i.numpy(), np.arange(n_txt)] = True
    i2t = []
    for i in range(n_img):
        order = np.argsort(-s[i], kind="stable")
        i2t.append(int(np.nonzero(pos[i, order])[0][0]))
    t2i_r = []
    for t in range(n_txt):
        order = np.argsort(-s[:, t], kind="stable")
        t2i_r.append(int(np.nonzero(pos[order, t])[0][0]))
    return np.array(i2t), np.array(t2i_r), s, pos


@pytest.mark.parametrize("seed", range(4))
def test_multi_caption_ranks_and_recall_match_brute_force_and_torchmetrics(seed):
    from torchmetrics.retrieval import RetrievalHitRate

    img, txt, t2i = _random_pairs(40, 4, 8, seed)
    i2t_ranks, t2i_ranks = retrieval_ranks(img, txt, t2i, chunk_size=6)
    ref_i2t, ref_t2i, s, pos = _brute_force(img, txt, t2i)
    np.testing.assert_array_equal(i2t_ranks.numpy(), ref_i2t)
    np.testing.assert_array_equal(t2i_ranks.numpy(), ref_t2i)
    m = retrieval_metrics(img, txt, t2i, chunk_size=6)
    n_img, n_txt = s.shape
    for k in (1, 5, 10):
        # image -> text: one query per image over all texts (several relevant)
        hit = RetrievalHitRate(top_k=k)
        ref = hit(
            torch.from_numpy(s).flatten(),
            torch.from_numpy(pos).flatten(),
            indexes=torch.arange(n_img).repeat_interleave(n_txt),
        )
        assert m[f"image_to_text_R@{k}"] == pytest.approx(float(ref), abs=1e-6)
        assert m[f"text_retrieval_recall@{k}"] == m[f"image_to_text_R@{k}"]
        hit = RetrievalHitRate(top_k=k)
        ref = hit(
            torch.from_numpy(s.T).flatten(),
            torch.from_numpy(pos.T).flatten(),
            indexes=torch.arange(n_txt).repeat_interleave(n_img),
        )
        assert m[f"text_to_image_R@{k}"] == pytest.approx(float(ref), abs=1e-6)
        assert m[f"image_retrieval_recall@{k}"] == m[f"text_to_image_R@{k}"]
    assert m["image_to_text_mean_rank"] == pytest.approx(ref_i2t.mean() + 1)
    assert m["text_to_image_median_rank"] == np.floor(np.median(ref_t2i)) + 1


def test_hand_built_case_with_two_captions():
    img = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    # texts 0, 1 describe image 0; text 2 image 1. Scores with image 0: 0.2, 0.9, 0.5.
    txt = torch.tensor([[0.2, 0.1], [0.9, 0.0], [0.5, 0.3]])
    i2t, t2i = retrieval_ranks(img, txt, torch.tensor([0, 0, 1]))
    # image 0: best caption (0.9) first -> 0; image 1: scores 0.1, 0.0, 0.3 -> its text first -> 0
    assert i2t.tolist() == [0, 0]
    # text 0: image 0 scores 0.2 vs image 1 0.1 -> 0; text 1: 0.9 vs 0.0 -> 0; text 2: 0.3 vs 0.5 -> 1
    assert t2i.tolist() == [0, 0, 1]


def test_collapsed_embeddings_score_zero_not_one():
    x = torch.ones(5, 3)
    m = retrieval_metrics(x, x)
    assert m["image_to_text_R@1"] == 0.0 and m["text_to_image_R@1"] == 0.0
    assert m["image_to_text_mean_rank"] == 5.0


def test_bad_inputs_are_rejected_with_a_message():
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"images without any text, e.g. indices \[2\]"):
        retrieval_ranks(x, torch.randn(2, 4), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="NaN"):
        retrieval_ranks(x, torch.full((3, 4), float("nan")))
    with pytest.raises(ValueError, match="feature sizes differ"):
        retrieval_ranks(x, torch.randn(3, 5))
    with pytest.raises(ValueError, match="outside"):
        retrieval_ranks(x, torch.randn(3, 4), torch.tensor([0, 1, 3]))


def _retrieval_fixture(tmp_path):
    """Shards and a CSV with the same 6 images; captions name noisy colours (rgb R G B)."""
    rng = np.random.default_rng(0)
    rgbs = [tuple(int(v) for v in rng.integers(0, 256, 3)) for _ in range(6)]
    caps = []
    for i, rgb in enumerate(rgbs):
        n = 1 + i % 3
        caps.append(
            [f"a patch rgb {' '.join(str(int(v) + int(rng.integers(-60, 61))) for v in rgb)} #{j}" for j in range(n)]
        )
    samples = [(f"{i:09d}", rgb, c[0], c if len(c) > 1 else None) for i, (rgb, c) in enumerate(zip(rgbs, caps))]
    (tmp_path / "shards").mkdir()
    write_shard(tmp_path / "shards" / "val-000.tar", samples[:4])
    write_shard(tmp_path / "shards" / "val-001.tar", samples[4:])
    rows = ["filepath,title"]
    for i, (rgb, c) in enumerate(zip(rgbs, caps)):
        write_png(tmp_path / "img" / f"{i}.png", rgb)
        rows.extend(f"img/{i}.png,{t}" for t in c)
    (tmp_path / "pairs.csv").write_text("\n".join(rows) + "\n")
    return rgbs, caps


def test_evaluate_retrieval_shards_and_csv_match_direct_features(tmp_path):
    rgbs, caps = _retrieval_fixture(tmp_path)
    model, tok = ToyCLIP(), ToyTokenizer()
    img = F.normalize(torch.tensor(rgbs, dtype=torch.float32) / 255 - 0.5, dim=-1)
    texts = [t for c in caps for t in c]
    t2i = torch.tensor([i for i, c in enumerate(caps) for _ in c])
    txt = F.normalize(tok(texts) - 0.5, dim=-1)
    expected = retrieval_metrics(img, txt, t2i)
    assert 0 < expected["image_to_text_R@1"] < 1  # the noise makes it a real ranking problem
    got_wds, info = evaluate_retrieval(
        model, to_tensor, tok, tmp_path / "shards", batch_size=4, progress=False, return_info=True
    )
    got_csv = evaluate_retrieval(model, to_tensor, tok, tmp_path / "pairs.csv", batch_size=4, progress=False)
    chance = info.pop("chance")
    assert info == {"num_images": 6, "num_texts": len(texts), "skipped": {}}
    assert chance["image_to_text_R@1"]["queries"] == 6 and chance["text_to_image_R@1"]["queries"] == len(texts)
    for k, v in expected.items():
        assert got_wds[k] == pytest.approx(v, abs=1e-6), k
        assert got_csv[k] == pytest.approx(v, abs=1e-6), k


def test_retrieval_cli_writes_flat_json(tmp_path, capsys):
    from clip_dcl.eval.cli import main

    _retrieval_fixture(tmp_path)
    out = tmp_path / "r.json"
    rc = main(
        [
            "retrieval",
            "--model",
            "clip-dcl-tiny",
            "--data",
            str(tmp_path / "pairs.csv"),
            "--output",
            str(out),
            "--no-progress",
            "--device",
            "cpu",
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["model"]["name"] == "clip-dcl-tiny" and doc["data"]["num_images"] == 6
    assert 0 <= doc["image_to_text_R@1"] <= doc["image_to_text_R@5"] <= 1
    assert doc["settings"]["chunk_size"] == 1024
    # 6 images, 12 captions: a text finds its image by chance k / 6, and R@10 over 6 images measures nothing
    assert doc["chance"]["text_to_image_R@1"]["chance"] == pytest.approx(1 / 6)
    assert doc["chance"]["text_to_image_R@1"]["queries"] == 12 and doc["chance"]["image_to_text_R@1"]["queries"] == 6
    assert doc["chance"]["text_to_image_R@10"]["mark"] == doc["chance"]["image_retrieval_recall@10"]["mark"]
    assert doc["chance"]["text_to_image_R@10"]["mark"] == "meaningless"
    printed = capsys.readouterr().out
    assert "\n  chance " in printed and "\n! meaningless: chance is 1" in printed, printed
    assert (
        main(["retrieval", "--model", "clip-dcl-tiny", "--data", str(tmp_path / "nothere.csv"), "--no-progress"]) == 2
    )


def test_a_corrupt_image_in_retrieval_shards_is_skipped_logged_and_counted(tmp_path, caplog):
    import io
    import logging
    import tarfile

    rgbs, caps = _retrieval_fixture(tmp_path)
    shard = tmp_path / "shards" / "val-001.tar"
    with tarfile.open(shard, "a") as tf:  # a sample whose png is cut short
        for name, data in (("000000099.png", b"\x89PNG\r\n\x1a\n truncated"), ("000000099.txt", b"a patch")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    caplog.set_level(logging.WARNING)
    model, tok = ToyCLIP(), ToyTokenizer()
    got, info = evaluate_retrieval(
        model, to_tensor, tok, tmp_path / "shards", batch_size=4, progress=False, return_info=True
    )
    assert info["num_images"] == 6  # the six good samples, scored as without the bad one
    assert info["skipped"] == {"undecodable image": 1}
    messages = [r.getMessage() for r in caplog.records]
    assert any("'000000099'" in m and "val-001.tar" in m and "undecodable image" in m for m in messages), messages


def test_output_json_writes_null_for_nan(tmp_path):
    from clip_dcl.eval.report import write_json

    path = write_json(
        tmp_path / "r.json",
        {"acc1": 0.5, "acc5": float("nan"), "nested": {"x": [float("inf"), 1.0]}, "t": torch.tensor(float("nan"))},
    )
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"acc1": 0.5, "acc5": None, "nested": {"x": [None, 1.0]}, "t": None}
