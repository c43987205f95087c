"""docs/training.md lists exactly the columns a training logs: each row of its table is trained for a few
steps and the columns of its last ``Train Epoch:`` line (after OpenCLIP's ``Logit Scale``) are compared
with the row's. DeCL's ``Loss`` is its InfoNCE term (``Loss`` compares with ``clip``'s), and its total keeps
its own column, ``Decl_loss``."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from conftest import SHARED_RUN_FLAGS, train_in_process

ROOT = Path(__file__).resolve().parents[1]
BEGIN = "<!-- logged columns:"
END = "<!-- end of the logged columns -->"


def documented_rows():
    """``[(flags, [column, ...])]`` of the table between the markers in docs/training.md."""
    text = (ROOT / "docs" / "training.md").read_text()
    table = text[text.index(BEGIN) : text.index(END)].splitlines()[3:]
    rows = []
    for line in table:
        flags, columns = [cell.strip() for cell in line.strip().strip("|").split("|")]
        rows.append((shlex.split(flags.strip("`")), re.findall(r"`([^`]+)`", columns)))
    return rows


def logged_columns(line: str) -> list:
    """The names of a ``Train Epoch:`` line's columns after ``Logit Scale: x`` (``Name: value``, in order)."""
    rest = line.split("Logit Scale: ", 1)[1].split(" ", 1)[1]
    return re.findall(r"(?:^| )([A-Z][A-Za-z0-9_]*): ", rest)


def last_train_line(run_dir: Path) -> str:
    return [ln for ln in (run_dir / "out.log").read_text().splitlines() if "Train Epoch:" in ln][-1]


def test_the_table_is_there_and_reads_as_flags_and_columns():
    rows = documented_rows()
    assert len(rows) >= 9 and all(flags[:1] == ["--loss"] and columns for flags, columns in rows)
    assert logged_columns(
        "x Train Epoch: 0 [16/48 (33%)] LR: 0.001000 Logit Scale: 14.286 Decl_loss: 1.0000 "
        "(1.0000) Loss: 2.7726 (2.7726) Term: loss1 Lambda_t: 1.0000 (1.0000)"
    ) == ["Decl_loss", "Loss", "Term", "Lambda_t"]


@pytest.mark.slow
@pytest.mark.parametrize("flags, columns", documented_rows(), ids=[" ".join(f) for f, _ in documented_rows()])
def test_each_rows_training_logs_exactly_its_columns(tmp_path, trained_run, flags, columns):
    loss = flags[1]
    if flags == ["--loss", loss, *SHARED_RUN_FLAGS.get(loss, ["-"])]:
        run_dir = trained_run(loss)
    else:
        res = train_in_process(
            [
                "--model",
                "clip-dcl-tiny",
                "--dataset-type",
                "synthetic",
                "--train-num-samples",
                "48",
                "--batch-size",
                "16",
                "--epochs",
                "1",
                "--precision",
                "fp32",
                "--device",
                "cpu",
                "--workers",
                "1",
                "--lr",
                "1e-3",
                "--warmup",
                "1",
                "--log-every-n-steps",
                "1",
                "--seed",
                "0",
                "--report-to",
                "",
                "--logs",
                tmp_path,
                "--name",
                "run",
                *flags,
            ]
        )
        assert res.returncode == 0, res.stderr[-3000:]
        run_dir = tmp_path / "run"
    assert logged_columns(last_train_line(run_dir)) == columns


@pytest.mark.slow
def test_decls_loss_is_its_infonce_term_and_its_total_has_its_own_column(trained_run):
    lines = [ln for ln in (trained_run("decl") / "out.log").read_text().splitlines() if "Train Epoch:" in ln]
    value = {
        name: [float(re.search(rf"\b{name}: (\S+)", ln).group(1)) for ln in lines] for name in ("Loss", "Decl_loss")
    }
    terms = [re.search(r"Term: (\w+)", ln).group(1) for ln in lines]
    assert terms[:2] == ["loss1", "infonce"]
    # the InfoNCE step optimises InfoNCE alone: there the total is the logged Loss; on a loss1 step it is not
    assert value["Decl_loss"][1] == value["Loss"][1]
    assert value["Decl_loss"][0] != value["Loss"][0] and value["Loss"][0] > 1.5  # InfoNCE of 16 pairs, not loss1's 1


def _pairs(n, seed, d=16):
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.nn.functional.normalize(torch.randn(n, d, generator=g), dim=-1) for _ in range(2)]


def test_update_then_read_keeps_the_ratio_under_the_ceiling_so_clamp_rate_is_left_out():
    import math

    import torch

    from clip_dcl.losses import create_loss

    gamma = 0.5  # ratio at most -log 0.5 = 0.69: a ceiling just above it never bites on unique ids
    loss = create_loss("decl", rate="index", num_samples=64, gamma=gamma, max_log_ratio=-math.log(gamma) + 1e-3)
    for step in range(6):  # ids revisited with other features: stale rates, the case the ceiling is for
        f, t = _pairs(16, step)
        loss(f, t, torch.tensor(30.0), sample_ids=torch.arange(16) + 8 * (step % 3))
        assert float(loss.metrics["clamp_rate"]) == 0.0 and float(loss.metrics["weight_max"]) <= 1 / gamma + 1e-4
    assert not loss.ceiling_can_bite() and "clamp_rate" not in loss.logged_metrics(loss.metrics)
    assert {"gamma_t", "loss2", "loss1"} <= loss.constant_metrics() and "lambda_t" not in loss.constant_metrics()
    read_first = create_loss("decl", rate="index", num_samples=64, include_current=False)
    assert read_first.ceiling_can_bite() and "clamp_rate" not in read_first.constant_metrics()
    tiny_gamma = create_loss("decl", rate="index", num_samples=64, gamma=1e-12)  # -log gamma above the ceiling, 20
    assert tiny_gamma.ceiling_can_bite()


def test_an_epoch_where_the_ceiling_bites_anyway_ends_with_a_warning():
    import torch

    from clip_dcl.losses import create_loss

    loss = create_loss("decl", rate="index", num_samples=64, max_log_ratio=0.5)  # gamma 0.9: bound 0.105
    f, t = _pairs(16, 0)
    t[1] = -f[1]  # row 1 scores its positive far below its negatives: its estimate is far above row 0's
    loss(f, t, torch.tensor(30.0), sample_ids=torch.tensor([0, 0, *range(2, 16)]))  # rows 0 and 1: one id
    bit = float(loss.metrics["clamp_rate"])
    assert bit > 0 and "clamp_rate" not in loss.logged_metrics(loss.metrics)
    said = loss.epoch_warning({"clamp_rate": bit})
    assert said and "ceiling (max_log_ratio 0.5) bit on" in said and "share a sample id" in said
    assert loss.epoch_warning({"clamp_rate": 0.0}) is None


def test_the_loss_column_takes_the_logged_value_and_its_sum_still_trains():
    import torch

    from clip_dcl.losses import create_loss
    from clip_dcl.train.loop import LossCall

    loss = create_loss("decl", rate="batch")
    call = LossCall(loss, torch.device("cpu"))
    f, t = _pairs(16, 0)
    f.requires_grad_(True)
    losses = call({"image_features": f, "text_features": t, "logit_scale": torch.tensor(10.0)}, None)
    total_loss = sum(losses.values())  # what the loop back-propagates
    logged = loss.logged_loss(loss.metrics)
    assert logged is not None and float(logged) != float(total_loss.detach())
    assert float(call.shown_loss(total_loss)) == float(logged) and total_loss.requires_grad
    assert list(losses) == ["decl_loss"]
    total_loss.backward()
    assert f.grad is not None and float(f.grad.abs().sum()) > 0
