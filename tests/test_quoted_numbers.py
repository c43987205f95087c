"""Every number the README and docs quote from a benchmark comes from its committed JSON.

Each generated block (``QUOTES`` of ``benchmarks/quotes.py``) is rendered again from
``benchmarks/results/*.json`` and compared with the text; a block whose markers are missing fails.
Outside the blocks, the Benchmarks sections of docs/results.md (the batch-size testbed's aside, which
quotes through its own generated block) hold no typed measurement: no decimal number, percentage, ratio
or ± outside code spans. Rewrite the blocks with ``python benchmarks/quotes.py README.md docs/*.md``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import quotes

ROOT = Path(__file__).resolve().parents[1]
#: The Benchmarks subsection (docs/results.md) another block (tests/test_batch_size_bench.py) keeps.
NOT_HERE = ("### Batch size: the testbed",)
#: What a typed measurement looks like: a decimal, a percentage, a ratio, a spread.
TYPED = re.compile(r"\d+(?:\.\d+)?x\b|\d+\.\d+|\d\s?%|±")


@pytest.mark.parametrize("quote", quotes.QUOTES, ids=lambda q: q.name)
def test_each_generated_block_equals_its_rendering_from_the_committed_json(quote):
    for name in quote.files:
        text = (ROOT / name).read_text()
        assert quote.begin in text, f"{name} lacks the begin marker of {quote.name!r} (or it was edited)"
        assert quotes.read_block(text, quote.name) == quotes.render(quote), (
            f"{name}: block {quote.name!r} differs from {quote.results}; run "
            "`python benchmarks/quotes.py README.md docs/*.md`"
        )


def test_the_rewrite_command_finds_nothing_to_change():
    files = [str(ROOT / "README.md"), *map(str, sorted((ROOT / "docs").glob("*.md")))]
    assert quotes.main(["--check", *files]) == 0


def test_replace_block_replaces_only_the_named_body_and_refuses_missing_or_repeated_markers():
    q = quotes.QUOTES[0]
    text = f"before\n{q.begin}\nold\n{q.end}\nafter\n"
    new = quotes.replace_block(text, q.name, "new 1.5")
    assert new == f"before\n{q.begin}\nnew 1.5\n{q.end}\nafter\n"
    assert quotes.read_block(new, q.name) == "new 1.5"
    for broken in ("no block here", f"{q.begin}\nold\n", f"old\n{q.end}\n", text + text):
        with pytest.raises(ValueError):
            quotes.replace_block(broken, q.name, "x")


def test_a_changed_number_in_the_json_changes_the_block():
    q = next(q for q in quotes.QUOTES if q.name == "quality numbers")
    doc = json.loads((ROOT / "benchmarks" / "results" / q.results).read_text())
    block = quotes.renderer(q)(doc)
    doc["summary"]["clip"]["zeroshot/top1"]["mean"] += 0.01
    assert quotes.renderer(q)(doc) != block


def benchmark_sections(text: str):
    """(title, body) of the ``### `` subsections under ``## Benchmarks`` (to the next ``## `` or the end)."""
    start = text.index("\n## Benchmarks")
    end = text.find("\n## ", start + 1)
    parts = re.split(r"\n(?=### )", text[start : end if end >= 0 else None])
    return [(p.splitlines()[0], p) for p in parts if p.startswith("### ")]


def strip_quoted(body: str) -> str:
    """``body`` without generated blocks, fenced code and code spans (flags and settings live there)."""
    body = re.sub(r"<!-- (.+?): generated.*?<!-- end of the generated \1 -->", "", body, flags=re.S)
    body = re.sub(r"```.*?```", "", body, flags=re.S)
    body = re.sub(r"\(benchmarks/results/[^)]*\)", "", body)
    return re.sub(r"`[^`]*`", "", body)


def test_the_benchmarks_sections_type_no_measurement_outside_generated_blocks():
    sections = benchmark_sections((ROOT / "docs" / "results.md").read_text())
    assert len(sections) >= 8
    typed = {}
    for title, body in sections:
        if title.startswith(NOT_HERE):
            continue
        found = [m.group(0) for m in TYPED.finditer(strip_quoted(body))]
        if found:
            typed[title] = found
    assert not typed, f"typed numbers outside generated blocks (quote them from the JSON): {typed}"


def test_the_typed_number_check_catches_a_typed_number():
    body = "### X\n\nprose 0.503 and 3 %, 1.2x\n`--tau-plus 0.05` is a flag\n"
    assert [m.group(0) for m in TYPED.finditer(strip_quoted(body))] == ["0.503", "3 %", "1.2x"]


def test_quality_records_every_loss_full_flags_with_the_decl_estimate():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import quality

    flags = quality.full_loss_flags(["--loss", "decl", "--decl-rate", "index"])
    assert flags[:4] == ["--loss", "decl", "--decl-rate", "index"] and "--decl-estimate" in flags
    assert (
        quality.full_loss_flags(["--loss", "decl", "--decl-estimate", "absolute"])[
            quality.full_loss_flags(["--loss", "decl", "--decl-estimate", "absolute"]).index("--decl-estimate") + 1
        ]
        == "absolute"
    )
    assert quality.full_loss_flags(["--loss", "clip"]) == ["--loss", "clip"]
    assert "estimate" in quality.decl_estimate({"loss_flags": {"decl": flags}})
