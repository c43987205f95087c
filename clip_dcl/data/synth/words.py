"""A word-level vocabulary for the synthetic captions as byte-pair merges OpenCLIP's ``SimpleTokenizer`` reads (it
ships no learner): its 49,408 tokens would make most of a tiny model's parameters a table for a hundred words.
"""

from __future__ import annotations

import gzip
import re
from collections import Counter
from pathlib import Path
from typing import Iterable, List, Sequence, Tuple

import numpy as np

from . import captions as _captions
from .attributes import COLOURS, SHAPES, sample_attributes

#: the words of SimpleTokenizer's pre-tokeniser that matter here: runs of letters (punctuation stays bytes)
_WORD = re.compile(r"[^\W\d_]+")
#: captions drawn to collect the words of every sentence pattern (the patterns' own words are fixed strings)
_DRAWS = 4000


def _strings(obj) -> Iterable[str]:
    """Every string inside nested tuples, dicts (keys and values) and lists."""
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(obj, (tuple, list)):
        for v in obj:
            yield from _strings(v)


def caption_words() -> List[str]:
    """Every word the synthetic data writes (captions, class names, prompts, few-shot names), lower case, sorted."""
    from .attributes import BACKGROUNDS, POSITIONS, SIZES
    from .layout import DIGIT_NAMES

    texts = list(
        _strings(
            [
                _captions._SHAPE_NOUNS,
                _captions._COLOUR_WORDS,
                _captions._SIZE_WORDS,
                _captions._COUNT_WORDS,
                _captions._POSITION_PHRASES,
                _captions._BACKGROUND_WORDS,
                _captions._PREFIXES,
                _captions.ZEROSHOT_TEMPLATES,
                list(SHAPES),
                list(COLOURS),
                list(DIGIT_NAMES),
                list(POSITIONS),
                list(SIZES),
                list(BACKGROUNDS),
            ]
        )
    )
    rng = np.random.default_rng(0)
    for _ in range(_DRAWS):
        attrs = sample_attributes(rng, SHAPES[rng.integers(len(SHAPES))], COLOURS[rng.integers(len(COLOURS))])
        texts.append(_captions.make_caption(attrs, rng))
    return sorted({w.lower() for t in texts for w in _WORD.findall(t)})


def learn_merges(words: Sequence[str]) -> List[Tuple[str, str]]:
    """Byte-pair merges, in rank order, after which each of ``words`` (non-empty letters) is one symbol: each round
    merges the adjacent pair in most words not yet whole (ties: the smallest), the last character marked ``</w>``."""
    bad = [w for w in words if not w or not _WORD.fullmatch(w)]
    if bad:
        raise ValueError(f"words must be runs of letters; got {bad[:3]!r}")
    pieces = {w: tuple(w[:-1]) + (w[-1] + "</w>",) for w in sorted(set(words))}
    merges: List[Tuple[str, str]] = []
    while True:
        counts: Counter = Counter()
        for sym in pieces.values():
            if len(sym) > 1:
                counts.update(set(zip(sym, sym[1:])))
        if not counts:
            return merges
        best = min(counts, key=lambda p: (-counts[p], p))
        merges.append(best)
        for w, sym in pieces.items():
            out, i = [], 0
            while i < len(sym):
                if i + 1 < len(sym) and (sym[i], sym[i + 1]) == best:
                    out.append(sym[i] + sym[i + 1])
                    i += 2
                else:
                    out.append(sym[i])
                    i += 1
            pieces[w] = tuple(out)


def merges_text(merges: Sequence[Tuple[str, str]]) -> str:
    """The merges file's text: a header line, then a merge a line, no newline at the end (it would be a token)."""
    return "\n".join(["#version: clip-dcl synthetic caption words", *(f"{a} {b}" for a, b in merges)])


def write_merges(path, merges: Sequence[Tuple[str, str]]) -> Path:
    """Write ``merges`` gzipped, with no file name or time in the header (same merges, same bytes)."""
    path = Path(path)
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
        f.write(merges_text(merges).encode("utf-8"))
    return path


def vocab_size(merges: Sequence[Tuple[str, str]]) -> int:
    """SimpleTokenizer's vocabulary size for ``merges``: 512 byte symbols, the merges, two special tokens."""
    return 512 + len(merges) + 2
