"""Tiled anchor statistics: the per-anchor log-sum-exps of `clip_dcl.losses.gather` without the G x G matrix.

Every loss here reads the logits ``l_ij = s <f_i, c_j>`` (``a_i = s f_i``, the scale on the anchors) only
through per-row (and, for the square matrix, per-column) reductions over the negatives::

    LSE_k,i = logsumexp_{j neg} (gamma_k l_ij + w_ij)        gamma_k in {1, 1 + beta, beta}

with ``w_ij = 0`` for the plain and hard-negative sums, and for the ``same_class="top"`` tail
``w_ij = -inf`` above the row's threshold (its ``floor(k) + 1``-th largest negative), ``log(1 - frac(k))``
at it and 0 below. `TiledLSE` computes them over column tiles of width ``tile`` with an online
reduction and keeps only the features, the scale and the statistics for backward. Its backward forms
``s f`` again and recomputes each tile: with ``G_k,i = dL/dLSE_k,i`` (autograd's gradient of the
per-row epilogue: the DCL clamp, HCL, DeCL's ratio, InfoNCE; 0 on a clamped row)::

    dL/dl_ij = sum_k G_k,i gamma_k exp(gamma_k l_ij + w_ij - LSE_k,i)   (+ the column analogues)
    dL/da_i = sum_j dL/dl_ij c_j,      dL/dc_j = sum_i dL/dl_ij a_i,
    dL/df_i = s dL/da_i,               dL/ds = sum_i <dL/da_i, f_i>

so a tile costs two matmuls forward-and-recompute and two for the gradients, and memory is a few
``n x tile`` blocks. The positives' logits are row-wise dot products in ordinary autograd, and a
bias ``b`` enters as ``gamma_k b`` added to each statistic. The ``top`` thresholds need a first pass
(a running top-``floor(k) + 1`` per row; a column's is complete within its tile). Exact ties at a
threshold are split differently from ``torch.topk`` (they have probability 0 with real features).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
from torch.autograd.function import once_differentiable

#: the column-tile width a device type uses when a loss is given ``tile=None``, where the tiled path was measured at
#: least as fast as the whole matrix; 0 (the whole matrix) elsewhere. None is yet: on the CPU (2 cores,
#: benchmarks/results/loss_speed.md) tiles of 1024 took about 1.4x the whole matrix's time for dcl and decl at
#: G = 4096 and 8192 (and less than ClipLoss's), for a fifth of its memory.
DEFAULT_TILE: Dict[str, int] = {}

NEG_INF = float("-inf")


def check_tile(tile) -> None:
    """``ValueError`` unless ``tile`` is None (the device's default) or an int >= 0 (0: the whole matrix)."""
    if tile is not None and (isinstance(tile, bool) or not isinstance(tile, int) or tile < 0):
        raise ValueError(f"tile={tile!r} must be an integer >= 0 (0: the whole logit matrix) or None (the default)")


def parse_tile(text: str) -> int:
    """``--loss-tile``: a column-tile width >= 0."""
    try:
        tile = int(text)
    except ValueError:
        raise ValueError(f"tile={text!r} is not an integer") from None
    check_tile(tile)
    return tile


def resolve_tile(tile: Optional[int], device: torch.device) -> int:
    """The tile width in effect: ``tile``, or the default of ``device``'s type for None."""
    return DEFAULT_TILE.get(device.type, 0) if tile is None else tile


@dataclass(frozen=True)
class Reduction:
    """One statistic: a log-sum-exp along rows (``axis=1``, one per anchor row) or columns (``axis=0``)."""

    axis: int
    gamma: float  #: the logits' multiplier: 1, 1 + beta or beta
    tail: bool = False  #: over the negatives below the ``top`` threshold only
    role: str = "plain"  #: ``"plain"``, ``"hard"`` (1 + beta) or ``"weight"`` (beta): beta may be 1


@dataclass
class TilePlan:
    """What `TiledLSE` needs besides the features: which entries are masked, what to reduce, how wide a tile."""

    pos_cols: torch.Tensor  #: ``(n, M)`` the columns of each row's positives, masked out of every statistic
    reductions: Tuple[Reduction, ...]
    tile: int
    #: the ``top`` thresholds of the rows ``(n,)`` and of the columns ``(C,)`` and ``log(1 - frac(k))`` of each
    row_threshold: Optional[torch.Tensor] = None
    col_threshold: Optional[torch.Tensor] = None
    row_keep: float = 0.0
    col_keep: float = 0.0
    beta: float = 0.0  #: HCL's beta: the statistics of (1 + beta) l and beta l are asked along every axis

    def tiles(self, num_cols: int):
        """``(start, end, rows, cols)`` of each column tile, with the positives inside it (cols tile-relative)."""
        inside_all = self.pos_cols
        for j0 in range(0, num_cols, self.tile):
            j1 = min(j0 + self.tile, num_cols)
            rows, m = ((inside_all >= j0) & (inside_all < j1)).nonzero(as_tuple=True)
            yield j0, j1, rows, inside_all[rows, m] - j0

    def masked_tile(self, anchors, candidates, j0, j1, rows, cols) -> torch.Tensor:
        logits = anchors @ candidates[j0:j1].T  # (n, t)
        logits[rows, cols] = NEG_INF
        return logits

    def tail_weight(self, logits: torch.Tensor, axis: int, j0: int, j1: int) -> torch.Tensor:
        """``w_ij`` of the tile: -inf above the threshold, ``log(1 - frac(k))`` at it, 0 below."""
        if axis == 1:
            thr, keep = self.row_threshold[:, None], self.row_keep
        else:
            thr, keep = self.col_threshold[None, j0:j1], self.col_keep
        zero = logits.new_zeros(())
        return torch.where(logits < thr, zero, torch.where(logits == thr, zero + keep, zero + NEG_INF))

    def axes(self):
        return sorted({r.axis for r in self.reductions}, reverse=True)

    def _index(self, axis: int, role: str, tail: bool = False) -> Optional[int]:
        for k, r in enumerate(self.reductions):
            if (r.axis, r.role, r.tail) == (axis, role, tail):
                return k
        return None

    def exponentials(self, z, axis):
        """``(k, exp(gamma_k z))`` of each statistic ``k`` along ``axis`` but the tails, ``z`` the shifted tile.

        Each is summed before the next is asked for, so they share ``z``'s memory: ``exp(z)`` is formed in place
        and becomes ``exp((1 + beta) z) = exp(z) exp(beta z)`` in place.
        """
        eb = (self.beta * z).exp_() if self.beta else None
        e1 = z.exp_()
        yield self._index(axis, "plain"), e1
        if self.beta:
            yield self._index(axis, "weight"), eb
            yield self._index(axis, "hard"), e1.mul_(eb)

    def logit_gradient(self, logits, outs, grads, j0, j1) -> torch.Tensor:
        """``dL/dl`` of the tile: ``sum_k gamma_k G_k exp(gamma_k l + w - LSE_k)`` over every statistic."""
        d_logits = None

        def add(x, scale):  # d_logits += x * scale, x a tile of this function's own
            nonlocal d_logits
            d_logits = x.mul_(scale) if d_logits is None else d_logits.addcmul_(x, scale)

        for axis in self.axes():
            plain = self._index(axis, "plain")
            lse1, c1 = _line(outs[plain], axis, j0, j1), _line(grads[plain], axis, j0, j1)
            e1 = (logits - lse1).exp_()  # the plain softmax weights
            if self.beta:
                # exp((1 + b) l - LSE_h) = exp(l - LSE_1) exp(b l - LSE_b) exp(LSE_1 + LSE_b - LSE_h), the last
                # factor between 1 and N: d = e1 (c1 + c_h f eb) + c_b eb, with c_k = gamma_k G_k
                weight, hard = self._index(axis, "weight"), self._index(axis, "hard")
                lse_b, lse_h = _line(outs[weight], axis, j0, j1), _line(outs[hard], axis, j0, j1)
                eb = torch.add(-lse_b, logits, alpha=self.beta).exp_()
                factor = (lse1 + lse_b - lse_h).exp_().mul_((1.0 + self.beta) * _line(grads[hard], axis, j0, j1))
                x = torch.addcmul(c1, eb, factor).mul_(e1).addcmul_(eb, self.beta * _line(grads[weight], axis, j0, j1))
                d_logits = x if d_logits is None else d_logits.add_(x)
            else:
                add(e1, c1)
            for k, r in enumerate(self.reductions):
                if r.axis == axis and r.tail:
                    x = logits if r.gamma == 1.0 else r.gamma * logits
                    x = (x + self.tail_weight(logits, axis, j0, j1)).sub_(_line(outs[k], axis, j0, j1)).exp_()
                    add(x, r.gamma * _line(grads[k], axis, j0, j1))
        return d_logits


def _line(vec: torch.Tensor, axis: int, j0: int, j1: int) -> torch.Tensor:
    """A per-row ``(n, 1)`` or per-column ``(1, t)`` view of a statistic for the tile ``[j0, j1)``."""
    return vec[:, None] if axis == 1 else vec[None, j0:j1]


class TiledLSE(torch.autograd.Function):
    """``(anchors (n, d), candidates (C, d), plan)`` -> one tensor per ``plan.reductions`` (``(n,)`` or ``(C,)``).

    See the module docstring for the forward reduction and the recomputing backward. The elementwise work
    is what costs beside the matmuls: one shift per row (or column) serves every statistic, and HCL's
    ``exp((1 + beta) l)`` is the product of the plain and the weight exponentials, one ``exp`` fewer.
    """

    @staticmethod
    def forward(ctx, anchors, candidates, scale, plan: TilePlan):
        n, c = anchors.shape[0], candidates.shape[0]
        a = scale * anchors  # (n, d): the scale on the anchors, as scaled_logits does; not kept
        outs = [anchors.new_full((n if r.axis == 1 else c,), NEG_INF) for r in plan.reductions]
        for j0, j1, rows, cols in plan.tiles(c):
            logits = plan.masked_tile(a, candidates, j0, j1, rows, cols)
            for axis in plan.axes():
                shift = logits.amax(dim=axis, keepdim=True)
                shift = torch.where(shift == NEG_INF, 0.0, shift)  # a line of masked entries only sums to 0
                z = logits - shift  # <= 0: no exp below overflows
                found = [
                    (k, torch.log(x.sum(dim=axis)).add_(plan.reductions[k].gamma * shift.reshape(-1)))
                    for k, x in plan.exponentials(z, axis)
                ]
                for k, r in enumerate(plan.reductions):
                    if r.axis == axis and r.tail:  # shifted by its own maximum: the row's lies in the top k
                        x = logits if r.gamma == 1.0 else r.gamma * logits
                        found.append((k, torch.logsumexp(x + plan.tail_weight(logits, axis, j0, j1), dim=axis)))
                for k, lse in found:
                    if axis == 1:  # online: merge this tile's log-sum-exp into the row's
                        torch.logaddexp(outs[k], lse, out=outs[k])
                    else:  # a tile holds every row: the column's statistic is complete
                        outs[k][j0:j1] = lse
        ctx.save_for_backward(anchors, candidates, scale, *outs)
        ctx.plan = plan
        return tuple(outs)

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads):
        anchors, candidates, scale, *outs = ctx.saved_tensors
        plan: TilePlan = ctx.plan
        a = scale * anchors
        d_a = torch.zeros_like(anchors)  # dL/d(s a)
        d_candidates = torch.zeros_like(candidates)
        for j0, j1, rows, cols in plan.tiles(candidates.shape[0]):
            logits = plan.masked_tile(a, candidates, j0, j1, rows, cols)
            d_logits = plan.logit_gradient(logits, outs, grads, j0, j1)
            d_a.addmm_(d_logits, candidates[j0:j1])
            d_candidates[j0:j1] = d_logits.T @ a
        d_scale = (d_a * anchors).sum().reshape(scale.shape) if ctx.needs_input_grad[2] else None
        return d_a.mul_(scale), d_candidates, d_scale, None


@torch.no_grad()
def top_thresholds(anchors, candidates, plan: TilePlan, k_rows: Optional[float], k_cols: Optional[float]):
    """The ``top`` thresholds: each row's (and column's) ``floor(k) + 1``-th largest negative logit (first pass)."""
    row_thr = col_thr = running = None
    c = candidates.shape[0]
    if k_cols is not None:
        col_thr = anchors.new_empty(c)
    for j0, j1, rows, cols in plan.tiles(c):
        logits = plan.masked_tile(anchors, candidates, j0, j1, rows, cols)
        if k_cols is not None:
            col_thr[j0:j1] = logits.topk(int(k_cols) + 1, dim=0).values[-1]
        if k_rows is not None:
            pool = logits if running is None else torch.cat([running, logits], dim=1)
            running = pool.topk(min(int(k_rows) + 1, pool.shape[1]), dim=1).values
    if k_rows is not None:
        row_thr = running[:, int(k_rows)]
    return row_thr, col_thr


def _keep(k: float) -> float:
    return math.log1p(-(k - math.floor(k)))


def tiled_matrix_stats(
    scale: torch.Tensor,
    anchors: torch.Tensor,
    candidates: torch.Tensor,
    bias: Optional[torch.Tensor],
    pos_cols: torch.Tensor,
    *,
    tile: int,
    both_axes: bool,
    beta: float = 0.0,
    k_rows: Optional[float] = None,
    k_cols: Optional[float] = None,
    pos_dot: Optional[torch.Tensor] = None,
):
    """The statistics of ``s <anchors, candidates> (+ bias)`` with ``pos_cols`` ``(n, M)`` masked, tiled.

    Returns ``(pos (n, M), row stats, column stats or None)``, each stats a list
    ``[lse, lse_hard, lse_weight, lse_tail, lse_hard_tail, lse_weight_tail]`` (None where not asked:
    the hard ones without ``beta``, the tails without ``k``), the fields of `AnchorStats`. ``pos_dot``: the
    positives' ``<a_i, c_v>`` ``(n, M)`` when the caller has them from views of the features (a gather by
    ``pos_cols`` would keep a copy of the positives for backward).
    """
    if pos_dot is None:
        pos_dot = (anchors[:, None, :] * candidates[pos_cols]).sum(-1)
    pos = scale * pos_dot  # (n, M): l_iv
    if bias is not None:
        pos = pos + bias
    # the six fields in AnchorStats order, (gamma, role) of each; the hard-negative ones only with beta
    roles = [(1.0, "plain")] + ([(1.0 + beta, "hard"), (beta, "weight")] if beta else [None, None])
    fields = [None if r is None else (r[0], tail, r[1]) for tail in (False, True) for r in roles]
    reductions, slots = [], []
    for axis, k in [(1, k_rows)] + ([(0, k_cols)] if both_axes else []):
        for slot, f in enumerate(fields):
            if f is not None and (not f[1] or k):
                reductions.append(Reduction(axis, *f))
                slots.append((axis, slot))
    plan = TilePlan(pos_cols, tuple(reductions), tile, beta=float(beta))
    cols_top = k_cols if both_axes and k_cols else None
    if k_rows or cols_top:
        with torch.no_grad():
            plan.row_threshold, plan.col_threshold = top_thresholds(
                scale * anchors, candidates, plan, k_rows or None, cols_top
            )
        plan.row_keep, plan.col_keep = _keep(k_rows or 0.0), _keep(cols_top or 0.0)
    outs = TiledLSE.apply(anchors, candidates, scale, plan)
    found = {1: [None] * 6, 0: [None] * 6}
    for red, (axis, slot), out in zip(reductions, slots, outs):
        found[axis][slot] = out if bias is None else out + red.gamma * bias
    return pos, found[1], (found[0] if both_axes else None)


def tiled_directions(
    scale, img_rows, txt_rows, all_img, all_txt, bias, m: int, offset: int, *, tile, beta, k_img, k_txt
):
    """Both directions' ``(pos, lse_neg, lse_hard, lse_weight, lse_tail, lse_hard_tail, lse_weight_tail)``.

    ``txt_rows`` None: the rows are global and the text anchors are the columns of the image matrix;
    otherwise (``local_loss``) each direction is its own ``(n, G)`` matrix. Layout as `anchor_stats`.
    """
    device = all_txt.device
    image_index = torch.arange(img_rows.shape[0], device=device) + offset  # each row's image in the global batch
    pos_cols = image_index[:, None] * m + torch.arange(m, device=device)  # (n, M): its captions
    both = txt_rows is None
    n, d = img_rows.shape
    # <f_i, g_v> of the positives from views (the image's M captions are consecutive rows)
    own_captions = all_txt[offset * m : (offset + n) * m].view(n, m, d)
    pos_i, img, cols = tiled_matrix_stats(
        scale,
        img_rows,
        all_txt,
        bias,
        pos_cols,
        tile=tile,
        both_axes=both,
        beta=beta,
        k_rows=k_img,
        k_cols=k_txt,
        pos_dot=(img_rows[:, None, :] * own_captions).sum(-1),
    )
    if both:
        pos_t, txt = pos_i.reshape(-1), cols
    else:
        owner = (torch.arange(txt_rows.shape[0], device=device) + offset * m) // m  # each caption's image
        pos_dot = (txt_rows.view(n, m, d) * all_img[offset : offset + n, None, :]).sum(-1).reshape(-1, 1)
        pos_t, txt, _ = tiled_matrix_stats(
            scale,
            txt_rows,
            all_img,
            bias,
            owner[:, None],
            tile=tile,
            both_axes=False,
            beta=beta,
            k_rows=k_txt,
            pos_dot=pos_dot,
        )
        pos_t = pos_t[:, 0]
    return [pos_i[:, 0] if m == 1 else pos_i, *img], [pos_t, *txt]
