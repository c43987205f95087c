"""The batch-size testbed (benchmarks/testbed/, benchmarks/batch_size.py): its objectives from the
registry, the rule and its readings, the reports and the docs' blocks, the stages' plans, and today's reports
written again from their JSON with the same verdicts."""

from __future__ import annotations

import inspect
import json
from datetime import datetime, timezone
from pathlib import Path

import batch_size as bs
import pytest
from testbed import blocks as B
from testbed import objectives as O
from testbed import report as R
from testbed import rule as T

from clip_dcl import experiment as ex
from clip_dcl.experiment import study
from clip_dcl.experiment.commands import loss_flags
from clip_dcl.losses import DeCLLoss
from clip_dcl.train.flags import build_parser, parse_train_args
from clip_dcl.train.loss_flags import flag_owners

STUDIES = Path(__file__).resolve().parents[1] / "benchmarks" / "studies"


def decl_kwargs(flags):
    """The decl keyword arguments a variant's flags set."""
    ours, owners = vars(build_parser().parse_known_args(list(flags))[0]), flag_owners()
    return {owners[d][1]: v for d, v in ours.items() if d in owners and v is not None}


def test_default_variant_is_the_package_default():
    defaults = {
        p.name: p.default
        for p in inspect.signature(DeCLLoss).parameters.values()
        if p.default is not inspect.Parameter.empty
    }
    got = decl_kwargs(O.objectives()["decl default"])
    for kwarg, value in got.items():
        if kwarg == "include_current":  # None: the loss resolves it to update-then-read for rate index
            assert defaults[kwarg] is None and value is True and DeCLLoss(num_samples=2).include_current
        else:
            assert defaults[kwarg] == value, kwarg
    assert got["rate"] == "index"


def test_each_variant_changes_one_setting_of_the_screens_base():
    default = decl_kwargs(O.objectives()["decl default"])
    base = decl_kwargs(O.objectives()["decl absolute"])  # the package default when the screen ran
    assert {k for k in default if default[k] != base[k]} == {"estimate"}
    assert base["estimate"] == "absolute" and default["estimate"] == "relative"
    assert len({O.objectives()[name] for name in O.DECL_VARIANTS}) == len(O.DECL_VARIANTS)  # no two alike
    for name, settings in O.DECL_VARIANTS.items():
        got = decl_kwargs(O.objectives()[name])
        changed = {k for k in set(base) | set(got) if base.get(k) != got.get(k)}
        if name in ("decl default", "decl absolute"):
            continue
        elif name.startswith("decl FastCLIP gamma"):  # the schedule and its final value
            assert changed == {"gamma_schedule", "gamma"}
        elif settings.get("rate") in ("queue", "batch"):  # the rate, and the index-only settings it drops
            assert "rate" in changed and all(
                k
                in (
                    "rate",
                    "queue_size",
                    "include_current",
                    "gamma",
                    "gamma_schedule",
                    "first_visit",
                    "drift_correction",
                    "state",
                    "state_dtype",
                )
                for k in changed
            ), (name, changed)
        else:
            assert changed == set(settings) - set(O.SCREEN_BASE), (name, changed)


def test_every_objective_is_a_valid_training_command(tmp_path):
    for name, flags in O.objectives().items():
        cfg = parse_train_args(["--dataset-type", "synthetic", "--train-num-samples", "64", *flags], check_files=False)
        assert cfg.loss == flags[1], name


def test_the_sweep_variants_are_decl_objectives_with_the_default_among_them():
    assert "decl default" in O.SWEEP_VARIANTS
    assert all(list(O.objectives()[name][:2]) == ["--loss", "decl"] for name in O.SWEEP_VARIANTS)


def test_loss_flags_refuse_unknown_settings():
    with pytest.raises(ValueError, match="gamma_min"):
        loss_flags("decl", gamma_min=0.1)


def rec(label, b, seed, r1, val=None):
    return {
        "label": label,
        "batch_size": b,
        "seed": seed,
        "metrics": {T.MEAN_R1: r1},
        "val_r1": val or [],
        "logit_scale": [],
        "train_seconds": 0.0,
    }


def test_gate_needs_three_points_three_seeds_and_separate_ranges():
    sizes = [16, 512]
    lo = [rec("clip", 16, s, v) for s, v in enumerate([0.20, 0.22, 0.21])]
    assert T.gate(lo + [rec("clip", 512, s, v) for s, v in enumerate([0.25, 0.26, 0.24])], sizes)["passed"]
    overlap = T.gate(lo + [rec("clip", 512, s, v) for s, v in enumerate([0.30, 0.30, 0.215])], sizes)
    assert overlap["gain"] > 0.03 and not overlap["separate"] and not overlap["passed"]
    small = T.gate(lo + [rec("clip", 512, s, v) for s, v in enumerate([0.23, 0.23, 0.23])], sizes)
    assert small["separate"] and not small["passed"]
    two_seeds = T.gate(lo[:2] + [rec("clip", 512, s, 0.3) for s in range(2)], sizes)
    assert not two_seeds["passed"]
    assert T.gate(lo, sizes) is None


def test_plateau_is_the_change_over_the_last_fifth():
    assert T.plateau([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.91]) == pytest.approx(1.0)
    assert T.plateau([0.1, 0.2]) is None


def test_paired_differences_against_clip_at_the_same_and_twice_the_batch():
    records = [
        rec("clip", 16, 0, 0.20),
        rec("clip", 16, 1, 0.22),
        rec("clip", 32, 0, 0.25),
        rec("clip", 32, 1, 0.27),
        rec("decl default", 16, 0, 0.26),
        rec("decl default", 16, 1, 0.26),
    ]
    same = R.paired(records, "clip")
    assert "| decl default | 16 | clip at 16 | s0 +6.0, s1 +4.0 | **+5.0** | 2 of 2 |" in same
    double = R.paired(records, "clip", same_b=False)
    assert "| decl default | 16 | clip at 32 | s0 +1.0, s1 -1.0 | **+0.0** | 1 of 2 |" in double
    # the DeCL variants against the screen's base: only decl variants, paired by seed
    records += [rec("decl absolute", 16, 0, 0.27), rec("decl absolute", 16, 1, 0.25), rec("dcl tau+ 0.05", 16, 0, 0.3)]
    variants = R.paired(records, "decl absolute", prefix="decl ")
    assert variants.count("\n") == 2  # header, rule, one row
    assert "| decl default | 16 | decl absolute at 16 | s0 -1.0, s1 +1.0 | **+0.0** | 1 of 2 |" in variants


# ------------------------------------------------------------------------------------------
# The decision rule, the decisive stage and the docs' generated verdicts
# ------------------------------------------------------------------------------------------
def scored(label, b, seed, r1):
    """A finished run scored on both splits (the test split's score is ``r1``, the validation one 0)."""
    return {**rec(label, b, seed, 0.0), "test_metrics": {T.MEAN_R1: r1}}


def reach_records(decl_minus_2b, gain=0.04, b=32):
    out = []
    for s, d in enumerate(decl_minus_2b):
        out += [
            scored("clip", b, s, 0.30),
            scored("clip", 2 * b, s, 0.30 + gain),
            scored("decl default", b, s, 0.30 + gain + d),
        ]
    return out


def test_reach_verdict_against_minus_half_of_clips_gain():
    # gain 4 points: the threshold is -2; an interval above it reaches, below it does not, across it is open
    reaches = T.comparison(reach_records([0.000, 0.005, -0.005]), "decl default", 32, 64)
    assert reaches["gain"] == pytest.approx(0.04) and T.reach_verdict(reaches) == "reaches"
    short = T.comparison(reach_records([-0.040, -0.045, -0.035]), "decl default", 32, 64)
    assert T.reach_verdict(short) == "does not reach"
    wide = T.comparison(reach_records([0.03, -0.05, 0.00]), "decl default", 32, 64)
    assert T.reach_verdict(wide) == "no verdict"
    two_seeds = T.comparison(reach_records([0.000, 0.001]), "decl default", 32, 64)
    assert T.reach_verdict(two_seeds) == "no verdict"  # below MIN_SEEDS whatever the interval


def test_beat_verdict_a_difference_inside_the_resolution_is_a_tie():
    def beat(diffs):
        recs = reach_records(diffs, gain=0.0)  # clip at 2B = clip at B: decl - clip at 2B is decl - clip at B
        return T.beat_verdict(T.comparison(recs, "decl default", 32, 32))

    assert beat([0.05, 0.06, 0.04]) == "beats"
    assert beat([0.005, 0.006, 0.004]) == "tie"  # interval above zero, mean half a point: never a win
    assert beat([-0.05, -0.06, -0.04]) == "trails"
    assert beat([0.05, -0.06, 0.05]) == "no verdict"
    assert beat([0.001, -0.002, 0.001]) == "no verdict"  # inside the resolution but not known to be: open


def test_verdicts_are_the_test_splits_and_the_validation_split_is_context_beside_them():
    archived = [
        {**rec(lab, b, s, v), "split": "validation"}
        for s in range(3)
        for lab, b, v in (("clip", 16, 0.20), ("clip", 32, 0.28), ("decl default", 16, 0.17 + s / 1000))
    ]
    rows = T.verdicts(reach_records([0.000, 0.005, -0.005]), archived)
    by = {(r["batch_size"], r["kind"], r["split"]): r for r in rows}
    assert by[(16, "reach", "test")]["n"] == 0 and by[(16, "reach", "test")]["verdict"] == "no verdict"
    assert by[(16, "reach", "validation")]["verdict"] == "does not reach"  # computed, shown as context
    assert by[(32, "reach", "test")]["verdict"] == "reaches" and (32, "reach", "validation") not in by
    table = R.verdict_table(rows)
    assert "| 16 | clip at 32 | validation | 3 |" in table and "none (the rule would read: does not reach)" in table
    assert "| 32 | clip at 64 | test | 3 |" in table and "**reaches**" in table
    assert R.decisive_status(rows) == (
        "B = 16: no verdict (0 test-split seeds); B = 32: reaches (3 test-split "
        "seeds); B = 64: no verdict (0 test-split seeds)"
    )


def test_the_readme_block_is_built_from_the_reports_verdicts():
    """(tests/test_quoted_numbers.py compares the docs' block with the committed JSON.)"""
    rows = T.verdicts(reach_records([0.000, 0.005, -0.005]))
    doc = {"verdicts": rows, "runs": [], "status": "PARTIAL", "confidence": T.CONFIDENCE}
    block = B.readme_block(doc)
    assert "**B = 32: `decl` reaches `clip` at 64** (test split, 3 seeds): decl@32 - clip@64 = +0.0 [" in block
    assert "(per seed +0.0, +0.5, -0.5)" in block
    assert "**B = 16: no test-split runs yet.**" in block and "not run yet" in block.split("Temperature controls")[1]
    changed = json.loads(json.dumps(doc))
    changed["verdicts"][2]["mean"] += 0.05
    assert B.readme_block(changed) != block


def test_each_dcl_variant_changes_only_its_settings_of_the_screens_base():
    base = decl_kwargs(loss_flags("dcl", **O.DCL_SCREEN_BASE))
    assert decl_kwargs(O.objectives()["dcl default"]) == base
    for name, settings in O.DCL_VARIANTS.items():
        got = decl_kwargs(O.objectives()[name])
        assert {k for k in set(base) | set(got) if base.get(k) != got.get(k)} == set(settings), name
    plan = study.load_plan(STUDIES / "testbed_dcl_screen.toml")
    assert "dcl top" not in O.screen_objectives() and ("dcl-top-b64", 0) in plan.runs()


def test_control_leads_pair_each_comparisons_arms_by_seed_on_the_test_split():
    arms = {
        "clip": 0.30,
        "decl default": 0.36,
        "clip at decl's scale (B=32)": 0.33,
        "decl at clip's scale (B=32)": 0.31,
    }
    records = [scored(lab, 32, s, v + s / 100) for s in range(2) for lab, v in arms.items()]
    records.append(scored("clip at decl's scale (B=32)", 32, 2, 0.5))  # seed 2 lacks the other arms: left out
    lead = T.control_leads(records)[32]
    assert lead["decl - clip"]["seeds"] == [0, 1] and lead["decl - clip"]["mean"] == pytest.approx(0.06)
    assert lead["decl - clip at decl scale"]["mean"] == pytest.approx(0.03)
    assert lead["decl at clip scale - clip"]["mean"] == pytest.approx(0.01)
    assert lead["clip at decl scale - clip"]["mean"] == pytest.approx(0.03)
    assert 64 not in T.control_leads(records)
    block = B.readme_block(
        {"verdicts": T.verdicts(records), "runs": records, "status": "x", "confidence": T.CONFIDENCE}
    )
    assert (
        "**Temperature controls at B = 32** (test split, paired by seed; verdicts by the rule's beats / trails / "
        "tie): `decl`'s lead over `clip`: +6.0 [+6.0, +6.0] (per seed +6.0, +6.0), no verdict (seeds 0, 1)"
    ) in block
    assert lead["decl - clip"]["verdict"] == "no verdict"  # 2 seeds: below the rule's 3
    # one control with a seed more than the other: each comparison over the seeds both of its arms have
    more = records + [scored(lab, 32, 2, arms[lab] + 0.02) for lab in ("clip", "decl default")]
    lead = T.control_leads(more)[32]
    assert lead["clip at decl scale - clip"]["seeds"] == [0, 1, 2] and lead["decl - clip"]["seeds"] == [0, 1, 2]
    assert lead["decl at clip scale - clip"]["seeds"] == [0, 1]
    assert 32 not in T.control_leads([r for r in more if "scale" not in r["label"]])  # no control: no row


def test_controls_carry_the_rules_verdict_once_three_seeds_agree():
    arms = {
        "clip": 0.30,
        "decl default": 0.36,
        "clip at decl's scale (B=32)": 0.355,
        "decl at clip's scale (B=32)": 0.30,
    }
    jitter = {0: 0.0, 1: 0.004, 2: -0.003}  # each arm moves alike per seed: paired differences barely spread
    records = [
        scored(lab, 32, s, v + jitter[s] + (0.001 * s if lab == "decl default" else 0.0))
        for s in range(3)
        for lab, v in arms.items()
    ]
    lead = T.control_leads(records)[32]
    assert lead["decl - clip"]["verdict"] == "beats"
    assert lead["clip at decl scale - clip"]["verdict"] == "beats"
    assert lead["decl - clip at decl scale"]["verdict"] == "tie"  # +0.6 point: inside the resolution
    assert lead["decl at clip scale - clip"]["verdict"] == "no verdict"  # 0 on every seed: the interval holds zero
    table = R.controls_table(records)
    assert (
        "| clip at decl's scale (B=32) | clip at 32 | 3 | s0 +5.5, s1 +5.5, s2 +5.5 | +5.5 | [+5.5, +5.5] | beats |"
        in table
    )
    which = B.which_loss_block({"verdicts": T.verdicts(records), "runs": records, "confidence": T.CONFIDENCE})
    assert (
        "- InfoNCE trained at `decl`'s final temperature - `clip`, B = 32, test split: +5.5 [+5.5, +5.5] (3 seeds, "
        "beats)." in which
    )
    assert "- `decl` - InfoNCE trained at `decl`'s final temperature, B = 32, test split: +0.6" in which


def test_dcl_default_rows_read_the_paired_interval_against_zero():
    def rows(diffs):
        records = [scored("clip", 64, s, 0.30) for s in range(len(diffs))]
        records += [scored(O.DCL_DEFAULT, 64, s, 0.30 + d) for s, d in enumerate(diffs)]
        return {r["split"]: r for r in T.dcl_default_rows(records)}

    noise = rows([0.01, -0.01, 0.004])["test"]
    assert noise["seeds"] == [0, 1, 2] and noise["verdict"] == "within the seeds' noise"
    assert noise["mean"] == pytest.approx(0.004 / 3)
    assert rows([-0.05, -0.06, -0.04])["test"]["verdict"] == "trails"
    assert rows([0.05, 0.06, 0.04])["test"]["verdict"] == "above"
    assert rows([-0.05, -0.06])["test"]["verdict"] == "no verdict"  # below MIN_SEEDS
    assert rows([0.0, 0.0, 0.0])["validation"]["n"] == 3  # the validation scores (0 here) pair the same way
    table = R.dcl_default_table(list(rows([-0.05, -0.06, -0.04]).values()))
    assert "| test | 3 | s0 -5.0, s1 -6.0, s2 -4.0 | -5.0 |" in table and "| trails |" in table
    block = B.dcl_default_block({"dcl_default": list(rows([0.01, -0.01, 0.004]).values())})
    assert "test split, 3 seeds: retrieval mean R@1 +0.13 points [" in block and "within the seeds' noise" in block
    assert "no test-split runs yet" in B.dcl_default_block({"dcl_default": []})


def test_which_loss_numbers_come_from_the_verdicts_the_dcl_check_and_the_screens():
    records = reach_records([0.000, 0.005, -0.005], gain=0.0)  # decl@32 - clip@32 = decl@32 - clip@64 here
    records += [scored(O.DCL_DEFAULT, 64, s, 0.30) for s in range(3)] + [scored("clip", 64, s, 0.30) for s in range(3)]
    doc = {
        "verdicts": T.verdicts(records),
        "runs": records,
        "confidence": T.CONFIDENCE,
        "dcl_default": T.dcl_default_rows(records),
    }
    block = B.which_loss_block(doc)
    assert "- `decl` - `clip` at the same batch, retrieval mean R@1, test split: B = 32: +0.0 [" in block
    assert "(3 seeds, no verdict)" in block
    assert (
        "minus half of `clip`'s gain from B to 2B), retrieval mean R@1, test split: B = 32: +0.0 [-0.8, +0.8] "
        "against a threshold of +0.0 (3 seeds, no verdict)."
    ) in block
    assert (
        "- `--loss dcl` at its defaults - `clip`, B = 64, retrieval mean R@1, test split: +0.00 [+0.00, +0.00] "
        "(3 seeds, within the seeds' noise)." in block
    )
    empty = B.which_loss_block({"verdicts": T.verdicts([]), "runs": [], "confidence": T.CONFIDENCE})
    assert "no test-split runs yet" in empty and "--loss dcl` at its defaults" not in empty


def test_scoring_refuses_an_unknown_split_and_a_test_split_the_data_lack():
    from clip_dcl.experiment.scoring import evaluate

    with pytest.raises(ValueError, match="split='train': choose 'validation' or 'test'"):
        evaluate("missing.pt", {"out_dir": "d", "val_data": "v"}, split="train")
    with pytest.raises(ValueError, match="written without a test split"):
        evaluate("missing.pt", {"out_dir": "d", "val_data": "v"}, split="test")


def test_the_b16_screen_changes_one_setting_of_the_package_default_each():
    base = decl_kwargs(O.objectives()["decl default"])
    default_lam = inspect.signature(DeCLLoss).parameters["lam"].default
    for name, settings in O.SCREEN16_VARIANTS.items():
        got = decl_kwargs(O.objectives()[name])
        changed = {k for k in set(base) | set(got) if base.get(k) != got.get(k)}
        # a constant or harmonic schedule reads lambda, spelled out (its default unless the variant sets it)
        assert changed - {"lam"} == set(settings) - {"lam"}, name
        assert got.get("lam", default_lam) == settings.get("lam", default_lam), name
    plan = study.load_plan(STUDIES / "testbed_screen16.toml").runs()
    assert plan[:2] == [("decl-default-b16", 0), ("clip-b16", 0)] and len(plan) == 2 + len(O.SCREEN16_VARIANTS)
    assert not set(O.SCREEN16_VARIANTS) & set(O.screen_objectives())


def test_code_checks_line_names_the_checked_commits_of_the_runs_only(tmp_path):
    def check(old, new, identical):
        return {
            "against": old,
            "identical": identical,
            "same_data": True,
            "objectives": {"clip": {"commits": [old, new], "identical": identical}},
        }

    doc = {
        "batch_size": 64,
        "seed": 0,
        "epochs": 2,
        "checks": [check("aaaaaaa111", "ccccccc333", True), check("bbbbbbb222", "ccccccc333", False)],
    }
    (tmp_path / "code_check.json").write_text(json.dumps(doc))
    line = R.code_checks_line(["aaaaaaa111"], tmp_path)
    assert "aaaaaaa111 and ccccccc333 train `clip` at B = 64, seed 0, 2 epochs to the same bits" in line
    assert "bbbbbbb222" not in line
    assert "**differently**: rerun the runs of bbbbbbb222" in R.code_checks_line(["bbbbbbb222"], tmp_path)
    assert R.code_checks_line(["ddddddd444"], tmp_path) == ""


def test_clearance_is_how_far_the_interval_lies_past_its_threshold():
    reach = {"kind": "reach", "gain": 0.04, "lo": -0.019, "hi": 0.01, "n": 5, "verdict": "reaches"}
    assert T.clearance(reach) == pytest.approx(0.001)  # threshold -0.02
    short = {**reach, "lo": -0.03, "hi": 0.01, "verdict": "no verdict"}
    assert T.clearance(short) == pytest.approx(-0.01)  # 1 point short of the threshold's upper side
    below = {**reach, "lo": -0.06, "hi": -0.05, "verdict": "does not reach"}
    assert T.clearance(below) == pytest.approx(0.03)
    beat = {"kind": "beat", "gain": 0.04, "lo": 0.005, "hi": 0.02, "n": 3, "verdict": "beats"}
    assert T.clearance(beat) == pytest.approx(0.005) and T.clearance({**beat, "n": 1}) is None
    assert B._cleared(reach) == ", the interval clearing it by 0.10 points" and B._cleared(short) == ""


# ------------------------------------------------------------------------------------------
# The dcl sweep: its plan, its rule and its report
# ------------------------------------------------------------------------------------------
DCL = O.DCL_SWEEP_VARIANTS[0]


def sweep_records(diffs_by_b, label=DCL):
    """clip at 0.30 and ``label`` at 0.30 + d on the test split, per batch size and seed (``diffs_by_b``)."""
    out = []
    for b, diffs in diffs_by_b.items():
        for s, d in enumerate(diffs):
            out += [scored("clip", b, s, 0.30), scored(label, b, s, 0.30 + d)]
    return out


def test_dcl_sweep_rows_pair_each_batch_with_clip_and_read_the_interval():
    rows = {
        r["batch_size"]: r
        for r in T.dcl_sweep_rows(sweep_records({16: [0.01, -0.01, 0.0], 64: [-0.05, -0.06, -0.04], 128: [0.02, 0.03]}))
    }
    assert rows[16]["reading"] == "within the seeds' noise" and rows[16]["test_r1"]["seeds"] == [0, 1, 2]
    assert rows[64]["reading"] == "trails" and rows[64]["test_r1"]["mean"] == pytest.approx(-0.05)
    assert rows[128]["reading"] == "no verdict"  # two seeds
    assert rows[16]["validation_r1"]["n"] == 3 and rows[16]["test_zeroshot"]["n"] == 0  # no zero-shot scored here


def test_the_dcl_rule_passes_a_setting_only_with_a_reading_at_every_size_and_none_trailing():
    ok = {b: [0.01, -0.01, 0.0] for b in O.DCL_SWEEP_SIZES}
    d = T.dcl_sweep_decision(T.dcl_sweep_rows(sweep_records(ok)), [])
    assert d["settings"][DCL]["passes"] and d["default"] == DCL
    short = dict(ok)
    short.pop(256)
    d = T.dcl_sweep_decision(T.dcl_sweep_rows(sweep_records(short)), [])
    assert not d["settings"][DCL]["passes"] and d["settings"][DCL]["missing"] == [256] and d["default"] is None
    bad = {**ok, 32: [-0.05, -0.06, -0.04]}
    d = T.dcl_sweep_decision(T.dcl_sweep_rows(sweep_records(bad)), [])
    assert d["settings"][DCL]["trails_at"] == [32] and d["default"] is None


def test_among_passing_settings_the_best_sampling_bias_zero_shot_is_the_default():
    ok = {b: [0.01, -0.01, 0.0] for b in O.DCL_SWEEP_SIZES}
    other = "dcl tau+ 0.021"
    rows = T.dcl_sweep_rows(sweep_records(ok) + sweep_records(ok, other), (DCL, other))
    bias = [{"label": T.bias_label(DCL), "mean": 0.01, "n": 3}, {"label": T.bias_label(other), "mean": 0.03, "n": 3}]
    assert T.bias_label(other) == "dcl tau+=0.021"
    assert T.dcl_sweep_decision(rows, bias, (DCL, other))["default"] == other
    bias[0]["mean"] = 0.05
    assert T.dcl_sweep_decision(rows, bias, (DCL, other))["default"] == DCL


def test_dcl_bias_rows_pair_each_objective_with_clip_by_seed(tmp_path):
    def run(seed, z):
        return {"seed": seed, "metrics": {"zeroshot/top1": z}}

    doc = {
        "data": {"config": {"num_classes": 10}},
        "true_tau_plus": 0.1,
        "complete": True,
        "runs": {"clip": [run(0, 0.50), run(1, 0.40)], "dcl tau+=0.01": [run(0, 0.55), run(1, 0.40), run(2, 0.9)]},
    }
    (tmp_path / T.DCL_BIAS_REPORTS[10]).write_text(json.dumps(doc))
    rows = T.dcl_bias_rows(tmp_path)
    assert len(rows) == 1 and rows[0]["classes"] == 10 and rows[0]["seeds"] == [0, 1]  # seed 2 has no clip
    assert rows[0]["diffs"] == pytest.approx([0.05, 0.0]) and rows[0]["label"] == "dcl tau+=0.01"
    assert T.dcl_bias_rows(tmp_path / "none") == []


def test_the_dcl_sweep_report_and_block_say_the_rules_verdict(tmp_path):
    data = {"config": {"num_classes": 48}, "tau_plus": 0.021}
    budget = ex.Budget(epochs=20, model=O.MODEL)
    trailing = {**{b: [0.01, -0.01, 0.0] for b in O.DCL_SWEEP_SIZES}, 256: [-0.2, -0.25, -0.22]}
    records = [{**r, "logit_scale": [], "val_r1": [], "train_seconds": 1.0} for r in sweep_records(trailing)]
    R.write_dcl_sweep(
        R.Inputs(tmp_path, records, len(records), data, budget, "cmd", datetime.now(timezone.utc), "dcl_sweep")
    )
    text = (tmp_path / "dcl_sweep.md").read_text()
    assert "fails: trails `clip` at B = 256" in text and "default stays `tau_plus` 0" in text
    assert "| `dcl tau+ 0.01` | 256 | 3 | s0 -20.0, s1 -25.0, s2 -22.0 |" in text
    doc = json.loads((tmp_path / "dcl_sweep.json").read_text())
    block = B.dcl_sweep_block(doc)
    assert "B = 256: -22.3 [" in block and "(3 seeds, trails)" in block
    assert "no setting passes at every batch size" in block
    partial = [r for r in records if r["batch_size"] != 16]
    R.write_dcl_sweep(
        R.Inputs(tmp_path, partial, len(records), data, budget, "cmd", datetime.now(timezone.utc), "partial")
    )
    assert "PARTIAL" in (tmp_path / "partial.md").read_text()


def screen16_records(variant_scores, default=0.20, seed=0):
    """The B = 16 screen's runs on the validation split: ``decl default`` and the variants given."""
    return [rec("decl default", 16, seed, default)] + [rec(n, 16, seed, v) for n, v in variant_scores.items()]


def test_the_b16_screens_best_is_chosen_on_the_validation_split_once_every_variant_has_run():
    names = list(O.SCREEN16_VARIANTS)
    partial = T.screen16_choice(screen16_records({names[0]: 0.25}))
    assert partial["best"] is None and partial["missing"] == names[1:]
    scores = {n: 0.19 for n in names} | {names[1]: 0.23}
    records = screen16_records(scores)
    records[1]["test_metrics"] = {T.MEAN_R1: 0.90}  # names[0]'s test-split score plays no part in the choice
    choice = T.screen16_choice(records)
    assert choice["best"] == names[1] and not choice["missing"] and choice["scores"]["decl default"] == 0.20
    assert T.screen16_choice(screen16_records({n: 0.19 for n in names}))["best"] == "decl default"
    assert T.screen16_choice(screen16_records(scores, seed=1), seed=0)["best"] is None  # another seed's screen


def test_the_readme_block_carries_the_b16_screen_and_its_best_on_the_test_split():
    doc = {"verdicts": T.verdicts([]), "runs": [], "confidence": T.CONFIDENCE, "status": "PARTIAL"}
    names = list(O.SCREEN16_VARIANTS)
    partial = {**T.screen16_choice(screen16_records({names[0]: 0.25})), "verdicts": []}
    block = B.readme_block({**doc, "screen16": partial})
    assert f"`{names[0]}` 25.0 (+5.0)" in block and "`decl default` 20.0," in block and "not yet run: `" in block
    records = screen16_records({n: 0.19 for n in names if n != names[1]})
    for s, d in enumerate([0.010, 0.005, 0.015]):  # names[1]'s seed-0 run scores 23.0 on the validation split
        records += [
            scored("clip", 16, s, 0.20),
            scored("clip", 32, s, 0.24),
            {**scored(names[1], 16, s, 0.24 + d), "metrics": {T.MEAN_R1: 0.23 if s == 0 else 0.5}},
        ]
    choice = T.screen16_choice(records)
    block = B.readme_block({**doc, "screen16": {**choice, "verdicts": T.screen16_rows(records, choice["best"])}})
    assert f"`{names[1]}` 23.0 (+3.0)" in block
    assert f"the best, `{names[1]}`, on the test split: decl@16 - clip@32 = +1.0 [" in block
    assert "decl@16 - clip@16 = +5.0 [" in block and ", beats." in block
    assert "not run yet" not in next(line for line in block.splitlines() if "B = 16 screen" in line)
    none = {**T.screen16_choice(screen16_records({n: 0.19 for n in names})), "verdicts": []}
    assert "no variant scores above the package default" in B.readme_block({**doc, "screen16": none})


# ------------------------------------------------------------------------------------------
# The stages' plans, a study's runs as the testbed's records, and today's reports again
# ------------------------------------------------------------------------------------------
def test_the_committed_plans_are_their_rendering_from_the_testbed_objectives():
    rendered = bs.plans()
    assert set(rendered) == {p.stem for p in STUDIES.glob("testbed_*.toml")}
    for name, text in rendered.items():
        assert (STUDIES / f"{name}.toml").read_text() == text, f"run `python benchmarks/batch_size.py plans` ({name})"
    sweep = study.load_plan(STUDIES / "testbed_sweep.toml")
    assert sweep.exploratory and sweep.recipe == "micro-bpe" and sweep.seeds == (0, 1, 2)
    names = O.objectives()
    for arm in sweep.arms:  # every arm's flags are its objective's, in full
        label = next(lab for lab in names if bs.arm_name(lab, dict(arm.overrides)["batch_size"]) == arm.name)
        assert arm.flags == tuple(names[label])


def test_the_decisive_plan_is_confirmatory_on_a_fresh_draw_and_fresh_seeds(capsys):
    plan = study.load_plan(STUDIES / "testbed_decisive.toml")
    assert not plan.exploratory and plan.split == "test"
    used = {r["seed"] for stem in bs.REPORTS for r in json.loads((O.RESULTS / f"{stem}.json").read_text())["runs"]}
    assert not set(plan.seeds) & used
    draws = {json.loads((O.RESULTS / f"{stem}.json").read_text())["data"]["seed"] for stem in bs.REPORTS}
    assert plan.data["command"][-2:] == ["--seed", str(bs.FRESH_DRAW)] and bs.FRESH_DRAW not in draws
    # the margins: half of clip's gain from B to 2B over the validation sweep's seeds, fixed in the plan
    archive = json.loads(O.ARCHIVE.read_text())["runs"]
    for c in (c for c in plan.comparisons if c.rule == "reaches"):
        b = int(c.a.rsplit("-b", 1)[1])
        r1 = {(r["label"], r["batch_size"], r["seed"]): r["metrics"][T.MEAN_R1] for r in archive}
        gains = [r1[("clip", 2 * b, s)] - r1[("clip", b, s)] for s in (0, 1, 2)]
        assert c.margin == pytest.approx(sum(gains) / 6, abs=1e-4)
    from clip_dcl.experiment.study.cli import check

    assert check(plan) == 0  # its seeds give each reach the plan's power
    assert "TOO FEW" not in capsys.readouterr().out


def test_verdicts_of_todays_report_come_again_from_its_runs():
    doc = json.loads((O.RESULTS / "batch_size.json").read_text())
    again = T.verdicts(doc["runs"], O.archived_runs(doc["data"]))
    assert [(r["kind"], r["split"], r["batch_size"], r["n"], r["verdict"]) for r in again] == [
        (r["kind"], r["split"], r["batch_size"], r["n"], r["verdict"]) for r in doc["verdicts"]
    ]
    assert [r["mean"] for r in again] == pytest.approx([r["mean"] for r in doc["verdicts"]])


@pytest.mark.slow
def test_todays_reports_regenerate_from_their_json_with_equal_verdicts(tmp_path):
    written = bs.regenerate(tmp_path)
    assert set(written) == set(bs.REPORTS)
    for stem, doc in written.items():
        committed = json.loads((O.RESULTS / f"{stem}.json").read_text())
        assert bs.same_verdicts(doc, committed), stem

    # the main report is the committed one but for the date line
    def body(path):
        return [x for x in path.read_text().splitlines() if not x.startswith("- Date (UTC)")]

    assert body(tmp_path / "batch_size.md") == body(O.RESULTS / "batch_size.md")
    changed = json.loads(json.dumps(written["batch_size"]))
    changed["verdicts"][2]["verdict"] = "reaches"
    assert not bs.same_verdicts(changed, json.loads((O.RESULTS / "batch_size.json").read_text()))


def test_a_studys_runs_become_the_testbed_reports_records(tmp_path):
    plan = study.load_plan(STUDIES / "testbed_second_draw.toml")
    work = tmp_path / "work"
    study.seal(plan, work)
    data = study.work.data_dir(work)
    data.mkdir(parents=True)
    cfg = json.loads((O.RESULTS / "batch_size_draw1.json").read_text())["data"]
    (data / "summary.json").write_text(json.dumps({"config": cfg, "tau_plus": 0.021}))
    r1 = {"clip-b32": 0.30, "decl-default-b32": 0.345, "clip-b64": 0.34}
    for arm, seed in plan.runs():
        folder = study.work.run_dir(work, arm, seed)
        (folder / "checkpoints").mkdir(parents=True)
        v = r1[arm] + seed / 1000
        for split in ("validation", "test"):
            (folder / f"scores-{split}.json").write_text(json.dumps({T.MEAN_R1: v, "zeroshot/top1": 0.1}))
        (folder / "run.json").write_text(
            json.dumps(
                {
                    "arm": arm,
                    "seed": seed,
                    "recipe": "micro-bpe",
                    "commit": "abc",
                    "hardware": "x",
                    "ended": "2030-01-01 00:00:00",
                }
            )
        )
        steps = [
            {"kind": "train", "epoch": e, "logit_scale": 10 + e + last / 2, "loss": 1}
            for e in range(3)
            for last in (0, 1)
        ]
        val = {"kind": "val", "epoch": 1, "image_to_text_R@1": 0.2, "text_to_image_R@1": 0.4}
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*steps, val]))
    recs = bs.records_of(STUDIES / "testbed_second_draw.toml", work)
    decl = next(r for r in recs if r["label"] == "decl default" and r["seed"] == 1)
    assert (decl["batch_size"], decl["test_metrics"][T.MEAN_R1]) == (32, pytest.approx(0.346))
    assert decl["logit_scale"] == [10.5, 11.5, 12.5] and decl["val_r1"] == [pytest.approx(0.3)]
    md = bs.report("testbed_second_draw", work, tmp_path / "out").read_text()
    assert "| 32 | clip at 64 | test | 3 | s0 +0.5, s1 +0.5, s2 +0.5 |" in md and "**reaches**" in md
    # an unfinished study gives no test-split scores to the report
    (study.work.run_dir(work, "clip-b64", 2) / "run.json").unlink()
    assert all(r["test_metrics"] is None for r in bs.records_of(STUDIES / "testbed_second_draw.toml", work))


def test_each_stages_lines_are_training_commands_of_the_recipe(tmp_path):
    from open_clip_train.params import parse_args as openclip_args

    from clip_dcl.experiment.study.lines import train_argv

    splits = {"validation": "/v.tar", "test": "/t.tar"}
    shards = study.work.data_dir(tmp_path) / "train"  # what decl's per-sample buffer is sized by
    shards.mkdir(parents=True)
    (shards / "sizes.json").write_text(json.dumps({f"{i:05d}.tar": 1500 for i in range(8)}))
    seen = set()
    for path in sorted(STUDIES.glob("testbed_*.toml")):
        plan = study.load_plan(path)
        for arm in plan.arms:
            if arm.name in seen:  # the same objective at the same batch in another stage: the same command
                continue
            seen.add(arm.name)
            argv = train_argv(plan, tmp_path, splits, arm.name, plan.seeds[0])
            words = argv[argv.index("--") + 1 :]
            cfg = parse_train_args(words, check_files=False)  # clip-dcl's and the loss's flags are valid
            assert cfg.loss == arm.flags[1]
            got = openclip_args(cfg.openclip_argv)
            assert (got.model, got.batch_size, got.epochs, got.seed) == (
                "clip-dcl-micro",
                dict(arm.overrides)["batch_size"],
                20,
                plan.seeds[0],
            ), path.name
            assert words[-len(arm.flags) - 2 : -2] == list(arm.flags) and words[-2:] == ["--resume", "latest"]
            assert got.train_data.startswith(str(study.work.data_dir(tmp_path))) and got.resume == "latest"
