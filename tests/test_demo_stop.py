"""Ctrl-C to `clip-dcl demo` while it trains: the training child saves and exits with it, and the
demo ends with one line saying what it kept (exit 130), no traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from test_study_signals import alive, descendants, wait_for

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_ctrl_c_to_the_demo_stops_its_training_and_says_what_it_kept(tmp_path, preloaded):
    out = tmp_path / "demo"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "", "CLIP_DCL_TRAIN_LOCK": ""}
    proc = subprocess.Popen(
        [
            preloaded.python,
            "-m",
            "clip_dcl.cli",
            "demo",
            "--quick",
            "--out",
            str(out),
            "--device",
            "cpu",
            "--losses",
            "clip",
            "decl",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    folder = out / "runs" / "clip"
    try:
        wait_for(
            lambda: (
                (folder / "run.lock").is_file()
                and (folder / "out.log").is_file()
                and "Train Epoch:" in (folder / "out.log").read_text(errors="replace")
            ),
            180,
            "clip training",
        )
        trainer = descendants(int(json.loads((folder / "run.lock").read_text())["pid"]))
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the demo's group, not its child's
        got, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, got + err
    assert "Traceback" not in got + err
    assert err.strip().splitlines()[-1] == (
        f"[demo] stopped by Ctrl-C while training 1/2 (clip): kept the synthetic data in {out / 'data'} (a rerun "
        f"reuses them); no report was written (demo.md, demo.json and demo.png in {out} are an earlier run's, if "
        "there)"
    )
    assert [p for p in trainer if alive(p)] == []
