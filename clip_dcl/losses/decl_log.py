"""What DeCL's training log shows: its comparable ``Loss``, the columns that can change, the step's term
and the epoch warning of the ``max_log_ratio`` ceiling.

The log half of `DeCLLoss` (it mixes `DeCLLog` in): the hooks
`LossDeclaration` declares (``logged_loss``, ``logged_metrics``,
``step_note``, ``epoch_warning``), answered from the loss's settings. docs/training.md lists the
columns per setting.
"""
from __future__ import annotations

import math
from typing import Dict, Optional

import torch

from .decl_rates import IndexRate


class DeCLLog:
    """DeCL's answers to the training log's questions; reads the settings `DeCLLoss`
    holds (``rate``, ``include_current``, ``gamma``, ``gamma_schedule``, ``queue_size``, ``max_log_ratio``,
    ``lambdas``, ``rates``) and the last call's ``_captions_per_image`` and ``_last_step``."""

    def logged_loss(self, metrics: Dict[str, object]) -> torch.Tensor:
        """``loss2``, the InfoNCE value, as the log's ``Loss``: the total (``Decl_loss``) moves between
        loss1's scale and InfoNCE's as ``lambda_t`` does, so only InfoNCE compares with ``clip``'s ``Loss``."""
        return metrics["loss2"]

    def ceiling_can_bite(self, captions_per_image: int = 1) -> bool:
        """Whether ``max_log_ratio`` can bite on a row whose sample id is alone in its batch. Read after
        this step's update (``index`` with ``include_current``), the rate holds ``gamma_t`` times the
        row's own estimate, so the ratio is at most ``-log gamma_t`` (``gamma`` is the smallest
        ``gamma_t``), plus ``log M`` for a caption among M; ``queue`` with the current batch counted
        holds its N negatives among ``N + Q``, at most ``log(1 + Q)``; ``batch`` reads the row's own
        estimate (ratio 0). Two rows of one id in a batch (resampled data, hashed keys) are not bounded:
        an epoch where the ceiling bites anyway gets a warning (`epoch_warning`)."""
        if self.rate == "batch":
            return False
        if self.include_current and self.rate == "index":
            return -math.log(self.gamma) + math.log(captions_per_image) > self.max_log_ratio
        if self.include_current and self.rate == "queue":
            return math.log1p(self.queue_size) > self.max_log_ratio
        return True

    def constant_metrics(self, captions_per_image: int = 1) -> set:
        """The `metrics` the log leaves out under this configuration: ``loss2`` (it is the log's
        ``Loss``), and those that cannot change: ``lambda_t`` under a constant schedule, ``gamma_t``
        under a constant gamma, ``clamp_rate`` where the ceiling cannot bite (`ceiling_can_bite`),
        the ratio and weight statistics of ``batch`` (its ratio is 0); and ``loss1`` read after this
        step's update (``index`` with ``include_current``: ``exp(e_i) / r_i`` is then close to 1 by
        construction, and InfoNCE is the value to follow)."""
        out = {"loss2"}
        if not self.lambdas.varies():
            out.add("lambda_t")
        if self.gamma_schedule == "constant":
            out.add("gamma_t")
        if not self.ceiling_can_bite(captions_per_image):
            out.add("clamp_rate")
        if self.rate == "batch":
            out.update(("log_ratio_mean", "log_ratio_std", "weight_mean", "weight_max"))
        if isinstance(self.rates, IndexRate) and self.include_current:
            out.add("loss1")
        return out

    def logged_metrics(self, metrics: Dict[str, object]) -> Dict[str, object]:
        """`metrics` less `constant_metrics`: the log line holds the columns that can change."""
        left_out = self.constant_metrics(self._captions_per_image)
        return {k: v for k, v in metrics.items() if k not in left_out}

    def step_note(self) -> str:
        """``Term: ...``: what the schedule optimised at the last call's step (``loss1``, ``infonce``, or both);
        nothing when every step optimises the same."""
        if self._last_step is None or not self.lambdas.varies():
            return ""
        return f"Term: {self.lambdas.term(self._last_step)}"

    def epoch_warning(self, epoch_means: Dict[str, float]) -> Optional[str]:
        """A line when the ``max_log_ratio`` ceiling bit in an epoch where the configuration bounds the
        ratio below it (`ceiling_can_bite`), so that its count, left out of the log line, is not lost."""
        rate = epoch_means.get("clamp_rate", 0.0)
        if rate > 0 and not self.ceiling_can_bite(self._captions_per_image):
            return (f"DeCL's log-ratio ceiling (max_log_ratio {self.max_log_ratio:g}) bit on {100 * rate:.3g}% of the "
                    f"anchor rows on average; with --decl-rate {self.rate} reading this step's estimate it binds only "
                    "where two rows of a batch share a sample id (resampled data, hashed keys)")
        return None
