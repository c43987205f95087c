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
