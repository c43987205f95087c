"""DeCL's flags and the arguments it completes from the training data."""

from __future__ import annotations

import math
from typing import Dict

from .base import DataFacts, DataSizeUnknown, LossFlag
from .decl_rates import FIRST_VISITS, RATES, STATES
from .decl_schedules import GAMMA_SCHEDULES, LAMBDA_SCHEDULES, RGCLG_ENTROPY, SCHEDULES, TEMPERATURE_MODES
from .state import STATE_DTYPES

ESTIMATES = ("absolute", "relative")

FLAGS = (
    LossFlag(
        "--decl-rate",
        "rate",
        choices=RATES,
        help="estimator of each anchor's rate r: per-sample moving average (index, needs sample ids from "
        "the shards), a FIFO of past embeddings (queue) or the batch alone (batch)",
    ),
    LossFlag(
        "--decl-schedule",
        "schedule",
        choices=SCHEDULES,
        help="schedule of lambda_t, the weight of loss1 (the decomposed loss) against InfoNCE: "
        + "; ".join(c.help for c in LAMBDA_SCHEDULES.values()),
    ),
    LossFlag(
        "--decl-lambda",
        "lam",
        type=float,
        help="lambda of the constant schedule, in [0, 1], or c of the harmonic one (lambda_t = min(1, c / t))",
    ),
    LossFlag(
        "--decl-gamma",
        "gamma",
        type=float,
        help="weight of the new estimate in the index rate's moving average, in (0, 1]; the final value "
        "of the cosine schedule",
    ),
    LossFlag(
        "--decl-gamma-schedule",
        "gamma_schedule",
        choices=GAMMA_SCHEDULES,
        help="rate index: gamma constant, or cosine from 1 down to --decl-gamma over "
        "--decl-gamma-decay-epochs (FastCLIP's schedule)",
    ),
    LossFlag(
        "--decl-gamma-decay-epochs",
        "gamma_decay_epochs",
        type=float,
        help="epochs of the cosine decay after the first epoch (held at gamma = 1, as FastCLIP does), turned "
        "into optimizer steps from the training data's batches per epoch; an error without "
        "--decl-gamma-schedule cosine",
        default_text="half of `--epochs`",
    ),
    LossFlag(
        "--decl-first-visit",
        "first_visit",
        choices=FIRST_VISITS,
        help="rate index: the rate an anchor reads on its first visit: its own batch estimate (batch) or "
        "the previous step's mean estimate (mean)",
    ),
    LossFlag(
        "--decl-estimate",
        "estimate",
        choices=ESTIMATES,
        help="what the rate estimates: the anchor's mean negative score mean_k exp(l_ik) (absolute; loss1 = "
        "u mean_k S_ik - l_ii) or FastCLIP's anchor-relative g_i = mean_k exp(l_ik - l_ii) (relative; "
        "loss1 = u g_i, positive and negatives scaled together)",
    ),
    LossFlag(
        "--decl-include-current",
        "include_current",
        boolean=True,
        help="index: fold this step's estimate into the stored rate, then read it (update-then-read, as "
        "SogCLR and FastCLIP do; the weight exp(e_i) / r_i is then at most 1 / gamma); "
        "--no-decl-include-current reads the rate stored by earlier visits first (the paper's "
        "wording), which is biased upward at small batches unless the rates are accurate (many "
        "visits, slow drift). queue: count the current batch with the queue",
        default_text="on for rate index, off for queue",
    ),
    LossFlag(
        "--decl-temperature-mode",
        "temperature_mode",
        choices=TEMPERATURE_MODES,
        help="what trains the logit scale: loss1 and InfoNCE (learned), InfoNCE alone (infonce: loss1 "
        "sees a detached scale, which it would otherwise push to OpenCLIP's clamp; under --decl-schedule "
        "decl, or constant at --decl-lambda 1, no step trains it and it keeps its initial value), none "
        "(fixed: --decl-temperature), or FastCLIP v3's RGCL-g objective (rgclg: --decl-rho)",
    ),
    LossFlag(
        "--decl-temperature",
        "temperature",
        type=float,
        help="temperature-mode fixed: the temperature t > 0 of both terms (logits <f, g> / t)",
        default_text="none (required by fixed)",
    ),
    LossFlag(
        "--decl-rho",
        "rho",
        type=float,
        help="temperature-mode rgclg: rho of FastCLIP v3's tau * (mean log g + rho); at the optimum the "
        "anchors' mean KL of their negatives' softmax from uniform is rho (default: log K - "
        f"{RGCLG_ENTROPY:.2f}, FastCLIP's 6.5 at global batch 1024 kept at every batch size)",
        default_text=f"log K - {RGCLG_ENTROPY:.2f}",
    ),
    LossFlag(
        "--decl-max-log-ratio",
        "max_log_ratio",
        type=float,
        help="ceiling on log(weight) = e_i - log r_i before exp: bounds a step whose stored rate is far "
        "too small (update-then-read is bounded by -log gamma already; the clamp rate is logged)",
    ),
    LossFlag(
        "--decl-drift-correction",
        "drift_correction",
        boolean=True,
        help="rate index: store each rate relative to its step's mean estimate and read it at the previous "
        "step's mean, so that rates an epoch old follow the global drift of the similarities",
    ),
    LossFlag(
        "--decl-sample-u",
        "sample_u",
        boolean=True,
        help="draw u ~ Gamma(1, r) (--decl-sample-u) or use its mean 1/r (--no-decl-sample-u)",
    ),
    LossFlag("--decl-queue-size", "queue_size", type=int, help="length of the queue of the queue rate, per modality"),
    LossFlag(
        "--decl-num-samples",
        "num_samples",
        type=int,
        help="rate index: size of the per-sample buffer; every sample id (the json 'key' of img2dataset "
        "shards, the CSV row, the synthetic index) must be below it (default: the sum of sizes.json "
        "next to the training shards, which is too small when img2dataset keys have gaps; the CSV's "
        "rows; --train-num-samples for synthetic data)",
        default_text="the training data's size",
    ),
    LossFlag(
        "--decl-state",
        "state",
        choices=STATES,
        help="rate index: keep 1/W of the per-sample buffer on each of the W ranks (sharded: the rates "
        "travel in one all-reduce of 4 x global-batch floats per step, no collective more than "
        "replicated) or all of it on every rank (replicated)",
    ),
    LossFlag(
        "--decl-state-dtype",
        "state_dtype",
        choices=tuple(STATE_DTYPES),
        help="rate index: storage dtype of the per-sample buffer; 16 bits halve its memory and round each "
        "stored log-rate (see docs/training.md)",
    ),
)


def resolve_data_params(kwargs: Dict[str, object], data: DataFacts, defaults: Dict[str, object]) -> Dict[str, object]:
    """``kwargs`` with what the data sets: ``num_samples`` (``index``) and the cosine gamma schedule's steps;
    refuses flags the configuration would ignore. With ``k`` ``::``-joined sources each owns a block of
    ``B`` ids (``--decl-num-samples`` or the largest source): ``k * B`` rows.
    """
    out = dict(kwargs)
    schedule = out.get("schedule", defaults["schedule"])
    if "lam" in out and schedule not in ("constant", "harmonic"):
        raise ValueError(
            f"--decl-lambda {out['lam']:g} has no effect with --decl-schedule {schedule}: only the "
            "constant and harmonic schedules use it"
        )
    decay_epochs = out.pop("gamma_decay_epochs", None)
    if out.get("gamma_schedule", defaults["gamma_schedule"]) == "cosine":
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
    if out.get("rate", defaults["rate"]) != "index":
        return out
    if not data.training:  # a run that only evaluates never builds the loss: any size checks the rest
        out.setdefault("num_samples", 1)
        return out
    given = out.get("num_samples")
    if given is None:
        if data.sample_ids is None:
            raise ValueError(
                f"--decl-rate index takes sample ids from webdataset keys, CSV rows or synthetic "
                f"indices, and {data.description} has none of them; use webdataset shards or a CSV, "
                "or --decl-rate queue / batch (no ids needed)"
            )
        out["num_samples"] = _data_size(data.num_samples)
    if data.num_sources > 1:
        block = given if given is not None else max(_data_size(data.source_sizes))
        if not block:
            raise ValueError(
                f"--decl-rate index with {data.num_sources} ::-joined sources needs the ids of each "
                "source: set --decl-num-samples above the largest sample key of any source"
            )
        out["num_samples"] = data.num_sources * block
    return out


def _data_size(read):
    try:
        return read()
    except DataSizeUnknown as e:
        remedy = f"{e.remedy}, or " if e.remedy else ""
        raise ValueError(
            f"--decl-rate index needs the size of its per-sample buffer, and {e.reason}: {remedy}"
            "set --decl-num-samples (above the largest sample key)"
        ) from None
