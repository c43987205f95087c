"""Skipped samples: what every reader of image-caption pairs leaves out (training's shards and CSV, ``data shards``,
``data pack``, ``eval``), why, in one vocabulary of causes, and the count of each cause."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

#: Why a sample (or a shard's rest) is left out, in the order the counts are listed. The same cause has the same
#: name in every reader, so that training, ``data shards`` and ``eval`` count one file alike.
SKIP_CAUSES = (
    "no caption",
    "empty caption",
    "undecodable caption",
    "no image",
    "image not found",
    "undecodable image",
    "no label",
    "undecodable label",
    "shard ended early",
)


def empty_caption(caption) -> bool:
    """Whether a listed caption is no caption: None, blank, or pandas' NaN for an empty CSV cell (which would
    otherwise train as the text "nan")."""
    return caption is None or (isinstance(caption, float) and math.isnan(caption)) or not str(caption).strip()


def row_cause(image, caption, image_exists: Callable[[str], bool]) -> Optional[str]:
    """Why a listed pair (a CSV's row) is left out, or None: ``"no image"`` (no path), ``"empty caption"``,
    ``"image not found"`` (``image_exists(image)`` is false), in that order. Every reader of a CSV applies it,
    each resolving a relative path as it documents."""
    if image is None or (isinstance(image, float) and math.isnan(image)) or not str(image).strip():
        return "no image"
    if empty_caption(caption):
        return "empty caption"
    return None if image_exists(str(image)) else "image not found"


@dataclass(frozen=True)
class Skip:
    """A sample left out (``key`` None: the rest of a shard), where it was and why."""

    url: str
    key: str | None
    cause: str
    detail: str = ""

    def describe(self) -> str:
        where = f"sample {self.key!r} in {self.url}" if self.key is not None else f"shard {self.url}"
        return f"{where}: {self.cause}" + (f" ({self.detail})" if self.detail else "")


class SampleSkipped(ValueError):
    """``--strict``: a sample the evaluation would otherwise skip; the message names it and the cause."""


class SkipCounter:
    """Counts skips by cause, logging each (unless not ``log``); with ``strict`` the first raises `SampleSkipped`."""

    def __init__(self, strict: bool = False, log: bool = True):
        import collections

        self.strict, self.log = strict, log
        self.counts: collections.Counter = collections.Counter()

    def record(self, skip: Skip) -> None:
        if self.strict:
            raise SampleSkipped(f"{skip.describe()} (--strict: without it, the sample would be skipped and counted)")
        import logging

        self.counts[skip.cause] += 1
        if self.log:
            logging.getLogger(__name__).warning("skipping %s", skip.describe())

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict[str, int]:
        """``{cause: count}`` of the causes met (empty when nothing was skipped)."""
        order = list(SKIP_CAUSES) + sorted(c for c in self.counts if c not in SKIP_CAUSES)
        return {c: int(self.counts[c]) for c in order if self.counts[c]}

    def summary(self) -> str:
        return f"{self.total} skipped" + (
            f" ({', '.join(f'{c} {n}' for c, n in self.as_dict().items())})" if self.total else ""
        )
