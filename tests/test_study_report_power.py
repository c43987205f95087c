"""The study report keeps what the plan knew: each comparison's planned power and `check`'s seed shortfall; a
difference that rounds to zero reads +0.00; the figure is legible with one comparison and with twenty."""

from __future__ import annotations

import json

from clip_dcl.experiment.study import load_plan
from clip_dcl.experiment.study import report as R
from clip_dcl.experiment.study import work as W
from clip_dcl.experiment.study.seal import seal as seal_plan

PLAN = """
seeds = [0, 1]
metric = "retrieval/mean_R@1"
confidence = 0.9
resolution = 0.01

[data]
train = "shards/train/0.tar"
train_samples = 64
validation = "shards/val/0.tar"
validation_samples = 8
test = "shards/test/0.tar"
test_samples = 8

[train]
epochs = 1

[[arms]]
name = "clip"
flags = ["--loss", "clip"]

[[arms]]
name = "decl"
flags = ["--loss", "decl"]

[[comparisons]]
a = "decl"
b = "clip"
rule = "beats"
expected = 0.01
paired_sd = 0.04
"""
#: (validation, test) mean R@1 per run: decl - clip is -0.00001 on the validation split (rounds to zero)
SCORES = {
    ("clip", 0): (0.20001, 0.30),
    ("decl", 0): (0.20, 0.31),
    ("clip", 1): (0.22001, 0.31),
    ("decl", 1): (0.22, 0.30),
}


def finished_study(tmp_path, comparisons: int = 1):
    text = PLAN + "".join(
        f'\n[[comparisons]]\na = "decl"\nb = "clip"\nrule = "reaches"\nmargin = 0.0{i % 9 + 1}\n'
        for i in range(comparisons - 1)
    )
    for name in ("train", "val", "test"):
        (tmp_path / "shards" / name).mkdir(parents=True)
        (tmp_path / "shards" / name / "0.tar").touch()
        (tmp_path / "shards" / name / "sizes.json").write_text('{"0.tar": 64}')  # the trainer's checks read it
    (tmp_path / "plan.toml").write_text(text)
    plan, work = load_plan(tmp_path / "plan.toml"), tmp_path / "work"
    seal_plan(plan, work)
    for (arm, seed), (val, test) in SCORES.items():
        folder = W.run_dir(work, arm, seed)
        folder.mkdir(parents=True)
        files = {
            "run.json": {
                "arm": arm,
                "seed": seed,
                "recipe": "custom",
                "commit": "abc",
                "hardware": "cpu",
                "started": "2030-01-01 00:00:00",
            },
            "scores-validation.json": {"retrieval/mean_R@1": val},
            "scores-test.json": {"retrieval/mean_R@1": test},
        }
        for name, doc in files.items():
            (folder / name).write_text(json.dumps(doc))
    return plan, work


def test_the_report_names_the_planned_power_and_checks_shortfall(tmp_path, capsys):
    from clip_dcl.experiment.study import cli

    plan, work = finished_study(tmp_path)
    assert cli.check(plan) == 1 and "its 2 give power 0.08 -- TOO FEW SEEDS" in capsys.readouterr().out
    got = R.write_report(plan, work)
    md = got["markdown"].read_text()
    assert "- Too few seeds for power 0.8: decl beats clip (see Planned power)" in md
    assert (
        "  - decl beats clip: power 0.08 with its 2 seeds (paired sd 4.00 points from the comparison's "
        "paired_sd, true difference assumed +1.00 points); 101 seeds give 0.8 -- TOO FEW SEEDS"
    ) in md
    planned = json.loads(got["json"].read_text())["comparisons"][0]["planned"]
    assert planned["short"] and planned["need"] == 101 and round(planned["power"], 2) == 0.08
    assert "-0.00" not in md and "| +0.00 |" in md  # the validation split's mean difference, -0.001 points
    assert cli.main(["report", str(tmp_path / "plan.toml"), "--work", str(work)]) == 0
    out = capsys.readouterr().out
    assert "planned: power 0.08 with its 2 seeds" in out and "TOO FEW SEEDS" in out


def _drawn(tmp_path, monkeypatch, comparisons: int):
    plan, work = finished_study(tmp_path, comparisons)
    figures = []
    real = R.save_figure
    monkeypatch.setattr(R, "save_figure", lambda fig, p, title="": figures.append(fig) or real(fig, p, title))
    R.write_report(plan, work)
    (fig,) = figures
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()  # the report closed it: a canvas of its own to measure on
    return fig


def test_the_figure_of_one_comparison_keeps_its_legend_inside_the_image_and_off_the_axis_label(tmp_path, monkeypatch):
    fig = _drawn(tmp_path, monkeypatch, 1)
    (ax,) = fig.axes
    renderer = fig.canvas.get_renderer()
    legend = ax.get_legend().get_window_extent(renderer)
    label = ax.xaxis.label.get_window_extent(renderer)
    image = fig.bbox
    assert image.x0 <= legend.x0 and legend.x1 <= image.x1 and image.y0 <= legend.y0 and legend.y1 <= image.y1
    assert not legend.overlaps(label) and not legend.overlaps(ax.get_window_extent(renderer))
    assert fig.get_figheight() < 3  # one row: no half-blank image


def test_the_figure_grows_with_the_comparisons(tmp_path, monkeypatch):
    fig = _drawn(tmp_path, monkeypatch, 20)
    (ax,) = fig.axes
    assert len(ax.get_yticklabels()) == 20 and fig.get_figheight() > 10
    renderer = fig.canvas.get_renderer()
    legend = ax.get_legend().get_window_extent(renderer)
    assert fig.bbox.x1 >= legend.x1 and not legend.overlaps(ax.get_window_extent(renderer))
