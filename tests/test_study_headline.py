"""The README's headline block rendered from a confirmatory study's JSON (benchmarks/headline.py)."""

import os
import re

import pytest
from headline import advice, readme_block

from clip_dcl.experiment.stats import t_interval
from clip_dcl.experiment.study.rule import judge


def _row(rule, diffs, margin=None):
    return {"seeds": list(range(len(diffs))), "diffs": diffs, **judge(rule, diffs, 0.9, resolution=0.01, margin=margin)}


def _doc(rows, status="complete"):
    comps = []
    for (a, b, rule), r in rows.items():
        comps.append({"a": a, "b": b, "rule": rule, "label": f"{a} {rule} {b}", "looks": [r] if r else [], "final": r})
    arms = [
        {
            "name": n,
            "flags": ["--loss", "dcl", "--tau-plus", "0", "--dcl-temperature", "0.035714"]
            if n.startswith("tuned")
            else ["--loss", n.split("-")[0]],
        }
        for n in sorted({x for k in rows for x in k[:2]})
    ]
    return {
        "plan": "benchmarks/studies/confirmatory.toml",
        "sealed": "2026-11-26 16:00",
        "sealed_commit": "abc123",
        "recipe": "micro-words",
        "design": "one look",
        "metric": "retrieval/mean_R@1",
        "exploratory": False,
        "status": status,
        "comparisons": comps,
        "plan_canonical": {"arms": arms},
    }


WIN = [0.05, 0.07, 0.04, 0.06]
NONE = [0.05, -0.04, 0.02, -0.03]


def test_complete_study_renders_every_comparison_from_its_rows():
    rows = {
        ("decl-b32", "clip-b32", "beats"): _row("beats", WIN),
        ("decl-b32", "tuned-b32", "beats"): _row("beats", NONE),
        ("decl-b32", "clip-b64", "reaches"): _row("reaches", [0.0, -0.01, 0.01, 0.0], margin=0.02),
    }
    text = readme_block(_doc(rows))
    st = t_interval(WIN, 0.9)
    assert f"+{100 * st['mean']:.1f} [+{100 * st['lo']:.1f}, +{100 * st['hi']:.1f}]" in text
    assert "+5.0, +7.0, +4.0, +6.0" in text  # every seed's difference
    assert text.count("**beats**") == 1 and "**no verdict**" in text and "**reaches**" in text
    assert "bar -2.0" in text  # the reach's threshold, minus the margin
    line = [x for x in text.splitlines() if x.startswith("- B = 32:")]
    assert len(line) == 1 and "not shown to be more than a temperature" in line[0]
    assert "--dcl-temperature 0.035714" in line[0]


def test_incomplete_study_states_no_number():
    rows = {("decl-b32", "clip-b32", "beats"): None}
    text = readme_block(_doc(rows, status="incomplete: 5 of 56 runs"))
    assert "incomplete: 5 of 56 runs" in text and "states nothing" in text
    assert not re.search(r"[+-]\d+\.\d", text)


@pytest.mark.parametrize(
    "verdicts, expect",
    [
        ({"clip": "beats", "tuned": "beats", "2B": "reaches"}, "train `--loss decl`: it beat InfoNCE"),
        ({"clip": "beats", "tuned": "trails", "2B": "no verdict"}, "train InfoNCE at the tuned temperature"),
        ({"clip": "beats", "tuned": "no verdict", "2B": "reaches"}, "train either"),
        ({"clip": "no verdict", "tuned": "no verdict", "2B": "no verdict"}, "keep `--loss clip`"),
        ({"clip": "tie", "tuned": "tie", "2B": "reaches"}, "keep `--loss clip`"),
    ],
)
def test_advice_follows_the_verdicts(verdicts, expect):
    line = advice(32, {k: {"verdict": v} for k, v in verdicts.items()}, ["--loss", "clip", "--init-logit-scale", "28"])
    assert expect in line
    assert ("reached `clip` at B = 64" in line) == (verdicts["tuned"] == "beats" and verdicts["2B"] == "reaches")


def test_advice_without_a_tuned_arm_says_so():
    line = advice(64, {"clip": {"verdict": "beats"}, "2B": {"verdict": "no verdict"}}, [])
    assert "train `--loss decl`" in line and "no tuned InfoNCE" in line and "``" not in line


def test_refuses_exploratory_and_unknown_arms():
    rows = {("decl-b32", "clip-b32", "beats"): _row("beats", WIN)}
    doc = _doc(rows)
    doc["exploratory"] = True
    with pytest.raises(ValueError, match="exploratory"):
        readme_block(doc)
    bad = _doc({("decl-b32", "infonce-b32", "beats"): _row("beats", WIN)})
    with pytest.raises(ValueError, match="infonce-b32"):
        readme_block(bad)


@pytest.mark.parametrize(
    "committed, sealed, first, said, unsaid",
    [
        # the plan's commit precedes the first run: that is the claim, whenever the folder was sealed
        (
            "2026-11-26 16:40:11",
            "2026-11-26 23:58",
            "2026-11-26 16:40:58",
            "committed 2026-11-26 16:40, before its first run",
            "after",
        ),
        (
            "2026-11-26 17:00:00",
            "2026-11-26 16:30",
            "2026-11-26 16:40:58",
            "committed 2026-11-26 17:00, after its first run",
            "before",
        ),
        # git holds no such plan at the seal's commit: said so, whatever the seal's date (a local file's word), and
        # the commit is named as the code's, not the plan's
        (
            None,
            "2026-11-26 16:30",
            "2026-11-26 16:40:58",
            "the plan was not committed to git, so no date of record shows "
            "it fixed before its runs; its work folder was sealed 2026-11-26 16:30 (clip-dcl at commit abc123)",
            "before its first run",
        ),
        (None, "2026-11-26 23:58", "2026-11-26 16:40:58", "the plan was not committed to git", "before its first run"),
    ],
)
def test_the_headline_says_the_plan_came_first_only_when_the_dates_do(committed, sealed, first, said, unsaid):
    doc = {
        **_doc({("decl-b32", "clip-b32", "beats"): _row("beats", WIN)}),
        "plan_committed": committed,
        "sealed": sealed,
        "first_run": first,
    }
    head = readme_block(doc).split("): **complete**")[0]
    assert said in head and unsaid not in head


def test_the_plans_commit_date_comes_from_git(tmp_path):
    import subprocess
    from pathlib import Path

    from clip_dcl.experiment.study.plan import load_plan
    from clip_dcl.experiment.study.report import plan_committed

    def git(*a, date=None):
        env = {
            **os.environ,
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
            **({"GIT_COMMITTER_DATE": date} if date else {}),
        }
        return subprocess.run(
            ["git", *a], cwd=tmp_path, env=env, check=True, capture_output=True, text=True
        ).stdout.strip()

    example = (Path(__file__).resolve().parents[1] / "benchmarks" / "studies" / "example.toml").read_text()
    path = tmp_path / "plan.toml"
    git("init", "-q")
    path.write_text(example)
    git("add", "plan.toml")
    git("commit", "-qm", "plan", date="2026-01-02T03:04:05+00:00")
    first = git("rev-parse", "--short=10", "HEAD")
    (tmp_path / "other.txt").write_text("x\n")
    git("add", "other.txt")
    git("commit", "-qm", "later", date="2026-02-03T04:05:06+00:00")
    head = git("rev-parse", "--short=10", "HEAD")
    # the date the plan itself was committed, not that of the later commit the folder was sealed at
    assert plan_committed(load_plan(path), head) == "2026-01-02 03:04:05"
    assert plan_committed(load_plan(path), first) == "2026-01-02 03:04:05"
    # a comment added since changes no key: still that plan
    path.write_text("# a note\n" + example)
    assert plan_committed(load_plan(path), head + "+changes") == "2026-01-02 03:04:05"
    # a seed added since: the committed file is another plan, and its date vouches for nothing
    path.write_text(example.replace("seeds = [0, 1]", "seeds = [0, 1, 2]"))
    assert "seeds = [0, 1, 2]" in path.read_text()
    assert plan_committed(load_plan(path), head + "+changes") is None
    assert plan_committed(load_plan(path), None) is None
    (tmp_path / "untracked.toml").write_text(example)
    assert plan_committed(load_plan(tmp_path / "untracked.toml"), head) is None


def test_caveats_name_a_straddled_bar_and_a_low_powered_verdict():
    below = [-0.04, -0.02, -0.03, -0.01, -0.035]  # below zero, across a bar at -2.5 points
    rows = {
        ("decl-b32", "clip-b32", "beats"): _row("beats", WIN),
        ("decl-b32", "tuned-b32", "beats"): _row("beats", WIN),
        ("decl-b32", "clip-b64", "reaches"): _row("reaches", below, margin=0.025),
    }
    doc = _doc(rows)
    doc["confidence"] = 0.9
    doc["plan_canonical"]["comparisons"] = [
        {"a": "decl-b32", "b": "clip-b32", "rule": "beats", "seeds": 4, "expected": 0.05, "paired_sd": 0.01},
        {"a": "decl-b32", "b": "tuned-b32", "rule": "beats", "seeds": 4, "expected": 0.01, "paired_sd": 0.04},
    ]
    lines = {x.split(":")[0]: x for x in readme_block(doc).splitlines() if x.startswith("- ")}
    assert "**no verdict**; the interval straddles the bar; it lies wholly below zero" in lines["- `clip` at 2B"]
    assert "planned power 0.1" in lines["- InfoNCE tuned at B"]  # 4 seeds for +1 at sd 4: about 0.12
    assert "planned power" not in lines["- `clip` at B"]  # well powered: nothing to add
