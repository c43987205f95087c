"""``curl``: the block contrastive loss of Arora et al. 2019 (Eq. 12, "CURL"), for image-text pairs.

Arora et al., ICML 2019, Sec. 6.3: the anchor is contrasted with the mean embedding of a positive
block against negative blocks, ``L_block = E[ l( f(x)^T (mean_i f(x_i^+) - mean_i f(x_i^-)) ) ]``.
A block is the ``M`` captions of one image. With ``p_j = mean_m g_jm`` (not renormalised) and
``v_ik = s <f_i, p_i> - s <f_i, p_k>``, image anchor ``i`` scores ``logistic``
``log(1 + sum_{k != i} exp(-v_ik))`` or ``hinge`` ``max(0, 1 + max_{k != i} (-v_ik))``; a caption's
positive block is its image. At ``M = 1`` ``logistic`` is InfoNCE. No ``no_grad_gather``. With a
``tile``, ``logistic`` is computed over column tiles (`clip_dcl.losses.tiled`); ``hinge`` (a maximum) keeps
the whole matrix.
"""

from __future__ import annotations

import torch

from .base import ContrastiveLoss, LossFlag, check_choice
from .gather import captions_per_image, compute_dtype, scaled_logits
from .tiled import tiled_matrix_stats

LINKS = ("logistic", "hinge")


def _row_loss(logits: torch.Tensor, pos_cols: torch.Tensor, link: str) -> torch.Tensor:
    # logits: (n, C), the positive of row r at column pos_cols[r]
    rows = torch.arange(logits.shape[0], device=logits.device)
    pos = logits[rows, pos_cols]
    if link == "logistic":  # log(1 + sum_k exp(l_k - l_pos)) = logsumexp_all l - l_pos
        return torch.logsumexp(logits, dim=1) - pos
    masked = logits.index_put((rows, pos_cols), torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device))
    return torch.clamp(1.0 + masked.max(dim=1).values - pos, min=0.0)


def _tiled_logistic(scale, rows, candidates, bias, pos_cols: torch.Tensor, tile: int) -> torch.Tensor:
    # logsumexp over all columns = logaddexp(l_pos, logsumexp over the others): the tiled statistics' lse_neg
    pos, stats, _ = tiled_matrix_stats(scale, rows, candidates, bias, pos_cols[:, None], tile=tile, both_axes=False)
    return torch.logaddexp(pos[:, 0], stats[0]) - pos[:, 0]


class BlockContrastiveLoss(ContrastiveLoss):
    """Arora et al.'s block contrastive loss with the captions of an image as its block.

    ``link``: ``"logistic"`` (default) or ``"hinge"``. ``metrics``: ``block_size`` (M), and with
    ``hinge`` ``active_rate``, the share of rows whose margin is violated.
    """

    output_key = "curl_loss"
    summary = "block contrastive loss (CURL, Arora et al. 2019): the captions of an image as one block"
    flags = (
        LossFlag(
            "--curl-link",
            "link",
            choices=LINKS,
            help="the loss on the block score differences: logistic (the paper's experiments) or hinge",
        ),
    )
    supports_no_grad_gather = False
    supports_captions_per_image = True

    def _no_grad_gather_blocker(self) -> str:
        return "curl (block means and hinge maxima)"

    def __init__(self, link: str = "logistic", **dist_kwargs):
        check_choice("link", link, LINKS)
        super().__init__(**dist_kwargs)
        self.link = link

    def compute(self, image_features, text_features, logit_scale, logit_bias, sample_ids):
        m = captions_per_image(image_features, text_features)
        batch = image_features.shape[0]
        all_img, all_txt = self.gather(image_features, text_features)
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
            dev = all_img.device
            pos_img = torch.arange(img_rows.shape[0], device=dev) + offset
            pos_txt = (torch.arange(txt_rows.shape[0], device=dev) + offset * m) // m
            tile = self.tile_for(image_features) if self.link == "logistic" else 0  # hinge: a max, not a sum
            if tile:
                rows_img = _tiled_logistic(s, img_rows, blocks, logit_bias, pos_img, tile)
                rows_txt = _tiled_logistic(s, txt_rows, all_img, logit_bias, pos_txt, tile)
            else:
                logits_img = scaled_logits(s, img_rows, blocks, logit_bias)  # (n, G)
                logits_txt = scaled_logits(s, txt_rows, all_img, logit_bias)  # (n M, G)
                rows_img = _row_loss(logits_img, pos_img, self.link)
                rows_txt = _row_loss(logits_txt, pos_txt, self.link)
        loss = (rows_img.mean() + rows_txt.mean()) / 2
        metrics = {"block_size": float(m)}
        if self.link == "hinge":
            metrics["active_rate"] = torch.cat([rows_img, rows_txt]).detach().gt(0).float().mean()
        return loss, metrics

    def extra_repr(self) -> str:
        return f"link={self.link!r}, " + super().extra_repr()
