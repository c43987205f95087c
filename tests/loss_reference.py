"""Slow, obviously-correct float64 re-computations of the losses (clip_dcl/losses docstrings).

Plain loops over anchors with ``exp`` and sums exactly as the equations read: no log-space
tricks, no masking, no gathering. Used by the unit tests and the distributed harness.
"""
from __future__ import annotations

import math

import torch


def _directions(f, g, s):
    """Yield the logits matrix of each direction: image anchors vs texts, text anchors vs images."""
    return [s * f @ g.T, s * g @ f.T]


def infonce(f, g, s):
    total = 0.0
    for logits in _directions(f, g, s):
        n = logits.shape[0]
        rows = []
        for i in range(n):
            rows.append(-torch.log(torch.exp(logits[i, i]) / torch.exp(logits[i]).sum()))
        total = total + torch.stack(rows).mean()
    return total / 2


def dcl(f, g, s, tau_plus, clamp="clamp"):
    total, clamped = 0.0, []
    for logits in _directions(f, g, s):
        n = logits.shape[0]
        big_n = n - 1
        rows = []
        for i in range(n):
            pos = torch.exp(logits[i, i])
            neg = sum(torch.exp(logits[i, j]) for j in range(n) if j != i)
            estimate = (neg - big_n * tau_plus * pos) / (1 - tau_plus)
            floor = big_n * torch.exp(-s)
            is_clamped = bool(estimate < floor)
            clamped.append(is_clamped)
            if not is_clamped:
                ng = estimate
            elif clamp == "clamp":
                ng = floor
            else:  # "biased": this row falls back to InfoNCE
                ng = neg
            rows.append(-torch.log(pos / (pos + ng)))
        total = total + torch.stack(rows).mean()
    return total / 2, sum(clamped) / len(clamped)


def decl(f, g, s, rates, eps, lam):
    """DeCL with given rates ``r`` (2, n) and draws ``eps`` (2, n): u_i = eps_i / r_i."""
    loss1, loss2 = 0.0, 0.0
    for d, logits in enumerate(_directions(f, g, s)):
        n = logits.shape[0]
        l1, l2 = [], []
        for i in range(n):
            negs = [torch.exp(logits[i, k]) for k in range(n) if k != i]
            mean_neg = sum(negs) / len(negs)
            u = eps[d][i] / rates[d][i]
            l1.append(u * mean_neg - logits[i, i])
            l2.append(-torch.log(torch.exp(logits[i, i]) / torch.exp(logits[i]).sum()))
        loss1 = loss1 + torch.stack(l1).mean()
        loss2 = loss2 + torch.stack(l2).mean()
    loss1, loss2 = loss1 / 2, loss2 / 2
    return lam * loss1 + (1 - lam) * loss2, loss1, loss2


def batch_mean_negative_score(f, g, s):
    """``E_k[S_ik]`` over the batch negatives, shape (2, n) (image anchors, text anchors)."""
    out = []
    for logits in _directions(f, g, s):
        n = logits.shape[0]
        out.append(torch.stack([
            sum(torch.exp(logits[i, k]) for k in range(n) if k != i) / (n - 1) for i in range(n)
        ]))
    return torch.stack(out).detach()


class IndexRates:
    """Dictionary re-computation of the per-sample moving-average rate buffer."""

    def __init__(self, gamma):
        self.gamma = gamma
        self.rate = [{}, {}]

    def visit(self, ids, batch_rates):
        for d in range(2):
            seen = set()
            for pos, sid in enumerate(ids.tolist()):
                if sid in seen:  # a repeated id in one batch keeps its first estimate
                    continue
                seen.add(sid)
                r = float(batch_rates[d][pos])
                old = self.rate[d].get(sid)
                self.rate[d][sid] = r if old is None else (1 - self.gamma) * old + self.gamma * r
        return torch.tensor([[self.rate[d][sid] for sid in ids.tolist()] for d in range(2)], dtype=torch.float64)

    def log_rate(self, d, sid):
        return math.log(self.rate[d][sid])
