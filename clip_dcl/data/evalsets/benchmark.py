"""CLIP_benchmark's webdataset layout: metadata and classification shards as (image, label)."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ..skips import Skip
from .files import describe_folder, read_classnames, read_templates
from .samples import ShardSamples, sample_image

#: Image keys CLIP_benchmark's webdataset reader accepts, in its order.
BENCHMARK_IMAGE_KEYS = ("webp", "png", "jpg", "jpeg")
BENCHMARK_TYPES = ("classification", "retrieval", "multilabel")


@dataclass
class BenchmarkShards:
    """A data set in CLIP_benchmark's webdataset layout (what ``clip_benchmark_export_wds`` writes)::

    ROOT/dataset_type.txt                       retrieval | multilabel (absent: classification)
    ROOT/classnames.txt                         one class name per line (classification)
    ROOT/zeroshot_classification_templates.txt  one template per line, {c} for the name
    ROOT/<split>/nshards.txt                    the shard count n
    ROOT/<split>/0.tar ... (n-1).tar            samples: image + .txt (captions, one per line),
                                                .cls (label id) or .npy (multi-hot labels)
    """

    root: Path
    split: str
    shards: list[str]
    dataset_type: str
    classnames: list[str] | None
    templates: list[str] | None


def benchmark_layout_root(path: str | os.PathLike, split: str = "test") -> tuple[Path, str] | None:
    """``(root, split)`` for a CLIP_benchmark data set root or split folder, else ``None``."""
    path = Path(path)
    if (path / split / "nshards.txt").is_file():
        return path, split
    if (path / "nshards.txt").is_file():
        return path.parent, path.name
    return None


def read_benchmark_shards(path: str | os.PathLike, split: str = "test") -> BenchmarkShards:
    """The metadata of a CLIP_benchmark data set (root or split folder); ``ValueError`` naming what is amiss."""
    found = benchmark_layout_root(path, split)
    if found is None:
        raise ValueError(
            f"{str(path)!r} is not in CLIP_benchmark's webdataset layout (no {split}/nshards.txt); "
            f"found {describe_folder(path)}"
        )
    root, split = found
    nfile = root / split / "nshards.txt"
    try:
        n = int(nfile.read_text().strip())
    except ValueError:
        raise ValueError(f"{str(nfile)!r} must hold the shard count, got {nfile.read_text().strip()[:40]!r}") from None
    if n < 1:
        raise ValueError(f"{str(nfile)!r} says {n} shards")
    shards = [str(root / split / f"{i}.tar") for i in range(n)]
    missing = [s for s in shards if not os.path.isfile(s)]
    if missing:
        raise ValueError(f"{str(nfile)!r} says {n} shards but {missing[0]!r} does not exist")
    dataset_type = "classification"
    if (root / "dataset_type.txt").is_file():
        dataset_type = (root / "dataset_type.txt").read_text().strip().lower()
        if dataset_type not in BENCHMARK_TYPES:
            raise ValueError(
                f"{str(root / 'dataset_type.txt')!r} says {dataset_type!r}; expected one of {list(BENCHMARK_TYPES)}"
            )
    classnames = read_classnames(root / "classnames.txt") if (root / "classnames.txt").is_file() else None
    tfile = root / "zeroshot_classification_templates.txt"
    templates = read_templates(tfile) if tfile.is_file() else None
    return BenchmarkShards(
        root=root, split=split, shards=shards, dataset_type=dataset_type, classnames=classnames, templates=templates
    )


def _classification_item(transform: Callable, multilabel: bool, sample: dict):
    import numpy as np
    import torch

    url, key = sample.get("__url__"), sample.get("__key__")
    ext = "npy" if multilabel else "cls"
    if ext not in sample:
        return Skip(url, key, "no label", f"no .{ext}")
    try:
        if multilabel:
            label = torch.as_tensor(np.load(io.BytesIO(sample[ext]), allow_pickle=False), dtype=torch.float32)
        else:
            label = int(sample[ext].decode("utf-8").strip())
    except (ValueError, UnicodeDecodeError, OSError, EOFError) as e:
        return Skip(url, key, "undecodable label", f".{ext}: {type(e).__name__}: {e}")
    img = sample_image(sample, BENCHMARK_IMAGE_KEYS)
    if isinstance(img, Skip):
        return img
    return transform(img), label


def classification_wds(
    shards: Sequence[str], transform: Callable, multilabel: bool = False, markers: bool = False, strict: bool = False
):
    """Dataset of ``(transform(image), label)`` in shard order (``.cls`` ids, or ``.npy`` multi-hot with
    ``multilabel``); an unusable sample is a `Skip` (see `ShardSamples`)."""
    import functools

    return ShardSamples(shards, functools.partial(_classification_item, transform, multilabel), markers, strict)
