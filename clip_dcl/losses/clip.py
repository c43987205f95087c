"""``clip``: OpenCLIP's own InfoNCE (``open_clip.loss.ClipLoss``), the baseline.

What ``ClipLoss`` lacks, ``no_grad_gather``, ``M > 1`` captions per image (each in turn the
positive, ``L_img = mean_{i, m}[-l_im + log(S_im + sum_{j neg} S_ij)]``) and the tiled statistics
(``tile > 0``), is `InfoNCEFromStats`.
"""

from __future__ import annotations

from open_clip.loss import ClipLoss

from .base import ContrastiveLoss, LossDeclaration, contrast_rows


class InfoNCELoss(LossDeclaration, ClipLoss):
    """OpenCLIP's ``ClipLoss`` with clip-dcl's call signature: ``{"contrastive_loss": L}`` with ``output_dict``."""

    supports_captions_per_image = True  # through InfoNCEFromStats
    #: OpenCLIP's ``create_loss(args)`` builds this objective (and SigLIP, CoCa, distillation as its flags
    #: say) unless clip-dcl's own is needed (``no_grad_gather``, M > 1 captions per image)
    openclip_native = True
    summary = "OpenCLIP's own loss (InfoNCE; also SigLIP/CoCa/distillation as OpenCLIP picks them)"

    @classmethod
    def from_args(cls, **kwargs):
        """``ClipLoss`` itself, or `InfoNCEFromStats` for ``no_grad_gather=True`` or a ``tile`` (its default: 0)."""
        if kwargs.get("no_grad_gather") or kwargs.get("tile"):
            return InfoNCEFromStats(**kwargs)
        kwargs.pop("tile", None)
        return cls(**kwargs)

    def __init__(
        self,
        local_loss=False,
        gather_with_grad=False,
        cache_labels=True,
        rank=0,
        world_size=1,
        use_horovod=False,
        no_grad_gather=False,
    ):
        if no_grad_gather:
            raise ValueError(
                "ClipLoss has no no_grad_gather mode: use create_loss('clip', no_grad_gather=True), "
                "which builds InfoNCEFromStats"
            )
        super().__init__(
            local_loss=local_loss,
            gather_with_grad=gather_with_grad,
            cache_labels=cache_labels,
            rank=rank,
            world_size=world_size,
            use_horovod=use_horovod,
        )
        self.metrics = {}

    def forward(self, image_features, text_features, logit_scale, logit_bias=None, output_dict=False, sample_ids=None):
        if text_features.shape[0] != image_features.shape[0]:  # M captions per image: not ClipLoss's layout
            if getattr(self, "_multi", None) is None:
                self._multi = InfoNCEFromStats(
                    local_loss=self.local_loss,
                    gather_with_grad=self.gather_with_grad,
                    rank=self.rank,
                    world_size=self.world_size,
                )
            return self._multi(image_features, text_features, logit_scale, logit_bias, output_dict=output_dict)
        return super().forward(
            image_features, text_features, logit_scale, logit_bias=logit_bias, output_dict=output_dict
        )


class InfoNCEFromStats(ContrastiveLoss):
    """InfoNCE from ``pos`` and ``lse_neg``, ``mean_i[logaddexp(pos_i, lse_neg_i) - pos_i]``; equals ``ClipLoss``."""

    output_key = "contrastive_loss"
    supports_captions_per_image = True

    def compute(self, image_features, text_features, logit_scale, logit_bias, sample_ids):
        st = self.stats(image_features, text_features, logit_scale, logit_bias)
        per_dir = [contrast_rows(d.pos, d.lse_neg) for d in (st.image, st.text)]
        return (per_dir[0] + per_dir[1]) / 2, {}
