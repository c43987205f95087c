"""A misspelt flag of any clip-dcl command is refused with the closest flags, exit 2, before any work."""

from __future__ import annotations

import pytest

from clip_dcl.arguments import FlagParser, misspelt_flag
from clip_dcl.cli import main as cli_main


@pytest.mark.parametrize(
    "argv, closest",
    [
        (["train", "--batchsize", "64"], "--batch-size"),
        (["train", "--decl-gama", "0.9"], "--decl-gamma"),
        (["eval", "retrieval", "--batchsize", "4", "--data", "missing"], "--batch-size"),
        (["eval", "zeroshot", "--dat", "missing"], "--data"),
        (["eval", "benchmark", "--dataset_rot", "x"], "--dataset_root"),
        (["data", "synth", "OUT", "--num-clases", "3"], "--num-classes"),
        (["data", "shards", "SRC", "OUT", "--val-fractoin", "0.1"], "--val-fraction"),
        (["study", "run", "plan.toml", "--work", "w", "--paralel", "2"], "--parallel"),
        (["study", "score", "RUN", "--chekpoint", "x.pt"], "--checkpoint"),
        (["demo", "--quik"], "--quick"),
        (["export", "a.pt", "out", "--forse"], "--force"),
    ],
)
def test_a_misspelt_flag_names_the_closest(argv, closest, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    try:
        code = cli_main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "the closest: " in err and closest in err, err
    assert len(err.strip().splitlines()) == 1, err  # one line, no usage
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_the_launcher_names_torchrun_and_training_flags(capsys):
    from clip_dcl.train.torchrun import main

    assert main(["--nprocs_per_node", "1", "-m", "clip_dcl.train", "--", "--batch-size", "4"]) == 2
    assert "--nproc_per_node" in capsys.readouterr().err
    assert main(["--nproc_per_node", "1", "-m", "clip_dcl.train", "--", "--batchsize", "4"]) == 2
    assert "the closest: --batch-size" in capsys.readouterr().err


def test_flag_parser_reads_subcommands_and_leaves_the_rest_to_argparse(capsys):
    p = FlagParser(prog="x")
    sub = p.add_subparsers(dest="command")
    a = sub.add_parser("a")
    a.add_argument("name")
    a.add_argument("--batch-size", type=int)
    assert not a.allow_abbrev and isinstance(a, FlagParser)
    assert p.parse_args(["a", "--batch-size", "3", "a"]).batch_size == 3  # a value that names a subcommand
    with pytest.raises(SystemExit):
        p.parse_args(["a", "n", "--unrelated"])
    assert "unrecognized arguments: --unrelated" in capsys.readouterr().err
    assert misspelt_flag(["--", "--batchsize"], ["--batch-size"]) is None  # after --: positional
    assert misspelt_flag(["--batchsize=3"], ["--batch-size"]) == ("--batchsize", ["--batch-size"])


@pytest.mark.parametrize(
    "argv, bad, closest",
    [
        (["trian"], "trian", "train"),
        (["Eval"], "Eval", "eval"),
        (["data", "synt", "OUT"], "synt", "synth"),
        (["eval", "zeroshoot", "--data", "x"], "zeroshoot", "zeroshot"),
        (["study", "chek", "plan.toml"], "chek", "check"),
        (["eval", "retrieval", "--data", "x", "--precision", "fp23"], "fp23", "fp32"),
        (["eval", "zeroshot", "--data", "x", "--format", "clip-benchmark"], "clip-benchmark", "clip_benchmark"),
        (["eval", "benchmark", "--task", "linear_prob"], "linear_prob", "linear_probe"),
        (["data", "benchmark", "SRC", "OUT", "--kind", "Retrieval"], "Retrieval", "retrieval"),
        (["demo", "--losses", "clip", "DeCL"], "DeCL", "decl"),
    ],
)
def test_a_bad_command_or_choice_is_one_line_naming_the_closest(argv, bad, closest, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    try:
        code = cli_main(argv)
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    err = captured.err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and not captured.out, err  # no usage block
    assert f"'{bad}' is not a " in err and f"; the closest: {closest} (one of: " in err, err
    assert "usage:" not in err and list(tmp_path.iterdir()) == []


def test_help_keeps_the_usage_and_a_far_word_is_refused_with_the_choices(capsys):
    from clip_dcl.arguments import closest_word

    with pytest.raises(SystemExit) as e:
        cli_main(["eval", "retrieval", "--help"])
    assert e.value.code == 0 and "usage: clip-dcl eval retrieval" in capsys.readouterr().out
    assert cli_main(["xyzzy"]) == 2
    err = capsys.readouterr().err
    assert "'xyzzy' is not a command (one of: data, train" in err and "closest" not in err
    assert closest_word("DECL", ["clip", "dcl", "decl"]) == "decl"
    assert closest_word("zzz", ["clip", "dcl"]) is None
