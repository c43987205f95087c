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
