"""k-shot subsets as the ELEVATER toolkit draws them, and its train / validation split.

Pure functions over label lists (vision-datasets 0.2.17's samplers, used by Elevater_Toolkit_IC),
so that the draws are tested without images:

1. **k-shot subset, per seed** (`sample_few_shot`): ``random.Random(seed)`` shuffles the
   train index list (index-file order; COCO indexes sorted by image id, as vision-datasets reads
   them); walking it, an image is kept while a class still has fewer than k images (multilabel:
   kept if ``min(counts) <= k/2 or max(counts) <= 1.5k`` over its labels and not all of them
   full; images without labels kept up to k), stopping once every class has k.
2. **Validation split** (`split_train_val`): the first ``ceil(0.2 n_c)`` images of each class
   in subset order (multilabel: the toolkit's greedy fill), the rest trains.
3. **1 shot** (`shot_plan`): the toolkit's ``linear_probe.py`` turns a 1-shot run into a
   2-shot draw whose final run does not merge train and validation, so 1 image per class trains
   the final head (the other one chose its hyper-parameters).
"""
from __future__ import annotations

import math
import random
from typing import Sequence

import numpy as np

VAL_SPLIT = 0.2


def shot_plan(shots: int) -> tuple[int, bool]:
    """``(images drawn per class, whether the final run merges train and validation)`` for a
    ``shots``-shot probe: ``(2, False)`` for 1 shot, as the toolkit does, else ``(shots, True)``."""
    if shots < 1:
        raise ValueError(f"shots must be >= 1, got {shots}")
    return (2, False) if shots == 1 else (shots, True)


def sample_few_shot(labels: Sequence[Sequence[int]], num_classes: int, shots: int, seed: int) -> list[int]:
    """Indices of the k-shot subset, in the (shuffled) order kept, as vision-datasets 0.2.17's
    ``DatasetManifest.sample_few_shot_subset`` draws it (see the module docstring, step 1).

    For single-label data this is "shuffle, then the first k of each class". A class with fewer
    than k images keeps all of them.
    """
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


def split_train_val(labels: Sequence[Sequence[int]], num_classes: int, multilabel: bool,
                    val_split: float = VAL_SPLIT) -> tuple[list[int], list[int]]:
    """(train positions, val positions) within a few-shot subset, as the toolkit's
    ``get_dataloader(val_split=0.2)`` (``feature.py``) splits it.

    Single-label: the first ``ceil(val_split * n_c)`` images of each class (in subset order) go to
    val (1 of 5 at 5-shot). Multilabel: repeatedly
    take the first image holding the first class still short of ``ceil(val_split * n_c)`` val
    labels. Train keeps the subset order; val is in the order taken.
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
