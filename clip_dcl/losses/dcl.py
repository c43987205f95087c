"""``dcl``: the debiased symmetric contrastive loss (Chuang et al. 2020, Eq. 6-8, Figure 3).

For anchor ``i`` with ``N`` negatives, ``M`` positives ``v`` and class prior ``tau_plus`` (the chance
that a random negative shares the anchor's latent class)::

    pos_i  = S_ii = exp(l_ii)
    neg_i  = sum_{j neg} S_ij
    pbar_i = mean over the M positives of S_iv                (Eq. 7; M = 1: pbar_i = pos_i)
    Ng_i   = max((neg_i - N * tau_plus * pbar_i) / (1 - tau_plus),  N * exp(-s))      (Eq. 7)
    loss_i = -log(pos_i / (pos_i + Ng_i)) = -l_ii + log(pos_i + Ng_i)

for image and text anchors, averaged; ``tau_plus = 0`` is InfoNCE exactly. ``exp(-s) = e^{-1/t}`` is
the smallest score of two unit vectors, so the floor keeps the negatives' mass positive. In log space
``log(neg - N tau pbar) = lse_neg + log(1 - exp(log(N tau) + log pbar - lse_neg))``. On a floored row
``clamp="clamp"`` gives the negatives no gradient, ``"biased"`` uses the uncorrected row (the paper's
CMC appendix); ``metrics["clamp_rate"]`` is the floored share.

With M captions per image (``text_features`` ``(B * M, d)``) an image anchor's negatives are the
``(G - 1) M`` other images' captions and each of its own is in turn the numerator's ``x+``. Hard
negatives (``beta > 0``; Robinson et al. 2021, HCL, Eq. 3-4): ``neg_i`` becomes
``N * sum_j w_ij S_ij / sum_j w_ij``, ``w_ij = exp(beta * l_ij)`` kept in the graph.

``same_class="top"`` (ours): CLIP's positive is the image's own caption, which scores far above any
same-class negative, so Eq. 7's ``N tau_plus pbar_i`` overshoots and rows sit at the floor. "top"
takes instead the mass of the row's ``k = tau_plus N`` highest-scoring negatives::

    top_i = sum of the floor(k) highest S_ij  +  frac(k) * the next one
    Ng_i  = max((neg_i - top_i) / (1 - tau_plus),  N exp(-s))

``Ng_i`` is ``N`` times the mean score of the negatives left, summed over them in log space
(``neg - top`` would cancel in float32). ``tau_plus="auto"`` estimates the prior per batch (`.prior`).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .base import ContrastiveLoss, LossFlag, check_choice, contrast_rows, log1mexp
from .gather import AnchorStats, compute_dtype

CLAMP_MODES = ("clamp", "biased")
#: an epoch whose mean ``clamp_rate`` is above this gets a warning in the training log (see ``epoch_warning``)
FLOOR_WARNING_RATE = 0.5
#: estimates of the same-class negatives' mass: Eq. 7's ``N tau_plus pbar_i`` (positive) or the mass of the
#: ``tau_plus N`` highest-scoring negatives (top, ours)
SAME_CLASS_MODES = ("positive", "top")


def parse_tau_plus(text: str):
    """``--tau-plus``: a number, or ``auto``."""
    if text == "auto":
        return "auto"
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"tau_plus={text!r} is neither a number nor 'auto'") from None


def debiased_log_negatives(
    stats: AnchorStats,
    num_negatives: int,
    tau_plus,
    logit_scale: torch.Tensor,
    clamp: str = "clamp",
    beta: float = 0.0,
    same_class: str = "positive",
):
    """``(log Ng_i, clamped_i)`` of Eq. 7 for one direction, in log space.

    ``stats`` holds ``pos`` ((n,) or (n, M)) and ``lse_neg``, plus ``lse_hard``/``lse_weight`` when
    ``beta > 0`` and the ``*_tail`` fields of ``anchor_stats(top_share=tau_plus)`` for ``"top"``.
    The floor is ``log N - s``.
    """
    pos, lse_neg = stats.pos, stats.lse_neg
    if pos.dim() == 2:  # M positives: log of the mean of their scores (Eq. 7)
        pos = torch.logsumexp(pos, dim=1) - math.log(pos.shape[1])
    log_n = math.log(num_negatives)
    if beta:  # log(N * sum w S / sum w), w = exp(beta l): the reweighted negatives' mass
        lse_neg = log_n + stats.lse_hard - stats.lse_weight
    if tau_plus > 0 and same_class == "top":
        # N times the (weighted) mean score of the negatives left: positive by construction
        valid = torch.ones_like(lse_neg, dtype=torch.bool)
        if beta:
            log_ng = log_n + stats.lse_hard_tail - stats.lse_weight_tail
        else:
            log_ng = stats.lse_tail - math.log1p(-tau_plus)  # sum over N - k negatives, times N / (N - k)
    elif tau_plus > 0:
        # d = log(N tau pbar) - log(neg); the numerator neg - N tau pbar is positive iff d < 0.
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
    """Debiased symmetric contrastive loss (``dcl``; Chuang et al., NeurIPS 2020), see the module docstring;
    the arguments are its flags'. ``metrics``: ``clamp_rate``, and ``tau_plus``/``tau_plus_batch`` under
    ``tau_plus="auto"``.
    """

    output_key = "dcl_loss"
    supports_captions_per_image = True
    summary = (
        "debiased contrastive loss (DCL; with --hcl-beta, hard negatives as HCL); InfoNCE until --tau-plus is given"
    )
    flags = (
        LossFlag(
            "--tau-plus",
            "tau_plus",
            type=parse_tau_plus,
            metavar="TAU|auto",
            help="class prior tau+ in [0, 1), the chance that a negative shares the anchor's class, or auto "
            "(estimated from the batches' scores, logged as Tau_plus). Default 0: InfoNCE exactly. How "
            "the settings fared: README, 'What the studies found'",
        ),
        LossFlag(
            "--dcl-clamp",
            "clamp",
            choices=CLAMP_MODES,
            help="rows whose negative estimate hits the floor N e^{-1/t}: keep the floor (clamp) or use the "
            "uncorrected row (biased)",
        ),
        LossFlag(
            "--dcl-same-class",
            "same_class",
            choices=SAME_CLASS_MODES,
            help="the same-class negatives' mass subtracted from the negatives: N tau+ times the positive's "
            "score (positive, the paper's Eq. 7) or the mass of the row's tau+ N highest-scoring "
            "negatives (top, ours for paired captions, whose positive scores far above any same-class "
            "negative; fractional k weighs the next one, tau+ 0 is InfoNCE; not with --no-grad-gather)",
        ),
        LossFlag(
            "--hcl-beta",
            "beta",
            type=float,
            help="hard-negative concentration beta >= 0 (HCL, Robinson et al. 2021): negatives weighted by "
            "exp(beta l), normalised to mean 1; 0 is plain dcl",
        ),
        LossFlag(
            "--dcl-temperature",
            "temperature",
            type=float,
            help="a fixed temperature t > 0 for this loss (the paper's t; logits s <f, g> with s = 1/t) instead "
            "of CLIP's learned logit scale, which then gets no gradient",
            default_text="learned",
        ),
        LossFlag(
            "--dcl-tau-momentum",
            "tau_momentum",
            type=float,
            help="--tau-plus auto: weight of each step's estimate in the moving average, in (0, 1]",
        ),
    )

    def __init__(
        self,
        tau_plus=0.0,
        clamp: str = "clamp",
        beta: float = 0.0,
        temperature: Optional[float] = None,
        tau_momentum: float = 0.05,
        same_class: str = "positive",
        device=None,
        **dist_kwargs,
    ):
        auto = isinstance(tau_plus, str) and tau_plus == "auto"
        if not auto and (
            isinstance(tau_plus, bool) or not isinstance(tau_plus, (int, float)) or not 0.0 <= float(tau_plus) < 1.0
        ):
            raise ValueError(f"tau_plus={tau_plus!r} is outside [0, 1) and not 'auto'")
        check_choice("clamp", clamp, CLAMP_MODES)
        check_choice("same_class", same_class, SAME_CLASS_MODES)
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0.0 <= float(beta) < math.inf:
            raise ValueError(f"beta={beta!r} must be a finite number >= 0")
        if temperature is not None and not (isinstance(temperature, (int, float)) and 0 < temperature < math.inf):
            raise ValueError(f"temperature={temperature!r} must be a number > 0 (or None for the learned scale)")
        if not 0.0 < tau_momentum <= 1.0:
            raise ValueError(f"tau_momentum={tau_momentum!r} is outside (0, 1]")
        self.beta = float(beta)
        self.temperature = None if temperature is None else float(temperature)
        self.same_class = same_class
        super().__init__(**dist_kwargs)
        self.auto = auto
        self.tau_plus = "auto" if auto else float(tau_plus)
        self.clamp = clamp
        self.tau_momentum = float(tau_momentum)
        if auto:
            self.register_buffer("tau_plus_estimate", torch.full((), float("nan"), device=device))

    def _no_grad_gather_blocker(self) -> str:
        if self.beta:
            return f"dcl with beta={self.beta:g} (hard-negative weights)"
        if self.same_class == "top":
            return "dcl with same_class='top' (the highest-scoring negatives' mass)"
        return f"dcl with temperature={self.temperature:g}" if self.temperature is not None else "dcl"

    @property
    def supports_no_grad_gather(self) -> bool:
        # the hard-negative weights read the logits beyond (pos, lse_neg); a fixed temperature is fine for the
        # column term but leaves the scale's gradient path of the surrogate untested, so it is refused too; the
        # top estimate weighs each negative by its rank in the row, not by the row's softmax alone
        return not self.beta and self.temperature is None and self.same_class == "positive"

    def _prior(self, all_image_features, all_text_features, logit_scale) -> float:
        """The prior for this call under ``"auto"``; updates the moving average when training."""
        from .prior import estimate_tau_plus

        if self.training:
            with torch.no_grad():  # the same gathered features on every rank: the same estimate
                s = logit_scale.detach()
                m = all_text_features.shape[0] // all_image_features.shape[0]
                img = all_image_features.detach()[:256]
                logits = (s * img) @ all_text_features.detach().T  # (g, G M)
                rows = torch.arange(img.shape[0], device=logits.device)
                owner = torch.arange(logits.shape[1], device=logits.device) // m
                positive = owner[None, :] == rows[:, None]
                estimate = estimate_tau_plus(logits[~positive], logits[positive])
            old = float(self.tau_plus_estimate)
            new = estimate if math.isnan(old) else (1 - self.tau_momentum) * old + self.tau_momentum * estimate
            self.tau_plus_estimate.fill_(new)
            self._last_estimate = estimate
        value = float(self.tau_plus_estimate)
        return 0.0 if math.isnan(value) else min(value, 0.99)

    def compute(self, image_features, text_features, logit_scale, logit_bias, sample_ids):
        if self.temperature is not None:
            logit_scale = torch.tensor(1.0 / self.temperature, device=image_features.device)
        metrics = {}
        tau_plus = self.tau_plus
        if self.same_class == "top":
            # the top estimate needs the prior before the statistics: it decides which negatives are set aside
            gathered = self.gather(image_features, text_features)
            if self.auto:
                dtype = compute_dtype(image_features, text_features)
                scale = torch.as_tensor(logit_scale).to(dtype)
                tau_plus = self._prior(gathered[0].to(dtype), gathered[1].to(dtype), scale)
            st = self.stats(
                image_features,
                text_features,
                logit_scale,
                logit_bias,
                beta=self.beta,
                top_share=tau_plus,
                gathered=gathered,
            )
        else:
            st = self.stats(image_features, text_features, logit_scale, logit_bias, beta=self.beta)
            if self.auto:
                tau_plus = self._prior(st.all_image_features, st.all_text_features, st.logit_scale)
        if self.auto:  # a plain number: the same arithmetic as a fixed prior
            metrics["tau_plus"] = tau_plus
            if self.training:
                metrics["tau_plus_batch"] = self._last_estimate
        losses, clamped = [], []
        for direction in (st.image, st.text):
            log_ng, c = debiased_log_negatives(
                direction, direction.num_negatives, tau_plus, st.logit_scale, self.clamp, self.beta, self.same_class
            )
            losses.append(contrast_rows(direction.pos, log_ng))
            clamped.append(c)
        loss = (losses[0] + losses[1]) / 2
        metrics["clamp_rate"] = torch.cat(clamped).float().mean()
        return loss, metrics

    @classmethod
    def start_notice(cls, loss_args):
        """At ``tau_plus = 0`` and ``beta = 0`` the loss is InfoNCE: say so, the name does not."""
        if loss_args.get("tau_plus", 0.0) != 0 or loss_args.get("beta", 0.0):
            return None
        at = "" if loss_args.get("temperature") is None else f" at the fixed temperature {loss_args['temperature']:g}"
        return (
            f"--loss dcl at --tau-plus 0 (its default) is InfoNCE exactly{at}, the objective of --loss clip; "
            f"give --tau-plus for the debiased loss"
        )

    def epoch_warning(self, epoch_means):
        """A warning when the epoch's mean ``clamp_rate`` is over one half, naming what moves rows off the floor."""
        rate = epoch_means.get("clamp_rate")
        if rate is None or not rate > FLOOR_WARNING_RATE:
            return None
        what = "their negatives got no gradient" if self.clamp == "clamp" else "they fell back to InfoNCE"
        tries = []
        if self.same_class == "positive":
            tries.append(
                "--dcl-same-class top (the same-class mass from the highest-scoring negatives, not the "
                "positive's score)"
            )
        tries.append("a smaller --tau-plus" + ("" if self.auto else f" (now {self.tau_plus:g})"))
        if self.clamp == "clamp":
            tries.append("--dcl-clamp biased (InfoNCE for the floored rows)")
        return (
            f"dcl: {rate:.1%} of the anchor rows sat at the floor N e^(-s) of the negatives' estimate on "
            f"average over the epoch (Clamp_rate), so {what}; try " + ", or ".join(tries) + "."
        )

    def extra_repr(self) -> str:
        extra = f"beta={self.beta}, " if self.beta else ""
        extra += f"temperature={self.temperature}, " if self.temperature is not None else ""
        extra += f"same_class={self.same_class!r}, " if self.same_class != "positive" else ""
        return f"tau_plus={self.tau_plus!r}, clamp={self.clamp!r}, " + extra + super().extra_repr()
