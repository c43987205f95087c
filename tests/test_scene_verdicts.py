"""The README's sentences on the scene testbed (benchmarks/headline.py: scenes_block, scenes_brief), rendered from
the later study's JSON with the first study's beside it: a verdict with its interval, why, and how many seeds
differ by more than the resolution; a tie said as a tie; no number while runs are missing."""

import pytest
from headline import TESTBEDS, scenes_block, scenes_brief, verdict_table_block

from clip_dcl.experiment.stats import t_interval
from clip_dcl.experiment.study.rule import judge

RES = 0.005


def _comparison(b, diffs, power=0.83):
    final = None
    if diffs is not None:
        final = {"seeds": list(range(200, 200 + len(diffs))), "diffs": diffs, "split": "test"}
        final.update(judge("beats", diffs, 0.9, resolution=RES))
    planned = {"n": len(diffs or [0] * 12), "power": power, "expected": RES, "short": power < 0.8}
    return {
        "a": "decl-b32",
        "b": b,
        "rule": "beats",
        "label": f"decl-b32 beats {b}",
        "final": final,
        "planned": planned,
    }


def _doc(clip, tuned, status="complete"):
    return {
        "plan": "benchmarks/studies/fscenes_powered.toml",
        "status": status,
        "exploratory": False,
        "resolution": RES,
        "confidence": 0.9,
        "plan_canonical": {"data": {"command": ["data", "fashion-scenes", "{DATA}", "--seed", "2"]}, "arms": []},
        "comparisons": [_comparison("clip-b32", clip), _comparison("tuned-b32", tuned, 0.80)],
    }


WIN = [0.012, 0.008, 0.011, 0.009, 0.010, 0.004]  # every seed ahead, most by more than the resolution
TIE = [0.002, 0.003, 0.001, 0.004, 0.002, 0.003]  # above zero, inside the resolution
NONE = [0.01, -0.012, 0.004, -0.006, 0.008, -0.01]


def test_a_complete_study_gives_each_verdict_its_interval_why_and_seed_count():
    block = scenes_block(_doc(WIN, TIE))
    st = t_interval(WIN, 0.9)
    assert f"against `clip` at B = 32 +{100 * st['mean']:.1f} [+{100 * st['lo']:.1f}, +{100 * st['hi']:.1f}]" in block
    assert "**beats** (the interval above zero, the mean past the resolution; `decl` ahead by more than the " in block
    assert "resolution in 5 of 6 seeds)" in block
    assert "**tie** (the interval on one side of zero, its mean inside the resolution: a tie, not a win" in block
    assert "data draw 2" in block and "planned power 0.83 and 0.80" in block and "test split" in block
    assert "resolution 0.5 points" in block
    # the first study, from the committed report, beside it
    assert "[plan](benchmarks/studies/fscenes_confirmatory.toml), data draw 1, 4 seeds" in block
    assert "**does not reach** `clip` at B = 64 from B = 32" in block


def test_no_verdict_counts_seeds_both_ways_and_the_brief_says_it():
    block = scenes_block(_doc(NONE, NONE))
    assert "**no verdict** (the interval crosses zero; `decl` ahead by more than the resolution in 2 of 6 seeds, " in (
        block
    )
    assert "behind by more in 3)" in block
    brief = scenes_brief(_doc(WIN, NONE))
    assert (
        "against `clip` at B = 32 **beats**" in brief and "against the tuned InfoNCE at B = 32 **no verdict**" in brief
    )
    assert "[report](benchmarks/results/fscenes_powered.md)" in brief


def test_a_difference_equal_to_the_resolution_is_not_counted_past_it():
    block = scenes_block(_doc([0.005, 0.005, 0.0050000000001, 0.006], NONE))
    assert "ahead by more than the resolution in 1 of 4 seeds" in block


def test_an_incomplete_study_states_no_number():
    doc = _doc(None, None, status="incomplete: 5 of 68 runs")
    for text in (scenes_block(doc).split("  - the first")[0], scenes_brief(doc)):
        assert "incomplete: 5 of 68 runs" in text
        assert "[" not in text.split("**incomplete")[0].split("power")[-1]  # no interval before the status
    assert "+" not in scenes_brief(doc)


def test_an_exploratory_report_is_refused():
    with pytest.raises(ValueError, match="exploratory"):
        scenes_block({**_doc(WIN, WIN), "exploratory": True})


def test_the_verdict_table_names_the_later_study_apart_and_its_testbed_once():
    assert [t[0] for t in TESTBEDS if t[0].startswith("Fashion-MNIST scenes")] == [
        "Fashion-MNIST scenes",
        "Fashion-MNIST scenes, powered",
    ]
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    table = verdict_table_block(json.loads((root / "benchmarks" / "results" / "confirmatory.json").read_text()))
    assert table.count("**Fashion-MNIST scenes**:") == 1
    assert "[Fashion-MNIST scenes, powered](benchmarks/studies/fscenes_powered.toml)" in table
    assert table.count("Fashion-MNIST scenes: `tuned` is") == 1
