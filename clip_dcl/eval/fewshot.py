"""ELEVATER few-shot linear probe (image classification), on frozen features cached once.

The protocol is the Elevater_Toolkit_IC linear probe (``linear_probe.py`` ->
``full_model_finetune.py``, samplers from vision-datasets 0.2.17), re-implemented on tensors:

1. **k-shot subset, per seed** (:func:`sample_few_shot`): ``random.Random(seed)`` shuffles the
   train index list; walking it, an image is kept while a class still has fewer than k images
   (multilabel: kept if ``min(counts) <= k/2 or max(counts) <= 1.5k`` over its labels and not all
   of them full; images without labels kept up to k), stopping once every class has k.
2. **Validation split** (:func:`split_train_val`): the first ``ceil(0.2 n_c)`` images of each class
   in subset order (multilabel: the toolkit's greedy fill), the rest trains.
3. **Head**: ``Linear(BatchNorm1d(f(x), affine=False))`` on the frozen, un-normalised
   ``encode_image`` output, logit scale 1; weight = the zero-shot text embeddings and bias 0
   when text-initialised (run.sh's setting; prompts from the data set's ``templates.txt``, else
   ``"a photo of a {c}."``), else PyTorch's default Linear init (from a generator seeded 0, the
   same for every run). Cross-entropy (BCE-with-logits for multilabel data). SGD, momentum 0.9,
   no Nesterov, constant lr, weight decay on every head parameter, batch 64, a batch of one
   skipped, order from a ``torch.Generator`` seeded 0 afresh for every run (the toolkit's
   ``create_dataloader``).
4. **Sweep** (:func:`sweep_hyperparameters`): for each lr in ``logspace(-6, -1, 6)``, weight decays
   from ``logspace(-6, 6, 97)``: 7 coarse points (indices 0, 16, ..., 96), then around the peak
   index +-8, +-4, +-2, +-1; a run (10 epochs) scores its best validation metric over epochs;
   ties keep the first (strict ``>`` from 0, peak index -1 at start, as the toolkit).
5. **Final run**: train + val merged (subset order), the chosen (lr, wd), 50 epochs, the test
   metric after every epoch. ``toolkit`` selection reports the best test epoch (what the
   toolkit's log shows); ``last`` the last epoch (ours by default). Both are recorded.
6. **Diverged runs** (our addition; the toolkit scores whatever the logits are): SGD with
   momentum ``m`` on the weight-decay term alone is unstable when ``lr * wd >= 2 (1 + m)`` (3.8),
   so such (lr, wd) pairs of the grid are not trained and score NaN; a run whose head turns
   non-finite scores NaN from then on. A NaN run is never selected (the toolkit's strict ``>``),
   and when the final run of the selected pair diverges, the next-best sweep pair is taken (the
   probe record lists the pairs that diverged). Without this, a head of NaN weights would be
   scored as a classifier (argmax of NaN logits) and report a meaningless accuracy such as 0.
7. **Metrics** on ``softmax`` probabilities: accuracy, mean per class, 11-point mAP (VOC 2007),
   ROC-AUC (Hateful Memes), per the catalogue (:mod:`clip_dcl.eval.metrics`).

Why batching is exact: the features are frozen and there is no augmentation, so every run of a
data set sees the same batches in the same order (same generator seed), and BatchNorm without
affine parameters depends on the data only; runs differ in (lr, wd) alone. All runs of one
sweep round are therefore trained at once as a stack of heads (one matmul per step), which is
the toolkit's sequence of runs computed in parallel; ``tests/test_eval_fewshot.py`` checks it
against a plain ``nn.BatchNorm1d`` + ``nn.Linear`` + ``torch.optim.SGD`` + ``DataLoader`` loop.

Also reported, sweep-free: the **mean classifier** of Arora et al. (2019, Definition 2.1):
``argmax_c f(x)^T mu_c`` with ``mu_c`` the mean normalised embedding of class c over the k shots;
and the **zero-shot** score of the text classifier on the same test set.
"""
from __future__ import annotations

import json
import logging
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..data.evalsets import FewShotData, ImageListDataset, list_fewshot_datasets, read_fewshot_dataset
from .metrics import ELEVATER_METRICS, elevater_scores

log = logging.getLogger(__name__)

#: Default prompt when a data set has no templates.txt (the toolkit's single template for most sets).
DEFAULT_TEMPLATES = ("a photo of a {}.",)
VAL_SPLIT = 0.2
BATCH_SIZE = 64
BN_MOMENTUM = 0.1
BN_EPS = 1e-5
SGD_MOMENTUM = 0.9
#: Below this many multiply-adds per step (heads x batch x classes x dim) heads train on one thread.
SINGLE_THREAD_WORK = 1 << 24


# ----------------------------------------------------------------------------------------------
# Catalogue
# ----------------------------------------------------------------------------------------------
def builtin_catalog() -> dict[str, dict]:
    """The 20 ELEVATER data sets (``catalog.json``): name -> metric, num_classes, test_size,
    layout, multilabel, center_crop, aliases."""
    doc = json.loads((Path(__file__).with_name("catalog.json")).read_text())
    return doc["datasets"]


def load_catalog(root: str | os.PathLike | None = None) -> dict[str, dict]:
    """Built-in catalogue, aliases expanded, updated with ``root/catalog.json`` when present.

    A local entry needs ``metric`` (one of :data:`ELEVATER_METRICS`); ``num_classes`` and
    ``multilabel`` are optional. A malformed file raises ``ValueError`` naming it.
    """
    cat = {}
    for name, entry in builtin_catalog().items():
        cat[name] = dict(entry, name=name)
        for alias in entry.get("aliases", []):
            cat[alias] = cat[name]
    if root is not None and (Path(root) / "catalog.json").is_file():
        path = Path(root) / "catalog.json"
        try:
            local = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"catalogue {str(path)!r} is not valid JSON: {e}") from e
        if not isinstance(local, dict):
            raise ValueError(f"catalogue {str(path)!r} must map data set names to entries")
        local = local.get("datasets", local)
        for name, entry in local.items():
            if not isinstance(entry, dict) or entry.get("metric") not in ELEVATER_METRICS:
                raise ValueError(f"catalogue {str(path)!r}: entry {name!r} needs a metric in {ELEVATER_METRICS}, "
                                 f"got {entry!r}")
            cat[name] = dict(cat.get(name, {}), **entry, name=name)
    return cat


def _check_enough_shots(d, name: str, shots: int) -> None:
    """Refuse ``shots`` above the train images of a class: the result would be reported as
    k-shot while some classes had fewer."""
    counts = np.zeros(d.num_classes, dtype=int)
    for _, ys in d.train:
        for y in set(ys):
            counts[y] += 1
    short = [(d.classnames[c] if c < len(d.classnames) else str(c), int(counts[c]))
             for c in np.flatnonzero(counts < shots)]
    if short:
        listed = ", ".join(f"{c!r} {k}" for c, k in short[:5]) + (", ..." if len(short) > 5 else "")
        raise ValueError(f"--shots {shots}: data set {name!r} has {len(short)} class(es) with fewer train images "
                         f"({listed}); use --shots {int(counts.min())} or less")


# ----------------------------------------------------------------------------------------------
# Sampling and splitting (pure functions over label lists)
# ----------------------------------------------------------------------------------------------
def sample_few_shot(labels: Sequence[Sequence[int]], num_classes: int, shots: int, seed: int) -> list[int]:
    """Indices of the k-shot subset, in the (shuffled) order kept, as vision-datasets 0.2.17's
    ``DatasetManifest.sample_few_shot_subset`` draws it (see the module docstring, step 1).

    For single-label data this is "shuffle, then the first k of each class". A class with fewer
    than k images keeps all of them.
    """
    if shots < 1:
        raise ValueError(f"shots must be >= 1, got {shots}")
    order = list(range(len(labels)))
    random.Random(seed).shuffle(order)
    counts = [0] * num_classes
    negatives = 0
    kept = []
    for i in order:
        ys = labels[i]
        if not ys:
            if negatives < shots:
                negatives += 1
                kept.append(i)
            continue
        c = [counts[y] for y in ys]
        if min(c) >= shots:
            continue
        if min(c) <= shots / 2 or max(c) <= 1.5 * shots:
            kept.append(i)
            for y in ys:
                counts[y] += 1
        if min(counts) >= shots:
            break
    return kept


def split_train_val(labels: Sequence[Sequence[int]], num_classes: int, multilabel: bool,
                    val_split: float = VAL_SPLIT) -> tuple[list[int], list[int]]:
    """(train positions, val positions) within a few-shot subset, as the toolkit's
    ``get_dataloader(val_split=0.2)`` (``feature.py``) splits it.

    Single-label: the first ``ceil(val_split * n_c)`` images of each class (in subset order) go to
    val (1 of 5 at 5-shot). Multilabel: repeatedly
    take the first image holding the first class still short of ``ceil(val_split * n_c)`` val
    labels. Train keeps the subset order; val is in the order taken.
    """
    n = len(labels)
    if multilabel:
        mat = np.zeros((n, num_classes))
        for i, ys in enumerate(labels):
            mat[i, list(ys)] = 1
        need = np.ceil(mat.sum(0) * val_split)
        val = []
        targets = np.where(need > 0)[0]
        while targets.size > 0:
            row = int(np.where(mat[:, targets[0]] > 0)[0][0])
            val.append(row)
            need -= mat[row]
            mat[row] = 0
            targets = np.where(need > 0)[0]
    else:
        if any(len(ys) != 1 for ys in labels):
            raise ValueError("single-label split needs exactly one label per image")
        flat = [ys[0] for ys in labels]
        val = []
        for c in dict.fromkeys(flat):
            members = [i for i, y in enumerate(flat) if y == c]
            val.extend(members[: math.ceil(len(members) * val_split)])
    val_set = set(val)
    train = [i for i in range(n) if i not in val_set]
    return train, val


def epoch_batches(n: int, epochs: int, batch_size: int = BATCH_SIZE, seed: int = 0) -> list[list[torch.Tensor]]:
    """Index batches per epoch of ``DataLoader(range(n), batch_size, shuffle=True,
    generator=torch.Generator().manual_seed(seed))`` iterated ``epochs`` times, size-1 batches
    dropped (the toolkit skips them: BatchNorm cannot train on one sample).

    Replays the generator draws the DataLoader makes (one ``int64`` base seed per epoch iterator,
    then ``RandomSampler``'s permutations) without building the loader.
    """
    from torch.utils.data import RandomSampler

    if n == 0:
        return [[] for _ in range(epochs)]
    g = torch.Generator().manual_seed(seed)
    sampler = RandomSampler(range(n), generator=g)
    out = []
    for _ in range(epochs):
        torch.empty((), dtype=torch.int64).random_(generator=g)  # the DataLoader iterator's _base_seed
        perm = torch.tensor(list(sampler), dtype=torch.long)
        out.append([b for b in perm.split(batch_size) if len(b) > 1])
    return out


# ----------------------------------------------------------------------------------------------
# Training stacks of linear heads
# ----------------------------------------------------------------------------------------------
def default_head_init(num_classes: int, dim: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``nn.Linear``'s default init, U(-1/sqrt(D), 1/sqrt(D)) for weight and bias, from a seeded generator."""
    g = torch.Generator().manual_seed(seed)
    bound = 1.0 / math.sqrt(dim)
    w = (torch.rand(num_classes, dim, generator=g) * 2 - 1) * bound
    b = (torch.rand(num_classes, generator=g) * 2 - 1) * bound
    return w, b


def train_heads(
    x: torch.Tensor,
    y: torch.Tensor,
    lrs: Sequence[float],
    wds: Sequence[float],
    batches: list[list[torch.Tensor]],
    init_weight: torch.Tensor,
    init_bias: torch.Tensor,
    eval_sets: dict[str, tuple[torch.Tensor, torch.Tensor]],
    metric: str,
    multilabel: bool = False,
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """Train H = len(lrs) heads ``Linear(BN(x))`` at once; score every eval set after each epoch.

    Args:
        x: (n, D) frozen features; y: (n,) class ids, or (n, C) multi-hot when ``multilabel``.
        lrs, wds: per-head learning rate and weight decay.
        batches: index batches per epoch (:func:`epoch_batches`); their count is the epoch count.
        init_weight, init_bias: (C, D), (C,) initial head, copied to every head.
        eval_sets: name -> (features, targets), scored with ``metric`` (eval-mode BatchNorm).

    Returns:
        (name -> (epochs, H) scores, final weights (H, C, D), final biases (H, C)). A head whose
        weights became non-finite scores NaN from that epoch on.
    """
    h = len(lrs)
    if len(wds) != h:
        raise ValueError(f"{h} learning rates but {len(wds)} weight decays")
    c, d = init_weight.shape
    # Few-shot heads are tiny: waking the intra-op thread pool costs more than the math (ms per
    # op on a busy 2-core machine, vs us single-threaded), so small stacks run on one thread.
    small = h * min(len(x), BATCH_SIZE) * c * d < SINGLE_THREAD_WORK
    threads = torch.get_num_threads()
    if small:
        torch.set_num_threads(1)
    try:
        return _train_heads(x, y, lrs, wds, batches, init_weight, init_bias, eval_sets, metric, multilabel)
    finally:
        if small:
            torch.set_num_threads(threads)


def _train_heads(x, y, lrs, wds, batches, init_weight, init_bias, eval_sets, metric, multilabel):
    h = len(lrs)
    c, d = init_weight.shape
    x = x.float()
    w = init_weight.float()[None].repeat(h, 1, 1)
    b = init_bias.float()[None].repeat(h, 1)
    lr = torch.tensor(lrs, dtype=torch.float32)
    wd = torch.tensor(wds, dtype=torch.float32)
    buf_w = buf_b = None
    running_mean, running_var = torch.zeros(d), torch.ones(d)
    scores = {name: torch.zeros(len(batches), h, dtype=torch.double) for name in eval_sets}
    alive = torch.ones(h, dtype=torch.bool)  # heads whose weights stayed finite
    yf = y.float() if multilabel else y.long()
    for epoch, epoch_batches_ in enumerate(batches):
        for idx in epoch_batches_:
            xb = x[idx]
            # BatchNorm1d(affine=False) in train mode, written out: ATen's batch_norm kernel
            # launches threads even for a (64, D) input, which costs milliseconds per call.
            mean, var = xb.mean(0), xb.var(0, unbiased=False)
            running_mean.mul_(1 - BN_MOMENTUM).add_(BN_MOMENTUM * mean)
            running_var.mul_(1 - BN_MOMENTUM).add_(BN_MOMENTUM * var * (len(idx) / (len(idx) - 1)))
            xb = (xb - mean) / torch.sqrt(var + BN_EPS)
            w.requires_grad_(True)
            b.requires_grad_(True)
            logits = torch.matmul(xb, w.transpose(1, 2)) + b[:, None, :]  # (H, nb, C)
            nb = len(idx)
            # Sum over heads of each head's mean loss: head h's gradient is that of its own loss.
            if multilabel:
                loss = F.binary_cross_entropy_with_logits(logits, yf[idx][None].expand(h, -1, -1),
                                                          reduction="sum") / (nb * c)
            else:
                loss = F.cross_entropy(logits.reshape(-1, c), yf[idx].repeat(h), reduction="sum") / nb
            gw, gb = torch.autograd.grad(loss, (w, b))
            with torch.no_grad():
                w.requires_grad_(False)
                b.requires_grad_(False)
                # torch.optim.SGD(momentum=0.9, dampening=0, nesterov=False), per-head lr and wd.
                dw = gw + wd[:, None, None] * w
                db = gb + wd[:, None] * b
                if buf_w is None:
                    buf_w, buf_b = dw.clone(), db.clone()
                else:
                    buf_w.mul_(SGD_MOMENTUM).add_(dw)
                    buf_b.mul_(SGD_MOMENTUM).add_(db)
                w.sub_(lr[:, None, None] * buf_w)
                b.sub_(lr[:, None] * buf_b)
        with torch.no_grad():
            alive &= torch.isfinite(w).flatten(1).all(1) & torch.isfinite(b).all(1)
            for name, (xe, ye) in eval_sets.items():
                xn = (xe.float() - running_mean) / torch.sqrt(running_var + BN_EPS)
                epoch_scores = elevater_scores(metric, torch.matmul(xn, w.transpose(1, 2)) + b[:, None, :], ye)
                scores[name][epoch] = torch.where(alive, epoch_scores.double(), float("nan"))
    return scores, w.detach(), b.detach()


# ----------------------------------------------------------------------------------------------
# Hyper-parameter sweep
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SweepGrid:
    """Learning rates, the weight-decay grid, its coarse indices, the refinement spans, epochs per run."""

    name: str
    lrs: tuple[float, ...]
    wds: tuple[float, ...]
    coarse: tuple[int, ...]
    spans: tuple[int, ...]
    epochs: int = 10
    final_epochs: int = 50


_WD_GRID = tuple(np.logspace(-6, 6, 97).tolist())
#: The toolkit's grid: 6 lrs x (7 coarse + refinement +-8/4/2/1) weight decays, 10 epochs a run.
FULL_GRID = SweepGrid("full", tuple(np.logspace(-6, -1, 6).tolist()), _WD_GRID, tuple(range(0, 97, 16)), (8, 4, 2, 1))
#: Quick runs: 3 lrs (1e-3, 1e-2, 1e-1) x (7 coarse + refinement +-8/4) weight decays.
REDUCED_GRID = SweepGrid("reduced", (1e-3, 1e-2, 1e-1), _WD_GRID, tuple(range(0, 97, 16)), (8, 4))
GRIDS = {"full": FULL_GRID, "reduced": REDUCED_GRID}


@dataclass
class SweepResult:
    best_lr: float
    best_wd: float
    best_score: float
    #: every distinct run: {"lr", "wd", "wd_index", "val_score"} in the order trained
    runs: list[dict] = field(default_factory=list)


def stable(lr: float, wd: float) -> bool:
    """Whether SGD with momentum can converge on the weight-decay term: ``lr * wd < 2 (1 + m)``."""
    return lr * wd < 2 * (1 + SGD_MOMENTUM)


def sweep_hyperparameters(
    x_train: torch.Tensor, y_train: torch.Tensor, x_val: torch.Tensor, y_val: torch.Tensor,
    grid: SweepGrid, metric: str, multilabel: bool, init_weight: torch.Tensor, init_bias: torch.Tensor,
) -> SweepResult:
    """The toolkit's ``hyperparameter_sweep_lr`` over ``grid`` (module docstring, step 4).

    Each round (coarse, then each span) trains all its new (lr, wd) runs as one stack of heads;
    a (lr, wd) pair already trained is not trained again (runs are deterministic, so the
    toolkit's repeat would score the same).
    """
    batches = epoch_batches(len(x_train), grid.epochs)
    cache: dict[tuple[int, int], float] = {}
    runs: list[dict] = []

    def run(pairs):
        todo = [p for p in dict.fromkeys(pairs) if p not in cache]
        for i, j in [p for p in todo if not stable(grid.lrs[p[0]], grid.wds[p[1]])]:
            cache[(i, j)] = float("nan")
            runs.append({"lr": grid.lrs[i], "wd": grid.wds[j], "wd_index": j, "val_score": float("nan"),
                         "unstable": True})
        todo = [p for p in todo if p not in cache]
        if not todo:
            return
        scores, _, _ = train_heads(
            x_train, y_train, [grid.lrs[i] for i, _ in todo], [grid.wds[j] for _, j in todo], batches,
            init_weight, init_bias, {"val": (x_val, y_val)}, metric, multilabel)
        best = scores["val"].amax(0)  # a run scores its best epoch (NaN when it diverged)
        for (i, j), s in zip(todo, best.tolist()):
            cache[(i, j)] = s
            runs.append({"lr": grid.lrs[i], "wd": grid.wds[j], "wd_index": j, "val_score": s})

    n_lr = len(grid.lrs)
    run([(i, j) for i in range(n_lr) for j in grid.coarse])
    peak = {i: (-1, 0.0) for i in range(n_lr)}  # (index, score); the toolkit starts at (-1, 0)

    def update(i, candidates):
        for j in candidates:
            if cache[(i, j)] > peak[i][1]:
                peak[i] = (j, cache[(i, j)])

    for i in range(n_lr):
        update(i, grid.coarse)
    last = len(grid.wds) - 1
    for span in grid.spans:
        cands = {}
        for i in range(n_lr):
            p = peak[i][0]
            left, right = max(p - span, 0), min(p + span, last)
            cands[i] = [j for j in (left, right) if j != p]
        run([(i, j) for i in range(n_lr) for j in cands[i]])
        for i in range(n_lr):
            update(i, cands[i])
    best_score, best_lr, best_wd = 0.0, 0.0, 0.0
    for i in range(n_lr):
        j, s = peak[i]
        if best_score < s:
            best_score, best_lr, best_wd = s, grid.lrs[i], grid.wds[j]
    return SweepResult(best_lr=best_lr, best_wd=best_wd, best_score=best_score, runs=runs)


# ----------------------------------------------------------------------------------------------
# One data set, one seed
# ----------------------------------------------------------------------------------------------
def labels_to_targets(labels: Sequence[Sequence[int]], num_classes: int, multilabel: bool) -> torch.Tensor:
    """(N,) long class ids, or (N, C) float multi-hot when ``multilabel``."""
    if multilabel:
        t = torch.zeros(len(labels), num_classes)
        for i, ys in enumerate(labels):
            t[i, list(ys)] = 1
        return t
    bad = [i for i, ys in enumerate(labels) if len(ys) != 1]
    if bad:
        raise ValueError(f"single-label data needs exactly one label per image; image {bad[0]} has {labels[bad[0]]}")
    return torch.tensor([ys[0] for ys in labels], dtype=torch.long)


def mean_classifier_logits(x_train: torch.Tensor, t_train: torch.Tensor, x_test: torch.Tensor,
                           num_classes: int) -> torch.Tensor:
    """Arora et al. (2019), Definition 2.1: scores ``100 f(x)^T mu_c``, ``mu_c`` = mean of the
    L2-normalised embeddings ``f`` of class c (multi-hot rows count for each of their classes);
    a class without examples gets ``mu_c = 0``. The factor 100 is CLIP's logit scale, which the
    softmax-based metrics (mAP, ROC-AUC) see; it does not change the argmax."""
    f_train = F.normalize(x_train.float(), dim=-1)
    onehot = t_train.float() if t_train.ndim == 2 else F.one_hot(t_train, num_classes).float()
    mu = onehot.T @ f_train / onehot.sum(0).clamp_min(1)[:, None]
    return 100.0 * F.normalize(x_test.float(), dim=-1) @ mu.T


@dataclass
class ProbeResult:
    """One (data set, seed) linear probe."""

    dataset: str
    seed: int
    metric: str
    shots: int
    n_train: int
    n_val: int
    n_test: int
    best_lr: float
    best_wd: float
    val_score: float
    test_scores: list[float]  # test metric after each final-run epoch
    mean_classifier: float
    runs: list[dict] = field(default_factory=list)

    @property
    def last(self) -> float:
        return self.test_scores[-1]

    @property
    def toolkit(self) -> float:
        return max(self.test_scores)

    def score(self, epoch_selection: str) -> float:
        return self.toolkit if epoch_selection == "toolkit" else self.last


def linear_probe(
    x_subset: torch.Tensor, labels_subset: Sequence[Sequence[int]], x_test: torch.Tensor, t_test: torch.Tensor,
    num_classes: int, metric: str, multilabel: bool, grid: SweepGrid, init_weight: torch.Tensor,
    init_bias: torch.Tensor, dataset: str = "", seed: int = 0, shots: int = 0,
) -> ProbeResult:
    """Split, sweep, final run and mean classifier for one k-shot subset (features in subset order)."""
    t_subset = labels_to_targets(labels_subset, num_classes, multilabel)
    tr, va = split_train_val(labels_subset, num_classes, multilabel)
    sweep = sweep_hyperparameters(x_subset[tr], t_subset[tr], x_subset[va], t_subset[va], grid, metric,
                                  multilabel, init_weight, init_bias)
    batches = epoch_batches(len(x_subset), grid.final_epochs)
    # The selected pair first, then the other trained pairs by validation score (stable sort:
    # the toolkit's order breaks ties), in case the 50-epoch final run diverges.
    ranked = sorted((r for r in sweep.runs if math.isfinite(r["val_score"])
                     and (r["lr"], r["wd"]) != (sweep.best_lr, sweep.best_wd)),
                    key=lambda r: -r["val_score"])
    candidates = [(sweep.best_lr, sweep.best_wd, sweep.best_score)] + [(r["lr"], r["wd"], r["val_score"])
                                                                       for r in ranked]
    runs = list(sweep.runs)
    for lr, wd, val_score in candidates:
        scores, _, _ = train_heads(x_subset, t_subset, [lr], [wd], batches, init_weight,
                                   init_bias, {"test": (x_test, t_test)}, metric, multilabel)
        if not bool(torch.isnan(scores["test"]).any()):
            break
        runs.append({"lr": lr, "wd": wd, "final_run_diverged": True})
        log.warning("%s seed %d: the final run at lr=%g wd=%g diverged; taking the next-best sweep pair",
                    dataset, seed, lr, wd)
    mc = elevater_scores(metric, mean_classifier_logits(x_subset, t_subset, x_test, num_classes), t_test)
    return ProbeResult(
        dataset=dataset, seed=seed, metric=metric, shots=shots, n_train=len(tr), n_val=len(va), n_test=len(x_test),
        best_lr=lr, best_wd=wd, val_score=val_score,
        test_scores=scores["test"][:, 0].tolist(), mean_classifier=float(mc), runs=runs)


# ----------------------------------------------------------------------------------------------
# The suite over a model
# ----------------------------------------------------------------------------------------------
@dataclass
class FewShotReport:
    """Everything :func:`evaluate_fewshot` measured: flat metrics, per-(data set, seed) records, settings."""

    metrics: dict[str, float]
    probes: list[ProbeResult]
    datasets: dict[str, dict]
    settings: dict

    def to_dict(self) -> dict:
        probes = []
        for p in self.probes:
            d = asdict(p)
            d.update(last=p.last, toolkit=p.toolkit)
            probes.append(d)
        return {"metrics": self.metrics, "probes": probes, "datasets": self.datasets, "settings": self.settings}


def _square_transform(model, preprocess):
    """Resize to the model's square input without cropping (kitti-distance's ``CENTER_CROP: false``)."""
    from open_clip import image_transform

    cfg = dict(getattr(getattr(model, "visual", None), "preprocess_cfg", {}) or {})
    if "size" not in cfg:
        log.warning("model has no preprocess_cfg; using its own preprocessing for a no-crop data set")
        return preprocess
    return image_transform(cfg["size"], is_train=False, mean=cfg.get("mean"), std=cfg.get("std"),
                           resize_mode="squash", interpolation=cfg.get("interpolation"))


def _dataset_spec(data: FewShotData, catalog: dict) -> dict:
    entry = catalog.get(data.name)
    if entry is None:
        log.info("%s: not in the catalogue; scoring with accuracy", data.name)
        entry = {"metric": "accuracy"}
    if "num_classes" in entry and int(entry["num_classes"]) != data.num_classes:
        raise ValueError(f"{data.name}: the catalogue says {entry['num_classes']} classes, its label list has "
                         f"{data.num_classes}")
    multilabel = bool(entry.get("multilabel", data.multilabel))
    metric = entry["metric"]
    if metric == "roc_auc" and data.num_classes != 2:
        raise ValueError(f"{data.name}: roc_auc needs 2 classes, found {data.num_classes}")
    if not multilabel and data.multilabel:
        raise ValueError(f"{data.name}: images carry several labels but the catalogue marks it single-label")
    return {"metric": metric, "multilabel": multilabel, "center_crop": bool(entry.get("center_crop", True)),
            "num_classes": data.num_classes, "layout": data.layout}


def evaluate_fewshot(
    model,
    preprocess: Callable,
    tokenizer: Callable,
    root: str | os.PathLike,
    datasets: Sequence[str] | None = None,
    shots: int = 5,
    seeds: Sequence[int] = (0, 1, 2),
    grid: str | SweepGrid = "full",
    epoch_selection: str = "last",
    text_init: bool = True,
    batch_size: int = 64,
    device: str | torch.device = "cpu",
    workers: int = 0,
    progress: bool = True,
    return_report: bool = False,
):
    """ELEVATER k-shot linear probe of ``model`` on the data sets under ``root``.

    Args:
        model, preprocess, tokenizer: an OpenCLIP model on ``device``, its eval transform, tokenizer.
        root: one folder per data set (iris index files, COCO json or train/test ImageFolder trees;
            :mod:`clip_dcl.data.evalsets`), plus an optional ``catalog.json`` for sets not in the
            built-in ELEVATER catalogue.
        datasets: names under ``root`` (default: all found).
        shots, seeds: k per class; one k-shot draw per seed.
        grid: ``"full"`` (the toolkit's, default), ``"reduced"`` (quick runs) or a :class:`SweepGrid`.
        epoch_selection: ``"last"`` (final-run last epoch) or ``"toolkit"`` (best test epoch).
        text_init: initialise the head from the zero-shot text classifier (bias 0).

    Returns:
        Flat metrics: per data set ``{ds}/linear_probe`` (mean over seeds, selected epoch),
        ``{ds}/linear_probe_last``, ``{ds}/linear_probe_toolkit``, ``{ds}/linear_probe_seed{s}``,
        ``{ds}/mean_classifier``, ``{ds}/zeroshot``; and ``average/...`` of each over data sets.
        With ``return_report``, a :class:`FewShotReport` instead.
    """
    from .zeroshot import encode_images, zeroshot_classifier

    if epoch_selection not in ("last", "toolkit"):
        raise ValueError(f"epoch_selection must be 'last' or 'toolkit', got {epoch_selection!r}")
    if isinstance(grid, str):
        if grid not in GRIDS:
            raise ValueError(f"grid must be one of {list(GRIDS)}, got {grid!r}")
        grid = GRIDS[grid]
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds must not be empty")
    if shots < 1:
        raise ValueError(f"shots must be >= 1, got {shots}")
    available = list_fewshot_datasets(root)
    names = list(datasets) if datasets else available
    missing = [n for n in names if n not in available]
    if missing:
        raise ValueError(f"data sets {missing} not found under {str(root)!r} (found: {available})")
    if not names:
        raise ValueError(f"no few-shot data sets under {str(root)!r}")
    catalog = load_catalog(root)
    # Read and check every data set before encoding anything.
    data = {n: read_fewshot_dataset(root, n) for n in names}
    specs = {n: _dataset_spec(data[n], catalog) for n in names}
    for n in names:
        _check_enough_shots(data[n], n, shots)

    probes: list[ProbeResult] = []
    zeroshot: dict[str, float] = {}
    t0 = time.time()
    for name in names:
        d, spec = data[name], specs[name]
        c, multilabel, metric = d.num_classes, spec["multilabel"], spec["metric"]
        train_labels = [ys for _, ys in d.train]
        subsets = {s: sample_few_shot(train_labels, c, shots, s) for s in seeds}
        needed = sorted(set().union(*subsets.values()))
        row = {i: r for r, i in enumerate(needed)}
        transform = preprocess if spec["center_crop"] else _square_transform(model, preprocess)
        x_train = encode_images(model, ImageListDataset([d.train[i][0] for i in needed], d.source, transform),
                                batch_size, device, workers, normalize=False, progress=progress,
                                desc=f"{name} train")
        x_test = encode_images(model, ImageListDataset([r for r, _ in d.test], d.source, transform),
                               batch_size, device, workers, normalize=False, progress=progress,
                               desc=f"{name} test")
        t_test = labels_to_targets([ys for _, ys in d.test], c, multilabel)
        text_w = zeroshot_classifier(model, tokenizer, d.classnames, d.templates or list(DEFAULT_TEMPLATES),
                                     device=device)  # (D, C)
        zeroshot[name] = float(elevater_scores(metric, 100.0 * F.normalize(x_test, dim=-1) @ text_w, t_test))
        if text_init:
            init_w, init_b = text_w.T.contiguous(), torch.zeros(c)
        else:
            init_w, init_b = default_head_init(c, x_train.shape[1])
        for s in seeds:
            idx = [row[i] for i in subsets[s]]
            res = linear_probe(x_train[idx], [train_labels[i] for i in subsets[s]], x_test, t_test, c, metric,
                               multilabel, grid, init_w, init_b, dataset=name, seed=s, shots=shots)
            probes.append(res)
            log.info("%s seed %d: %s %.4f (last) %.4f (best epoch), lr %.0e wd %.1e, mean classifier %.4f",
                     name, s, metric, res.last, res.toolkit, res.best_lr, res.best_wd, res.mean_classifier)
    metrics: dict[str, float] = {}
    for name in names:
        rs = [p for p in probes if p.dataset == name]
        metrics[f"{name}/linear_probe"] = float(np.mean([p.score(epoch_selection) for p in rs]))
        metrics[f"{name}/linear_probe_last"] = float(np.mean([p.last for p in rs]))
        metrics[f"{name}/linear_probe_toolkit"] = float(np.mean([p.toolkit for p in rs]))
        for p in rs:
            metrics[f"{name}/linear_probe_seed{p.seed}"] = p.score(epoch_selection)
        metrics[f"{name}/mean_classifier"] = float(np.mean([p.mean_classifier for p in rs]))
        metrics[f"{name}/zeroshot"] = zeroshot[name]
    for key in ("linear_probe", "linear_probe_last", "linear_probe_toolkit", "mean_classifier", "zeroshot"):
        metrics[f"average/{key}"] = float(np.mean([metrics[f"{n}/{key}"] for n in names]))
    settings = {"shots": shots, "seeds": seeds, "grid": grid.name, "learning_rates": list(grid.lrs),
                "sweep_epochs": grid.epochs, "final_epochs": grid.final_epochs, "refinement_spans": list(grid.spans),
                "epoch_selection": epoch_selection, "text_init": text_init, "val_split": VAL_SPLIT,
                "batch_size_head": BATCH_SIZE, "seconds": round(time.time() - t0, 1)}
    if not return_report:
        return metrics
    return FewShotReport(metrics=metrics, probes=probes, datasets={n: dict(specs[n], num_train=len(data[n].train),
                         num_test=len(data[n].test)) for n in names}, settings=settings)
