"""The ELEVATER toolkit's linear-probe head ``Linear(BatchNorm1d(f(x), affine=False))`` and lr x wd sweep
(``full_model_finetune.py``) on frozen features, and Arora et al.'s mean classifier. Every run sees the same
batches (seeded 0, no augmentation), so a sweep round trains as one stack of heads. Ours: SGD with momentum ``m``
on the weight decay alone diverges when ``lr * wd >= 2 (1 + m)``, so such pairs score NaN untrained and a diverged
final run falls back to the next-best pair; grid ``toolkit-exact`` scores diverged heads as the toolkit does.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .kshot import split_train_val
from .metrics import elevater_scores

log = logging.getLogger(__name__)

BATCH_SIZE = 64
BN_MOMENTUM = 0.1
BN_EPS = 1e-5
SGD_MOMENTUM = 0.9
#: Below this many multiply-adds per step (heads x batch x classes x dim) heads train on one thread.
SINGLE_THREAD_WORK = 1 << 24


def epoch_batches(n: int, epochs: int, batch_size: int = BATCH_SIZE, seed: int = 0) -> list[list[torch.Tensor]]:
    """Index batches per epoch of a shuffled ``DataLoader(range(n), batch_size)`` seeded ``seed``, size-1 batches
    dropped; the generator's draws are replayed without building the loader."""
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
    score_diverged: bool = False,
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """Train H = len(lrs) heads at once: ``(eval set -> (epochs, H) scores, weights (H, C, D), biases (H, C))``; a
    head that turns non-finite scores NaN from then on, or by the toolkit's rule with ``score_diverged``."""
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
        return _train_heads(
            x, y, lrs, wds, batches, init_weight, init_bias, eval_sets, metric, multilabel, score_diverged
        )
    finally:
        if small:
            torch.set_num_threads(threads)


def _train_heads(x, y, lrs, wds, batches, init_weight, init_bias, eval_sets, metric, multilabel, score_diverged):
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
                loss = F.binary_cross_entropy_with_logits(logits, yf[idx][None].expand(h, -1, -1), reduction="sum") / (
                    nb * c
                )
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
                epoch_scores = elevater_scores(
                    metric,
                    torch.matmul(xn, w.transpose(1, 2)) + b[:, None, :],
                    ye,
                    nan_rule="toolkit" if score_diverged else "zero",
                )
                keep = alive | score_diverged
                scores[name][epoch] = torch.where(keep, epoch_scores.double(), float("nan"))
    return scores, w.detach(), b.detach()


@dataclass(frozen=True)
class SweepGrid:
    """Learning rates, weight-decay grid, coarse indices, refinement spans, epochs per run; ``exact``: the
    toolkit's handling of diverged heads."""

    name: str
    lrs: tuple[float, ...]
    wds: tuple[float, ...]
    coarse: tuple[int, ...]
    spans: tuple[int, ...]
    epochs: int = 10
    final_epochs: int = 50
    exact: bool = False


_WD_GRID = tuple(np.logspace(-6, 6, 97).tolist())
#: The toolkit's grid: 6 lrs x (7 coarse + refinement +-8/4/2/1) weight decays, 10 epochs a run.
FULL_GRID = SweepGrid("full", tuple(np.logspace(-6, -1, 6).tolist()), _WD_GRID, tuple(range(0, 97, 16)), (8, 4, 2, 1))
#: Quick runs: 3 lrs (1e-3, 1e-2, 1e-1) x (7 coarse + refinement +-8/4) weight decays.
REDUCED_GRID = SweepGrid("reduced", (1e-3, 1e-2, 1e-1), _WD_GRID, tuple(range(0, 97, 16)), (8, 4))
#: The toolkit's grid run exactly as the toolkit runs it: unstable pairs trained, no fallback.
TOOLKIT_EXACT_GRID = SweepGrid("toolkit-exact", FULL_GRID.lrs, _WD_GRID, FULL_GRID.coarse, FULL_GRID.spans, exact=True)
GRIDS = {"full": FULL_GRID, "reduced": REDUCED_GRID, "toolkit-exact": TOOLKIT_EXACT_GRID}


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
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    x_val: torch.Tensor,
    y_val: torch.Tensor,
    grid: SweepGrid,
    metric: str,
    multilabel: bool,
    init_weight: torch.Tensor,
    init_bias: torch.Tensor,
) -> SweepResult:
    """The toolkit's ``hyperparameter_sweep_lr`` over ``grid``; a pair is trained once (runs are deterministic)."""
    batches = epoch_batches(len(x_train), grid.epochs)
    cache: dict[tuple[int, int], float] = {}
    runs: list[dict] = []

    def run(pairs):
        todo = [p for p in dict.fromkeys(pairs) if p not in cache]
        for i, j in [p for p in todo if not grid.exact and not stable(grid.lrs[p[0]], grid.wds[p[1]])]:
            cache[(i, j)] = float("nan")
            runs.append(
                {"lr": grid.lrs[i], "wd": grid.wds[j], "wd_index": j, "val_score": float("nan"), "unstable": True}
            )
        todo = [p for p in todo if p not in cache]
        if not todo:
            return
        scores, _, _ = train_heads(
            x_train,
            y_train,
            [grid.lrs[i] for i, _ in todo],
            [grid.wds[j] for _, j in todo],
            batches,
            init_weight,
            init_bias,
            {"val": (x_val, y_val)},
            metric,
            multilabel,
            score_diverged=grid.exact,
        )
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


def mean_classifier_logits(
    x_train: torch.Tensor, t_train: torch.Tensor, x_test: torch.Tensor, num_classes: int
) -> torch.Tensor:
    """Arora et al. (2019), Definition 2.1: ``100 f(x)^T mu_c``, ``mu_c`` the mean normalised embedding of class c
    (0 without examples); 100 is CLIP's logit scale, which the softmax metrics see."""
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
    #: images the final run trains on: n_train + n_val when merged (the toolkit's default), n_train at 1 shot
    n_final: int
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
    x_subset: torch.Tensor,
    labels_subset: Sequence[Sequence[int]],
    x_test: torch.Tensor,
    t_test: torch.Tensor,
    num_classes: int,
    metric: str,
    multilabel: bool,
    grid: SweepGrid,
    init_weight: torch.Tensor,
    init_bias: torch.Tensor,
    dataset: str = "",
    seed: int = 0,
    shots: int = 0,
    merge_final: bool = True,
) -> ProbeResult:
    """Split, sweep, final run (on train + validation with ``merge_final``) and mean classifier of one k-shot
    subset (features in subset order)."""
    t_subset = labels_to_targets(labels_subset, num_classes, multilabel)
    tr, va = split_train_val(labels_subset, num_classes, multilabel)
    sweep = sweep_hyperparameters(
        x_subset[tr], t_subset[tr], x_subset[va], t_subset[va], grid, metric, multilabel, init_weight, init_bias
    )
    final = list(range(len(x_subset))) if merge_final else tr
    x_final, t_final = x_subset[final], t_subset[final]
    batches = epoch_batches(len(final), grid.final_epochs)
    # The selected pair first, then the other trained pairs by validation score (stable sort:
    # the toolkit's order breaks ties), in case the 50-epoch final run diverges (not with an
    # exact grid: the toolkit reports the selected pair's run, whatever it gives).
    ranked = sorted(
        (
            r
            for r in sweep.runs
            if math.isfinite(r["val_score"]) and (r["lr"], r["wd"]) != (sweep.best_lr, sweep.best_wd)
        ),
        key=lambda r: -r["val_score"],
    )
    candidates = [(sweep.best_lr, sweep.best_wd, sweep.best_score)]
    if not grid.exact:
        candidates += [(r["lr"], r["wd"], r["val_score"]) for r in ranked]
    runs = list(sweep.runs)
    for lr, wd, val_score in candidates:
        scores, _, _ = train_heads(
            x_final,
            t_final,
            [lr],
            [wd],
            batches,
            init_weight,
            init_bias,
            {"test": (x_test, t_test)},
            metric,
            multilabel,
            score_diverged=grid.exact,
        )
        if not bool(torch.isnan(scores["test"]).any()):
            break
        runs.append({"lr": lr, "wd": wd, "final_run_diverged": True})
        log.warning(
            "%s seed %d: the final run at lr=%g wd=%g diverged; taking the next-best sweep pair", dataset, seed, lr, wd
        )
    mc = elevater_scores(metric, mean_classifier_logits(x_final, t_final, x_test, num_classes), t_test)
    return ProbeResult(
        dataset=dataset,
        seed=seed,
        metric=metric,
        shots=shots,
        n_train=len(tr),
        n_val=len(va),
        n_test=len(x_test),
        n_final=len(final),
        best_lr=lr,
        best_wd=wd,
        val_score=val_score,
        test_scores=scores["test"][:, 0].tolist(),
        mean_classifier=float(mc),
        runs=runs,
    )
