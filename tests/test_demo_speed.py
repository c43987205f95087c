"""benchmarks/demo_speed.py: the demo's training against the demo's training as it was, in one run."""

from __future__ import annotations

import json

import benchmark_script
import pytest

speed = benchmark_script.load("demo_speed")


def test_the_baseline_differs_from_the_demo_in_model_and_optimizer_only():
    from clip_dcl.experiment.budgets import DEMO_BUDGET, DEMO_MODEL

    assert speed.BEFORE.model == "clip-dcl-tiny" and DEMO_BUDGET.model == DEMO_MODEL
    assert speed.BEFORE.extra == () and "--adamw-impl" in DEMO_BUDGET.extra
    same = ("epochs", "batch_size", "lr", "wd", "warmup", "seed", "workers")
    assert all(getattr(speed.BEFORE, k) == getattr(DEMO_BUDGET, k) for k in same)


def test_bad_epochs_fail_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit):
        speed.main(["--epochs", "0", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "r")])
    assert "--epochs must be >= 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


@pytest.mark.slow
def test_quick_run_times_both_settings_and_reports_their_ratio(tmp_path, monkeypatch, preloaded):
    # both settings' trainings start from the preloaded python (the same start-up for both: the ratio is unchanged)
    monkeypatch.setattr(speed, "ENTRY", [preloaded.python, "-m", "clip_dcl.train"])
    out = tmp_path / "report" / "demo_speed"
    assert speed.main(["--quick", "--work", str(tmp_path / "w"), "--out", str(out)]) == 0
    doc = json.loads(out.with_suffix(".json").read_text())
    before, demo = doc["rows"]
    assert (before["setting"], before["train_data"], before["model"]) == ("before", "webdataset", "clip-dcl-tiny")
    assert (demo["setting"], demo["train_data"]) == ("demo", "auto")
    assert demo["command"][demo["command"].index("--train-data") + 1].endswith("train.npz")
    assert doc["ratio"] == pytest.approx(demo["seconds"] / before["seconds"])
    assert f"**{doc['ratio']:.2f}**" in out.with_suffix(".md").read_text()
