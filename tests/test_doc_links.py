"""Every relative link in the README, docs/ and the committed benchmark reports leads to a file that
exists, and every #anchor to a heading of that file (GitHub's slugs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "benchmarks" / "results").glob("*.md")),
]


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    text = re.sub(r"`", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


def links(page: Path):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for m in re.finditer(r"\]\(([^)\s]+)\)", text):
        if not re.match(r"[a-z]+:", m.group(1)):
            yield m.group(1)


def test_slug_follows_githubs_rule():
    assert (
        slug("Does `decl` at batch B reach `clip` at 2B? Which loss when")
        == "does-decl-at-batch-b-reach-clip-at-2b-which-loss-when"
    )
    assert (
        slug("Communication: `--gather-with-grad` against `--no-grad-gather`")
        == "communication---gather-with-grad-against---no-grad-gather"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_somewhere(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path) if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: links to nothing: {broken}"
