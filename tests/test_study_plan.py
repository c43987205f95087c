"""A study's plan: parsing, the checks that name the bad key, the runs, the design and the diff of two plans."""

from __future__ import annotations

from pathlib import Path

import pytest

from clip_dcl.experiment.study import PlanError, load_plan, parse_plan, plan_changes
from clip_dcl.experiment.study.cli import check

ROOT = Path(__file__).resolve().parents[1]

BASE = """
seeds = [0, 1, 2]
metric = "retrieval/mean_R@1"
confidence = 0.9
resolution = 0.01

[data]
train = "/d/train/{0..1}.tar"
train_samples = 100
validation = "/d/val/0.tar"
validation_samples = 10
test = "/d/test/0.tar"
test_samples = 10

[train]
model = "clip-dcl-micro"
epochs = 2

[[arms]]
name = "clip"
flags = ["--loss", "clip"]

[[arms]]
name = "decl"
flags = ["--loss", "decl"]
batch_size = 64

[[comparisons]]
a = "decl"
b = "clip"
rule = "reaches"
margin = 0.02
"""


def plan(extra_top: str = "", text: str = BASE):
    return parse_plan(extra_top + text, "p.toml")


def test_the_example_plan_parses_with_two_arms_two_seeds_and_data_from_a_command():
    p = load_plan(ROOT / "benchmarks" / "studies" / "example.toml")
    assert p.seeds == (0, 1) and [a.name for a in p.arms] == ["clip", "decl"]
    assert p.data["command"][:3] == ["data", "synth", "--quick"] and p.data["from_summary"]
    assert p.train["epochs"] == 1 and p.threads == 1 and p.recipe == "custom"
    assert p.runs() == [("clip", 0), ("decl", 0), ("clip", 1), ("decl", 1)]


def test_runs_go_seed_after_seed_and_an_arm_keeps_its_overrides():
    p = plan()
    assert p.runs()[:2] == [("clip", 0), ("decl", 0)] and len(p.runs()) == 6
    assert dict(p.arm("decl").overrides) == {"batch_size": 64} and p.arm("decl").flags == ("--loss", "decl")
    assert p.design() == [(3, pytest.approx(0.1))] and "one look" in p.design_text()


@pytest.mark.parametrize(
    "extra, match",
    [
        ("seed = 3\n", r"unknown key 'seed' in the top level"),
        ("power = 1.5\n", r"power = 1.5: expected a number between 0 and 1"),
        ("threads = 0\n", r"threads = 0: expected an integer >= 1"),
        ('pair_across = ["gpus"]\n', r"pair_across = \['gpus'\]"),
        ("looks = [2, 3]\n", r"looks = \[2, 3\] needs alpha_split"),
        ("looks = [2, 3]\nalpha_split = [0.08, 0.08]\n", r"alpha_split = \[0.08, 0.08\]: spends 0.16"),
        (
            'looks = [2, 4]\nalpha_split = "bonferroni"\n',
            r"looks = \[2, 4\]: expected increasing seed counts ending at",
        ),
        ("alpha_split = [0.1]\n", r"alpha_split = \[0.1\]: an error split without looks"),
    ],
)
def test_a_bad_top_level_value_is_one_line_naming_it(extra, match):
    with pytest.raises(PlanError, match=match) as err:
        plan(extra)
    assert "\n" not in str(err.value) and str(err.value).startswith("p.toml: ")


@pytest.mark.parametrize(
    "old, new, match",
    [
        ("seeds = [0, 1, 2]", "seeds = [0, 1, 1]", r"seeds = \[0, 1, 1\]: give one or more distinct seeds"),
        ('metric = "retrieval/mean_R@1"', 'metric = "R@1"', r"metric = 'R@1': choose one of"),
        ("confidence = 0.9", "confidence = 90", r"confidence = 90.0: expected a number between 0 and 1"),
        ("epochs = 2", 'epochs = "2"', r"train.epochs = '2': expected int"),
        ("epochs = 2", "epoch = 2", r"unknown key 'epoch' in \[train\]"),
        ("batch_size = 64", "batch = 64", r"unknown key 'batch' in \[arms\[1\]\]"),
        ('name = "decl"', 'name = "decl default"', r"arms\[1\].name = 'decl default': use letters"),
        ('name = "decl"', 'name = "clip"', r"arms.name = 'clip': two arms have this name"),
        ('a = "decl"', 'a = "dcl"', r"comparisons\[0\].a = 'dcl': no such arm; the arms are clip, decl"),
        ('rule = "reaches"', 'rule = "wins"', r"comparisons\[0\].rule = 'wins': choose beats, reaches, matches"),
        ("margin = 0.02", "margin = -0.02", r"comparisons\[0\].margin = -0.02: expected a number > 0.0"),
        ("margin = 0.02", "expected = 0.0", r"rule 'reaches' needs exactly one of margin and margin_gain"),
        ('rule = "reaches"', 'rule = "beats"', r"'beats' has no margin"),
        ("test_samples = 10", "test_sample = 10", r"unknown key 'test_sample' in \[data\]"),
        ('test = "/d/test/0.tar"', "", r"\[data\] lacks test"),
        ('train = "/d/train/{0..1}.tar"', 'train = "{DATA}/train.tar"', r"data.train = .*there is no command"),
        ('metric = "retrieval/mean_R@1"', 'metric = "zeroshot/top1"', r"needs \[data\] validation_zeroshot"),
    ],
)
def test_a_bad_key_or_value_is_refused_with_one_line_naming_it(old, new, match):
    assert old in BASE
    with pytest.raises(PlanError, match=match) as err:
        parse_plan(BASE.replace(old, new, 1), "p.toml")
    assert "\n" not in str(err.value)


def test_missing_keys_and_broken_toml_are_named():
    with pytest.raises(PlanError, match="missing key 'resolution'"):
        parse_plan(BASE.replace("resolution = 0.01", ""), "p.toml")
    with pytest.raises(PlanError, match="p.toml: not valid TOML"):
        parse_plan("seeds = [0,", "p.toml")
    with pytest.raises(PlanError, match=r"p.toml: cannot read the plan"):
        load_plan("p.toml")
    with pytest.raises(PlanError, match=r"data.command = .*must write into \{DATA\}"):
        parse_plan(BASE.replace("[data]\n", '[data]\ncommand = "data synth /tmp/x"\n'), "p.toml")


def test_a_sequential_design_spends_its_error_over_its_looks():
    p = plan('looks = [2, 3]\nalpha_split = "bonferroni"\n')
    assert p.design() == [(2, pytest.approx(0.05)), (3, pytest.approx(0.05))]
    assert "sequential: 2 looks, at 2, 3 seeds" in p.design_text()
    q = plan("looks = [2, 3]\nalpha_split = [0.02, 0.08]\n")
    assert [a for _, a in q.design()] == [0.02, 0.08]


def test_margin_gain_names_two_arms_and_a_share():
    p = plan(text=BASE.replace("margin = 0.02", 'margin_gain = {from = "clip", to = "decl", share = 0.5}'))
    assert p.comparisons[0].margin_gain == ("clip", "decl", 0.5) and p.comparisons[0].margin is None
    with pytest.raises(PlanError, match=r"margin_gain.to = 'x': no such arm"):
        plan(text=BASE.replace("margin = 0.02", 'margin_gain = {from = "clip", to = "x", share = 0.5}'))


def test_plan_changes_name_each_changed_key():
    a = plan().canonical()
    assert plan_changes(a, plan().canonical()) == []
    # comments and layout are not the plan
    assert plan_changes(a, parse_plan("# a comment\n" + BASE, "p.toml").canonical()) == []
    assert plan_changes(a, plan(text=BASE.replace("[0, 1, 2]", "[0, 1, 2, 3]")).canonical()) == [
        "seeds: [0, 1, 2] -> [0, 1, 2, 3]"
    ]
    assert plan_changes(a, plan(text=BASE.replace("margin = 0.02", "margin = 0.03")).canonical()) == [
        "comparisons[0].margin: 0.02 -> 0.03"
    ]
    renamed = BASE.replace('name = "decl"', 'name = "decl2"').replace('a = "decl"', 'a = "decl2"')
    assert plan_changes(a, plan(text=renamed).canonical()) == [
        "arms[1].name: 'decl' -> 'decl2'",
        "comparisons[0].a: 'decl' -> 'decl2'",
    ]
    assert plan_changes(a, plan('recipe = "mine"\n').canonical()) == ["recipe: 'custom' -> 'mine'"]


def plan_with_data(tmp_path, extra_top: str = "", text: str = BASE):
    """``plan(...)`` written as ``tmp_path/p.toml`` with its [data] relative to it (``d/...``) and those
    (empty) shards made, with their ``sizes.json``: what `study check` reads (the trainer's checks size
    DeCL's per-sample state from the sizes)."""
    for name in ("train/0.tar", "train/1.tar", "val/0.tar", "test/0.tar"):
        (tmp_path / "d" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "d" / name).touch()
    (tmp_path / "d" / "train" / "sizes.json").write_text('{"0.tar": 50, "1.tar": 50}')
    for split in ("val", "test"):
        (tmp_path / "d" / split / "sizes.json").write_text('{"0.tar": 10}')
    (tmp_path / "p.toml").write_text(extra_top + text.replace('"/d/', '"d/'))
    return load_plan(tmp_path / "p.toml")


def test_check_counts_the_seeds_each_comparison_needs_and_says_when_too_few(tmp_path, capsys):
    few = plan_with_data(tmp_path, "paired_sd = 0.02\n")  # reaches at margin 0.02 = one sd: 8 seeds at 90 %, power 0.8
    assert check(few) == 1
    out = capsys.readouterr().out
    assert "runs: 6 (2 arms x 3 seeds [0, 1, 2])" in out and "needs 8 seeds" in out and "TOO FEW SEEDS" in out
    enough = plan_with_data(tmp_path, "paired_sd = 0.02\n", text=BASE.replace("[0, 1, 2]", str(list(range(8)))))
    assert check(enough) == 0 and "TOO FEW" not in capsys.readouterr().out
    assert check(plan_with_data(tmp_path)) == 0 and "seeds not checked: no paired spread" in capsys.readouterr().out


def test_check_reads_the_spread_of_an_earlier_studys_report(tmp_path):
    import json

    earlier = {"comparisons": [{"a": "decl", "b": "clip", "final": {"n": 3, "diffs": [0.0, 0.02, 0.04]}, "looks": []}]}
    (tmp_path / "STUDY.json").write_text(json.dumps(earlier))
    lines = []
    check(plan_with_data(tmp_path, 'spread_from = "STUDY.json"\n'), echo=lines.append)
    assert any("paired sd 2.00 points (STUDY.json, test split, 3 seeds)" in line for line in lines)
