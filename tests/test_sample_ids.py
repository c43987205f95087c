"""How a sample's id is made from its shard (:mod:`clip_dcl.data.ids`): the key's order of preference
and the hash fallback's collision rate that the module documents."""

from __future__ import annotations

import math

import numpy as np

from clip_dcl.data.ids import hashed_id, sample_id


def test_sample_id_prefers_json_key_then_numeric_key_then_hash():
    assert sample_id({"json": {"key": "000000123"}, "__key__": "000000007", "__url__": "a.tar"}) == 123
    assert sample_id({"json": {"caption": "x"}, "__key__": "000000007", "__url__": "a.tar"}) == 7
    assert sample_id({"__key__": "sub/000000042", "__url__": "a.tar"}) == 42
    hashed = sample_id({"__key__": "cat_photo", "__url__": "/data/cc3m/00012.tar"}, num_samples=1000)
    assert hashed == hashed_id("/elsewhere/00012.tar", "cat_photo", 1000)  # only the shard's file name counts
    assert 0 <= hashed < 1000
    assert hashed_id("00012.tar", "cat_photo") != hashed_id("00013.tar", "cat_photo")


def test_hash_fallback_collision_rate_matches_the_documented_figures():
    # data/ids.py documents: with num_samples = n about 1 - 1/e of the samples share a row, with 10 n about 1 - e^-0.1.
    n = 20000
    for factor, expected in ((1, 1 - math.exp(-1)), (10, 1 - math.exp(-0.1))):
        ids = np.array([hashed_id("00000.tar", f"img{i}", factor * n) for i in range(n)])
        _, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
        shared = float(np.mean(counts[inverse] > 1))
        assert abs(shared - expected) < 0.02, (factor, shared, expected)
