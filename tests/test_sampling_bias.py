"""The sampling-bias benchmark: run list, aggregation, the oracle driver through clip_dcl.train."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
import sampling_bias as sb  # noqa: E402
from train_oracle import UnbiasedOracleLoss  # noqa: E402


def test_runs_put_clip_at_zero_and_the_oracle_off_the_axis():
    runs = sb.make_runs([0.4, 0.05, 0.25])
    assert [r.name for r in runs] == ["clip", "dcl tau+=0.05", "dcl tau+=0.25", "dcl tau+=0.4", sb.ORACLE]
    assert [sb.run_tau_plus(r) for r in runs] == [0.0, 0.05, 0.25, 0.4, None]
    assert runs[2].flags == ("--loss", "dcl", "--tau-plus", "0.25")
    assert runs[-1].flags == ("--loss", "unbiased")
    assert sb.ORACLE not in [r.name for r in sb.make_runs([0.1], oracle=False)]


@pytest.mark.parametrize("bad", [[0.0], [1.0], [-0.1], [0.1, 0.1]])
def test_bad_tau_plus_is_named(bad):
    with pytest.raises(ValueError, match="tau_plus"):
        sb.make_runs(bad)


def test_summary_matches_numpy_and_skips_missing_values():
    rng = np.random.default_rng(0)
    scores = {
        "a": [{"m": float(v), "seed": i} for i, v in enumerate(rng.random(5))],
        "b": [{"m": 0.3}, {"m": float("nan")}, {}],
    }
    out = sb.summarize(scores, ["m"])
    vals = [s["m"] for s in scores["a"]]
    assert out["a"]["m"]["mean"] == pytest.approx(np.mean(vals))
    assert out["a"]["m"]["std"] == pytest.approx(statistics.stdev(vals))
    assert out["a"]["m"]["n"] == 5
    assert out["b"]["m"]["mean"] == pytest.approx(0.3) and out["b"]["m"]["n"] == 1
    assert np.isnan(out["b"]["m"]["std"])


def test_tau_table_lists_each_run_with_its_prior_and_spread():
    runs = sb.make_runs([0.25])
    keys = [k for k, _ in sb.HEADLINE]
    scores = {
        "clip": [{k: 0.5 for k in keys}, {k: 0.7 for k in keys}],
        "dcl tau+=0.25": [{k: 0.8 for k in keys}],
        sb.ORACLE: [],
    }
    have = {n: v for n, v in scores.items() if v}
    table = sb.tau_table(runs, sb.summarize(have, keys), {keys[0]: 0.25})
    rows = table.splitlines()
    assert rows[2].startswith("| chance |") and "25.0" in rows[2]
    assert rows[3].startswith("| clip | 0 | 2 | 60.0 ± 14.1 |")
    assert rows[4].startswith("| dcl tau+=0.25 | 0.25 | 1 | 80.0 |")
    assert len(rows) == 5  # the oracle has no finished run


def test_bound_oracle_records_no_label_tensor_and_equals_the_unbound_loss():
    from clip_dcl.train.flags import full_loss_args

    labels = torch.tensor([0, 1, 0, 1, 2, 2])
    bound = UnbiasedOracleLoss.with_labels(labels)
    from clip_dcl.losses import LOSSES

    saved = LOSSES.get("unbiased")
    LOSSES["unbiased"] = bound
    try:
        assert full_loss_args("unbiased", {}) == {}
    finally:
        LOSSES["unbiased"] = saved
    gen = torch.Generator().manual_seed(1)
    f = torch.nn.functional.normalize(torch.randn(4, 5, generator=gen), dim=-1)
    g = torch.nn.functional.normalize(torch.randn(4, 5, generator=gen), dim=-1)
    ids = torch.tensor([5, 0, 2, 3])
    s = torch.tensor(3.0)
    torch.testing.assert_close(bound()(f, g, s, sample_ids=ids), UnbiasedOracleLoss(labels)(f, g, s, sample_ids=ids))
    assert bound().state_dict() == {}


def test_loss_flag_accepts_a_registered_loss_and_still_rejects_unknown_ones():
    from clip_dcl.losses import LOSSES
    from clip_dcl.train.flags import build_parser

    saved = LOSSES.get("unbiased")
    LOSSES["unbiased"] = UnbiasedOracleLoss.with_labels(torch.zeros(3, dtype=torch.long))
    try:
        parser = build_parser()
        assert parser.parse_known_args(["--loss", "unbiased"])[0].loss == "unbiased"
        with pytest.raises(SystemExit):
            parser.parse_known_args(["--loss", "nonsense"])
    finally:
        LOSSES["unbiased"] = saved
    assert "{clip,dcl,decl" in build_parser().format_help()


@pytest.mark.slow
def test_oracle_trains_through_clip_dcl_train_and_checkpoint_has_no_labels(tmp_path, monkeypatch, preloaded):
    from clip_dcl import experiment as ex

    monkeypatch.setenv("CLIP_DCL_TRAIN_LOCK", "")  # a 6-step run: no need to queue behind long trainings
    from clip_dcl.data.synth import generate

    data = generate(tmp_path / "data", quick=True, num_classes=3, train_samples=96, verbose=False)
    budget = ex.Budget(epochs=2, batch_size=32, warmup=1, workers=0, log_every_n_steps=1)
    res = ex.train(
        ex.Run("oracle", ("--loss", "unbiased")),
        data,
        tmp_path / "runs",
        budget,
        echo=lambda s: None,
        entry=[preloaded.python, str(BENCH / "train_oracle.py")],
    )  # the benchmark's script, as run
    # each epoch's checkpoint replaced the one before: a run keeps one
    assert sorted(p.name for p in res.checkpoint.parent.glob("*.pt")) == ["epoch_2.pt"]
    ckpt = torch.load(res.checkpoint, map_location="cpu", weights_only=False)
    assert ckpt["clip_dcl"]["loss"] == "unbiased" and ckpt["clip_dcl"]["loss_args"] == {}
    assert ckpt["loss_state"] == {}
    log = (res.log_dir / "out.log").read_text()
    share = [float(x) for x in __import__("re").findall(r"Same_class_share: (\S+)", log)]
    assert share and all(0.0 < v < 1.0 for v in share)  # labels were looked up: some negatives dropped


def test_extra_runs_parse_with_the_training_flags_and_their_table_gives_ratios_to_clip(tmp_path):
    from clip_dcl.train.flags import build_parser

    runs = sb.make_extra_runs(0.25)
    assert runs[0].name == "clip" and len({r.name for r in runs}) == len(runs)
    parser = build_parser()
    for run in runs:  # every variant's flags are real flags of clip_dcl.train
        ours, rest = parser.parse_known_args(list(run.flags))
        assert rest == [], run
    m3 = [r for r in runs if "--captions-per-image" in r.flags]
    assert {r.flags[1] for r in m3} == {"clip", "dcl", "curl", "decl"}
    assert [sb.run_tau_plus(r) for r in runs if "auto" in r.flags] == [None]
    log = tmp_path
    (log / "metrics.jsonl").write_text(
        '{"kind": "train", "clamp_rate": 0.2, "tau_plus": 0.1}\n{"kind": "train", "clamp_rate": 0.4, "tau_plus": 0.2}\n'
    )
    assert sb.log_means(log) == {"clamp_rate": pytest.approx(0.3), "tau_plus_final": 0.2}
    summary = {
        "clip": {k: {"mean": 0.5, "std": 0.1, "n": 3} for k, _ in sb.HEADLINE},
        runs[1].name: {k: {"mean": 0.6, "std": 0.1, "n": 3} for k, _ in sb.HEADLINE},
    }
    table = sb.extra_table(runs, summary, {runs[1].name: [sb.log_means(log)]}, {})
    assert "60.0 ± 10.0 (1.20x)" in table and "| 0.30 | 0.200 |" in table


def test_prior_diagnosis_splits_the_pairs_by_relation_and_names_the_runs():
    import prior_diagnosis as pd

    masks = pd.relation_masks(["circle", "circle", "square", "square"], ["red", "blue", "red", "red"])
    total = sum(m.int() for m in masks.values())
    assert torch.equal(total, 1 - torch.eye(4, dtype=torch.int))  # every ordered pair i != j once
    assert masks["same class"][2, 3] and masks["same class"][3, 2] and not masks["same class"][0, 1]
    assert masks["same shape only"][0, 1] and masks["same colour only"][0, 2] and masks["neither"][1, 3]
    assert pd.name_of(["--loss", "clip"]) == "clip"
    assert pd.name_of(["--loss", "dcl", "--tau-plus", "auto"]) == "dcl tau+=auto"
    assert pd.name_of(["--loss", "dcl", "--tau-plus", "0.25", "--hcl-beta", "1"]) == ""
    rows = [
        {
            "estimate": 0.4,
            "sklearn_estimate": 0.45,
            "positive": {"mean": 9.0},
            "clean_estimate": 0.5,
            "clean_truth": 0.5,
            **{r: {"mean": 1.0, "sd": 2.0, "share": 0.25} for r in pd.RELATIONS},
        }
    ]
    md = pd.table({"clip": rows, "dcl tau+=auto": []}, 0.25)
    assert "| clip | 1 | 0.400 | 0.450 | 9.00 | 1.00 ± 2.00 (0.25) |" in md and "auto" not in md
    scores = torch.cat(
        [
            torch.randn(3000, generator=torch.Generator().manual_seed(0)),
            8 + torch.randn(1000, generator=torch.Generator().manual_seed(1)),
        ]
    )
    assert pd.sklearn_upper_weight(scores) == pytest.approx(0.25, abs=0.02)


def test_a_stem_with_a_folder_stops_before_any_data_is_written(tmp_path, capsys):
    with pytest.raises(SystemExit, match="--stem must be a file name without a folder, got '../x'"):
        sb.main(["--stem", "../x", "--work", str(tmp_path / "work"), "--results", str(tmp_path / "out")])
    assert not (tmp_path / "work").exists() and not (tmp_path / "out").exists()
