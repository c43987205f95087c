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

Rate estimators (``rate=``).

- ``"index"`` (the paper's global buffer): ``log r`` per training sample and direction, indexed by
  the sample ids the data pipeline carries (``sample_ids=``). **Update, then read** (the default,
  ``include_current=True``, as SogCLR and FastCLIP do): this step's batch estimate ``e_i = lse_neg_i -
  log K`` is folded in first, ``log r <- log((1 - gamma_t) r + gamma_t exp(e_i))`` (an unvisited entry
  stores ``e_i``), and loss1 reads the result, so the weight multiplier ``exp(e_i - log r_i)`` is at
  most ``1 / gamma_t``: a stale entry cannot blow up a step. **Read, then update**
  (``include_current=False``, the paper's "statistics taken from previous iterations"): loss1 reads
  the rate stored by earlier visits, ``u`` is then independent of the minibatch it multiplies and
  loss1's gradient ``(eps / r) grad mean_k S_ik`` has expectation ``grad D_i / r``; but ``r`` is then
  one minibatch estimate an epoch old and ``E[1/r]`` is inflated (Jensen): the negatives' mean
  weight was 5.5x InfoNCE's balance at B = 32 on fixed features, and training collapsed on the
  batch-size testbed. It is only sound when the rates are accurate (many visits, slow drift).
  An anchor seen for the first time (its entry still NaN) gets
  ``first_visit="batch"``: its own batch estimate ``e_i`` (so the first epoch is the coupled
  ``batch`` rate, as FastCLIP's ``gamma = 1`` first epoch is), or ``first_visit="mean"``: the mean
  of the previous step's batch estimates over the global batch (per direction; the batch estimate
  at the very first step).

  **Drift correction** (``drift_correction=True``, the default). A stored rate is up to an epoch
  old, and early in training the whole similarity scale moves fast: on the synthetic data the
  mean log-rate climbed by about 9 within the first epoch, so the first revisits read rates
  ``e^9`` too small, loss1 reached 10^4 and training collapsed (zero-shot at chance, for gamma 0.9
  and 0.2 alike). So each rate is stored relative to the mean estimate of the step that stored
  it, ``m_t = mean_i e_i`` over the global batch (its finite estimates), and read at the latest
  level: ``log r_i = (stored relative rate) + m_t`` after the update (``m_{t-1}`` when read before
  it), i.e. the stale estimate shifted by the global drift since it was stored. The moving average
  runs on the relative rates, ``rel <- log((1 - gamma_t) e^rel + gamma_t e^(e_i - m_t))``;
  ``first_visit="mean"`` is a relative rate of 0. ``drift_correction=False`` keeps absolute rates.
  A repeated id in one global batch reads the same stored value for both rows and is updated with
  its first occurrence's estimate.

  **Where the buffer lives** (``state=``). ``"sharded"`` (the default): rank ``r`` of ``W`` keeps
  only the ids ``i`` with ``i mod W = r`` (column ``i // W``; see :mod:`clip_dcl.losses.state`),
  ``2 * num_samples / W`` entries. Each step, every rank puts the stored rates of the global batch's
  ids it owns into a ``(2, G)`` tensor of zeros and one all-reduce (sum) gives every rank all ``G``
  of them (exactly one owner adds a non-zero, so the sum is the stored value bit for bit); with
  ``local_loss`` the same all-reduce carries each rank's own estimates ``e`` (which replication
  all-gathers instead), so no collective is added. The owners then fold in the step's estimates.
  That is ``O(G)`` communication per step. ``"replicated"``: every rank keeps the whole
  buffer and updates it from the gathered pairs, with no extra collective. Both give the same
  values, gradients and state, bit for bit. ``state_dtype`` stores the rates in ``bfloat16`` or
  ``float16`` (read and updated in float32): half the memory, at the cost of rounding every
  stored relative log-rate to 8 (bfloat16) or 11 (float16) significant bits.
- ``"queue"`` (no ids needed): a FIFO of the last ``queue_size`` gathered embeddings of each
  modality (detached), from earlier steps; ``log r_i = logsumexp`` over the queue of the other
  modality minus ``log(count)``; the current batch is enqueued after use. At the first step (an
  empty queue) the batch estimate is used.
- ``"batch"`` (ablation): ``log r_i = e_i`` from the current global batch alone: the minibatch-coupled
  gradient ``eps grad log mean_k S_ik`` that DeCL is meant to remove.

For ``queue``, ``include_current=True`` counts the current batch's negatives with the queue's (off
by default).

**The anchor-relative estimate** (``estimate="relative"``, the default, every rate; FastCLIP, Wei et al. 2024,
arXiv 2407.01445, ``FastCLIPLoss``): the rate estimates ``g_i = mean_{k != i} exp(l_ik - l_ii)``, the
positive inside, and ``loss1_i = u_i g_i = eps_i exp(lse_neg_i - log K - l_ii - log r_i)``, with the
gradient ``(eps_i / r_i) grad g_i``. Conditioned on ``u`` it is still decomposed over the negatives;
the positive and the negatives are scaled together, so a wrong rate only rescales that anchor's
step and cannot tip pull against push. With M captions ``l_ii`` is ``mean_m l_im``.
It is the default because it measured best on the batch-size testbed (``benchmarks/batch_size.py``,
report section "DeCL variants against the screen's base"): over the paper's absolute estimate
(``estimate="absolute"``, the loss1 above) it won on all 9 paired seeds at B = 16, 32 and 64,
the small batches DeCL is for (at B = 128 the two are within the seed spread).

**Non-finite steps.** Only finite estimates (``index``) and finite pairs of embeddings (``queue``) enter
the state; the others are dropped and counted (``metrics["nonfinite_dropped"]``). :meth:`rollback_step`
undoes the last step's state update and step counter, for a step whose optimizer update AMP's
GradScaler skipped (the training plugin calls it).

``gamma`` may follow a schedule (``gamma_schedule``): ``"constant"``, or ``"cosine"``: 1 for
``gamma_hold_steps`` steps (FastCLIP: the first epoch), then from 1 down to ``gamma`` over
``gamma_decay_steps`` optimizer steps, ``gamma_t = gamma + (1 - gamma) (1 + cos(pi min(1, (t - 1 -
H) / T))) / 2``: FastCLIP's ``adjust_gamma``, which steps it once per epoch, made continuous in the
step (:meth:`DeCLLoss.resolve_data_params` sets ``H`` to one epoch and ``T`` from
``--decl-gamma-decay-epochs``, once the training data's batches per epoch are known).

**Temperature** (``temperature_mode``). loss1 has no positive in its normaliser: its gradient with
respect to the logit scale is ``E_w[c_ik] - c_ii`` (w the negatives' weights), negative once
positives outrank negatives, so it drives a learned scale to OpenCLIP's clamp. ``"infonce"`` (the
default): loss1 sees the scale detached, the InfoNCE terms train it; ``"learned"``: both terms do;
``"fixed"``: ``1 / temperature`` in both terms; ``"rgclg"``: only FastCLIP v3's RGCL-g objective
``tau (mean_i log g_i + rho)`` trains it (see :meth:`DeCLLoss._rgclg_term`). A step that does not
train the scale gives it a zero gradient (DDP expects one for every parameter).

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

**M captions per image** (``text_features`` of shape ``(B * M, d)``, the M captions of each image in
image order, M read from the row counts; the sample ids stay one per image). The anchors are those
of ``dcl`` and ``clip`` with M positives (:mod:`clip_dcl.losses.dcl`):

- image anchor ``i``: negatives the ``K = (G - 1) M`` captions of the other images (its own are
  never negatives), rate ``r_i`` their expected score; each of its M captions is in turn the
  positive, ``loss1_i = u_i * mean_k S_ik - mean_m l_im`` and ``loss2_i = mean_m[-l_im + log(S_im +
  sum_k S_ik)]`` (the InfoNCE of ``clip`` with M captions);
- caption anchor ``c`` of image ``i``: one positive (its image), ``K = G - 1`` negatives, its own
  ``u_c`` draw. Its rate is the image's text-direction rate: ``index`` keeps one rate per sample id
  and direction, so it stores, for the text direction, the mean of the id's M captions' estimates,
  ``log mean_m exp(e_c)`` (the expected negative score of a caption of that image; the captions
  are drawn afresh each epoch, so a rate per caption would have nothing to follow), and every
  caption of the id reads it (a first visit too: the mean of its captions' batch estimates).
  ``batch`` gives each caption its own estimate ``e_c``; ``queue`` scores each caption against
  the queued images. The text queue (the negatives of image anchors) keeps one caption per image,
  the first of its M (itself a random draw from the image's captions), so that both queues
  advance by ``G`` per step.

``u`` is drawn per anchor row: ``G`` image draws, then ``G M`` caption draws in caption order
(with ``M = 1`` the same draws as before). With ``M = 1`` all of this is the loss above, computed by
the same code.

Written here because no released implementation of DeCL exists for CLIP.
"""
from __future__ import annotations

import inspect
import math
from typing import Dict, Optional

import torch
import torch.distributed as dist

from .base import ContrastiveLoss, DataFacts, DataSizeUnknown, LossFlag, PairStats, all_gather_cat, anchor_stats
from .dcl import contrast_rows
from .state import STATE_DTYPES, plain_sums, reshard, shard_size, state_digest, table_sums

RATES = ("index", "queue", "batch")
ESTIMATES = ("absolute", "relative")
TEMPERATURE_MODES = ("learned", "infonce", "fixed", "rgclg")
#: RGCL-g's default target: the negatives' softmax entropy at FastCLIP's rho = 6.5 and global batch 1024
RGCLG_ENTROPY = math.log(1023) - 6.5
SCHEDULES = ("alternate", "decl", "harmonic", "constant")
GAMMA_SCHEDULES = ("constant", "cosine")
FIRST_VISITS = ("batch", "mean")
STATES = ("sharded", "replicated")


class SampleIdError(ValueError):
    """A sample id that cannot index the per-sample rate buffer (negative, or ``>= num_samples``)."""


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


def schedule_gamma(schedule: str, step: int, gamma: float, decay_steps: Optional[int], hold_steps: int = 0) -> float:
    """``gamma_t`` at optimizer step ``step`` (1-based): ``gamma``, or 1 for ``hold_steps`` steps and then the
    cosine from 1 to ``gamma`` over ``decay_steps``."""
    if schedule == "constant":
        return gamma
    if schedule == "cosine":
        progress = min(1.0, max(0, step - 1 - hold_steps) / decay_steps)
        return gamma + (1.0 - gamma) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"gamma_schedule={schedule!r} is not one of {GAMMA_SCHEDULES}")


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
        gamma: moving-average weight of the new estimate for ``rate="index"``, in (0, 1]; with
            ``gamma_schedule="cosine"`` the final value of the schedule.
        gamma_schedule: ``"constant"`` or ``"cosine"`` (from 1 down to ``gamma``; ``rate="index"`` only).
        gamma_decay_steps: optimizer steps of the cosine schedule (required by ``"cosine"``).
        first_visit: what an anchor's first visit reads for ``rate="index"``: ``"batch"`` (its batch
            estimate) or ``"mean"`` (the previous step's mean estimate).
        include_current: let the current batch enter the rate it is scored with (``index``: update, then
            read; ``queue``: count the batch with the queue); ``None``: True for ``index``, False for ``queue``.
        estimate: ``"relative"`` (FastCLIP's ``g_i``, the default) or ``"absolute"`` (the paper's mean
            negative score).
        gamma_hold_steps: steps at ``gamma_t = 1`` before the cosine schedule starts.
        temperature_mode: ``"infonce"``, ``"learned"``, ``"fixed"`` or ``"rgclg"`` (module docstring).
        temperature: the fixed temperature of ``"fixed"``.
        rho: ``rho`` of ``"rgclg"`` (default ``log K - 0.43``).
        drift_correction: ``rate="index"`` keeps each rate relative to the mean estimate of the step
            that stored it and reads it at the previous step's mean (see the module docstring).
        sample_u: draw ``u ~ Gamma(1, r)`` (True) or use its mean ``1 / r`` (False).
        num_samples: size of the ``index`` buffer (ids must lie in ``[0, num_samples)``).
        state: ``"sharded"`` (each rank keeps ``1 / world_size`` of the ``index`` buffer) or
            ``"replicated"`` (every rank keeps all of it); see the module docstring.
        state_dtype: storage dtype of the ``index`` buffer: ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        device: where the buffers are allocated (``"meta"`` validates the arguments without allocating).
        queue_size: length of the ``queue`` FIFO per modality.
        accum_freq: loss calls per optimizer step (OpenCLIP's ``--accum-freq``).
        max_log_ratio: ceiling on ``lse_neg - log K - log r`` before ``exp``.
        seed: seed of the ``u`` draws.
        local_loss, gather_with_grad, rank, world_size: as OpenCLIP's ``ClipLoss``.

    Attributes:
        metrics: ``lambda_t``, ``loss1``, ``loss2`` (each averaged over directions), ``mean_log_rate``
            ``clamp_rate``, ``log_ratio_mean`` and ``log_ratio_std`` (of ``log(mean_k S_ik / r_i)`` over the
            anchor rows: how far the rates used are from the batch's own estimates), from the last call;
            ``weight_mean`` and ``weight_max`` (of the per-anchor multiplier ``exp(e_i) / r_i``, after the
            ceiling), ``nonfinite_dropped`` (training, ``index`` and ``queue``);
            for ``index`` also ``gamma_t`` and ``first_visit_rate``
            (the share of anchor rows read on their first visit).
        calls: buffer, training-mode calls so far (``t = calls // accum_freq + 1``).
        log_rate: buffer ``(2, num_samples)`` of ``log r`` (image, text), NaN where unvisited (index);
            relative to the storing step's mean estimate with ``drift_correction``. Sharded over
            ``W > 1`` ranks, this rank's ``(2, shard_size(num_samples, rank, W))`` columns; see
            :meth:`full_log_rate`.
        prev_log_rate: buffer ``(2,)``, the previous step's mean batch estimate ``m_{t-1}`` (index; NaN
            before the first step).
        queue, queue_ptr, queue_count: FIFO buffers (queue).

    Raises:
        ValueError: an unknown ``rate``/``schedule``, ``num_samples`` missing for ``index``, or an
            argument out of range (the message names it); at call time, ``sample_ids`` missing, or
            :class:`SampleIdError` for an id out of range (raised on every rank, from the gathered ids).

    Example::

        loss = DeCLLoss(rate="index", num_samples=len(dataset), schedule="alternate")
        value = loss(image_features, text_features, logit_scale, sample_ids=ids)
        loss.metrics["lambda_t"], loss.metrics["loss1"]
    """

    output_key = "decl_loss"
    summary = "decomposable contrastive loss (DeCL)"
    supports_captions_per_image = True
    flags = (
        LossFlag("--decl-rate", "rate", choices=RATES,
                 help="estimator of each anchor's rate r: per-sample moving average (index, needs sample ids from "
                      "the shards), a FIFO of past embeddings (queue) or the batch alone (batch)"),
        LossFlag("--decl-schedule", "schedule", choices=SCHEDULES,
                 help="schedule of lambda_t, the weight of the decomposed loss against InfoNCE"),
        LossFlag("--decl-lambda", "lam", type=float,
                 help="lambda of the constant schedule, in [0, 1], or c of the harmonic one (lambda_t = min(1, c / t))"),
        LossFlag("--decl-gamma", "gamma", type=float,
                 help="weight of the new estimate in the index rate's moving average, in (0, 1]; the final value "
                      "of the cosine schedule"),
        LossFlag("--decl-gamma-schedule", "gamma_schedule", choices=GAMMA_SCHEDULES,
                 help="rate index: gamma constant, or cosine from 1 down to --decl-gamma over "
                      "--decl-gamma-decay-epochs (FastCLIP's schedule)"),
        LossFlag("--decl-gamma-decay-epochs", "gamma_decay_epochs", type=float,
                 help="epochs of the cosine decay after the first epoch (held at gamma = 1, as FastCLIP does), turned "
                      "into optimizer steps from the training data's batches per epoch; an error without "
                      "--decl-gamma-schedule cosine",
                 default_text="half of `--epochs`"),
        LossFlag("--decl-first-visit", "first_visit", choices=FIRST_VISITS,
                 help="rate index: the rate an anchor reads on its first visit: its own batch estimate (batch) or "
                      "the previous step's mean estimate (mean)"),
        LossFlag("--decl-estimate", "estimate", choices=ESTIMATES,
                 help="what the rate estimates: the anchor's mean negative score mean_k exp(l_ik) (absolute; loss1 = "
                      "u mean_k S_ik - l_ii) or FastCLIP's anchor-relative g_i = mean_k exp(l_ik - l_ii) (relative; "
                      "loss1 = u g_i, positive and negatives scaled together)"),
        LossFlag("--decl-include-current", "include_current", boolean=True,
                 help="index: fold this step's estimate into the stored rate, then read it (update-then-read, as "
                      "SogCLR and FastCLIP do; the weight exp(e_i) / r_i is then at most 1 / gamma); "
                      "--no-decl-include-current reads the rate stored by earlier visits first (the paper's "
                      "wording), which is biased upward at small batches unless the rates are accurate (many "
                      "visits, slow drift). queue: count the current batch with the queue",
                 default_text="on for rate index, off for queue"),
        LossFlag("--decl-temperature-mode", "temperature_mode", choices=TEMPERATURE_MODES,
                 help="what trains the logit scale: loss1 and InfoNCE (learned), InfoNCE alone (infonce: loss1 "
                      "sees a detached scale, which it would otherwise push to OpenCLIP's clamp), none "
                      "(fixed: --decl-temperature), or FastCLIP v3's RGCL-g objective (rgclg: --decl-rho)"),
        LossFlag("--decl-temperature", "temperature", type=float,
                 help="temperature-mode fixed: the temperature t > 0 of both terms (logits <f, g> / t)",
                 default_text="none (required by fixed)"),
        LossFlag("--decl-rho", "rho", type=float,
                 help="temperature-mode rgclg: rho of FastCLIP v3's tau * (mean log g + rho); at the optimum the "
                      "anchors' mean KL of their negatives' softmax from uniform is rho (default: log K - "
                      f"{RGCLG_ENTROPY:.2f}, FastCLIP's 6.5 at global batch 1024 kept at every batch size)",
                 default_text=f"log K - {RGCLG_ENTROPY:.2f}"),
        LossFlag("--decl-max-log-ratio", "max_log_ratio", type=float,
                 help="ceiling on log(weight) = e_i - log r_i before exp: bounds a step whose stored rate is far "
                      "too small (update-then-read is bounded by -log gamma already; the clamp rate is logged)"),
        LossFlag("--decl-drift-correction", "drift_correction", boolean=True,
                 help="rate index: store each rate relative to its step's mean estimate and read it at the previous "
                      "step's mean, so that rates an epoch old follow the global drift of the similarities"),
        LossFlag("--decl-sample-u", "sample_u", boolean=True,
                 help="draw u ~ Gamma(1, r) (--decl-sample-u) or use its mean 1/r (--no-decl-sample-u)"),
        LossFlag("--decl-queue-size", "queue_size", type=int, help="length of the queue of the queue rate, per modality"),
        LossFlag("--decl-num-samples", "num_samples", type=int,
                 help="rate index: size of the per-sample buffer; every sample id (the json 'key' of img2dataset "
                      "shards, the CSV row, the synthetic index) must be below it (default: the sum of sizes.json "
                      "next to the training shards, which is too small when img2dataset keys have gaps; the CSV's "
                      "rows; --train-num-samples for synthetic data)",
                 default_text="the training data's size"),
        LossFlag("--decl-state", "state", choices=STATES,
                 help="rate index: keep 1/W of the per-sample buffer on each of the W ranks (sharded: the rates "
                      "travel in one all-reduce of 4 x global-batch floats per step, no collective more than "
                      "replicated) or all of it on every rank (replicated)"),
        LossFlag("--decl-state-dtype", "state_dtype", choices=tuple(STATE_DTYPES),
                 help="rate index: storage dtype of the per-sample buffer; 16 bits halve its memory and round each "
                      "stored log-rate (see docs/training.md)"),
    )

    #: what the saved state means: the estimator (which buffers), what each stored rate estimates
    #: (``estimate``), relative to its step's level or absolute (``drift_correction``), in which storage
    #: dtype, and the queue's length. (``accum_freq`` only changes the unit of ``calls``: converted, see
    #: :meth:`adapt_saved_state`.)
    state_settings = ("rate", "estimate", "drift_correction", "state_dtype", "queue_size")
    #: the settings of ``state_settings`` that only the state of one estimator depends on
    _RATE_STATE_SETTINGS = {"index": ("estimate", "drift_correction", "state_dtype"), "queue": ("queue_size",)}

    @classmethod
    def state_meaning(cls, loss_args: Dict[str, object]) -> Dict[str, object]:
        """:attr:`state_settings` less those of the estimators not configured (``queue_size`` means nothing
        to the ``index`` buffer, the queue stores embeddings whatever ``estimate``)."""
        rate = loss_args.get("rate", _DEFAULTS["rate"])
        others = {k for r, keys in cls._RATE_STATE_SETTINGS.items() if r != rate for k in keys}
        mine = set(cls._RATE_STATE_SETTINGS.get(rate, ()))
        return {k: v for k, v in super().state_meaning(loss_args).items() if k in mine or k not in others}

    def adapt_saved_state(self, state, saved_args):
        """``calls`` counts loss calls, ``accum_freq`` of them an optimizer step: a state saved with another
        ``--accum-freq`` (e.g. halved when the ranks are doubled) keeps its step count ``t``."""
        saved = saved_args.get("accum_freq")
        if saved is None or int(saved) == self.accum_freq or "calls" not in state:
            return state, []
        calls = int(state["calls"])
        steps = calls // int(saved)  # a checkpoint is taken at a step boundary: calls is a multiple
        converted = torch.full_like(state["calls"], steps * self.accum_freq)
        return {**state, "calls": converted}, [
            f"the step counter: {calls} loss calls at --accum-freq {saved} are {steps} optimizer steps, "
            f"{int(converted)} calls at --accum-freq {self.accum_freq}"]

    @classmethod
    def resolve_data_params(cls, kwargs: Dict[str, object], data: DataFacts) -> Dict[str, object]:
        """``kwargs`` with what the data sets: ``num_samples`` (``rate="index"``, when not given) and the
        cosine gamma schedule's steps (``gamma_decay_steps`` from ``--decl-gamma-decay-epochs``,
        ``gamma_hold_steps`` one epoch); refuses flags the configuration would ignore.

        The buffer holds the training data's size (the sum of the shards' ``sizes.json``, the CSV's rows,
        ``--train-num-samples`` for synthetic data); with ``k`` ``::``-joined sources each owns a block of
        ``B`` ids, ``B`` = ``--decl-num-samples`` or the largest source, so it holds ``k * B`` rows.
        """
        out = dict(kwargs)
        schedule = out.get("schedule", _DEFAULTS["schedule"])
        if "lam" in out and schedule not in ("constant", "harmonic"):
            raise ValueError(f"--decl-lambda {out['lam']:g} has no effect with --decl-schedule {schedule}: only the "
                             "constant and harmonic schedules use it")
        decay_epochs = out.pop("gamma_decay_epochs", None)
        if out.get("gamma_schedule", _DEFAULTS["gamma_schedule"]) == "cosine":
            if decay_epochs is None:
                decay_epochs = max(1.0, data.epochs / 2)
            if not 0 < decay_epochs < math.inf:
                raise ValueError(f"--decl-gamma-decay-epochs must be > 0, got {decay_epochs:g}")
            # While the flags are checked the steps are unknown, and any count checks the other values.
            epoch_steps = 1 if data.steps_per_epoch is None else data.steps_per_epoch
            # FastCLIP's schedule: gamma = 1 through the first epoch, then the cosine
            out.update(gamma_decay_steps=max(1, round(decay_epochs * epoch_steps)), gamma_hold_steps=epoch_steps)
        elif decay_epochs is not None:
            raise ValueError(f"--decl-gamma-decay-epochs {decay_epochs:g} needs --decl-gamma-schedule cosine")
        if out.get("rate", _DEFAULTS["rate"]) != "index":
            return out
        if not data.training:  # a run that only evaluates never builds the loss: any size checks the rest
            out.setdefault("num_samples", 1)
            return out
        given = out.get("num_samples")
        if given is None:
            if data.sample_ids is None:
                raise ValueError(f"--decl-rate index takes sample ids from webdataset keys, CSV rows or synthetic "
                                 f"indices, and {data.description} has none of them; use webdataset shards or a CSV, "
                                 "or --decl-rate queue / batch (no ids needed)")
            out["num_samples"] = cls._data_size(data.num_samples)
        if data.num_sources > 1:
            block = given if given is not None else max(cls._data_size(data.source_sizes))
            if not block:
                raise ValueError(f"--decl-rate index with {data.num_sources} ::-joined sources needs the ids of each "
                                 "source: set --decl-num-samples above the largest sample key of any source")
            out["num_samples"] = data.num_sources * block
        return out

    @staticmethod
    def _data_size(read):
        try:
            return read()
        except DataSizeUnknown as e:
            remedy = f"{e.remedy}, or " if e.remedy else ""
            raise ValueError(f"--decl-rate index needs the size of its per-sample buffer, and {e.reason}: {remedy}"
                             "set --decl-num-samples (above the largest sample key)") from None

    def __init__(self, rate: str = "index", schedule: str = "alternate", lam: float = 1.0, gamma: float = 0.9,
                 gamma_schedule: str = "constant", gamma_decay_steps: Optional[int] = None,
                 gamma_hold_steps: int = 0, estimate: str = "relative",
                 first_visit: str = "batch", include_current: Optional[bool] = None, drift_correction: bool = True,
                 sample_u: bool = False, num_samples: Optional[int] = None, state: str = "sharded",
                 state_dtype: str = "float32", queue_size: int = 4096, accum_freq: int = 1,
                 max_log_ratio: float = 20.0, temperature_mode: str = "infonce", temperature: Optional[float] = None,
                 rho: Optional[float] = None, seed: int = 0, device=None, **dist_kwargs):
        self.temperature_mode = temperature_mode
        self.schedule = schedule
        self.lam = float(lam) if isinstance(lam, (int, float)) else lam
        super().__init__(**dist_kwargs)
        if estimate not in ESTIMATES:
            raise ValueError(f"estimate={estimate!r} is not one of {ESTIMATES}")
        if temperature_mode not in TEMPERATURE_MODES:
            raise ValueError(f"temperature_mode={temperature_mode!r} is not one of {TEMPERATURE_MODES}")
        if temperature_mode == "fixed":
            if temperature is None or not (isinstance(temperature, (int, float)) and 0 < temperature < math.inf):
                raise ValueError(f"temperature={temperature!r} must be a number > 0 for temperature_mode='fixed'")
        elif temperature is not None:
            raise ValueError(f"temperature={temperature!r} applies to temperature_mode='fixed' only, not "
                             f"{temperature_mode!r}")
        if rho is not None and temperature_mode != "rgclg":
            raise ValueError(f"rho={rho!r} applies to temperature_mode='rgclg' only, not {temperature_mode!r}")
        if rho is not None and not (isinstance(rho, (int, float)) and math.isfinite(rho)):
            raise ValueError(f"rho={rho!r} must be a finite number")
        if int(gamma_hold_steps) < 0:
            raise ValueError(f"gamma_hold_steps={gamma_hold_steps!r} must be >= 0")
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
        if gamma_schedule not in GAMMA_SCHEDULES:
            raise ValueError(f"gamma_schedule={gamma_schedule!r} is not one of {GAMMA_SCHEDULES}")
        if gamma_schedule != "constant":
            if rate != "index":
                raise ValueError(f"gamma_schedule={gamma_schedule!r} applies to rate='index' only (the moving "
                                 f"average of the per-sample rates); rate={rate!r} has no gamma")
            if gamma_decay_steps is None or int(gamma_decay_steps) < 1:
                raise ValueError(f"gamma_decay_steps={gamma_decay_steps!r} must be >= 1 for "
                                 f"gamma_schedule={gamma_schedule!r}")
        if first_visit not in FIRST_VISITS:
            raise ValueError(f"first_visit={first_visit!r} is not one of {FIRST_VISITS}")
        if include_current and rate == "batch":
            raise ValueError("include_current=True applies to rate='index' and 'queue'; rate='batch' always "
                             "uses the current batch")
        if rate == "index":
            if num_samples is None:
                raise ValueError("num_samples is required for rate='index' (the size of the per-sample rate "
                                 "buffer); or use rate='queue' or rate='batch', which need no sample ids")
            if int(num_samples) < 1:
                raise ValueError(f"num_samples={num_samples!r} must be >= 1")
        if state not in STATES:
            raise ValueError(f"state={state!r} is not one of {STATES}")
        if state_dtype not in STATE_DTYPES:
            raise ValueError(f"state_dtype={state_dtype!r} is not one of {tuple(STATE_DTYPES)}")
        if rate == "queue" and int(queue_size) < 1:
            raise ValueError(f"queue_size={queue_size!r} must be >= 1 for rate='queue'")
        if int(accum_freq) < 1:
            raise ValueError(f"accum_freq={accum_freq!r} must be >= 1")
        if not max_log_ratio > 0:
            raise ValueError(f"max_log_ratio={max_log_ratio!r} must be > 0")
        self.rate = rate
        self.estimate = estimate
        self.temperature = None if temperature is None else float(temperature)
        self.rho = None if rho is None else float(rho)
        self.gamma_hold_steps = int(gamma_hold_steps)
        self.lam = float(lam)
        self.gamma = float(gamma)
        self.gamma_schedule = gamma_schedule
        self.gamma_decay_steps = int(gamma_decay_steps) if gamma_decay_steps is not None else None
        self.first_visit = first_visit
        #: None: update-then-read for index, the queue of earlier steps only for queue
        self.include_current = (rate == "index") if include_current is None else bool(include_current)
        self.drift_correction = bool(drift_correction)
        self.sample_u = bool(sample_u)
        self.num_samples = int(num_samples) if num_samples is not None else None
        self.queue_size = int(queue_size)
        self.accum_freq = int(accum_freq)
        self.max_log_ratio = float(max_log_ratio)
        self.seed = int(seed)
        self.state = state
        self.state_dtype = state_dtype
        #: the index buffer is split over the ranks (with one rank, sharded and replicated coincide)
        self.sharded = state == "sharded" and self.world_size > 1
        self.requires_sample_ids = rate == "index"
        self.register_buffer("calls", torch.zeros((), dtype=torch.long, device=device))
        if rate == "index":
            cols = shard_size(self.num_samples, self.rank, self.world_size) if self.sharded else self.num_samples
            self.register_buffer("log_rate", torch.full((2, cols), float("nan"), dtype=STATE_DTYPES[state_dtype],
                                                        device=device))
            self.register_buffer("prev_log_rate", torch.full((2,), float("nan"), device=device))
        if rate == "queue":
            # (2, Q, d): queue[0] holds text embeddings (negatives of image anchors), queue[1] images.
            # d is known at the first call; an empty buffer until then (see _load_from_state_dict).
            self.register_buffer("queue", torch.zeros(2, self.queue_size, 0, device=device))
            self.register_buffer("queue_ptr", torch.zeros((), dtype=torch.long, device=device))
            self.register_buffer("queue_count", torch.zeros((), dtype=torch.long, device=device))
        self._step_cache = None
        self._undo = None  # what the last step's state update overwrote (see rollback_step)
        self._calls_at_step = None
        self._dropped = None

    def rollback_step(self) -> bool:
        """Undo the state update of the last optimizer step: the rates or queue entries it wrote and
        the step counter. For a step whose optimizer update was skipped (AMP's GradScaler found inf or
        NaN gradients): the state is then that of a run without the step. Returns whether there was
        an update to undo (a second call does nothing)."""
        if self._calls_at_step is None:
            return False
        with torch.no_grad():
            undo = self._undo
            if undo is not None and undo[0] == "index":
                _, ids, old, level = undo
                self._write_rates(ids, old)
                self.prev_log_rate.copy_(level)
            elif undo is not None and undo[0] == "queue":
                _, ptr, count, idx, rows = undo
                self.queue[:, idx] = rows
                self.queue_ptr.fill_(ptr)
                self.queue_count.fill_(count)
            self.calls.fill_(self._calls_at_step)
        self._undo = self._calls_at_step = None
        self._step_cache = None
        return True

    # -- state -------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        """Optimizer step ``t`` (1-based) that the next training call belongs to."""
        return int(self.calls) // self.accum_freq + 1

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "queue"
        if self.rate == "queue" and key in state_dict and state_dict[key].shape != self.queue.shape:
            self.queue = torch.zeros_like(state_dict[key], device=self.queue.device)
        key = prefix + "prev_log_rate"
        if self.rate == "index" and prefix + "log_rate" in state_dict and key not in state_dict:
            # a checkpoint of an earlier version: absolute log-rates and no level. Made relative to the
            # mean of the visited entries (which becomes the level) when drift correction is on.
            rates = state_dict[prefix + "log_rate"]
            finite = torch.isfinite(rates)
            level = torch.stack([rates[d][finite[d]].mean() if bool(finite[d].any()) else
                                 torch.tensor(float("nan")) for d in range(rates.shape[0])])
            if self.drift_correction:
                state_dict[prefix + "log_rate"] = rates - level[:, None].to(rates)
            state_dict[key] = level.to(torch.float32)
        key = prefix + "log_rate"
        if self.rate == "index" and key in state_dict:
            state_dict[key] = self._own_columns(state_dict[key])
        self._step_cache = None
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _own_columns(self, table: torch.Tensor) -> torch.Tensor:
        """``table`` as this rank's buffer: as is when it has the buffer's shape; this rank's columns
        when it is the whole ``(2, num_samples)`` table and the buffer is sharded."""
        want = tuple(self.log_rate.shape)
        if tuple(table.shape) == want:
            return table
        layout = (f"sharded, rank {self.rank} of {self.world_size}: {want[1]} columns" if self.sharded
                  else "replicated: all of them")
        if self.sharded and tuple(table.shape) == (2, self.num_samples):
            out = torch.empty(want, dtype=table.dtype)
            return reshard([(0, 1, lambda: table)], self.num_samples, self.rank, self.world_size, out)
        raise ValueError(f"the saved log_rate has shape {tuple(table.shape)}, but this loss has num_samples="
                         f"{self.num_samples} ({layout}); resume with the --decl-num-samples it was trained with, with "
                         "--decl-grow-state (the data set grew: the new ids start unvisited) or with --loss-reset")

    def full_log_rate(self) -> torch.Tensor:
        """The whole ``(2, num_samples)`` buffer on every rank (all-gathers the shards when sharded).

        ``O(num_samples)`` memory and communication: for tests and inspection, not for training.
        """
        if not self.sharded:
            return self.log_rate.clone()
        width = shard_size(self.num_samples, 0, self.world_size)
        padded = torch.full((2, width), float("nan"), dtype=self.log_rate.dtype, device=self.log_rate.device)
        padded[:, :self.log_rate.shape[1]] = self.log_rate
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded)
        # column j of rank r is id r + W j: interleave the shards
        return torch.stack(parts, dim=2).reshape(2, -1)[:, :self.num_samples].clone()

    def state_digest(self) -> str:
        """Digest of the whole loss state, equal on every rank, on any world size, sharded or not.

        Computed on the buffers' device without a host copy (see :mod:`clip_dcl.losses.state`); for
        a sharded buffer each rank sums its shard and one all-reduce of two integers adds them. It
        equals :func:`clip_dcl.losses.state.digest_of_state_dict` of the whole ``state_dict``.
        """
        entries = []
        for name, buf in self.state_dict().items():
            if name == "log_rate":
                rank, world = (self.rank, self.world_size) if self.sharded else (0, 1)
                sums = table_sums(buf, self.num_samples, rank, world)
                if self.sharded:
                    dist.all_reduce(sums)
                    sums = torch.remainder(sums, 2 ** 31 - 1)
                entries.append((name, buf.dtype, (2, self.num_samples), sums))
            else:
                entries.append((name, buf.dtype, buf.shape, plain_sums(buf)))
        return state_digest(entries)

    def gamma_at(self, step: int) -> float:
        """``gamma_t`` of the moving average at optimizer step ``step`` (1-based)."""
        return schedule_gamma(self.gamma_schedule, step, self.gamma, self.gamma_decay_steps, self.gamma_hold_steps)

    # -- rate estimators ---------------------------------------------------------------------
    @staticmethod
    def _positive(stats) -> torch.Tensor:
        """The anchor's positive logit: ``l_ii``, or ``mean_m l_im`` over its M captions."""
        return stats.pos.mean(dim=1) if stats.pos.dim() == 2 else stats.pos

    def _live_estimates(self, st: PairStats):
        """``[e of the image rows, e of the caption rows]`` with their graph: ``e = log mean_k S_ik`` over the
        row's negatives (``absolute``), or ``log g = log mean_k exp(l_ik - l_ii)`` (``relative``)."""
        out = []
        for d in (st.image, st.text):
            e = d.lse_neg - math.log(d.num_negatives)
            out.append(e - self._positive(d) if self.estimate == "relative" else e)
        return out

    def _row_estimates(self, st: PairStats):
        """:meth:`_live_estimates`, detached: what the rates estimate."""
        return [e.detach() for e in self._live_estimates(st)]

    def _batch_estimates(self, st: PairStats) -> torch.Tensor:
        """``(2, n)`` estimates per sample id: the image row's, and the mean of its M captions' (``log mean exp``)."""
        e_img, e_txt = self._row_estimates(st)
        m = st.captions_per_image
        if m > 1:
            e_txt = torch.logsumexp(e_txt.reshape(-1, m), dim=1) - math.log(m)
        return torch.stack([e_img, e_txt])

    def _read_rates(self, ids: torch.Tensor, local_rows: Optional[torch.Tensor] = None, row_offset: int = 0):
        """Stored relative rates of the global batch's ``ids`` (``(2, G)``, compute dtype), on every rank.

        Sharded, with ``local_rows`` (this rank's ``(2, B)`` estimates, at columns ``row_offset:``), the
        same all-reduce also gathers the estimates of all ranks: returns ``(rates, estimates)``, so
        that sharding costs no collective more than replication, which all-gathers the estimates.
        """
        work = self.prev_log_rate.dtype
        if not self.sharded:
            return self.log_rate[:, ids].to(work), None
        mine = ids % self.world_size == self.rank
        vals = torch.zeros(2 if local_rows is None else 4, ids.numel(), dtype=work, device=self.log_rate.device)
        vals[:2, mine] = self.log_rate[:, ids[mine] // self.world_size].to(work)
        if local_rows is not None:
            vals[2:, row_offset:row_offset + local_rows.shape[1]] = local_rows
        dist.all_reduce(vals)  # one rank adds each value, every other rank adds 0: exact
        return vals[:2], (None if local_rows is None else vals[2:])

    def _write_rates(self, ids: torch.Tensor, values: torch.Tensor) -> None:
        """Store ``values`` (``(2, U)``) for the distinct ``ids``: the ones this rank keeps.

        The values are computed for the whole global batch on every rank and only then cut to the
        owned columns: CPU kernels round a vector's tail differently from its body, so computing on
        the owned subset would differ from the replicated buffer in the last bit.
        """
        if self.sharded:
            mine = ids % self.world_size == self.rank
            ids, values = ids[mine] // self.world_size, values[:, mine]
        self.log_rate[:, ids] = values.to(self.log_rate.dtype)

    def _index_log_rate(self, st: PairStats, sample_ids, n_rows: int, update: bool, gamma: float):
        """``(log r of the rows, mask of rows on their first visit)``; updates the buffer when ``update``."""
        if sample_ids is None:
            raise ValueError("rate='index' needs sample_ids= (a LongTensor of the local rows' sample ids)")
        ids = torch.as_tensor(sample_ids).to(device=self.log_rate.device, dtype=torch.long).reshape(-1)
        all_ids = all_gather_cat(ids, self.world_size)
        if all_ids.numel() != st.all_image_features.shape[0]:
            raise ValueError(f"sample_ids has {ids.numel()} entries but the features have "
                             f"{st.all_image_features.shape[0] // self.world_size} rows; pass one id per row")
        # checked on the gathered ids, so that every rank raises (none is left waiting in a collective)
        if bool((all_ids < 0).any()):
            raise SampleIdError(f"sample id {int(all_ids[all_ids < 0][0])} is negative: ids index the per-sample "
                                f"rate buffer [0, num_samples={self.num_samples}) and must be >= 0")
        if bool((all_ids >= self.num_samples).any()):
            worst = int(all_ids.max())
            raise SampleIdError(f"sample id {worst} is outside [0, num_samples={self.num_samples}); raise "
                                "num_samples (--decl-num-samples) to exceed the largest sample id")
        work = self.prev_log_rate.dtype
        rows = slice(None) if n_rows == all_ids.numel() else slice(st.row_offset, st.row_offset + n_rows)
        e_rows = self._batch_estimates(st).to(work)  # (2, n_rows): this step's estimates
        if n_rows == all_ids.numel():  # every rank holds all rows
            stored, _ = self._read_rates(all_ids)  # (2, G): read before this step's update
            e_all = e_rows
        elif self.sharded:
            stored, e_all = self._read_rates(all_ids, e_rows, st.row_offset)
        else:
            stored, _ = self._read_rates(all_ids)
            e_all = all_gather_cat(e_rows, self.world_size, dim=1)
        keep = first_occurrence(all_ids)  # sorted by id
        upd_ids = all_ids[keep]

        def fold_in():
            e_keep, old = e_all[:, keep], stored[:, keep]
            # only finite estimates are folded in (a NaN or inf feature would poison the rates, and NaN
            # also means "unvisited"); the level m_t is their mean, the previous level when there is none
            finite = torch.isfinite(e_keep)
            n_finite = finite.sum(dim=1)
            level = torch.where(finite.all(dim=1), e_keep.mean(dim=1),  # m_t: this step's mean estimate
                                torch.where(finite, e_keep, 0.0).sum(dim=1) / n_finite.clamp(min=1))
            level = torch.where(n_finite > 0, level, self.prev_log_rate)
            new = e_keep - level[:, None] if self.drift_correction else e_keep
            updated = torch.where(finite, moving_average_log_rate(old, new, gamma), old)
            self._undo = ("index", upd_ids, old.clone(), self.prev_log_rate.clone())
            self._dropped = (~finite).sum()
            self._write_rates(upd_ids, updated)
            self.prev_log_rate.copy_(level)
            return updated

        log_r = stored[:, rows]
        if update and self.include_current:  # the coupled ablation: the current estimate enters the rate
            updated = fold_in().to(self.log_rate.dtype).to(work)  # as stored
            position = torch.searchsorted(upd_ids, all_ids)  # each row's id among the distinct ids
            log_r = updated[:, position][:, rows]
        if self.drift_correction:  # relative rates, at the level of the previous step (NaN before any step)
            log_r = log_r + self.prev_log_rate[:, None]
        fresh = torch.isnan(log_r)
        fallback = e_rows  # first visits; with "mean", the previous step's level once there is one
        if self.first_visit == "mean":
            prev = self.prev_log_rate[:, None].expand_as(log_r)
            fallback = torch.where(torch.isnan(prev), e_rows, prev)
        log_r = torch.where(fresh, fallback, log_r)  # no host sync: computed whether or not any is fresh
        if update and not self.include_current:
            fold_in()
        return log_r, fresh

    def _queue_log_rate(self, st: PairStats, anchors, update: bool) -> torch.Tensor:
        dim = st.all_image_features.shape[1]
        if self.queue.shape[-1] != dim:
            if int(self.queue_count) > 0:
                raise ValueError(f"feature dim {dim} differs from the queue's {self.queue.shape[-1]}")
            self.queue = torch.zeros(2, self.queue_size, dim, device=st.all_image_features.device)
        count = int(self.queue_count)
        log_r = []
        for d, (stats, anchor) in enumerate(zip((st.image, st.text), anchors)):
            shift = self._positive(stats).detach() if self.estimate == "relative" else 0.0
            if not count:  # the first step: nothing earlier to read
                log_r.append(stats.lse_neg.detach() - math.log(stats.num_negatives) - shift)
                continue
            with torch.no_grad():
                q = self.queue[d, :count].to(anchor)
                lse_q = torch.logsumexp((st.logit_scale.detach() * anchor.detach()) @ q.T, 1)
            if self.include_current:  # the batch's negatives counted with the queue's
                log_r.append(torch.logaddexp(stats.lse_neg.detach(), lse_q) - math.log(stats.num_negatives + count)
                             - shift)
            else:
                log_r.append(lse_q - math.log(count) - shift)
        if update:
            with torch.no_grad():
                # one caption per image (the first of its M), so that both queues advance by G
                texts = st.all_text_features[::st.captions_per_image].detach()
                images = st.all_image_features.detach()
                # only finite pairs are queued: a NaN or inf embedding would poison every later rate
                ok = torch.isfinite(texts).all(dim=1) & torch.isfinite(images).all(dim=1)
                if not bool(ok.all()):
                    texts, images = texts[ok], images[ok]
                self._dropped = (~ok).sum() * 2
                n = min(texts.shape[0], self.queue_size)
                idx = ((int(self.queue_ptr) + torch.arange(n)) % self.queue_size).to(self.queue.device)
                self._undo = ("queue", int(self.queue_ptr), count, idx, self.queue[:, idx].clone())
                for d, feats in enumerate((texts, images)):
                    self.queue[d, idx] = feats[texts.shape[0] - n:].to(self.queue)
                self.queue_ptr.fill_((int(self.queue_ptr) + n) % self.queue_size)
                self.queue_count.fill_(min(self.queue_size, count + n))
        return log_r

    def _draw_eps(self, step: int, n_rows: int, row_offset: int, global_rows: int, m: int, device, dtype):
        """``[eps of the n image rows, eps of their n M caption rows]``, sliced from the global batch's draws."""
        if not self.sample_u:
            return [torch.ones(n_rows * k, device=device, dtype=dtype) for k in (1, m)]
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        eps = torch.empty(1 + m, global_rows, dtype=torch.float64).exponential_(1.0, generator=gen)
        img, txt = eps[0], eps[1:].reshape(-1)  # (G,) and (G M,): M = 1 is the (2, G) draw of one caption
        return [e[row_offset * k:(row_offset + n_rows) * k].to(device=device, dtype=dtype)
                for e, k in ((img, 1), (txt, m))]

    # -- the loss ----------------------------------------------------------------------------
    def compute(self, image_features, text_features, logit_scale, logit_bias, sample_ids):
        training = self.training
        calls = int(self.calls)
        step = calls // self.accum_freq + 1
        lam_t = schedule_lambda(self.schedule, step, self.lam)
        model_scale = live_scale = logit_scale
        if self.temperature_mode == "fixed":
            live_scale = logit_scale = torch.tensor(1.0 / self.temperature, device=image_features.device)
        elif torch.is_tensor(logit_scale) and (self.temperature_mode == "rgclg"
                                               or (self.temperature_mode == "infonce" and lam_t > 0.0)):
            logit_scale = logit_scale.detach()  # loss1 must not drive the scale (module docstring)
        st = self.stats(image_features, text_features, logit_scale, logit_bias)
        # InfoNCE's statistics with the live scale: the same ones unless loss1 needed a detached scale
        st2 = st
        if logit_scale is not live_scale and self.temperature_mode == "infonce" and lam_t < 1.0:
            st2 = self.stats(image_features, text_features, live_scale, logit_bias)
        n_rows = st.image.pos.shape[0]
        m = st.captions_per_image
        first_call = calls % self.accum_freq == 0 or not training
        cache = self._step_cache
        if first_call and training:
            self._calls_at_step, self._undo, self._dropped = calls, None, None
        if first_call or cache is None or cache[0] != step or cache[1][0].shape[0] != n_rows:
            local_rows = self.local_loss and self.world_size > 1
            anchors = (image_features, text_features) if local_rows else (st.all_image_features,
                                                                          st.all_text_features)
            update = training
            fresh = None
            with torch.no_grad():
                if self.rate == "index":
                    per_id, fresh = self._index_log_rate(st, sample_ids, n_rows, update, self.gamma_at(step))
                    # every caption of an id reads the id's text-direction rate
                    log_r = [per_id[0], per_id[1] if m == 1 else per_id[1].repeat_interleave(m)]
                elif self.rate == "queue":
                    log_r = self._queue_log_rate(st, [a.to(st.all_image_features) for a in anchors], update)
                else:
                    log_r = self._row_estimates(st)
                log_r = [r.to(device=st.image.pos.device, dtype=st.image.pos.dtype) for r in log_r]
                eps = self._draw_eps(step, n_rows, st.row_offset, st.all_image_features.shape[0], m,
                                     st.image.pos.device, st.image.pos.dtype)
            cache = (step, log_r, eps, fresh)
            self._step_cache = cache if training else None
        _, log_r, eps, fresh = cache
        if training:
            self.calls += 1

        loss1_dirs, loss2_dirs, clamped, ratios = [], [], [], []
        for d, (stats, e_live) in enumerate(zip((st.image, st.text), self._live_estimates(st))):
            # log of the anchor's weight multiplier exp(e_i) / r_i (e_i with its graph)
            log_ratio = e_live - log_r[d]
            clamped.append(log_ratio.detach() > self.max_log_ratio)
            ratios.append(log_ratio.detach())
            term = eps[d] * torch.exp(log_ratio.clamp(max=self.max_log_ratio))
            if self.estimate == "absolute":  # relative: the positive is inside g_i already
                term = term - self._positive(stats)
            loss1_dirs.append(term.mean())
        for stats in (st2.image, st2.text):
            loss2_dirs.append(contrast_rows(stats.pos, stats.lse_neg))
        ratios = torch.cat(ratios)
        all_r = torch.cat(log_r)
        loss1 = (loss1_dirs[0] + loss1_dirs[1]) / 2
        loss2 = (loss2_dirs[0] + loss2_dirs[1]) / 2
        loss = lam_t * loss1 + (1.0 - lam_t) * loss2
        weights = torch.exp(ratios.clamp(max=self.max_log_ratio))
        metrics = {
            "lambda_t": lam_t,
            "loss1": loss1.detach(),
            "loss2": loss2.detach(),
            "mean_log_rate": all_r[torch.isfinite(all_r)].mean() if bool(torch.isfinite(all_r).any())
            else torch.tensor(float("nan")),
            "clamp_rate": torch.cat(clamped).float().mean(),
            # log(exp(e_i) / r_i): 0 for a rate equal to this batch's estimate; its spread says how far
            # the rates read are from the current batch's
            "log_ratio_mean": ratios.mean(),
            "log_ratio_std": ratios.std() if ratios.numel() > 1 else torch.zeros(()),
            # the per-anchor weight multiplier exp(e_i) / r_i of loss1's gradient (after the ceiling)
            "weight_mean": weights.mean(),
            "weight_max": weights.max(),
        }
        if self.rate == "index":
            metrics["gamma_t"] = self.gamma_at(step)
            metrics["first_visit_rate"] = fresh.float().mean()
        if self.rate != "batch" and training:
            # estimates (index) or embeddings (queue, two per pair) of this step left out of the state
            metrics["nonfinite_dropped"] = self._dropped if self._dropped is not None else torch.zeros(())
        if self.temperature_mode == "rgclg" and torch.is_tensor(live_scale) and live_scale.requires_grad:
            term = self._rgclg_term(st, image_features, text_features, live_scale, logit_bias, log_r)
            loss = loss + (term - term.detach())  # value 0: only the scale's gradient
        elif torch.is_tensor(model_scale) and model_scale.requires_grad and self.temperature_mode != "learned":
            # a zero gradient rather than none on steps that do not train the scale: DDP expects a gradient
            # for every parameter, and one process then steps the optimizer exactly as W ranks do
            loss = loss + 0.0 * model_scale
        return loss, metrics

    def rgclg_rho(self, num_negatives: int) -> float:
        """``rho`` of the RGCL-g temperature objective for anchors with ``num_negatives`` negatives."""
        return self.rho if self.rho is not None else math.log(num_negatives) - RGCLG_ENTROPY

    def _rgclg_term(self, st: PairStats, image_features, text_features, scale, logit_bias, log_r):
        """A surrogate whose gradient to the scale is FastCLIP v3's RGCL-g temperature gradient.

        With ``tau = 1 / s`` and ``g_i(tau) = mean_k exp((c_ik - c_ii) / tau)`` (features fixed), the
        objective is ``F(tau) = tau * (mean_i log g_i + rho)`` (both directions averaged), so ``dF/dtau =
        rho - mean_i KL(p_i || uniform)``, ``p_i`` the softmax over the anchor's negatives: the scale
        settles where the negatives' mean KL from uniform is ``rho``. Stochastic EM's estimate replaces
        ``log g_i`` by the stored ``log r_i`` and ``g'_i / g_i`` by ``g'_i / r_i`` (FastCLIP's
        ``loss / s.detach() + (rho + mean log u) / s``). With ``estimate="absolute"`` the relative rate
        is ``r_i exp(-l_ii)``. The features enter detached, so only the scale is trained by it.
        """
        g_stats = anchor_stats(
            image_features.detach(), text_features.detach(), scale,
            None if logit_bias is None else logit_bias.detach(), rank=self.rank, world_size=self.world_size,
            local_loss=self.local_loss, gathered=(st.all_image_features.detach(), st.all_text_features.detach()))
        s_det = scale.detach()
        total = 0.0
        for d, (fixed, live) in enumerate(zip((st.image, st.text), (g_stats.image, g_stats.text))):
            log_g_rate = log_r[d] - (self._positive(fixed).detach() if self.estimate == "absolute" else 0.0)
            log_g = live.lse_neg - math.log(live.num_negatives) - self._positive(live)
            ratio = torch.exp((log_g - log_g_rate).clamp(max=self.max_log_ratio))
            rho = self.rgclg_rho(live.num_negatives)
            total = total + ratio.mean() / s_det + (log_g_rate.mean() + rho) / scale
        return total / 2

    def extra_repr(self) -> str:
        return (f"rate={self.rate!r}, schedule={self.schedule!r}, lam={self.lam}, gamma={self.gamma}, "
                f"gamma_schedule={self.gamma_schedule!r}, gamma_decay_steps={self.gamma_decay_steps}, "
                f"first_visit={self.first_visit!r}, include_current={self.include_current}, "
                f"drift_correction={self.drift_correction}, "
                f"sample_u={self.sample_u}, num_samples={self.num_samples}, state={self.state!r}, "
                f"state_dtype={self.state_dtype!r}, queue_size={self.queue_size}, estimate={self.estimate!r}, "
                f"temperature_mode={self.temperature_mode!r}, temperature={self.temperature}, rho={self.rho}, "
                f"gamma_hold_steps={self.gamma_hold_steps}, max_log_ratio={self.max_log_ratio}, "
                f"accum_freq={self.accum_freq}, " + super().extra_repr())


#: ``DeCLLoss``'s defaults, for :meth:`DeCLLoss.resolve_data_params` (which sees the given values only)
_DEFAULTS = {p.name: p.default for p in inspect.signature(DeCLLoss.__init__).parameters.values()}
