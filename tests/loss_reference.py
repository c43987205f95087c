"""Slow, obviously-correct float64 re-computations of the losses (clip_dcl/losses docstrings).

Plain loops over anchors with ``exp`` and sums exactly as the equations read: no log-space
tricks, no masking, no gathering. Used by the unit tests and the distributed harness.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _directions(f, g, s):
    """Yield the logits matrix of each direction: image anchors vs texts, text anchors vs images."""
    return [s * f @ g.T, s * g @ f.T]


def infonce(f, g, s):
    total = 0.0
    for logits in _directions(f, g, s):
        n = logits.shape[0]
        rows = []
        for i in range(n):
            rows.append(-torch.log(torch.exp(logits[i, i]) / torch.exp(logits[i]).sum()))
        total = total + torch.stack(rows).mean()
    return total / 2


def dcl(f, g, s, tau_plus, clamp="clamp"):
    total, clamped = 0.0, []
    for logits in _directions(f, g, s):
        n = logits.shape[0]
        big_n = n - 1
        rows = []
        for i in range(n):
            pos = torch.exp(logits[i, i])
            neg = sum(torch.exp(logits[i, j]) for j in range(n) if j != i)
            estimate = (neg - big_n * tau_plus * pos) / (1 - tau_plus)
            floor = big_n * torch.exp(-s)
            is_clamped = bool(estimate < floor)
            clamped.append(is_clamped)
            if not is_clamped:
                ng = estimate
            elif clamp == "clamp":
                ng = floor
            else:  # "biased": this row falls back to InfoNCE
                ng = neg
            rows.append(-torch.log(pos / (pos + ng)))
        total = total + torch.stack(rows).mean()
    return total / 2, sum(clamped) / len(clamped)


def decl(f, g, s, rates, eps, lam, relative=False):
    """DeCL with given rates ``r`` (2, n) and draws ``eps`` (2, n): u_i = eps_i / r_i.

    ``relative``: loss1_i = u_i g_i with FastCLIP's g_i = mean_k exp(l_ik - l_ii) (no separate positive).
    """
    loss1, loss2 = 0.0, 0.0
    for d, logits in enumerate(_directions(f, g, s)):
        n = logits.shape[0]
        l1, l2 = [], []
        for i in range(n):
            negs = [torch.exp(logits[i, k]) for k in range(n) if k != i]
            mean_neg = sum(negs) / len(negs)
            u = eps[d][i] / rates[d][i]
            if relative:
                l1.append(u * sum(torch.exp(logits[i, k] - logits[i, i]) for k in range(n) if k != i) / (n - 1))
            else:
                l1.append(u * mean_neg - logits[i, i])
            l2.append(-torch.log(torch.exp(logits[i, i]) / torch.exp(logits[i]).sum()))
        loss1 = loss1 + torch.stack(l1).mean()
        loss2 = loss2 + torch.stack(l2).mean()
    loss1, loss2 = loss1 / 2, loss2 / 2
    return lam * loss1 + (1 - lam) * loss2, loss1, loss2


def _general_directions(f, g):
    """``(anchors, candidates, positive columns of each anchor)`` of both directions with ``M = len(g) / len(f)``."""
    n_img = f.shape[0]
    m = g.shape[0] // n_img
    return [
        (f, g, [list(range(i * m, i * m + m)) for i in range(n_img)]),
        (g, f, [[c // m] for c in range(g.shape[0])]),
    ]


def decl_general(f, g, s, rates, eps, lam, relative=False):
    """DeCL with ``M = len(g) / len(f)`` captions per image, given each anchor row's rate and draw.

    ``rates`` and ``eps``: ``[image rows (n,), caption rows (n M,)]``. Image anchor i: negatives
    the captions of the other images, ``loss1 = u_i mean_k S_ik - mean_m l_im``, ``loss2 =
    mean_m -log(S_im / (S_im + sum_k S_ik))``; caption c: positive image c // M, negatives the other
    images. Returns ``(loss, loss1, loss2)``.
    """
    loss1, loss2 = 0.0, 0.0
    for d, (anchors, cands, positives) in enumerate(_general_directions(f, g)):
        l1, l2 = [], []
        for i, pos_cols in enumerate(positives):
            logit = [s * anchors[i] @ cands[j] for j in range(cands.shape[0])]
            negs = [torch.exp(logit[k]) for k in range(cands.shape[0]) if k not in pos_cols]
            u = eps[d][i] / rates[d][i]
            pbar = sum(logit[v] for v in pos_cols) / len(pos_cols)
            if relative:  # g_i = mean_k exp(l_ik - mean_m l_im)
                l1.append(
                    u * sum(torch.exp(logit[k] - pbar) for k in range(cands.shape[0]) if k not in pos_cols) / len(negs)
                )
            else:
                l1.append(u * sum(negs) / len(negs) - pbar)
            l2.append(
                sum(-torch.log(torch.exp(logit[v]) / (torch.exp(logit[v]) + sum(negs))) for v in pos_cols)
                / len(pos_cols)
            )
        loss1 = loss1 + torch.stack(l1).mean()
        loss2 = loss2 + torch.stack(l2).mean()
    loss1, loss2 = loss1 / 2, loss2 / 2
    return lam * loss1 + (1 - lam) * loss2, loss1, loss2


def row_mean_negative_scores(f, g, s, relative=False):
    """``E_k[S_ik]`` of every anchor row over its negatives: ``[image rows (n,), caption rows (n M,)]``;
    ``relative``: ``E_k[exp(l_ik - mean_m l_im)]``."""
    out = []
    for anchors, cands, positives in _general_directions(f, g):
        rows = []
        for i, pos_cols in enumerate(positives):
            pbar = sum(s * anchors[i] @ cands[v] for v in pos_cols) / len(pos_cols) if relative else 0.0
            rows.append(
                sum(torch.exp(s * anchors[i] @ cands[k] - pbar) for k in range(cands.shape[0]) if k not in pos_cols)
                / (cands.shape[0] - len(pos_cols))
            )
        out.append(torch.stack(rows).detach())
    return out


def id_mean_negative_scores(f, g, s):
    """``(2, n)`` per sample id: the image's ``E_k[S_ik]``, and the mean of its M captions' (the text-direction
    rate)."""
    img, txt = row_mean_negative_scores(f, g, s)
    m = txt.shape[0] // img.shape[0]
    return torch.stack([img, torch.stack([sum(txt[i * m + k] for k in range(m)) / m for i in range(img.shape[0])])])


def batch_mean_negative_score(f, g, s, relative=False):
    """``E_k[S_ik]`` over the batch negatives, shape (2, n) (image anchors, text anchors); ``relative``:
    ``g_i = E_k[exp(l_ik - l_ii)]``."""
    out = []
    for logits in _directions(f, g, s):
        n = logits.shape[0]
        out.append(
            torch.stack(
                [
                    sum(torch.exp(logits[i, k] - (logits[i, i] if relative else 0.0)) for k in range(n) if k != i)
                    / (n - 1)
                    for i in range(n)
                ]
            )
        )
    return torch.stack(out).detach()


def rgclg_scale_gradient(f, g, s, log_rates, rho):
    """d/ds of FastCLIP v3's RGCL-g temperature objective with the features fixed, estimated with the
    rates: tau = 1/s, F = tau (mean_i log g_i + rho) per direction (averaged), log g_i replaced by the
    rate's log and g_i' / g_i by g_i' / r_i. Written out: dF/ds = -(mean log r + rho) / s^2 +
    (1/s) mean_i g_i'(s) / r_i, with g_i'(s) = mean_k (c_ik - c_ii) exp(s (c_ik - c_ii))."""
    total = 0.0
    for d, (a, b) in enumerate(((f, g), (g, f))):
        n = a.shape[0]
        c = a @ b.T
        terms = []
        for i in range(n):
            diffs = [c[i, k] - c[i, i] for k in range(n) if k != i]
            g_prime = sum(x * torch.exp(s * x) for x in diffs) / len(diffs)
            terms.append(g_prime / torch.exp(log_rates[d][i]))
        mean_log_r = sum(log_rates[d]) / n
        total = total + (-(mean_log_r + rho) / s**2 + torch.stack(terms).mean() / s)
    return total / 2


class IndexRates:
    """Dictionary re-computation of the per-sample moving-average rate buffer.

    ``visit`` returns the rates a step's loss1 uses: by default those stored by earlier visits (read,
    then update), a first visit reading its own batch estimate (``first_visit="batch"``) or the mean of
    the previous step's log batch estimates (``"mean"``); with ``include_current`` the buffer is updated
    first and read after. With ``drift`` the stored rates are relative to the storing step's mean log
    estimate ``m_t`` (``r / exp(m_t)``) and read at the previous step's level.
    """

    def __init__(self, gamma, first_visit="batch", include_current=False, drift=True):
        self.gamma = gamma
        self.first_visit = first_visit
        self.include_current = include_current
        self.drift = drift
        self.rate = [{}, {}]
        self.prev_mean_log = None  # per direction, from the previous visit() call

    def _first_estimate_log_mean(self, ids, batch_rates):
        out = []
        for d in range(2):
            firsts = {}
            for pos, sid in enumerate(ids.tolist()):
                firsts.setdefault(sid, pos)
            out.append(sum(math.log(float(batch_rates[d][p])) for p in firsts.values()) / len(firsts))
        return out

    def visit(self, ids, batch_rates, gamma=None):
        gamma = self.gamma if gamma is None else gamma
        m_t = self._first_estimate_log_mean(ids, batch_rates)

        def update():
            for d in range(2):
                seen = set()
                for pos, sid in enumerate(ids.tolist()):
                    if sid in seen:  # a repeated id in one batch keeps its first estimate
                        continue
                    seen.add(sid)
                    r = float(batch_rates[d][pos]) / (math.exp(m_t[d]) if self.drift else 1.0)
                    old = self.rate[d].get(sid)
                    self.rate[d][sid] = r if old is None else (1 - gamma) * old + gamma * r

        if self.include_current:
            update()
        level = m_t if self.include_current else self.prev_mean_log
        used = []
        for d in range(2):
            row = []
            for pos, sid in enumerate(ids.tolist()):
                if sid in self.rate[d]:
                    row.append(self.rate[d][sid] * (math.exp(level[d]) if self.drift else 1.0))
                elif self.first_visit == "mean" and self.prev_mean_log is not None:
                    row.append(math.exp(self.prev_mean_log[d]))
                else:
                    row.append(float(batch_rates[d][pos]))
            used.append(row)
        if not self.include_current:
            update()
        self.prev_mean_log = m_t
        return torch.tensor(used, dtype=torch.float64)

    def log_rate(self, d, sid):
        """The stored value: relative to its step's mean estimate with ``drift``."""
        return math.log(self.rate[d][sid])


def dcl_general(f, g, s, tau_plus, clamp="clamp", beta=0.0):
    """DCL with ``M = len(g) / len(f)`` captions per image (Eq. 6-7) and hard-negative weights (HCL).

    Image anchor i: positives the captions i*M .. i*M+M-1, negatives the captions of the other
    images; each positive is the numerator in turn. Caption anchor c: positive image c // M,
    negatives the other images. ``neg = N * sum_j w_j S_j / sum_j w_j`` with ``w_j = exp(beta l_j)``.
    Returns ``(loss, clamp rate)``.
    """
    n_img = f.shape[0]
    m = g.shape[0] // n_img
    img_logits, txt_logits = s * f @ g.T, s * g @ f.T
    directions = [
        (img_logits, [list(range(i * m, i * m + m)) for i in range(n_img)]),
        (txt_logits, [[c // m] for c in range(g.shape[0])]),
    ]
    total, clamped = 0.0, []
    for logits, positives in directions:
        rows = []
        for i, pos_cols in enumerate(positives):
            negs = [j for j in range(logits.shape[1]) if j not in pos_cols]
            big_n = len(negs)
            scores = [torch.exp(logits[i, j]) for j in negs]
            weights = [torch.exp(beta * logits[i, j]) for j in negs]
            neg = big_n * sum(w * x for w, x in zip(weights, scores)) / sum(weights)
            pbar = sum(torch.exp(logits[i, v]) for v in pos_cols) / len(pos_cols)
            estimate = (neg - big_n * tau_plus * pbar) / (1 - tau_plus)
            floor = big_n * torch.exp(-s)
            is_clamped = bool(estimate < floor)
            clamped.append(is_clamped)
            ng = estimate if not is_clamped else (floor if clamp == "clamp" else neg)
            for v in pos_cols:
                pos = torch.exp(logits[i, v])
                rows.append(-torch.log(pos / (pos + ng)))
        total = total + torch.stack(rows).mean()
    return total / 2, sum(clamped) / len(clamped)


def curl(f, g, s, link="logistic"):
    """Arora et al.'s block loss: image i against the mean caption of each image; caption c against images."""
    n_img = f.shape[0]
    m = g.shape[0] // n_img
    blocks = torch.stack([sum(g[i * m + k] for k in range(m)) / m for i in range(n_img)])

    def one(logits_row, p):
        v = [logits_row[p] - logits_row[k] for k in range(len(logits_row)) if k != p]  # v_k = s f.(p_i - p_k)
        if link == "logistic":
            return torch.log(1 + sum(torch.exp(-x) for x in v))
        return torch.clamp(1 - min(v), min=0.0)

    img_rows = [one(s * f[i] @ blocks.T, i) for i in range(n_img)]
    txt_rows = [one(s * g[c] @ f.T, c // m) for c in range(g.shape[0])]
    return (torch.stack(img_rows).mean() + torch.stack(txt_rows).mean()) / 2


def dcl_top(f, g, s, tau_plus, clamp="clamp", beta=0.0):
    """DCL whose same-class mass is that of each anchor's ``k = tau_plus N`` highest-scoring negatives
    (``same_class="top"``), with ``M = len(g) / len(f)`` captions per image and hard-negative weights.

    Each row's negatives are sorted by score, highest first, with Python's ``sorted``; negative ``r``
    (0-based) of the sorted row is set aside with the share ``a_r = min(1, max(0, k - r))`` (the first
    floor(k) whole, the next one by frac(k)) and kept with ``1 - a_r``. With ``w_j = exp(beta l_j)``:
    ``Ng = N * sum_r (1 - a_r) w_r S_r / sum_r (1 - a_r) w_r``, floored at ``N exp(-s)`` (or the
    reweighted negatives' whole mass for ``clamp="biased"``). Returns ``(loss, clamp rate)``.
    """
    n_img = f.shape[0]
    m = g.shape[0] // n_img
    img_logits, txt_logits = s * f @ g.T, s * g @ f.T
    directions = [
        (img_logits, [list(range(i * m, i * m + m)) for i in range(n_img)]),
        (txt_logits, [[c // m] for c in range(g.shape[0])]),
    ]
    total, clamped = 0.0, []
    for logits, positives in directions:
        rows = []
        for i, pos_cols in enumerate(positives):
            negs = [logits[i, j] for j in range(logits.shape[1]) if j not in pos_cols]
            big_n = len(negs)
            k = tau_plus * big_n
            ranked = sorted(negs, key=lambda x: x.detach().item(), reverse=True)
            kept = [1.0 - min(1.0, max(0.0, k - r)) for r in range(big_n)]
            scores = [torch.exp(x) for x in ranked]
            weights = [torch.exp(beta * x) for x in ranked]
            estimate = (
                big_n
                * sum(c * w * x for c, w, x in zip(kept, weights, scores))
                / sum(c * w for c, w in zip(kept, weights))
            )
            neg = big_n * sum(w * x for w, x in zip(weights, scores)) / sum(weights)
            floor = big_n * torch.exp(-s)
            is_clamped = bool(estimate < floor)
            clamped.append(is_clamped)
            ng = estimate if not is_clamped else (floor if clamp == "clamp" else neg)
            for v in pos_cols:
                pos = torch.exp(logits[i, v])
                rows.append(-torch.log(pos / (pos + ng)))
        total = total + torch.stack(rows).mean()
    return total / 2, sum(clamped) / len(clamped)


def features(n, m=1, d=16, seed=0, dtype=torch.float64, align=0.0):
    """``n`` images and ``n * m`` captions (the ``m`` captions of image i at rows i*m .. i*m+m-1), unit rows."""
    gen = torch.Generator().manual_seed(seed)
    f = torch.randn(n, d, generator=gen, dtype=dtype)
    g = torch.randn(n * m, d, generator=gen, dtype=dtype) + align * f.repeat_interleave(m, 0)
    return F.normalize(f, dim=-1), F.normalize(g, dim=-1)
