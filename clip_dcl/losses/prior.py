"""Estimating DCL's class prior ``tau_plus`` from the batch (``create_loss("dcl", tau_plus="auto")``).

False negatives score like positives, so the negatives' scores are a mixture
``tau_plus * p_same(l) + (1 - tau_plus) * p_other(l)``: mixture proportion estimation as in
positive-unlabeled learning (Elkan & Noto 2008), to which the DCL paper relates its estimator
(Chuang et al. 2020, Sec. 2). A two-Gaussian EM, the upper component started at the positives'
moments, gives the weight, or 0 when the means are under one pooled standard deviation apart. It
measures what the embedding scores like positives, which is not the class prior while the embedding
separates only part of a class. EM is written here because scikit-learn's ``GaussianMixture`` fits
on the host every step; `fit_two_gaussians` is tested equal to it.
"""

from __future__ import annotations

import math
from typing import Tuple

import torch

#: negatives' scores used per estimate at most (an even stride through the batch's negatives)
MAX_SCORES = 8192


def fit_two_gaussians(
    x: torch.Tensor,
    means: Tuple[float, float],
    variances: Tuple[float, float],
    weights: Tuple[float, float],
    iters: int = 100,
    tol: float = 1e-6,
    var_floor: float = 1e-6,
):
    """EM for a two-component Gaussian mixture on 1-D ``x``: ``(weights, means, variances)``, each (2,) float64.

    Stops when the mean log-likelihood gains less than ``10 tol`` over 10 iterations, or after ``iters``.
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
    """The weight of the same-class component among ``neg_scores`` (0 below ``min_separation``)."""
    neg = neg_scores.detach().reshape(-1).to(torch.float64)
    pos = pos_scores.detach().reshape(-1).to(torch.float64)
    if neg.numel() > MAX_SCORES:
        neg = neg[torch.linspace(0, neg.numel() - 1, MAX_SCORES, device=neg.device).long()]
    if neg.numel() < 4 or pos.numel() < 1:
        return 0.0
    var_neg = float(neg.var()) if neg.numel() > 1 else 1.0
    var_pos = float(pos.var()) if pos.numel() > 1 else var_neg
    w, mu, var = fit_two_gaussians(
        neg, (float(neg.mean()), float(pos.mean())), (var_neg, max(var_pos, 1e-6)), (0.9, 0.1)
    )
    upper, lower = (1, 0) if mu[1] >= mu[0] else (0, 1)
    spread = math.sqrt(float(w[0] * var[0] + w[1] * var[1]))
    if float(mu[upper] - mu[lower]) < min_separation * spread:
        return 0.0
    return float(w[upper])
