"""Errors that name their real cause and the flag to change, before the model is built where the inputs tell:
a batch that a data-loader worker's shards cannot fill, fewer shards than workers, a folder of shards given
as the training data, an unknown model name, ``--model`` against an exported folder of another model, and a
wrong retrieval ``--data``."""

from __future__ import annotations

import json

import pytest
import torch
from test_eval_zeroshot import _colour_tree
from test_train import dense_keys, write_shards

from clip_dcl.data.shards import folder_pattern
from clip_dcl.train import main

RUN = ["--model", "clip-dcl-tiny", "--epochs", "1", "--precision", "fp32", "--device", "cpu", "--report-to", ""]


@pytest.fixture
def no_model(monkeypatch):
    """Building a model fails the test: what is refused must be refused before."""
    import open_clip

    def built(*a, **k):
        raise AssertionError("the model was built")

    monkeypatch.setattr(open_clip, "create_model_and_transforms", built)


def _refused(capsys, argv, tmp_path) -> str:
    rc = main([*RUN, "--logs", str(tmp_path / "logs"), *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1, err
    assert not (tmp_path / "logs").exists()  # no run folder
    return err


# -- the batch against the samples each worker gets ----------------------------------------------------------
def test_a_batch_no_worker_can_fill_is_refused_naming_batch_size_and_workers(tmp_path, capsys, no_model):
    pattern = write_shards(tmp_path / "shards", dense_keys(num_shards=4, per_shard=16))
    err = _refused(capsys, ["--train-data", pattern, "--batch-size", "40", "--workers", "2"], tmp_path)
    assert err == (
        "clip-dcl train: error: --batch-size 40 is more than the 32 samples a data-loader worker may be "
        "given: the 4 training shard(s) (64 samples) are split over 2 worker(s) (--workers 2), and each "
        "fills whole batches from its own shards; give --batch-size 32 or less, or fewer --workers"
    )
    # more than all the data: fewer workers would not help, so only the batch is named
    err = _refused(capsys, ["--train-data", pattern, "--batch-size", "65", "--workers", "2"], tmp_path)
    assert err.endswith("; give --batch-size 32 or less")


def test_the_fewest_samples_a_worker_may_get_counts_the_smallest_shards(tmp_path, capsys, no_model):
    # shards of 2, 30 and 30 samples over 2 workers: in an epoch whose shuffle gives one worker the 2-sample
    # shard alone, that worker has 2 samples
    pattern = write_shards(tmp_path / "shards", [list(range(2)), list(range(2, 32)), list(range(32, 62))])
    err = _refused(capsys, ["--train-data", pattern, "--batch-size", "4", "--workers", "2"], tmp_path)
    assert "more than the 2 samples a data-loader worker may be given" in err
    from clip_dcl.train.flags import parse_train_args

    assert parse_train_args([*RUN, "--train-data", pattern, "--batch-size", "2", "--workers", "2"]) is not None
    assert parse_train_args([*RUN, "--train-data", pattern, "--batch-size", "60", "--workers", "0"]) is not None
    # resampled shards have no pass to end: nothing to refuse
    assert (
        parse_train_args(
            [
                *RUN,
                "--train-data",
                pattern,
                "--batch-size",
                "60",
                "--workers",
                "2",
                "--dataset-resampled",
                "--train-num-samples",
                "62",
            ]
        )
        is not None
    )


def test_fewer_shards_than_workers_is_refused_before_the_model(tmp_path, capsys, no_model):
    pattern = write_shards(tmp_path / "shards", dense_keys(num_shards=2, per_shard=16))
    err = _refused(capsys, ["--train-data", pattern, "--batch-size", "4", "--workers", "3"], tmp_path)
    assert err == (
        "clip-dcl train: error: --train-data has 2 shard(s) for --workers 3: each worker reads shards of "
        "its own, so 3 are needed; give --workers 2 or fewer, more shards, or --dataset-resampled"
    )


# -- a folder of shards -----------------------------------------------------------------------------------------
def test_a_folder_of_shards_is_read_as_the_pattern_of_its_tar_files(tmp_path, capsys):
    from clip_dcl.train.flags import parse_train_args

    write_shards(tmp_path / "shards", dense_keys(num_shards=3, per_shard=8))
    folder = str(tmp_path / "shards")
    cfg = parse_train_args(
        [*RUN, "--train-data", folder, "--batch-size", "4", "--workers", "1", "--loss", "decl", "--decl-rate", "index"]
    )
    pattern = f"{folder}/{{00000..00002}}.tar"
    assert cfg.openclip_argv[cfg.openclip_argv.index("--train-data") + 1] == pattern
    assert cfg.num_samples == 24  # the sizes.json beside the shards was read
    assert f"clip-dcl train: --train-data {folder} is a folder: reading its shards {pattern}" in capsys.readouterr().err
    cfg = parse_train_args([*RUN, f"--train-data={folder}", "--batch-size", "4", "--workers", "1"])
    assert f"--train-data={pattern}" in cfg.openclip_argv


def test_a_folder_with_no_shard_is_refused_with_the_pattern_to_give(tmp_path, capsys, no_model):
    (tmp_path / "empty").mkdir()
    err = _refused(capsys, ["--train-data", str(tmp_path / "empty"), "--batch-size", "4"], tmp_path)
    assert err == (
        f"clip-dcl train: error: --train-data: {str(tmp_path / 'empty')!r} is a folder with no .tar shard "
        f"in it: give the shards' pattern, e.g. {str(tmp_path / 'empty' / '{00000..00009}.tar')!r}"
    )


def test_folder_pattern_is_a_range_a_list_or_one_file(tmp_path):
    import braceexpand

    def folder(*names):
        d = tmp_path / f"f{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        for n in names:
            (d / n).write_bytes(b"")
        return d

    d = folder("00003.tar", "00004.tar", "00005.tar", "sizes.json")
    assert folder_pattern(d) == f"{d}/{{00003..00005}}.tar"
    d = folder("00000.tar", "00002.tar")  # a gap: listed
    assert folder_pattern(d) == f"{d}/{{00000,00002}}.tar"
    d = folder("b.tar", "a.tar", "notes.txt")
    assert sorted(braceexpand.braceexpand(folder_pattern(d))) == [f"{d}/a.tar", f"{d}/b.tar"]
    d = folder("only.tar")
    assert folder_pattern(d) == f"{d}/only.tar"
    d = folder("a,b.tar", "c.tar")
    with pytest.raises(ValueError, match="cannot be listed in a brace pattern: give the shards' pattern"):
        folder_pattern(d)


# -- model names ----------------------------------------------------------------------------------------------
def test_an_unknown_model_is_one_line_with_the_closest_names(tmp_path, capsys, no_model):
    err = _refused(
        capsys, ["--model", "clip-dcl-tinyy", "--dataset-type", "synthetic", "--train-num-samples", "8"], tmp_path
    )
    assert err.startswith(
        "clip-dcl train: error: --model 'clip-dcl-tinyy' is not a model OpenCLIP knows (the closest are clip-dcl-tiny"
    )
    from clip_dcl.eval.cli import main as eval_main

    data = write_shards(tmp_path / "val", dense_keys(num_shards=1, per_shard=4))
    assert eval_main(["retrieval", "--model", "clip-dcl-tinyy", "--data", data]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines()[-1].startswith(
        "clip-dcl eval retrieval: --model 'clip-dcl-tinyy' is not a model OpenCLIP knows (the closest are clip-dcl-tiny"
    )


def test_retrieval_with_a_wrong_data_path_says_so_before_the_model(tmp_path, capsys, no_model):
    from clip_dcl.eval.cli import main as eval_main

    missing = tmp_path / "no_such_shards"
    assert eval_main(["retrieval", "--model", "clip-dcl-tiny", "--data", str(missing)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"clip-dcl eval retrieval: --data {missing}: shard {str(missing)!r} does not exist"
    )
    assert eval_main(["retrieval", "--model", "clip-dcl-tiny", "--data", str(tmp_path / "val.csv")]) == 2
    assert capsys.readouterr().err.strip().startswith(f"clip-dcl eval retrieval: --data {tmp_path / 'val.csv'}: ")


@pytest.fixture
def exported_tiny(tmp_path):
    """An exported clip-dcl-tiny (random weights)."""
    import open_clip

    from clip_dcl.checkpoint import export

    model, _, _ = open_clip.create_model_and_transforms("clip-dcl-tiny")
    path = tmp_path / "epoch_1.pt"
    torch.save({"state_dict": model.state_dict(), "clip_dcl": {"model": "clip-dcl-tiny"}}, path)
    return export(path, tmp_path / "exported")


def test_model_against_an_exported_folder_of_another_model_is_refused(tmp_path, capsys, exported_tiny):
    from clip_dcl.eval.cli import main as eval_main

    root = _colour_tree(tmp_path / "zs", ["blue", "green", "red"], per_class=1)
    (root / "classnames.txt").write_text("blue\ngreen\nred\n")
    common = ["zeroshot", "--checkpoint", str(exported_tiny), "--data", str(root), "--no-progress"]
    assert eval_main([*common, "--model", "clip-dcl-micro"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"clip-dcl eval zeroshot: --model clip-dcl-micro: the exported folder {str(exported_tiny)!r} holds a "
        "clip-dcl-tiny (its open_clip_config.json), which is what it loads: drop --model or give --model clip-dcl-tiny"
    )
    for extra in ([], ["--model", "clip-dcl-tiny"]):
        out = tmp_path / "z.json"
        assert eval_main([*common, *extra, "--output", str(out)]) == 0
        model = json.loads(out.read_text())["model"]  # the model scored: never --model as given
        assert model["name"] == f"local-dir:{exported_tiny}" and model["exported_model"] == "clip-dcl-tiny"
