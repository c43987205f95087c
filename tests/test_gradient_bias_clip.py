"""The CLIP gradient-bias benchmark's pieces: the full-data objective and the expected minibatch gradient.

The decisive check: averaged over *every* partition of a small data set into batches, the gradient
of DeCL's decomposed loss with the exact (full-data) rates equals the full-data gradient, while
InfoNCE's does not; so what the benchmark reports as bias is bias, not a wrong reference.
"""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gradient_bias_clip as gb  # noqa: E402


def features(n, d=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    f = F.normalize(torch.randn(n, d, generator=gen, dtype=torch.float64), dim=-1)
    g = F.normalize(torch.randn(n, d, generator=gen, dtype=torch.float64) + f, dim=-1)
    return f, g, torch.tensor(3.0, dtype=torch.float64)


def slow_full_objective(f, g, s):
    """The module docstring's F with loops: both directions, mean over the N - 1 others."""
    n = len(f)
    total = 0.0
    for a, b in ((f, g), (g, f)):
        rows = []
        for i in range(n):
            mean_neg = sum(torch.exp(s * a[i] @ b[k]) for k in range(n) if k != i) / (n - 1)
            rows.append(-s * a[i] @ b[i] + torch.log(mean_neg))
        total = total + torch.stack(rows).mean()
    return total / 2


def test_full_objective_and_rates_match_loops():
    f, g, s = features(7)
    leaves = [t.clone().requires_grad_() for t in (f, g, s)]
    slow_leaves = [t.clone().requires_grad_() for t in (f, g, s)]
    fast, slow = gb.full_objective(*leaves), slow_full_objective(*slow_leaves)
    torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-12)
    for a, b in zip(torch.autograd.grad(fast, leaves), torch.autograd.grad(slow, slow_leaves)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    rates = gb.full_log_rates(f, g, s)
    expect = math.log(sum(math.exp(float(s * g[2] @ f[k])) for k in range(7) if k != 2) / 6)
    assert float(rates[1, 2]) == pytest.approx(expect, rel=1e-12)


def mean_over_all_partitions(name, f, g, s, batch):
    n = len(f)
    total = [torch.zeros_like(f), torch.zeros_like(g), torch.zeros_like(s)]
    perms = list(itertools.permutations(range(n)))
    for perm in perms:
        objective, _ = gb.make_objective(name, n, f, g, s)
        grads = gb.feature_gradients(objective, f, g, s, batch, torch.tensor(perm))
        for t, x in zip(total, grads):
            t += x / len(perms)
    return total


def test_decl_with_exact_rates_is_unbiased_and_infonce_is_not():
    f, g, s = features(6, seed=3)
    leaves = [t.clone().requires_grad_() for t in (f, g, s)]
    full = torch.autograd.grad(gb.full_objective(*leaves), leaves)
    decl = mean_over_all_partitions("decl exact rates", f, g, s, batch=3)
    for a, b in zip(decl, full):  # the loss keeps its rates in float32
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8)
    clip = mean_over_all_partitions("clip", f, g, s, batch=3)
    assert max(float((a - b).abs().max()) for a, b in zip(clip, full)) > 1e-3
    coupled = mean_over_all_partitions("decl rate=batch", f, g, s, batch=3)
    assert max(float((a - b).abs().max()) for a, b in zip(coupled, full)) > 1e-3


def test_one_batch_of_everything_is_the_full_batch_gradient():
    f, g, s = features(8, seed=5)
    objective, _ = gb.make_objective("clip", 8, f, g, s)
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    got = gb.feature_gradients(objective, f, g, s, 8, perm)
    leaves = [t.clone().requires_grad_() for t in (f, g, s)]
    from open_clip.loss import ClipLoss

    expect = torch.autograd.grad(ClipLoss()(*leaves), leaves)
    for a, b in zip(got, expect):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_unknown_objective_and_bad_sizes_are_refused():
    f, g, s = features(4)
    with pytest.raises(ValueError, match="'nonsense'"):
        gb.make_objective("nonsense", 4, f, g, s)
    with pytest.raises(SystemExit, match="divide --num-pairs 100"):
        gb.main(["--num-pairs", "100", "--batch-sizes", "16"])
    with pytest.raises(SystemExit, match="--shuffles"):
        gb.main(["--shuffles", "1"])
