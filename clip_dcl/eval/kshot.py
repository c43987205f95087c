"""k-shot subsets and the train / validation split as the ELEVATER toolkit (vision-datasets 0.2.17) draws them."""

from __future__ import annotations

import math
import random
from typing import Sequence

import numpy as np

VAL_SPLIT = 0.2


def shot_plan(shots: int) -> tuple[int, bool]:
    """``(images drawn per class, whether the final run merges train and validation)``: a 1-shot probe is a 2-shot
    draw without the merge, as the toolkit's ``linear_probe.py`` does."""
    if shots < 1:
        raise ValueError(f"shots must be >= 1, got {shots}")
    return (2, False) if shots == 1 else (shots, True)


def sample_few_shot(labels: Sequence[Sequence[int]], num_classes: int, shots: int, seed: int) -> list[int]:
    """Indices of the k-shot subset, in the order kept, as ``DatasetManifest.sample_few_shot_subset`` draws them
    (multilabel: kept while ``min(counts) <= k/2 or max(counts) <= 1.5k`` over its labels and not all full)."""
    if shots < 1:
        raise ValueError(f"shots must be >= 1, got {shots}")
    order = list(range(len(labels)))
    random.Random(seed).shuffle(order)
    counts = [0] * num_classes
    negatives = 0
    kept = []
    for i in order:
        ys = labels[i]
        if not ys:
            if negatives < shots:
                negatives += 1
                kept.append(i)
            continue
        c = [counts[y] for y in ys]
        if min(c) >= shots:
            continue
        if min(c) <= shots / 2 or max(c) <= 1.5 * shots:
            kept.append(i)
            for y in ys:
                counts[y] += 1
        if min(counts) >= shots:
            break
    return kept


def split_train_val(
    labels: Sequence[Sequence[int]], num_classes: int, multilabel: bool, val_split: float = VAL_SPLIT
) -> tuple[list[int], list[int]]:
    """(train positions, val positions) within a subset, as the toolkit's ``get_dataloader(val_split=0.2)``: each
    class's first ``ceil(val_split * n_c)`` to val; multilabel: a greedy fill, first image of the first class short.
    """
    n = len(labels)
    if multilabel:
        mat = np.zeros((n, num_classes))
        for i, ys in enumerate(labels):
            mat[i, list(ys)] = 1
        need = np.ceil(mat.sum(0) * val_split)
        val = []
        targets = np.where(need > 0)[0]
        while targets.size > 0:
            row = int(np.where(mat[:, targets[0]] > 0)[0][0])
            val.append(row)
            need -= mat[row]
            mat[row] = 0
            targets = np.where(need > 0)[0]
    else:
        if any(len(ys) != 1 for ys in labels):
            raise ValueError("single-label split needs exactly one label per image")
        flat = [ys[0] for ys in labels]
        val = []
        for c in dict.fromkeys(flat):
            members = [i for i, y in enumerate(flat) if y == c]
            val.extend(members[: math.ceil(len(members) * val_split)])
    val_set = set(val)
    train = [i for i in range(n) if i not in val_set]
    return train, val
