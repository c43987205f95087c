"""The README's verdict table across testbeds: one row per confirmatory comparison, naming its testbed (the plan
linked), metric, split, seeds and interval, from the studies' report JSON; no number while a study is incomplete."""

import json
from pathlib import Path

import pytest
from headline import verdict_table

ROOT = Path(__file__).resolve().parents[1]


def _doc(status="complete", metric="zeroshot/top1"):
    final = {
        "seeds": [100, 101, 102],
        "diffs": [0.01, 0.02, 0.03],
        "split": "test",
        "mean": 0.02,
        "lo": 0.0031,
        "hi": 0.0369,
        "n": 3,
        "margin": None,
        "verdict": "beats",
    }
    return {
        "exploratory": False,
        "status": status,
        "metric": metric,
        "split": "test",
        "comparisons": [
            {"a": "decl-b32", "b": "clip-b32", "rule": "beats", "final": final},
            {
                "a": "decl-b32",
                "b": "clip-b64",
                "rule": "reaches",
                "final": {**final, "mean": -0.01, "lo": -0.03, "hi": 0.01, "margin": 0.025, "verdict": "reaches"},
            },
        ],
    }


def test_rows_name_testbed_metric_split_seeds_and_interval():
    table = verdict_table([("Fashion-MNIST", "plans/f.toml", _doc())]).splitlines()
    assert len(table) == 4
    assert table[2] == (
        "| [Fashion-MNIST](plans/f.toml) | `decl-b32` - `clip-b32` (beats) | zero-shot top-1, test | "
        "3 (100-102) | +2.0 [+0.3, +3.7] | **beats** |"
    )
    assert "bar -2.5" in table[3] and "**reaches**" in table[3]


def test_incomplete_study_gives_no_number_and_exploratory_is_refused():
    table = verdict_table([("A", "a.toml", _doc()), ("B", "b.toml", _doc(status="incomplete (3 of 9 runs)"))])
    last = table.splitlines()[-1]
    assert last.startswith("| [B](b.toml) | incomplete (3 of 9 runs)") and "+" not in last
    with pytest.raises(ValueError, match="exploratory"):
        verdict_table([("A", "a.toml", {**_doc(), "exploratory": True})])


def test_the_committed_synthetic_study_renders_every_comparison():
    doc = json.loads((ROOT / "benchmarks" / "results" / "confirmatory.json").read_text())
    rows = verdict_table([("synthetic", "benchmarks/studies/confirmatory.toml", doc)]).splitlines()[2:]
    assert len(rows) == len(doc["comparisons"]) == 6
    assert all("retrieval mean R@1, test" in r for r in rows)
