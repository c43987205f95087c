"""ELEVATER few-shot probe: metrics, sampler, split, shuffling, batched heads, sweep bookkeeping, suite,
the toolkit's prompts, download layout, 1-shot rule and exact grid."""

from __future__ import annotations

import io
import json
import math
import random
import zipfile
from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image
from test_evalsets import COLOURS, ToyCLIP, ToyTokenizer, colour_split, png_bytes, to_tensor, write_iris, write_png

from clip_dcl.data import evalsets as es
from clip_dcl.eval import fewshot as fs
from clip_dcl.eval import kshot, probe
from clip_dcl.eval.metrics import average_precision_11point, binary_roc_auc, elevater_scores


# ----------------------------------------------------------------------------------------------
# Metrics against scikit-learn
# ----------------------------------------------------------------------------------------------
def _ap11_reference(scores, targets):
    """vision-evaluation's 11-point AP, re-computed per class on sklearn's precision_recall_curve."""
    from sklearn.metrics import precision_recall_curve

    precision, recall, _ = precision_recall_curve(targets, scores)
    total = 0.0
    for t in np.linspace(1, 0, 11):
        inside = precision[recall >= t]
        total += inside.max() if inside.size else 0.0
    return total / 11


@pytest.mark.parametrize("seed", range(6))
def test_11point_map_matches_sklearn_curve(seed):
    rng = np.random.default_rng(seed)
    n, c = int(rng.integers(5, 80)), 5
    scores = torch.from_numpy(rng.random((3, n, c)).round(1 + seed % 3))  # rounding makes ties
    targets = torch.from_numpy((rng.random((n, c)) < 0.3).astype(np.int64))
    ap = average_precision_11point(scores, targets)
    for b in range(3):
        for j in range(c):
            if targets[:, j].sum() == 0:
                assert math.isnan(ap[b, j])
            else:
                assert ap[b, j].item() == pytest.approx(
                    _ap11_reference(scores[b, :, j].numpy(), targets[:, j].numpy()), abs=1e-12
                )


def test_11point_map_hand_built():
    # Ranked: pos, neg, pos -> curve points (r, p): (0.5, 1), (0.5, 0.5), (1, 2/3), end point (0, 1).
    ap = average_precision_11point(torch.tensor([[0.9], [0.8], [0.7]]), torch.tensor([[1], [0], [1]]))
    assert ap.item() == pytest.approx((6 * 1.0 + 5 * (2 / 3)) / 11)


@pytest.mark.parametrize("seed", range(6))
def test_roc_auc_matches_sklearn_with_ties(seed):
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 200))
    y = torch.from_numpy(rng.integers(0, 2, n))
    y[0], y[1] = 0, 1
    s = torch.from_numpy(rng.random((4, n)).round(2))
    auc = binary_roc_auc(s, y)
    for b in range(4):
        assert auc[b].item() == pytest.approx(roc_auc_score(y.numpy(), s[b].numpy()), abs=1e-12)
    assert math.isnan(binary_roc_auc(s[0], torch.zeros(n, dtype=torch.long)).item())


@pytest.mark.parametrize("seed", range(4))
def test_elevater_scores_match_sklearn(seed):
    from sklearn.metrics import accuracy_score, balanced_accuracy_score, roc_auc_score

    g = torch.Generator().manual_seed(seed)
    n, c = 120, 7
    y = torch.randint(0, c - 1, (n,), generator=g)  # class 6 absent
    logits = torch.randn(3, n, c, generator=g) * 2
    probs = torch.softmax(logits.double(), -1).numpy()
    acc = elevater_scores("accuracy", logits, y)
    mpc = elevater_scores("mean_per_class", logits, y)
    for b in range(3):
        assert acc[b].item() == pytest.approx(accuracy_score(y.numpy(), probs[b].argmax(1)))
        # the toolkit drops the absent class before the argmax
        assert mpc[b].item() == pytest.approx(balanced_accuracy_score(y.numpy(), probs[b][:, : c - 1].argmax(1)))
    multi = (torch.rand(n, c, generator=g) < 0.3).long()
    multi[:, 3] = 0  # a class without positives is dropped
    m = elevater_scores("11point_mAP", logits, multi)
    keep = [j for j in range(c) if j != 3]
    for b in range(3):
        ref = np.mean([_ap11_reference(probs[b][:, j], multi[:, j].numpy()) for j in keep])
        assert m[b].item() == pytest.approx(ref, abs=1e-12)
    y2 = torch.randint(0, 2, (n,), generator=g)
    auc = elevater_scores("roc_auc", logits[:, :, :2], y2)
    p2 = torch.softmax(logits[:, :, :2].double(), -1)[:, :, 1].numpy()
    for b in range(3):
        assert auc[b].item() == pytest.approx(roc_auc_score(y2.numpy(), p2[b]), abs=1e-12)


def _toolkit_score(metric, logits, y):
    """vision-evaluation 0.2.9's way, written from its evaluators: numpy softmax probabilities,
    columns of classes without a target dropped (mean per class), ``np.argmax`` (NaN first),
    scikit-learn's balanced accuracy; top-1 accuracy from ``np.argmax`` of every column."""
    from sklearn.metrics import balanced_accuracy_score

    z = logits.double().numpy()
    with np.errstate(invalid="ignore"):
        e = np.exp(z - z.max(1, keepdims=True))
        p = e / e.sum(1, keepdims=True)
    y = y.numpy()
    if metric == "accuracy":
        return float(np.mean(np.argmax(p, 1) == y))
    present = np.flatnonzero(np.bincount(y, minlength=p.shape[1]) > 0)
    t = np.argmax(np.eye(p.shape[1])[y][:, present], 1)
    return float(balanced_accuracy_score(t, np.argmax(p[:, present], 1)))


def test_toolkit_rule_scores_nan_probabilities_by_numpy_argmax():
    # 10 test images over classes 0-3 of 5 (class 4 absent); 2 of them are class 0
    y = torch.tensor([0, 0, 1, 1, 1, 2, 2, 3, 3, 3])
    nan = torch.full((10, 5), float("nan"))
    acc = elevater_scores("accuracy", nan, y, nan_rule="toolkit").item()
    mpc = elevater_scores("mean_per_class", nan, y, nan_rule="toolkit").item()
    assert (acc, mpc) == (0.2, 0.25)  # everything predicted class 0: 2/10; recall 1 for class 0 of 4
    assert acc == _toolkit_score("accuracy", nan, y) and mpc == _toolkit_score("mean_per_class", nan, y)
    # partly diverged: rows with an infinite logit turn NaN after softmax, the others are scored as usual
    g = torch.Generator().manual_seed(3)
    mixed = torch.randn(4, 10, 5, generator=g)
    mixed[0, :3, 2] = float("inf")
    mixed[1, 5:, 0] = float("nan")
    mixed[2, ::2, 4] = float("-inf")  # -inf alone stays finite after softmax
    mixed[3] = float("nan")
    for metric in ("accuracy", "mean_per_class"):
        got = elevater_scores(metric, mixed, y, nan_rule="toolkit")
        ref = [_toolkit_score(metric, mixed[b], y) for b in range(4)]
        assert got.tolist() == pytest.approx(ref, abs=1e-12), metric
        # our default rule: a head with any non-finite probability scores 0
        assert elevater_scores(metric, mixed, y).tolist() == [0.0, 0.0, pytest.approx(ref[2]), 0.0]
    # the 11-point mAP and ROC-AUC raise on NaN in scikit-learn: the toolkit scores 0
    assert elevater_scores("roc_auc", torch.full((10, 2), float("nan")), y % 2, nan_rule="toolkit").item() == 0
    assert elevater_scores("11point_mAP", nan, torch.eye(5)[y], nan_rule="toolkit").item() == 0
    with pytest.raises(ValueError, match="nan_rule must be 'zero' or 'toolkit', got 'x'"):
        elevater_scores("accuracy", nan, y, nan_rule="x")


def test_diverged_head_scores_zero():
    logits = torch.randn(2, 10, 3)
    logits[1, 4, 0] = float("nan")
    y = logits[0].argmax(-1)
    s = elevater_scores("accuracy", logits, y)
    assert s[0].item() == 1.0 and s[1].item() == 0.0
    with pytest.raises(ValueError, match="unknown metric"):
        elevater_scores("f1", logits, y)


# ----------------------------------------------------------------------------------------------
# Sampler and split
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2, 7])
def test_single_label_sampler_is_shuffle_then_first_k(seed):
    rng = random.Random(100 + seed)
    labels = [[rng.randrange(6)] for _ in range(200)]
    labels += [[6], [6]]  # a class with fewer than k images keeps both
    got = kshot.sample_few_shot(labels, 7, 5, seed)
    order = list(range(len(labels)))
    random.Random(seed).shuffle(order)
    counts = Counter()
    ref = []
    for i in order:
        y = labels[i][0]
        if counts[y] < 5:
            counts[y] += 1
            ref.append(i)
    assert got == ref
    assert kshot.sample_few_shot(labels, 7, 5, seed) == got
    assert Counter(labels[i][0] for i in got) == Counter({**{c: 5 for c in range(6)}, 6: 2})


def test_sampler_seeds_differ_and_stop_when_full():
    labels = [[i % 3] for i in range(300)]
    a, b = kshot.sample_few_shot(labels, 3, 5, 0), kshot.sample_few_shot(labels, 3, 5, 1)
    assert a != b and len(a) == len(b) == 15
    # stops as soon as every class is full: the last kept image completes the last class
    order = list(range(300))
    random.Random(0).shuffle(order)
    assert order.index(a[-1]) == max(order.index(i) for i in a)


def _walk_order(n, seed):
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


def test_multilabel_sampler_rule_hand_built():
    # Labels as met in the walk (k = 2, k/2 = 1, 1.5k = 3).
    walk = [[0], [], [0, 1], [0], [0, 1], [], [], [2, 0], [2, 0], [1]]
    order = _walk_order(len(walk), seed=3)
    labels = [None] * len(walk)
    for pos, i in enumerate(order):
        labels[i] = walk[pos]
    got = kshot.sample_few_shot(labels, 3, 2, seed=3)
    kept_positions = [order.index(i) for i in got]
    # [0] kept; [] kept (1st negative); [0,1] kept (min 0); [0] skipped (full);
    # [0,1] kept (min 1 <= 1); [] kept (2nd negative); [] skipped (k negatives);
    # [2,0] kept (min 0) -> counts 4,2,1; [2,0] kept (min 1) -> counts 5,2,2: all full, stop.
    assert kept_positions == [0, 1, 2, 4, 5, 7, 8]


def test_multilabel_sampler_max_rule():
    # k = 4: an image whose labels have counts (3, 7) is skipped (3 > k/2, 7 > 1.5k); (3, 6) is kept.
    walk = [[1]] * 4 + [[0, 1]] * 3 + [[0, 2], [0, 2]]
    order = _walk_order(len(walk), seed=0)
    labels = [None] * len(walk)
    for pos, i in enumerate(order):
        labels[i] = walk[pos]
    got = kshot.sample_few_shot(labels, 3, 4, seed=0)
    # [1] x4 -> c1=4; [0,1] x3: min(c0)=0,1,2 <= 2 kept -> c0=3, c1=7; [0,2]: c=(3,0) min 0 kept.
    assert [order.index(i) for i in got] == [0, 1, 2, 3, 4, 5, 6, 7, 8]
    walk2 = [[1]] * 4 + [[0, 1]] * 3 + [[0, 1]]  # (3, 7): skipped
    labels2 = [None] * len(walk2)
    order2 = _walk_order(len(walk2), seed=0)
    for pos, i in enumerate(order2):
        labels2[i] = walk2[pos]
    assert [order2.index(i) for i in kshot.sample_few_shot(labels2, 2, 4, seed=0)] == list(range(7))


def test_single_label_split_first_ceil_fifth_per_class():
    labels = [[c] for c in [0, 1, 0, 2, 1, 0, 0, 0, 1, 1, 1]]
    train, val = kshot.split_train_val(labels, 3, multilabel=False)
    # class 0: 5 images -> 1 val (first, position 0); class 1: 5 -> 1 (position 1); class 2: 1 -> 1 (position 3)
    assert sorted(val) == [0, 1, 3]
    assert train == [2, 4, 5, 6, 7, 8, 9, 10]  # subset order kept
    assert len(kshot.split_train_val([[0]] * 15, 1, False)[1]) == 3
    assert len(kshot.split_train_val([[0]] * 16, 1, False)[1]) == 4
    five_shot = [[c] for c in range(4) for _ in range(5)]
    tr, va = kshot.split_train_val(five_shot, 4, False)
    assert len(va) == 4 and len(tr) == 16


def test_multilabel_split_greedy():
    labels = [[0], [0, 1], [1], [2], [0, 2]]
    train, val = kshot.split_train_val(labels, 3, multilabel=True)
    assert val == [0, 1, 3] and train == [2, 4]


# ----------------------------------------------------------------------------------------------
# Shuffling and the batched heads
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 40, 65, 130])
def test_epoch_batches_replay_the_dataloader(n):
    from torch.utils.data import DataLoader

    loader = DataLoader(range(n), batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0))
    ref = [[b for b in loader if len(b) > 1] for _ in range(4)]
    got = probe.epoch_batches(n, 4)
    assert len(got) == 4
    for e in range(4):
        assert [b.tolist() for b in got[e]] == [b.tolist() for b in ref[e]]


def _reference_head(x, y, lr, wd, epochs, w0, b0, x_eval, y_eval, metric, multilabel):
    """The toolkit's loop in miniature: BN1d(affine=False) + Linear, SGD, DataLoader(generator 0)."""
    from torch.utils.data import DataLoader, TensorDataset

    bn = torch.nn.BatchNorm1d(x.shape[1], affine=False)
    lin = torch.nn.Linear(x.shape[1], w0.shape[0])
    lin.weight.data, lin.bias.data = w0.clone(), b0.clone()
    model = torch.nn.Sequential(bn, lin)
    opt = torch.optim.SGD(lin.parameters(), lr=lr, momentum=0.9, weight_decay=wd)
    crit = torch.nn.BCEWithLogitsLoss() if multilabel else torch.nn.CrossEntropyLoss()
    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0))
    scores = []
    for _ in range(epochs):
        model.train()
        for xb, yb in loader:
            if xb.shape[0] == 1:
                continue
            opt.zero_grad()
            crit(model(xb), yb).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            scores.append(elevater_scores(metric, model(x_eval)[None], y_eval)[0].item())
    return scores, lin.weight.detach(), lin.bias.detach()


@pytest.mark.parametrize("multilabel, n", [(False, 65), (False, 130), (True, 90)])
def test_batched_heads_equal_separate_toolkit_runs(multilabel, n):
    g = torch.Generator().manual_seed(n)
    c, d = 4, 6
    x = torch.randn(n, d, generator=g) * 3 + 1
    x_eval = torch.randn(50, d, generator=g) * 3 + 1
    if multilabel:
        y, y_eval = (torch.rand(n, c, generator=g) < 0.4).float(), (torch.rand(50, c, generator=g) < 0.4).long()
        metric = "11point_mAP"
    else:
        y, y_eval = torch.randint(0, c, (n,), generator=g), torch.randint(0, c, (50,), generator=g)
        metric = "mean_per_class"
    w0, b0 = probe.default_head_init(c, d, seed=1)
    lrs, wds = [0.1, 0.01, 0.5], [1e-4, 1e-2, 0.3]
    scores, w, b = probe.train_heads(
        x, y, lrs, wds, probe.epoch_batches(n, 5), w0, b0, {"ev": (x_eval, y_eval)}, metric, multilabel
    )
    for h in range(3):
        ref_scores, ref_w, ref_b = _reference_head(x, y, lrs[h], wds[h], 5, w0, b0, x_eval, y_eval, metric, multilabel)
        torch.testing.assert_close(w[h], ref_w, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(b[h], ref_b, atol=1e-5, rtol=1e-4)
        np.testing.assert_allclose(scores["ev"][:, h].numpy(), ref_scores, atol=1e-9)


# ----------------------------------------------------------------------------------------------
# Sweep bookkeeping
# ----------------------------------------------------------------------------------------------
def _toolkit_sweep(score, grid):
    """hyperparameter_sweep_lr / hyperparameter_sweep, sequentially, as the toolkit runs them."""
    visited = []

    def run(lr, idx):
        visited.append((lr, idx))
        return score(lr, idx)

    best_score, best_lr, best_wd = 0, 0, 0
    for lr in grid.lrs:
        peak_idx, peak_score = -1, 0
        for idx in grid.coarse:
            s = run(lr, idx)
            if s > peak_score:
                peak_idx, peak_score = idx, s
        for span in grid.spans:
            left, right = max(peak_idx - span, 0), min(peak_idx + span, len(grid.wds) - 1)
            for idx in [i for i in (left, right) if i != peak_idx]:
                s = run(lr, idx)
                if s > peak_score:
                    peak_idx, peak_score = idx, s
        if best_score < peak_score:
            best_score, best_lr, best_wd = peak_score, lr, grid.wds[peak_idx]
    return best_lr, best_wd, best_score, set(visited)


def _fake_trainer(table, grid, calls):
    """Stands in for train_heads: a run's per-epoch val scores peak at table[(lr, wd index)]."""

    def fake(x, y, lrs, wds, batches, w0, b0, eval_sets, metric, multilabel=False, score_diverged=False):
        calls.append(len(lrs))
        h = len(lrs)
        out = torch.zeros(len(batches), h, dtype=torch.double)
        for k, (lr, wd) in enumerate(zip(lrs, wds)):
            s = table[(lr, grid.wds.index(wd))]
            out[:, k] = torch.linspace(0, s, len(batches), dtype=torch.double).flip(0)  # best epoch first
        return {"val": out}, None, None

    return fake


@pytest.mark.parametrize("seed", range(5))
def test_sweep_rounds_match_the_sequential_toolkit_search(monkeypatch, seed):
    # every lr x wd below the stability bound, so the search is the toolkit's, pair for pair
    grid = probe.SweepGrid(
        "t", (1e-4, 2e-4, 3e-4), tuple(float(v) for v in np.logspace(-3, 3, 13)), (0, 4, 8, 12), (2, 1), epochs=3
    )
    rng = np.random.default_rng(seed)
    table = {(lr, j): float(rng.integers(0, 6)) / 5 for lr in grid.lrs for j in range(13)}  # many ties
    calls = []
    monkeypatch.setattr(probe, "train_heads", _fake_trainer(table, grid, calls))
    x = torch.zeros(4, 2)
    res = probe.sweep_hyperparameters(
        x, torch.zeros(4), x, torch.zeros(4), grid, "accuracy", False, torch.zeros(2, 2), torch.zeros(2)
    )
    best_lr, best_wd, best_score, visited = _toolkit_sweep(lambda lr, j: table[(lr, j)], grid)
    assert (res.best_lr, res.best_wd, res.best_score) == (best_lr, best_wd, best_score)
    assert {(r["lr"], r["wd_index"]) for r in res.runs} == visited
    assert calls[0] == 12 and len(calls) == 3  # coarse round (3 lrs x 4), then one round per span


def test_sweep_never_trains_or_picks_unstable_pairs(monkeypatch):
    # lr * wd >= 2 (1 + momentum) diverges on the weight-decay term alone: not trained, NaN, not chosen
    grid = probe.SweepGrid("t", (0.1,), (1.0, 10.0, 100.0), (0, 1, 2), (), epochs=2)
    table = {(0.1, 0): 0.2, (0.1, 1): 0.5, (0.1, 2): 0.9}  # the unstable pair would win
    calls = []
    monkeypatch.setattr(probe, "train_heads", _fake_trainer(table, grid, calls))
    x = torch.zeros(4, 2)
    res = probe.sweep_hyperparameters(
        x, torch.zeros(4), x, torch.zeros(4), grid, "accuracy", False, torch.zeros(2, 2), torch.zeros(2)
    )
    assert (res.best_lr, res.best_wd, res.best_score) == (0.1, 10.0, 0.5)
    assert calls == [2]  # the pair (0.1, 100) was never trained
    unstable = [r for r in res.runs if r.get("unstable")]
    assert [(r["lr"], r["wd"]) for r in unstable] == [(0.1, 100.0)] and np.isnan(unstable[0]["val_score"])
    assert probe.stable(0.1, 37.0) and not probe.stable(0.1, 38.0)


def test_a_head_that_overflows_scores_nan_and_the_final_run_falls_back(monkeypatch):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 4, generator=g)
    y = torch.arange(20) % 2
    batches = probe.epoch_batches(20, 30, batch_size=8)
    init_w, init_b = torch.randn(2, 4, generator=g), torch.zeros(2)
    # lr * wd = 10: the weights are multiplied by about -9 a step and overflow within 30 epochs
    scores, w, _ = probe.train_heads(x, y, [1.0, 0.01], [10.0, 0.0], batches, init_w, init_b, {"t": (x, y)}, "accuracy")
    col = scores["t"][:, 0]
    assert torch.isnan(col[-1]) and torch.isfinite(col[0]) and not torch.isfinite(w[0]).all()
    assert torch.isnan(col[int(torch.isnan(col).nonzero()[0]) :]).all()  # once diverged, NaN from then on
    assert torch.isfinite(scores["t"][:, 1]).all()
    # If the stability bound let such a pair through and it won the short sweep, the 50-epoch final
    # run would diverge: the probe then takes the next-best pair and records the failure.
    monkeypatch.setattr(probe, "stable", lambda lr, wd: True)
    grid = probe.SweepGrid("t", (1.0,), (10.0, 0.0), (0, 1), (), epochs=1, final_epochs=80)  # 80 steps: overflow
    res = probe.linear_probe(x, [[int(v)] for v in y], x, y, 2, "accuracy", False, grid, init_w, init_b)
    assert (res.best_lr, res.best_wd) == (1.0, 0.0)
    assert {"lr": 1.0, "wd": 10.0, "final_run_diverged": True} in res.runs
    assert all(np.isfinite(res.test_scores))


def test_sweep_all_zero_keeps_toolkit_defaults(monkeypatch):
    grid = probe.SweepGrid("t", (0.1, 0.2), tuple(float(v) for v in np.logspace(-3, 3, 13)), (0, 6, 12), (2,), epochs=2)
    monkeypatch.setattr(
        probe, "train_heads", _fake_trainer({(lr, j): 0.0 for lr in grid.lrs for j in range(13)}, grid, [])
    )
    x = torch.zeros(4, 2)
    res = probe.sweep_hyperparameters(
        x, torch.zeros(4), x, torch.zeros(4), grid, "accuracy", False, torch.zeros(2, 2), torch.zeros(2)
    )
    assert (res.best_lr, res.best_wd, res.best_score) == (0.0, 0.0, 0.0)


def test_full_grid_is_the_toolkits(monkeypatch):
    wds = np.logspace(-6, 6, 97).tolist()
    coarse = [i for i, v in enumerate(wds) if v in set(np.logspace(-6, 6, 7))]
    assert list(probe.FULL_GRID.coarse) == coarse and list(probe.FULL_GRID.wds) == wds
    assert list(probe.FULL_GRID.lrs) == np.logspace(-6, -1, 6).tolist()
    assert probe.FULL_GRID.epochs + 40 == probe.FULL_GRID.final_epochs == 50
    rng = np.random.default_rng(0)
    table = {(lr, j): float(rng.random()) for lr in probe.FULL_GRID.lrs for j in range(97)}
    monkeypatch.setattr(probe, "train_heads", _fake_trainer(table, probe.FULL_GRID, []))
    x = torch.zeros(4, 2)
    res = probe.sweep_hyperparameters(
        x, torch.zeros(4), x, torch.zeros(4), probe.FULL_GRID, "accuracy", False, torch.zeros(2, 2), torch.zeros(2)
    )
    assert 6 * 7 < len(res.runs) <= 90


def test_mean_classifier_is_class_mean_inner_product():
    g = torch.Generator().manual_seed(0)
    x, y, xt = torch.randn(30, 5, generator=g), torch.randint(0, 4, (30,), generator=g), torch.randn(7, 5, generator=g)
    y[-1] = 3
    logits = probe.mean_classifier_logits(x, y, xt, 5)
    f = torch.nn.functional.normalize(x, dim=-1)
    ft = torch.nn.functional.normalize(xt, dim=-1)
    for c in range(5):
        mu = f[y == c].mean(0) if (y == c).any() else torch.zeros(5)
        torch.testing.assert_close(logits[:, c], 100 * ft @ mu)


# ----------------------------------------------------------------------------------------------
# The suite end to end on generated data
# ----------------------------------------------------------------------------------------------
def _suite(root):
    names = ["red", "green", "blue"]
    write_iris(root / "colours", names, colour_split(names, 8), colour_split(names, 3))
    for split, n in (("train", 6), ("test", 3)):
        for c in ("yellow", "cyan"):
            for i in range(n):
                write_png(root / "pairs" / split / c / f"{i}.png", COLOURS[c], noise=10, seed=i)
    # multilabel: images are left/right halves of two colours
    folder = root / "halves"
    folder.mkdir()
    (folder / "labels.txt").write_text("red\ngreen\nblue\n")
    rng = np.random.default_rng(0)
    lines = {"train": [], "test": []}
    with zipfile.ZipFile(folder / "all.zip", "w") as zf:
        for split, n in (("train", 18), ("test", 9)):
            for i in range(n):
                a, b = sorted(rng.choice(3, 2, replace=False)) if i % 3 else (i % 3, i % 3)
                arr = np.zeros((8, 8, 3), np.uint8)
                arr[:, :4] = COLOURS[names[a]]
                arr[:, 4:] = COLOURS[names[b]]
                buf = io.BytesIO()
                Image.fromarray(arr).save(buf, format="PNG")
                zf.writestr(f"{split}/{i}.png", buf.getvalue())
                lines[split].append(f"all.zip@{split}/{i}.png {','.join(str(v) for v in sorted({a, b}))}")
    for split in lines:
        (folder / f"{split}.txt").write_text("\n".join(lines[split]) + "\n")
    (root / "catalog.json").write_text(
        json.dumps(
            {
                "pairs": {"metric": "mean_per_class", "num_classes": 2},
                "halves": {"metric": "11point_mAP", "multilabel": True},
            }
        )
    )
    return root


def test_evaluate_fewshot_end_to_end(tmp_path):
    root = _suite(tmp_path)
    report = fs.run_fewshot(
        ToyCLIP(), to_tensor, ToyTokenizer(), root, shots=3, seeds=(0, 1), grid="reduced", progress=False
    )
    m = report.metrics
    assert [p.dataset for p in report.probes] == ["colours", "colours", "halves", "halves", "pairs", "pairs"]
    assert {p.metric for p in report.probes} == {"accuracy", "11point_mAP", "mean_per_class"}
    for p in report.probes:
        assert p.shots == 3 and p.n_test in (9, 6) and len(p.test_scores) == 50
        assert p.toolkit >= p.last
    colours = [p for p in report.probes if p.dataset == "colours"]
    assert all(p.n_train == 6 and p.n_val == 3 for p in colours)  # 3 shots: ceil(0.6) = 1 val per class
    # colours are separable: the text classifier, the class means and the probe all get them right
    assert m["colours/zeroshot"] == 1.0 and m["colours/mean_classifier"] == 1.0
    assert m["colours/linear_probe"] == 1.0 and m["pairs/linear_probe"] == 1.0
    assert 0 < m["halves/linear_probe"] <= 1
    assert m["average/zeroshot"] == pytest.approx(np.mean([m[f"{d}/zeroshot"] for d in ("colours", "halves", "pairs")]))
    assert m["colours/linear_probe"] == np.mean([m["colours/linear_probe_seed0"], m["colours/linear_probe_seed1"]])
    json.dumps(report.to_dict())  # serialisable as is
    assert report.settings["epoch_selection"] == "last" and report.settings["grid"] == "reduced"


def test_bad_file_fails_before_any_encoding(tmp_path):
    root = _suite(tmp_path)
    with open(root / "colours" / "test.txt", "a") as f:
        f.write("test/missing.png 0\n")

    class Exploding(ToyCLIP):
        def encode_image(self, x, normalize=False):
            raise AssertionError("encoded before checking the files")

    with pytest.raises(ValueError, match=r"colours test split: image .*missing.png' does not exist"):
        fs.evaluate_fewshot(Exploding(), to_tensor, ToyTokenizer(), root, progress=False)
    with pytest.raises(ValueError, match=r"data sets \['nope'\] not found"):
        fs.evaluate_fewshot(Exploding(), to_tensor, ToyTokenizer(), root, datasets=["nope"], progress=False)
    (root / "catalog.json").write_text(json.dumps({"pairs": {"metric": "f1"}}))
    with pytest.raises(ValueError, match=r"catalog.json': entry 'pairs' needs a metric"):
        fs.evaluate_fewshot(Exploding(), to_tensor, ToyTokenizer(), root, datasets=["pairs"], progress=False)


def test_catalogue_lists_the_20_elevater_sets():
    cat = fs.builtin_catalog()
    assert len(cat) == 20
    assert Counter(e["metric"] for e in cat.values()) == Counter(
        {"accuracy": 14, "mean_per_class": 4, "11point_mAP": 1, "roc_auc": 1}
    )
    assert [n for n, e in cat.items() if e["multilabel"]] == ["voc-2007-classification"]
    assert fs.load_catalog()["cifar10"]["name"] == "cifar-10"


def test_fewshot_cli_with_tiny_model(tmp_path):
    from clip_dcl.eval.cli import main

    root = _suite(tmp_path / "suite")
    out = tmp_path / "f.json"
    assert (
        main(
            [
                "fewshot",
                "--model",
                "clip-dcl-tiny",
                "--data",
                str(root),
                "--datasets",
                "colours",
                "pairs",
                "--shots",
                "2",
                "--seeds",
                "0",
                "--no-text-init",
                "--epoch-selection",
                "toolkit",
                "--grid",
                "reduced",
                "--output",
                str(out),
                "--no-progress",
                "--format",
                "clip_benchmark",
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    # CLIP_benchmark's linear_probe result, one per set, the score under the key of the set's metric
    colours = json.loads((tmp_path / "colours_none_clip-dcl-tiny_en_linear_probe.json").read_text())
    pairs = json.loads((tmp_path / "pairs_none_clip-dcl-tiny_en_linear_probe.json").read_text())
    assert colours["task"] == pairs["task"] == "linear_probe" and colours["pretrained"] == "none"
    assert colours["metrics"]["lp_acc1"] == doc["colours/linear_probe"]
    assert pairs["metrics"]["lp_mean_per_class_recall"] == doc["pairs/linear_probe"]
    assert colours["metrics"]["fewshot_k"] == 2 and colours["metrics"]["seeds"] == [0]
    assert colours["metrics"]["weight_decay"] == [d["best_wd"] for d in doc["details"] if d["dataset"] == "colours"]
    assert (
        main(
            [
                "fewshot",
                "--model",
                "clip-dcl-tiny",
                "--data",
                str(root),
                "--dataset-name",
                "x",
                "--output",
                str(out),
                "--format",
                "clip_benchmark",
            ]
        )
        == 2
    )  # one name for several sets
    assert doc["settings"]["epoch_selection"] == "toolkit" and doc["settings"]["text_init"] is False
    assert doc["settings"]["grid"] == "reduced"
    assert doc["colours/linear_probe"] == doc["colours/linear_probe_toolkit"]
    assert {d["dataset"] for d in doc["details"]} == {"colours", "pairs"}
    assert doc["data"]["datasets"]["pairs"]["metric"] == "mean_per_class"
    # sets outside the catalogue, without a templates file: the toolkit's fallback, no full stop
    assert doc["data"]["datasets"]["colours"]["templates"] == "default"
    data, _ = fs._read_dataset(root, "colours", fs.load_catalog(root))
    assert data.templates == ["a photo of a {}"]


# ----------------------------------------------------------------------------------------------
# The toolkit's grid run exactly, the 1-shot rule
# ----------------------------------------------------------------------------------------------
def test_toolkit_exact_grid_trains_unstable_pairs_and_can_pick_them(monkeypatch):
    grid = probe.SweepGrid("t", (0.1,), (1.0, 10.0, 100.0), (0, 1, 2), (), epochs=2, exact=True)
    table = {(0.1, 0): 0.2, (0.1, 1): 0.5, (0.1, 2): 0.9}  # the unstable pair wins, as it may in the toolkit
    calls = []
    monkeypatch.setattr(probe, "train_heads", _fake_trainer(table, grid, calls))
    x = torch.zeros(4, 2)
    res = probe.sweep_hyperparameters(
        x, torch.zeros(4), x, torch.zeros(4), grid, "accuracy", False, torch.zeros(2, 2), torch.zeros(2)
    )
    assert calls == [3] and not any(r.get("unstable") for r in res.runs)
    assert (res.best_lr, res.best_wd, res.best_score) == (0.1, 100.0, 0.9)
    exact = probe.GRIDS["toolkit-exact"]
    assert exact.exact and (exact.lrs, exact.wds, exact.coarse, exact.spans) == (
        probe.FULL_GRID.lrs,
        probe.FULL_GRID.wds,
        probe.FULL_GRID.coarse,
        probe.FULL_GRID.spans,
    )


def test_toolkit_exact_scores_a_diverged_head_as_the_metric_does_and_keeps_its_final_run():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 4, generator=g)
    y = torch.arange(20) % 2
    batches = probe.epoch_batches(20, 30, batch_size=8)
    init_w, init_b = torch.randn(2, 4, generator=g), torch.zeros(2)
    scores, w, _ = probe.train_heads(
        x, y, [1.0], [10.0], batches, init_w, init_b, {"t": (x, y)}, "accuracy", score_diverged=True
    )
    assert not torch.isfinite(w).all() and torch.isfinite(scores["t"]).all()
    # non-finite probabilities: numpy's argmax of a NaN row is 0, so every image is predicted class 0
    assert scores["t"][-1, 0] == pytest.approx(float((y == 0).double().mean()))
    plain, _, _ = probe.train_heads(x, y, [1.0], [10.0], batches, init_w, init_b, {"t": (x, y)}, "accuracy")
    assert torch.isnan(plain["t"][-1, 0])  # the full grid's rule: a diverged head is not scored
    grid = probe.SweepGrid("t", (1.0,), (10.0, 0.0), (0, 1), (), epochs=1, final_epochs=80, exact=True)
    table_pick = probe.linear_probe(x, [[int(v)] for v in y], x, y, 2, "accuracy", False, grid, init_w, init_b)
    assert not any(r.get("final_run_diverged") for r in table_pick.runs)  # no fallback: the toolkit's run
    assert all(np.isfinite(table_pick.test_scores))


def test_one_shot_draws_two_and_the_final_run_does_not_merge(tmp_path):
    assert kshot.shot_plan(1) == (2, False) and kshot.shot_plan(5) == (5, True)
    with pytest.raises(ValueError, match="shots must be >= 1, got 0"):
        kshot.shot_plan(0)
    names = ["red", "green", "blue"]
    write_iris(tmp_path / "colours", names, colour_split(names, 6), colour_split(names, 3))
    report = fs.run_fewshot(
        ToyCLIP(), to_tensor, ToyTokenizer(), tmp_path, shots=1, seeds=(0, 1), grid="reduced", progress=False
    )
    for p in report.probes:  # 2 drawn per class: 1 chooses (lr, wd), 1 trains the final head
        assert (p.n_train, p.n_val, p.n_final) == (3, 3, 3)
    assert report.settings["shots_drawn"] == 2 and report.settings["final_run_merges_val"] is False
    report5 = fs.run_fewshot(
        ToyCLIP(), to_tensor, ToyTokenizer(), tmp_path, shots=5, seeds=(0,), grid="reduced", progress=False
    )
    assert (report5.probes[0].n_train, report5.probes[0].n_val, report5.probes[0].n_final) == (12, 3, 15)


# ----------------------------------------------------------------------------------------------
# The toolkit's prompts and its download layout
# ----------------------------------------------------------------------------------------------
#: Templates per set in the toolkit's template_map (its prompts.py).
TOOLKIT_TEMPLATE_COUNTS = {
    "caltech-101": 34,
    "cifar-10": 18,
    "cifar-100": 18,
    "country211": 5,
    "dtd": 8,
    "eurosat_clip": 3,
    "fer-2013": 6,
    "fgvc-aircraft-2013b-variants102": 2,
    "food-101": 1,
    "gtsrb": 3,
    "hateful-memes": 1,
    "kitti-distance": 1,
    "mnist": 1,
    "oxford-flower-102": 1,
    "oxford-iiit-pets": 1,
    "patch-camelyon": 1,
    "rendered-sst2": 1,
    "resisc45_clip": 18,
    "stanford-cars": 8,
    "voc-2007-classification": 1,
}


def test_the_20_sets_prompts_ship_with_the_package():
    prompts, cat = fs.builtin_prompts(), fs.builtin_catalog()
    assert set(prompts) == set(cat) == set(TOOLKIT_TEMPLATE_COUNTS)
    for name, p in prompts.items():
        assert len(p["classnames"]) == cat[name]["num_classes"], name
        assert len(p["templates"]) == TOOLKIT_TEMPLATE_COUNTS[name], name
        assert all("{c}" in t for t in p["templates"]) and all(n.strip() for n in p["classnames"])
    assert prompts["cifar-10"]["templates"] == prompts["cifar-100"]["templates"]
    assert prompts["fer-2013"]["classnames"][3] == "happy"  # the first of ['happy', 'smiling']
    assert prompts["kitti-distance"]["templates"] == ["{c}"]
    assert fs.dataset_prompts("cifar10", fs.load_catalog()) == prompts["cifar-10"]  # the yaml alias


class AnyTextTokenizer(ToyTokenizer):
    """ToyTokenizer for texts that name a colour; any other text maps to a colour from its hash."""

    def __call__(self, texts):
        texts = [texts] if isinstance(texts, str) else texts
        out = []
        for t in texts:
            try:
                out.append(super().__call__([t])[0])
            except StopIteration:
                h = abs(hash(t)) % (256**3)
                out.append(torch.tensor([h % 256, (h // 256) % 256, h // 65536], dtype=torch.float32) / 255)
        return torch.stack(out)


def _png(rgb, seed):
    return png_bytes(rgb, noise=10, seed=seed)


def _toolkit_root(root, cifar_folder="cifar_10_20211007"):
    """A miniature of the toolkit's download: cifar-10 (iris index, images in train.zip and val.zip)
    and kitti-distance (COCO index files *_meta.json, images in zips, images listed out of id order)."""
    colours = ["red", "green", "blue", "yellow", "purple", "cyan", "red", "green", "blue", "yellow"]
    cifar = root / "classification" / cifar_folder
    cifar.mkdir(parents=True)
    (cifar / "labels.txt").write_text("\n".join(f"label_{i}" for i in range(10)) + "\n")
    for split, zname, n in (("train", "train.zip", 4), ("test", "val.zip", 2)):
        lines = []
        with zipfile.ZipFile(cifar / zname, "w") as zf:
            for j in range(n):
                for y in range(10):
                    name = f"{split}/{y}_{j}.png"
                    zf.writestr(name, _png(COLOURS[colours[y]], y * 10 + j))
                    lines.append(f"{zname}@{name} {y}")
        (cifar / f"{split}.txt").write_text("\n".join(lines) + "\n")
    kitti = root / "classification" / "kitti_distance_20210923"
    kitti.mkdir(parents=True)
    cats = [{"id": i + 1, "name": n} for i, n in enumerate(["a", "b", "c", "d"])]
    for split, n in (("train", 5), ("test", 2)):
        zname = f"{split}_images.zip"
        images, anns = [], []
        with zipfile.ZipFile(kitti / zname, "w") as zf:
            for j in range(n * 4):
                y = j % 4
                zf.writestr(f"{j}.png", _png(COLOURS[["red", "green", "blue", "cyan"][y]], 500 + j))
                images.append({"id": j + 1, "file_name": f"{j}.png", "zip_file": zname})
                anns.append({"id": j + 1, "image_id": j + 1, "category_id": y + 1})
        images = images[::-1]  # listed out of id order
        (kitti / f"{split}_meta.json").write_text(
            json.dumps({"images": images, "annotations": anns, "categories": cats})
        )
    return root


def test_toolkit_download_layout_reads_without_renaming(tmp_path, monkeypatch):
    root = _toolkit_root(tmp_path / "datasets")
    used = {}
    real = fs.zeroshot_classifier

    def spy(model, tokenizer, classnames, templates, **kw):
        used[tuple(classnames)] = list(templates)
        return real(model, tokenizer, classnames, templates, **kw)

    monkeypatch.setattr(fs, "zeroshot_classifier", spy)
    report = fs.run_fewshot(
        ToyCLIP(),
        to_tensor,
        AnyTextTokenizer(),
        root,
        datasets=["cifar10", "kitti-distance"],
        shots=2,
        seeds=(0,),
        grid="reduced",
        progress=False,
    )
    ds = report.datasets
    assert set(ds) == {"cifar-10", "kitti-distance"}
    assert ds["cifar-10"]["layout"] == "iris" and ds["kitti-distance"]["layout"] == "coco"
    assert ds["cifar-10"]["folder"].endswith("classification/cifar_10_20211007")
    assert (ds["cifar-10"]["num_train"], ds["cifar-10"]["num_test"]) == (40, 20)
    assert (ds["kitti-distance"]["num_train"], ds["kitti-distance"]["num_test"]) == (20, 8)
    # the shipped class names and templates, not labels.txt and not one generic template
    prompts = fs.builtin_prompts()
    assert ds["cifar-10"]["classnames"].endswith("elevater_prompts.json") and ds["cifar-10"]["num_templates"] == 18
    assert used[tuple(prompts["cifar-10"]["classnames"])] == prompts["cifar-10"]["templates"]
    assert tuple(prompts["kitti-distance"]["classnames"]) in used
    assert {p.dataset for p in report.probes} == {"cifar-10", "kitti-distance"}
    assert report.probes[0].metric == "accuracy" and all(len(p.test_scores) == 50 for p in report.probes)
    # all sets found under the root, or under its classification/ folder, and another download date
    assert fs.run_fewshot(
        ToyCLIP(),
        to_tensor,
        AnyTextTokenizer(),
        root / "classification",
        shots=2,
        seeds=(0,),
        grid="reduced",
        progress=False,
    ).datasets.keys() == {"cifar-10", "kitti-distance"}
    (root / "classification" / "cifar_10_20211007").rename(root / "classification" / "cifar_10_20230101")
    again = fs.run_fewshot(
        ToyCLIP(),
        to_tensor,
        AnyTextTokenizer(),
        root,
        datasets=["cifar-10"],
        shots=2,
        seeds=(0,),
        grid="reduced",
        progress=False,
    )
    assert again.datasets["cifar-10"]["folder"].endswith("cifar_10_20230101")
    with pytest.raises(ValueError, match=r"(?s)\['dtd'\] not found .*toolkit's download layout.*one folder a data set"):
        fs.run_fewshot(ToyCLIP(), to_tensor, AnyTextTokenizer(), root, datasets=["dtd"], progress=False)


def test_coco_images_are_ordered_by_id_so_the_draws_match_the_toolkit(tmp_path):
    root = _toolkit_root(tmp_path)
    folder = root / "classification" / "kitti_distance_20210923"
    names, items = es.read_coco_classification(folder / "train_meta.json")
    doc = json.loads((folder / "train_meta.json").read_text())
    by_id = sorted(doc["images"], key=lambda im: im["id"])
    assert [ref for ref, _ in items] == [f"{im['zip_file']}@{im['file_name']}" for im in by_id]
    assert [ref for ref, _ in items] != [f"{im['zip_file']}@{im['file_name']}" for im in doc["images"]]
    # the toolkit's draw: shuffle the id-sorted list with random.Random(seed), first k per class
    labels_by_id = {a["image_id"]: a["category_id"] - 1 for a in doc["annotations"]}
    for seed in range(3):
        order = list(range(len(by_id)))
        random.Random(seed).shuffle(order)
        counts, expected = [0] * 4, []
        for i in order:
            y = labels_by_id[by_id[i]["id"]]
            if counts[y] < 2:
                counts[y] += 1
                expected.append(by_id[i]["file_name"])
        got = kshot.sample_few_shot([ys for _, ys in items], 4, 2, seed)
        assert [items[i][0].split("@")[1] for i in got] == expected


def test_catalogued_sets_in_the_one_folder_layout_use_the_shipped_prompts(tmp_path):
    folder = tmp_path / "mnist"
    write_iris(
        folder,
        [f"digit {i}" for i in range(10)],
        [(y, COLOURS["red"], y) for y in range(10)],
        [(y, COLOURS["red"], y) for y in range(10)],
    )
    data, source = fs._read_dataset(tmp_path, "mnist", fs.load_catalog(tmp_path))
    assert data.classnames == [str(i) for i in range(10)] and source.endswith("elevater_prompts.json")
    assert data.templates == ['a photo of the number: "{c}".']
    (folder / "templates.txt").write_text("a drawing of the digit {c}\n")
    data, source = fs._read_dataset(tmp_path, "mnist", fs.load_catalog(tmp_path))
    assert data.templates == ["a drawing of the digit {}"] and "templates file" in source
    (folder / "labels.txt").write_text("zero\none\n")
    with pytest.raises(ValueError, match=r"labels.txt' names 2 classes, but 10 class names were given"):
        fs._read_dataset(tmp_path, "mnist", fs.load_catalog(tmp_path))


def test_more_shots_than_a_class_has_is_refused_before_encoding(tmp_path):
    root = _suite(tmp_path)  # "pairs": 6 train images per class

    class Exploding(ToyCLIP):
        def encode_image(self, x, normalize=False):
            raise AssertionError("encoded before checking the shots")

    with pytest.raises(
        ValueError,
        match=r"--shots 10: data set 'pairs' has 2 class\(es\) with fewer train images "
        r"\('cyan' 6, 'yellow' 6\); use --shots 6 or less",
    ):
        fs.evaluate_fewshot(Exploding(), to_tensor, ToyTokenizer(), root, datasets=["pairs"], shots=10, progress=False)
