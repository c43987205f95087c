"""The benchmark-only ``unbiased`` oracle loss against a loop re-computation."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from train_oracle import UnbiasedOracleLoss  # noqa: E402


def test_oracle_drops_exactly_the_same_class_negatives():
    gen = torch.Generator().manual_seed(0)
    n, s = 9, 7.0
    f = F.normalize(torch.randn(n, 6, generator=gen, dtype=torch.float64), dim=-1)
    g = F.normalize(torch.randn(n, 6, generator=gen, dtype=torch.float64), dim=-1)
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 0, 1, 2, 1, 0])  # label of sample id k
    ids = torch.tensor([3, 0, 1, 11, 5, 6, 2, 9, 4])
    loss = UnbiasedOracleLoss(labels)(f, g, torch.tensor(s, dtype=torch.float64), sample_ids=ids)
    y = labels[ids]
    total = 0.0
    for a, c in ((f, g), (g, f)):
        rows = []
        for i in range(n):
            terms = [torch.exp(s * a[i] @ c[i])]
            terms += [torch.exp(s * a[i] @ c[j]) for j in range(n) if j != i and y[j] != y[i]]
            rows.append(-torch.log(terms[0] / sum(terms)))
        total = total + torch.stack(rows).mean()
    torch.testing.assert_close(loss, total / 2)
