"""benchmarks/fscenes_gate.py: the gate's rule read off a work folder of runs written here."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import fscenes_gate as gate
import pytest

PLAN = Path(gate.STUDIES) / "fscenes_gate.toml"


def _work(tmp_path: Path, scores: dict) -> Path:
    """A work folder with ``scores[B] = [R@1 per seed]`` (points) for the gate's seeds 1, 2, 3."""
    for b, values in scores.items():
        for seed, v in zip((1, 2, 3), values):
            folder = tmp_path / "runs" / f"clip-b{b}" / f"seed{seed}"
            folder.mkdir(parents=True)
            r = {
                "retrieval/mean_R@1": v / 100,
                "retrieval/image_to_text_R@1": v / 100,
                "retrieval/text_to_image_R@1": v / 100,
                "zeroshot/top1": 0.3,
            }
            (folder / "scores-validation.json").write_text(json.dumps(r))
            (folder / "run.json").write_text(json.dumps({"train_seconds": 100.0, "commit": "abc"}))
    return tmp_path


@pytest.mark.parametrize(
    "small, large, verdict",
    [
        ([20, 21, 22], [25, 26, 27], "pass"),
        ([20, 21, 22], [22.5, 23, 24], "fail"),  # every seed above, gain under 3 points
        ([20, 21, 30], [26, 27, 28], "fail"),  # gain over 3 points, one seed of 16 above one of 256
    ],
)
def test_the_rule_needs_the_gain_and_every_seed_above(tmp_path, small, large, verdict):
    g = gate.read_gate(PLAN, _work(tmp_path, {16: small, 32: [22] * 3, 64: [23] * 3, 128: [24] * 3, 256: large}))
    assert g["status"] == "complete" and g["verdict"] == verdict
    assert g["gain"] == pytest.approx(sum(large) / 3 - sum(small) / 3)
    doc = json.loads(json.dumps({"gates": [g], "passed": [g["plan"]] if verdict == "pass" else []}))  # as committed
    assert verdict in gate.readme_block(doc)


def test_no_verdict_while_an_end_of_the_range_lacks_a_seed(tmp_path):
    g = gate.read_gate(PLAN, _work(tmp_path, {16: [20, 21, 22], 256: [25, 26]}))
    assert g["verdict"] == "no verdict" and g["runs_finished"] == 5
    assert "no verdict yet" in gate.readme_block({"gates": [g], "passed": []})


def test_kept_records_hold_no_checkpoint(tmp_path):
    work = _work(tmp_path / "w", {16: [20, 21, 22]})
    (work / "runs" / "clip-b16" / "seed1" / "out.log").write_text(f"log of {work}/runs/clip-b16/seed1\n")
    (work / "runs" / "clip-b16" / "seed1" / "params.txt").write_text(f"logs: {work}/runs/clip-b16\n")
    (work / "runs" / "clip-b16" / "seed1" / "checkpoints").mkdir()
    (work / "runs" / "clip-b16" / "seed1" / "checkpoints" / "epoch_10.pt").write_bytes(b"x")
    assert gate.keep_records(work, tmp_path / "kept") == 3
    kept = {p.relative_to(tmp_path / "kept").as_posix() for p in (tmp_path / "kept").rglob("*") if p.is_file()}
    assert "runs/clip-b16/seed1/out.log.gz" in kept and not any(".pt" in k for k in kept)
    # no path of this machine in what is kept: the work folder is written from its name
    seed1 = tmp_path / "kept" / "runs" / "clip-b16" / "seed1"
    assert (seed1 / "params.txt").read_text() == "logs: $OUTSIDE/w/runs/clip-b16\n"  # _work's folder is w/...
    assert gzip.decompress((seed1 / "out.log.gz").read_bytes()).decode() == "log of $OUTSIDE/w/runs/clip-b16/seed1\n"
