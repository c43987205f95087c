"""The README's demo table is rendered from a demo's JSON through a package module's renderer."""

from __future__ import annotations

import json

import quotes

from clip_dcl import demo


def test_the_demo_block_quotes_the_jsons_table_and_times(tmp_path):
    doc = {
        "machine": "a CPU",
        "date": "2026-11-25 12:00 UTC",
        "minutes": 9.04,
        "runs": {"clip": [{"train_seconds": 181.4}], "dcl": [{"train_seconds": 175.0}]},
        "table": "| metric (%) | chance | clip | dcl |\n|---|---|---|---|\n| zero-shot top-1 | 10.0 | 65.0 | 56.5 |\n",
    }
    block = demo.readme_block(doc)
    assert block.startswith(
        "A run of `clip-dcl demo` on a CPU, 2026-11-25 12:00 UTC: 9.0 minutes of wall-clock time "
        "in all (training 181 s / 175 s for clip / dcl; times, not speed measurements"
    )
    assert block.endswith("| zero-shot top-1 | 10.0 | 65.0 | 56.5 |")
    # a Quote may name a package module instead of a benchmark script
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "demo.json").write_text(json.dumps(doc))
    q = quotes.Quote("demo table", "clip_dcl.demo", "demo.json")
    assert quotes.render(q, root=tmp_path) == block
    doc["minutes"] = 12.0
    (tmp_path / "benchmarks" / "results" / "demo.json").write_text(json.dumps(doc))
    assert quotes.render(q, root=tmp_path) != block


def test_the_readmes_demo_time_is_the_jsons():
    import re

    from quotes import ROOT, read_block

    doc = json.loads((ROOT / "benchmarks" / "results" / "demo.json").read_text())
    block = read_block((ROOT / "README.md").read_text(), "demo time")
    minutes = float(re.search(r"took (\d+\.\d) minutes of wall-clock time on ", block).group(1))
    assert minutes == round(doc["minutes"], 1) and doc["machine"] in block and doc["date"] in block
    assert "proportionally longer" in block and "DEMO_ARGS=--quick" in block
    # a run that records the load around it says so; one that does not (the committed one) is read without it
    with_load = demo.readme_time_block({**doc, "minutes": 6.94, "load_average": {"start": 0.12, "end": 2.05}})
    assert "took 6.9 minutes" in with_load and "load average 0.1 at its start and 2.0 at its end" in with_load
    assert ("load average" in block) == ("load_average" in doc)


def test_demo_help_reads_cleanly():
    text = demo.build_parser().format_help()
    assert "``" not in text and "(default: None)" not in text and "default 4; quick 1" in text
    assert "proportionally longer" in text and "DEMO_ARGS=--quick" in text
