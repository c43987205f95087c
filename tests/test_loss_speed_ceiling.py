"""benchmarks/loss_speed.py: the batch ceiling from the measured peaks, and the README's sentence from the JSON."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import loss_speed  # noqa: E402

TILED = f"decl rate=index tile={loss_speed.TILE}"


def _rows(peak, names, batches=(4096, 8192, 16384)):
    return [{"device": "cpu", "G": g, "loss": n, "peak_extra_bytes": peak(n, g)} for n in names for g in batches]


def test_the_ceiling_solves_the_fit_of_each_kind():
    # the whole matrix: 16 G^2 bytes reach 4 GiB at G = 16384; tiled: 40 kB per anchor plus 1 MB
    def peak(name, g):
        return 16 * g * g if name == loss_speed.BASELINE else 40_000 * g + 1_000_000

    got = {
        c["loss"]: c for c in loss_speed.batch_ceilings(_rows(peak, [loss_speed.BASELINE, TILED]), loss_speed.LOSSES)
    }
    assert got[loss_speed.BASELINE]["ceiling"] == 16384 and got[loss_speed.BASELINE]["model"] == "a G^2 + b G"
    assert got[TILED]["ceiling"] == (4 * 2**30 - 1_000_000) // 40_000 // 256 * 256
    assert got[TILED]["largest_measured"] == 16384


def test_a_loss_measured_at_one_batch_gets_no_ceiling():
    rows = _rows(lambda n, g: 1.0, [loss_speed.BASELINE], batches=(4096,))
    assert loss_speed.batch_ceilings(rows, loss_speed.LOSSES) == []


def test_the_readme_sentence_reads_the_ratios_at_8192():
    names = [loss_speed.BASELINE] + [
        f"{n} tile={loss_speed.TILE}" for n in ("dcl", "dcl HCL beta=1", "decl rate=index")
    ]
    rows = [
        {"device": "cpu", "G": 8192, "loss": n, "seconds": 1.0 + i / 10, "peak_extra_bytes": 100 - 20 * i}
        for i, n in enumerate(names)
    ]
    doc = {"rows": rows, "tile": 1024, "dim": 512, "date": "2026-12-07 03:00", "machine": "a CPU", "ceilings": []}
    text = loss_speed.readme_block(doc)
    assert "`dcl` 0.80x, HCL 0.60x, `decl` 0.40x" in text
    assert "in 1.10x to 1.30x its time" in text and "a CPU" in text
