"""Training faults that end in one line or are skipped and named: a CSV with an undecodable image and an empty
caption trains (exit 0, both skips named, no caption read as "nan"); a training of nothing is refused."""

from __future__ import annotations

import os

import pytest
from conftest import TINY, train_in_process
from PIL import Image


def csv_flags(csv) -> list:
    return ["--train-data", csv, "--csv-img-key", "filepath", "--csv-caption-key", "title"]


def _csv(tmp_path, rows):
    for i in range(6):
        Image.new("RGB", (8, 8), (40 * i, 10, 200 - 30 * i)).save(tmp_path / f"ok{i}.png")
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image at all")
    lines = ["filepath\ttitle"] + [f"{image}\t{caption}" for image, caption in rows]
    (tmp_path / "pairs.csv").write_text("\n".join(lines) + "\n")
    return tmp_path / "pairs.csv"


@pytest.mark.slow
def test_a_csv_with_an_undecodable_image_and_an_empty_caption_trains_and_names_both(tmp_path):
    rows = [(f"ok{i}.png", f"a picture number {i}") for i in range(6)] + [("bad.png", "a broken one"), ("ok0.png", "")]
    csv = _csv(tmp_path, rows)
    res = train_in_process(
        [
            *csv_flags(csv),
            "--batch-size",
            "2",
            *TINY,
            "--loss",
            "decl",
            "--logs",
            tmp_path / "logs",
            "--name",
            "r",
            "--warmup",
            "1",
        ]  # fmt: skip
    )
    log = (tmp_path / "logs" / "r" / "out.log").read_text()
    assert res.returncode == 0, res.stderr
    assert "1 row(s) left out: empty caption (first: row 8, " in log
    assert "undecodable image" in log and "bad.png" in log and "Traceback" not in res.stderr


def test_a_csv_whose_captions_are_all_empty_or_missing_is_refused_in_one_line(tmp_path):
    import torch

    from clip_dcl.train.csv_data import DecodedRows, leave_out_bad_rows

    class Rows:  # OpenCLIP's CsvDataset's two lists
        images = [str(tmp_path / "ok0.png"), str(tmp_path / "gone.png"), str(tmp_path / "ok1.png")]
        captions = ["one", "two", float("nan")]

    _csv(tmp_path, [])
    rows = Rows()
    assert leave_out_bad_rows(rows, "pairs.csv") == {"image not found": 1, "empty caption": 1}
    assert rows.images == [str(tmp_path / "ok0.png")] and rows.captions == ["one"]
    Rows.captions = [" ", float("nan"), ""]
    with pytest.raises(RuntimeError, match="no row has an image and a caption"):
        leave_out_bad_rows(Rows(), "pairs.csv")

    class Reads:
        images = ["bad.png", "ok.png"]

        def __len__(self):
            return 2

        def __getitem__(self, row):
            if row == 0:
                raise OSError("cannot identify image file")
            return torch.zeros(1), torch.zeros(1)

    assert int(DecodedRows(Reads(), "pairs.csv")[0][2]) == 1  # the next row, with its own id


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--train-num-samples", "0"], "--train-num-samples 0: must be an integer >= 1"),
        (["--train-num-samples", "16", "--epochs", "0"], "--epochs 0: the run would train nothing"),
    ],
)
def test_a_training_of_nothing_is_refused_before_any_work(tmp_path, capsys, flags, named):
    from clip_dcl.train import main

    assert main(["--dataset-type", "synthetic", *flags, "--logs", str(tmp_path), "--name", "x"]) == 2
    err = capsys.readouterr().err
    assert named in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def _evil(path):
    import torch

    class Evil:
        def __reduce__(self):
            return (print, ("code ran",))

    torch.save({"x": Evil()}, path)


@pytest.mark.parametrize("kind", ["random bytes", "needs globals"])
def test_a_corrupt_or_malicious_pretrained_ends_in_one_line(tmp_path, capsys, kind):
    from clip_dcl.train import main

    path = tmp_path / "weights.pt"
    if kind == "random bytes":
        path.write_bytes(bytes(range(256)) * 20)
    else:
        _evil(path)
    code = main(
        [
            "--dataset-type",
            "synthetic",
            "--train-num-samples",
            "16",
            "--batch-size",
            "8",
            "--model",
            "clip-dcl-tiny",
            "--device",
            "cpu",
            "--pretrained",
            str(path),
            "--logs",
            str(tmp_path / "logs"),
            "--name",
            "x",
        ]  # fmt: skip
    )
    out = capsys.readouterr()
    assert code == 1 and "Traceback" not in out.err and "code ran" not in out.out + out.err
    said = [line for line in out.err.splitlines() if "clip-dcl train: error:" in line]
    assert len(said) == 1 and f"--pretrained {path}" in said[0]
    if kind == "random bytes":
        assert "is not a checkpoint" in said[0] and "unsafe" not in said[0].lower()
    else:
        assert "asks for Python objects" in said[0]


def test_reading_random_bytes_says_not_a_checkpoint_and_a_pickle_of_objects_names_the_opt_in(tmp_path):
    from clip_dcl.train.saving import CheckpointUnreadable, UnsafeCheckpoint, read_checkpoint

    (tmp_path / "random.pt").write_bytes(bytes(range(256)) * 20)
    with pytest.raises(CheckpointUnreadable, match="is not a checkpoint") as err:
        read_checkpoint(tmp_path / "random.pt")
    assert "unsafe" not in str(err.value).lower()
    _evil(tmp_path / "evil.pt")
    with pytest.raises(UnsafeCheckpoint, match="--unsafe-pickle"):
        read_checkpoint(tmp_path / "evil.pt")


def test_a_run_folder_removed_mid_run_ends_in_one_line(tmp_path, capsys):
    import shutil

    from clip_dcl.losses import DeCLLoss
    from clip_dcl.train import main

    folder = tmp_path / "logs" / "x"
    calls = []
    forward = DeCLLoss.forward

    def removing(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            shutil.rmtree(folder)
        return forward(self, *args, **kwargs)

    DeCLLoss.forward = removing
    try:
        code = main(
            [
                "--loss",
                "decl",
                "--dataset-type",
                "synthetic",
                "--train-num-samples",
                "48",
                "--batch-size",
                "8",
                *TINY,
                "--log-every-n-steps",
                "1",
                "--logs",
                str(tmp_path / "logs"),
                "--name",
                "x",
            ]  # fmt: skip
        )
    finally:
        DeCLLoss.forward = forward
    err = capsys.readouterr().err
    assert len(calls) >= 2 and code == 1 and "Traceback" not in err
    said = [line for line in err.splitlines() if "clip-dcl train: error:" in line]
    assert len(said) == 1 and f"the run folder {folder} was removed while the run trained" in said[0]


@pytest.mark.parametrize(
    "words, closest",
    [
        (["--loss", "DeCL"], "the closest: decl"),
        (["--precision", "fp23"], "the closest: fp32"),
        (["--precision=amp_bf6"], "the closest: amp_bf16"),
    ],
)
def test_a_bad_choice_of_any_training_flag_is_one_line_naming_the_closest(capsys, words, closest):
    from clip_dcl.train import main

    assert main(["--dataset-type", "synthetic", *words]) == 2
    out = capsys.readouterr()
    assert closest in out.err and len(out.err.strip().splitlines()) == 1 and "usage:" not in out.err + out.out


@pytest.mark.parametrize("bad", ["undecodable image", "empty caption"])
def test_strict_refuses_the_first_sample_training_would_skip(tmp_path, bad):
    rows = [(f"ok{i}.png", f"a picture number {i}") for i in range(6)]
    rows.append(("bad.png", "a broken one") if bad == "undecodable image" else ("ok0.png", ""))
    csv = _csv(tmp_path, rows)
    res = train_in_process(
        [
            *csv_flags(csv),
            "--batch-size",
            "7",
            *TINY,
            "--strict",
            "--logs",
            tmp_path / "logs",
            "--name",
            "r",
        ]  # fmt: skip
    )
    assert res.returncode == 1 and "Traceback" not in res.stderr
    said = [line for line in res.stderr.splitlines() if "clip-dcl train: error:" in line]
    assert len(said) == 1 and "--strict" in said[0] and ("row 7" in said[0])


def test_training_shard_paths_keep_their_backslashes(tmp_path):
    """Issue: a backslash in a path was dropped (OpenCLIP's brace expansion reads it as an escape), so shards under
    ``back\\slash`` were looked for under ``backslash``: every reader of ``--train-data`` and ``--val-data`` keeps it,
    with one source or several and with --dataset-resampled's per-source factors."""
    import torch
    from test_train import _epoch_batches, _pipeline_args, write_shards

    from clip_dcl.train.flag_checks import check_data_paths
    from clip_dcl.train.ids import id_layout
    from clip_dcl.train.pipeline import get_wds_train_dataset

    one = write_shards(tmp_path / "back\\slash", [[0, 1, 2, 3], [4, 5, 6, 7]])
    two = write_shards(tmp_path / "other\\one", [[10, 11, 12, 13]])
    assert "back\\slash" in one and not (tmp_path / "backslash").exists()
    args = _pipeline_args(one, "--val-data", two, workers=0, batch_size=2)
    check_data_paths(args)  # no "does not exist"
    info = get_wds_train_dataset(args, lambda img: torch.zeros(1), tokenizer=lambda text: [torch.tensor(0)])
    assert sorted(int(i) for _, _, ids in _epoch_batches(info, 0) for i in ids) == list(range(8))
    sources, block = id_layout(f"{one}::{two}", 1000)
    assert block == 1000 and set(sources.values()) == {0, 1} and len(sources) == 3
    assert all("\\" in url and os.path.isfile(url) for url in sources)

    both = _pipeline_args(
        f"{one}::{two}", "--dataset-resampled", "--train-data-upsampling-factors", "1::3", "--train-num-samples", "8",
        workers=0, batch_size=2,
    )  # fmt: skip
    info = get_wds_train_dataset(both, lambda img: torch.zeros(1), tokenizer=lambda text: [torch.tensor(0)])
    assert len(_epoch_batches(info, 0)) == 4
