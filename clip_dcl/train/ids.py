"""Per-sample ids in training, for the losses that keep per-sample state (``--loss decl --decl-rate index``).

How one sample's id is made from its shard (the img2dataset key, a numeric ``__key__``, or a hash of
the shard's file name and key) is the data's business: `clip_dcl.data.ids`. This module places
those ids in the loss's buffer, and gives map-style data sets their indices as ids.

**Several sources.** ``--train-data 'a/{0..9}.tar::b/{0..9}.tar'`` joins sources whose keys
each start at 0. So with ``k`` sources, source ``i`` (in the order given) owns the ids
``[i * B, (i + 1) * B)`` where ``B`` is ``--decl-num-samples`` (default: the largest ``sizes.json``
total of any source): a sample's id is ``i * B + key`` (hash fallback: ``i * B + hash % B``), and
the buffer has ``k * B`` rows. A key that is not below ``B`` stops the run and names the flag.

Collisions are checked in the first epoch of a run: the trainer logs the number of distinct
samples (by shard url and key) against the number of distinct ids, and warns when they differ.

Written here because neither OpenCLIP nor webdataset hands sample keys to the loss.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Mapping, Optional, Tuple

import torch

from .preempt import chain_worker_init


class MissingSampleIds(RuntimeError):
    """The loss needs sample ids (``--decl-rate index``) and the training batches carry none."""


class SampleIdOutOfRange(RuntimeError):
    """A sample id does not fit the loss's per-sample buffer (``--decl-num-samples`` is too small),
    or is negative."""


def num_sources(train_data: Optional[str]) -> int:
    """How many ``::``-joined sources ``--train-data`` names."""
    return len(train_data.split("::")) if train_data else 0


def id_layout(train_data: str, block: Optional[int]) -> Tuple[Dict[str, int], Optional[int]]:
    """``({shard url: source index}, ids per source)`` of ``--train-data``; ``block`` is None for one source."""
    from open_clip_train.data import expand_urls

    sources = {}
    for i, part in enumerate(train_data.split("::")):
        for url in expand_urls(part)[0]:
            sources.setdefault(url, i)
    return sources, (block if num_sources(train_data) > 1 else None)


def source_index(sources: Mapping[str, int], url) -> int:
    """The index of the source a shard url belongs to (0 when unknown)."""
    return sources.get(str(url), 0)


class IndexedDataset(torch.utils.data.Dataset):
    """A map-style data set whose items also carry their index, which is the sample id.

    For OpenCLIP's ``CsvDataset`` that is the row of the CSV (so ids are stable as long as the CSV
    keeps its rows in place: a split or reordered CSV gives other rows the same ids), for its
    ``SyntheticDataset`` the sample's index.
    """

    def __init__(self, base):
        self.base = base

    def __len__(self):
        return len(self.base)

    def __getitem__(self, idx):
        return (*self.base[idx], torch.tensor(idx, dtype=torch.long))


def with_indices(info):
    """OpenCLIP's ``DataInfo`` of a map-style training set, its batches extended with the sample ids.

    The same sampler (OpenCLIP's ``DistributedSampler``, or the random sampler of one process),
    batch size, workers and ``drop_last``, so the data order is OpenCLIP's own.
    """
    from torch.utils.data import DataLoader

    old = info.dataloader
    loader = DataLoader(IndexedDataset(old.dataset), batch_size=old.batch_size, sampler=old.sampler,
                        num_workers=old.num_workers, pin_memory=old.pin_memory, drop_last=old.drop_last,
                        collate_fn=old.collate_fn, persistent_workers=old.persistent_workers,
                        worker_init_fn=chain_worker_init(old.worker_init_fn))
    loader.num_samples, loader.num_batches = old.num_samples, old.num_batches
    return dataclasses.replace(info, dataloader=loader)
