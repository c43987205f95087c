"""``decl``: the decomposable contrastive loss with Gamma auxiliary variables (DeCL).

Chen et al., "Why do We Need Large Batchsizes in Contrastive Learning? A Gradient-Bias
Perspective", NeurIPS 2022: Algorithm 1, Eq. 2-3 and Sec. 2.2.3 (stochastic EM). For anchor ``i``
(image anchors against texts and text anchors against images, averaged)::

    r_i     estimate of the rate E_k[S_ik] (expected negative score), no gradient
    u_i     ~ Gamma(shape=1, rate=r_i)        (or its mean 1 / r_i with sample_u=False)
    loss1_i = u_i * mean_{k != i} S_ik - l_ii            (decomposable loss, Alg. 1 line 8)
    loss2_i = -l_ii + logsumexp_j l_ij                   (InfoNCE, the smoothing loss, line 9)
    loss    = lambda_t * mean(loss1) + (1 - lambda_t) * mean(loss2)

In log space ``u_i * mean_k S_ik = eps_i * exp(lse_neg_i - log K - log r_i)``, ``eps_i ~
Exponential(1)``; the exponent is clamped at ``max_log_ratio`` so a stale rate cannot overflow.
``estimate="relative"`` (default; FastCLIP, Wei et al. 2024, arXiv 2407.01445) estimates
``g_i = mean_{k != i} exp(l_ik - l_ii)`` and takes ``loss1_i = u_i g_i``: positive and negatives are
scaled together, so a wrong rate rescales that anchor's step and cannot tip pull against push.

``t`` counts optimizer steps: of the ``accum_freq`` calls of a step, the first updates the state and
draws ``u`` from a generator seeded by ``(seed, t)`` for the whole global batch (sliced per rank, so
W ranks draw what one process would), the later ones reuse them. With M captions per image the
image anchor's positive is ``mean_m l_im`` and each caption anchor has its own ``u_c``.
"""

from __future__ import annotations

import math
import warnings
from typing import Dict, Optional

import torch

from .base import DataFacts, PairStats, SampleIdError, StateBuffer, StatefulLoss, check_choice, contrast_rows
from .decl_flags import ESTIMATES, FLAGS, resolve_data_params
from .decl_log import DeCLLog
from .decl_rates import FIRST_VISITS, RATE_TYPES, RATES, STATES, BatchRate, IndexRate, QueueRate
from .decl_schedules import (
    GAMMA_SCHEDULE_TYPES,
    GAMMA_SCHEDULES,
    LAMBDA_SCHEDULES,
    RGCLG_ENTROPY,
    SCHEDULES,
    TEMPERATURE_MODES,
    lambda_schedule,
)
from .decl_schedules import temperature_mode as make_temperature_mode
from .gather import anchor_stats
from .state import STATE_DTYPES

__all__ = ["DeCLLoss", "SampleIdError", "RATES", "SCHEDULES", "ESTIMATES", "TEMPERATURE_MODES"]  # noqa: F401


class DeCLLoss(DeCLLog, StatefulLoss):
    """Decomposable contrastive loss (``decl``), both directions, its state in registered buffers.

    Arguments are the ``--decl-*`` flags' plus ``accum_freq``, ``seed`` (of the ``u`` draws), ``device``
    (``"meta"`` validates only) and ``ClipLoss``'s; ``rate="index"`` needs ``sample_ids`` on every call.
    """

    output_key = "decl_loss"
    summary = "decomposable contrastive loss (DeCL)"
    supports_captions_per_image = True
    flags = FLAGS

    #: what the saved state means: the estimator (which buffers) and what its own buffers depend on
    #: (``accum_freq`` only changes the unit of ``calls``: converted, see `adapt_saved_state`)
    state_settings = ("rate", "estimate", "drift_correction", "state_dtype", "queue_size")

    @classmethod
    def state_meaning(cls, loss_args: Dict[str, object]) -> Dict[str, object]:
        """`state_settings` less those of the estimators not configured."""
        rate = loss_args.get("rate", cls.defaults()["rate"])
        others = {k for r, t in RATE_TYPES.items() if r != rate for k in t.state_settings}
        mine = set(RATE_TYPES[rate].state_settings if rate in RATE_TYPES else ())
        return {k: v for k, v in super().state_meaning(loss_args).items() if k in mine or k not in others}

    @classmethod
    def settings_in_effect(cls, values: Dict[str, object]) -> Dict[str, object]:
        """``include_current=None`` resolved: True for ``index`` (update, then read), False otherwise."""
        out = dict(values)
        if out.get("include_current") is None:
            out["include_current"] = out.get("rate") == "index"
        return out

    @classmethod
    def reads_setting(cls, kwarg: str, values: Dict[str, object]) -> bool:
        """Whether ``kwarg`` takes effect under ``values`` (an estimator's, a schedule's or a mode's own setting)."""
        rate = values.get("rate")
        owners = [r for r, t in RATE_TYPES.items() if kwarg in t.reads]
        if owners:
            return rate in owners
        if kwarg == "lam":
            return values.get("schedule") in LAMBDA_SCHEDULES and LAMBDA_SCHEDULES[values["schedule"]].uses_lam
        if kwarg in ("temperature", "rho"):
            return values.get("temperature_mode") == {"temperature": "fixed", "rho": "rgclg"}[kwarg]
        return True

    def adapt_saved_state(self, state, saved_args):
        """A state saved with another ``--accum-freq`` keeps its step count ``t`` (``calls`` counts loss calls)."""
        saved = saved_args.get("accum_freq")
        if saved is None or int(saved) == self.accum_freq or "calls" not in state:
            return state, []
        calls = int(state["calls"])
        steps = calls // int(saved)  # a checkpoint is taken at a step boundary: calls is a multiple
        converted = torch.full_like(state["calls"], steps * self.accum_freq)
        return {**state, "calls": converted}, [
            f"the step counter: {calls} loss calls at --accum-freq {saved} are {steps} optimizer steps, "
            f"{int(converted)} calls at --accum-freq {self.accum_freq}"
        ]

    @classmethod
    def resolve_data_params(cls, kwargs: Dict[str, object], data: DataFacts) -> Dict[str, object]:
        """``kwargs`` completed from the data (`clip_dcl.losses.decl_flags.resolve_data_params`)."""
        return resolve_data_params(kwargs, data, cls.defaults())

    def __init__(
        self,
        rate: str = "index",
        schedule: str = "alternate",
        lam: float = 1.0,
        gamma: float = 0.9,
        gamma_schedule: str = "constant",
        gamma_decay_steps: Optional[int] = None,
        gamma_hold_steps: int = 0,
        estimate: str = "relative",
        first_visit: str = "batch",
        include_current: Optional[bool] = None,
        drift_correction: bool = True,
        sample_u: bool = False,
        num_samples: Optional[int] = None,
        state: str = "sharded",
        state_dtype: str = "float32",
        queue_size: int = 4096,
        accum_freq: int = 1,
        max_log_ratio: float = 20.0,
        temperature_mode: str = "infonce",
        temperature: Optional[float] = None,
        rho: Optional[float] = None,
        seed: int = 0,
        device=None,
        **dist_kwargs,
    ):
        super().__init__(**dist_kwargs)
        check_choice("estimate", estimate, ESTIMATES)
        self.temperature_mode = temperature_mode
        self.scale_mode = make_temperature_mode(temperature_mode, temperature, rho)
        if int(gamma_hold_steps) < 0:
            raise ValueError(f"gamma_hold_steps={gamma_hold_steps!r} must be >= 0")
        check_choice("rate", rate, RATES)
        self.lambdas = lambda_schedule(schedule, lam)
        self.lambdas.check()
        if temperature_mode == "infonce" and self.lambdas.always_loss1():
            warnings.warn(
                f"schedule={schedule!r}"
                + (f" with lam={lam!r}" if self.lambdas.uses_lam else "")
                + " takes no InfoNCE step, and temperature_mode='infonce' trains the logit scale on "
                "InfoNCE terms only: the scale keeps its initial value for the whole run. Fix it on "
                "purpose (temperature_mode='fixed' with a temperature) or train it ('rgclg' or 'learned')",
                stacklevel=2,
            )
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma={gamma!r} is outside (0, 1]")
        check_choice("gamma_schedule", gamma_schedule, GAMMA_SCHEDULES)
        if gamma_schedule != "constant":
            if not RATE_TYPES[rate].has_gamma:
                raise ValueError(
                    f"gamma_schedule={gamma_schedule!r} applies to rate='index' only (the moving "
                    f"average of the per-sample rates); rate={rate!r} has no gamma"
                )
            if gamma_decay_steps is None or int(gamma_decay_steps) < 1:
                raise ValueError(
                    f"gamma_decay_steps={gamma_decay_steps!r} must be >= 1 for gamma_schedule={gamma_schedule!r}"
                )
        check_choice("first_visit", first_visit, FIRST_VISITS)
        if include_current and rate == "batch":
            raise ValueError(
                "include_current=True applies to rate='index' and 'queue'; rate='batch' always uses the current batch"
            )
        if rate == "index" and num_samples is None:
            raise ValueError(
                "num_samples is required for rate='index' (the size of the per-sample rate "
                "buffer); or use rate='queue' or rate='batch', which need no sample ids"
            )
        check_choice("state", state, STATES)
        if state_dtype not in STATE_DTYPES:
            raise ValueError(f"state_dtype={state_dtype!r} is not one of {tuple(STATE_DTYPES)}")
        if int(accum_freq) < 1:
            raise ValueError(f"accum_freq={accum_freq!r} must be >= 1")
        if not max_log_ratio > 0:
            raise ValueError(f"max_log_ratio={max_log_ratio!r} must be > 0")
        self.rate, self.schedule, self.estimate = rate, schedule, estimate
        self.temperature = None if temperature is None else float(temperature)
        self.rho = None if rho is None else float(rho)
        self.lam, self.gamma, self.gamma_schedule = float(lam), float(gamma), gamma_schedule
        self.gamma_hold_steps = int(gamma_hold_steps)
        self.gamma_decay_steps = int(gamma_decay_steps) if gamma_decay_steps is not None else None
        self.gammas = GAMMA_SCHEDULE_TYPES[gamma_schedule](self.gamma, self.gamma_decay_steps, self.gamma_hold_steps)
        self.first_visit = first_visit
        #: None: update-then-read for index, the queue of earlier steps only for queue
        self.include_current = (rate == "index") if include_current is None else bool(include_current)
        self.drift_correction = bool(drift_correction)
        self.sample_u = bool(sample_u)
        self.num_samples = int(num_samples) if num_samples is not None else None
        self.queue_size, self.accum_freq = int(queue_size), int(accum_freq)
        self.max_log_ratio, self.seed = float(max_log_ratio), int(seed)
        self.state, self.state_dtype = state, state_dtype
        self.register_buffer("calls", torch.zeros((), dtype=torch.long, device=device))
        if rate == "index":
            self.rates = IndexRate(
                self, num_samples, self.include_current, first_visit, self.drift_correction, state, state_dtype, device
            )
        elif rate == "queue":
            self.rates = QueueRate(self, queue_size, self.include_current, device)
        else:
            self.rates = BatchRate(self)
        #: the index buffer is split over the ranks (with one rank, sharded and replicated coincide)
        self.sharded = isinstance(self.rates, IndexRate) and self.rates.sharded
        self.requires_sample_ids = self.rates.requires_sample_ids
        self._step_cache = self._calls_at_step = self._last_step = None
        self._captions_per_image = 1  # M of the last call, for the log's bound on the ratio

    def state_buffers(self):
        return (StateBuffer("calls", torch.long, ()),) + self.rates.buffers()

    def rollback_step(self) -> bool:
        """Undo the last optimizer step's state update and counter (a step AMP skipped); whether there was one."""
        if self._calls_at_step is None:
            return False
        with torch.no_grad():
            self.rates.rollback()
            self.calls.fill_(self._calls_at_step)
        self.rates.undo = self._calls_at_step = None
        self._step_cache = None
        return True

    @property
    def step(self) -> int:
        """Optimizer step ``t`` (1-based) that the next training call belongs to."""
        return int(self.calls) // self.accum_freq + 1

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        self.rates.adapt_loaded(state_dict, prefix)
        self._step_cache = None
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def full_log_rate(self) -> torch.Tensor:
        """The whole ``(2, num_samples)`` ``index`` buffer on every rank (all-gathered; not for training)."""
        return self.rates.full_table()

    def gamma_at(self, step: int) -> float:
        """``gamma_t`` of the moving average at optimizer step ``step`` (1-based)."""
        return self.gammas.value(step)

    @staticmethod
    def positive(stats) -> torch.Tensor:
        """The anchor's positive logit: ``l_ii``, or ``mean_m l_im`` over its M captions."""
        return stats.pos.mean(dim=1) if stats.pos.dim() == 2 else stats.pos

    def live_estimates(self, st: PairStats):
        """``[e of the image rows, e of the caption rows]`` with their graph (``log mean_k S_ik``, or ``log g_i``)."""
        out = []
        for d in (st.image, st.text):
            e = d.lse_neg - math.log(d.num_negatives)
            out.append(e - self.positive(d) if self.estimate == "relative" else e)
        return out

    def batch_estimates(self, st: PairStats) -> torch.Tensor:
        """``(2, n)`` estimates per sample id: the image row's, and the mean of its M captions' (``log mean exp``)."""
        e_img, e_txt = [e.detach() for e in self.live_estimates(st)]
        m = st.captions_per_image
        if m > 1:
            e_txt = torch.logsumexp(e_txt.reshape(-1, m), dim=1) - math.log(m)
        return torch.stack([e_img, e_txt])

    def _draw_eps(self, step: int, n_rows: int, row_offset: int, global_rows: int, m: int, device, dtype):
        """``[eps of the n image rows, eps of their n M caption rows]``, sliced from the global batch's draws."""
        if not self.sample_u:
            return [torch.ones(n_rows * k, device=device, dtype=dtype) for k in (1, m)]
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        eps = torch.empty(1 + m, global_rows, dtype=torch.float64).exponential_(1.0, generator=gen)
        img, txt = eps[0], eps[1:].reshape(-1)  # (G,) and (G M,): M = 1 is the (2, G) draw of one caption
        return [
            e[row_offset * k : (row_offset + n_rows) * k].to(device=device, dtype=dtype)
            for e, k in ((img, 1), (txt, m))
        ]

    def compute(self, image_features, text_features, logit_scale, logit_bias, sample_ids):
        training = self.training
        calls = int(self.calls)
        step = calls // self.accum_freq + 1
        lam_t = self.lambdas.value(step)
        model_scale = logit_scale
        logit_scale, live_scale = self.scale_mode.scales(logit_scale, lam_t, image_features.device)
        st = self.stats(image_features, text_features, logit_scale, logit_bias)
        # InfoNCE's statistics with the live scale: the same ones unless loss1 needed a detached scale
        st2 = st
        if logit_scale is not live_scale and self.scale_mode.separate_infonce(lam_t):
            st2 = self.stats(image_features, text_features, live_scale, logit_bias)
        n_rows = st.image.pos.shape[0]
        m = self._captions_per_image = st.captions_per_image
        first_call = calls % self.accum_freq == 0 or not training
        cache = self._step_cache
        if first_call and training:
            self._calls_at_step = calls
            self.rates.begin_step()
        if first_call or cache is None or cache[0] != step or cache[1][0].shape[0] != n_rows:
            local_rows = self.local_loss and self.world_size > 1
            anchors = (image_features, text_features) if local_rows else (st.all_image_features, st.all_text_features)
            with torch.no_grad():
                log_r, fresh = self.rates.log_rates(st, sample_ids, n_rows, training, self.gamma_at(step), anchors)
                log_r = [r.to(device=st.image.pos.device, dtype=st.image.pos.dtype) for r in log_r]
                eps = self._draw_eps(
                    step,
                    n_rows,
                    st.row_offset,
                    st.all_image_features.shape[0],
                    m,
                    st.image.pos.device,
                    st.image.pos.dtype,
                )
            cache = (step, log_r, eps, fresh)
            self._step_cache = cache if training else None
        _, log_r, eps, fresh = cache
        if training:
            self.calls += 1
        self._last_step = step

        loss1_dirs, loss2_dirs, clamped, ratios = [], [], [], []
        for d, (stats, e_live) in enumerate(zip((st.image, st.text), self.live_estimates(st))):
            # log of the anchor's weight multiplier exp(e_i) / r_i (e_i with its graph)
            log_ratio = e_live - log_r[d]
            clamped.append(log_ratio.detach() > self.max_log_ratio)
            ratios.append(log_ratio.detach())
            term = eps[d] * torch.exp(log_ratio.clamp(max=self.max_log_ratio))
            if self.estimate == "absolute":  # relative: the positive is inside g_i already
                term = term - self.positive(stats)
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
            "mean_log_rate": all_r[torch.isfinite(all_r)].mean()
            if bool(torch.isfinite(all_r).any())
            else torch.tensor(float("nan")),
            "clamp_rate": torch.cat(clamped).float().mean(),
            "log_ratio_mean": ratios.mean(),
            "log_ratio_std": ratios.std() if ratios.numel() > 1 else torch.zeros(()),
            "weight_mean": weights.mean(),
            "weight_max": weights.max(),
            **self.rates.step_metrics(fresh, self.gamma_at(step), training),
        }
        loss = self.scale_mode.finish(
            loss,
            model_scale,
            live_scale,
            lambda: self._rgclg_term(st, image_features, text_features, live_scale, logit_bias, log_r),
        )
        return loss, metrics

    def rgclg_rho(self, num_negatives: int) -> float:
        """``rho`` of the RGCL-g temperature objective for anchors with ``num_negatives`` negatives."""
        return self.rho if self.rho is not None else math.log(num_negatives) - RGCLG_ENTROPY

    def _rgclg_term(self, st: PairStats, image_features, text_features, scale, logit_bias, log_r):
        """A surrogate whose gradient to the scale is FastCLIP v3's RGCL-g temperature gradient.

        With ``tau = 1 / s`` and ``g_i(tau) = mean_k exp((c_ik - c_ii) / tau)``, the objective is
        ``F(tau) = tau * (mean_i log g_i + rho)``, so ``dF/dtau = rho - mean_i KL(p_i || uniform)``: the scale
        settles where the negatives' mean KL from uniform is ``rho``. Stochastic EM replaces ``log g_i`` by
        the stored ``log r_i`` (FastCLIP's ``loss / s.detach() + (rho + mean log u) / s``); ``"absolute"``
        uses ``r_i exp(-l_ii)``. The features enter detached: only the scale is trained by it.
        """
        g_stats = anchor_stats(
            image_features.detach(),
            text_features.detach(),
            scale,
            None if logit_bias is None else logit_bias.detach(),
            rank=self.rank,
            world_size=self.world_size,
            local_loss=self.local_loss,
            gathered=(st.all_image_features.detach(), st.all_text_features.detach()),
            tile=self.tile_for(image_features),
        )
        s_det = scale.detach()
        total = 0.0
        for d, (fixed, live) in enumerate(zip((st.image, st.text), (g_stats.image, g_stats.text))):
            log_g_rate = log_r[d] - (self.positive(fixed).detach() if self.estimate == "absolute" else 0.0)
            log_g = live.lse_neg - math.log(live.num_negatives) - self.positive(live)
            ratio = torch.exp((log_g - log_g_rate).clamp(max=self.max_log_ratio))
            rho = self.rgclg_rho(live.num_negatives)
            total = total + ratio.mean() / s_det + (log_g_rate.mean() + rho) / scale
        return total / 2

    def extra_repr(self) -> str:
        shown = (
            "rate schedule lam gamma gamma_schedule gamma_decay_steps first_visit include_current drift_correction "
            "sample_u num_samples state state_dtype queue_size estimate temperature_mode temperature rho "
            "gamma_hold_steps max_log_ratio accum_freq"
        )
        return "".join(f"{k}={getattr(self, k)!r}, " for k in shown.split()) + super().extra_repr()
