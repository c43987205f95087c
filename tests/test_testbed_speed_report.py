"""benchmarks/testbed_speed.py's report across calls: a part made elsewhere (a lent GPU's CUDA part) is merged
in with where it was made, and the generated block names the GPU and whether the goal was met."""

from __future__ import annotations

import json

import benchmark_script


def _module():
    return benchmark_script.load("testbed_speed")


def _cuda_run(seed, seconds):
    return {
        "recipe": "micro-words",
        "batch_size": 32,
        "epochs": 20,
        "seed": seed,
        "steps": 7500,
        "seconds": seconds,
        "ms_per_step": 1000 * seconds / 7500,
        "threads": 1,
        "device": "cuda",
        "load_before": 1.0,
        "load_after": 5.0,
    }


def _cpu_report():
    return {
        "command": "python benchmarks/testbed_speed.py",
        "date": "2026-11-26 13:00",
        "commit": "aaa",
        "machine": "AMD EPYC, 2 CPU cores (2 torch threads), no GPU; Linux, Python 3.11.7, torch 2.14.1",
        "speed": [{"recipe": "micro-words", "batch_size": 32, "seconds": 198.0}],
        "ratios": {"32": 0.284},
        "cuda": None,
        "cuda_note": "No GPU was visible",
        "gate": [{"batch_size": 16}],
        "gate_verdict": {"holds": False},
    }


def _gpu_report():
    return {
        "command": "python benchmarks/testbed_speed.py --parts cuda",
        "date": "2026-11-27 00:05",
        "commit": "bbb",
        "machine": "Intel Xeon, 16 CPU cores (16 torch threads), NVIDIA H100 80GB HBM3; Linux, Python 3.12.3, torch "
        "2.11.0",
        "cuda": [_cuda_run(0, 183.3), _cuda_run(1, 182.5)],
    }


def test_merge_takes_each_part_from_the_report_that_has_it_and_records_where_it_was_made():
    ts = _module()
    made = {"command": "merge", "date": "now", "machine": "here", "commit": "ccc"}
    doc = ts.merged({"commit": "ccc"}, [_cpu_report(), _gpu_report()], ran=[], made=made)
    assert doc["speed"] == _cpu_report()["speed"] and doc["ratios"] == {"32": 0.284}
    assert doc["gate_verdict"] == {"holds": False}
    # the GPU's CUDA part replaces the CPU call's "no GPU" note, which must not survive beside it
    assert [r["seconds"] for r in doc["cuda"]] == [183.3, 182.5] and "cuda_note" not in doc
    assert doc["sources"]["cuda"]["machine"].endswith("torch 2.11.0") and doc["sources"]["cuda"]["commit"] == "bbb"
    assert doc["sources"]["speed"]["commit"] == "aaa"
    # merged again (the merged report as input), the sources stay those of the calls that made the parts
    again = ts.merged({"commit": "ddd"}, [doc], ran=[], made={**made, "commit": "ddd"})
    assert again["sources"] == doc["sources"]
    # a part run in this call is this call's, whatever the merged reports hold
    own = ts.merged({"commit": "ccc", "cuda": [_cuda_run(0, 50.0)]}, [_gpu_report()], ran=["cuda"], made=made)
    assert own["cuda"][0]["seconds"] == 50.0 and own["sources"]["cuda"] == made


def test_report_and_block_name_the_gpu_and_the_goal_of_the_merged_cuda_part(tmp_path):
    ts = _module()
    doc = ts.merged(
        {
            "commit": "ccc",
            "status": "complete",
            "data_argv": ["data", "synth"],
            "train_argv": ["--x"],
            "recipe": "micro-words",
            "baseline_recipe": "micro-bpe",
            "goal": 0.33,
        },
        [_gpu_report()],
        ran=[],
        made={"command": "merge", "date": "now", "machine": "here", "commit": "ccc"},
    )
    block = ts.readme_block(doc)
    assert "CUDA (NVIDIA H100 80GB HBM3): 2 runs of `micro-words` at once" in block
    assert "the slowest 183 s (goal <= 60 s): **not met**" in block
    fast = {**doc, "cuda": [_cuda_run(0, 41.0)]}
    assert "**met**" in ts.readme_block(fast)
    report = ts.Report.at(tmp_path / "tb", "merge", date="now", machine="here")
    ts.write(report, doc)
    md = (tmp_path / "tb.md").read_text()
    assert "Made by `python benchmarks/testbed_speed.py --parts cuda` on Intel Xeon" in md
    assert "| 0 | 7500 | 183.3 |" in md
    assert json.loads((tmp_path / "tb.json").read_text())["sources"]["cuda"]["commit"] == "bbb"


def test_the_gate_read_paired_by_seed_matches_a_slow_recomputation():
    from scipy import stats

    ts = _module()

    def run(b, seed, r1):
        return {"batch_size": b, "seed": seed, "metrics": {ts.MEAN_R1: r1}}

    runs = [
        run(16, 0, 0.238),
        run(16, 1, 0.193),
        run(16, 2, 0.152),
        run(512, 0, 0.328),
        run(512, 1, 0.236),
        run(512, 2, 0.297),
        run(512, 3, 0.9),
    ]  # seed 3 has no B = 16 run: not paired
    p = ts.gate_paired(runs)
    diffs = [0.328 - 0.238, 0.236 - 0.193, 0.297 - 0.152]
    mean = sum(diffs) / 3
    sd = (sum((d - mean) ** 2 for d in diffs) / 2) ** 0.5
    half = stats.t.ppf(0.95, 2) * sd / 3**0.5
    assert p["seeds"] == [0, 1, 2] and p["diffs"] == diffs
    assert (
        abs(p["mean"] - mean) < 1e-12 and abs(p["lo"] - (mean - half)) < 1e-12 and abs(p["hi"] - (mean + half)) < 1e-12
    )
    # the ranges touch (0.236 < 0.238) while every seed's pair rises: the gate fails, the paired reading is above 0
    assert not ts.gate_verdict(runs[:6])["apart"] and p["lo"] > 0
    text = ts._paired_text(p)
    assert "per seed +9.0, +4.3, +14.5" in text and "did not name before its runs" in text
    assert ts.gate_paired(runs[:1] + runs[3:4]) is None  # one paired seed: no interval
