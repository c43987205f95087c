"""``clip``: OpenCLIP's own InfoNCE (``open_clip.loss.ClipLoss``), the baseline.

Nothing is re-implemented: the class only accepts (and ignores) the ``sample_ids`` keyword
and exposes an empty ``metrics`` dict, so that the training plugin can treat all losses alike.
"""
from __future__ import annotations

from open_clip.loss import ClipLoss


class InfoNCELoss(ClipLoss):
    """OpenCLIP's ``ClipLoss`` with clip-dcl's uniform call signature.

    ``L = (L_img + L_txt) / 2`` with ``L_img = mean_i[-l_ii + logsumexp_j l_ij]``
    (the InfoNCE of CLIP, both directions). Returns ``{"contrastive_loss": L}`` with ``output_dict=True``.
    """

    requires_sample_ids = False

    def __init__(self, local_loss=False, gather_with_grad=False, cache_labels=True, rank=0, world_size=1,
                 use_horovod=False):
        super().__init__(local_loss=local_loss, gather_with_grad=gather_with_grad, cache_labels=cache_labels,
                         rank=rank, world_size=world_size, use_horovod=use_horovod)
        self.metrics = {}

    def forward(self, image_features, text_features, logit_scale, logit_bias=None, output_dict=False,
                sample_ids=None):
        return super().forward(image_features, text_features, logit_scale, logit_bias=logit_bias,
                               output_dict=output_dict)
