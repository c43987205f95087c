"""Retrieval pairs: a CSV/TSV of (image path, caption) rows, or webdataset shards (folder, pattern, list)."""

from __future__ import annotations

import csv
import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ..skips import Skip, SkipCounter, row_cause
from .benchmark import benchmark_layout_root, read_benchmark_shards
from .files import ImageSource, describe_folder, split_zip_ref
from .samples import ShardSamples, sample_captions, sample_image


@dataclass
class RetrievalCSV:
    """Images and their captions read from a CSV: ``images[i]`` has ``captions[i]`` (>= 1)."""

    images: list[str]
    captions: list[list[str]]
    source: ImageSource


def read_retrieval_csv(
    path: str | os.PathLike,
    img_key: str | None = None,
    caption_key: str | None = None,
    sep: str | None = None,
    skips: SkipCounter | None = None,
) -> RetrievalCSV:
    """A CSV/TSV of (image path, caption) rows (columns found as `csv_columns` finds them), rows of one image grouped
    in order of first appearance, relative paths read from the CSV's folder. A row with an empty caption or image
    path, or whose image file is missing, is skipped and counted in ``skips`` (`--strict` refuses it); a `SkipCounter`
    of its own when none is given."""
    from ..pairs import csv_columns

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"retrieval CSV {str(path)!r} does not exist")
    columns = csv_columns(path, img_key, caption_key, sep)
    ik, ck = columns.img_key, columns.caption_key
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f, delimiter=columns.sep)
        index: dict[str, int] = {}
        images: list[str] = []
        captions: list[list[str]] = []
        skips = SkipCounter() if skips is None else skips
        base = path.parent
        for lineno, row in enumerate(reader, 2):
            img, cap = row.get(ik), row.get(ck)
            cause = row_cause(img, cap, lambda ref: split_zip_ref(ref) is not None or (base / ref).is_file())
            if cause is not None:  # the rules of data shards and training: skipped and counted
                skips.record(Skip(str(path), f"line {lineno}", cause, img or ""))
                continue
            if img not in index:
                index[img] = len(images)
                images.append(img)
                captions.append([])
            captions[index[img]].append(cap.strip())
    if not images:
        raise ValueError(f"retrieval CSV {str(path)!r} has no rows")
    source = ImageSource(path.parent)
    source.check(images, f"retrieval CSV {str(path)!r}")
    return RetrievalCSV(images=images, captions=captions, source=source)


def expand_shards(data: str | os.PathLike | Sequence[str]) -> list[str]:
    """Shard paths from a folder, a brace pattern, ``::``-joined patterns, a ``.tar`` or a list of those."""
    if isinstance(data, (list, tuple)):
        return [s for d in data for s in expand_shards(d)]
    data = str(data)
    if os.path.isdir(data):
        if benchmark_layout_root(data) is not None:
            return read_benchmark_shards(data).shards
        shards = sorted(glob.glob(os.path.join(data, "*.tar")))
        if not shards:
            from ..pairs import caption_folder_hint, is_caption_folder

            if is_caption_folder(data):
                raise ValueError(caption_folder_hint(data))
            raise ValueError(
                f"shard folder {data!r} is in neither layout: no .tar shards (img2dataset's "
                f"layout) and no test/nshards.txt (CLIP_benchmark's webdataset layout); found "
                f"{describe_folder(data)}"
            )
        return shards
    from ...paths import expand_pattern

    shards = expand_pattern(data)
    for s in shards:
        if not os.path.isfile(s):
            raise ValueError(f"shard {s!r} does not exist")
    return shards


def _retrieval_item(transform: Callable, sample: dict):
    caps = sample_captions(sample)
    if isinstance(caps, Skip):
        return caps
    img = sample_image(sample)
    if isinstance(img, Skip):
        return img
    return transform(img), caps, sample["__key__"]


def retrieval_wds(shards: Sequence[str], transform: Callable, markers: bool = False, strict: bool = False):
    """Dataset of ``(transform(image), captions, key)`` in shard order; an unusable sample is a `Skip`."""
    import functools

    return ShardSamples(shards, functools.partial(_retrieval_item, transform), markers, strict)
