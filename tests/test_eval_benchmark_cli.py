"""``clip-dcl eval benchmark``: CLIP_benchmark's ``eval`` command line, flags, defaults, grid and
result files; our result files read by CLIP_benchmark's ``build`` and by pandas; our exported
checkpoints in CLIP_benchmark's own ``eval``.

The CLIP_benchmark-gated tests run where ``clip_benchmark`` is importable (it is not a dependency).
"""

from __future__ import annotations

import argparse
import json
import sys

import pytest
import torch
from test_eval_benchmark_layout import _classification_set, _numpy2_safe_accuracy, _retrieval_set

from clip_dcl.eval import benchmark as bm
from clip_dcl.eval.cli import build_parser, main


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A random clip-dcl-tiny trainer checkpoint and its export, a retrieval and a zero-shot set in
    CLIP_benchmark's webdataset layout, published as wds_<name> folders."""
    import open_clip

    from clip_dcl.checkpoint import export
    from clip_dcl.models import register_builtin_configs

    root = tmp_path_factory.mktemp("bench")
    register_builtin_configs()
    torch.manual_seed(0)
    model = open_clip.create_model("clip-dcl-tiny")
    ckpt = root / "ckpt.pt"
    torch.save({"state_dict": model.state_dict(), "clip_dcl": {"model": "clip-dcl-tiny"}}, ckpt)
    _retrieval_set(root / "data" / "wds_toy_captions", n=12, captions=3)
    _classification_set(root / "data" / "wds_toy_colours")
    exported = export(ckpt, root / "exported")
    return {"root": root, "ckpt": ckpt, "exported": exported, "data": root / "data"}


def _ours(data, task, name):
    """Our numbers from the Python functions, straight."""
    from clip_dcl.checkpoint import load_checkpoint
    from clip_dcl.eval.retrieval import evaluate_retrieval
    from clip_dcl.eval.zeroshot import evaluate_zeroshot

    model, preprocess, tok = load_checkpoint(data["ckpt"])
    fn = evaluate_retrieval if task == "zeroshot_retrieval" else evaluate_zeroshot
    kw = {"ks": (1, 5, 10)} if task == "zeroshot_retrieval" else {}
    return fn(model, preprocess, tok, data["data"] / f"wds_{name}", progress=False, **kw)


# ----------------------------------------------------------------------------------------------
# Flags
# ----------------------------------------------------------------------------------------------
def test_defaults_are_clip_benchmarks_and_no_flag_is_taken_as_a_prefix(capsys):
    args = build_parser().parse_args(["benchmark", "--dataset", "wds/x"])
    assert (args.recall_k, args.batch_size, args.num_workers, args.amp) == ([5], 64, 4, True)
    assert (args.bench_task, args.split, args.language, args.seed) == ("auto", "test", ["en"], 0)
    assert args.output == "{dataset}_{pretrained}_{model}_{language}_{task}.json"
    assert (args.model, args.pretrained, args.verbose) == (["ViT-B-32-quickgelu"], ["laion400m_e32"], True)
    parsed = build_parser().parse_args(
        [
            "benchmark",
            "--dataset",
            "wds/x",
            "--no_amp",
            "--quiet",
            "--test_split",
            "val",
            "--model",
            "a",
            "b",
            "--pretrained",
            "p",
            "q",
        ]
    )
    assert parsed.amp is False and parsed.verbose is False and parsed.split == "val"
    assert bm.expand_models(parsed.model, parsed.pretrained) == [("a", "p"), ("a", "q"), ("b", "p"), ("b", "q")]
    # abbreviations are refused on every parser, naming the flag they begin
    for argv, flag in (
        (["retrieval", "--data", "x", "--dataset", "y"], "--dataset-name"),
        (["benchmark", "--dataset", "wds/x", "--recall", "1"], "--recall_k"),
        (["zeroshot", "--data", "x", "--templ", "t"], "--templates"),
    ):
        with pytest.raises(SystemExit):
            build_parser().parse_args(argv)
        err = capsys.readouterr().err
        assert f"{argv[-2]} is not a flag; the closest: " in err and flag in err


@pytest.mark.parametrize(
    "flag,why",
    [
        ("--distributed", "ranks of a launcher"),
        ("--wds_cache_dir", "streamed from a hub"),
        ("--fewshot_epochs", "linear_probe"),
        ("--annotation_file", "webdataset layout"),
    ],
)
def test_flags_with_no_meaning_here_are_refused_by_name(flag, why, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["benchmark", "--dataset", "wds/x", flag, "5"][: 4 if flag == "--distributed" else 5])
    err = capsys.readouterr().err
    assert f"{flag} is not supported by `clip-dcl eval benchmark`" in err and why in err


def test_bad_values_are_named(data, tmp_path, capsys):
    base = [
        "benchmark",
        "--dataset",
        "wds/toy_captions",
        "--dataset_root",
        str(data["data"] / "wds_{dataset}"),
        "--model",
        "clip-dcl-tiny",
        "--pretrained",
        str(data["ckpt"]),
        "--quiet",
        "--num_workers",
        "0",
    ]
    cases = [
        (
            ["--dataset_root", "https://huggingface.co/datasets/clip-benchmark/wds_{dataset_cleaned}/tree/main"],
            "'https://huggingface.co/datasets/clip-benchmark/wds_toy_captions/tree/main' is a remote location",
        ),
        (["--task", "captioning"], "--task captioning: captioning needs a generative (CoCa) model"),
        (["--task", "linear_probe", "--fewshot_k", "-1"], "--fewshot_k -1: give K >= 1 images per class"),
        (["--recall_k", "0"], "--recall_k values must be >= 1, got [0]"),
        (["--output", str(tmp_path / "{nope}.json")], "unknown or malformed field ('nope')"),
        (["--dataset", "cifar10"], "data set 'cifar10': CLIP_benchmark builds it with its own downloader"),
        (["--split", "val"], "is not in CLIP_benchmark's webdataset layout (no val/nshards.txt); found dataset_type"),
        (["--pretrained_model", "openai"], "--pretrained_model 'openai' is a collection of hub weights"),
    ]
    for extra, message in cases:
        assert main(base + extra) == 2, extra
        assert message in capsys.readouterr().err, extra
    assert not list(tmp_path.iterdir())


# ----------------------------------------------------------------------------------------------
# The runs and their files
# ----------------------------------------------------------------------------------------------
def test_retrieval_command_writes_clip_benchmarks_file(data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            [
                "benchmark",
                "--dataset",
                "wds/toy_captions",
                "--dataset_root",
                str(data["data"] / "wds_{dataset}"),
                "--task",
                "zeroshot_retrieval",
                "--model",
                "clip-dcl-tiny",
                "--pretrained",
                str(data["ckpt"]),
                "--recall_k",
                "1",
                "5",
                "10",
                "--batch_size",
                "32",
                "--num_workers",
                "0",
                "--no_amp",
                "--output",
                "{dataset}_{pretrained}_{model}_{language}_{task}.json",
            ]
        )
        == 0
    )
    written = [p.name for p in tmp_path.iterdir()]
    assert written == ["toy_captions_ckpt.pt_clip-dcl-tiny_en_zeroshot_retrieval.json"]
    doc = json.loads((tmp_path / written[0]).read_text())
    assert list(doc) == ["dataset", "model", "pretrained", "task", "metrics", "language", "precision"]
    assert (doc["dataset"], doc["model"], doc["pretrained"], doc["task"], doc["language"], doc["precision"]) == (
        "wds/toy_captions",
        "clip-dcl-tiny",
        str(data["ckpt"]),
        "zeroshot_retrieval",
        "en",
        "fp32",
    )
    ours = _ours(data, "zeroshot_retrieval", "toy_captions")
    assert list(doc["metrics"].items()) == [
        (f"{d}_retrieval_recall@{k}", ours[f"{d}_retrieval_recall@{k}"]) for k in (1, 5, 10) for d in ("image", "text")
    ]  # CLIP_benchmark's order


def test_classification_grid_skip_existing_dumps_and_custom_templates(data, tmp_path, capsys):
    out = str(tmp_path / "r" / "{dataset}_{pretrained}_{model}_{language}_{task}.json")
    common = [
        "benchmark",
        "--dataset",
        "wds/toy_colours",
        "wds/toy_captions",
        "--dataset_root",
        str(data["data"] / "wds_{dataset_cleaned}"),
        "--model",
        "clip-dcl-tiny",
        "--num_workers",
        "0",
        "--no_amp",
        "--output",
        out,
        "--quiet",
    ]
    assert main(common + ["--pretrained", str(data["ckpt"]), "none", "--dump_classnames", "--dump_templates"]) == 0
    names = sorted(p.name for p in (tmp_path / "r").iterdir())
    assert names == [
        "toy_captions_ckpt.pt_clip-dcl-tiny_en_zeroshot_retrieval.json",
        "toy_captions_none_clip-dcl-tiny_en_zeroshot_retrieval.json",
        "toy_colours_ckpt.pt_clip-dcl-tiny_en_zeroshot_classification.json",
        "toy_colours_none_clip-dcl-tiny_en_zeroshot_classification.json",
    ]  # --task auto per set
    cls = json.loads((tmp_path / "r" / names[2]).read_text())
    ours = _ours(data, "zeroshot_classification", "toy_colours")
    assert cls["metrics"] == {k: ours[k] for k in ("acc1", "acc5", "mean_per_class_recall")}
    assert cls["classnames"][:2] == ["red", "green"] and cls["templates"] == ["a photo of a {c}.", "a {c} thing"]
    assert json.loads((tmp_path / "r" / names[3]).read_text())["pretrained"] == "none"
    assert "classnames" not in json.loads((tmp_path / "r" / names[0]).read_text())  # retrieval has none

    # --skip_existing: nothing is loaded or rewritten; a missing file is run again
    (tmp_path / "r" / names[3]).unlink()
    before = {n: (tmp_path / "r" / n).stat().st_mtime_ns for n in names[:3]}
    runs = bm.run_benchmark(
        ["wds/toy_colours", "wds/toy_captions"],
        str(data["data"] / "wds_{dataset_cleaned}"),
        model=["clip-dcl-tiny"],
        pretrained=[str(data["ckpt"]), "none"],
        num_workers=0,
        amp=False,
        output=out,
        skip_existing=True,
        verbose=False,
    )
    assert [r.skipped for r in runs] == [True, True, False, True]
    assert {n: (tmp_path / "r" / n).stat().st_mtime_ns for n in names[:3]} == before
    assert (tmp_path / "r" / names[3]).is_file()

    # CLIP_benchmark's custom template file, keyed by the name without wds/
    custom = tmp_path / "templates.json"
    custom.write_text(json.dumps({"toy_colours": ["{c}"], "imagenet1k": ["never used"]}))
    runs = bm.run_benchmark(
        ["wds/toy_colours"],
        str(data["data"] / "wds_{dataset_cleaned}"),
        model=["clip-dcl-tiny"],
        pretrained=[str(data["ckpt"])],
        num_workers=0,
        amp=False,
        output=str(tmp_path / "c.json"),
        custom_template_file=str(custom),
        dump_templates=True,
        verbose=False,
    )
    assert runs[0].document["templates"] == ["{c}"]
    assert runs[0].document["metrics"] != cls["metrics"]  # other prompts, other numbers


def test_every_parser_refuses_abbreviations():
    from clip_dcl.checkpoint import export_main
    from clip_dcl.data.cli import build_parser as data_parser

    eval_parser = build_parser()
    subs = next(a for a in eval_parser._actions if isinstance(a, argparse._SubParsersAction))
    parsers = [eval_parser, data_parser(), *subs.choices.values()]
    data_subs = next(a for a in parsers[1]._actions if isinstance(a, argparse._SubParsersAction))
    parsers += list(data_subs.choices.values())
    # eval, data; 4 eval subcommands; synth, fashion-mnist, fashion-scenes, benchmark, shards, pack
    assert len(parsers) == 12 and not any(p.allow_abbrev for p in parsers)
    with pytest.raises(SystemExit):
        export_main(["a.pt", "out", "--mod", "x"])  # --model's prefix


def test_amp_is_on_by_default_as_in_clip_benchmark():
    assert bm.benchmark_precision(True, "cpu") == "amp_bf16" and bm.benchmark_precision(True, "cuda:0") == "amp_fp16"
    assert bm.benchmark_precision(False, "cuda") == "fp32"


def test_file_names_follow_clip_benchmarks_rules(tmp_path):
    ckpt = tmp_path / "runs" / "epoch_3.pt"
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"")
    p = bm.output_path(bm.DEFAULT_OUTPUT, "wds/vtab/cifar10", "ViT-B-32", str(ckpt), "en", "zeroshot_classification")
    assert str(p) == "vtab_cifar10_epoch_3.pt_ViT-B-32_en_zeroshot_classification.json"
    full = bm.output_path("{pretrained_full_path}.json", "x", "m", str(ckpt), "en", "t")
    assert str(full) == str(ckpt).replace("/", "_") + ".json"
    # a tag stays as is; a '/' in a model name does not become folders
    assert (
        str(bm.output_path("{model}_{pretrained}.json", "x", "local-dir:/a/b", "laion2b", "en", "t"))
        == "local-dir_a_b_laion2b.json"
    )


def test_format_clip_benchmark_names_wds_folders_and_never_writes_null(data, tmp_path):
    out = tmp_path / "ours.json"
    assert (
        main(
            [
                "retrieval",
                "--model",
                "clip-dcl-tiny",
                "--data",
                str(data["data"] / "wds_toy_captions"),
                "--no-progress",
                "--format",
                "clip_benchmark",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    doc = json.loads((tmp_path / "toy_captions_none_clip-dcl-tiny_en_zeroshot_retrieval.json").read_text())
    assert doc["dataset"] == "wds/toy_captions" and doc["pretrained"] == "none"
    assert (
        main(
            [
                "zeroshot",
                "--checkpoint",
                str(data["exported"]),
                "--data",
                str(data["data"] / "wds_toy_colours"),
                "--no-progress",
                "--format",
                "clip_benchmark",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    model = f"local-dir:{data['exported']}"
    name = f"toy_colours_exported_{model.replace(':/', '_').replace('/', '_')}_en_zeroshot_classification.json"
    files = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("toy_colours_"))
    assert files == [name]  # the folder's name for {pretrained}; '/' and ':' in the model made one '_'
    doc = json.loads((tmp_path / files[0]).read_text())
    assert doc["pretrained"] == str(data["exported"]) and doc["model"] == model


# ----------------------------------------------------------------------------------------------
# CLIP_benchmark's tools on our files, our checkpoints in CLIP_benchmark
# ----------------------------------------------------------------------------------------------
def _clip_benchmark_eval(argv, monkeypatch):
    """CLIP_benchmark's own ``clip_benchmark eval`` in this process (its zero-shot accuracy made
    NumPy 2 safe; nothing else changed)."""
    from clip_benchmark import cli
    from clip_benchmark.metrics import zeroshot_classification

    monkeypatch.setattr(zeroshot_classification, "accuracy", _numpy2_safe_accuracy)
    monkeypatch.setattr(sys, "argv", ["clip_benchmark", "eval"] + argv)
    cli.main()


def test_clip_benchmark_eval_loads_our_export_as_local_dir_and_gives_our_numbers(data, tmp_path, monkeypatch):
    pytest.importorskip("clip_benchmark")
    monkeypatch.chdir(data["root"])  # a relative local-dir: path keeps CLIP_benchmark's default file name a file
    for name, task in (("toy_colours", "zeroshot_classification"), ("toy_captions", "zeroshot_retrieval")):
        _clip_benchmark_eval(
            [
                "--dataset",
                f"wds/{name}",
                "--dataset_root",
                "data/wds_{dataset}",
                "--task",
                task,
                "--model",
                "local-dir:exported",
                "--pretrained",
                "ckpt.pt",
                "--recall_k",
                "1",
                "5",
                "10",
                "--num_workers",
                "0",
                "--no_amp",
                "--quiet",
                "--output",
                str(tmp_path / "{dataset}_{pretrained}_{model}_{language}_{task}.json"),
            ],
            monkeypatch,
        )
        theirs = json.loads((tmp_path / f"{name}_ckpt.pt_local-dir:exported_en_{task}.json").read_text())
        ours = _ours(data, task, name)
        assert theirs["metrics"] and all(ours[k] == pytest.approx(v, abs=1e-7) for k, v in theirs["metrics"].items())


def _our_results(data, folder):
    """Our result files of both tasks, one with pretrained none."""
    out = str(folder / "{dataset}_{pretrained}_{model}_{language}_{task}.json")
    bm.run_benchmark(
        ["wds/toy_colours", "wds/toy_captions"],
        str(data["data"] / "wds_{dataset_cleaned}"),
        model=["clip-dcl-tiny"],
        pretrained=[str(data["ckpt"]), "none"],
        recall_k=[1, 5],
        num_workers=0,
        amp=False,
        output=out,
        verbose=False,
    )


def test_our_result_files_read_with_pandas_json_normalize(data, tmp_path):
    pd = pytest.importorskip("pandas")
    _our_results(data, tmp_path)
    # beside one as CLIP_benchmark's run() dumps it
    (tmp_path / "cifar10_laion400m_e32_ViT-B-32_en_zeroshot_classification.json").write_text(
        json.dumps(
            {
                "dataset": "cifar10",
                "model": "ViT-B-32",
                "pretrained": "laion400m_e32",
                "task": "zeroshot_classification",
                "metrics": {"acc1": 0.9, "acc5": 0.99, "mean_per_class_recall": 0.9},
                "language": "en",
            }
        )
    )
    docs = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*.json"))]
    table = pd.json_normalize(docs)
    assert len(table) == 5 and table["pretrained"].notna().all()
    assert (table["model"] + " " + table["pretrained"]).str.len().gt(1).all()  # CLIP_benchmark's build line
    assert {"metrics.acc1", "metrics.image_retrieval_recall@5", "metrics.text_retrieval_recall@1"} <= set(table)
    assert sorted(table["dataset"].unique()) == ["cifar10", "wds/toy_captions", "wds/toy_colours"]


def test_clip_benchmark_build_reads_our_files_beside_its_own(data, tmp_path, monkeypatch):
    pytest.importorskip("clip_benchmark")
    import csv

    from clip_benchmark import cli

    results = tmp_path / "results"
    results.mkdir()
    _our_results(data, results)
    monkeypatch.chdir(data["root"])
    _clip_benchmark_eval(
        [
            "--dataset",
            "wds/toy_colours",
            "--dataset_root",
            "data/wds_{dataset}",
            "--model",
            "local-dir:exported",
            "--num_workers",
            "0",
            "--no_amp",
            "--quiet",
            "--output",
            str(results / "theirs_{dataset}_{task}.json"),
        ],
        monkeypatch,
    )
    monkeypatch.setattr(sys, "argv", ["clip_benchmark", "build", str(results), "--output", str(tmp_path / "b.csv")])
    cli.main()
    rows = list(csv.DictReader((tmp_path / "b.csv").open()))
    assert len(rows) == 5
    full = {r["model_fullname"] for r in rows}
    assert f"clip-dcl-tiny {data['ckpt']}" in full and "clip-dcl-tiny none" in full
    assert "local-dir:exported laion400m_e32" in full  # theirs, its default --pretrained
    ours = [r for r in rows if r["model"] == "clip-dcl-tiny" and r["task"] == "zeroshot_classification"]
    theirs = [r for r in rows if r["model"] == "local-dir:exported"]
    mine = [r for r in ours if r["pretrained"] == str(data["ckpt"])]
    assert float(mine[0]["acc1"]) == pytest.approx(float(theirs[0]["acc1"]), abs=1e-7)
