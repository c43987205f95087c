"""What ``clip-dcl train`` says about its own command before any work: ``--loss dcl`` at ``tau_plus`` 0
says in one line that it trains InfoNCE exactly, a flag of another loss is refused in words that fit
their number, and the usage names the command that was typed."""

from __future__ import annotations

import pytest
import torch

from clip_dcl.losses import create_loss
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
    "--device",
    "cpu",
    "--precision",
    "fp32",
]
INFONCE = "clip-dcl train: --loss dcl at --tau-plus 0 (its default) is InfoNCE exactly"


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--loss", "dcl"], True),
        (["--loss", "dcl", "--tau-plus", "0"], True),
        (["--loss", "dcl", "--dcl-temperature", "0.07"], True),
        (["--loss", "dcl", "--tau-plus", "0.05"], False),
        (["--loss", "dcl", "--tau-plus", "auto"], False),
        (["--loss", "dcl", "--hcl-beta", "1"], False),  # hard-negative weights: not InfoNCE
        (["--loss", "clip"], False),
        (["--loss", "decl", "--decl-rate", "batch"], False),
    ],
)
def test_dcl_at_tau_plus_0_says_in_one_line_that_it_is_infonce(capsys, flags, says):
    parse_train_args(BASE + flags)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "InfoNCE exactly" in ln]
    assert lines == ([lines[0]] if says else [])
    if says:
        assert lines[0].startswith(INFONCE) and "--tau-plus" in lines[0]
        assert ("0.07" in lines[0]) == ("--dcl-temperature" in flags)


def test_the_line_is_true_dcl_at_tau_plus_0_computes_clips_loss():
    from open_clip.loss import ClipLoss

    g = torch.Generator().manual_seed(0)
    f, t = (
        torch.nn.functional.normalize(torch.randn(12, 8, generator=g, dtype=torch.float64), dim=-1) for _ in range(2)
    )
    scale = torch.tensor(14.0, dtype=torch.float64)
    torch.testing.assert_close(create_loss("dcl")(f, t, scale), ClipLoss()(f, t, scale))


def test_the_line_is_not_said_for_another_machine(capsys):
    parse_train_args(BASE + ["--loss", "dcl"], check_files=False)  # a command checked for another machine
    assert "InfoNCE exactly" not in capsys.readouterr().err


def test_a_foreign_flag_is_refused_in_words_that_fit_their_number():
    with pytest.raises(FlagError, match=r"^--tau-plus only applies to --loss dcl, not --loss clip$"):
        parse_train_args(BASE + ["--loss", "clip", "--tau-plus", "0.1"])
    with pytest.raises(FlagError, match=r"^--tau-plus, --hcl-beta only apply to --loss dcl, not --loss clip$"):
        parse_train_args(BASE + ["--loss", "clip", "--tau-plus", "0.1", "--hcl-beta", "1"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "entry, prog", [("clip_dcl.cli", "clip-dcl train"), ("clip_dcl.train", "python -m clip_dcl.train")]
)
def test_the_usage_and_errors_name_the_command_that_was_typed(preloaded, entry, prog):
    import subprocess

    words = ["train"] if entry == "clip_dcl.cli" else []
    # `python -m` in a process of its own: the program name comes from how the interpreter was started
    helped = subprocess.run(
        [preloaded.python, "-m", entry, *words, "--help"], capture_output=True, text=True, timeout=300
    )
    usages = [ln for ln in helped.stdout.splitlines() if ln.startswith("usage:")]
    assert len(usages) == 2 and all(ln.startswith(f"usage: {prog} [") for ln in usages)  # ours, then OpenCLIP's
    refused = subprocess.run(
        [preloaded.python, "-m", entry, *words, "--no-such-flag"], capture_output=True, text=True, timeout=300
    )
    assert (
        refused.returncode == 2
        and refused.stderr.splitlines()[-1] == f"{prog}: error: unrecognized arguments: --no-such-flag"
    )
