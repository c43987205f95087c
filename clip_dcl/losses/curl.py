"""``curl``: the block contrastive loss of Arora et al. 2019 (Eq. 12, "CURL"), for image-text pairs.

Arora, Khandeparkar, Khodak, Plevrakis, Saunshi, "A Theoretical Analysis of Contrastive
Unsupervised Representation Learning", ICML 2019, Sec. 6.3: with blocks of ``b`` points of one
class, the anchor ``x`` is contrasted with the *mean embedding* of a positive block against the
mean embedding of a negative block,
``L_block = E[ l( f(x)^T (mean_i f(x_i^+) - mean_i f(x_i^-)) ) ]``, and, as their Eq. 5 does for
pairs, with several negative blocks.

Here a block is the set of ``M`` captions of one image (``b = M``; ``text_features`` of shape
``(B * M, d)`` in image order). With ``p_j = mean_m g_jm`` (the plain mean of the unit caption
embeddings, not renormalised, as in the paper) and ``v_ik = s <f_i, p_i> - s <f_i, p_k>``:

- image anchor ``i`` against its block ``p_i`` and the blocks ``p_k`` of the other ``G - 1`` images
  of the global batch (gathered across ranks):
  ``logistic`` (the paper's experiments): ``log(1 + sum_{k != i} exp(-v_ik))``;
  ``hinge``: ``max(0, 1 + max_{k != i} (-v_ik))`` (the paper's two losses, Sec. 2, with natural
  logs; the margin is 1 in units of the scaled logit ``s <f, g>``);
- text anchors "where defined": a caption's positive block is its image (one image, ``b = 1`` on
  that side), its negative blocks the other ``G - 1`` images, with the same ``l``;
- ``L = (L_img + L_txt) / 2``, the mean over image anchors and over caption anchors.

``b = M = 1``: a block is one caption, and ``logistic`` is CLIP's InfoNCE exactly (tested equal to
``clip``); ``hinge`` is a multi-class hinge on the CLIP logits.

The loss reads the logits through block means and (hinge) maxima, not through each anchor's
``(pos, lse_neg)``, so ``no_grad_gather`` is refused. Written here: OpenCLIP has no block loss.
"""
from __future__ import annotations

import torch
from open_clip.loss import gather_features

from .base import ContrastiveLoss, LossFlag
from .gather import captions_per_image, compute_dtype

LINKS = ("logistic", "hinge")


def _row_loss(logits: torch.Tensor, pos_cols: torch.Tensor, link: str) -> torch.Tensor:
    # logits: (n, C), the positive of row r at column pos_cols[r]
    rows = torch.arange(logits.shape[0], device=logits.device)
    pos = logits[rows, pos_cols]
    if link == "logistic":  # log(1 + sum_k exp(l_k - l_pos)) = logsumexp_all l - l_pos
        return torch.logsumexp(logits, dim=1) - pos
    masked = logits.index_put((rows, pos_cols), torch.tensor(float("-inf"), dtype=logits.dtype,
                                                              device=logits.device))
    return torch.clamp(1.0 + masked.max(dim=1).values - pos, min=0.0)


class BlockContrastiveLoss(ContrastiveLoss):
    """Arora et al.'s block contrastive loss (CURL, Eq. 12) with the captions of an image as its block.

    Args:
        link: ``"logistic"`` (default, the paper's experiments) or ``"hinge"``.
        local_loss, gather_with_grad, rank, world_size: as OpenCLIP's ``ClipLoss``.

    Attributes:
        metrics: ``block_size`` (M); with ``hinge``, ``active_rate``, the share of anchor rows whose
            margin is violated (the rows with a gradient).

    Raises:
        ValueError: an unknown ``link``, or ``no_grad_gather=True``.

    Example::

        loss = BlockContrastiveLoss(link="logistic")
        value = loss(image_features, text_features_of_3_captions_each, logit_scale)
    """

    output_key = "curl_loss"
    summary = "block contrastive loss (CURL, Arora et al. 2019): the captions of an image as one block"
    flags = (LossFlag("--curl-link", "link", choices=LINKS,
                      help="the loss on the block score differences: logistic (the paper's experiments) or hinge"),)
    supports_no_grad_gather = False
    supports_captions_per_image = True

    def _no_grad_gather_blocker(self) -> str:
        return "curl (block means and hinge maxima)"

    def __init__(self, link: str = "logistic", **dist_kwargs):
        if link not in LINKS:
            raise ValueError(f"link={link!r} is not one of {LINKS}")
        super().__init__(**dist_kwargs)
        self.link = link

    def compute(self, image_features, text_features, logit_scale, logit_bias, sample_ids):
        m = captions_per_image(image_features, text_features)
        batch = image_features.shape[0]
        if self.world_size > 1:
            all_img, all_txt = gather_features(image_features, text_features, local_loss=self.local_loss,
                                               gather_with_grad=self.gather_with_grad, rank=self.rank,
                                               world_size=self.world_size)
        else:
            all_img, all_txt = image_features, text_features
        num_images = all_img.shape[0]
        if num_images < 2:
            raise ValueError(f"a contrastive loss needs at least 2 pairs in the global batch; got {num_images}")
        dtype = compute_dtype(image_features, text_features)
        local = self.local_loss and self.world_size > 1
        offset = self.rank * batch if local else 0
        with torch.autocast(device_type=image_features.device.type, enabled=False):
            s = logit_scale.to(dtype) if torch.is_tensor(logit_scale) else torch.tensor(float(logit_scale), dtype=dtype)
            all_img, all_txt = all_img.to(dtype), all_txt.to(dtype)
            blocks = all_txt.reshape(num_images, m, -1).mean(dim=1)  # (G, d): p_j, the mean caption of image j
            img_rows = image_features.to(dtype) if local else all_img
            txt_rows = text_features.to(dtype) if local else all_txt
            logits_img = (s * img_rows) @ blocks.T  # (n, G)
            logits_txt = (s * txt_rows) @ all_img.T  # (n M, G)
            if logit_bias is not None:
                logits_img = logits_img + logit_bias
                logits_txt = logits_txt + logit_bias
            dev = logits_img.device
            pos_img = torch.arange(img_rows.shape[0], device=dev) + offset
            pos_txt = (torch.arange(txt_rows.shape[0], device=dev) + offset * m) // m
            rows_img = _row_loss(logits_img, pos_img, self.link)
            rows_txt = _row_loss(logits_txt, pos_txt, self.link)
        loss = (rows_img.mean() + rows_txt.mean()) / 2
        metrics = {"block_size": float(m)}
        if self.link == "hinge":
            metrics["active_rate"] = torch.cat([rows_img, rows_txt]).detach().gt(0).float().mean()
        return loss, metrics

    def extra_repr(self) -> str:
        return f"link={self.link!r}, " + super().extra_repr()
