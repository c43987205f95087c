"""A plan is data, never code: no control character reaches a shell line, and the Slurm script runs a lines file
only when it holds one run a line."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from test_study_plan import BASE

from clip_dcl.experiment.study import PlanError, parse_plan
from clip_dcl.experiment.study.lines import run_tag

SCRIPT = Path(__file__).resolve().parents[1] / "launch" / "study_slurm.sbatch"


@pytest.mark.parametrize(
    "old, new, field",
    [
        (
            'flags = ["--loss", "decl"]',
            'flags = ["--loss", "decl", "--wandb-notes", "note\\n$(touch X) #"]',
            "arms[1].flags[3]",
        ),
        ('flags = ["--loss", "clip"]', 'flags = ["--loss", "clip\\r"]', "arms[0].flags[1]"),
        ('model = "clip-dcl-micro"', 'model = "clip-dcl-micro\\u0000"', "train.model"),
        ('test = "/d/test/0.tar"', 'test = "/d/test/0.tar\\u2028"', "data.test"),
        ("[data]", 'title = """two\nlines"""\n[data]', "title"),
    ],
)
def test_a_control_character_in_any_value_is_refused_naming_its_field(old, new, field):
    assert old in BASE
    with pytest.raises(PlanError, match=re.escape(f"p.toml: {field} = ") + ".*control character"):
        parse_plan(BASE.replace(old, new, 1), "p.toml")


def test_an_arm_name_must_match_whole_so_a_final_newline_is_refused():
    for name in ("decl\\n", "decl\\n\\n"):
        with pytest.raises(PlanError, match="control character"):
            parse_plan(BASE.replace('name = "decl"', f'name = "{name}"'), "p.toml")
    with pytest.raises(PlanError, match=r"arms\[1\].name = 'decl x': use letters"):
        parse_plan(BASE.replace('name = "decl"', 'name = "decl x"'), "p.toml")


def _slurm(lines: Path, task: int, **env):
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run(
        ["bash", str(SCRIPT), str(lines)],
        env={**base, "SLURM_ARRAY_TASK_ID": str(task), **env},
        capture_output=True,
        text=True,
        cwd=lines.parent,
    )


def test_the_slurm_script_runs_no_line_of_a_file_where_a_run_spans_two_lines(tmp_path):
    # what `study commands` printed before plans were checked: one run's value held a newline and $(...)
    lines = tmp_path / "lines.sh"
    lines.write_text(f"echo one > ran1 {run_tag(1, 2)}\necho 'note\n$(touch X) #' > ran2 {run_tag(2, 2)}\n")
    for task in (1, 2, 3):
        got = _slurm(lines, task)
        assert got.returncode == 2, got.stderr
        assert "refusing to run any line" in got.stderr and len(got.stderr.splitlines()) == 1
    assert not (tmp_path / "X").exists() and not list(tmp_path.glob("ran*"))


def test_the_slurm_script_refuses_lines_without_their_numbers_and_runs_a_whole_file(tmp_path):
    lines = tmp_path / "lines.sh"
    lines.write_text("echo one > ran1\necho two > ran2\n")
    assert _slurm(lines, 1).returncode == 2 and not (tmp_path / "ran1").exists()
    lines.write_text(f"echo one > ran1 {run_tag(1, 2)}\necho two > ran2 {run_tag(2, 2)}\n")
    got = _slurm(lines, 2)
    assert got.returncode == 0, got.stderr
    assert (tmp_path / "ran2").read_text() == "two\n" and not (tmp_path / "ran1").exists()
