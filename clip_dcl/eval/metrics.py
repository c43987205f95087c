"""Metric functions over tensors: retrieval ranks, classification scores, ELEVATER's four metrics. Written here
because OpenCLIP's ``get_clip_metrics`` materialises the N x N logits (1:1 pairs only) and scikit-learn scores one
class and one call at a time; each is tested against scikit-learn or a slow re-computation.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

#: The four ELEVATER metrics (``TEST.METRIC`` acc / mpc / mAP11 / auc in the toolkit's yaml files).
ELEVATER_METRICS = ("accuracy", "mean_per_class", "11point_mAP", "roc_auc")


def _check_features(name: str, x: torch.Tensor) -> None:
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D (N, D), got shape {tuple(x.shape)}")
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} holds NaN or inf values")


#: Elements compared per block when counting: the boolean block and the int64 copy that ``sum``
#: makes of it stay around 9 MB, whatever the chunk size.
_COUNT_BLOCK = 1 << 20


def _count_at_least(scores: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """Per row i, ``#{j : scores[i, j] >= thresholds[i]}``, `_COUNT_BLOCK` elements at a time."""
    rows, cols = scores.shape
    step = max(1, _COUNT_BLOCK // max(cols, 1))
    out = torch.empty(rows, dtype=torch.long, device=scores.device)
    for r in range(0, rows, step):
        out[r : r + step] = (scores[r : r + step] >= thresholds[r : r + step, None]).sum(1)
    return out


def retrieval_ranks(
    image_features: torch.Tensor,
    text_features: torch.Tensor,
    text_to_image: torch.Tensor | None = None,
    chunk_size: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor]:
    """0-based rank of the best-ranked true match, per image query and per text query.

    Scores are ``<f_i, g_t>``; text ``t`` describes image ``text_to_image[t]`` (default 1:1). Image ->
    text: ``#{t not of i : s(i, t) >= max_{t' of i} s(i, t')}``; text -> image:
    ``#{j != img(t) : s(j, t) >= s(img(t), t)}``. "In the top k" is ``rank < k``, and a tie counts
    against the query (a collapsed model scores 0). Built ``chunk_size`` rows at a time: about
    ``4 chunk_size N + 4 N D`` extra bytes, not ``4 N^2`` (``benchmarks/results/retrieval_speed.md``).
    """
    _check_features("image_features", image_features)
    _check_features("text_features", text_features)
    n_img, n_txt = image_features.shape[0], text_features.shape[0]
    if image_features.shape[1] != text_features.shape[1]:
        raise ValueError(f"feature sizes differ: images {image_features.shape[1]}, texts {text_features.shape[1]}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    device = image_features.device
    if text_to_image is None:
        if n_img != n_txt:
            raise ValueError(f"1:1 pairs need as many texts as images, got {n_txt} texts for {n_img} images")
        text_to_image = torch.arange(n_img, device=device)
    text_to_image = torch.as_tensor(text_to_image, dtype=torch.long, device=device)
    if text_to_image.shape != (n_txt,):
        raise ValueError(f"text_to_image must have shape ({n_txt},), got {tuple(text_to_image.shape)}")
    if n_txt and (text_to_image.min() < 0 or text_to_image.max() >= n_img):
        raise ValueError(f"text_to_image holds indices outside [0, {n_img})")
    counts = torch.bincount(text_to_image, minlength=n_img)
    if (counts == 0).any():
        missing = torch.nonzero(counts == 0).flatten()[:5].tolist()
        raise ValueError(f"images without any text, e.g. indices {missing}")

    # Texts grouped by image, so that the positives of an image chunk are one contiguous run.
    order = torch.argsort(text_to_image, stable=True)
    starts = torch.cumsum(counts, 0) - counts

    i2t = torch.empty(n_img, dtype=torch.long, device=device)
    for s in range(0, n_img, chunk_size):
        e = min(s + chunk_size, n_img)
        scores = image_features[s:e] @ text_features.T  # (c, T)
        lo, hi = int(starts[s]), int(starts[e - 1] + counts[e - 1])
        pos_t = order[lo:hi]  # texts of images s..e-1
        pos_row = text_to_image[pos_t] - s
        pos_score = scores[pos_row, pos_t]
        best = torch.full((e - s,), -math.inf, dtype=scores.dtype, device=device)
        best.scatter_reduce_(0, pos_row, pos_score, reduce="amax")
        # Positives tied with the best one are not "false items ranked above".
        n_pos_at_best = torch.zeros(e - s, dtype=torch.long, device=device)
        n_pos_at_best.scatter_add_(0, pos_row, (pos_score >= best[pos_row]).long())
        i2t[s:e] = _count_at_least(scores, best) - n_pos_at_best
        del scores

    t2i = torch.empty(n_txt, dtype=torch.long, device=device)
    for s in range(0, n_txt, chunk_size):
        e = min(s + chunk_size, n_txt)
        scores = text_features[s:e] @ image_features.T  # (c, I)
        true = scores.gather(1, text_to_image[s:e, None])[:, 0]
        t2i[s:e] = _count_at_least(scores, true) - 1
        del scores
    return i2t, t2i


def rank_metrics(ranks: torch.Tensor, prefix: str, ks: Sequence[int] = (1, 5, 10)) -> dict[str, float]:
    """``{prefix}_R@k`` = P(rank < k), ``{prefix}_mean_rank`` = mean + 1, ``{prefix}_median_rank``
    = floor(median) + 1 (numpy's median, as OpenCLIP's ``get_clip_metrics``), from 0-based ranks."""
    r = ranks.detach().cpu().numpy()
    out = {f"{prefix}_mean_rank": float(r.mean() + 1), f"{prefix}_median_rank": float(np.floor(np.median(r)) + 1)}
    for k in ks:
        out[f"{prefix}_R@{k}"] = float(np.mean(r < k))
    return out


def retrieval_metrics(
    image_features: torch.Tensor,
    text_features: torch.Tensor,
    text_to_image: torch.Tensor | None = None,
    ks: Sequence[int] = (1, 5, 10),
    chunk_size: int = 1024,
) -> dict[str, float]:
    """Image->text and text->image recall@k, mean and median rank, under OpenCLIP's names
    (``image_to_text_R@k``, ...) and CLIP_benchmark's (``text_retrieval_recall@k`` = image_to_text_R@k,
    ``image_retrieval_recall@k`` = text_to_image_R@k).
    """
    i2t, t2i = retrieval_ranks(image_features, text_features, text_to_image, chunk_size)
    out = {**rank_metrics(i2t, "image_to_text", ks), **rank_metrics(t2i, "text_to_image", ks)}
    for k in ks:
        out[f"text_retrieval_recall@{k}"] = out[f"image_to_text_R@{k}"]
        out[f"image_retrieval_recall@{k}"] = out[f"text_to_image_R@{k}"]
    return out


def topk_accuracy(logits: torch.Tensor, labels: torch.Tensor, k: int = 1) -> float:
    """Fraction of rows whose label is among the k highest logits; NaN when k > #classes."""
    if k > logits.shape[-1]:
        return float("nan")
    top = logits.topk(k, dim=-1).indices
    return float((top == labels[:, None]).any(-1).double().mean())


def mean_per_class_recall(preds: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean over the classes present of ``P(pred = c | label = c)`` (scikit-learn's balanced accuracy), of class
    ids or logits."""
    if preds.ndim == 2:
        preds = preds.argmax(-1)
    preds, labels = preds.cpu(), labels.cpu()
    classes, inverse = torch.unique(labels, return_inverse=True)
    correct = (preds == labels).double()
    hits = torch.zeros(len(classes), dtype=torch.double).scatter_add_(0, inverse, correct)
    totals = torch.bincount(inverse, minlength=len(classes)).double()
    return float((hits / totals).mean())


def classification_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """``top1``, ``top5`` (NaN with fewer than 5 classes) and ``mean_per_class_recall``."""
    return {
        "top1": topk_accuracy(logits, labels, 1),
        "top5": topk_accuracy(logits, labels, 5),
        "mean_per_class_recall": mean_per_class_recall(logits.argmax(-1), labels),
    }


#: A score within this many standard errors of its chance level is "near chance": a content-blind model lands
#: there about 19 times in 20 (the normal approximation of the binomial count of hits over the queries).
NOISE_SE = 2.0


def any_hit_chance(num_candidates: int, num_true: int, k: int) -> float:
    """P(at least one of ``num_true`` relevant items in a uniformly random top ``k`` of ``num_candidates``):
    ``1 - C(M - m, k) / C(M, k)``; ``k / M`` for one relevant item."""
    k = min(k, num_candidates)
    miss = 1.0
    for i in range(k):
        miss *= max(0, num_candidates - num_true - i) / (num_candidates - i)
    return 1.0 - miss


def _level(per_query: torch.Tensor) -> tuple[float, float, int]:
    """``(chance, standard error, queries)`` of a mean of independent hits with these chances."""
    p = per_query.double()
    n = len(p)
    return float(p.mean()), float((p * (1 - p)).sum().sqrt() / n), n


def retrieval_chance(text_to_image: torch.Tensor, num_images: int, ks: Sequence[int] = (1, 5, 10)) -> dict:
    """``{metric: (chance, standard error, queries)}`` of every R@k key of `retrieval_metrics` for a ranking that
    ignores the content: an image query hits when any of its ``m_i`` texts is in a random top k of the ``T``
    texts (`any_hit_chance`), a text query when its image is in a random top k of the ``N`` images (``k / N``)."""
    text_to_image = torch.as_tensor(text_to_image).long().cpu()
    counts = torch.bincount(text_to_image, minlength=num_images)
    num_texts = len(text_to_image)
    sizes, inverse = torch.unique(counts, return_inverse=True)
    out = {}
    for k in ks:
        by_size = torch.tensor([any_hit_chance(num_texts, int(m), k) for m in sizes], dtype=torch.double)
        i2t = _level(by_size[inverse])
        t2i = _level(torch.full((num_texts,), min(1.0, k / num_images), dtype=torch.double))
        for key, level in (
            (f"image_to_text_R@{k}", i2t),
            (f"text_retrieval_recall@{k}", i2t),
            (f"text_to_image_R@{k}", t2i),
            (f"image_retrieval_recall@{k}", t2i),
        ):
            out[key] = level
    return out


def classification_chance(num_classes: int, num_images: int) -> dict:
    """``{metric: (chance, standard error, queries)}`` of `classification_metrics`' keys (and ``acc1``/``acc5``)
    for a classifier that ignores the image: top-k ``k / C``, mean per-class recall ``1 / C`` (its standard error
    is exact for balanced classes, an approximation otherwise)."""
    out = {}
    for k, keys in ((1, ("top1", "acc1", "mean_per_class_recall")), (5, ("top5", "acc5"))):
        level = _level(torch.full((num_images,), min(1.0, k / num_classes), dtype=torch.double))
        out.update({key: level for key in keys})
    return out


def against_chance(metrics: dict, levels: dict) -> dict:
    """For each metric with a chance level: ``{"chance", "noise", "queries", "mark"}``. ``noise`` is `NOISE_SE`
    standard errors; ``mark`` is ``"meaningless"`` where chance is 1 (R@k with k at or above the candidates,
    top-k with k at or above the classes: every model scores 1), ``"near chance"`` where the score is within
    ``noise`` of chance, else None."""
    out = {}
    for key, (level, se, queries) in levels.items():
        if key not in metrics:
            continue
        value = metrics[key]
        noise = NOISE_SE * se
        if level >= 1.0 - 1e-12:
            mark = "meaningless"
        elif math.isfinite(value) and abs(value - level) <= noise:
            mark = "near chance"
        else:
            mark = None
        out[key] = {"chance": level, "noise": noise, "queries": queries, "mark": mark}
    return out


def mean_average_precision(scores: torch.Tensor, targets: torch.Tensor) -> float:
    """Mean over classes of the average precision against multi-hot ``targets``, as CLIP_benchmark reports it (a
    class without a positive counts 0); raw scores, not torchmetrics' sigmoid, which saturates CLIP's 100x logits
    into ties."""
    from sklearn.metrics import average_precision_score

    if scores.ndim != 2 or targets.shape != scores.shape:
        raise ValueError(
            f"scores and multi-hot targets must both be (N, C), got {tuple(scores.shape)} and {tuple(targets.shape)}"
        )
    s = scores.detach().double().cpu().numpy()
    t = (targets.detach().cpu().numpy() > 0).astype(int)
    ap = [average_precision_score(t[:, c], s[:, c]) if t[:, c].any() else 0.0 for c in range(s.shape[1])]
    return float(np.mean(ap))


# ELEVATER metrics, batched over a leading dimension (heads)
def targets_to_matrix(targets: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(N,) class ids -> (N, C) one-hot; (N, C) multi-hot returned as is (as a float tensor)."""
    if targets.ndim == 1:
        return torch.nn.functional.one_hot(targets.long(), num_classes).double()
    return targets.double()


def average_precision_11point(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """11-point interpolated average precision per class, batched: (B, N, C) -> (B, C).

    ``AP = (1/11) sum_{t in 0, 0.1, ..., 1} max{p_j : r_j >= t}`` over scikit-learn's
    ``precision_recall_curve`` points, as vision-evaluation's ``MeanAveragePrecisionNPointsEvaluator``
    computes it, bit for bit (float64 recalls, numpy's thresholds). Classes without a positive: NaN.
    """
    if scores.ndim == 2:
        return average_precision_11point(scores[None], targets)[0]
    b, n, c = scores.shape
    tmat = targets_to_matrix(targets, c).to(scores.device)  # (N, C)
    s = scores.double().permute(0, 2, 1)  # (B, C, N)
    s_sorted, idx = torch.sort(s, dim=-1, descending=True, stable=True)
    t_sorted = tmat.T[None].expand(b, c, n).gather(-1, idx)
    tps = torch.cumsum(t_sorted, -1)
    fps = torch.cumsum(1.0 - t_sorted, -1)
    n_pos = tps[..., -1:]
    precision = tps / (tps + fps)
    recall = tps / n_pos
    # Only the last position of each run of tied scores is a point of the curve.
    last_of_tie = torch.ones_like(s_sorted, dtype=torch.bool)
    last_of_tie[..., :-1] = s_sorted[..., :-1] != s_sorted[..., 1:]
    precision = torch.where(last_of_tie, precision, torch.zeros_like(precision))
    thresholds = torch.as_tensor(np.linspace(1, 0, 11), dtype=torch.double, device=scores.device)
    interp = []
    for t in thresholds:
        p = torch.where(recall >= t, precision, torch.zeros_like(precision)).amax(-1)
        if t <= 0:  # the curve's end point (recall 0, precision 1)
            p = torch.ones_like(p)
        interp.append(p)
    ap = torch.stack(interp, -1).mean(-1)  # (B, C)
    return torch.where(n_pos[..., 0] > 0, ap, torch.full_like(ap, float("nan")))


def binary_roc_auc(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Area under the ROC curve, batched: scores (B, N), targets (N,) in {0, 1} -> (B,).

    Mann-Whitney form ``AUC = (R_+ - P(P+1)/2) / (P Q)``, ``R_+`` the tie-averaged ranks' sum of the P
    positives: scikit-learn's ``roc_auc_score``, ties included. NaN with one class only.
    """
    if scores.ndim == 1:
        return binary_roc_auc(scores[None], targets)[0]
    b, n = scores.shape
    y = targets.to(scores.device).double()
    p = float(y.sum())
    q = n - p
    if p == 0 or q == 0:
        return torch.full((b,), float("nan"), dtype=torch.double, device=scores.device)
    s, idx = torch.sort(scores.double(), dim=-1, stable=True)
    pos = torch.arange(n, device=scores.device).expand(b, n)
    new_run = torch.ones_like(s, dtype=torch.bool)
    new_run[:, 1:] = s[:, 1:] != s[:, :-1]
    end_run = torch.ones_like(s, dtype=torch.bool)
    end_run[:, :-1] = s[:, :-1] != s[:, 1:]
    first = torch.cummax(torch.where(new_run, pos, torch.zeros_like(pos)), -1).values
    last = torch.flip(
        torch.cummin(torch.flip(torch.where(end_run, pos, torch.full_like(pos, n)), [-1]), -1).values, [-1]
    )
    avg_rank = (first + last).double() / 2 + 1
    r_pos = (avg_rank * y[idx]).sum(-1)
    return (r_pos - p * (p + 1) / 2) / (p * q)


def numpy_argmax(scores: torch.Tensor) -> torch.Tensor:
    """``numpy.argmax`` over the last dimension: a row's first NaN if it holds one, else its first maximum."""
    nan = torch.isnan(scores)
    first_max = torch.nan_to_num(scores, nan=float("-inf")).argmax(-1)
    first_nan = nan.to(torch.uint8).argmax(-1)
    return torch.where(nan.any(-1), first_nan, first_max)


def elevater_scores(metric: str, logits: torch.Tensor, targets: torch.Tensor, nan_rule: str = "zero") -> torch.Tensor:
    """An ELEVATER metric of ``softmax(logits)`` for a batch of heads, (B, N, C) -> (B,), classes without a positive
    dropped; a non-finite head scores 0 (``nan_rule="zero"``) or as vision-evaluation 0.2.9 does (``"toolkit"``)."""
    if nan_rule not in ("zero", "toolkit"):
        raise ValueError(f"nan_rule must be 'zero' or 'toolkit', got {nan_rule!r}")
    if metric not in ELEVATER_METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of {ELEVATER_METRICS}")
    squeeze = logits.ndim == 2
    if squeeze:
        logits = logits[None]
    b, n, c = logits.shape
    raw = torch.softmax(logits.double(), -1)
    finite = torch.isfinite(raw).all(-1).all(-1)  # (B,)
    probs = torch.nan_to_num(raw, nan=0.0, posinf=0.0, neginf=0.0)
    argmax_rule = nan_rule == "toolkit" and metric in ("accuracy", "mean_per_class")
    tmat = targets_to_matrix(targets, c).to(logits.device)
    present = tmat.sum(0) > 0
    if metric == "accuracy":
        if targets.ndim != 1:
            raise ValueError("accuracy needs single-label targets (N,)")
        pred = numpy_argmax(raw) if argmax_rule else probs.argmax(-1)
        out = (pred == targets.to(logits.device)[None]).double().mean(-1)
    elif metric == "mean_per_class":
        sub_t = tmat[:, present].argmax(-1)  # (N,) ids among the present classes
        sub_p = numpy_argmax(raw[:, :, present]) if argmax_rule else probs[:, :, present].argmax(-1)  # (B, N)
        k = int(present.sum())
        hit = (sub_p == sub_t[None]).double()
        per_class = torch.zeros(b, k, dtype=torch.double, device=logits.device).index_add_(1, sub_t, hit)
        out = (per_class / torch.bincount(sub_t, minlength=k).double()[None]).mean(-1)
    elif metric == "11point_mAP":
        out = average_precision_11point(probs[:, :, present], tmat[:, present]).mean(-1)
    else:
        if c != 2 or targets.ndim != 1:
            raise ValueError(f"roc_auc is for binary single-label data, got {c} classes")
        out = binary_roc_auc(probs[:, :, 1], targets)
    ok = torch.isfinite(out) if argmax_rule else finite & torch.isfinite(out)
    out = torch.where(ok, out, torch.zeros_like(out))
    return out[0] if squeeze else out
