"""Distributed loss harness: run under ``torchrun --nproc_per_node 2`` (gloo, CPU), or import.

A tiny two-tower model (one linear map per modality, L2-normalised, learned logit scale) is
trained for a few SGD steps with each loss. Under torchrun every rank sees its slice of the
global batch, features are gathered by the loss, and DDP averages the gradients; each rank
saves the global loss, the averaged gradients and the loss buffers of every step to
``OUT/rank{r}.pt``. :func:`run` with ``world_size=1`` gives the single-process reference on the
concatenated batch, which the test compares against.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

STEPS = 3
GLOBAL_BATCH = 16
NUM_SAMPLES = 40
IN_IMG, IN_TXT, DIM = 12, 10, 8

#: (name, loss name, kwargs); "openclip" is OpenCLIP's own ClipLoss, which the harness must pass too.
CONFIGS = [
    ("openclip", "openclip", {}),
    ("clip", "clip", {}),
    ("dcl", "dcl", {"tau_plus": 0.1}),
    ("dcl_biased", "dcl", {"tau_plus": 0.4, "clamp": "biased"}),
    ("decl_index", "decl", {"rate": "index", "num_samples": NUM_SAMPLES, "gamma": 0.5, "sample_u": True}),
    ("decl_queue", "decl", {"rate": "queue", "queue_size": 24, "schedule": "harmonic", "lam": 2.0}),
    ("decl_batch", "decl", {"rate": "batch", "schedule": "constant", "lam": 0.7, "sample_u": True}),
    ("decl_alternate", "decl", {"rate": "index", "num_samples": NUM_SAMPLES, "sample_u": False}),
    (
        "decl_index_mean_cosine",
        "decl",
        {
            "rate": "index",
            "num_samples": NUM_SAMPLES,
            "first_visit": "mean",
            "gamma": 0.2,
            "gamma_schedule": "cosine",
            "gamma_decay_steps": 2,
        },
    ),
    ("decl_index_coupled", "decl", {"rate": "index", "num_samples": NUM_SAMPLES, "include_current": True}),
    ("decl_queue_coupled", "decl", {"rate": "queue", "queue_size": 24, "include_current": True}),
    # read order, the anchor-relative estimate of every rate, the temperature modes
    (
        "decl_read_then_update",
        "decl",
        {"rate": "index", "num_samples": NUM_SAMPLES, "include_current": False, "sample_u": True},
    ),
    (
        "decl_relative_index",
        "decl",
        {"rate": "index", "num_samples": NUM_SAMPLES, "estimate": "relative", "gamma": 0.5, "sample_u": True},
    ),
    ("decl_relative_queue", "decl", {"rate": "queue", "queue_size": 24, "estimate": "relative"}),
    ("decl_relative_batch", "decl", {"rate": "batch", "estimate": "relative", "schedule": "constant", "lam": 0.7}),
    ("decl_learned_scale", "decl", {"rate": "index", "num_samples": NUM_SAMPLES, "temperature_mode": "learned"}),
    (
        "decl_fixed_temperature",
        "decl",
        {"rate": "index", "num_samples": NUM_SAMPLES, "temperature_mode": "fixed", "temperature": 0.1},
    ),
    (
        "decl_rgclg",
        "decl",
        {
            "rate": "index",
            "num_samples": NUM_SAMPLES,
            "estimate": "relative",
            "temperature_mode": "rgclg",
            "schedule": "harmonic",
            "lam": 2.0,
        },
    ),
    # the index buffer kept whole on every rank, and in 16 bits: each must equal its sharded twin
    (
        "decl_relative_index_replicated",
        "decl",
        {
            "rate": "index",
            "num_samples": NUM_SAMPLES,
            "estimate": "relative",
            "gamma": 0.5,
            "sample_u": True,
            "state": "replicated",
        },
    ),
    (
        "decl_index_replicated",
        "decl",
        {"rate": "index", "num_samples": NUM_SAMPLES, "gamma": 0.5, "sample_u": True, "state": "replicated"},
    ),
    (
        "decl_alternate_replicated",
        "decl",
        {"rate": "index", "num_samples": NUM_SAMPLES, "sample_u": False, "state": "replicated"},
    ),
    ("decl_index_bf16", "decl", {"rate": "index", "num_samples": NUM_SAMPLES, "state_dtype": "bfloat16"}),
    (
        "decl_index_bf16_replicated",
        "decl",
        {"rate": "index", "num_samples": NUM_SAMPLES, "state_dtype": "bfloat16", "state": "replicated"},
    ),
    # M captions per image ("captions": M, the harness's own key), hard negatives, the block loss, tau_plus auto
    ("clip_m3", "clip", {"captions": 3}),
    ("dcl_m3", "dcl", {"tau_plus": 0.1, "captions": 3}),
    ("hcl", "dcl", {"tau_plus": 0.1, "beta": 1.0}),
    ("hcl_m2_biased", "dcl", {"tau_plus": 0.3, "beta": 0.5, "clamp": "biased", "captions": 2}),
    ("curl_m3", "curl", {"captions": 3}),
    ("curl_hinge_m2", "curl", {"link": "hinge", "captions": 2}),
    ("dcl_auto_m2", "dcl", {"tau_plus": "auto", "tau_momentum": 0.5, "captions": 2}),
    (
        "decl_index_m3",
        "decl",
        {"rate": "index", "num_samples": NUM_SAMPLES, "gamma": 0.5, "sample_u": True, "captions": 3},
    ),
    (
        "decl_index_m3_replicated",
        "decl",
        {
            "rate": "index",
            "num_samples": NUM_SAMPLES,
            "gamma": 0.5,
            "sample_u": True,
            "captions": 3,
            "state": "replicated",
        },
    ),
    ("decl_queue_m2", "decl", {"rate": "queue", "queue_size": 24, "sample_u": True, "captions": 2}),
    ("decl_batch_m3", "decl", {"rate": "batch", "schedule": "constant", "lam": 0.7, "sample_u": True, "captions": 3}),
]
#: dcl's same-class estimate for paired captions (same_class="top"), in a mode of its own ("same_class"): global
#: batch 16, so k = 0.15 * 15 = 2.25 (fractional) for the texts and 0.15 * 15 * 3 = 6.75 for the images with
#: M = 3; k = 0.2 * 15 = 3 (integer). Not in NO_GRAD_CONFIGS: the loss refuses no_grad_gather.
SAME_CLASS_CONFIGS = [
    ("dcl_top", "dcl", {"tau_plus": 0.15, "same_class": "top"}),
    ("dcl_top_integer_k", "dcl", {"tau_plus": 0.2, "same_class": "top"}),
    ("dcl_top_m3", "dcl", {"tau_plus": 0.15, "same_class": "top", "captions": 3}),
    (
        "dcl_top_hcl_m2_biased",
        "dcl",
        {"tau_plus": 0.3, "same_class": "top", "beta": 0.5, "clamp": "biased", "captions": 2},
    ),
    ("dcl_top_auto_m2", "dcl", {"tau_plus": "auto", "tau_momentum": 0.5, "same_class": "top", "captions": 2}),
]
#: (sharded config, its replicated twin): equal bit for bit on any world size
TWINS = [
    ("decl_index", "decl_index_replicated"),
    ("decl_relative_index", "decl_relative_index_replicated"),
    ("decl_alternate", "decl_alternate_replicated"),
    ("decl_index_bf16", "decl_index_bf16_replicated"),
    ("decl_index_m3", "decl_index_m3_replicated"),
]
#: what the 4-rank run covers (the index buffer's layouts)
INDEX_CONFIGS = [c for c in CONFIGS if c[2].get("rate") == "index"]
#: gathered without autograd (no_grad_gather): every clip-dcl loss whose gradient follows from (pos, lse_neg)
NO_GRAD_CONFIGS = [
    c for c in CONFIGS if c[1] not in ("openclip", "curl") and "captions" not in c[2] and not c[2].get("beta")
]
#: with accum_freq=2 (OpenCLIP's accumulation: each micro-batch's features recomputed with gradient)
ACCUM_CONFIGS = [
    ("clip", "clip", {}),
    ("dcl", "dcl", {"tau_plus": 0.1}),
    (
        "decl_index",
        "decl",
        {"rate": "index", "num_samples": NUM_SAMPLES, "gamma": 0.5, "sample_u": True, "accum_freq": 2},
    ),
]

#: tiled statistics on the ranks, in tiles of TILE columns (several per matrix of the global batch of 16), against
#: one process's whole matrix: every clip-dcl configuration on 2 ranks, a share of each family on 4
TILE = 5
TILED_CONFIGS = [c for c in CONFIGS + SAME_CLASS_CONFIGS if c[1] != "openclip"]
TILED_FOUR_RANKS = (
    "clip clip_m3 dcl hcl dcl_m3 dcl_top dcl_top_m3 dcl_top_hcl_m2_biased decl_index decl_index_m3 decl_queue "
    "decl_rgclg decl_relative_index_replicated curl_m3"
).split()
TILED_NO_GRAD = [c for c in NO_GRAD_CONFIGS if c[0] in ("clip", "dcl", "dcl_biased", "decl_index", "decl_rgclg")]


def tiled(kwargs, tile=TILE):
    return {**kwargs, "tile": tile}


class Towers(nn.Module):
    def __init__(self, dtype=torch.float64):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.image = nn.Parameter((torch.randn(IN_IMG, DIM, generator=gen, dtype=torch.float64) / 3).to(dtype))
        self.text = nn.Parameter((torch.randn(IN_TXT, DIM, generator=gen, dtype=torch.float64) / 3).to(dtype))
        self.logit_scale = nn.Parameter(torch.tensor(2.5, dtype=dtype))

    def forward(self, x, y):
        return F.normalize(x @ self.image, dim=-1), F.normalize(y @ self.text, dim=-1), self.logit_scale.exp()


def global_data(step):
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, IN_IMG, generator=gen, dtype=torch.float64)
    y = x[:, :IN_TXT] + 0.5 * torch.randn(GLOBAL_BATCH, IN_TXT, generator=gen, dtype=torch.float64)
    ids = torch.randperm(NUM_SAMPLES, generator=gen)[:GLOBAL_BATCH]
    ids[1] = ids[0]  # a repeated id inside one global batch (resampled data can do this)
    return x, y, ids


def global_captions(step, m):
    """``m`` texts per image of :func:`global_data` (``m = 1``: its ``y``), in image order."""
    x, y, _ = global_data(step)
    if m == 1:
        return y
    gen = torch.Generator().manual_seed(2000 + step)
    return y.repeat_interleave(m, 0) + 0.5 * torch.randn(GLOBAL_BATCH * m, IN_TXT, generator=gen, dtype=torch.float64)


def build_loss(loss_name, kwargs, rank, world_size, local_loss, gather_with_grad=True, no_grad_gather=False):
    kwargs = {k: v for k, v in kwargs.items() if k != "captions"}
    dist_kwargs = dict(rank=rank, world_size=world_size, local_loss=local_loss, gather_with_grad=gather_with_grad)
    if no_grad_gather:
        dist_kwargs.update(gather_with_grad=False, no_grad_gather=True)
    if loss_name == "openclip":
        from open_clip.loss import ClipLoss

        return ClipLoss(**dist_kwargs)
    from clip_dcl.losses import create_loss

    return create_loss(loss_name, **dist_kwargs, **kwargs)


def run(
    loss_name,
    kwargs,
    rank=0,
    world_size=1,
    local_loss=False,
    gather_with_grad=True,
    no_grad_gather=False,
    dtype=torch.float64,
    accum_freq=1,
):
    """Train STEPS steps; return per-step global loss, averaged gradients, feature gradients and loss buffers.

    ``accum_freq > 1`` follows OpenCLIP's accumulation: the step's micro-batches are first encoded
    without gradient, then each is encoded again with gradient, put in its place among the others,
    and the loss of the whole step's rows is back-propagated (accumulating into the parameters).
    """
    model = Towers(dtype)
    train_model = model
    if world_size > 1:
        train_model = nn.parallel.DistributedDataParallel(model)
    loss_fn = build_loss(loss_name, kwargs, rank, world_size, local_loss, gather_with_grad, no_grad_gather)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    records = []
    m = kwargs.get("captions", 1)
    for step in range(STEPS):
        x, y, ids = global_data(step)
        y = global_captions(step, m)
        x, y = x.to(dtype), y.to(dtype)
        b = GLOBAL_BATCH // world_size
        rows = torch.arange(rank * b, (rank + 1) * b)
        text_rows = torch.arange(rank * b * m, (rank + 1) * b * m)
        opt.zero_grad()
        if accum_freq == 1:
            f, g, s = train_model(x[rows], y[text_rows])
            f.retain_grad()
            g.retain_grad()
            extra = {} if loss_name == "openclip" else {"sample_ids": ids[rows]}
            loss = loss_fn(f, g, s, **extra)
            loss.backward()
            feature_grads = (f.grad.detach().clone(), g.grad.detach().clone())
        else:  # micro-batch j of this rank: its rows j::accum_freq of the rank's slice, in fetch order
            micro = [rows[j * b // accum_freq : (j + 1) * b // accum_freq] for j in range(accum_freq)]
            with torch.no_grad():
                cached = [model(x[m], y[m]) for m in micro]
            for j in range(accum_freq):
                parts = [list(c) for c in cached]
                parts[j] = list(train_model(x[micro[j]], y[micro[j]]))
                f = torch.cat([p[0] for p in parts])
                g = torch.cat([p[1] for p in parts])
                loss = loss_fn(f, g, parts[j][2], sample_ids=ids[torch.cat(micro)])
                loss.backward()
            feature_grads = None
        value = loss.detach().clone()
        if world_size > 1 and local_loss:  # each rank holds the mean over its own anchors
            dist.all_reduce(value)
            value /= world_size
        buffers = {k: v.detach().clone() for k, v in loss_fn.named_buffers()}
        if "log_rate" in buffers:  # the whole table, gathered from the shards when sharded
            buffers["log_rate"] = loss_fn.full_log_rate()
        records.append(
            {
                "loss": value,
                "feature_grads": feature_grads,
                "grads": [p.grad.detach().clone() for p in model.parameters()],
                "buffers": buffers,
                "digest": loss_fn.state_digest() if hasattr(loss_fn, "state_digest") else None,
                "shard_columns": tuple(loss_fn.log_rate.shape) if hasattr(loss_fn, "log_rate") else None,
            }
        )
        opt.step()
    return records


def bad_id(rank, world_size):
    """One rank passes an id past the buffer: every rank must raise (none may wait in a collective)."""
    from clip_dcl.losses.base import SampleIdError

    loss_fn = build_loss("decl", {"rate": "index", "num_samples": NUM_SAMPLES}, rank, world_size, True)
    f = F.normalize(torch.randn(4, DIM, dtype=torch.float64), dim=-1)
    ids = torch.arange(4) + 4 * rank
    if rank == world_size - 1:
        ids[2] = NUM_SAMPLES + 7
    try:
        loss_fn(f, f, torch.tensor(10.0, dtype=torch.float64), sample_ids=ids)
    except SampleIdError as e:
        return str(e)
    return None


#: the stateful configurations of the non-finite checks: sharded and replicated index, the queue
NONFINITE_CONFIGS = [c for c in CONFIGS if c[0] in ("decl_index", "decl_index_replicated", "decl_queue")]


def nonfinite(rank, world_size, kwargs, bad_value):
    """Step 0 clean, step 1 with one ``bad_value`` entry in one rank's image features (then rolled
    back, as for a step the GradScaler skipped), step 2 clean; against a run of steps 0 and 2 only.
    Returns the digests and losses both runs give, on this rank."""
    from clip_dcl.losses import create_loss

    out = {}
    for label, steps in (("with_bad_step", (0, 1, 2)), ("without", (0, 2))):
        loss_fn = create_loss(
            "decl", rank=rank, world_size=world_size, local_loss=True, gather_with_grad=False, **kwargs
        )
        model = Towers()
        b = GLOBAL_BATCH // world_size
        rows = torch.arange(rank * b, (rank + 1) * b)
        visited = None
        for step in steps:
            x, y, ids = global_data(step)
            with torch.no_grad():
                f, g, s = model(x[rows], y[rows])
            if step == 1 and rank == world_size - 1:
                f = f.clone()
                f[0, 0] = bad_value
            loss = loss_fn(f, g, s, sample_ids=ids[rows])
            if step == 1:
                out[(label, "dropped")] = float(loss_fn.metrics["nonfinite_dropped"])
                # no entry visited before turned NaN (unvisited), and nothing else is non-finite
                state = {k: v for k, v in loss_fn.state_dict().items() if v.is_floating_point()}
                table = loss_fn.full_log_rate() if "log_rate" in state else None
                clean = all(bool(torch.isfinite(v).all()) for k, v in state.items() if k != "log_rate")
                if table is not None:
                    clean = (
                        clean
                        and not bool((visited & torch.isnan(table)).any())
                        and bool(torch.isfinite(table[~torch.isnan(table)]).all())
                    )
                out[(label, "finite_state")] = clean
                out[(label, "rolled_back")] = loss_fn.rollback_step()
            elif hasattr(loss_fn, "log_rate"):
                visited = ~torch.isnan(loss_fn.full_log_rate())
            out[(label, step, "digest")] = loss_fn.state_digest()
            value = loss.detach().clone()
            dist.all_reduce(value)
            out[(label, step, "loss")] = value / world_size
    return out


def main(out_dir, mode="all"):
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    results = {}
    if mode == "bad_id":
        results["error"] = bad_id(rank, world_size)
    elif mode == "nonfinite":
        for name, _, kwargs in NONFINITE_CONFIGS:
            for bad in (float("nan"), float("inf")):
                results[(name, str(bad))] = nonfinite(rank, world_size, kwargs, bad)
    elif mode == "same_class":
        for name, loss_name, kwargs in SAME_CLASS_CONFIGS:
            for local_loss in (False, True):
                results[(name, local_loss)] = run(loss_name, kwargs, rank, world_size, local_loss)
    elif mode in ("tiled", "tiled4"):
        four = mode == "tiled4"
        for name, loss_name, kwargs in TILED_CONFIGS:
            if not four or name in TILED_FOUR_RANKS:
                for local_loss in (False, True):
                    results[(name, local_loss)] = run(loss_name, tiled(kwargs), rank, world_size, local_loss)
        for name, loss_name, kwargs in TILED_NO_GRAD:
            results[(name, "no_grad")] = run(loss_name, tiled(kwargs), rank, world_size, True, no_grad_gather=True)
        for name, loss_name, kwargs in ACCUM_CONFIGS:
            if not four:
                results[(name, "accum")] = run(loss_name, tiled(kwargs), rank, world_size, True, accum_freq=2)
    elif mode == "no_grad":
        for name, loss_name, kwargs in NO_GRAD_CONFIGS:
            for dtype in (torch.float64, torch.float32):
                results[(name, str(dtype))] = run(
                    loss_name, kwargs, rank, world_size, True, no_grad_gather=True, dtype=dtype
                )
        # without the column surrogate: local rows against features gathered without autograd
        results[("clip_plain_local", "torch.float64")] = run("clip", {}, rank, world_size, True, gather_with_grad=False)
        for name, loss_name, kwargs in ACCUM_CONFIGS:
            results[(name, "accum")] = run(loss_name, kwargs, rank, world_size, True, no_grad_gather=True, accum_freq=2)
    else:
        for name, loss_name, kwargs in CONFIGS if mode == "all" else INDEX_CONFIGS:
            for local_loss in (False, True):
                results[(name, local_loss)] = run(loss_name, kwargs, rank, world_size, local_loss)
    if mode == "all":
        # A known mismatch, to show that the comparison can fail: without gather_with_grad the remote
        # features carry no gradient, so the averaged gradient is not the single-process one.
        results[("openclip_no_gather_grad", False)] = run("openclip", {}, rank, world_size, False, False)
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()
    # End here, past the interpreter's finalisation: gloo's worker threads can still be torn down
    # there, and on a loaded machine that teardown aborted a rank (SIGABRT, "terminate called
    # without an active exception") after every rank had saved its results.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], *sys.argv[2:])
