"""How a sample's id is made from its shard: the row of per-sample state (``--loss decl --decl-rate index``).

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

The trainer places ids of several ``::``-joined sources in blocks (:mod:`clip_dcl.train.ids`); the
packed training set (:mod:`clip_dcl.data.packed`) stores the same ids.

Written here because neither OpenCLIP nor webdataset makes ids of sample keys.
"""

from __future__ import annotations

import hashlib
import os
from typing import Mapping, Optional

#: Ids of the hash fallback without a buffer size are taken modulo this (they fit an int64).
_HASH_MODULUS = 2**62


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
