"""ELEVATER few-shot probe: metrics, sampler, split, shuffling, batched heads, sweep bookkeeping, suite."""
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
from test_evalsets import COLOURS, ToyCLIP, ToyTokenizer, colour_split, to_tensor, write_iris, write_png

from clip_dcl.eval import fewshot as fs
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
                assert ap[b, j].item() == pytest.approx(_ap11_reference(scores[b, :, j].numpy(),
                                                                         targets[:, j].numpy()), abs=1e-12)


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
    got = fs.sample_few_shot(labels, 7, 5, seed)
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
    assert fs.sample_few_shot(labels, 7, 5, seed) == got
    assert Counter(labels[i][0] for i in got) == Counter({**{c: 5 for c in range(6)}, 6: 2})


def test_sampler_seeds_differ_and_stop_when_full():
    labels = [[i % 3] for i in range(300)]
    a, b = fs.sample_few_shot(labels, 3, 5, 0), fs.sample_few_shot(labels, 3, 5, 1)
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
    got = fs.sample_few_shot(labels, 3, 2, seed=3)
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
    got = fs.sample_few_shot(labels, 3, 4, seed=0)
    # [1] x4 -> c1=4; [0,1] x3: min(c0)=0,1,2 <= 2 kept -> c0=3, c1=7; [0,2]: c=(3,0) min 0 kept.
    assert [order.index(i) for i in got] == [0, 1, 2, 3, 4, 5, 6, 7, 8]
    walk2 = [[1]] * 4 + [[0, 1]] * 3 + [[0, 1]]  # (3, 7): skipped
    labels2 = [None] * len(walk2)
    order2 = _walk_order(len(walk2), seed=0)
    for pos, i in enumerate(order2):
        labels2[i] = walk2[pos]
    assert [order2.index(i) for i in fs.sample_few_shot(labels2, 2, 4, seed=0)] == list(range(7))


def test_single_label_split_first_ceil_fifth_per_class():
    labels = [[c] for c in [0, 1, 0, 2, 1, 0, 0, 0, 1, 1, 1]]
    train, val = fs.split_train_val(labels, 3, multilabel=False)
    # class 0: 5 images -> 1 val (first, position 0); class 1: 5 -> 1 (position 1); class 2: 1 -> 1 (position 3)
    assert sorted(val) == [0, 1, 3]
    assert train == [2, 4, 5, 6, 7, 8, 9, 10]  # subset order kept
    assert len(fs.split_train_val([[0]] * 15, 1, False)[1]) == 3
    assert len(fs.split_train_val([[0]] * 16, 1, False)[1]) == 4
    five_shot = [[c] for c in range(4) for _ in range(5)]
    tr, va = fs.split_train_val(five_shot, 4, False)
    assert len(va) == 4 and len(tr) == 16


def test_multilabel_split_greedy():
    labels = [[0], [0, 1], [1], [2], [0, 2]]
    train, val = fs.split_train_val(labels, 3, multilabel=True)
    assert val == [0, 1, 3] and train == [2, 4]


# ----------------------------------------------------------------------------------------------
# Shuffling and the batched heads
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 40, 65, 130])
def test_epoch_batches_replay_the_dataloader(n):
    from torch.utils.data import DataLoader

    loader = DataLoader(range(n), batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0))
    ref = [[b for b in loader if len(b) > 1] for _ in range(4)]
    got = fs.epoch_batches(n, 4)
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
    w0, b0 = fs.default_head_init(c, d, seed=1)
    lrs, wds = [0.1, 0.01, 0.5], [1e-4, 1e-2, 0.3]
    scores, w, b = fs.train_heads(x, y, lrs, wds, fs.epoch_batches(n, 5), w0, b0, {"ev": (x_eval, y_eval)},
                                  metric, multilabel)
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

    def fake(x, y, lrs, wds, batches, w0, b0, eval_sets, metric, multilabel=False):
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
    grid = fs.SweepGrid("t", (1e-4, 2e-4, 3e-4), tuple(float(v) for v in np.logspace(-3, 3, 13)), (0, 4, 8, 12),
                        (2, 1), epochs=3)
    rng = np.random.default_rng(seed)
    table = {(lr, j): float(rng.integers(0, 6)) / 5 for lr in grid.lrs for j in range(13)}  # many ties
    calls = []
    monkeypatch.setattr(fs, "train_heads", _fake_trainer(table, grid, calls))
    x = torch.zeros(4, 2)
    res = fs.sweep_hyperparameters(x, torch.zeros(4), x, torch.zeros(4), grid, "accuracy", False,
                                   torch.zeros(2, 2), torch.zeros(2))
    best_lr, best_wd, best_score, visited = _toolkit_sweep(lambda lr, j: table[(lr, j)], grid)
    assert (res.best_lr, res.best_wd, res.best_score) == (best_lr, best_wd, best_score)
    assert {(r["lr"], r["wd_index"]) for r in res.runs} == visited
    assert calls[0] == 12 and len(calls) == 3  # coarse round (3 lrs x 4), then one round per span


def test_sweep_never_trains_or_picks_unstable_pairs(monkeypatch):
    # lr * wd >= 2 (1 + momentum) diverges on the weight-decay term alone: not trained, NaN, not chosen
    grid = fs.SweepGrid("t", (0.1,), (1.0, 10.0, 100.0), (0, 1, 2), (), epochs=2)
    table = {(0.1, 0): 0.2, (0.1, 1): 0.5, (0.1, 2): 0.9}  # the unstable pair would win
    calls = []
    monkeypatch.setattr(fs, "train_heads", _fake_trainer(table, grid, calls))
    x = torch.zeros(4, 2)
    res = fs.sweep_hyperparameters(x, torch.zeros(4), x, torch.zeros(4), grid, "accuracy", False,
                                   torch.zeros(2, 2), torch.zeros(2))
    assert (res.best_lr, res.best_wd, res.best_score) == (0.1, 10.0, 0.5)
    assert calls == [2]  # the pair (0.1, 100) was never trained
    unstable = [r for r in res.runs if r.get("unstable")]
    assert [(r["lr"], r["wd"]) for r in unstable] == [(0.1, 100.0)] and np.isnan(unstable[0]["val_score"])
    assert fs.stable(0.1, 37.0) and not fs.stable(0.1, 38.0)


def test_a_head_that_overflows_scores_nan_and_the_final_run_falls_back(monkeypatch):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 4, generator=g)
    y = torch.arange(20) % 2
    batches = fs.epoch_batches(20, 30, batch_size=8)
    init_w, init_b = torch.randn(2, 4, generator=g), torch.zeros(2)
    # lr * wd = 10: the weights are multiplied by about -9 a step and overflow within 30 epochs
    scores, w, _ = fs.train_heads(x, y, [1.0, 0.01], [10.0, 0.0], batches, init_w, init_b, {"t": (x, y)}, "accuracy")
    col = scores["t"][:, 0]
    assert torch.isnan(col[-1]) and torch.isfinite(col[0]) and not torch.isfinite(w[0]).all()
    assert torch.isnan(col[int(torch.isnan(col).nonzero()[0]):]).all()  # once diverged, NaN from then on
    assert torch.isfinite(scores["t"][:, 1]).all()
    # If the stability bound let such a pair through and it won the short sweep, the 50-epoch final
    # run would diverge: the probe then takes the next-best pair and records the failure.
    monkeypatch.setattr(fs, "stable", lambda lr, wd: True)
    grid = fs.SweepGrid("t", (1.0,), (10.0, 0.0), (0, 1), (), epochs=1, final_epochs=80)  # 80 steps: overflow
    res = fs.linear_probe(x, [[int(v)] for v in y], x, y, 2, "accuracy", False, grid, init_w, init_b)
    assert (res.best_lr, res.best_wd) == (1.0, 0.0)
    assert {"lr": 1.0, "wd": 10.0, "final_run_diverged": True} in res.runs
    assert all(np.isfinite(res.test_scores))


def test_sweep_all_zero_keeps_toolkit_defaults(monkeypatch):
    grid = fs.SweepGrid("t", (0.1, 0.2), tuple(float(v) for v in np.logspace(-3, 3, 13)), (0, 6, 12), (2,), epochs=2)
    monkeypatch.setattr(fs, "train_heads", _fake_trainer({(lr, j): 0.0 for lr in grid.lrs for j in range(13)}, grid, []))
    x = torch.zeros(4, 2)
    res = fs.sweep_hyperparameters(x, torch.zeros(4), x, torch.zeros(4), grid, "accuracy", False,
                                   torch.zeros(2, 2), torch.zeros(2))
    assert (res.best_lr, res.best_wd, res.best_score) == (0.0, 0.0, 0.0)


def test_full_grid_is_the_toolkits(monkeypatch):
    wds = np.logspace(-6, 6, 97).tolist()
    coarse = [i for i, v in enumerate(wds) if v in set(np.logspace(-6, 6, 7))]
    assert list(fs.FULL_GRID.coarse) == coarse and list(fs.FULL_GRID.wds) == wds
    assert list(fs.FULL_GRID.lrs) == np.logspace(-6, -1, 6).tolist()
    assert fs.FULL_GRID.epochs + 40 == fs.FULL_GRID.final_epochs == 50
    rng = np.random.default_rng(0)
    table = {(lr, j): float(rng.random()) for lr in fs.FULL_GRID.lrs for j in range(97)}
    monkeypatch.setattr(fs, "train_heads", _fake_trainer(table, fs.FULL_GRID, []))
    x = torch.zeros(4, 2)
    res = fs.sweep_hyperparameters(x, torch.zeros(4), x, torch.zeros(4), fs.FULL_GRID, "accuracy", False,
                                   torch.zeros(2, 2), torch.zeros(2))
    assert 6 * 7 < len(res.runs) <= 90


def test_mean_classifier_is_class_mean_inner_product():
    g = torch.Generator().manual_seed(0)
    x, y, xt = torch.randn(30, 5, generator=g), torch.randint(0, 4, (30,), generator=g), torch.randn(7, 5, generator=g)
    y[-1] = 3
    logits = fs.mean_classifier_logits(x, y, xt, 5)
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
    (root / "catalog.json").write_text(json.dumps({
        "pairs": {"metric": "mean_per_class", "num_classes": 2},
        "halves": {"metric": "11point_mAP", "multilabel": True},
    }))
    return root


def test_evaluate_fewshot_end_to_end(tmp_path):
    root = _suite(tmp_path)
    report = fs.evaluate_fewshot(ToyCLIP(), to_tensor, ToyTokenizer(), root, shots=3, seeds=(0, 1),
                                 grid="reduced", progress=False, return_report=True)
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
        {"accuracy": 14, "mean_per_class": 4, "11point_mAP": 1, "roc_auc": 1})
    assert [n for n, e in cat.items() if e["multilabel"]] == ["voc-2007-classification"]
    assert fs.load_catalog()["cifar10"]["name"] == "cifar-10"


def test_fewshot_cli_with_tiny_model(tmp_path):
    from clip_dcl.eval.cli import main

    root = _suite(tmp_path / "suite")
    out = tmp_path / "f.json"
    assert main(["fewshot", "--model", "clip-dcl-tiny", "--data", str(root), "--datasets", "colours", "pairs",
                 "--shots", "2", "--seeds", "0", "--no-text-init", "--epoch-selection", "toolkit",
                 "--grid", "reduced", "--output", str(out), "--no-progress"]) == 0
    doc = json.loads(out.read_text())
    assert doc["settings"]["epoch_selection"] == "toolkit" and doc["settings"]["text_init"] is False
    assert doc["settings"]["grid"] == "reduced"
    assert doc["colours/linear_probe"] == doc["colours/linear_probe_toolkit"]
    assert {d["dataset"] for d in doc["details"]} == {"colours", "pairs"}
    assert doc["data"]["datasets"]["pairs"]["metric"] == "mean_per_class"


def test_more_shots_than_a_class_has_is_refused_before_encoding(tmp_path):
    root = _suite(tmp_path)  # "pairs": 6 train images per class

    class Exploding(ToyCLIP):
        def encode_image(self, x, normalize=False):
            raise AssertionError("encoded before checking the shots")

    with pytest.raises(ValueError, match=r"--shots 10: data set 'pairs' has 2 class\(es\) with fewer train images "
                                         r"\('cyan' 6, 'yellow' 6\); use --shots 6 or less"):
        fs.evaluate_fewshot(Exploding(), to_tensor, ToyTokenizer(), root, datasets=["pairs"], shots=10,
                            progress=False)
