"""Small things a first user meets: the study's --help in plain text, zero-shot's top5 NaN explained, and a
package description setuptools reads without a deprecation warning."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("argv", [["--help"], ["score", "--help"]])
def test_study_help_is_plain_text(capsys, argv):
    from clip_dcl.experiment.study.cli import main

    with pytest.raises(SystemExit):
        main(argv)
    out = capsys.readouterr().out
    assert "``" not in out and not any(role in out for role in (":mod:", ":func:", ":class:"))
    if argv == ["--help"]:
        assert "* check PLAN: validate the plan" in out and "(score)" in out


def test_plain_text_drops_roles_and_literals():
    from clip_dcl.experiment.study.cli import plain_text

    assert plain_text("``check PLAN`` (:mod:`.score`, :func:`~a.b`)") == "check PLAN (score, a.b)"


def test_zeroshot_says_why_top5_is_nan():
    from clip_dcl.eval.zeroshot import zeroshot_table

    few = zeroshot_table({"top1": 0.5, "top5": math.nan, "mean_per_class_recall": 0.5})
    assert few.splitlines()[-1] == (
        "top5 and acc5 are nan: the data have fewer than 5 classes, so the true class is "
        "always among the top 5 and they measure nothing"
    )
    assert "fewer than 5 classes" not in zeroshot_table({"top1": 0.5, "top5": 0.9, "mean_per_class_recall": 0.5})


def test_pyproject_reads_without_deprecation_warnings(tmp_path):
    from setuptools.config import pyprojecttoml
    from setuptools.dist import Distribution

    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "README.md").write_text("x\n")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        dist = pyprojecttoml.apply_configuration(Distribution(), tmp_path / "pyproject.toml")
    assert not [str(w.message) for w in seen if "deprecated" in str(w.message)]
    assert dist.metadata.license_expression == "MIT"
