"""CLIP_benchmark's path from one's own data: ``clip-dcl data benchmark`` writes synth's shards and
zero-shot tree in its webdataset layout, ``eval benchmark --task auto`` tells retrieval from
classification (synth's ``val/`` folder included), result names from relative paths carry no
``..``, ``:`` or ``__``, ``--task linear_probe`` runs the few-shot probe, class names are tied to
the folders (``data benchmark`` and ``eval benchmark``, checked before any model loads), and
``clip-dcl --help`` lists every eval subcommand."""

from __future__ import annotations

import json
import os

import pytest
import torch

from clip_dcl.cli import main as clip_dcl_main
from clip_dcl.eval.cli import build_parser
from clip_dcl.eval.cli import main as eval_main

MODEL = "clip-dcl-tiny"


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    """synth's quick data, a random clip-dcl-tiny checkpoint, and the val shards and zero-shot tree
    written in CLIP_benchmark's layout by the command."""
    import open_clip

    from clip_dcl.data.synth import generate

    root = tmp_path_factory.mktemp("path")
    generate(root / "syn", quick=True, train_samples=16, test_samples=0, verbose=False)
    torch.manual_seed(0)
    torch.save(
        {"state_dict": open_clip.create_model(MODEL).state_dict(), "clip_dcl": {"model": MODEL}}, root / "ckpt.pt"
    )
    assert (
        clip_dcl_main(["data", "benchmark", str(root / "syn" / "val"), str(root / "wds_synval"), "--shard-size", "40"])
        == 0
    )
    assert clip_dcl_main(["data", "benchmark", str(root / "syn" / "zeroshot"), str(root / "wds_synzs")]) == 0
    return root


def _flat(task, data, tmp_path, *extra):
    """``clip-dcl eval TASK`` on ``data``: its flat JSON."""
    out = tmp_path / f"{task}.json"
    assert eval_main([task, *extra, "--data", str(data), "--no-progress", "--output", str(out)]) == 0
    return json.loads(out.read_text())


def test_data_benchmark_writes_clip_benchmarks_layout(synth):
    from clip_dcl.data.evalsets import read_benchmark_shards

    val = read_benchmark_shards(synth / "wds_synval")
    assert val.dataset_type == "retrieval" and len(val.shards) == 2  # 64 samples, 40 a shard
    zs = read_benchmark_shards(synth / "wds_synzs")
    assert zs.dataset_type == "classification"
    assert zs.classnames == (synth / "syn" / "zeroshot" / "classnames.txt").read_text().split("\n")[:-1]
    assert "{c}" in (synth / "wds_synzs" / "zeroshot_classification_templates.txt").read_text()
    with pytest.raises(SystemExit):  # the split folder is there already: refused, naming it
        clip_dcl_main(["data", "benchmark", str(synth / "syn" / "val"), str(synth / "wds_synval")])


def test_auto_tells_retrieval_from_classification_with_our_numbers(synth, tmp_path, monkeypatch):
    ckpt = str(synth / "ckpt.pt")
    monkeypatch.chdir(tmp_path)
    assert (
        eval_main(
            [
                "benchmark",
                "--dataset",
                "wds/synval",
                "wds/synzs",
                "--dataset_root",
                str(synth / "wds_{dataset}"),
                "--model",
                MODEL,
                "--pretrained",
                ckpt,
                "--recall_k",
                "1",
                "5",
                "--num_workers",
                "0",
                "--no_amp",
                "--quiet",
            ]
        )
        == 0
    )
    retrieval = json.loads((tmp_path / f"synval_ckpt.pt_{MODEL}_en_zeroshot_retrieval.json").read_text())
    classification = json.loads((tmp_path / f"synzs_ckpt.pt_{MODEL}_en_zeroshot_classification.json").read_text())
    flat_r = _flat("retrieval", synth / "syn" / "val", tmp_path, "--checkpoint", ckpt)
    flat_z = _flat("zeroshot", synth / "syn" / "zeroshot", tmp_path, "--checkpoint", ckpt)
    # the converted sets give the source's numbers, bit for bit
    assert retrieval["metrics"] == {
        f"{d}_retrieval_recall@{k}": flat_r[f"{d}_retrieval_recall@{k}"] for k in (1, 5) for d in ("image", "text")
    }
    assert classification["metrics"] == {k: flat_z[k] for k in ("acc1", "acc5", "mean_per_class_recall")}


def test_auto_on_synths_val_folder_from_relative_paths_names_cleanly(synth, tmp_path, monkeypatch):
    from clip_dcl.checkpoint import export

    export(synth / "ckpt.pt", tmp_path / "exported")
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    rel_val = os.path.relpath(synth / "syn" / "val") + "/"
    assert rel_val.startswith("..")
    assert (
        eval_main(
            [
                "benchmark",
                "--dataset",
                rel_val,
                "--model",
                "local-dir:../exported",
                "--pretrained",
                "none",
                "--num_workers",
                "0",
                "--no_amp",
                "--quiet",
            ]
        )
        == 0
    )
    (name,) = [p.name for p in (tmp_path / "here").iterdir()]
    assert name.endswith("_none_local-dir_exported_en_zeroshot_retrieval.json")  # --task auto: retrieval
    assert ".." not in name and ":" not in name and "__" not in name and not name.startswith("_")
    doc = json.loads((tmp_path / "here" / name).read_text())
    assert doc["task"] == "zeroshot_retrieval" and doc["dataset"] == rel_val


def test_linear_probe_runs_the_few_shot_probe(synth, tmp_path):
    ckpt = str(synth / "ckpt.pt")
    out = str(tmp_path / "{dataset}_{task}.json")
    assert (
        eval_main(
            [
                "benchmark",
                "--task",
                "linear_probe",
                "--dataset",
                str(synth / "syn" / "fewshot" / "synth-colour"),
                "--model",
                MODEL,
                "--pretrained",
                ckpt,
                "--fewshot_k",
                "2",
                "--fewshot_grid",
                "reduced",
                "--num_workers",
                "0",
                "--no_amp",
                "--quiet",
                "--output",
                out,
            ]
        )
        == 0
    )
    (written,) = list(tmp_path.iterdir())
    assert written.name.endswith("fewshot_synth-colour_linear_probe.json")
    doc = json.loads(written.read_text())
    flat = _flat(
        "fewshot",
        synth / "syn" / "fewshot",
        tmp_path,
        "--checkpoint",
        ckpt,
        "--datasets",
        "synth-colour",
        "--shots",
        "2",
        "--seeds",
        "0",
        "--grid",
        "reduced",
    )
    assert doc["task"] == "linear_probe" and doc["metrics"]["fewshot_k"] == 2 and doc["metrics"]["seeds"] == [0]
    assert doc["metrics"]["lp_acc1"] == flat["synth-colour/linear_probe"]


def test_clip_dcl_help_lists_every_eval_subcommand(capsys):
    assert clip_dcl_main(["--help"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("eval "))
    subcommands = build_parser()._subparsers._group_actions[0].choices
    assert list(subcommands) == ["retrieval", "zeroshot", "fewshot", "benchmark"]
    assert line.split(": ", 1)[1].split(" | ") == list(subcommands)


def _two_class_tree(synth, tree):
    """``tree/blue`` and ``tree/red``, one of synth's zero-shot images in each."""
    image = next((synth / "syn" / "zeroshot").glob("*/*.jpg")).read_bytes()
    for folder in ("blue", "red"):
        (tree / folder).mkdir(parents=True)
        (tree / folder / "0.jpg").write_bytes(image)
    return tree


def test_data_benchmark_ties_class_names_to_the_folders(synth, tmp_path):
    from clip_dcl.data.evalsets import read_benchmark_shards

    tree = _two_class_tree(synth, tmp_path / "tree")
    (tree / "classnames.txt").write_text("red\nblue\n")  # the user's order, not the folders'
    with pytest.raises(SystemExit):
        clip_dcl_main(["data", "benchmark", str(tree), str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()  # refused before anything is written
    (tree / "classnames.txt").unlink()
    (tree / "classnames.json").write_text(json.dumps({"red": "a red thing", "blue": "a blue thing"}))
    assert clip_dcl_main(["data", "benchmark", str(tree), str(tmp_path / "out")]) == 0
    assert read_benchmark_shards(tmp_path / "out").classnames == ["a blue thing", "a red thing"]  # label order


def test_benchmark_reads_every_data_set_before_any_model_loads(synth, tmp_path, monkeypatch, capsys):
    from clip_dcl.eval import benchmark

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(benchmark, "load_benchmark_model", no_model)
    # linear_probe on a zero-shot tree, not a few-shot data set folder
    assert (
        eval_main(
            [
                "benchmark",
                "--task",
                "linear_probe",
                "--dataset",
                str(synth / "syn" / "zeroshot"),
                "--model",
                MODEL,
                "--pretrained",
                "none",
                "--quiet",
            ]
        )
        == 2
    )
    assert "is not a few-shot data set folder" in capsys.readouterr().err
    # zero-shot class names in another order than the folders, as the second data set of the grid
    tree = _two_class_tree(synth, tmp_path / "tree")
    (tree / "classnames.txt").write_text("red\nblue\n")
    assert (
        eval_main(
            [
                "benchmark",
                "--task",
                "zeroshot_classification",
                "--dataset",
                str(synth / "syn" / "zeroshot"),
                str(tree),
                "--model",
                MODEL,
                "--pretrained",
                "none",
                "--quiet",
            ]
        )
        == 2
    )
    assert "not in sorted folder order: line 1, 'red'" in capsys.readouterr().err
