"""What a training command line gets on the machine it runs on (clip_dcl.train.precision).

On a CPU, OpenCLIP's default ``--precision amp`` is replaced by ``fp32`` with one line saying so, and
a named precision is kept; ``--report-to`` with a logger whose package is missing is refused before
any work, naming the extra. The last two train one tiny epoch with ``--report-to tensorboard`` and
``wandb`` (offline), where those packages are installed.
"""

from __future__ import annotations

import importlib.util
import io

import pytest
import torch
from conftest import train_in_process

from clip_dcl.train import precision
from clip_dcl.train.flags import FlagError, parse_train_args

BASE = [
    "--model",
    "clip-dcl-tiny",
    "--dataset-type",
    "synthetic",
    "--train-num-samples",
    "32",
    "--batch-size",
    "16",
    "--epochs",
    "1",
    "--workers",
    "0",
    "--report-to",
    "",
]


def settle(argv, cuda=False, monkeypatch=None):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    log = io.StringIO()
    return precision.settle_machine_flags(argv, log=log), log.getvalue()


def test_a_cpu_run_with_no_precision_gets_fp32_and_one_line_saying_so(monkeypatch):
    for device in (["--device", "cpu"], ["--device=cpu"], []):  # [] : OpenCLIP's cuda, no GPU visible
        argv, said = settle(BASE + device, cuda=False, monkeypatch=monkeypatch)
        assert argv == BASE + device + ["--precision", "fp32"]
        assert len(said.splitlines()) == 1 and "--precision fp32" in said and "amp" in said


@pytest.mark.parametrize(
    "named", [["--precision", "amp"], ["--precision=bf16"], ["--prec", "amp_bf16"], ["--precision", "fp32"]]
)
def test_a_named_precision_is_kept_on_the_cpu(monkeypatch, named):
    argv, said = settle(BASE + ["--device", "cpu"] + named, monkeypatch=monkeypatch)
    assert argv == BASE + ["--device", "cpu"] + named and said == ""


def test_a_gpu_run_keeps_openclips_default(monkeypatch):
    argv, said = settle(BASE, cuda=True, monkeypatch=monkeypatch)
    assert argv == BASE and said == ""
    argv, said = settle(BASE + ["--device", "cuda:1"], cuda=True, monkeypatch=monkeypatch)
    assert argv == BASE + ["--device", "cuda:1"] and said == ""


def test_only_the_first_rank_says_it(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    argv, said = settle(BASE + ["--device", "cpu"], monkeypatch=monkeypatch)
    assert argv[-2:] == ["--precision", "fp32"] and said == ""


def test_the_parsed_training_config_hands_fp32_to_openclip(monkeypatch, capsys):
    from open_clip_train.params import parse_args

    cfg = parse_train_args(BASE + ["--device", "cpu", "--loss", "decl"])
    assert parse_args(cfg.openclip_argv).precision == "fp32"
    assert "--precision fp32" in capsys.readouterr().err
    cfg = parse_train_args(BASE + ["--device", "cpu", "--precision", "amp", "--loss", "clip"])
    assert parse_args(cfg.openclip_argv).precision == "amp"


def test_a_missing_logger_is_refused_naming_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in ("tensorboard", "wandb") else real(name, *a)
    )
    with pytest.raises(FlagError, match=r"tensorboard package is not installed.*clip-dcl\[tensorboard\]"):
        precision.check_loggers("tensorboard")
    with pytest.raises(
        FlagError,
        match=r"tensorboard and wandb packages are not installed.*"
        r"clip-dcl\[tensorboard,wandb\]",
    ):
        precision.check_loggers("all")
    with pytest.raises(FlagError, match=r"wandb package.*clip-dcl\[wandb\]"):
        precision.check_loggers("wandb")
    precision.check_loggers("")  # no logger: nothing to check


def test_a_command_for_another_machine_is_checked_for_logger_names_only(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = [w for w in BASE if w not in ("--report-to", "")] + ["--report-to", "wandb", "--device", "cpu"]
    assert precision.settle_machine_flags(argv, this_machine=False) == argv  # no fp32 added, wandb not needed here
    cfg = parse_train_args(argv + ["--loss", "clip"], check_files=False)
    assert cfg.openclip_argv[-4:] == ["--report-to", "wandb", "--device", "cpu"]
    with pytest.raises(FlagError, match="wandbb is not one of"):
        precision.settle_machine_flags(argv[:-3] + ["wandbb"], this_machine=False)


def test_an_unknown_logger_is_refused_naming_it():
    with pytest.raises(FlagError, match=r"--report-to tensorbord: tensorbord is not one of tensorboard, wandb, all"):
        precision.check_loggers("tensorbord")


def test_a_refused_logger_exits_2_before_any_work(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    argv = [w for w in BASE if w not in ("--report-to", "")]
    res = train_in_process(
        argv + ["--device", "cpu", "--report-to", "wandb", "--logs", tmp_path, "--name", "x", "--loss", "clip"]
    )
    assert res.returncode == 2 and "clip-dcl[wandb]" in res.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None,
    reason="tensorboard is not installed (pip install 'clip-dcl[tensorboard]')",
)
def test_report_to_tensorboard_trains_and_writes_events(tmp_path):
    argv = [w for w in BASE if w not in ("--report-to", "")]
    res = train_in_process(
        argv + ["--device", "cpu", "--report-to", "tensorboard", "--logs", tmp_path, "--name", "tb", "--loss", "decl"]
    )
    assert res.returncode == 0, res.stderr[-3000:]
    events = list((tmp_path / "tb" / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("wandb") is None, reason="wandb is not installed (pip install 'clip-dcl[wandb]')"
)
def test_report_to_wandb_trains_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")  # no account, nothing sent: the run is written locally
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    argv = [w for w in BASE if w not in ("--report-to", "")]
    res = train_in_process(
        argv
        + ["--device", "cpu", "--report-to", "wandb", "--logs", tmp_path / "logs", "--name", "wb", "--loss", "clip"]
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert list((tmp_path / "wandb").glob("offline-run-*"))
