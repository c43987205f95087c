"""``decl``: the decomposable contrastive loss with Gamma auxiliary variables (DeCL).

Chen et al., "Why do We Need Large Batchsizes in Contrastive Learning? A Gradient-Bias
Perspective", NeurIPS 2022: Algorithm 1, Eq. 2-3 and Sec. 2.2.3 (stochastic EM). For anchor ``i``
(image anchors against texts and text anchors against images, averaged)::

    r_i     estimate of the rate E_k[S_ik] (expected negative score), no gradient
    u_i     ~ Gamma(shape=1, rate=r_i)        (or its mean 1 / r_i with sample_u=False)
    loss1_i = u_i * mean_{k != i} S_ik - l_ii            (decomposable loss, Alg. 1 line 8)
    loss2_i = -l_ii + logsumexp_j l_ij                   (InfoNCE, the smoothing loss, line 9)
    loss    = lambda_t * mean(loss1) + (1 - lambda_t) * mean(loss2)

In log space, ``u_i * mean_k S_ik = eps_i * exp(lse_neg_i - log K - log r_i)`` with
``eps_i ~ Exponential(1)`` (1 for the mean); only ``log r`` is ever stored. The exponent is clamped
at ``max_log_ratio`` so that a stale rate cannot overflow; ``metrics["clamp_rate"]`` says how often
that bites (those rows get no gradient through their negatives).

Rate estimators (``rate=``):

- ``"index"`` (the paper's global buffer): ``log r`` per training sample and direction, indexed by
  the sample ids the data pipeline carries (``sample_ids=``). With the batch estimate
  ``e_i = lse_neg_i - log K``: first visit ``log r = e_i``; later
  ``log r = log((1 - gamma) r + gamma exp(e_i))``. The buffer is updated *before* it is read, so
  the current batch enters the rate. Every rank keeps an identical replica, updated from the
  all-gathered ``(id, e)`` pairs; a repeated id in one global batch takes its first occurrence's
  estimate (deterministic on every rank).
- ``"queue"`` (no ids needed): a FIFO of the last ``queue_size`` gathered embeddings of each
  modality (detached); ``log r_i = logsumexp`` over the batch negatives and the queue of the other
  modality, minus ``log(count)``. The current batch is enqueued after it is used.
- ``"batch"`` (ablation): ``log r_i = e_i`` from the current global batch alone.

Schedules for ``lambda_t`` (``t`` counts optimizer steps from 1):
``"alternate"`` (the paper's OpenCLIP setting: loss1 at odd t, InfoNCE at even t), ``"decl"``
(``lambda_t = 1``, the paper's ImageNet setting), ``"harmonic"`` (``min(1, lam / t)``, the paper's
``lambda_t ~ 1/t``), ``"constant"`` (``lambda_t = lam``).

Optimizer steps, not calls: OpenCLIP's loop calls the loss ``accum_freq`` times per optimizer step,
each time on all micro-batches' rows. The loss counts its training-mode calls in a buffer; the
first call of each group of ``accum_freq`` updates the state and draws ``u``, the later calls of the
group reuse them, so the accumulated gradient is that of one loss over the whole step.

``u`` is drawn from a generator seeded by ``(seed, t)`` for the whole global batch and sliced per
rank, so a run on W ranks draws the same ``u`` as one process on the concatenated batch.

Written here because no released implementation of DeCL exists for CLIP.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .base import ContrastiveLoss, PairStats, all_gather_cat

RATES = ("index", "queue", "batch")
SCHEDULES = ("alternate", "decl", "harmonic", "constant")


def schedule_lambda(schedule: str, step: int, lam: float) -> float:
    """``lambda_t`` of the stochastic-EM schedule at optimizer step ``step`` (1-based)."""
    if schedule == "alternate":
        return 1.0 if step % 2 == 1 else 0.0
    if schedule == "decl":
        return 1.0
    if schedule == "harmonic":
        return min(1.0, lam / step)
    if schedule == "constant":
        return lam
    raise ValueError(f"schedule={schedule!r} is not one of {SCHEDULES}")


def moving_average_log_rate(old: torch.Tensor, new: torch.Tensor, gamma: float) -> torch.Tensor:
    """``log((1 - gamma) exp(old) + gamma exp(new))``, and ``new`` where ``old`` is NaN (unvisited)."""
    if gamma >= 1.0:
        return new.clone()
    mixed = torch.logaddexp(old + math.log1p(-gamma), new + math.log(gamma))
    return torch.where(torch.isnan(old), new, mixed)


def first_occurrence(ids: torch.Tensor) -> torch.Tensor:
    """Positions of the first occurrence of each distinct id (deterministic on every device)."""
    order = torch.argsort(ids, stable=True)
    sorted_ids = ids[order]
    keep = torch.ones_like(sorted_ids, dtype=torch.bool)
    keep[1:] = sorted_ids[1:] != sorted_ids[:-1]
    return order[keep]


class DeCLLoss(ContrastiveLoss):
    """Decomposable contrastive loss (``decl``), both directions, state in registered buffers.

    Args:
        rate: ``"index"`` (per-sample buffer, needs ``num_samples`` and ``sample_ids``),
            ``"queue"`` or ``"batch"``; see the module docstring.
        schedule: ``"alternate"``, ``"decl"``, ``"harmonic"`` or ``"constant"``.
        lam: ``lambda`` for ``constant`` (in [0, 1]) and ``c`` of ``harmonic`` (> 0).
        gamma: moving-average weight of the new estimate for ``rate="index"``, in (0, 1].
        sample_u: draw ``u ~ Gamma(1, r)`` (True) or use its mean ``1 / r`` (False).
        num_samples: size of the ``index`` buffer (ids must lie in ``[0, num_samples)``).
        queue_size: length of the ``queue`` FIFO per modality.
        accum_freq: loss calls per optimizer step (OpenCLIP's ``--accum-freq``).
        max_log_ratio: ceiling on ``lse_neg - log K - log r`` before ``exp``.
        seed: seed of the ``u`` draws.
        local_loss, gather_with_grad, rank, world_size: as OpenCLIP's ``ClipLoss``.

    Attributes:
        metrics: ``lambda_t``, ``loss1``, ``loss2`` (each averaged over directions), ``mean_log_rate``
            and ``clamp_rate``, from the last call.
        calls: buffer, training-mode calls so far (``t = calls // accum_freq + 1``).
        log_rate: buffer ``(2, num_samples)`` of ``log r`` (image, text), NaN where unvisited (index).
        queue, queue_ptr, queue_count: FIFO buffers (queue).

    Raises:
        ValueError: an unknown ``rate``/``schedule``, ``num_samples`` missing for ``index``, or an
            argument out of range (the message names it); at call time, ``sample_ids`` missing or
            out of range for ``index``.

    Example::

        loss = DeCLLoss(rate="index", num_samples=len(dataset), schedule="alternate")
        value = loss(image_features, text_features, logit_scale, sample_ids=ids)
        loss.metrics["lambda_t"], loss.metrics["loss1"]
    """

    output_key = "decl_loss"

    def __init__(self, rate: str = "index", schedule: str = "alternate", lam: float = 1.0, gamma: float = 0.9,
                 sample_u: bool = True, num_samples: Optional[int] = None, queue_size: int = 4096,
                 accum_freq: int = 1, max_log_ratio: float = 20.0, seed: int = 0, **dist_kwargs):
        super().__init__(**dist_kwargs)
        if rate not in RATES:
            raise ValueError(f"rate={rate!r} is not one of {RATES}")
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule={schedule!r} is not one of {SCHEDULES}")
        if schedule == "constant" and not 0.0 <= lam <= 1.0:
            raise ValueError(f"lam={lam!r} must be in [0, 1] for schedule='constant'")
        if schedule == "harmonic" and not lam > 0:
            raise ValueError(f"lam={lam!r} must be > 0 for schedule='harmonic' (lambda_t = min(1, lam / t))")
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma={gamma!r} is outside (0, 1]")
        if rate == "index":
            if num_samples is None:
                raise ValueError("num_samples is required for rate='index' (the size of the per-sample rate "
                                 "buffer); or use rate='queue' or rate='batch', which need no sample ids")
            if int(num_samples) < 1:
                raise ValueError(f"num_samples={num_samples!r} must be >= 1")
        if rate == "queue" and int(queue_size) < 1:
            raise ValueError(f"queue_size={queue_size!r} must be >= 1 for rate='queue'")
        if int(accum_freq) < 1:
            raise ValueError(f"accum_freq={accum_freq!r} must be >= 1")
        if not max_log_ratio > 0:
            raise ValueError(f"max_log_ratio={max_log_ratio!r} must be > 0")
        self.rate = rate
        self.schedule = schedule
        self.lam = float(lam)
        self.gamma = float(gamma)
        self.sample_u = bool(sample_u)
        self.num_samples = int(num_samples) if num_samples is not None else None
        self.queue_size = int(queue_size)
        self.accum_freq = int(accum_freq)
        self.max_log_ratio = float(max_log_ratio)
        self.seed = int(seed)
        self.requires_sample_ids = rate == "index"
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        if rate == "index":
            self.register_buffer("log_rate", torch.full((2, self.num_samples), float("nan")))
        if rate == "queue":
            # (2, Q, d): queue[0] holds text embeddings (negatives of image anchors), queue[1] images.
            # d is known at the first call; an empty buffer until then (see _load_from_state_dict).
            self.register_buffer("queue", torch.zeros(2, self.queue_size, 0))
            self.register_buffer("queue_ptr", torch.zeros((), dtype=torch.long))
            self.register_buffer("queue_count", torch.zeros((), dtype=torch.long))
        self._step_cache = None

    # -- state -------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        """Optimizer step ``t`` (1-based) that the next training call belongs to."""
        return int(self.calls) // self.accum_freq + 1

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "queue"
        if self.rate == "queue" and key in state_dict and state_dict[key].shape != self.queue.shape:
            self.queue = torch.zeros_like(state_dict[key], device=self.queue.device)
        self._step_cache = None
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # -- rate estimators ---------------------------------------------------------------------
    def _batch_estimates(self, st: PairStats) -> torch.Tensor:
        # e_i = log mean_{k != i} S_ik, shape (2, n)
        return torch.stack([st.image.lse_neg, st.text.lse_neg]).detach() - math.log(st.num_negatives)

    def _index_log_rate(self, st: PairStats, sample_ids, n_rows: int, update: bool) -> torch.Tensor:
        if sample_ids is None:
            raise ValueError("rate='index' needs sample_ids= (a LongTensor of the local rows' sample ids)")
        ids = torch.as_tensor(sample_ids).to(device=self.log_rate.device, dtype=torch.long).reshape(-1)
        all_ids = all_gather_cat(ids, self.world_size)
        if all_ids.numel() != st.all_image_features.shape[0]:
            raise ValueError(f"sample_ids has {ids.numel()} entries but the features have "
                             f"{st.all_image_features.shape[0] // self.world_size} rows; pass one id per row")
        bad = (all_ids < 0) | (all_ids >= self.num_samples)
        if bool(bad.any()):
            worst = int(all_ids[bad][0])
            raise ValueError(f"sample id {worst} is outside [0, num_samples={self.num_samples}); "
                             "raise num_samples (--decl-num-samples) to exceed the largest sample id")
        row_ids = all_ids if n_rows == all_ids.numel() else ids
        if update:
            e = self._batch_estimates(st).to(self.log_rate)  # (2, n_rows)
            if n_rows != all_ids.numel():  # local_loss: each rank estimated its own anchors only
                e = all_gather_cat(e, self.world_size, dim=1)
            keep = first_occurrence(all_ids)
            upd_ids = all_ids[keep]
            self.log_rate[:, upd_ids] = moving_average_log_rate(self.log_rate[:, upd_ids], e[:, keep], self.gamma)
        return self.log_rate[:, row_ids]

    def _queue_log_rate(self, st: PairStats, anchors, update: bool) -> torch.Tensor:
        dim = st.all_image_features.shape[1]
        if self.queue.shape[-1] != dim:
            if int(self.queue_count) > 0:
                raise ValueError(f"feature dim {dim} differs from the queue's {self.queue.shape[-1]}")
            self.queue = torch.zeros(2, self.queue_size, dim, device=st.all_image_features.device)
        count = int(self.queue_count)
        log_r = []
        for d, (stats, anchor) in enumerate(zip((st.image, st.text), anchors)):
            lse = stats.lse_neg.detach()
            if count:
                with torch.no_grad():
                    q = self.queue[d, :count].to(anchor)
                    lse = torch.logaddexp(lse, torch.logsumexp((st.logit_scale.detach() * anchor.detach()) @ q.T, 1))
            log_r.append(lse - math.log(st.num_negatives + count))
        if update:
            with torch.no_grad():
                for d, feats in enumerate((st.all_text_features, st.all_image_features)):
                    feats = feats.detach()[-self.queue_size:].to(self.queue)
                    idx = (int(self.queue_ptr) + torch.arange(feats.shape[0])) % self.queue_size
                    self.queue[d, idx.to(self.queue.device)] = feats
                self.queue_ptr.fill_((int(self.queue_ptr) + feats.shape[0]) % self.queue_size)
                self.queue_count.fill_(min(self.queue_size, count + feats.shape[0]))
        return torch.stack(log_r)

    def _draw_eps(self, step: int, n_rows: int, row_offset: int, global_rows: int, device, dtype):
        if not self.sample_u:
            return torch.ones(2, n_rows, device=device, dtype=dtype)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        eps = torch.empty(2, global_rows, dtype=torch.float64).exponential_(1.0, generator=gen)
        return eps[:, row_offset:row_offset + n_rows].to(device=device, dtype=dtype)

    # -- the loss ----------------------------------------------------------------------------
    def compute(self, image_features, text_features, logit_scale, logit_bias, sample_ids):
        st = self.stats(image_features, text_features, logit_scale, logit_bias)
        n_rows = st.image.pos.shape[0]
        training = self.training
        calls = int(self.calls)
        step = calls // self.accum_freq + 1
        first_call = calls % self.accum_freq == 0 or not training
        cache = self._step_cache
        if first_call or cache is None or cache[0] != step or cache[1].shape[1] != n_rows:
            local_rows = self.local_loss and self.world_size > 1
            anchors = (image_features, text_features) if local_rows else (st.all_image_features,
                                                                          st.all_text_features)
            update = training
            with torch.no_grad():
                if self.rate == "index":
                    log_r = self._index_log_rate(st, sample_ids, n_rows, update)
                elif self.rate == "queue":
                    log_r = self._queue_log_rate(st, [a.to(st.all_image_features) for a in anchors], update)
                else:
                    log_r = self._batch_estimates(st)
                log_r = log_r.to(device=st.image.pos.device, dtype=st.image.pos.dtype)
                eps = self._draw_eps(step, n_rows, st.row_offset, st.all_image_features.shape[0],
                                     st.image.pos.device, st.image.pos.dtype)
            cache = (step, log_r, eps)
            self._step_cache = cache if training else None
        _, log_r, eps = cache
        if training:
            self.calls += 1

        lam_t = schedule_lambda(self.schedule, step, self.lam)
        loss1_dirs, loss2_dirs, clamped = [], [], []
        for d, stats in enumerate((st.image, st.text)):
            log_ratio = stats.lse_neg - math.log(st.num_negatives) - log_r[d]
            clamped.append(log_ratio.detach() > self.max_log_ratio)
            loss1_dirs.append((eps[d] * torch.exp(log_ratio.clamp(max=self.max_log_ratio)) - stats.pos).mean())
            loss2_dirs.append((torch.logaddexp(stats.pos, stats.lse_neg) - stats.pos).mean())
        loss1 = (loss1_dirs[0] + loss1_dirs[1]) / 2
        loss2 = (loss2_dirs[0] + loss2_dirs[1]) / 2
        loss = lam_t * loss1 + (1.0 - lam_t) * loss2
        metrics = {
            "lambda_t": lam_t,
            "loss1": loss1.detach(),
            "loss2": loss2.detach(),
            "mean_log_rate": log_r[torch.isfinite(log_r)].mean() if bool(torch.isfinite(log_r).any())
            else torch.tensor(float("nan")),
            "clamp_rate": torch.cat(clamped).float().mean(),
        }
        return loss, metrics

    def extra_repr(self) -> str:
        return (f"rate={self.rate!r}, schedule={self.schedule!r}, lam={self.lam}, gamma={self.gamma}, "
                f"sample_u={self.sample_u}, num_samples={self.num_samples}, queue_size={self.queue_size}, "
                f"accum_freq={self.accum_freq}, " + super().extra_repr())
