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

#: ``{device type: (G, tile)}``: the tile width a loss given ``tile=None`` uses on that device from a square G x G
#: logit matrix of G columns up, where the tiled path was measured at least as fast as the whole matrix for every
#: loss; 0 (the whole matrix) below G, for a B x G matrix (``--local-loss`` on several ranks) and on other devices.
#: On the CPU (2 cores, benchmarks/results/loss_speed.md and loss_speed_small.md) tiles of 1024 took less time than
#: the whole matrix for dcl, HCL and decl at G = 4096 and 8192, and more for dcl and decl at G = 32 to 2048.
DEFAULT_TILE: Dict[str, Tuple[int, int]] = {"cpu": (4096, 1024)}

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


def resolve_tile(tile: Optional[int], device: torch.device, columns: int = 0, square: bool = True) -> int:
    """The tile width in effect: ``tile``, or for None `DEFAULT_TILE`'s for ``device``'s type and a logit matrix of
    ``columns`` columns (``square``: as many rows)."""
    if tile is not None:
        return tile
    from_columns, width = DEFAULT_TILE.get(device.type, (0, 0))
    return width if width and square and columns >= from_columns else 0


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

    def masked_tile(self, anchors, candidates, j0, j1, rows, cols, out=None) -> torch.Tensor:
        """The tile's logits ``(n, j1 - j0)`` with the positives at -inf, written into ``out`` when given."""
        logits = torch.mm(anchors, candidates[j0:j1].T, out=out)
        logits[rows, cols] = NEG_INF
        return logits

    def masked_columns(self, anchors, candidates, j0, j1, rows, cols, idx) -> torch.Tensor:
        """The logits of the tile's columns ``idx`` only ``(n, len(idx))``, positives at -inf."""
        logits = anchors @ candidates[j0 + idx].T
        where = torch.full((j1 - j0,), -1, dtype=torch.long, device=idx.device)
        where[idx] = torch.arange(idx.numel(), device=idx.device)
        at = where[cols]
        inside = at >= 0
        logits[rows[inside], at[inside]] = NEG_INF
        return logits

    def tail_weight(self, logits: torch.Tensor, axis: int, j0: int, j1: int) -> torch.Tensor:
        """``w_ij`` of the tile: -inf above the threshold, ``log(1 - frac(k))`` at it, 0 below."""
        if axis == 1:
            thr, keep = self.row_threshold[:, None], self.row_keep
        else:
            thr, keep = self.col_threshold[None, j0:j1], self.col_keep
        zero = logits.new_zeros(())
        return torch.where(logits < thr, zero, torch.where(logits == thr, zero + keep, zero + NEG_INF))

    def gammas(self) -> Tuple[float, ...]:
        """The distinct multipliers of the statistics but the tails: 1, and beta and 1 + beta with HCL."""
        return (1.0,) if not self.beta else ((1.0, 2.0) if self.beta == 1.0 else (1.0, self.beta, 1.0 + self.beta))

    def tail_stats(self, logits, j0, j1):
        """``(k, this tile's log-sum-exp)`` of the tails, each shifted by its own maximum (the row's lies in the
        top k)."""
        found = []
        for k, r in enumerate(self.reductions):
            if r.tail:
                x = logits if r.gamma == 1.0 else r.gamma * logits
                found.append((k, torch.logsumexp(x + self.tail_weight(logits, r.axis, j0, j1), dim=r.axis)))
        return found

    def tail_gradient(self, logits, outs, grads, j0, j1) -> Optional[torch.Tensor]:
        """``sum_k gamma_k G_k exp(gamma_k l + w - LSE_k)`` over the tails (None without any)."""
        d = None
        for k, r in enumerate(self.reductions):
            if r.tail:
                x = logits if r.gamma == 1.0 else r.gamma * logits
                x = (x + self.tail_weight(logits, r.axis, j0, j1)).sub_(_line(outs[k], r.axis, j0, j1)).exp_()
                x.mul_(r.gamma * _line(grads[k], r.axis, j0, j1))
                d = x if d is None else d.add_(x)
        return d

    def powers(self, z, spare):
        """``(gamma, exp(gamma z))`` for `gammas`, ``z`` the row-shifted tile, each to be used before the next.

        ``exp(z)`` is formed in place of ``z``; HCL's ``exp(beta z)`` in ``spare()`` (``exp(z)`` itself when
        beta = 1), and ``exp((1 + beta) z) = exp(z) exp(beta z)`` then in place of it: one ``exp`` per entry, two
        with beta other than 1.
        """
        eb = torch.mul(z, self.beta, out=spare()).exp_() if self.beta and self.beta != 1.0 else None
        e1 = z.exp_()
        yield 1.0, e1
        if self.beta == 1.0:
            yield 2.0, torch.mul(e1, e1, out=spare())
        elif self.beta:
            yield self.beta, eb
            yield 1.0 + self.beta, eb.mul_(e1)


def _line(vec: torch.Tensor, axis: int, j0: int, j1: int) -> torch.Tensor:
    """A per-row ``(n, 1)`` or per-column ``(1, t)`` view of a statistic for the tile ``[j0, j1)``."""
    return vec[:, None] if axis == 1 else vec[None, j0:j1]


def _log_floor(dtype: torch.dtype, n: int) -> float:
    """The least ``log S_j`` of a column sum formed from row-shifted exponentials that keeps its dtype's precision.

    Each of the ``n`` terms ``exp(gamma (l_ij - r_i)) exp(gamma (r_i - M))`` is either accurate to ``eps`` of its
    size or below ``tiny`` (an underflow), so ``S_j`` is within ``eps S_j + 4 n tiny``; below this floor the
    column is summed again from its own logits.
    """
    info = torch.finfo(dtype)
    return math.log(4 * n * info.tiny / info.eps)


class _Tile:
    """One tile's row shifts: ``r_i`` its row maxima, ``M`` the largest of them.

    Every exponential of the tile is taken once, row-shifted: ``P_ij = exp(gamma (l_ij - r_i)) <= 1``. A row's
    statistic is ``log sum_j P_ij + gamma r_i`` (its online merge as before); a column's is
    ``log S_j + gamma M`` with ``S_j = sum_i P_ij exp(gamma (r_i - M))``, a matrix-vector product. The column
    statistic is exact whenever ``log S_j`` clears `_log_floor` (in float64 always, for logits within
    +-700); a column below it is recomputed from its own logits.
    """

    def __init__(self, logits: torch.Tensor):
        self.r = logits.amax(dim=1)  # (n,)
        self.shift = torch.where(self.r == NEG_INF, 0.0, self.r)  # a line of masked entries only sums to 0
        top = self.r.max()
        self.top = torch.where(top == NEG_INF, 0.0, top)
        self.floor = _log_floor(logits.dtype, logits.shape[0])

    def weights(self, gamma: float) -> torch.Tensor:
        """``exp(gamma (r_i - M))`` ``(n,)``: 0 on a row of masked entries."""
        return ((self.r - self.top) * gamma).exp_()


class _Buffers:
    """The ``n x tile`` blocks a call reuses across its tiles (a fresh one per tile costs the allocator more
    than the arithmetic on the CPU)."""

    def __init__(self, like: torch.Tensor, n: int, tile: int):
        self.like, self.n, self.tile = like, n, tile
        self.flat = {}  # made at first use: a loss without HCL never asks for the spare one

    def __call__(self, i: int, width: int) -> torch.Tensor:
        if i not in self.flat:
            self.flat[i] = self.like.new_empty(self.n * self.tile)
        return self.flat[i][: self.n * width].view(self.n, width)


class TiledLSE(torch.autograd.Function):
    """``(anchors (n, d), candidates (C, d), plan)`` -> one tensor per ``plan.reductions`` (``(n,)`` or ``(C,)``).

    See the module docstring for the forward reduction and the recomputing backward, and `_Tile` for how one
    set of row-shifted exponentials serves the row and the column statistics alike.
    """

    @staticmethod
    def forward(ctx, anchors, candidates, scale, plan: TilePlan):
        n, c = anchors.shape[0], candidates.shape[0]
        a = scale * anchors  # (n, d): the scale on the anchors, as scaled_logits does; not kept
        outs = [anchors.new_full((n if r.axis == 1 else c,), NEG_INF) for r in plan.reductions]
        buffers = _Buffers(a, n, min(plan.tile, c))
        ones = a.new_ones(min(plan.tile, c))
        by_gamma = {}  # gamma -> [(k, axis)] of the statistics but the tails
        for k, r in enumerate(plan.reductions):
            if not r.tail:
                by_gamma.setdefault(r.gamma, []).append((k, r.axis))
        for j0, j1, rows, cols in plan.tiles(c):
            logits = plan.masked_tile(a, candidates, j0, j1, rows, cols, out=buffers(0, j1 - j0))
            found = plan.tail_stats(logits, j0, j1)  # before the tile is overwritten by its exponentials
            tile = _Tile(logits)
            z = logits.sub_(tile.shift[:, None])
            for gamma, p in plan.powers(z, lambda: buffers(1, j1 - j0)):
                targets = by_gamma.get(gamma, [])
                if any(axis == 1 for _, axis in targets):
                    row = torch.mv(p, ones[: j1 - j0]).log_().add_(tile.shift, alpha=gamma)
                if any(axis == 0 for _, axis in targets):
                    col = torch.mv(p.T, tile.weights(gamma)).log_()
                    low = (col < tile.floor).nonzero()[:, 0]
                    col.add_(gamma * tile.top)
                    if low.numel():  # summed again from their own logits, each shifted by its own maximum
                        again = plan.masked_columns(a, candidates, j0, j1, rows, cols, low)
                        col[low] = torch.logsumexp(gamma * again, dim=0)
                found += [(k, row if axis == 1 else col) for k, axis in targets]
            for k, lse in found:
                if plan.reductions[k].axis == 1:  # online: merge this tile's log-sum-exp into the row's
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
        n, c = anchors.shape[0], candidates.shape[0]
        a = scale * anchors
        d_a = torch.zeros_like(anchors)  # dL/d(s a)
        d_candidates = torch.empty_like(candidates)
        buffers = _Buffers(a, n, min(plan.tile, c))
        for j0, j1, rows, cols in plan.tiles(c):
            logits = plan.masked_tile(a, candidates, j0, j1, rows, cols, out=buffers(0, j1 - j0))
            d_tail = plan.tail_gradient(logits, outs, grads, j0, j1)  # before the tile is overwritten
            d_logits = _logit_gradient(plan, logits, outs, grads, buffers, a, candidates, j0, j1, rows, cols)
            if d_tail is not None:
                d_logits.add_(d_tail)
            d_a.addmm_(d_logits, candidates[j0:j1])
            torch.mm(d_logits.T, a, out=d_candidates[j0:j1])
        d_scale = (d_a * anchors).sum().reshape(scale.shape) if ctx.needs_input_grad[2] else None
        return d_a.mul_(scale), d_candidates, d_scale, None


def _logit_gradient(plan: TilePlan, logits, outs, grads, buffers, a, candidates, j0, j1, rows, cols):
    """``dL/dl`` of the tile from the statistics but the tails, from one set of row-shifted exponentials.

    With ``P_g = exp(g (l - r))`` (`_Tile`), each statistic's term ``g G_k exp(g l - LSE_k)`` is
    ``P_g rho_i`` along rows, ``rho_i = g G_k,i exp(g r_i - LSE_k,i) <= g G_k,i``, and ``P_g w_i kappa_j`` along
    columns, ``w_i = exp(g (r_i - M)) <= 1``, ``kappa_j = g G_k,j exp(g M - LSE_k,j)``: so
    ``dL/dl = sum_g P_g (U_g V_g)``, ``U_g = [rho, w]`` ``(n, 2)`` and ``V_g = [1, kappa]`` ``(2, t)``, a rank-two
    product each. HCL's ``P_(1+b) = P_1 P_b`` folds into ``P_1 (U_1 V_1 + P_b (U_h V_h)) + P_b (U_b V_b)``.
    A column whose sum fell below the floor in forward (`_log_floor`) gets its term from its own logits.
    """
    width = j1 - j0
    tile = _Tile(logits)
    low = {}  # gamma -> the columns summed again
    factors = {}
    for gamma in plan.gammas():
        rho = logits.new_zeros(logits.shape[0])
        kappa = None
        for k, r in enumerate(plan.reductions):
            if r.tail or r.gamma != gamma:
                continue
            if r.axis == 1:
                rho += (gamma * tile.shift - outs[k]).exp_().mul_(gamma * grads[k])
            else:
                log_s = outs[k][j0:j1] - gamma * tile.top
                term = log_s.neg().exp_().mul_(gamma * grads[k][j0:j1])
                below = log_s < tile.floor
                kappa = torch.where(below, 0.0, term) if kappa is None else kappa + torch.where(below, 0.0, term)
                low.setdefault(gamma, []).append((k, below))
        rho = torch.where(tile.r == NEG_INF, 0.0, rho)
        if kappa is None:
            factors[gamma] = (rho[:, None], logits.new_ones(1, width))
        else:
            u = torch.stack([rho, tile.weights(gamma)], dim=1)
            factors[gamma] = (u, torch.stack([torch.ones_like(kappa), kappa]))
    z = logits.sub_(tile.shift[:, None])
    powers = plan.powers(z, lambda: buffers(1, width))
    d = buffers(2, width)
    _, p1 = next(powers)
    if not plan.beta:
        torch.mm(*factors[1.0], out=d).mul_(p1)
    elif plan.beta == 1.0:
        # P_1 (U_1 V_1 + P_1 (U_2 V_2)): P_2 = P_1 P_1 is never formed
        torch.mm(*factors[2.0], out=d).mul_(p1).addmm_(*factors[1.0]).mul_(p1)
    else:
        beta = plan.beta
        _, pb = next(powers)  # P_1 (U_1 V_1 + P_b (U_h V_h)) + P_b (U_b V_b), U_b V_b formed where P_1 was
        torch.mm(*factors[1.0 + beta], out=d).mul_(pb).addmm_(*factors[1.0]).mul_(p1)
        d.addcmul_(pb, torch.mm(*factors[beta], out=p1))
    for gamma, entries in low.items():
        idx = torch.stack([b for _, b in entries]).any(dim=0).nonzero()[:, 0]
        if idx.numel():
            again = gamma * plan.masked_columns(a, candidates, j0, j1, rows, cols, idx)
            for k, below in entries:
                lse = outs[k][j0 + idx]
                x = (again - lse).exp_().mul_(gamma * torch.where(below[idx], grads[k][j0 + idx], 0.0))
                d.index_add_(1, idx, torch.where(lse == NEG_INF, 0.0, x))
    return d


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
