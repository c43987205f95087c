"""Gathered logits and per-anchor statistics: what every clip-dcl loss is computed from.

Every loss here reduces, per anchor ``i`` and direction, to ``pos_i = l_ii`` and
``lse_neg_i = logsumexp_{j != i} l_ij``. `anchor_stats` computes both from features gathered as
OpenCLIP's ``ClipLoss`` does (``local_loss`` and ``gather_with_grad`` honoured); ``ClipLoss`` itself
exposes only the cross-entropy. The logits are float32 outside autocast (they reach +-100, where
bf16 resolves 0.5), the positive is masked in place (one matrix kept for autograd, reduced along
both axes), and the scale multiplies the (n x d) anchors, not the (n x G) product.

``no_grad_gather=True`` (with ``local_loss``): exact gradients without gathering through autograd.
The backward collective of ``gather_with_grad`` carries the gradient the other ranks' anchors put on
the local features (their columns). For a loss of ``(pos, lse_neg)`` that is fixed by two numbers per
remote anchor and direction: ``lse_neg_i`` (the softmax weight ``p_ik = exp(l_ik - lse_neg_i)``) and
``c_i = dL / d lse_neg_i`` (everything loss-specific: InfoNCE's ``sigmoid(lse_neg_i - pos_i) / n``,
dcl's debiasing factor and clamp mask, decl's ``lambda_t u_i / r_i`` and ceiling). ``pos_i`` of a
remote anchor is never a local column. Each rank all-gathers ``(lse_neg, c)`` (``4 G`` floats) and
adds ``S - S.detach()`` with ``S = sum_{i, k local} c_i p_ik l_ik``, ``l_ik`` built from the detached
scale, bias and remote features: its gradient is the exact column gradient; DDP's all-reduce does the
rest. The idea is FastCLIP's (Wei et al. 2024, arXiv 2407.01445, which exchanges InfoNCE's weights).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.distributed as dist
from open_clip.loss import gather_features

from .tiled import tiled_directions


@dataclass
class AnchorStats:
    """Per-anchor statistics of one direction (``(n,)``; the image direction's ``pos`` is ``(n, M)`` for M > 1)."""

    pos: torch.Tensor  #: ``l_ii`` (``(n,)``), or ``l_{i, v}`` of the M positives (``(n, M)``)
    lse_neg: torch.Tensor  #: ``logsumexp_{j != i} l_ij``
    #: ``N``, the anchor's negatives: ``G - 1`` candidates of the other modality, or ``(G - 1) M`` captions
    num_negatives: int = 0
    #: ``logsumexp_{j neg} (1 + beta) l_ij`` and ``logsumexp_{j neg} beta l_ij`` (hard-negative weights;
    #: only when ``anchor_stats(beta=...)`` is nonzero)
    lse_hard: Optional[torch.Tensor] = None
    lse_weight: Optional[torch.Tensor] = None
    #: the negatives left after the ``k = top_share * N`` highest-scoring ones are set aside (only when
    #: ``anchor_stats(top_share=...)`` is nonzero; see `_tail_stats`): ``logsumexp`` of their
    #: logits, and with ``beta`` of ``(1 + beta) l`` and ``beta l``
    lse_tail: Optional[torch.Tensor] = None
    lse_hard_tail: Optional[torch.Tensor] = None
    lse_weight_tail: Optional[torch.Tensor] = None


@dataclass
class PairStats:
    """Both directions of one batch, plus what the stateful losses need."""

    image: AnchorStats  #: image anchors against texts
    text: AnchorStats  #: text anchors against images
    num_negatives: int  #: ``K = G - 1``
    row_offset: int  #: global index of this rank's first anchor row (0 when rows are global)
    all_image_features: torch.Tensor  #: gathered (G, d) image features, compute dtype
    all_text_features: torch.Tensor  #: gathered (G, d) text features, compute dtype
    logit_scale: torch.Tensor  #: the scale ``s`` in compute dtype
    #: ``M``, captions per image: the text rows are ``M`` times the image rows, in image order
    captions_per_image: int = 1


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float32, or float64 when any input is float64 (so that tests can compare tightly)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def scaled_logits(scale, anchors: torch.Tensor, candidates: torch.Tensor, bias=None) -> torch.Tensor:
    """``s <a, c>`` (plus the bias), the scale on the (n x d) anchors rather than the (n x G) product."""
    logits = (scale * anchors) @ candidates.T
    return logits if bias is None else logits + bias


def _masked_stats(logits: torch.Tensor, offset: int, both_axes: bool):
    # logits: (n, G) with the positive of row i at column i + offset.
    diag = logits.diagonal(offset)
    pos = diag.clone()  # keep the positives before the in-place mask below
    diag.fill_(float("-inf"))  # the matmul output is not saved by autograd, so in place is safe
    lse_rows = torch.logsumexp(logits, dim=1)  # (n,)
    lse_cols = torch.logsumexp(logits, dim=0) if both_axes else None  # (G,), square case only
    return pos, lse_rows, lse_cols


def _masked_block_stats(logits: torch.Tensor, pos_cols: torch.Tensor, both_axes: bool):
    # logits: (n, C); pos_cols: (n, M) the columns of each row's positives (M >= 1).
    # (n, M), a copy; advanced indexing keeps only the shape for its backward (gather would keep logits,
    # which the in-place mask below then invalidates)
    pos = logits[torch.arange(logits.shape[0], device=logits.device)[:, None], pos_cols]
    logits.scatter_(1, pos_cols, float("-inf"))  # in place, as _masked_stats
    lse_rows = torch.logsumexp(logits, dim=1)
    lse_cols = torch.logsumexp(logits, dim=0) if both_axes else None
    return pos, lse_rows, lse_cols


def _hard_stats(masked: torch.Tensor, beta: float, dim: int):
    """``(logsumexp (1 + beta) l, logsumexp beta l)`` over the negatives (masked entries are -inf)."""
    return torch.logsumexp((1.0 + beta) * masked, dim=dim), torch.logsumexp(beta * masked, dim=dim)


def _tail_stats(masked: torch.Tensor, dim: int, k: float, beta: float):
    """The negatives' log-masses without the ``k`` highest-scoring ones, along ``dim`` of ``masked``.

    ``masked`` has the positives at ``-inf``. The top ``floor(k)`` go whole and the next keeps weight
    ``1 - frac(k)``, so the mass left is continuous in ``k``. Returns ``(lse_tail, lse_hard_tail,
    lse_weight_tail)`` (the last two None without ``beta``), each summed over the negatives left, never
    as ``neg - top``, which cancels in float32 when the top few hold nearly all the mass.
    """
    whole = int(math.floor(k))
    keep = math.log1p(-(k - whole))  # log of the weight of the (floor(k) + 1)-th negative
    values, index = masked.topk(whole + 1, dim=dim)  # the highest first
    nxt = values.narrow(dim, whole, 1)
    gone = torch.full_like(values.narrow(dim, 0, whole), float("-inf"))

    def lse(c: float) -> torch.Tensor:
        scaled = masked if c == 1.0 else c * masked
        # the top floor(k) removed, the next one weighted by 1 - frac(k), the rest as they are
        return torch.logsumexp(scaled.scatter(dim, index, torch.cat([gone, c * nxt + keep], dim=dim)), dim=dim)

    if not beta:
        return lse(1.0), None, None
    return lse(1.0), lse(1.0 + beta), lse(beta)


def captions_per_image(image_features: torch.Tensor, text_features: torch.Tensor) -> int:
    """``M`` from the row counts (``(B, d)`` and ``(B * M, d)``); ``ValueError`` otherwise."""
    if (
        image_features.dim() != 2
        or text_features.dim() != 2
        or image_features.shape[1] != text_features.shape[1]
        or image_features.shape[0] < 1
        or text_features.shape[0] % image_features.shape[0]
        or text_features.shape[0] < image_features.shape[0]
    ):
        raise ValueError(
            f"image_features must be (B, d) and text_features (B * M, d) with M >= 1 captions per image, in image "
            f"order; got {tuple(image_features.shape)} and {tuple(text_features.shape)}"
        )
    return text_features.shape[0] // image_features.shape[0]


def anchor_stats(
    image_features: torch.Tensor,
    text_features: torch.Tensor,
    logit_scale: torch.Tensor,
    logit_bias: Optional[torch.Tensor] = None,
    *,
    rank: int = 0,
    world_size: int = 1,
    local_loss: bool = False,
    gather_with_grad: bool = False,
    beta: float = 0.0,
    gathered: Optional[tuple] = None,
    top_share: float = 0.0,
    tile: int = 0,
) -> PairStats:
    """Gather features across ranks and return the per-anchor statistics of both directions.

    ``image_features`` ``(B, d)``, ``text_features`` ``(B * M, d)`` (M captions per image, in image
    order), ``logit_scale`` exponentiated. Image anchor ``i`` has captions ``i M .. i M + M - 1`` as
    positives and the other images' ``(G - 1) M`` captions as negatives; a caption anchor has its image
    and ``G - 1`` negatives. ``beta > 0`` adds ``lse_hard``/``lse_weight``; ``top_share`` adds the tail
    masses (`_tail_stats`); ``gathered`` reuses features gathered earlier in the step. ``tile > 0``
    computes the same statistics over column tiles of that width, never holding the matrix
    (`clip_dcl.losses.tiled`).
    """
    m = captions_per_image(image_features, text_features)
    batch = image_features.shape[0]
    if gathered is not None:
        all_img, all_txt = gathered
    elif world_size > 1:
        # Gather in the features' own dtype (half the traffic under bf16), as ClipLoss does.
        all_img, all_txt = gather_features(
            image_features,
            text_features,
            local_loss=local_loss,
            gather_with_grad=gather_with_grad,
            rank=rank,
            world_size=world_size,
        )
    else:
        all_img, all_txt = image_features, text_features
    if all_img.shape[0] < 2:
        raise ValueError(f"a contrastive loss needs at least 2 pairs in the global batch; got {all_img.shape[0]}")
    num_images = all_img.shape[0]

    dtype = compute_dtype(image_features, text_features)
    device_type = image_features.device.type
    hard = [None, None, None, None]  # lse_hard / lse_weight of the image and text directions
    tails = [(None, None, None), (None, None, None)]  # _tail_stats of the image and text directions
    k_img, k_txt = top_share * ((num_images - 1) * m), top_share * (num_images - 1)  # k = top_share * N
    with torch.autocast(device_type=device_type, enabled=False):
        s = logit_scale.to(dtype) if torch.is_tensor(logit_scale) else torch.tensor(float(logit_scale), dtype=dtype)
        all_img = all_img.to(dtype)
        all_txt = all_txt.to(dtype)
        local = local_loss and world_size > 1
        offset = rank * batch if local else 0
        img_rows = image_features.to(dtype) if local else all_img

        if tile:
            image, text = tiled_directions(
                s,
                img_rows,
                text_features.to(dtype) if local else None,
                all_img,
                all_txt,
                logit_bias,
                m,
                offset,
                tile=tile,
                beta=beta,
                k_img=k_img or None,
                k_txt=k_txt or None,
            )
            return _pair_stats(image, text, num_images, m, offset, all_img, all_txt, s)
        if m == 1 and local:
            txt = text_features.to(dtype)
            logits_img = scaled_logits(s, img_rows, all_txt, logit_bias)  # (B, G)
            logits_txt = scaled_logits(s, txt, all_img, logit_bias)  # (B, G)
            pos_i, lse_i, _ = _masked_stats(logits_img, offset, both_axes=False)
            pos_t, lse_t, _ = _masked_stats(logits_txt, offset, both_axes=False)
            if beta:
                hard = [*_hard_stats(logits_img, beta, 1), *_hard_stats(logits_txt, beta, 1)]
            if top_share:
                tails = [_tail_stats(logits_img, 1, k_img, beta), _tail_stats(logits_txt, 1, k_txt, beta)]
        elif m == 1:
            # (G, G): rows are image anchors, columns text anchors
            logits = scaled_logits(s, all_img, all_txt, logit_bias)
            pos_i, lse_i, lse_t = _masked_stats(logits, 0, both_axes=True)
            pos_t = pos_i
            if beta:
                hard = [*_hard_stats(logits, beta, 1), *_hard_stats(logits, beta, 0)]
            if top_share:
                tails = [_tail_stats(logits, 1, k_img, beta), _tail_stats(logits, 0, k_txt, beta)]
        else:
            rows = torch.arange(img_rows.shape[0], device=all_txt.device) + offset  # global image index of each row
            pos_cols = rows[:, None] * m + torch.arange(m, device=rows.device)  # (n, M)
            logits_img = scaled_logits(s, img_rows, all_txt, logit_bias)  # (n, G M)
            pos_i, lse_i, lse_cols = _masked_block_stats(logits_img, pos_cols, both_axes=not local)
            if beta:
                hard[:2] = _hard_stats(logits_img, beta, 1)
            if top_share:
                tails[0] = _tail_stats(logits_img, 1, k_img, beta)
            if local:
                txt = text_features.to(dtype)
                logits_txt = scaled_logits(s, txt, all_img, logit_bias)  # (B M, G)
                owner = (torch.arange(txt.shape[0], device=txt.device) + offset * m) // m
                pos_t, lse_t, _ = _masked_block_stats(logits_txt, owner[:, None], both_axes=False)
                pos_t = pos_t[:, 0]
                if beta:
                    hard[2:] = _hard_stats(logits_txt, beta, 1)
                if top_share:
                    tails[1] = _tail_stats(logits_txt, 1, k_txt, beta)
            else:  # the columns of the (G, G M) matrix are the caption anchors; each had one entry masked
                pos_t, lse_t = pos_i.reshape(-1), lse_cols
                if beta:
                    hard[2:] = _hard_stats(logits_img, beta, 0)
                if top_share:
                    tails[1] = _tail_stats(logits_img, 0, k_txt, beta)
    image = (pos_i, lse_i, hard[0], hard[1], *tails[0])
    return _pair_stats(image, (pos_t, lse_t, hard[2], hard[3], *tails[1]), num_images, m, offset, all_img, all_txt, s)


def _pair_stats(image, text, num_images, m, offset, all_img, all_txt, s) -> PairStats:
    """`PairStats` from each direction's ``(positive, lse, hard..., tail...)``: an image row has ``(N - 1) m``
    negatives (every caption of the other images), a caption row ``N - 1``."""
    return PairStats(
        image=AnchorStats(image[0], image[1], (num_images - 1) * m, *image[2:]),
        text=AnchorStats(text[0], text[1], num_images - 1, *text[2:]),
        num_negatives=num_images - 1,
        row_offset=offset,
        all_image_features=all_img,
        all_text_features=all_txt,
        logit_scale=s,
        captions_per_image=m,
    )


def all_gather_cat(tensor: torch.Tensor, world_size: int, dim: int = 0) -> torch.Tensor:
    """Concatenate ``tensor`` from every rank in rank order, without gradient."""
    if world_size <= 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(world_size)]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts, dim=dim)


def column_surrogate(
    loss: torch.Tensor,
    stats: List[PairStats],
    image_features: torch.Tensor,
    text_features: torch.Tensor,
    logit_bias: Optional[torch.Tensor],
    rank: int,
    world_size: int,
    tile: int = 0,
) -> torch.Tensor:
    """``S - S.detach()``: zero, with the gradient every rank's anchors put on the local features.

    See the module docstring. ``stats``: one or several sets of the local anchors' statistics from the
    same features, whose derivatives add up. ``tile > 0`` takes the ``(G, B)`` weights ``tile`` anchors at a time.
    """
    st = stats[0]
    c_local = d_local = None
    for one in stats:
        directions = (one.image, one.text)
        wanted = [d.lse_neg for d in directions] + [d.pos for d in directions]
        grads = torch.autograd.grad(loss, wanted, retain_graph=True, allow_unused=True)
        grads = [torch.zeros_like(w) if g is None else g for w, g in zip(wanted, grads)]
        if c_local is None:
            c_local, d_local = grads[:2], grads[2:]
        else:
            c_local = [a + b for a, b in zip(c_local, grads[:2])]
            d_local = [a + b for a, b in zip(d_local, grads[2:])]
    local = torch.stack([d.lse_neg.detach() for d in directions] + [g.detach() for g in c_local])  # (4, B)
    lse_all, c_all = all_gather_cat(local, world_size, dim=1).split(2)  # (2, G) each
    batch = image_features.shape[0]
    s = st.logit_scale.detach()
    rows = torch.arange(batch, device=st.all_image_features.device) + rank * batch
    cols = torch.arange(batch, device=rows.device)
    total = loss.new_zeros(())
    # image anchors (all G) against the local texts; text anchors (all G) against the local images
    for d, (anchors, local_feats) in enumerate(
        ((st.all_image_features, text_features), (st.all_text_features, image_features))
    ):
        feats = local_feats.to(anchors.dtype)
        with torch.no_grad():
            scaled = s * anchors.detach()
            pulled = torch.zeros_like(feats)  # (B, d): dS/d(local features)
            step = tile or scaled.shape[0]
            for i0 in range(0, scaled.shape[0], step):
                part = scaled[i0 : i0 + step]
                logits = part @ feats.detach().T  # (t, B)
                if logit_bias is not None:
                    logits = logits + logit_bias.detach().to(logits.dtype)
                weights = c_all[d][i0 : i0 + step, None] * torch.exp(logits - lse_all[d][i0 : i0 + step, None])
                here = (rows >= i0) & (rows < i0 + step)  # the local positives in this block of anchors
                weights[rows[here] - i0, cols[here]] = d_local[d].detach().to(weights.dtype)[here]
                pulled.addmm_(weights.T, part)
        total = total + (pulled * feats).sum()
    return total - total.detach()
