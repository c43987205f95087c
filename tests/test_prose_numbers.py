"""No result number is typed in the README's or the docs' prose: results come from generated blocks.

A *result number* is a number next to what results are stated in: points, seeds (a count of them),
a percentage, a ratio (``2.4x``), a retrieval or zero-shot metric (``R@1``, ``top-1``) or a verdict
word (beats, reaches, matches, trails, tie, no verdict). Outside the generated blocks (the
``<!-- NAME: generated ... -->`` markers of ``benchmarks/quotes.py``), fenced code, code
spans and link targets, README.md and docs/*.md hold none. The numbers that are settings, not
results, are the exceptions of :data:`EXCEPTIONS`, each with its reason; nothing else is guessed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]

NUMBER = r"(?<![\w.])[+-]?\d[\d,]*(?:\.\d+)?"
#: what a result is stated in, right after a number
UNIT_AFTER = r"\s?(?:points?|pts|seeds|%|x\b|×)"
#: what a result is stated in, a few words before or after a number
NEAR = re.compile(
    r"R@\d+|\btop-\d\b|\b(?:beats?|beaten|reach(?:es|ed)?|match(?:es|ed)?|trails?|ties?|tied|verdict|lead|"
    r"gains?|margin)\b",
    re.I,
)
#: how many words on each side of a number a word of :data:`NEAR` is looked for
WINDOW = 6

#: numbers that are settings, not results: (pattern, why). Matched text is blanked before the search.
EXCEPTIONS = [
    (r"\bB\s?=\s?\d+(?:\s?(?:,|and|or|to|-)\s?\d+)*", "a batch size (or a list of them) is a setting"),
    (
        r"\b(?:at|from|batch(?:es)? of)\s\d+(?:\s?(?:,|and|or|to|-)\s?\d+)*(?:\s(?:up|and up))?\b",
        "'at 32', 'from 16 to 256', 'batches of 32': batch sizes, which name the arms",
    ),
    (r"\b\d*B\b", "'2B', twice the batch, names an arm"),
    (r"\bdefaults? (?:to|is) \d+", "a default value is a setting"),
    (r"\b\d+ x [A-Z]\b", "a formula (4 x G floats)"),
    (r"\b\d+ ?% per-class validation", "the ELEVATER protocol's validation share, a setting"),
    (r"\b(?:prior|tau_plus|tau\+|temperature|logit scale|lambda|gamma)(?: of| at)? \d+(?:\.\d+)?", "a loss setting"),
    (r"\b9[05] % (?:t-)?(?:confidence|interval|level)", "the confidence level of the rule is a setting"),
    (r"\b\d+ ?% (?:t-)?interval", "an interval's confidence level is a setting"),
    (r"\d+x\d+", "an image size (64x64)"),
    (
        r"\b\d[\d,]* ?(?:images?|pairs?|classes|class|epochs?|steps?|samples?|px|GPUs?|cores?|shards?|ranks?|nodes?"
        r"|captions?|layers?|tokens?|threads?|workers?|runs?|MB|GB|GiB|KB|bits?|min(?:utes)?|s\b|seconds)",
        "a size or a count of the setup (data, model, machine, budget)",
    ),
    (r"\b(?:R@|top-)\d+(?:/\d+)*", "the metric's own name (R@1/5/10, top-1)"),
    (r"\bseeds? \d+(?:\s?(?:-|to|,|and)\s?\d+)*", "which seeds (their names), not how many"),
    (
        r"\b(?:Python|torch|PyTorch|OpenCLIP|open_clip_torch|NumPy|webdataset|CLIP_benchmark|version)"
        r"\s?[<>=]*\s?\d+(?:\.\d+)+",
        "a version",
    ),
    (r"\b\d+\.\d+\.\d+\b", "a version"),
    (r"\b(?:Table|Figure|Eq\.|Equation|section|issue|page)\s?\d+", "a reference into a paper or page"),
    (r"\bone point of R@1", "the evaluation's resolution, a setting of the rule"),
]


def prose(text: str) -> str:
    """``text`` without generated blocks, fenced code, code spans, link targets and HTML comments."""
    text = re.sub(r"<!-- (.+?): generated.*?<!-- end of the generated \1 -->", " ", text, flags=re.S)
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return re.sub(r"`[^`]*`", " ", text)


def result_numbers(text: str):
    """The typed result numbers of ``text`` (prose only), each with a little context."""
    original = prose(text)
    body = original
    for pattern, _why in EXCEPTIONS:  # blanked, so that offsets stay those of ``original``
        body = re.sub(pattern, lambda m: " " * len(m.group(0)), body, flags=re.I)
    found = []
    for m in re.finditer(NUMBER, body):
        before = original[: m.start()].split()[-WINDOW:]
        after = original[m.end() :].split()[:WINDOW]
        if (
            re.match(UNIT_AFTER, body[m.end() : m.end() + 8])
            or re.match(r"\s?\[" + NUMBER, body[m.end() :])
            or NEAR.search(" ".join(before + after))
        ):
            found.append(" ".join(original[max(0, m.start() - 30) : m.end() + 20].split()))
    return found


@pytest.mark.parametrize("page", PAGES)
def test_no_page_types_a_result_number_outside_generated_blocks(page):
    found = result_numbers((ROOT / page).read_text())
    assert not found, (
        f"{page} types result numbers outside generated blocks (quote them from a results JSON "
        f"through benchmarks/quotes.py, or list a setting in EXCEPTIONS): {found}"
    )


@pytest.mark.parametrize(
    "typed",
    [
        "`decl` reaches `clip` at twice the batch, by 7.9 points (12 seeds, 95 %).",
        "On the test split it gains 3 points over clip.",
        "decl beats clip at B = 32 with a margin of 4.3.",
        "the new recipe runs in 0.28x the time",
        "R@1 rose to 41.7 on the test split.",
        "zero-shot top-1 of 0.48 against 0.15",
        "a lead of +4.5 [+0.3, +8.7] over clip",
    ],
)
def test_the_check_catches_a_typed_result_number(typed):
    assert result_numbers(typed), typed


@pytest.mark.parametrize(
    "setting",
    [
        "at B = 32 and 64 `decl` beats `clip` at B = 32 (the interval above zero)",
        "a 90 % t-interval over seeds; seeds 3-7 are fresh",
        "12,000 pairs of 48 classes at 64x64, 20 epochs on 2 cores",
        "`--tau-plus 0.05` is a flag, and so is `--epochs 20`",
        "the R@1/5/10 and top-1/top-5 columns",
        "Python 3.11 and torch 2.14.1",
        "about one point of R@1 on 1,000 images is a tie",
        "<!-- x: generated by y -->\nbeats by 7.9 points\n<!-- end of the generated x -->",
    ],
)
def test_settings_and_generated_blocks_are_not_result_numbers(setting):
    assert result_numbers(setting) == []
