"""The demo and its comparison engine (clip_dcl.experiment, clip_dcl.demo)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from clip_dcl import experiment as ex
from clip_dcl.eval.metrics import classification_metrics, retrieval_metrics


def _data(n_img=40, m=3, classes=7, fewshot=None):
    return {
        "val": {"num_samples": n_img},
        "config": {"val_captions_per_image": m},
        "zeroshot": {"num_classes": classes},
        "fewshot": {"datasets": fewshot or {"a": {"num_classes": 2}, "b": {"num_classes": 4}}},
    }


def test_chance_levels_match_random_embeddings():
    """The closed forms equal the mean score of content-blind embeddings (Monte Carlo, 400 draws)."""
    n_img, m, classes = 40, 3, 7
    chance = ex.chance_levels(_data(n_img, m, classes))
    gen = torch.Generator().manual_seed(0)
    t2i = torch.arange(n_img).repeat_interleave(m)
    sums: dict[str, float] = {}
    draws = 400
    for _ in range(draws):
        img = torch.randn(n_img, 8, generator=gen)
        txt = torch.randn(n_img * m, 8, generator=gen)
        for k, v in retrieval_metrics(img, txt, t2i).items():
            sums[f"retrieval/{k}"] = sums.get(f"retrieval/{k}", 0.0) + v / draws
        logits = torch.randn(200, classes, generator=gen)
        labels = torch.arange(200) % classes
        for k, v in classification_metrics(logits, labels).items():
            sums[f"zeroshot/{k}"] = sums.get(f"zeroshot/{k}", 0.0) + v / draws
    for key in (
        "retrieval/image_to_text_R@1",
        "retrieval/image_to_text_R@5",
        "retrieval/image_to_text_R@10",
        "retrieval/text_to_image_R@1",
        "retrieval/text_to_image_R@10",
        "zeroshot/top1",
        "zeroshot/top5",
        "zeroshot/mean_per_class_recall",
    ):
        assert sums[key] == pytest.approx(chance[key], abs=0.012), key
    # image -> text with several true captions is not k * m / M: the closed form counts overlaps.
    assert chance["retrieval/image_to_text_R@10"] < 10 * m / (n_img * m)
    assert chance["fewshot/b/linear_probe"] == 0.25
    assert chance["fewshot/average/linear_probe"] == pytest.approx((0.5 + 0.25) / 2)


def test_comparison_table_means_spreads_and_best():
    scores = {"clip": [{"x": 0.10}, {"x": 0.20}], "dcl": [{"x": 0.30}, {"x": 0.50}], "decl": [{"x": float("nan")}]}
    table = ex.comparison_table(scores, [("x", "metric x")], {"x": 0.05})
    row = table.splitlines()[2]
    assert row.startswith("| metric x | 5.0 |")
    # mean ± sample standard deviation in percent; the best mean in bold; NaN stays visible
    assert "15.0 ± 7.1" in row and "**40.0 ± 14.1**" in row and "nan" in row


def test_read_curves_and_val(tmp_path):
    records = [
        {
            "kind": "train",
            "step": 0,
            "epoch": 0,
            "samples": 32,
            "samples_per_epoch": 256,
            "loss": 3.5,
            "contrastive_loss": 3.5,
        },
        {"kind": "val", "step": 8, "epoch": 1, "image_to_text_R@1": 0.5, "time": 1.0},
        {"kind": "train", "step": 15, "epoch": 1, "samples": 256, "samples_per_epoch": 256, "loss": 2.25},
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"kind": "tra')  # a torn last line
    curves = ex.read_curves(path)
    assert curves == {"epoch": [pytest.approx(0.125), pytest.approx(2.0)], "loss": [3.5, 2.25]}
    assert ex.read_curves(tmp_path) == curves  # the run folder names its file
    assert ex.read_val(path) == [{"epoch": 1, "image_to_text_R@1": 0.5}]
    assert ex.read_val(tmp_path / "missing.jsonl") == [] and ex.read_curves(tmp_path / "missing.jsonl")["loss"] == []


def test_train_command_shares_the_budget():
    data = {
        "train_data": "/d/train/{00000..00001}.tar",
        "val_data": "/d/val/00000.tar",
        "train": {"num_samples": 100},
        "val": {"num_samples": 10},
    }
    budget = ex.Budget(epochs=3, seed=5, extra=("--lr-scheduler", "const"))
    runs = ex.default_runs(0.25)
    cmds = [ex.train_command(r, data, "/logs", budget) for r in runs]
    assert [c[c.index("--name") + 1] for c in cmds] == ["clip", "dcl", "decl"]
    common = [c[: c.index("--name")] for c in cmds]
    assert common[0] == common[1] == common[2]  # same data, model, seed and budget
    assert cmds[1][-4:] == ["--loss", "dcl", "--tau-plus", "0.25"]
    assert cmds[0][1:4] == ["-m", "clip_dcl.train", "--"] and "--lr-scheduler" in cmds[0]
    with pytest.raises(ValueError, match="epochs=0"):
        ex.Budget(epochs=0).validate()


def test_demo_rejects_bad_flags_before_work(tmp_path, capsys):
    from clip_dcl.demo import main

    assert main(["--out", str(tmp_path / "o"), "--num-classes", "1"]) == 2
    assert "--num-classes" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    with pytest.raises(SystemExit):
        main(["--losses", "infonce"])


@pytest.mark.parametrize("quick", [True, False])
def test_quick_demo_says_it_is_a_smoke_test_bolds_nothing_and_counts_its_steps_forward(
    tmp_path, monkeypatch, capsys, quick
):
    import re

    from clip_dcl import demo

    data = {**_data(classes=10), "train": {"num_samples": 32}, "tau_plus": 0.1}
    data["config"]["num_classes"] = 10
    monkeypatch.setattr(ex, "synth_data", lambda *a, **k: data)
    monkeypatch.setattr(ex, "packed_training_set", lambda d: d)
    monkeypatch.setattr(
        ex,
        "train",
        lambda run, *a, **k: ex.TrainResult(
            run, tmp_path / f"{run.name}.pt", tmp_path, 1.0, ["cmd"], {"epoch": [1.0], "loss": [2.0]}, []
        ),
    )
    level = iter([0.1, 0.3, 0.2])  # dcl scores best: bold in a full demo only
    monkeypatch.setattr(
        ex, "evaluate", lambda ckpt, d, **k: dict.fromkeys([m for m, _ in ex.headline_metrics(d)], next(level))
    )
    assert demo.main([*(["--quick"] if quick else []), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    steps = [int(s) for s in re.findall(r"^\[demo\] (\d)/4", out, flags=re.M)]
    assert steps == sorted(steps) and steps[0] == 1 and steps[-1] == 4  # never 2, 3, 2, 3
    assert "[demo] 3/4 evaluating 3/3: decl" in out
    md = (tmp_path / "o" / "demo.md").read_text()
    table = md[md.index("| metric (%)") : md.index("![")]
    doc = json.loads((tmp_path / "o" / "demo.json").read_text())
    if quick:
        assert demo.SMOKE_TEST in out and f"**{demo.SMOKE_TEST}**" in md and doc["smoke_test"] == demo.SMOKE_TEST
        assert "**" not in table and "**" not in doc["table"]
    else:
        assert "smoke test" not in out + md and "smoke_test" not in doc
        assert "**30.0**" in table


def _fake_demo(monkeypatch, tmp_path):
    data = {**_data(classes=10), "train": {"num_samples": 32}, "tau_plus": 0.1}
    data["config"]["num_classes"] = 10
    monkeypatch.setattr(ex, "synth_data", lambda *a, **k: data)
    monkeypatch.setattr(ex, "packed_training_set", lambda d: d)
    monkeypatch.setattr(
        ex,
        "train",
        lambda run, *a, **k: ex.TrainResult(
            run, tmp_path / f"{run.name}.pt", tmp_path, 1.0, ["cmd"], {"epoch": [1.0], "loss": [2.0]}, []
        ),
    )
    monkeypatch.setattr(ex, "evaluate", lambda ckpt, d, **k: dict.fromkeys([m for m, _ in ex.headline_metrics(d)], 0.1))


def test_a_rerun_with_other_settings_is_refused_and_one_with_the_same_continues(tmp_path, monkeypatch, capsys):
    from clip_dcl import demo

    _fake_demo(monkeypatch, tmp_path)
    out = tmp_path / "o"
    assert demo.main(["--quick", "--out", str(out)]) == 0
    made = sorted(p.name for p in out.iterdir())
    assert demo.SETTINGS in made and json.loads((out / demo.SETTINGS).read_text())["quick"] is True
    capsys.readouterr()
    assert demo.main(["--out", str(out), "--seed", "3"]) == 2  # a full run into the quick run's folder
    err = capsys.readouterr().err.strip()
    assert err == (
        f"clip-dcl demo: {out} holds a demo run with other settings (--quick there, no --quick here; "
        f"--epochs 1 there, --epochs {demo.DEMO_BUDGET.epochs} here; --seed 0 there, --seed 3 here; "
        f"--fewshot-seeds 0 there, --fewshot-seeds 0 1 2 here): rerun with its settings to continue it, "
        f"or, for these, give another --out, or delete it to start again"
    )
    assert sorted(p.name for p in out.iterdir()) == made  # nothing touched
    assert demo.main(["--quick", "--out", str(out)]) == 0  # the same settings: continues
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    assert demo.main(["--quick", "--out", str(tmp_path / "other")]) == 2
    assert f"holds files but no {demo.SETTINGS}" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["notes.txt"]


def test_progress_estimates_the_time_left_from_the_steps_measured(monkeypatch):
    import io

    from clip_dcl import demo

    clock = [0.0]
    monkeypatch.setattr(demo.time, "perf_counter", lambda: clock[0])
    stream = io.StringIO()
    progress = demo.Progress(2, 0.0, stream)
    progress.begin("train")
    clock[0] = 5.0
    assert progress.left() is None and "estimated once" in progress.status()
    progress.echo("  [clip] epoch 1/2 100%  loss 4.0000  (5 s)")  # half of the first training in 5 s
    assert progress.left() is None  # one point: the child's start-up is in it
    clock[0] = 6.0
    progress.echo("  [clip] epoch 2/2  50%  loss 3.0000  (6 s)")  # a quarter more in 1 s
    # 1 s more of it (7 s in all), one more training of 7 s, two evaluations (EVAL_SHARE of a training each)
    assert progress.left() == pytest.approx(1 + 7 + 2 * demo.EVAL_SHARE * 7)
    # three quarters of the first training: 0.75 of 2 x (1 + EVAL_SHARE) units of work
    assert stream.getvalue().splitlines()[-1].endswith("| 30% of the demo done, about 12 s left")
    clock[0] = 7.0
    assert progress.end() == 7.0
    progress.begin("eval")
    clock[0] = 8.0
    assert progress.left() == pytest.approx(demo.EVAL_SHARE * 7 - 1 + 7 + demo.EVAL_SHARE * 7)


def test_progress_on_a_terminal_is_one_line_written_over():
    import io

    from clip_dcl import demo

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    progress = demo.Progress(1, 0.0, stream)
    progress.begin("train")
    progress.echo("  [clip] epoch 1/1  50%  loss 4.0000  (5 s)")
    progress.echo("  [clip] epoch 1/1 100%  loss 3.0000  (9 s)")
    progress.say("[demo]     clip: trained")
    text = stream.getvalue()
    assert text.count("\r\033[K") == 2 and text.count("\n") == 2 and text.endswith("\n[demo]     clip: trained\n")


@pytest.mark.slow
def test_demo_quick_end_to_end(tmp_path, preloaded):
    out = tmp_path / "demo"
    # its own lock: a test does not queue behind trainings outside it
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "CLIP_DCL_TRAIN_LOCK": str(tmp_path / "train.lock")}
    # the command as a user types it, in a process of its own (its trainings too, started from the preloaded python)
    proc = subprocess.run(
        [preloaded.python, "-m", "clip_dcl.cli", "demo", "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # progress was visible, and the table was printed
    assert (
        "[demo] 2/4 training 3/3: decl" in proc.stdout and "| metric (%) | chance | clip | dcl | decl |" in proc.stdout
    )
    # the whole demo's share done and time left, from the first training on
    assert re.search(r"trained in \d+ s -> .*; \d+% of the demo done, about \d+(\.\d)? (s|min) left", proc.stdout)
    assert "--quick is a smoke test" in proc.stdout and "**" not in (out / "demo.md").read_text().split("| metric")[1]
    doc = json.loads((out / "demo.json").read_text())
    # its time, printed at the very end, is the one its JSON records
    assert proc.stdout.strip().splitlines()[-1].startswith(f"[demo] done: {doc['minutes']:.1f} minutes of wall-clock")
    assert 0 < doc["minutes"] < 30 and set(doc["load_average"]) == {"start", "end"}
    assert list(doc["runs"]) == ["clip", "dcl", "decl"]
    # the demo's own model and optimizer on its packed training set, in --quick too
    from clip_dcl.experiment.budgets import DEMO_MODEL

    assert doc["budget"]["model"] == DEMO_MODEL
    for name, (run,) in doc["runs"].items():
        cmd = run["command"]
        assert cmd[0] == "python" and cmd[cmd.index("--train-data") + 1] == "data/train.npz", name  # relative to out
        assert cmd[cmd.index("--dataset-type") + 1] == "auto" and "--adamw-impl" in cmd, name
    keys = list(doc["chance"])  # every scored metric with a chance level: retrieval, zero-shot, few-shot
    assert len(keys) >= 20 and any(k.startswith("fewshot/digits/") for k in keys)
    for name, (run,) in doc["runs"].items():
        for key in keys:
            assert math.isfinite(run["metrics"][key]), (name, key)
        assert run["curves"]["loss"] and all(math.isfinite(v) for v in run["curves"]["loss"])
        assert (out / run["checkpoint"]).is_file()
    table = (out / "demo.md").read_text()
    assert table.count("\n| ") >= 16 and "nan" not in table
    png = (out / "demo.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_trainings_take_turns_on_one_machine(tmp_path, monkeypatch):
    lock = tmp_path / "train.lock"
    monkeypatch.setenv("CLIP_DCL_TRAIN_LOCK", str(lock))
    probe = (
        "import fcntl, sys\nf = open(sys.argv[1], 'a+')\n"
        "try:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept BlockingIOError:\n    sys.exit(3)\n"
    )
    with ex.machine_lock(echo=lambda s: None):  # the probe is another process: an flock is held per process
        assert subprocess.run([sys.executable, "-c", probe, str(lock)]).returncode == 3  # held
    assert subprocess.run([sys.executable, "-c", probe, str(lock)]).returncode == 0  # released
    monkeypatch.setenv("CLIP_DCL_TRAIN_LOCK", "")
    with ex.machine_lock(echo=lambda s: None):  # disabled: nothing to hold
        assert subprocess.run([sys.executable, "-c", probe, str(lock)]).returncode == 0


def test_headline_rows_follow_the_data():
    rows = [k for k, _ in ex.headline_metrics(_data(classes=10))]
    assert rows[:6] == [f"retrieval/{d}_R@{k}" for d in ("image_to_text", "text_to_image") for k in (1, 5, 10)]
    assert "zeroshot/top5" in rows and "fewshot/a/linear_probe" in rows and "fewshot/b/linear_probe" in rows
    assert "zeroshot/top5" not in [k for k, _ in ex.headline_metrics(_data(classes=4))]


def test_train_and_evaluate_resumes_from_its_cache(tmp_path, monkeypatch):
    calls = []
    ckpt = tmp_path / "epoch_1.pt"
    ckpt.write_bytes(b"x")

    def fake_train(run, data, logs, budget, **kw):
        calls.append(("train", run.name, budget.seed))
        return ex.TrainResult(run, ckpt, tmp_path, 1.5, ["cmd"], {"epoch": [1.0], "loss": [2.0]}, [])

    def fake_evaluate(checkpoint, data, fewshot_seeds=(0,), **kw):
        calls.append(("evaluate", Path(checkpoint).name))
        return {"zeroshot/top1": 0.5}

    from clip_dcl.experiment import runner, scoring

    monkeypatch.setattr(runner, "train", fake_train)
    monkeypatch.setattr(scoring, "evaluate", fake_evaluate)
    data = {"config": {"num_classes": 4}}
    run, budget, cache = ex.Run("dcl", ("--loss", "dcl")), ex.Budget(epochs=1, extra=("--x",)), tmp_path / "c.json"
    out = ex.train_and_evaluate(run, data, tmp_path, budget, cache, fewshot_seeds=(0,))
    assert out.source == "trained" and out.metrics == {"zeroshot/top1": 0.5} and len(calls) == 2
    again = ex.train_and_evaluate(run, data, tmp_path, budget, cache, fewshot_seeds=(0,))
    assert again.source == "reused" and again.metrics == out.metrics and len(calls) == 2  # tuples survive JSON
    monkeypatch.setattr(
        scoring, "EVALUATOR", scoring.EVALUATOR + 1
    )  # the evaluators changed: score the checkpoint again
    assert ex.train_and_evaluate(run, data, tmp_path, budget, cache, fewshot_seeds=(0,)).source == "evaluated"
    assert calls[-1] == ("evaluate", "epoch_1.pt") and len(calls) == 3
    other = ex.Budget(epochs=1, extra=("--x",), seed=1)  # another seed is another run
    assert ex.train_and_evaluate(run, data, tmp_path, other, cache, fewshot_seeds=(0,)).source == "trained"
    from clip_dcl.experiment import commands

    defaults = commands.loss_defaults("dcl")  # a package default of the run's loss changed: train again
    monkeypatch.setattr(commands, "loss_defaults", lambda name: {**defaults, "tau_plus": 0.2})
    assert ex.train_and_evaluate(run, data, tmp_path, other, cache, fewshot_seeds=(0,)).source == "trained"
    assert ex.train_and_evaluate(run, data, tmp_path, other, cache, fewshot_seeds=(0,)).source == "reused"
    ckpt.unlink()  # a cache whose checkpoint is gone trains again
    assert ex.train_and_evaluate(run, data, tmp_path, other, cache, fewshot_seeds=(0,)).source == "trained"


def test_training_and_evaluation_use_a_gpu_when_one_is_present(tmp_path, monkeypatch):
    from clip_dcl import demo
    from clip_dcl.eval.encoding import resolve_device
    from clip_dcl.experiment import runner

    data = {"train_data": "t.tar", "val_data": "v.tar", "train": {"num_samples": 8}, "val": {"num_samples": 4}}
    run, budget = ex.Run("clip", ("--loss", "clip")), ex.Budget(epochs=1)
    seen = []

    def fake_stream(cmd, env, *a):
        seen.append((cmd[cmd.index("--device") + 1], env.get("CUDA_VISIBLE_DEVICES")))
        return 1, ["stopped by the test"]

    monkeypatch.setattr(runner, "_stream", fake_stream)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == resolve_device(None) == "cuda" and resolve_device("cuda:1") == "cuda:1"
    for device in ("auto", "cpu"):
        with pytest.raises(RuntimeError, match="stopped by the test"):
            ex.train(run, data, tmp_path / device, budget, device=device, lock=False, echo=lambda s: None)
    # auto: the GPU, visible to the child; cpu: the child sees no GPU
    assert seen == [("cuda", os.environ.get("CUDA_VISIBLE_DEVICES")), ("cpu", "")]
    assert demo.build_parser().parse_args([]).device == "auto"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    assert "--device cpu" in " ".join(ex.train_command(run, data, tmp_path, budget))
    assert demo.main(["--device", "cuda", "--out", str(tmp_path / "d")]) == 2  # named, not available


def test_packed_training_set_holds_the_shards_and_is_remade_only_when_they_are(tmp_path):
    import webdataset as wds
    from open_clip_train.data import expand_urls

    from clip_dcl.data.packed import load_packed

    data = ex.synth_data(tmp_path / "data", quick=True, verbose=False)
    packed = ex.packed_training_set(data, verbose=False)
    path = Path(packed["train_data"])
    assert path == tmp_path / "data" / "train.npz" and packed["dataset_type"] == "auto"
    assert data["train_data"].endswith(".tar") and "dataset_type" not in data  # the shards' summary unchanged
    arrays = load_packed(path)
    shards = list(wds.WebDataset(expand_urls(data["train_data"])[0], shardshuffle=False))
    assert [s["__key__"] for s in shards] == [str(k) for k in arrays["keys"]]
    assert [s["txt"].decode() for s in shards] == [str(c) for c in arrays["captions"]]
    assert len(arrays["images"]) == data["train"]["num_samples"]
    # reused while newer than the data's summary; packed again once the data is rewritten
    stamp = path.stat().st_mtime_ns
    ex.packed_training_set(data, verbose=False)
    assert path.stat().st_mtime_ns == stamp
    summary = tmp_path / "data" / "summary.json"
    os.utime(summary, ns=(stamp + 10**9, stamp + 10**9))
    ex.packed_training_set(data, verbose=False)
    assert path.stat().st_mtime_ns != stamp


def test_the_share_done_never_goes_backwards_when_a_step_takes_longer_than_estimated(monkeypatch):
    """The first training's end, after its last step (its checkpoint, its process's exit), is in no estimate made
    from its steps: the time left grows when it ends, and a share of time would go backwards there."""
    import io
    import re

    from clip_dcl import demo

    clock = [15.0]  # the data took 15 s
    monkeypatch.setattr(demo.time, "perf_counter", lambda: clock[0])
    stream = io.StringIO()
    progress = demo.Progress(3, 0.0, stream)
    for name, steps, ended in (
        ("clip", (37, 45, 50, 61), 95),
        ("dcl", (38, 48, 53, 56), 63),
        ("decl", (24, 29, 35, 37), 60),
    ):
        began = clock[0]
        progress.begin("train")
        for at, pct in zip(steps, (12, 38, 62, 100)):
            clock[0] = began + at
            progress.echo(f"  [{name}] epoch 1/1 {pct:3d}%  loss 3.5000  ({at} s)")
        clock[0] = began + ended
        progress.end()
        progress.say(f"[demo]     {name}: trained; {progress.status()}")
    for seconds in (12, 19, 12):
        progress.begin("eval")
        clock[0] += seconds
        progress.end()
        progress.say(f"[demo]     evaluated; {progress.status()}")
    shares = [int(m) for m in re.findall(r"(\d+)% of the demo done", stream.getvalue())]
    assert len(shares) == 17 and shares == sorted(shares) and shares[-1] == 100, stream.getvalue()
    left = [float(m) for m in re.findall(r"about ([\d.]+) min left", stream.getvalue())]
    assert left[2] < left[3]  # the time left did grow at the first training's end: the estimate says so
