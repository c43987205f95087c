"""Per-sample ids for the losses that keep per-sample state (``--loss decl --decl-rate index``).

A sample's id is the row of the loss's buffer that belongs to it, so it must be the same every
time the sample comes back (every epoch, on every rank, in every dataloader worker). In order of
preference:

1. the img2dataset global key, ``json["key"]`` (``"000000123"`` -> 123), unique across shards;
2. a numeric ``__key__`` (the tar member name without extension, e.g. ``000000123.jpg``);
3. otherwise a stable hash of the shard's file name and ``__key__``, modulo ``num_samples``.

img2dataset's keys are ``shard_index * 10**k + index_in_shard`` with ``10**k`` at least the number
of samples per shard it *tried* to download, so with failed downloads the largest key exceeds the
number of samples in ``sizes.json``: the buffer size (``--decl-num-samples``) must then be set
above the largest key (e.g. ``number_of_shards * 10**k``).

The hash fallback (3) maps ``n`` samples into ``num_samples`` rows at random, so rows are shared:
with ``num_samples = n`` about 63 % of the samples (``1 - (1 - 1/n)**(n-1) ~ 1 - 1/e``) share a
row with at least one other sample and about 37 % of the rows stay unused; with
``num_samples = 10 n`` about 9.5 % (``1 - e**-0.1``) share a row. Samples that share a row share
their rate estimate (the moving average mixes them), which blurs the per-sample estimate but
keeps the loss well defined. Prefer shards whose json carries a numeric ``key``.

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
import hashlib
import os
from typing import Dict, Mapping, Optional, Tuple

import torch

from .preempt import chain_worker_init

#: Ids of the hash fallback without a buffer size are taken modulo this (they fit an int64).
_HASH_MODULUS = 2 ** 62


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


def _numeric(key) -> Optional[int]:
    """``int(key)`` for an int or an all-digits string (``"000000123"`` -> 123), else ``None``."""
    if isinstance(key, bool):
        return None
    if isinstance(key, int):
        return key
    if isinstance(key, str):
        key = key.strip()
        if key.isdigit() and key.isascii():
            return int(key)
    return None


def hashed_id(url: str, key: str, num_samples: Optional[int] = None) -> int:
    """Stable id of ``key`` in the shard ``url``: blake2b of ``"<shard file name>/<key>"``.

    Only the shard's file name is hashed, not its folder, so that moving the data (or reading it
    through ``pipe:`` / ``s3://`` urls) keeps the ids. Returns a value in ``[0, num_samples)``
    (``[0, 2**62)`` when ``num_samples`` is None).
    """
    name = os.path.basename(str(url).rstrip("/").split("?")[0])
    digest = hashlib.blake2b(f"{name}/{key}".encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (num_samples if num_samples else _HASH_MODULUS)


def sample_id(sample: Mapping, num_samples: Optional[int] = None, with_kind: bool = False):
    """The id of one decoded webdataset sample (a dict with ``__key__``, ``__url__``, maybe ``json``).

    See the module docstring for the order of preference. The numeric ids (1, 2) are returned as
    they are, even when they exceed ``num_samples``: the caller reports that, because it means
    the buffer is too small, not that the sample is bad. With ``with_kind``, returns
    ``(id, hashed)``, ``hashed`` true for the hash fallback.
    """
    meta = sample.get("json")
    key = None
    if isinstance(meta, Mapping):
        key = _numeric(meta.get("key"))
    raw_key = str(sample.get("__key__", ""))
    if key is None:
        key = _numeric(raw_key.rsplit("/", 1)[-1])
    hashed = key is None
    if hashed:
        key = hashed_id(sample.get("__url__", ""), raw_key, num_samples)
    return (key, hashed) if with_kind else key


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
