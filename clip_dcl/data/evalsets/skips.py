"""Skipped samples: what the evaluation readers leave out, why, and the count of each cause."""

from __future__ import annotations

from dataclasses import dataclass

#: Why an evaluation sample (or a shard's rest) is left out, in the order the counts are listed.
SKIP_CAUSES = (
    "no caption",
    "empty caption",
    "undecodable caption",
    "no image",
    "undecodable image",
    "no label",
    "undecodable label",
    "shard ended early",
)


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
