"""``dcl``: the debiased symmetric contrastive loss (Chuang et al. 2020, Eq. 7-8, Figure 3).

For anchor ``i`` with ``N = K = G - 1`` negatives and class prior ``tau_plus`` (the chance that a
random negative shares the anchor's latent class)::

    pos_i  = S_ii = exp(l_ii)
    neg_i  = sum_{j != i} S_ij
    Ng_i   = max((neg_i - N * tau_plus * pos_i) / (1 - tau_plus),  N * exp(-s))      (Eq. 7)
    loss_i = -log(pos_i / (pos_i + Ng_i)) = -l_ii + log(pos_i + Ng_i)

computed for image anchors and text anchors and averaged, ``L = (L_img + L_txt) / 2``.
``exp(-s) = e^{-1/t}`` is the smallest score two unit vectors can have, so the floor keeps the
estimate of the negatives' mass positive. Everything runs in log space:
``log(neg - N tau pos) = lse_neg + log(1 - exp(log(N tau) + l_ii - lse_neg))``.

When the floor is active for a row (``clamp="clamp"``, the paper's Eq. 7) that row's negatives get
no gradient; ``clamp="biased"`` instead falls back to the biased (InfoNCE) row, as the paper's
CMC appendix does. The fraction of clamped rows is reported as ``metrics["clamp_rate"]``.
``tau_plus = 0`` gives InfoNCE exactly.

Written here because OpenCLIP has no debiased objective. One positive per anchor (``M = 1``):
the captions of an image beyond its pair are not used by this loss.
"""
from __future__ import annotations

import math

import torch

from .base import AnchorStats, ContrastiveLoss, log1mexp

CLAMP_MODES = ("clamp", "biased")


def debiased_log_negatives(stats: AnchorStats, num_negatives: int, tau_plus: float, logit_scale: torch.Tensor,
                           clamp: str = "clamp"):
    """``(log Ng_i, clamped_i)`` of Eq. 7 for one direction, in log space.

    Args:
        stats: ``pos`` (n,) and ``lse_neg`` (n,) of the anchors.
        num_negatives: ``N``.
        tau_plus: class prior in [0, 1).
        logit_scale: ``s``; the floor is ``log N - s``.
        clamp: ``"clamp"`` (floor) or ``"biased"`` (fall back to ``lse_neg`` on clamped rows).
    """
    pos, lse_neg = stats.pos, stats.lse_neg
    log_n = math.log(num_negatives)
    if tau_plus > 0:
        # d = log(N tau pos) - log(neg); the numerator neg - N tau pos is positive iff d < 0.
        d = (log_n + math.log(tau_plus)) + pos - lse_neg
        valid = d < 0
        d_safe = torch.where(valid, d, torch.full_like(d, -1.0))  # keep gradients finite on invalid rows
        log_ng = lse_neg + log1mexp(d_safe) - math.log1p(-tau_plus)
    else:
        valid = torch.ones_like(pos, dtype=torch.bool)
        log_ng = lse_neg
    floor = log_n - logit_scale
    clamped = ~valid | (log_ng < floor)
    fallback = floor.expand_as(log_ng) if clamp == "clamp" else lse_neg
    return torch.where(clamped, fallback, log_ng), clamped


class DebiasedClipLoss(ContrastiveLoss):
    """Debiased symmetric contrastive loss for image-text pairs (``dcl``).

    Chuang, Robinson, Lin, Torralba, Jegelka, "Debiased Contrastive Learning", NeurIPS 2020,
    Eq. 7-8, applied to both directions of the CLIP logits with negatives gathered across ranks.

    Args:
        tau_plus: class prior ``tau^+`` in [0, 1); 0 gives InfoNCE.
        clamp: ``"clamp"`` (default, Eq. 7's floor ``N e^{-1/t}``) or ``"biased"`` (clamped rows use
            the InfoNCE row instead).
        local_loss, gather_with_grad, rank, world_size: as OpenCLIP's ``ClipLoss``.

    Attributes:
        metrics: ``clamp_rate`` (fraction of anchor rows, both directions, where the floor bit).

    Raises:
        ValueError: ``tau_plus`` outside [0, 1) or an unknown ``clamp``.

    Example::

        loss = DebiasedClipLoss(tau_plus=0.1)
        value = loss(image_features, text_features, logit_scale)
    """

    output_key = "dcl_loss"

    def __init__(self, tau_plus: float = 0.1, clamp: str = "clamp", **dist_kwargs):
        super().__init__(**dist_kwargs)
        if not isinstance(tau_plus, (int, float)) or not 0.0 <= float(tau_plus) < 1.0:
            raise ValueError(f"tau_plus={tau_plus!r} is outside [0, 1)")
        if clamp not in CLAMP_MODES:
            raise ValueError(f"clamp={clamp!r} is not one of {CLAMP_MODES}")
        self.tau_plus = float(tau_plus)
        self.clamp = clamp

    def compute(self, image_features, text_features, logit_scale, logit_bias, sample_ids):
        st = self.stats(image_features, text_features, logit_scale, logit_bias)
        losses, clamped = [], []
        for direction in (st.image, st.text):
            log_ng, c = debiased_log_negatives(direction, st.num_negatives, self.tau_plus, st.logit_scale,
                                               self.clamp)
            losses.append((torch.logaddexp(direction.pos, log_ng) - direction.pos).mean())
            clamped.append(c)
        loss = (losses[0] + losses[1]) / 2
        return loss, {"clamp_rate": torch.cat(clamped).float().mean()}

    def extra_repr(self) -> str:
        return f"tau_plus={self.tau_plus}, clamp={self.clamp!r}, " + super().extra_repr()
