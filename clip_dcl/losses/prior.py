"""Estimating DCL's class prior ``tau_plus`` from the batch (``create_loss("dcl", tau_plus="auto")``).

``tau_plus`` is the share of an anchor's negatives that belong to its own latent class. Those
"false negatives" score like positives, the others lower, so the negatives' scores are a
two-component mixture

    p(l_ij) = tau_plus * p_same(l) + (1 - tau_plus) * p_other(l)

and ``tau_plus`` is the weight of the upper component. This is mixture proportion estimation as
in positive-unlabeled learning (Elkan & Noto 2008; Blanchard et al. 2010), which the DCL paper
itself relates its estimator to (Chuang et al. 2020, Sec. 2). The estimator here:

1. pools the logits of image anchors against the captions of the other images of the global
   batch (the negatives), and the logits of the matched pairs (the positives), both detached;
2. fits a two-component 1-D Gaussian mixture to the negatives by EM, the upper component
   initialised at the positives' mean and variance, the lower at the negatives' (the positives
   say which component is "same class"; the fit frees both, because a matched caption scores
   above a caption of another image of the same class);
3. returns the upper component's weight, or 0 when its mean does not lie above the lower one's
   by at least one pooled standard deviation (no visible class structure yet: early in training
   the negatives are one bump, and DCL then stays InfoNCE).

The loss keeps an exponential moving average of the per-step estimates (a buffer, saved with the
checkpoint) and uses it as ``tau_plus``.

Limits, measured (``benchmarks/prior_diagnosis.py``): the estimate is the share of negatives that the
*embedding* scores like positives. When the embedding has learned only part of what defines a class
(on the synthetic data the tiny model separates colours, not shapes), that share exceeds the
class prior (about 0.5 for a true 0.25). And the EM, started at the positives' narrow distribution,
can settle on the upper tail of that cluster (0.13-0.18 where a k-means start finds 0.42-0.57). In
the sampling-bias benchmark ``auto`` trained worse than a fixed prior.

EM is written here (about 20 lines of tensor code) rather than taken from scikit-learn's
``GaussianMixture``, which fits on the CPU in NumPy: one host round trip and about 0.3 s per fit on
a few thousand scores on a 2-core machine, every training step. `fit_two_gaussians` is tested
equal to ``GaussianMixture`` started from the same parameters.
"""
from __future__ import annotations

import math
from typing import Tuple

import torch

#: negatives' scores used per estimate at most (an even stride through the batch's negatives)
MAX_SCORES = 8192


def fit_two_gaussians(x: torch.Tensor, means: Tuple[float, float], variances: Tuple[float, float],
                      weights: Tuple[float, float], iters: int = 100, tol: float = 1e-6, var_floor: float = 1e-6):
    """EM for a two-component Gaussian mixture on the 1-D sample ``x``; returns ``(weights, means, variances)``.

    Each a tensor of shape ``(2,)`` in float64. Stops when the mean log-likelihood gains less than
    ``10 tol`` over 10 iterations (checked every 10, to keep host syncs rare), or after ``iters``.
    """
    x = x.detach().reshape(-1).to(torch.float64)
    w = torch.tensor(weights, dtype=torch.float64, device=x.device)
    mu = torch.tensor(means, dtype=torch.float64, device=x.device)
    var = torch.tensor(variances, dtype=torch.float64, device=x.device).clamp(min=var_floor)
    prev = -math.inf
    for it in range(iters):
        # E step: log w_k N(x | mu_k, var_k), shape (n, 2)
        log_p = torch.log(w) - 0.5 * (torch.log(2 * math.pi * var) + (x[:, None] - mu) ** 2 / var)
        log_norm = torch.logsumexp(log_p, dim=1, keepdim=True)
        resp = torch.exp(log_p - log_norm)
        # M step
        nk = resp.sum(0) + 10 * torch.finfo(torch.float64).eps
        w = nk / x.numel()
        mu = (resp * x[:, None]).sum(0) / nk
        var = ((resp * (x[:, None] - mu) ** 2).sum(0) / nk).clamp(min=var_floor)
        if it % 10 == 9:  # one host sync per 10 iterations
            ll = float(log_norm.mean())
            if abs(ll - prev) < 10 * tol:
                break
            prev = ll
    return w, mu, var


def estimate_tau_plus(neg_scores: torch.Tensor, pos_scores: torch.Tensor, min_separation: float = 1.0) -> float:
    """The weight of the same-class component among ``neg_scores`` (see the module docstring).

    Args:
        neg_scores: logits of anchors against their negatives, any shape.
        pos_scores: logits of the positive pairs, any shape.
        min_separation: the upper mean must exceed the lower by this many pooled standard
            deviations, else 0 is returned.
    """
    neg = neg_scores.detach().reshape(-1).to(torch.float64)
    pos = pos_scores.detach().reshape(-1).to(torch.float64)
    if neg.numel() > MAX_SCORES:
        neg = neg[torch.linspace(0, neg.numel() - 1, MAX_SCORES, device=neg.device).long()]
    if neg.numel() < 4 or pos.numel() < 1:
        return 0.0
    var_neg = float(neg.var()) if neg.numel() > 1 else 1.0
    var_pos = float(pos.var()) if pos.numel() > 1 else var_neg
    w, mu, var = fit_two_gaussians(neg, (float(neg.mean()), float(pos.mean())), (var_neg, max(var_pos, 1e-6)),
                                   (0.9, 0.1))
    upper, lower = (1, 0) if mu[1] >= mu[0] else (0, 1)
    spread = math.sqrt(float(w[0] * var[0] + w[1] * var[1]))
    if float(mu[upper] - mu[lower]) < min_separation * spread:
        return 0.0
    return float(w[upper])
