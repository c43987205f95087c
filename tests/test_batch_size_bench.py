"""The batch-size testbed's pure pieces: variants built from the registry, the gate, the plateau, pairing."""
from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import batch_size as bs  # noqa: E402

from clip_dcl.losses import DeCLLoss  # noqa: E402
from clip_dcl.train.flags import LOSS_FLAGS, build_parser, parse_train_args  # noqa: E402


def decl_kwargs(flags):
    """The decl keyword arguments a variant's flags set."""
    ours = vars(build_parser().parse_known_args(list(flags))[0])
    return {LOSS_FLAGS[d][1]: v for d, v in ours.items() if d in LOSS_FLAGS and v is not None}


def test_default_variant_is_the_package_default():
    defaults = {p.name: p.default for p in inspect.signature(DeCLLoss).parameters.values()
                if p.default is not inspect.Parameter.empty}
    got = decl_kwargs(bs.objectives()["decl default"])
    for kwarg, value in got.items():
        if kwarg == "include_current":  # None: the loss resolves it to update-then-read for rate index
            assert defaults[kwarg] is None and value is True and DeCLLoss(num_samples=2).include_current
        else:
            assert defaults[kwarg] == value, kwarg
    assert got["rate"] == "index"


def test_each_variant_changes_one_setting_of_the_screens_base():
    default = decl_kwargs(bs.objectives()["decl default"])
    base = decl_kwargs(bs.objectives()["decl absolute"])  # the package default when the screen ran
    assert {k for k in default if default[k] != base[k]} == {"estimate"}
    assert base["estimate"] == "absolute" and default["estimate"] == "relative"
    assert len({bs.objectives()[name] for name in bs.DECL_VARIANTS}) == len(bs.DECL_VARIANTS)  # no two alike
    for name, settings in bs.DECL_VARIANTS.items():
        got = decl_kwargs(bs.objectives()[name])
        changed = {k for k in set(base) | set(got) if base.get(k) != got.get(k)}
        if name in ("decl default", "decl absolute"):
            continue
        elif name.startswith("decl FastCLIP gamma"):  # the schedule and its final value
            assert changed == {"gamma_schedule", "gamma"}
        elif settings.get("rate") in ("queue", "batch"):  # the rate, and the index-only settings it drops
            assert "rate" in changed and all(k in ("rate", "queue_size", "include_current", "gamma",
                                                   "gamma_schedule", "first_visit", "drift_correction", "state",
                                                   "state_dtype") for k in changed), (name, changed)
        else:
            assert changed == set(settings) - set(bs.SCREEN_BASE), (name, changed)


def test_every_objective_is_a_valid_training_command(tmp_path):
    for name, flags in bs.objectives().items():
        cfg = parse_train_args(["--dataset-type", "synthetic", "--train-num-samples", "64", *flags],
                               check_files=False)
        assert cfg.loss == flags[1], name


def test_the_sweep_variants_are_decl_objectives_with_the_default_among_them():
    assert "decl default" in bs.SWEEP_VARIANTS
    assert all(list(bs.objectives()[name][:2]) == ["--loss", "decl"] for name in bs.SWEEP_VARIANTS)


def test_loss_flags_refuse_unknown_settings():
    with pytest.raises(ValueError, match="gamma_min"):
        bs.loss_flags("decl", gamma_min=0.1)


def rec(label, b, seed, r1, val=None):
    return {"label": label, "batch_size": b, "seed": seed, "metrics": {bs.MEAN_R1: r1}, "val_r1": val or [],
            "logit_scale": [], "train_seconds": 0.0}


def test_gate_needs_three_points_three_seeds_and_separate_ranges():
    sizes = [16, 512]
    lo = [rec("clip", 16, s, v) for s, v in enumerate([0.20, 0.22, 0.21])]
    assert bs.gate(lo + [rec("clip", 512, s, v) for s, v in enumerate([0.25, 0.26, 0.24])], sizes)["passed"]
    overlap = bs.gate(lo + [rec("clip", 512, s, v) for s, v in enumerate([0.30, 0.30, 0.215])], sizes)
    assert overlap["gain"] > 0.03 and not overlap["separate"] and not overlap["passed"]
    small = bs.gate(lo + [rec("clip", 512, s, v) for s, v in enumerate([0.23, 0.23, 0.23])], sizes)
    assert small["separate"] and not small["passed"]
    two_seeds = bs.gate(lo[:2] + [rec("clip", 512, s, 0.3) for s in range(2)], sizes)
    assert not two_seeds["passed"]
    assert bs.gate(lo, sizes) is None


def test_plateau_is_the_change_over_the_last_fifth():
    assert bs.plateau([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.91]) == pytest.approx(1.0)
    assert bs.plateau([0.1, 0.2]) is None


def test_paired_differences_against_clip_at_the_same_and_twice_the_batch():
    records = [rec("clip", 16, 0, 0.20), rec("clip", 16, 1, 0.22), rec("clip", 32, 0, 0.25), rec("clip", 32, 1, 0.27),
               rec("decl default", 16, 0, 0.26), rec("decl default", 16, 1, 0.26)]
    same = bs.paired(records, "clip")
    assert "| decl default | 16 | clip at 16 | s0 +6.0, s1 +4.0 | **+5.0** | 2 of 2 |" in same
    double = bs.paired(records, "clip", same_b=False)
    assert "| decl default | 16 | clip at 32 | s0 +1.0, s1 -1.0 | **+0.0** | 1 of 2 |" in double
    # the DeCL variants against the screen's base: only decl variants, paired by seed
    records += [rec("decl absolute", 16, 0, 0.27), rec("decl absolute", 16, 1, 0.25), rec("dcl tau+ 0.05", 16, 0, 0.3)]
    variants = bs.paired(records, "decl absolute", prefix="decl ")
    assert variants.count("\n") == 2  # header, rule, one row
    assert "| decl default | 16 | decl absolute at 16 | s0 -1.0, s1 +1.0 | **+0.0** | 1 of 2 |" in variants


def test_progress_counts_the_screen_and_the_sweep_from_the_finished_runs():
    sizes = [16, 32, 512]
    gate = [rec("clip", b, s, 0.2 + b / 10000) for b in sizes for s in range(3)]
    others = [lab for lab in bs.screen_objectives() if lab != "clip"]
    line = bs.progress(gate, sizes)
    assert line.startswith("gate passed") and f"screen 0 of {2 * len(others)} runs" in line
    assert "sweep: 0 runs beyond the screen" in line and "complete for" not in line
    screened = gate + [rec(lab, b, 0, 0.2) for lab in others for b in bs.SCREEN_BATCH_SIZES]
    assert f"screen {2 * len(others)} of {2 * len(others)} runs;" in bs.progress(screened, sizes)
    one_short = screened[:-1]
    assert f"(not yet: {others[-1]})" in bs.progress(one_short, sizes)
    # the default at every batch below the largest with 3 seeds: 16 at seeds 1, 2 and 32 at 0, 1, 2 are new
    swept = screened + [rec("decl default", b, s, 0.2) for b in (16, 32) for s in range(3)]
    line = bs.progress(swept, sizes)
    assert "sweep: 5 runs beyond the screen, complete for decl default" in line
    assert not bs.progress(gate[:3], sizes).startswith("gate passed")


def test_planned_runs_of_the_gate_screen_and_sweep():
    sizes = [16, 64, 512]
    others = [lab for lab in bs.screen_objectives() if lab != "clip"]
    plan = bs.planned_runs(("gate", "screen", "sweep"), sizes)
    assert len(plan) == len(set(plan))
    assert [j for j in plan if j[0] == "clip"] == [("clip", b, s) for s in range(3) for b in sizes]
    assert {j for j in plan if j[0] == "dcl tau+ 0.05"} == {("dcl tau+ 0.05", b, s) for b in (16, 64) for s in range(3)}
    assert ("decl batch", 512, 0) not in plan and ("decl batch", 64, 2) in plan
    assert {j for j in plan if j[0] == "decl queue"} == {("decl queue", 16, 0), ("decl queue", 64, 0)}
    # the gate, the screen, then the sweep's runs beyond the screen's seed 0
    assert len(plan) == 9 + 2 * len(others) + (1 + len(bs.SWEEP_VARIANTS)) * 2 * 2
    assert bs.planned_runs(["screen"], sizes, screen_variants=["decl batch"]) == [("decl batch", 16, 0),
                                                                               ("decl batch", 64, 0)]


def test_bad_arguments_stop_before_any_work(tmp_path):
    with pytest.raises(SystemExit, match="unknown objective 'nope'"):
        bs.main(["--variants", "nope", "--work", str(tmp_path)])
    with pytest.raises(SystemExit, match="--jobs"):
        bs.main(["--jobs", "0", "--work", str(tmp_path)])
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------------------------------
# The decision rule, the decisive stage and the docs' generated verdicts
# ------------------------------------------------------------------------------------------
def scored(label, b, seed, r1):
    """A finished run scored on both splits (the test split's score is ``r1``, the validation one 0)."""
    return {**rec(label, b, seed, 0.0), "test_metrics": {bs.MEAN_R1: r1}}


def test_t_interval_is_the_students_t_interval_of_the_mean():
    st = bs.t_interval([0.01, 0.02, 0.03])
    # mean 0.02, sample std 0.01, t(0.95; 2 dof) = 2.919986
    assert st["mean"] == pytest.approx(0.02)
    assert st["hi"] - st["mean"] == pytest.approx(2.919986 * 0.01 / 3 ** 0.5, rel=1e-5)
    assert st["lo"] == pytest.approx(2 * st["mean"] - st["hi"])
    assert bs.t_interval([0.01])["n"] == 1


def reach_records(decl_minus_2b, gain=0.04, b=32):
    out = []
    for s, d in enumerate(decl_minus_2b):
        out += [scored("clip", b, s, 0.30), scored("clip", 2 * b, s, 0.30 + gain),
                scored("decl default", b, s, 0.30 + gain + d)]
    return out


def test_reach_verdict_against_minus_half_of_clips_gain():
    # gain 4 points: the threshold is -2; an interval above it reaches, below it does not, across it is open
    reaches = bs.comparison(reach_records([0.000, 0.005, -0.005]), "decl default", 32, 64)
    assert reaches["gain"] == pytest.approx(0.04) and bs.reach_verdict(reaches) == "reaches"
    short = bs.comparison(reach_records([-0.040, -0.045, -0.035]), "decl default", 32, 64)
    assert bs.reach_verdict(short) == "does not reach"
    wide = bs.comparison(reach_records([0.03, -0.05, 0.00]), "decl default", 32, 64)
    assert bs.reach_verdict(wide) == "no verdict"
    two_seeds = bs.comparison(reach_records([0.000, 0.001]), "decl default", 32, 64)
    assert bs.reach_verdict(two_seeds) == "no verdict"  # below MIN_SEEDS whatever the interval


def test_beat_verdict_a_difference_inside_the_resolution_is_a_tie():
    def beat(diffs):
        recs = reach_records(diffs, gain=0.0)  # clip at 2B = clip at B: decl - clip at 2B is decl - clip at B
        return bs.beat_verdict(bs.comparison(recs, "decl default", 32, 32))
    assert beat([0.05, 0.06, 0.04]) == "beats"
    assert beat([0.005, 0.006, 0.004]) == "tie"  # interval above zero, mean half a point: never a win
    assert beat([-0.05, -0.06, -0.04]) == "trails"
    assert beat([0.05, -0.06, 0.05]) == "no verdict"
    assert beat([0.001, -0.002, 0.001]) == "no verdict"  # inside the resolution but not known to be: open


def test_decisive_runs_add_seeds_only_while_a_verdict_is_missing():
    plan = bs.decisive_runs((32, 64), seeds=(0, 1))
    assert plan[:5] == [("clip", 32, 0), ("decl default", 32, 0), ("clip", 64, 0), ("decl default", 64, 0),
                        ("clip", 128, 0)]  # clip at 64 serves both batch sizes, once
    assert len(plan) == 10
    records = reach_records([0.000, 0.005, -0.005])  # B = 32 decided (reaches), B = 64 not run
    assert bs.decided(records, 32) and not bs.decided(records, 64)
    assert not bs.needed(("decl default", 32, 3), records) and not bs.needed(("clip", 32, 3), records)
    assert bs.needed(("clip", 64, 3), records)  # still serves B = 64
    assert bs.needed(("decl default", 64, 3), records) and bs.needed(("clip", 128, 3), records)
    capped = reach_records([0.03, -0.05, 0.00, 0.03, -0.05, 0.00, 0.03, -0.05, 0.00, 0.01])
    assert bs.reach_verdict(bs.comparison(capped, "decl default", 32, 64)) == "no verdict"
    assert bs.decided(capped, 32)  # the cap of 10 seeds


def test_verdicts_are_the_test_splits_and_the_validation_split_is_context_beside_them():
    archived = [{**rec(lab, b, s, v), "split": "validation"} for s in range(3)
                for lab, b, v in (("clip", 16, 0.20), ("clip", 32, 0.28), ("decl default", 16, 0.17 + s / 1000))]
    rows = bs.verdicts(reach_records([0.000, 0.005, -0.005]), archived)
    by = {(r["batch_size"], r["kind"], r["split"]): r for r in rows}
    assert by[(16, "reach", "test")]["n"] == 0 and by[(16, "reach", "test")]["verdict"] == "no verdict"
    assert by[(16, "reach", "validation")]["verdict"] == "does not reach"  # computed, shown as context
    assert by[(32, "reach", "test")]["verdict"] == "reaches" and (32, "reach", "validation") not in by
    table = bs.verdict_table(rows)
    assert "| 16 | clip at 32 | validation | 3 |" in table and "none (the rule would read: does not reach)" in table
    assert "| 32 | clip at 64 | test | 3 |" in table and "**reaches**" in table
    assert bs.decisive_status(rows) == ("B = 16: no verdict (0 test-split seeds); B = 32: reaches (3 test-split "
                                        "seeds); B = 64: no verdict (0 test-split seeds)")


def test_the_readme_block_is_built_from_the_reports_verdicts():
    """(tests/test_quoted_numbers.py compares the docs' block with the committed JSON.)"""
    rows = bs.verdicts(reach_records([0.000, 0.005, -0.005]))
    doc = {"verdicts": rows, "runs": [], "status": "PARTIAL", "confidence": bs.CONFIDENCE}
    block = bs.readme_block(doc)
    assert "**B = 32: `decl` reaches `clip` at 64** (test split, 3 seeds): decl@32 - clip@64 = +0.0 [" in block
    assert "(per seed +0.0, +0.5, -0.5)" in block
    assert "**B = 16: no test-split runs yet.**" in block and "not run yet" in block.split("Temperature controls")[1]
    changed = json.loads(json.dumps(doc))
    changed["verdicts"][2]["mean"] += 0.05
    assert bs.readme_block(changed) != block


def test_each_dcl_variant_changes_only_its_settings_of_the_screens_base():
    base = decl_kwargs(bs.loss_flags("dcl", **bs.DCL_SCREEN_BASE))
    assert decl_kwargs(bs.objectives()["dcl default"]) == base
    for name, settings in bs.DCL_VARIANTS.items():
        got = decl_kwargs(bs.objectives()[name])
        assert {k for k in set(base) | set(got) if base.get(k) != got.get(k)} == set(settings), name
    assert "dcl top" not in bs.screen_objectives() and ("dcl top", 64, 0) in bs.planned_runs(["dcl-screen"])


def test_control_leads_pair_each_comparisons_arms_by_seed_on_the_test_split():
    arms = {"clip": 0.30, "decl default": 0.36, "clip at decl's scale (B=32)": 0.33, "decl at clip's scale (B=32)": 0.31}
    records = [scored(lab, 32, s, v + s / 100) for s in range(2) for lab, v in arms.items()]
    records.append(scored("clip at decl's scale (B=32)", 32, 2, 0.5))  # seed 2 lacks the other arms: left out
    lead = bs.control_leads(records)[32]
    assert lead["decl - clip"]["seeds"] == [0, 1] and lead["decl - clip"]["mean"] == pytest.approx(0.06)
    assert lead["decl - clip at decl scale"]["mean"] == pytest.approx(0.03)
    assert lead["decl at clip scale - clip"]["mean"] == pytest.approx(0.01)
    assert lead["clip at decl scale - clip"]["mean"] == pytest.approx(0.03)
    assert 64 not in bs.control_leads(records)
    block = bs.readme_block({"verdicts": bs.verdicts(records), "runs": records, "status": "x",
                             "confidence": bs.CONFIDENCE})
    assert ("**Temperature controls at B = 32** (test split, paired by seed; verdicts by the rule's beats / trails / "
            "tie): `decl`'s lead over `clip`: +6.0 [+6.0, +6.0] (per seed +6.0, +6.0), no verdict (seeds 0, 1)") in block
    assert lead["decl - clip"]["verdict"] == "no verdict"  # 2 seeds: below the rule's 3
    # one control with a seed more than the other: each comparison over the seeds both of its arms have
    more = records + [scored(lab, 32, 2, arms[lab] + 0.02) for lab in ("clip", "decl default")]
    lead = bs.control_leads(more)[32]
    assert lead["clip at decl scale - clip"]["seeds"] == [0, 1, 2] and lead["decl - clip"]["seeds"] == [0, 1, 2]
    assert lead["decl at clip scale - clip"]["seeds"] == [0, 1]
    assert 32 not in bs.control_leads([r for r in more if "scale" not in r["label"]])  # no control: no row


def test_controls_carry_the_rules_verdict_once_three_seeds_agree():
    arms = {"clip": 0.30, "decl default": 0.36, "clip at decl's scale (B=32)": 0.355, "decl at clip's scale (B=32)": 0.30}
    jitter = {0: 0.0, 1: 0.004, 2: -0.003}  # each arm moves alike per seed: paired differences barely spread
    records = [scored(lab, 32, s, v + jitter[s] + (0.001 * s if lab == "decl default" else 0.0))
               for s in range(3) for lab, v in arms.items()]
    lead = bs.control_leads(records)[32]
    assert lead["decl - clip"]["verdict"] == "beats"
    assert lead["clip at decl scale - clip"]["verdict"] == "beats"
    assert lead["decl - clip at decl scale"]["verdict"] == "tie"  # +0.6 point: inside the resolution
    assert lead["decl at clip scale - clip"]["verdict"] == "no verdict"  # 0 on every seed: the interval holds zero
    table = bs.controls_table(records)
    assert "| clip at decl's scale (B=32) | clip at 32 | 3 | s0 +5.5, s1 +5.5, s2 +5.5 | +5.5 | [+5.5, +5.5] | beats |" in table
    which = bs.which_loss_block({"verdicts": bs.verdicts(records), "runs": records, "confidence": bs.CONFIDENCE})
    assert "- InfoNCE trained at `decl`'s final temperature - `clip`, B = 32, test split: +5.5 [+5.5, +5.5] (3 seeds, beats)." in which
    assert "- `decl` - InfoNCE trained at `decl`'s final temperature, B = 32, test split: +0.6" in which


def test_dcl_package_default_is_the_bare_loss_flag_planned_beside_clip_at_its_batch():
    assert bs.objectives()[bs.DCL_DEFAULT] == ("--loss", "dcl")
    assert bs.DCL_DEFAULT not in bs.screen_objectives()
    plan = bs.planned_runs(["dcl-default"], seeds=(0, 1))
    assert plan == [(bs.DCL_DEFAULT, 64, 0), ("clip", 64, 0), (bs.DCL_DEFAULT, 64, 1), ("clip", 64, 1)]


def test_dcl_default_rows_read_the_paired_interval_against_zero():
    def rows(diffs):
        records = [scored("clip", 64, s, 0.30) for s in range(len(diffs))]
        records += [scored(bs.DCL_DEFAULT, 64, s, 0.30 + d) for s, d in enumerate(diffs)]
        return {r["split"]: r for r in bs.dcl_default_rows(records)}
    noise = rows([0.01, -0.01, 0.004])["test"]
    assert noise["seeds"] == [0, 1, 2] and noise["verdict"] == "within the seeds' noise"
    assert noise["mean"] == pytest.approx(0.004 / 3)
    assert rows([-0.05, -0.06, -0.04])["test"]["verdict"] == "trails"
    assert rows([0.05, 0.06, 0.04])["test"]["verdict"] == "above"
    assert rows([-0.05, -0.06])["test"]["verdict"] == "no verdict"  # below MIN_SEEDS
    assert rows([0.0, 0.0, 0.0])["validation"]["n"] == 3  # the validation scores (0 here) pair the same way
    table = bs.dcl_default_table(list(rows([-0.05, -0.06, -0.04]).values()))
    assert "| test | 3 | s0 -5.0, s1 -6.0, s2 -4.0 | -5.0 |" in table and "| trails |" in table
    block = bs.dcl_default_block({"dcl_default": list(rows([0.01, -0.01, 0.004]).values())})
    assert "test split, 3 seeds: retrieval mean R@1 +0.13 points [" in block and "within the seeds' noise" in block
    assert "no test-split runs yet" in bs.dcl_default_block({"dcl_default": []})


def test_another_draw_of_the_data_gets_its_own_folder_and_its_verdicts_beside_draw_0(tmp_path):
    assert bs.data_dir(tmp_path) == tmp_path / "data" and bs.data_dir(tmp_path, 1) == tmp_path / "data-seed1"
    rows = bs.draw_rows({1: reach_records([0.000, 0.005, -0.005])})
    reach = [r for r in rows if r["kind"] == "reach"]
    assert [(r["data_seed"], r["batch_size"], r["verdict"]) for r in reach] == [(1, 32, "reaches")]
    doc = {"verdicts": bs.verdicts([]), "runs": [], "status": "x", "confidence": bs.CONFIDENCE, "draws": rows}
    assert "**Another draw of the data** (`--seed 1`, B = 32, test split, 3 seeds)" in bs.readme_block(doc)
    assert "holds on one draw" in bs.readme_block({**doc, "draws": []})
    which = bs.which_loss_block(doc)
    assert "- The same on another draw of the data (`--seed 1`: other training, validation and test images), `decl` " \
           "at 32 - `clip` at 64, test split: +0.0 [-0.8, +0.8] against a threshold of " in which
    assert "(3 seeds, reaches, the interval clearing it by " in which
    assert "another draw" not in bs.which_loss_block({**doc, "draws": []})


def test_a_negative_data_seed_stops_before_any_work(tmp_path):
    with pytest.raises(SystemExit, match="--data-seed must be >= 0, got -1"):
        bs.main(["--data-seed", "-1", "--work", str(tmp_path), "--report-only"])
    assert not any(tmp_path.iterdir())


def test_which_loss_numbers_come_from_the_verdicts_the_dcl_check_and_the_screens():
    records = reach_records([0.000, 0.005, -0.005], gain=0.0)  # decl@32 - clip@32 = decl@32 - clip@64 here
    records += [scored(bs.DCL_DEFAULT, 64, s, 0.30) for s in range(3)] + [scored("clip", 64, s, 0.30) for s in range(3)]
    doc = {"verdicts": bs.verdicts(records), "runs": records, "confidence": bs.CONFIDENCE,
           "dcl_default": bs.dcl_default_rows(records)}
    block = bs.which_loss_block(doc)
    assert "- `decl` - `clip` at the same batch, retrieval mean R@1, test split: B = 32: +0.0 [" in block
    assert "(3 seeds, no verdict)" in block
    assert ("minus half of `clip`'s gain from B to 2B), retrieval mean R@1, test split: B = 32: +0.0 [-0.8, +0.8] "
            "against a threshold of +0.0 (3 seeds, no verdict).") in block
    assert "- `--loss dcl` at its defaults - `clip`, B = 64, retrieval mean R@1, test split: +0.00 [+0.00, +0.00] " \
           "(3 seeds, within the seeds' noise)." in block
    empty = bs.which_loss_block({"verdicts": bs.verdicts([]), "runs": [], "confidence": bs.CONFIDENCE})
    assert "no test-split runs yet" in empty and "--loss dcl` at its defaults" not in empty


def test_scoring_refuses_an_unknown_split_and_a_test_split_the_data_lack():
    from clip_dcl.experiment.scoring import evaluate
    with pytest.raises(ValueError, match="split='train': choose 'validation' or 'test'"):
        evaluate("missing.pt", {"out_dir": "d", "val_data": "v"}, split="train")
    with pytest.raises(ValueError, match="written without a test split"):
        evaluate("missing.pt", {"out_dir": "d", "val_data": "v"}, split="test")


def test_the_b16_screen_changes_one_setting_of_the_package_default_each():
    base = decl_kwargs(bs.objectives()["decl default"])
    default_lam = inspect.signature(DeCLLoss).parameters["lam"].default
    for name, settings in bs.SCREEN16_VARIANTS.items():
        got = decl_kwargs(bs.objectives()[name])
        changed = {k for k in set(base) | set(got) if base.get(k) != got.get(k)}
        # a constant or harmonic schedule reads lambda, spelled out (its default unless the variant sets it)
        assert changed - {"lam"} == set(settings) - {"lam"}, name
        assert got.get("lam", default_lam) == settings.get("lam", default_lam), name
    plan = bs.planned_runs(["screen16"])
    assert plan[:2] == [("decl default", 16, 0), ("clip", 16, 0)] and len(plan) == 2 + len(bs.SCREEN16_VARIANTS)
    assert not set(bs.SCREEN16_VARIANTS) & set(bs.screen_objectives())


def test_restore_cache_makes_a_reports_runs_reused_and_skips_a_report_of_other_data(tmp_path, monkeypatch):
    data = {"config": {"seed": 0, "num_classes": 48}}
    budget = bs.ex.Budget(epochs=2, lr=1e-3, wd=0.1, warmup=5, model=bs.MODEL)
    run = {**rec("clip", 32, 1, 0.25), "flags": ["--loss", "clip"], "epochs": 2, "source": "trained", "split": "test"}
    report = tmp_path / "report.json"
    doc = {"data": data["config"], "budget": bs.dataclasses.asdict(budget), "runs": [run]}
    report.write_text(json.dumps(doc))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**doc, "data": {"seed": 1, "num_classes": 48}}))
    assert bs.restore_cache([other], tmp_path, data, budget) == 0
    assert bs.restore_cache([report], tmp_path, data, budget) == 1
    assert bs.restore_cache([report], tmp_path, data, budget) == 0  # already cached: left alone
    monkeypatch.setattr(bs.ex, "train", lambda *a, **k: pytest.fail("a restored run was retrained"))
    got = bs.run_one("clip", ("--loss", "clip"), data, bs.dataclasses.replace(budget, batch_size=32, seed=1),
                     tmp_path, threads=1)
    assert got["source"] == "reused" and got["metrics"] == run["metrics"] and "split" not in got
    # another seed of the same objective is not in the report: it would train
    with pytest.raises(pytest.fail.Exception):
        bs.run_one("clip", ("--loss", "clip"), data, bs.dataclasses.replace(budget, batch_size=32, seed=2),
                   tmp_path, threads=1)
    assert [r["label"] for r in bs.finished_runs(tmp_path, data, budget)] == ["clip"]


def test_code_checks_line_names_the_checked_commits_of_the_runs_only(tmp_path):
    def check(old, new, identical):
        return {"against": old, "identical": identical, "same_data": True,
                "objectives": {"clip": {"commits": [old, new], "identical": identical}}}
    doc = {"batch_size": 64, "seed": 0, "epochs": 2,
           "checks": [check("aaaaaaa111", "ccccccc333", True), check("bbbbbbb222", "ccccccc333", False)]}
    (tmp_path / "code_check.json").write_text(json.dumps(doc))
    line = bs.code_checks_line(["aaaaaaa111"], tmp_path)
    assert "aaaaaaa111 and ccccccc333 train `clip` at B = 64, seed 0, 2 epochs to the same bits" in line
    assert "bbbbbbb222" not in line
    assert "**differently**: rerun the runs of bbbbbbb222" in bs.code_checks_line(["bbbbbbb222"], tmp_path)
    assert bs.code_checks_line(["ddddddd444"], tmp_path) == ""


def test_clearance_is_how_far_the_interval_lies_past_its_threshold():
    reach = {"kind": "reach", "gain": 0.04, "lo": -0.019, "hi": 0.01, "n": 5, "verdict": "reaches"}
    assert bs.clearance(reach) == pytest.approx(0.001)  # threshold -0.02
    short = {**reach, "lo": -0.03, "hi": 0.01, "verdict": "no verdict"}
    assert bs.clearance(short) == pytest.approx(-0.01)  # 1 point short of the threshold's upper side
    below = {**reach, "lo": -0.06, "hi": -0.05, "verdict": "does not reach"}
    assert bs.clearance(below) == pytest.approx(0.03)
    beat = {"kind": "beat", "gain": 0.04, "lo": 0.005, "hi": 0.02, "n": 3, "verdict": "beats"}
    assert bs.clearance(beat) == pytest.approx(0.005) and bs.clearance({**beat, "n": 1}) is None
    assert bs._cleared(reach) == ", the interval clearing it by 0.10 points" and bs._cleared(short) == ""


# ------------------------------------------------------------------------------------------
# The dcl sweep: its plan, its rule and its report
# ------------------------------------------------------------------------------------------
DCL = bs.DCL_SWEEP_VARIANTS[0]


def sweep_records(diffs_by_b, label=DCL):
    """clip at 0.30 and ``label`` at 0.30 + d on the test split, per batch size and seed (``diffs_by_b``)."""
    out = []
    for b, diffs in diffs_by_b.items():
        for s, d in enumerate(diffs):
            out += [scored("clip", b, s, 0.30), scored(label, b, s, 0.30 + d)]
    return out


def test_the_dcl_sweep_plans_its_settings_beside_clip_largest_batch_first():
    plan = bs.planned_runs(["dcl-sweep"], sizes=(16, 256), seeds=(0, 1), dcl_sweep_variants=("dcl tau+ 0.01",))
    assert plan == [("dcl tau+ 0.01", 256, 0), ("clip", 256, 0), ("dcl tau+ 0.01", 256, 1), ("clip", 256, 1),
                    ("dcl tau+ 0.01", 16, 0), ("clip", 16, 0), ("dcl tau+ 0.01", 16, 1), ("clip", 16, 1)]
    assert set(bs.DCL_SWEEP_VARIANTS) <= set(bs.DCL_VARIANTS)  # swept settings are screened ones
    assert "--tau-plus 0.01" in " ".join(bs.objectives()[DCL])


def test_dcl_sweep_rows_pair_each_batch_with_clip_and_read_the_interval():
    rows = {r["batch_size"]: r for r in bs.dcl_sweep_rows(
        sweep_records({16: [0.01, -0.01, 0.0], 64: [-0.05, -0.06, -0.04], 128: [0.02, 0.03]}))}
    assert rows[16]["reading"] == "within the seeds' noise" and rows[16]["test_r1"]["seeds"] == [0, 1, 2]
    assert rows[64]["reading"] == "trails" and rows[64]["test_r1"]["mean"] == pytest.approx(-0.05)
    assert rows[128]["reading"] == "no verdict"  # two seeds
    assert rows[16]["validation_r1"]["n"] == 3 and rows[16]["test_zeroshot"]["n"] == 0  # no zero-shot scored here


def test_the_dcl_rule_passes_a_setting_only_with_a_reading_at_every_size_and_none_trailing():
    ok = {b: [0.01, -0.01, 0.0] for b in bs.DCL_SWEEP_SIZES}
    d = bs.dcl_sweep_decision(bs.dcl_sweep_rows(sweep_records(ok)), [])
    assert d["settings"][DCL]["passes"] and d["default"] == DCL
    short = dict(ok)
    short.pop(256)
    d = bs.dcl_sweep_decision(bs.dcl_sweep_rows(sweep_records(short)), [])
    assert not d["settings"][DCL]["passes"] and d["settings"][DCL]["missing"] == [256] and d["default"] is None
    bad = {**ok, 32: [-0.05, -0.06, -0.04]}
    d = bs.dcl_sweep_decision(bs.dcl_sweep_rows(sweep_records(bad)), [])
    assert d["settings"][DCL]["trails_at"] == [32] and d["default"] is None


def test_among_passing_settings_the_best_sampling_bias_zero_shot_is_the_default():
    ok = {b: [0.01, -0.01, 0.0] for b in bs.DCL_SWEEP_SIZES}
    other = "dcl tau+ 0.021"
    rows = bs.dcl_sweep_rows(sweep_records(ok) + sweep_records(ok, other), (DCL, other))
    bias = [{"label": bs.bias_label(DCL), "mean": 0.01, "n": 3}, {"label": bs.bias_label(other), "mean": 0.03, "n": 3}]
    assert bs.bias_label(other) == "dcl tau+=0.021"
    assert bs.dcl_sweep_decision(rows, bias, (DCL, other))["default"] == other
    bias[0]["mean"] = 0.05
    assert bs.dcl_sweep_decision(rows, bias, (DCL, other))["default"] == DCL


def test_dcl_bias_rows_pair_each_objective_with_clip_by_seed(tmp_path):
    def run(seed, z):
        return {"seed": seed, "metrics": {"zeroshot/top1": z}}
    doc = {"data": {"config": {"num_classes": 10}}, "true_tau_plus": 0.1, "complete": True,
           "runs": {"clip": [run(0, 0.50), run(1, 0.40)], "dcl tau+=0.01": [run(0, 0.55), run(1, 0.40), run(2, 0.9)]}}
    (tmp_path / bs.DCL_BIAS_REPORTS[10]).write_text(json.dumps(doc))
    rows = bs.dcl_bias_rows(tmp_path)
    assert len(rows) == 1 and rows[0]["classes"] == 10 and rows[0]["seeds"] == [0, 1]  # seed 2 has no clip
    assert rows[0]["diffs"] == pytest.approx([0.05, 0.0]) and rows[0]["label"] == "dcl tau+=0.01"
    assert bs.dcl_bias_rows(tmp_path / "none") == []


def test_the_dcl_sweep_report_and_block_say_the_rules_verdict(tmp_path):
    data = {"config": {"num_classes": 48}, "tau_plus": 0.021}
    budget = bs.ex.Budget(epochs=20, model=bs.MODEL)
    trailing = {**{b: [0.01, -0.01, 0.0] for b in bs.DCL_SWEEP_SIZES}, 256: [-0.2, -0.25, -0.22]}
    records = [{**r, "logit_scale": [], "val_r1": [], "train_seconds": 1.0} for r in sweep_records(trailing)]
    bs.write_dcl_sweep(tmp_path, records, len(records), data, budget, "cmd", bs.datetime.now(bs.timezone.utc),
                       "dcl_sweep")
    text = (tmp_path / "dcl_sweep.md").read_text()
    assert "fails: trails `clip` at B = 256" in text and "default stays `tau_plus` 0" in text
    assert "| `dcl tau+ 0.01` | 256 | 3 | s0 -20.0, s1 -25.0, s2 -22.0 |" in text
    doc = json.loads((tmp_path / "dcl_sweep.json").read_text())
    block = bs.dcl_sweep_block(doc)
    assert "B = 256: -22.3 [" in block and "(3 seeds, trails)" in block
    assert "no setting passes at every batch size" in block
    partial = [r for r in records if r["batch_size"] != 16]
    bs.write_dcl_sweep(tmp_path, partial, len(records), data, budget, "cmd", bs.datetime.now(bs.timezone.utc),
                       "partial")
    assert "PARTIAL" in (tmp_path / "partial.md").read_text()


def screen16_records(variant_scores, default=0.20, seed=0):
    """The B = 16 screen's runs on the validation split: ``decl default`` and the variants given."""
    return [rec("decl default", 16, seed, default)] + [rec(n, 16, seed, v) for n, v in variant_scores.items()]


def test_the_b16_screens_best_is_chosen_on_the_validation_split_once_every_variant_has_run():
    names = list(bs.SCREEN16_VARIANTS)
    partial = bs.screen16_choice(screen16_records({names[0]: 0.25}))
    assert partial["best"] is None and partial["missing"] == names[1:]
    scores = {n: 0.19 for n in names} | {names[1]: 0.23}
    records = screen16_records(scores)
    records[1]["test_metrics"] = {bs.MEAN_R1: 0.90}  # names[0]'s test-split score plays no part in the choice
    choice = bs.screen16_choice(records)
    assert choice["best"] == names[1] and not choice["missing"] and choice["scores"]["decl default"] == 0.20
    assert bs.screen16_choice(screen16_records({n: 0.19 for n in names}))["best"] == "decl default"
    assert bs.screen16_choice(screen16_records(scores, seed=1), seed=0)["best"] is None  # another seed's screen


def test_the_b16_screens_best_goes_to_the_test_split_beside_clip_at_16_and_32():
    plan = bs.planned_runs(["screen16-test"], seeds=(0, 1, 2), screen16_best="decl gamma 0.5")
    assert plan[:3] == [("decl gamma 0.5", 16, 0), ("clip", 16, 0), ("clip", 32, 0)] and len(plan) == 9
    assert bs.planned_runs(["screen16-test"]) == []  # the driver refuses the stage before it plans
    assert bs.screen16_rows([], "decl default") == [] and bs.screen16_rows([], None) == []
    records = []
    for s, d in enumerate([0.010, 0.005, 0.015]):  # clip gains 4 points from 16 to 32
        records += [scored("clip", 16, s, 0.20), scored("clip", 32, s, 0.24), scored("decl gamma 0.5", 16, s, 0.24 + d)]
    rows = bs.screen16_rows(records, "decl gamma 0.5")
    assert [(r["kind"], r["against"], r["verdict"]) for r in rows] == [("reach", "clip at 32", "reaches"),
                                                                         ("beat", "clip at 16", "beats")]
    table = bs.verdict_table(rows, who="decl gamma 0.5")
    assert table.startswith("| B | decl gamma 0.5 against |") and "| 16 | clip at 32 | test | 3 |" in table
    doc = {"verdicts": bs.verdicts([]), "runs": [], "confidence": bs.CONFIDENCE,
           "screen16": {"best": "decl gamma 0.5", "verdicts": rows}}
    block = bs.which_loss_block(doc)
    assert ("- `decl gamma 0.5` (the best of the B = 16 screen on the validation split) at 16 - `clip` at 32, "
            "retrieval mean R@1, test split: +1.0 [") in block and "(3 seeds, reaches, the interval clearing" in block
    assert "at 16 - `clip` at 16, retrieval mean R@1, test split: +5.0 [" in block


def test_screen16_test_is_refused_before_any_training_until_the_screen_is_complete(tmp_path, monkeypatch):
    monkeypatch.setattr(bs.ex, "synth_data", lambda *a, **k: {"config": {"seed": 0}, "train": {"num_samples": 999}})
    monkeypatch.setattr(bs, "finished_runs", lambda *a, **k: screen16_records({"decl gamma 0.5": 0.3}))
    monkeypatch.setattr(bs, "run_one", lambda *a, **k: pytest.fail("trained before refusing"))
    with pytest.raises(SystemExit, match="not complete .*decl gamma 0.2"):
        bs.main(["--stage", "screen16-test", "--work", str(tmp_path), "--batch-sizes", "16", "32",
                 "--screen-batch-sizes", "16"])
    monkeypatch.setattr(bs, "finished_runs",
                        lambda *a, **k: screen16_records({n: 0.1 for n in bs.SCREEN16_VARIANTS}))
    with pytest.raises(SystemExit, match="no variant of the B = 16 screen scores above the package default"):
        bs.main(["--stage", "screen16-test", "--work", str(tmp_path), "--batch-sizes", "16", "32",
                 "--screen-batch-sizes", "16"])


def test_the_readme_block_carries_the_b16_screen_and_its_best_on_the_test_split():
    doc = {"verdicts": bs.verdicts([]), "runs": [], "confidence": bs.CONFIDENCE, "status": "PARTIAL"}
    names = list(bs.SCREEN16_VARIANTS)
    partial = {**bs.screen16_choice(screen16_records({names[0]: 0.25})), "verdicts": []}
    block = bs.readme_block({**doc, "screen16": partial})
    assert f"`{names[0]}` 25.0 (+5.0)" in block and "`decl default` 20.0," in block and "not yet run: `" in block
    records = screen16_records({n: 0.19 for n in names if n != names[1]})
    for s, d in enumerate([0.010, 0.005, 0.015]):  # names[1]'s seed-0 run scores 23.0 on the validation split
        records += [scored("clip", 16, s, 0.20), scored("clip", 32, s, 0.24),
                    {**scored(names[1], 16, s, 0.24 + d), "metrics": {bs.MEAN_R1: 0.23 if s == 0 else 0.5}}]
    choice = bs.screen16_choice(records)
    block = bs.readme_block({**doc, "screen16": {**choice, "verdicts": bs.screen16_rows(records, choice["best"])}})
    assert f"`{names[1]}` 23.0 (+3.0)" in block
    assert f"the best, `{names[1]}`, on the test split: decl@16 - clip@32 = +1.0 [" in block
    assert "decl@16 - clip@16 = +5.0 [" in block and ", beats." in block
    assert "not run yet" not in next(line for line in block.splitlines() if "B = 16 screen" in line)
    none = {**bs.screen16_choice(screen16_records({n: 0.19 for n in names})), "verdicts": []}
    assert "no variant scores above the package default" in bs.readme_block({**doc, "screen16": none})


def test_a_decisive_call_that_adds_later_seeds_reads_the_cached_earlier_ones(tmp_path, monkeypatch):
    """Seeds 0-2 in the cache are wide; seeds 3-5 alone would read "reaches", all six read no verdict: a call
    with --decisive-seeds 3 4 5 6 must go on to seed 6."""
    cached = reach_records([0.03, -0.05, 0.00])
    later = [r for r in reach_records([0.0, 0.0, 0.0, 0.000, 0.005, -0.005, 0.0]) if r["seed"] >= 3]
    assert bs.reach_verdict(bs.comparison(later[:9], "decl default", 32, 64)) == "reaches"  # seeds 3-5 alone
    both = bs.known_runs(cached, later[:9])
    assert len(both) == 18 and bs.reach_verdict(bs.comparison(both, "decl default", 32, 64)) == "no verdict"
    assert bs.known_runs(cached + later[:1], later[:1]).count(later[0]) == 1  # this call's record replaces the cache's
    monkeypatch.setattr(bs.ex, "synth_data", lambda *a, **k: {"config": {"seed": 0}, "train": {"num_samples": 999}})
    monkeypatch.setattr(bs, "finished_runs", lambda *a, **k: cached)
    monkeypatch.setattr(bs, "write", lambda *a, **k: None)
    trained = []

    def run_one(label, flags, data, budget, work, threads):
        trained.append((label, budget.batch_size, budget.seed))
        r = next(r for r in later if (r["label"], r["batch_size"], r["seed"]) == trained[-1])
        return {**r, "metrics": {"zeroshot/top1": 0.0, **r["metrics"]}, "source": "trained"}
    monkeypatch.setattr(bs, "run_one", run_one)
    bs.main(["--stage", "decisive", "--decisive-batch-sizes", "32", "--decisive-seeds", "3", "4", "5", "6",
             "--jobs", "1", "--work", str(tmp_path), "--batch-sizes", "16", "32"])
    assert {s for _, _, s in trained} == {3, 4, 5, 6} and len(trained) == 12
