"""`make`'s set-up says what it installs, one line a step, with pip's own output kept quiet."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: A python that makes a venv of itself and records every pip call instead of installing anything.
STUB = """#!/bin/sh
if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && exit 0; fi
echo "$@" >> "$(dirname "$0")/pip-calls"
echo "pip would print this"
"""


@pytest.mark.skipif(shutil.which("make") is None or sys.platform == "win32", reason="needs make and sh")
def test_make_says_each_install_step_in_one_line_and_pip_stays_quiet(tmp_path):
    stub = tmp_path / "python3"
    stub.write_text(STUB)
    stub.chmod(0o755)
    venv = tmp_path / "venv"
    proc = subprocess.run(
        ["make", "-C", str(ROOT), "--no-print-directory", "venv", f"VENV={venv}", f"PYTHON={stub}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    calls = (venv / "bin" / "pip-calls").read_text().splitlines()
    assert len(calls) == 3 and all(c.startswith("-m pip install -q ") for c in calls), calls
    lines = [line for line in proc.stdout.splitlines() if "pip would print this" not in line]
    assert [line.split()[:2] for line in lines] == [
        ["[make]", "creating"],
        ["[make]", "updating"],
        ["[make]", "installing"],
        ["[make]", "installing"],
        ["[make]", str(venv)],
    ], proc.stdout
    assert "torch==" in lines[2] and "clip-dcl" in lines[3]
    assert "-m pip" not in proc.stdout  # the commands themselves are not echoed
    again = subprocess.run(
        ["make", "-C", str(ROOT), "--no-print-directory", "venv", f"VENV={venv}", f"PYTHON={stub}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 0 and "[make]" not in again.stdout  # installed: nothing to say
