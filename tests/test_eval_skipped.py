"""Evaluation skips what training skips: each bad sample is logged with its shard, key and the right
cause, counted by cause, and written to the result JSON; ``--strict`` turns a skip into an error.
Retrieval, zero-shot and few-shot alike."""

from __future__ import annotations

import io
import json
import logging
import tarfile

import numpy as np
import pytest
from test_evalsets import ToyCLIP, ToyTokenizer, colour_split, png_bytes, to_tensor, write_iris, write_shard

from clip_dcl.data import evalsets as es


def _add_files(shard, files):
    """Append members to an existing tar (each ``(name, bytes)``)."""
    with tarfile.open(shard, "a") as tf:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def _bad_retrieval_shards(folder):
    """6 good samples in two shards, plus: an empty .txt, a .txt that is not UTF-8, a shard of random bytes."""
    rng = np.random.default_rng(0)
    rgbs = [tuple(int(v) for v in rng.integers(0, 256, 3)) for _ in range(6)]
    samples = [(f"{i:09d}", rgb, f"a patch rgb {' '.join(map(str, rgb))}", None) for i, rgb in enumerate(rgbs)]
    folder.mkdir(parents=True)
    write_shard(folder / "val-000.tar", samples[:3])
    write_shard(folder / "val-001.tar", samples[3:])
    _add_files(folder / "val-000.tar", [("000000090.png", png_bytes((1, 2, 3))), ("000000090.txt", b"  \n\n")])
    _add_files(
        folder / "val-001.tar",
        [("000000091.png", png_bytes((3, 2, 1))), ("000000091.txt", "caf\u00e9 au lait".encode("latin-1"))],
    )
    (folder / "val-002.tar").write_bytes(np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    return rgbs


EXPECTED = {"empty caption": 1, "undecodable caption": 1, "shard ended early": 1}


def test_skipped_retrieval_samples_are_counted_by_their_own_cause(tmp_path, caplog):
    from clip_dcl.eval.retrieval import evaluate_retrieval

    _bad_retrieval_shards(tmp_path / "shards")
    caplog.set_level(logging.WARNING)
    for workers in (0, 2):  # counted in the main process whatever worker read the sample
        caplog.clear()
        metrics, info = evaluate_retrieval(
            ToyCLIP(),
            to_tensor,
            ToyTokenizer(),
            tmp_path / "shards",
            batch_size=4,
            progress=False,
            return_info=True,
            workers=workers,
        )
        assert info["num_images"] == 6 and info["skipped"] == EXPECTED, info
        messages = [r.getMessage() for r in caplog.records]
        shards = tmp_path / "shards"
        assert (
            f"skipping sample '000000090' in {shards / 'val-000.tar'}: empty caption (.txt holds no caption)"
            in messages
        ), messages
        assert any(
            m.startswith(
                f"skipping sample '000000091' in {shards / 'val-001.tar'}: undecodable caption (.txt is not UTF-8"
            )
            for m in messages
        ), messages
        assert any(
            m.startswith(f"skipping shard {shards / 'val-002.tar'}: shard ended early (after 0 samples")
            for m in messages
        ), messages
        assert not any("undecodable image" in m for m in messages)  # the old mislabel of a non-UTF-8 caption
    # the six good samples score as they do alone
    (tmp_path / "good").mkdir()
    for name in ("val-000.tar", "val-001.tar"):
        data = (tmp_path / "shards" / name).read_bytes()
        (tmp_path / "good" / name).write_bytes(data)
    alone = evaluate_retrieval(
        ToyCLIP(), to_tensor, ToyTokenizer(), tmp_path / "good", batch_size=4, progress=False, strict=False
    )
    assert alone == metrics


def test_skipped_retrieval_with_strict_names_the_sample(tmp_path):
    from clip_dcl.eval.retrieval import evaluate_retrieval

    _bad_retrieval_shards(tmp_path / "shards")
    with pytest.raises(es.SampleSkipped, match=r"sample '000000090' in .*val-000.tar: empty caption .*--strict"):
        evaluate_retrieval(ToyCLIP(), to_tensor, ToyTokenizer(), tmp_path / "shards", progress=False, strict=True)


def test_skipped_cli_writes_the_counts_and_strict_exits_nonzero(tmp_path, capsys):
    from clip_dcl.eval.cli import main

    _bad_retrieval_shards(tmp_path / "shards")
    out = tmp_path / "r.json"
    common = [
        "retrieval",
        "--model",
        "clip-dcl-tiny",
        "--data",
        str(tmp_path / "shards"),
        "--no-progress",
        "--device",
        "cpu",
        "--batch-size",
        "4",
    ]
    assert main([*common, "--output", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["skipped"] == EXPECTED and doc["data"]["num_images"] == 6
    assert "skipped" not in doc["data"]
    assert main([*common, "--strict", "--output", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err
    assert "sample '000000090'" in err and "empty caption" in err
    assert not (tmp_path / "s.json").exists()


def test_skipped_counts_are_empty_for_clean_data(tmp_path):
    from clip_dcl.eval.cli import main

    rgbs = [(200, 10, 10), (10, 200, 10)]
    (tmp_path / "s").mkdir()
    write_shard(tmp_path / "s" / "0.tar", [(f"{i:09d}", c, f"rgb {c}", None) for i, c in enumerate(rgbs)])
    assert (
        main(
            [
                "retrieval",
                "--model",
                "clip-dcl-tiny",
                "--data",
                str(tmp_path / "s"),
                "--no-progress",
                "--device",
                "cpu",
                "--output",
                str(tmp_path / "r.json"),
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "r.json").read_text())["skipped"] == {}


def test_skipped_causes_of_each_kind_of_bad_sample(tmp_path):
    """No caption, no image, json that does not parse, an image that does not decode, a shard cut short."""
    shard = tmp_path / "a.tar"
    write_shard(shard, [("000000001", (9, 9, 9), "fine", None)])
    _add_files(shard, [("000000002.png", png_bytes((1, 1, 1)))])  # no caption (its json has none)
    _add_files(shard, [("000000003.txt", b"a caption, no image")])
    _add_files(
        shard, [("000000004.png", png_bytes((1, 1, 1))), ("000000004.json", b"{not json"), ("000000004.txt", b"x")]
    )
    _add_files(shard, [("000000005.png", b"\x89PNG\r\n\x1a\n cut"), ("000000005.txt", b"x")])
    write_shard(tmp_path / "b.tar", [(f"{i:09d}", (i, i, i), "y", None) for i in range(10, 14)])
    data = (tmp_path / "b.tar").read_bytes()
    (tmp_path / "b.tar").write_bytes(data[: len(data) // 2])  # cut inside a member
    ds = es.retrieval_wds([str(shard), str(tmp_path / "b.tar")], to_tensor, markers=True)
    items = list(ds)
    skips = [i for i in items if isinstance(i, es.Skip)]
    kept = [i[2] for i in items if not isinstance(i, es.Skip)]
    assert [(s.key, s.cause) for s in skips] == [
        ("000000002", "no caption"),
        ("000000003", "no image"),
        ("000000004", "undecodable caption"),
        ("000000005", "undecodable image"),
        (None, "shard ended early"),
    ]
    assert kept[0] == "000000001" and all(k.startswith("0000000") for k in kept[1:])
    assert "cut short" in skips[-1].detail or "after" in skips[-1].detail
    counter = es.SkipCounter()
    for s in skips:
        counter.record(s)
    assert counter.as_dict() == {
        "no caption": 1,
        "no image": 1,
        "undecodable caption": 1,
        "undecodable image": 1,
        "shard ended early": 1,
    }
    assert counter.summary() == (
        "5 skipped (no caption 1, undecodable caption 1, no image 1, undecodable image 1, shard ended early 1)"
    )  # in the order of SKIP_CAUSES
    # read directly (no markers), the skips are logged and left out; strict raises at the first
    assert [i[2] for i in es.retrieval_wds([str(shard)], to_tensor)] == ["000000001"]
    with pytest.raises(es.SampleSkipped, match="'000000002' .*no caption"):
        list(es.retrieval_wds([str(shard)], to_tensor, strict=True))


def _classification_shards(root, n=12, bad=True):
    """CLIP_benchmark's classification layout: red / green / blue patches, plus bad samples."""
    names = ["red", "green", "blue"]
    (root / "test").mkdir(parents=True)
    (root / "classnames.txt").write_text("\n".join(names) + "\n")
    (root / "zeroshot_classification_templates.txt").write_text("a {c} thing\n")
    colours = [(250, 5, 5), (5, 250, 5), (5, 5, 250)]
    with tarfile.open(root / "test" / "0.tar", "w") as tf:
        members = []
        for i in range(n):
            members += [(f"s{i:04d}.png", png_bytes(colours[i % 3])), (f"s{i:04d}.cls", str(i % 3).encode())]
        if bad:
            members += [("s9000.png", png_bytes((1, 1, 1)))]  # no label
            members += [("s9001.png", b"not an image"), ("s9001.cls", b"1")]
            members += [("s9002.png", png_bytes((1, 1, 1))), ("s9002.cls", b"\xff\xfe")]
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    (root / "test" / "nshards.txt").write_text("1\n")
    return names


def test_skipped_zeroshot_samples_are_counted_and_strict_raises(tmp_path):
    from clip_dcl.eval.zeroshot import evaluate_zeroshot

    _classification_shards(tmp_path / "bad")
    _classification_shards(tmp_path / "good", bad=False)
    model, tok = ToyCLIP(), ToyTokenizer()
    m, info = evaluate_zeroshot(model, to_tensor, tok, tmp_path / "bad", progress=False, return_info=True, batch_size=4)
    assert info["skipped"] == {"undecodable image": 1, "no label": 1, "undecodable label": 1}
    assert info["num_images"] == 12
    good = evaluate_zeroshot(model, to_tensor, tok, tmp_path / "good", progress=False, batch_size=4)
    assert m == pytest.approx(good, nan_ok=True)  # top-5 is NaN with 3 classes
    with pytest.raises(es.SampleSkipped, match=r"sample 's9000' in .*0.tar: no label"):
        evaluate_zeroshot(model, to_tensor, tok, tmp_path / "bad", progress=False, strict=True)
    # an ImageFolder tree: an image file that does not decode
    for c, rgb in (("red", (250, 5, 5)), ("blue", (5, 5, 250))):
        (tmp_path / "tree" / c).mkdir(parents=True)
        for i in range(2):
            (tmp_path / "tree" / c / f"{i}.png").write_bytes(png_bytes(rgb))
    (tmp_path / "tree" / "blue" / "9.png").write_bytes(b"garbage")
    (tmp_path / "tree" / "classnames.txt").write_text("blue\nred\n")  # sorted folder order
    m, info = evaluate_zeroshot(
        model, to_tensor, tok, tmp_path / "tree", progress=False, return_info=True, templates=["a {c} thing"]
    )
    assert info["skipped"] == {"undecodable image": 1} and info["num_images"] == 4 and m["top1"] == 1.0
    with pytest.raises(es.SampleSkipped, match=r"9.png.*undecodable image"):
        evaluate_zeroshot(
            model, to_tensor, tok, tmp_path / "tree", progress=False, strict=True, templates=["a {c} thing"]
        )


def test_skipped_fewshot_images_are_left_out_and_counted(tmp_path):
    from clip_dcl.eval.fewshot import run_fewshot

    names = ["red", "green", "blue"]
    folder = write_iris(tmp_path / "colours", names, colour_split(names, 4), colour_split(names, 2))
    test_index = (folder / "test.txt").read_text().splitlines()
    bad_ref = test_index[0].rsplit(" ", 1)[0]
    bad_path = folder / bad_ref
    assert "@" not in bad_ref and bad_path.is_file(), bad_ref
    bad_path.write_bytes(b"not a png")
    model, tok = ToyCLIP(), ToyTokenizer()
    report = run_fewshot(
        model, to_tensor, tok, tmp_path, datasets=["colours"], shots=2, seeds=[0], grid="reduced", progress=False
    )
    assert report.skipped == {"undecodable image": 1}
    assert report.datasets["colours"]["skipped"] == {"undecodable image": 1}
    assert report.to_dict()["skipped"] == {"undecodable image": 1}
    with pytest.raises(es.SampleSkipped, match="undecodable image"):
        run_fewshot(
            model,
            to_tensor,
            tok,
            tmp_path,
            datasets=["colours"],
            shots=2,
            seeds=[0],
            grid="reduced",
            progress=False,
            strict=True,
        )
