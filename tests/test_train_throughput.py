"""The training-throughput benchmark's pure parts: reading the step records, statistics, run order, commands."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
import train_throughput as tt  # noqa: E402


def step_record(epoch, done, total, data_t, batch_t, batch_size):
    """A training record of ``metrics.jsonl`` as the trainer writes it (one step per record)."""
    return {
        "kind": "train",
        "step": done // batch_size - 1,
        "epoch": epoch,
        "samples": done,
        "samples_per_epoch": total,
        "data_time": data_t,
        "batch_time": batch_t,
        "samples_per_second": batch_size / batch_t,
        "loss": 3.7102,
    }


def write_records(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_read_step_times_reads_every_training_record_and_nothing_else(tmp_path):
    rng = np.random.default_rng(0)
    batch, n = 128, 12
    batch_t = rng.uniform(0.2, 3.0, n)
    data_t = rng.uniform(0.0, 0.2, n)
    records = []
    for i in range(n):
        records.append(step_record(0, batch * (i + 1), batch * n, data_t[i], batch_t[i], batch))
        if i == 5:
            records.append({"kind": "val", "epoch": 1, "image_to_text_R@1": 0.1, "clip_val_loss": 3.2})
    steps = tt.read_step_times(write_records(tmp_path / "metrics.jsonl", records))
    assert len(steps) == n
    assert [s.samples_done for s in steps] == [batch * (i + 1) for i in range(n)]
    np.testing.assert_allclose([s.batch_seconds for s in steps], batch_t)
    np.testing.assert_allclose([s.data_seconds for s in steps], data_t)
    np.testing.assert_allclose([s.samples_per_second for s in steps], batch / batch_t)


def test_steady_rates_drops_warmup_and_rejects_multi_step_lines(tmp_path):
    records = [step_record(0, 32 * (i + 1), 320, 0.01, 0.1 * (i + 1), 32) for i in range(10)]
    steps = tt.read_step_times(write_records(tmp_path / "a.jsonl", records))
    rates = tt.steady_rates(steps, warmup_steps=3)
    np.testing.assert_allclose(rates, [32 / (0.1 * (i + 1)) for i in range(3, 10)], rtol=1e-5)
    every_5 = tt.read_step_times(
        write_records(tmp_path / "b.jsonl", [step_record(0, d, 320, 0.01, 0.5, 32) for d in (32, 192, 320)])
    )
    with pytest.raises(ValueError, match="log-every-n-steps 1"):
        tt.steady_rates(every_5, 0)
    with pytest.raises(ValueError, match="none left"):
        tt.steady_rates(steps, warmup_steps=10)
    np.testing.assert_allclose(tt.steady_rates(steps, 3, tail_steps=2), rates[:-2])
    with pytest.raises(ValueError, match="none left"):
        tt.steady_rates(steps, warmup_steps=5, tail_steps=5)
    # the tail is what the loader workers prefetched: two batches each
    setup = tt.Setup(warmup_steps=5, steps=20, workers=3)
    assert setup.tail_steps == 6 and setup.train_steps == 31


def test_summarize_matches_a_direct_computation():
    rng = np.random.default_rng(1)
    names = ["clip", "dcl", "decl"]
    rounds = [{n: list(rng.uniform(100, 300, 9 + r)) for n in names} for r in range(4)]
    del rounds[2]["decl"]  # a failed child loses only its round
    out = tt.summarize(rounds)
    for n in names:
        kept = [r for r in rounds if n in r]
        meds = [float(np.median(r[n])) for r in kept]
        assert out[n]["per_round"] == pytest.approx(meds)
        assert out[n]["median"] == pytest.approx(float(np.median(meds)))
        ratios = [float(np.median(r[n]) / np.median(r["clip"])) for r in kept]
        assert out[n]["ratios"] == pytest.approx(ratios)
        assert (out[n]["ratio_min"], out[n]["ratio_max"]) == pytest.approx((min(ratios), max(ratios)))
        # throughput: samples over time, each step one batch (any batch size cancels out)
        rates = np.concatenate([r[n] for r in kept])
        assert out[n]["throughput"] == pytest.approx(len(rates) / np.sum(1 / rates))
        fast = [
            np.percentile(r[n], 75, method="weibull") / np.percentile(r["clip"], 75, method="weibull") for r in kept
        ]
        assert out[n]["fast_ratios"] == pytest.approx(fast)
    assert out["clip"]["ratios"] == pytest.approx([1.0] * 4)
    with pytest.raises(ValueError, match="baseline"):
        tt.summarize([{"dcl": [1.0]}])


def test_round_order_puts_every_objective_in_every_position_once():
    objs = tt.objectives(0.1)
    orders = [tt.round_order(objs, r) for r in range(len(objs))]
    assert all(sorted(o, key=objs.index) == objs for o in orders)
    for pos in range(len(objs)):
        assert {o[pos].name for o in orders} == {o.name for o in objs}
    assert tt.round_order(objs, len(objs)) == objs
    with pytest.raises(ValueError, match="tau_plus"):
        tt.objectives(1.0)


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    from clip_dcl.data.synth import generate

    return generate(tmp_path_factory.mktemp("synth"), quick=True, train_samples=64, shard_size=32, verbose=False)


def test_child_commands_pass_the_training_parser(tiny_data):
    from clip_dcl.train.flags import parse_train_args

    setup = tt.Setup(batch_size=16, warmup_steps=2, steps=3)
    for obj in tt.objectives(float(tiny_data["tau_plus"])):
        cmd = tt.child_command(obj, tiny_data, setup, "/tmp/logs")
        assert cmd[1:4] == ["-m", "clip_dcl.train", "--"]
        config = parse_train_args(cmd[4:])
        assert config.loss == obj.flags[1]
        argv = config.openclip_argv
        assert argv[argv.index("--train-num-samples") + 1] == str(16 * (2 + 3 + 2))  # warm-up, timed, tail
        assert argv[argv.index("--log-every-n-steps") + 1] == "1"
    rate = {
        o.name: parse_train_args(tt.child_command(o, tiny_data, setup, "logs")[4:]).loss_kwargs.get("rate")
        for o in tt.objectives(0.1)
    }
    assert rate["decl rate=queue"] == "queue" and rate["decl rate=batch"] == "batch"


@pytest.mark.parametrize("field, value", [("batch_size", 0), ("steps", 0), ("warmup_steps", -1), ("device", "tpu")])
def test_bad_setup_is_named(field, value):
    with pytest.raises(ValueError, match=field):
        tt.Setup(**{field: value}).validate()


#: Step lines as the two trainers write them in ``out.log`` (OpenCLIP 3.3's main, then clip-dcl's loop).
OPENCLIP_LINES = [
    "2026-12-07,07:47:05 | INFO | Train Epoch: 0 [ 32/320 (10%)] Data (t): 0.192 Batch (t): 0.417, 76.6482/s, "
    "76.6482/s/gpu LR: 0.000500 Logit Scale: 14.286 Contrastive_loss: 3.9101 (3.9101) Loss: 3.9101 (3.9101)",
    "2026-12-07,07:47:05 | INFO | Train Epoch: 0 [ 64/320 (20%)] Data (t): 0.006 Batch (t): 0.129, 247.315/s, "
    "247.315/s/gpu LR: 0.001000 Logit Scale: 14.279 Contrastive_loss: 3.5257 (3.7179) Loss: 3.5257 (3.7179)",
]
CLIP_DCL_LINE = (
    "2026-12-07,07:46:48 | INFO | Train Epoch: 0 [ 96/320 (30%)] Data (t): 0.004 Batch (t): 0.118, 271.186/s, "
    "271.186/s/gpu Elapsed: 0:00, left 0:04 (run 0:04) LR: 0.000500 Logit Scale: 14.286 Decl_loss: 1.0000 "
    "(1.0000) Loss: 3.7102 (3.7102) Term: loss1 Lambda_t: 1.0000 (1.0000) Log_ratio_mean: 3.7253e-09 (3.7253e-09)"
)


def test_read_logged_steps_reads_both_trainers_step_lines_and_nothing_else(tmp_path):
    log = tmp_path / "out.log"
    log.write_text(
        "\n".join(
            [
                "2026-12-07,07:47:04 | INFO | Start epoch 0",
                OPENCLIP_LINES[0],
                "2026-12-07,07:47:05 | INFO |   batch_size: 32",
                OPENCLIP_LINES[1],
                CLIP_DCL_LINE,
                "Train Epoch: 0 [ 128/320 (40%)] Data (t): 0.004",  # torn: no step time
            ]
        )
        + "\n"
    )
    steps = tt.read_logged_steps(log)
    assert [(s.epoch, s.samples_done) for s in steps] == [(0, 32), (0, 64), (0, 96)]
    assert [s.data_seconds for s in steps] == [0.192, 0.006, 0.004]
    assert [s.batch_seconds for s in steps] == [0.417, 0.129, 0.118]
    # samples/s from its own field (6 significant digits), not from the millisecond Batch (t)
    assert [s.samples_per_second for s in steps] == [76.6482, 247.315, 271.186]
    assert tt.steady_rates(steps[:2], warmup_steps=1) == [247.315]


def test_openclip_child_runs_openclips_main_on_the_clip_childs_flags_without_loss(tiny_data):
    from open_clip_train.params import parse_args

    from clip_dcl.train.flags import parse_train_args

    setup = tt.Setup(batch_size=16, warmup_steps=2, steps=3)
    runs = tt.runs(float(tiny_data["tau_plus"]))
    assert [r.name for r in runs][-1] == tt.OPENCLIP and runs[:-1] == tt.objectives(float(tiny_data["tau_plus"]))
    oc = tt.child_command(runs[-1], tiny_data, setup, "logs")
    clip = tt.child_command(runs[0], tiny_data, setup, "logs")
    assert oc[1:4] == ["-c", tt.OPENCLIP_MAIN, "--"] and "clip_dcl.train" not in oc
    words = oc[4:]
    assert "--loss" not in words
    # the same OpenCLIP words as the clip child's, which differs by its run name and --loss clip alone
    assert clip[4:] == [*words[: words.index("--name") + 1], "clip", *words[words.index("--name") + 2 :]] + [
        "--loss",
        "clip",
    ]
    args = parse_args(words)  # OpenCLIP's own parser takes every word
    ours = parse_args(parse_train_args(clip[4:]).openclip_argv)
    for name in ("model", "batch_size", "train_num_samples", "log_every_n_steps", "precision", "device", "seed"):
        assert getattr(args, name) == getattr(ours, name), name
    assert args.dataset_resampled and args.train_num_samples == 16 * (2 + 3 + 2)


def test_openclip_child_program_passes_the_words_after_the_separator_to_openclips_main(monkeypatch):
    """``python -c OPENCLIP_MAIN -- WORDS``: OpenCLIP's main gets WORDS, with clip-dcl-tiny known; its None
    (done) exits 0 and its -1 (a taken --name) does not."""
    import open_clip
    import open_clip_train.main

    seen = []

    def fake_main(argv):
        seen.append((argv, "clip-dcl-tiny" in open_clip.list_models()))
        return -1 if "--taken" in argv else None

    monkeypatch.setattr(open_clip_train.main, "main", fake_main)
    for words, code in ((["--model", "clip-dcl-tiny"], None), (["--taken"], -1)):
        monkeypatch.setattr(sys, "argv", ["-c", "--", *words])
        with pytest.raises(SystemExit) as stop:
            exec(tt.OPENCLIP_MAIN, {})
        assert stop.value.code == code
    assert seen == [(["--model", "clip-dcl-tiny"], True), (["--taken"], True)]


def test_loop_ratio_is_clip_over_openclip_within_each_round():
    rng = np.random.default_rng(2)
    rounds = [{n: list(rng.uniform(200, 300, 8)) for n in ("clip", "dcl", tt.OPENCLIP)} for _ in range(3)]
    del rounds[1][tt.OPENCLIP]  # a round without OpenCLIP's child gives no loop ratio
    loop = tt.to_reference(rounds)["clip"]
    expected = [float(np.median(r["clip"]) / np.median(r[tt.OPENCLIP])) for r in (rounds[0], rounds[2])]
    assert loop["ratios"] == pytest.approx(expected)
    assert loop["ratio_median"] == pytest.approx(float(np.median(expected)))
    assert tt.to_reference([{"clip": [1.0], "dcl": [2.0]}]) == {}
    # the README's sentence: objectives against clip, then clip against OpenCLIP's trainer
    doc = {
        "machine": "a CPU; Linux",
        "setup": {"model": "m", "batch_size": 8, "device": "cpu", "precision": "fp32"},
        "baseline": "clip",
        "reference": tt.OPENCLIP,
        "goal": tt.GOAL,
        "summary": tt.summarize(rounds),
        "to_openclip": tt.to_reference(rounds),
    }
    text = tt.readme_block(doc)
    assert f"`{tt.OPENCLIP}`" not in text.split("Median ratios to it:")[1].split("(goal")[0]
    assert f"runs at {loop['ratio_median']:.2f} of its samples/s" in text
    del doc["reference"], doc["to_openclip"], doc["summary"][tt.OPENCLIP]
    assert "OpenCLIP's own trainer" not in tt.readme_block(doc)
