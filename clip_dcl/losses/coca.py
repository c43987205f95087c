"""CoCa's objective with a clip-dcl contrastive term, OpenCLIP's ``CoCaLoss`` giving the caption term::

loss = contrastive_weight * ours(image_features, text_features, logit_scale)
     + caption_weight * CE(logits, labels)
"""

from __future__ import annotations

import torch.nn as nn
from open_clip.loss import CoCaLoss

from .base import LossWrapper


class CoCaObjective(LossWrapper):
    """``forward`` takes the CoCa model's outputs and returns ``{contrastive key, "caption_loss"}`` with
    ``output_dict=True``, else their sum."""

    def __init__(
        self, contrastive: nn.Module, caption_loss_weight: float, contrastive_loss_weight: float, pad_id: int = 0
    ):
        super().__init__()
        self.contrastive = contrastive
        self.caption = CoCaLoss(caption_loss_weight=caption_loss_weight, clip_loss_weight=0.0, pad_id=pad_id)
        self.contrastive_loss_weight = float(contrastive_loss_weight)

    @property
    def requires_sample_ids(self) -> bool:
        return bool(self.contrastive.requires_sample_ids)

    @property
    def metrics(self) -> dict:
        return self.contrastive.metrics

    def forward(
        self,
        image_features,
        text_features,
        logits,
        labels,
        logit_scale,
        logit_bias=None,
        output_dict=False,
        sample_ids=None,
    ):
        terms = self.contrastive(
            image_features, text_features, logit_scale, logit_bias, output_dict=True, sample_ids=sample_ids
        )
        terms = {k: self.contrastive_loss_weight * v for k, v in terms.items()}
        _, terms["caption_loss"] = self.caption(image_features, text_features, logits, labels, logit_scale)
        return terms if output_dict else sum(terms.values())
