"""Per-sample ids in training, for the losses that keep per-sample state (``--decl-rate index``).

With ``k`` ``::``-joined sources, source ``i`` owns ids ``[i * B, (i + 1) * B)`` (``B`` is
``--decl-num-samples`` or the largest source), so keys that each start at 0 do not collide.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Mapping, Optional, Tuple

import torch

from .signals import chain_worker_init


class MissingSampleIds(RuntimeError):
    """The loss needs sample ids (``--decl-rate index``) and the training batches carry none."""


class SampleIdOutOfRange(RuntimeError):
    """A sample id that is negative or does not fit the per-sample buffer (``--decl-num-samples``)."""


def num_sources(train_data: Optional[str]) -> int:
    """How many ``::``-joined sources ``--train-data`` names."""
    return len(train_data.split("::")) if train_data else 0


def id_layout(train_data: str, block: Optional[int]) -> Tuple[Dict[str, int], Optional[int]]:
    """``({shard url: source index}, ids per source)`` of ``--train-data``; ``block`` is None for one source."""
    from ..paths import expand_pattern

    sources = {}
    for i, part in enumerate(train_data.split("::")):
        for url in expand_pattern(part):
            sources.setdefault(url, i)
    return sources, (block if num_sources(train_data) > 1 else None)


def source_index(sources: Mapping[str, int], url) -> int:
    """The index of the source a shard url belongs to (0 when unknown)."""
    return sources.get(str(url), 0)


class IndexedDataset(torch.utils.data.Dataset):
    """A map-style data set whose items carry their index as the sample id (a CSV's row)."""

    def __init__(self, base):
        self.base = base

    def __len__(self):
        return len(self.base)

    def __getitem__(self, idx):
        return (*self.base[idx], torch.tensor(idx, dtype=torch.long))


def with_indices(info, wrap=IndexedDataset, sampler=None):
    """OpenCLIP's ``DataInfo`` of a map-style set with sample ids in its batches (``wrap(dataset)``'s items),
    in OpenCLIP's own order (``sampler``: another one, for a set whose rows changed)."""
    from torch.utils.data import DataLoader

    old = info.dataloader
    loader = DataLoader(
        wrap(old.dataset),
        batch_size=old.batch_size,
        sampler=sampler or old.sampler,
        num_workers=old.num_workers,
        pin_memory=old.pin_memory,
        drop_last=old.drop_last,
        collate_fn=old.collate_fn,
        persistent_workers=old.persistent_workers,
        worker_init_fn=chain_worker_init(old.worker_init_fn),
    )
    loader.num_samples, loader.num_batches = old.num_samples, len(loader)
    return dataclasses.replace(info, dataloader=loader, sampler=sampler or info.sampler)
