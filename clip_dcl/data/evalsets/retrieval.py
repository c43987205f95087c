"""Retrieval pairs: a CSV/TSV of (image path, caption) rows, and webdataset shards in the
Conceptual Captions layout (or CLIP_benchmark's) given as a folder, a brace pattern or a list."""
from __future__ import annotations

import csv
import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from .benchmark import benchmark_layout_root, read_benchmark_shards
from .files import ImageSource, describe_folder
from .samples import ShardSamples, sample_captions, sample_image
from .skips import Skip

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
) -> RetrievalCSV:
    """Read a CSV/TSV of (image path, caption) rows, grouping rows of the same image.

    The separator and the columns, where not given, are found as training finds them
    (:func:`clip_dcl.data.pairs.csv_columns`: a tab when the header line has one, else a comma; the
    first of ``filepath|image|image_path|img|path|file|filename`` and ``title|caption|text|captions``).
    Image paths are relative to the CSV's folder unless absolute. Image order is the order of first
    appearance.
    """
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
        for lineno, row in enumerate(reader, 2):
            img, cap = row.get(ik), row.get(ck)
            if not img or cap is None or not cap.strip():
                raise ValueError(f"retrieval CSV {str(path)!r} line {lineno}: empty image path or caption")
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
    """Shard paths from a folder (its ``*.tar``, sorted; or, in CLIP_benchmark's layout, the
    ``test`` split's ``0..n-1.tar``), a brace pattern, ``::``-joined patterns, a single ``.tar``
    or a list of those; ``ValueError`` naming a missing shard."""
    if isinstance(data, (list, tuple)):
        out = []
        for d in data:
            out.extend(expand_shards(d))
        return out
    data = str(data)
    if os.path.isdir(data):
        if benchmark_layout_root(data) is not None:
            return read_benchmark_shards(data).shards
        shards = sorted(glob.glob(os.path.join(data, "*.tar")))
        if not shards:
            from ..pairs import caption_folder_hint, is_caption_folder

            if is_caption_folder(data):
                raise ValueError(caption_folder_hint(data))
            raise ValueError(f"shard folder {data!r} is in neither layout: no .tar shards (img2dataset's "
                             f"layout) and no test/nshards.txt (CLIP_benchmark's webdataset layout); found "
                             f"{describe_folder(data)}")
        return shards
    import braceexpand

    shards = []
    for part in data.split("::"):
        shards.extend(braceexpand.braceexpand(part))
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
    """Dataset yielding ``(transform(image), captions, key)`` per sample, shards in order.

    A sample without a caption or an image, with an empty caption, a caption that is not UTF-8 (or
    json that does not parse), or an image that does not decode, and the rest of a shard that ends
    early, is a :class:`Skip` (see :class:`ShardSamples` for ``markers`` and ``strict``). Every
    sample carries its own captions, so the interleaving of workers does not matter.
    """
    import functools

    return ShardSamples(shards, functools.partial(_retrieval_item, transform), markers, strict)
