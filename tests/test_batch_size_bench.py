"""The batch-size benchmark's pure pieces: the default variant, the ablation flags, the B vs 2B claim."""
from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import batch_size as bs  # noqa: E402

from clip_dcl.losses import DeCLLoss  # noqa: E402
from clip_dcl.train.flags import LOSS_FLAGS, build_parser  # noqa: E402


def decl_kwargs(flags):
    """The decl keyword arguments a variant's flags set."""
    ours = vars(build_parser().parse_known_args(list(flags))[0])
    return {LOSS_FLAGS[d][1]: v for d, v in ours.items() if d in LOSS_FLAGS and v is not None}


def test_default_variant_is_the_package_default():
    defaults = {p.name: p.default for p in inspect.signature(DeCLLoss).parameters.values()
                if p.default is not inspect.Parameter.empty}
    for kwarg, value in decl_kwargs(bs.VARIANTS[bs.DEFAULT_VARIANT]).items():
        assert defaults[kwarg] == value, kwarg
    assert bs.OBJECTIVES["decl"] == bs.VARIANTS[bs.DEFAULT_VARIANT]


def test_each_variant_changes_one_setting_of_the_reference():
    base = decl_kwargs(bs.VARIANTS[bs.REFERENCE])
    for name, flags in bs.VARIANTS.items():
        changed = {k for k, v in decl_kwargs(flags).items() if base.get(k) != v}
        if name == bs.REFERENCE:
            assert not changed
        elif name == "gamma=cosine":  # the schedule and its final value
            assert changed == {"gamma_schedule", "gamma"}
        else:
            assert len(changed) == 1, (name, changed)


def test_cache_names_follow_flags_not_labels():
    a = bs.cache_name(bs.VARIANTS["gamma=0.9"], 64, 0)
    assert bs.cache_name(bs.VARIANTS[bs.DEFAULT_VARIANT], 64, 0) == bs.cache_name(bs.OBJECTIVES["decl"], 64, 0)
    assert len({a, bs.cache_name(bs.VARIANTS["gamma=0.2"], 64, 0), bs.cache_name(bs.VARIANTS["gamma=0.9"], 32, 0),
                bs.cache_name(bs.VARIANTS["gamma=0.9"], 64, 1)}) == 4


def scores_of(values):
    """objective -> batch -> [{"seed", "m"}] from {objective: {batch: [m per seed]}}."""
    return {n: {b: [{"seed": s, "m": v} for s, v in enumerate(vs)] for b, vs in per.items()}
            for n, per in values.items()}


def test_double_batch_claim_pairs_decl_at_b_with_clip_at_2b_by_seed():
    scores = scores_of({"clip": {32: [0.1, 0.2, 0.3], 64: [0.5, 0.4, 0.6], 128: [0.7, 0.7, 0.7]},
                        "decl": {32: [0.6, 0.3, 0.7], 64: [0.6, 0.8, 0.6], 128: [0.9, 0.9, 0.9]}})
    claim = bs.double_batch_claim(scores, "decl", "clip", ["m"])
    assert sorted(claim) == [32, 64]  # no clip at 256
    # slow re-computation: per seed, decl@B - clip@2B
    for b in (32, 64):
        diffs = [d["m"] - c["m"] for d, c in zip(scores["decl"][b], scores["clip"][2 * b])]
        assert claim[b]["m"]["diffs"] == pytest.approx(diffs)
        assert claim[b]["m"]["mean"] == pytest.approx(sum(diffs) / 3)
        assert claim[b]["m"]["wins"] == sum(x > 0 for x in diffs)
    same = bs.same_batch(scores, "decl", "clip", ["m"])
    assert same[128]["m"]["mean"] == pytest.approx(0.2)
    lines = bs.claim_verdict(claim, "decl", headline=(("m", "score"),))
    # decl@32 - clip@64 = +0.1, -0.1, +0.1: a positive mean without a win on every seed
    assert lines[0] == "- decl at 32 vs clip at 64: score holds (+3.3 points, 2 of 3 seeds)"
    # -0.1, +0.1, -0.1: below 0 by less than one standard error of the differences
    assert lines[1] == "- decl at 64 vs clip at 128: score holds (-3.3 points, 1 of 3 seeds)"
    worse = scores_of({"clip": {64: [0.5, 0.5, 0.5]}, "decl": {32: [0.1, 0.2, 0.1]}})
    assert "fails" in bs.claim_verdict(bs.double_batch_claim(worse, "decl", "clip", ["m"]),
                                       headline=(("m", "score"),))[0]


def test_bad_arguments_stop_before_any_work(tmp_path):
    with pytest.raises(SystemExit, match="--batch-sizes"):
        bs.main(["--batch-sizes", "32", "32", "--work", str(tmp_path)])
    with pytest.raises(SystemExit, match="--train-samples 100"):
        bs.main(["--train-samples", "100", "--batch-sizes", "128", "--work", str(tmp_path)])
    assert not any(tmp_path.iterdir())
