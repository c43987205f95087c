"""A sample's id from its shard: its row of per-sample state (``--loss decl --decl-rate index``), the same every epoch,
rank and worker. In order of preference: img2dataset's ``json["key"]``, a numeric ``__key__``, else a hash of the
shard's file name and ``__key__`` modulo ``num_samples``.

img2dataset's keys are ``shard_index * 10**k + index_in_shard`` (``10**k`` >= samples it tried per shard), so with
failed downloads ``--decl-num-samples`` must exceed the largest key, not the count in ``sizes.json``. The hash
shares rows: with ``num_samples = n`` about 63 % of samples (``1 - 1/e``) share a row, with ``10 n`` about 9.5 %
(``1 - e**-0.1``); sharers share their rate estimate. The trainer blocks ids of ``::``-joined sources
(``clip_dcl.train.ids``); ``clip_dcl.data.packed`` stores the same ids.
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
    """blake2b of ``"<shard file name>/<key>"`` in ``[0, num_samples)`` (``[0, 2**62)`` without); the file name
    only, so that moving the data (or ``pipe:`` / ``s3://`` urls) keeps the ids."""
    name = os.path.basename(str(url).rstrip("/").split("?")[0])
    digest = hashlib.blake2b(f"{name}/{key}".encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (num_samples if num_samples else _HASH_MODULUS)


def sample_id(sample: Mapping, num_samples: Optional[int] = None, with_kind: bool = False):
    """The id of a decoded webdataset sample (module docstring), or ``(id, hashed)`` with ``with_kind``. Numeric ids
    may exceed ``num_samples``: the caller reports that (a buffer too small, not a bad sample)."""
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
