"""The quality benchmark's pure pieces: ablation flags, the paired comparison, the mean R@1."""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
import quality as q  # noqa: E402

from clip_dcl import experiment as ex  # noqa: E402
from clip_dcl.train.flags import build_parser  # noqa: E402


def _decl():
    return next(r for r in ex.default_runs(0.1) if r.name == q.DECL)


def test_ablation_changes_one_setting_of_the_default_decl():
    decl = _decl()
    runs = q.ablation_runs(list(q.ABLATIONS), decl)
    assert [r.name for r in runs] == [f"decl {n}" for n in q.ABLATIONS]
    parser = build_parser()
    base = vars(parser.parse_known_args(list(decl.flags))[0])
    changed = {}
    for run in runs:
        parsed = vars(parser.parse_known_args(list(run.flags))[0])
        changed[run.name] = {k: v for k, v in parsed.items() if v != base[k]}
        # A replaced flag appears once: the training parser would silently take the last of two.
        assert run.flags.count("--decl-rate") == 1
    assert changed == {
        "decl rate=queue": {"decl_rate": "queue"},
        "decl rate=batch": {"decl_rate": "batch"},
        "decl schedule=decl": {"decl_schedule": "decl"},
        "decl schedule=harmonic": {"decl_schedule": "harmonic"},
        "decl u=gamma": {"decl_sample_u": True},
    }


@pytest.mark.parametrize("bad", [["rate=index2"], ["rate=queue", "rate=queue"]])
def test_bad_ablation_is_named(bad):
    with pytest.raises(ValueError, match="ablation"):
        q.ablation_runs(bad, _decl())


def _reference_pairs(scores, ref, run, key):
    """Slow re-computation: loop over the reference's seeds, look the run's record up by seed."""
    out = []
    for r in scores[ref]:
        for s in scores[run]:
            if s["seed"] == r["seed"] and math.isfinite(s.get(key, math.nan)) and math.isfinite(r.get(key, math.nan)):
                out.append((r["seed"], s[key] - r[key]))
    return sorted(out)


def test_paired_differences_match_a_slow_recomputation_on_random_scores():
    rng = np.random.default_rng(0)
    for trial in range(20):
        seeds = list(rng.choice(10, size=int(rng.integers(1, 6)), replace=False))
        scores = {}
        for name in ("clip", "a", "b"):
            mine = [s for s in seeds if rng.random() > 0.2]  # some seeds missing in some runs
            rng.shuffle(mine)  # records in any order
            scores[name] = [
                {"m": float(rng.random()) if rng.random() > 0.1 else math.nan, "seed": int(s)} for s in mine
            ]
        out = ex.paired_differences(scores, "clip", ["m", "absent"])
        assert set(out) == {"a", "b"}
        for name in ("a", "b"):
            ref = _reference_pairs(scores, "clip", name, "m")
            d = out[name]["m"]
            assert d["seeds"] == [s for s, _ in ref]
            assert d["diffs"] == pytest.approx([v for _, v in ref])
            assert d["n"] == len(ref)
            assert d["wins"] == sum(v > 0 for _, v in ref) and d["losses"] == sum(v < 0 for _, v in ref)
            if len(ref) >= 2:
                assert d["mean"] == pytest.approx(statistics.mean(v for _, v in ref))
                assert d["std"] == pytest.approx(statistics.stdev(v for _, v in ref))
            assert out[name]["absent"]["n"] == 0 and math.isnan(out[name]["absent"]["mean"])


def test_paired_differences_reject_a_missing_reference_and_repeated_seeds():
    with pytest.raises(ValueError, match="reference"):
        ex.paired_differences({"a": [{"m": 1.0, "seed": 0}]}, "clip", ["m"])
    with pytest.raises(ValueError, match="repeats a seed"):
        ex.paired_differences({"clip": [{"m": 1.0, "seed": 0}, {"m": 2.0, "seed": 0}]}, "clip", ["m"])


def test_paired_table_shows_per_seed_points_mean_and_wins():
    scores = {
        "clip": [{k: 0.5 for k, _ in q.HEADLINE} | {"seed": s} for s in (0, 1, 2)],
        "dcl": [{k: v for k, _ in q.HEADLINE} | {"seed": s} for s, v in ((0, 0.52), (1, 0.5), (2, 0.56))],
    }
    paired = ex.paired_differences(scores, "clip", [k for k, _ in q.HEADLINE])
    first = paired["dcl"][q.HEADLINE[0][0]]
    assert (first["wins"], first["ties"], first["losses"]) == (2, 1, 0)  # a tie is not a win
    row = q.paired_table(paired, "clip").splitlines()[2]
    assert row.startswith("| dcl | s0 +2.0, s1 +0.0, s2 +6.0 / **+2.7** / 2 of 3 |")


def test_mean_r1_is_the_mean_of_both_directions():
    m = ex.with_mean_r1({"retrieval/image_to_text_R@1": 0.2, "retrieval/text_to_image_R@1": 0.4, "x": 1.0})
    assert m[ex.MEAN_R1] == pytest.approx(0.3) and m["x"] == 1.0
    assert math.isnan(ex.with_mean_r1({"retrieval/image_to_text_R@1": 0.2})[ex.MEAN_R1])
