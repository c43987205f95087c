"""DeCL's rate estimators: where each anchor's rate ``r_i`` (its expected negative score) comes from.

Each owns its buffers (registered on the loss), their layout across ranks, its checks, a step's
update and its undo. ``e_i`` is the anchor's batch estimate (``lse_neg_i - log K``, less ``l_ii`` for
the relative estimate); only ``log r`` is stored, and non-finite estimates are dropped and counted.

- `IndexRate` (``index``, the paper's global buffer, Chen et al. 2022 Alg. 1): ``log r`` per sample
  and direction. Update, then read (default, as SogCLR and FastCLIP):
  ``log r <- log((1 - gamma_t) r + gamma_t exp(e_i))``, then loss1 reads it, so the weight
  ``exp(e_i - log r_i)`` is at most ``1 / gamma_t``. Read, then update (the paper's wording): loss1
  reads earlier visits' rate; a first visit reads its own ``e_i`` or the previous step's mean.
  Drift correction stores each rate relative to its step's mean estimate and reads it at the latest
  one. ``sharded`` keeps ids ``i mod W = r`` on rank ``r``; one all-reduce a step, where exactly one
  owner adds each value, gives every rank the batch's rates, bit for bit as ``replicated``.
- `QueueRate` (``queue``, no ids): ``log r_i`` is the logsumexp over a FIFO of the other modality's
  last ``queue_size`` embeddings less ``log(count)``; the batch is enqueued after use.
- `BatchRate` (``batch``, the ablation): ``log r_i = e_i``, the coupling DeCL is meant to remove.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch
import torch.distributed as dist

from .base import SampleIdError, StateBuffer
from .gather import PairStats, all_gather_cat
from .state import STATE_DTYPES, reshard, shard_size

STATES = ("sharded", "replicated")
FIRST_VISITS = ("batch", "mean")


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


class RateEstimator:
    """One way of estimating ``log r``; ``host`` is the loss whose buffers it registers and reads."""

    name = ""
    requires_sample_ids = False
    has_gamma = False  #: whether ``gamma`` (and its schedule) means something to it
    #: the loss's keyword arguments that the saved state of this estimator depends on
    state_settings: Tuple[str, ...] = ()
    #: the loss's keyword arguments that only this estimator reads
    reads: Tuple[str, ...] = ()

    def __init__(self, host):
        self.host = host
        self.undo = None  # what the last step's update overwrote
        self.dropped = None  # non-finite estimates or embeddings of the last step left out of the state

    def begin_step(self) -> None:
        self.undo = self.dropped = None

    def buffers(self) -> Tuple[StateBuffer, ...]:
        return ()

    def rollback(self) -> None:
        """Undo the last step's update (see `rollback_step`)."""

    def adapt_loaded(self, state_dict, prefix: str) -> None:
        """Fit a ``state_dict`` being loaded to this estimator's buffers (in place)."""

    def step_metrics(self, fresh, gamma: float, training: bool) -> Dict[str, object]:
        if not training:
            return {}
        # estimates (index) or embeddings (queue, two per pair) of this step left out of the state
        return {"nonfinite_dropped": self.dropped if self.dropped is not None else torch.zeros(())}


class BatchRate(RateEstimator):
    name = "batch"

    def log_rates(self, st: PairStats, sample_ids, n_rows: int, update: bool, gamma: float, anchors):
        return [e.detach() for e in self.host.live_estimates(st)], None

    def step_metrics(self, fresh, gamma, training):
        return {}


class QueueRate(RateEstimator):
    name = "queue"
    state_settings = ("queue_size",)
    reads = ("queue_size", "include_current")

    def __init__(self, host, queue_size: int, include_current: bool, device):
        super().__init__(host)
        if int(queue_size) < 1:
            raise ValueError(f"queue_size={queue_size!r} must be >= 1 for rate='queue'")
        self.queue_size, self.include_current = int(queue_size), include_current
        # (2, Q, d): queue[0] holds text embeddings (negatives of image anchors), queue[1] images.
        # d is known at the first call; an empty buffer until then (see adapt_loaded).
        host.register_buffer("queue", torch.zeros(2, self.queue_size, 0, device=device))
        host.register_buffer("queue_ptr", torch.zeros((), dtype=torch.long, device=device))
        host.register_buffer("queue_count", torch.zeros((), dtype=torch.long, device=device))

    def buffers(self):
        h = self.host
        return (
            StateBuffer("queue", h.queue.dtype, tuple(h.queue.shape)),
            StateBuffer("queue_ptr", torch.long, ()),
            StateBuffer("queue_count", torch.long, ()),
        )

    def adapt_loaded(self, state_dict, prefix):
        key = prefix + "queue"
        if key in state_dict and state_dict[key].shape != self.host.queue.shape:
            self.host.queue = torch.zeros_like(state_dict[key], device=self.host.queue.device)

    def log_rates(self, st: PairStats, sample_ids, n_rows, update, gamma, anchors):
        h = self.host
        anchors = [a.to(st.all_image_features) for a in anchors]
        dim = st.all_image_features.shape[1]
        if h.queue.shape[-1] != dim:
            if int(h.queue_count) > 0:
                raise ValueError(f"feature dim {dim} differs from the queue's {h.queue.shape[-1]}")
            h.queue = torch.zeros(2, self.queue_size, dim, device=st.all_image_features.device)
        count = int(h.queue_count)
        log_r = []
        for d, (stats, anchor) in enumerate(zip((st.image, st.text), anchors)):
            shift = h.positive(stats).detach() if h.estimate == "relative" else 0.0
            if not count:  # the first step: nothing earlier to read
                log_r.append(stats.lse_neg.detach() - math.log(stats.num_negatives) - shift)
                continue
            with torch.no_grad():
                q = h.queue[d, :count].to(anchor)
                scaled = st.logit_scale.detach() * anchor.detach()
                # rows of the (n, Q) scores a tile at a time: the queue is as long as a batch
                rows = scaled.split(h.tile_for(anchor) or scaled.shape[0])
                lse_q = torch.cat([torch.logsumexp(part @ q.T, 1) for part in rows])
            if self.include_current:  # the batch's negatives counted with the queue's
                log_r.append(
                    torch.logaddexp(stats.lse_neg.detach(), lse_q) - math.log(stats.num_negatives + count) - shift
                )
            else:
                log_r.append(lse_q - math.log(count) - shift)
        if update:
            with torch.no_grad():
                # one caption per image (the first of its M), so that both queues advance by G
                texts = st.all_text_features[:: st.captions_per_image].detach()
                images = st.all_image_features.detach()
                # only finite pairs are queued: a NaN or inf embedding would poison every later rate
                ok = torch.isfinite(texts).all(dim=1) & torch.isfinite(images).all(dim=1)
                if not bool(ok.all()):
                    texts, images = texts[ok], images[ok]
                self.dropped = (~ok).sum() * 2
                n = min(texts.shape[0], self.queue_size)
                idx = ((int(h.queue_ptr) + torch.arange(n)) % self.queue_size).to(h.queue.device)
                self.undo = (int(h.queue_ptr), count, idx, h.queue[:, idx].clone())
                for d, feats in enumerate((texts, images)):
                    h.queue[d, idx] = feats[texts.shape[0] - n :].to(h.queue)
                h.queue_ptr.fill_((int(h.queue_ptr) + n) % self.queue_size)
                h.queue_count.fill_(min(self.queue_size, count + n))
        return log_r, None

    def rollback(self):
        if self.undo is not None:
            ptr, count, idx, rows = self.undo
            self.host.queue[:, idx] = rows
            self.host.queue_ptr.fill_(ptr)
            self.host.queue_count.fill_(count)


class IndexRate(RateEstimator):
    name = "index"
    requires_sample_ids = True
    has_gamma = True
    state_settings = ("estimate", "drift_correction", "state_dtype")
    reads = ("gamma", "gamma_schedule", "first_visit", "drift_correction", "state", "state_dtype", "include_current")

    def __init__(
        self,
        host,
        num_samples,
        include_current: bool,
        first_visit: str,
        drift_correction: bool,
        state: str,
        state_dtype: str,
        device,
    ):
        super().__init__(host)
        if int(num_samples) < 1:  # None is refused by DeCLLoss
            raise ValueError(f"num_samples={num_samples!r} must be >= 1")
        self.num_samples = int(num_samples)
        self.include_current, self.first_visit, self.drift_correction = include_current, first_visit, drift_correction
        #: the buffer is split over the ranks (with one rank, sharded and replicated coincide)
        self.sharded = state == "sharded" and host.world_size > 1
        cols = shard_size(self.num_samples, host.rank, host.world_size) if self.sharded else self.num_samples
        host.register_buffer(
            "log_rate", torch.full((2, cols), float("nan"), dtype=STATE_DTYPES[state_dtype], device=device)
        )
        host.register_buffer("prev_log_rate", torch.full((2,), float("nan"), device=device))

    def buffers(self):
        h = self.host
        return (
            StateBuffer("log_rate", h.log_rate.dtype, (2, self.num_samples), per_sample=True, sharded=self.sharded),
            StateBuffer("prev_log_rate", h.prev_log_rate.dtype, (2,)),
        )

    def step_metrics(self, fresh, gamma, training):
        out = {"gamma_t": gamma}
        if not self.include_current:  # update-then-read writes every entry before reading it: no first visits
            out["first_visit_rate"] = fresh.float().mean()
        return {**out, **super().step_metrics(fresh, gamma, training)}

    def rollback(self):
        if self.undo is not None:
            ids, old, level = self.undo
            self._write_rates(ids, old)
            self.host.prev_log_rate.copy_(level)

    def adapt_loaded(self, state_dict, prefix):
        key = prefix + "prev_log_rate"
        if prefix + "log_rate" in state_dict and key not in state_dict:
            # a checkpoint without a level holds absolute log-rates: made relative to the mean of the visited
            # entries (which becomes the level) when drift correction is on
            rates = state_dict[prefix + "log_rate"]
            finite = torch.isfinite(rates)
            level = torch.stack(
                [
                    rates[d][finite[d]].mean() if bool(finite[d].any()) else torch.tensor(float("nan"))
                    for d in range(rates.shape[0])
                ]
            )
            if self.drift_correction:
                state_dict[prefix + "log_rate"] = rates - level[:, None].to(rates)
            state_dict[key] = level.to(torch.float32)
        key = prefix + "log_rate"
        if key in state_dict:
            state_dict[key] = self._own_columns(state_dict[key])

    def _own_columns(self, table: torch.Tensor) -> torch.Tensor:
        """``table`` as this rank's buffer (its own columns of a whole ``(2, num_samples)`` table when sharded)."""
        h = self.host
        want = tuple(h.log_rate.shape)
        if tuple(table.shape) == want:
            return table
        layout = (
            f"sharded, rank {h.rank} of {h.world_size}: {want[1]} columns"
            if self.sharded
            else "replicated: all of them"
        )
        if self.sharded and tuple(table.shape) == (2, self.num_samples):
            out = torch.empty(want, dtype=table.dtype)
            return reshard([(0, 1, lambda: table)], self.num_samples, h.rank, h.world_size, out)
        raise ValueError(
            f"the saved log_rate has shape {tuple(table.shape)}, but this loss has num_samples="
            f"{self.num_samples} ({layout}); resume with the --decl-num-samples it was trained with, with "
            "--decl-grow-state (the data set grew: the new ids start unvisited) or with --loss-reset"
        )

    def full_table(self) -> torch.Tensor:
        h = self.host
        if not self.sharded:
            return h.log_rate.clone()
        width = shard_size(self.num_samples, 0, h.world_size)
        padded = torch.full((2, width), float("nan"), dtype=h.log_rate.dtype, device=h.log_rate.device)
        padded[:, : h.log_rate.shape[1]] = h.log_rate
        parts = [torch.empty_like(padded) for _ in range(h.world_size)]
        dist.all_gather(parts, padded)
        # column j of rank r is id r + W j: interleave the shards
        return torch.stack(parts, dim=2).reshape(2, -1)[:, : self.num_samples].clone()

    def _read_rates(self, ids: torch.Tensor, local_rows: Optional[torch.Tensor] = None, row_offset: int = 0):
        """Stored relative rates of the global batch's ``ids`` (``(2, G)``), on every rank.

        Sharded, with ``local_rows``, the same all-reduce gathers every rank's estimates too:
        ``(rates, estimates)``.
        """
        h = self.host
        work = h.prev_log_rate.dtype
        if not self.sharded:
            return h.log_rate[:, ids].to(work), None
        mine = ids % h.world_size == h.rank
        vals = torch.zeros(2 if local_rows is None else 4, ids.numel(), dtype=work, device=h.log_rate.device)
        vals[:2, mine] = h.log_rate[:, ids[mine] // h.world_size].to(work)
        if local_rows is not None:
            vals[2:, row_offset : row_offset + local_rows.shape[1]] = local_rows
        dist.all_reduce(vals)  # one rank adds each value, every other rank adds 0: exact
        return vals[:2], (None if local_rows is None else vals[2:])

    def _write_rates(self, ids: torch.Tensor, values: torch.Tensor) -> None:
        """Store ``values`` for the distinct ``ids`` this rank keeps.

        They are computed for the whole batch and then cut: CPU kernels round a vector's tail differently
        from its body, so computing on the owned subset would differ from replication in the last bit.
        """
        h = self.host
        if self.sharded:
            mine = ids % h.world_size == h.rank
            ids, values = ids[mine] // h.world_size, values[:, mine]
        h.log_rate[:, ids] = values.to(h.log_rate.dtype)

    def _check_ids(self, sample_ids, st: PairStats) -> Tuple[torch.Tensor, torch.Tensor]:
        h = self.host
        if sample_ids is None:
            raise ValueError("rate='index' needs sample_ids= (a LongTensor of the local rows' sample ids)")
        ids = torch.as_tensor(sample_ids).to(device=h.log_rate.device, dtype=torch.long).reshape(-1)
        all_ids = all_gather_cat(ids, h.world_size)
        if all_ids.numel() != st.all_image_features.shape[0]:
            raise ValueError(
                f"sample_ids has {ids.numel()} entries but the features have "
                f"{st.all_image_features.shape[0] // h.world_size} rows; pass one id per row"
            )
        # checked on the gathered ids, so that every rank raises (none is left waiting in a collective)
        if bool((all_ids < 0).any()):
            raise SampleIdError(
                f"sample id {int(all_ids[all_ids < 0][0])} is negative: ids index the per-sample "
                f"rate buffer [0, num_samples={self.num_samples}) and must be >= 0"
            )
        if bool((all_ids >= self.num_samples).any()):
            worst = int(all_ids.max())
            raise SampleIdError(
                f"sample id {worst} is outside [0, num_samples={self.num_samples}); raise "
                "num_samples (--decl-num-samples) to exceed the largest sample id"
            )
        return ids, all_ids

    def log_rates(self, st: PairStats, sample_ids, n_rows: int, update: bool, gamma: float, anchors):
        """``(log r of the rows, mask of rows on their first visit)``; updates the buffer when ``update``."""
        h = self.host
        _, all_ids = self._check_ids(sample_ids, st)
        work = h.prev_log_rate.dtype
        rows = slice(None) if n_rows == all_ids.numel() else slice(st.row_offset, st.row_offset + n_rows)
        e_rows = h.batch_estimates(st).to(work)  # (2, n_rows): this step's estimates
        if n_rows == all_ids.numel():  # every rank holds all rows
            stored, _ = self._read_rates(all_ids)  # (2, G): read before this step's update
            e_all = e_rows
        elif self.sharded:
            stored, e_all = self._read_rates(all_ids, e_rows, st.row_offset)
        else:
            stored, _ = self._read_rates(all_ids)
            e_all = all_gather_cat(e_rows, h.world_size, dim=1)
        keep = first_occurrence(all_ids)  # sorted by id
        upd_ids = all_ids[keep]

        def fold_in():
            e_keep, old = e_all[:, keep], stored[:, keep]
            # only finite estimates are folded in (a NaN or inf feature would poison the rates, and NaN
            # also means "unvisited"); the level m_t is their mean, the previous level when there is none
            finite = torch.isfinite(e_keep)
            n_finite = finite.sum(dim=1)
            level = torch.where(
                finite.all(dim=1),
                e_keep.mean(dim=1),  # m_t: this step's mean estimate
                torch.where(finite, e_keep, 0.0).sum(dim=1) / n_finite.clamp(min=1),
            )
            level = torch.where(n_finite > 0, level, h.prev_log_rate)
            new = e_keep - level[:, None] if self.drift_correction else e_keep
            updated = torch.where(finite, moving_average_log_rate(old, new, gamma), old)
            self.undo = (upd_ids, old.clone(), h.prev_log_rate.clone())
            self.dropped = (~finite).sum()
            self._write_rates(upd_ids, updated)
            h.prev_log_rate.copy_(level)
            return updated

        log_r = stored[:, rows]
        if update and self.include_current:  # the current estimate enters the rate it is scored with
            updated = fold_in().to(h.log_rate.dtype).to(work)  # as stored
            position = torch.searchsorted(upd_ids, all_ids)  # each row's id among the distinct ids
            log_r = updated[:, position][:, rows]
        if self.drift_correction:  # relative rates, at the level of the previous step (NaN before any step)
            log_r = log_r + h.prev_log_rate[:, None]
        fresh = torch.isnan(log_r)
        fallback = e_rows  # first visits; with "mean", the previous step's level once there is one
        if self.first_visit == "mean":
            prev = h.prev_log_rate[:, None].expand_as(log_r)
            fallback = torch.where(torch.isnan(prev), e_rows, prev)
        log_r = torch.where(fresh, fallback, log_r)  # no host sync: computed whether or not any is fresh
        if update and not self.include_current:
            fold_in()
        # every caption of an id reads the id's text-direction rate
        m = st.captions_per_image
        return [log_r[0], log_r[1] if m == 1 else log_r[1].repeat_interleave(m)], fresh


RATE_TYPES: Dict[str, type] = {c.name: c for c in (IndexRate, QueueRate, BatchRate)}
RATES = tuple(RATE_TYPES)
