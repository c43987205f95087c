"""What DeCL's training log shows: its comparable ``Loss``, the columns that can change, the step's
term and the ``max_log_ratio`` ceiling's epoch warning (docs/training.md lists the columns).
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import torch

from .decl_rates import IndexRate


class DeCLLog:
    """DeCL's answers to the training log's hooks, mixed into `DeCLLoss` and reading its settings."""

    def logged_loss(self, metrics: Dict[str, object]) -> torch.Tensor:
        """``loss2`` (InfoNCE) as the log's ``Loss``: the total moves with ``lambda_t`` and compares with nothing."""
        return metrics["loss2"]

    def ceiling_can_bite(self, captions_per_image: int = 1) -> bool:
        """Whether ``max_log_ratio`` can bite on a row whose id is alone in its batch.

        Update-then-read bounds the ratio by ``-log gamma`` (plus ``log M`` for a caption among M); a queue
        counting the batch by ``log(1 + Q)``; ``batch`` reads ratio 0. Repeated ids are not bounded.
        """
        if self.rate == "batch":
            return False
        if self.include_current and self.rate == "index":
            return -math.log(self.gamma) + math.log(captions_per_image) > self.max_log_ratio
        if self.include_current and self.rate == "queue":
            return math.log1p(self.queue_size) > self.max_log_ratio
        return True

    def constant_metrics(self, captions_per_image: int = 1) -> set:
        """The `metrics` the log leaves out: ``loss2`` (the log's ``Loss``) and those that cannot change here
        (``loss1`` too under update-then-read, where its weight is near 1 by construction).
        """
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
        """``Term: ...``: what the schedule optimised at the last step; nothing when every step is the same."""
        if self._last_step is None or not self.lambdas.varies():
            return ""
        return f"Term: {self.lambdas.term(self._last_step)}"

    def epoch_warning(self, epoch_means: Dict[str, float]) -> Optional[str]:
        """A line when the ceiling bit where the configuration bounds the ratio below it (its column is not logged)."""
        rate = epoch_means.get("clamp_rate", 0.0)
        if rate > 0 and not self.ceiling_can_bite(self._captions_per_image):
            return (
                f"DeCL's log-ratio ceiling (max_log_ratio {self.max_log_ratio:g}) bit on {100 * rate:.3g}% of the "
                f"anchor rows on average; with --decl-rate {self.rate} reading this step's estimate it binds only "
                "where two rows of a batch share a sample id (resampled data, hashed keys)"
            )
        return None
