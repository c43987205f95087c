"""DeCL's per-sample rate buffer: replicated against sharded, and 16-bit storage against float32.

Three parts, one report (``results/decl_state.md`` and ``.json``):

1. **Measured on gloo ranks** (``--nproc``, default 2), for each ``--num-samples``: per-rank state
   bytes, peak resident memory of each rank (``ru_maxrss``, one fresh process group per
   configuration, so peaks do not carry over) and its rise over the process before the loss was
   built, the median step time of ``decl`` (forward + backward, ``--local-loss
   --gather-with-grad``, global batch ``--nproc x --batch``, d = ``--dim``), the time of the
   per-epoch state digest and of writing this rank's checkpoint shard. The step-time ratio is
   sharded over replicated, measured in the same run.
2. **Computed** for LAION-400M and DataComp-1.4B at W in {8, 64, 512}: bytes per rank of each
   layout and dtype, and the communication of each layout's per-step collective (a ring
   all-reduce sends ``2 (W - 1) / W`` times its size per rank).
   Per step (``--local-loss``), the sharded layout all-reduces ``(4, G)`` float32 (the stored
   rates and the step's estimates); the replicated one all-gathers the ``(2, G / W)`` estimates.
3. **16-bit storage error**, one process: the same feature stream (ids revisited for several
   epochs) through float32, bfloat16 and float16 buffers; the error of the stored rates and of the
   loss against float32.

    .venv/bin/python benchmarks/decl_state.py                          # 1e6, 1e7, 5e7 samples
    .venv/bin/python benchmarks/decl_state.py --num-samples 1e5 --steps 5 --quick
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from argparse import Namespace
from pathlib import Path

import torch
import torch.nn.functional as F

from clip_dcl.experiment import torchrun
from clip_dcl.experiment.memory import peak_rss_mib
from clip_dcl.experiment.reporting import Report, add_report_arguments, command_line, markdown_table, report_path
from clip_dcl.losses import create_loss

HERE = Path(__file__).resolve().parent

MODES = ("replicated", "sharded")
SCALES = {"LAION-400M": 400_000_000, "DataComp-1.4B": 1_400_000_000}
WORLDS = (8, 64, 512)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


# -- part 1: one configuration on the ranks of a process group ------------------------------------
def _batch(args, rank, world, gen):
    f = F.normalize(torch.randn(args.batch, args.dim), dim=-1).requires_grad_()
    g = F.normalize(torch.randn(args.batch, args.dim), dim=-1).requires_grad_()
    ids = torch.randint(0, args.num_samples, (world * args.batch,), generator=gen)[rank::world].contiguous()
    return f, g, ids


def _decl(args, mode, rank, world):
    return create_loss(
        "decl",
        rate="index",
        num_samples=args.num_samples,
        state=mode,
        rank=rank,
        world_size=world,
        local_loss=True,
        gather_with_grad=True,
        schedule="decl",
    )


def worker(args) -> None:
    """One rank of :func:`measure`: leaves its record for the launcher."""
    with torchrun.process_group() as (rank, world):
        torchrun.write_rank_record(args, rank, _measure_layout(args, rank, world))


def _measure_layout(args, rank: int, world: int) -> dict:
    """One layout (memory, digest, checkpoint write), or ``--mode both``: step times, interleaved."""
    import torch.distributed as dist

    from clip_dcl.train import loss_state

    torch.manual_seed(rank)
    gen = torch.Generator().manual_seed(1)  # the same ids on every rank: each takes its slice
    out = {"rank": rank, "world_size": world, "mode": args.mode, "num_samples": args.num_samples}
    if args.mode == "both":
        losses = {mode: _decl(args, mode, rank, world) for mode in MODES}
        times = {mode: [] for mode in MODES}
        for step in range(args.warmup + args.steps):
            f, g, ids = _batch(args, rank, world, gen)
            order = MODES if step % 2 == 0 else MODES[::-1]  # alternate which goes first
            for mode in order:
                dist.barrier()
                t0 = time.perf_counter()
                losses[mode](f, g, torch.tensor(14.3), sample_ids=ids).backward()
                dist.barrier()
                if step >= args.warmup:
                    times[mode].append(time.perf_counter() - t0)
                f.grad = g.grad = None
        out["step_ms"] = {mode: 1e3 * statistics.median(t) for mode, t in times.items()}
        digests = {mode: fn.state_digest() for mode, fn in losses.items()}
        out["same_state"] = len(set(digests.values())) == 1
    else:
        before = peak_rss_mib()
        loss = _decl(args, args.mode, rank, world)
        for _ in range(3):
            f, g, ids = _batch(args, rank, world, gen)
            loss(f, g, torch.tensor(14.3), sample_ids=ids).backward()
        out.update(state_bytes=loss.log_rate.numel() * loss.log_rate.element_size(), rss_before_mb=before)
        t0 = time.perf_counter()
        out["digest"] = loss.state_digest()
        out["digest_s"] = time.perf_counter() - t0
        with tempfile.TemporaryDirectory() as tmp:
            fake = Namespace(
                logs=tmp,
                checkpoint_path=tmp,
                epochs=1,
                save_frequency=1,
                save_most_recent=False,
                delete_previous_checkpoint=False,
            )
            t0 = time.perf_counter()
            if loss.sharded:
                loss_state.write_shards(loss, fake, 1)
            elif rank == 0:  # what the master's checkpoint takes: the whole buffer
                torch.save(loss.state_dict(), os.path.join(tmp, "state.pt"))
            out["write_s"] = time.perf_counter() - t0
            dist.barrier()
        out["peak_rss_mb"] = peak_rss_mib()
    return out


def measure(num_samples: int, mode: str, args) -> list:
    """Every rank's record of one layout (``mode``) at ``num_samples``, on ``args.nproc`` fresh ranks."""
    return torchrun.launch(
        __file__,
        args.nproc,
        [
            "--mode",
            mode,
            "--num-samples",
            str(num_samples),
            "--steps",
            str(args.steps),
            "--warmup",
            str(args.warmup),
            "--batch",
            str(args.batch),
            "--dim",
            str(args.dim),
        ],
        threads=max(1, (os.cpu_count() or 2) // args.nproc),
        what=f"{mode} at {num_samples}",
    )


# -- part 2: computed ------------------------------------------------------------------------------
def computed(global_batch: int) -> list:
    rows = []
    for name, n in SCALES.items():
        for world in WORLDS:
            row = {"data": name, "num_samples": n, "world_size": world}
            for dtype, size in DTYPE_BYTES.items():
                row[f"replicated_{dtype}_gb"] = 2 * n * size / 1e9
                row[f"sharded_{dtype}_gb"] = 2 * math.ceil(n / world) * size / 1e9
            # per step, --local-loss: sharded all-reduces (rates, estimates) as (4, G) float32 (a ring sends
            # 2 (W-1)/W of it per rank); replicated all-gathers the (2, G / W) estimates instead
            row["allreduce_mb_per_step"] = 2 * (world - 1) / world * 4 * global_batch * 4 / 1e6
            row["replicated_gather_mb_per_step"] = (world - 1) * 2 * (global_batch // world) * 4 / 1e6
            rows.append(row)
    return rows


# -- part 3: 16-bit storage ------------------------------------------------------------------------
def precision(num_samples=8192, batch=512, epochs=6, dim=256, seed=0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    base_i = F.normalize(torch.randn(num_samples, dim, generator=gen), dim=-1)
    base_t = F.normalize(base_i + 0.8 * torch.randn(num_samples, dim, generator=gen) / math.sqrt(dim) * 8, dim=-1)
    losses = {
        d: create_loss("decl", rate="index", num_samples=num_samples, state_dtype=d, schedule="decl")
        for d in ("float32", "bfloat16", "float16")
    }
    values = {d: [] for d in losses}
    for epoch in range(epochs):
        order = torch.randperm(num_samples, generator=gen)
        scale = torch.tensor(10.0 + 5.0 * epoch)  # the similarities sharpen as training would make them
        for start in range(0, num_samples - batch + 1, batch):
            ids = order[start : start + batch]
            noise = 0.3 * torch.randn(batch, dim, generator=gen) / math.sqrt(dim)
            f, g = F.normalize(base_i[ids] + noise, dim=-1), F.normalize(base_t[ids] - noise, dim=-1)
            for d, fn in losses.items():
                values[d].append(float(fn(f, g, scale, sample_ids=ids)))
    ref = losses["float32"]
    ref_rates = ref.log_rate.double()
    out = {"num_samples": num_samples, "batch": batch, "epochs": epochs, "steps": len(values["float32"])}
    for d in ("bfloat16", "float16"):
        err = (losses[d].log_rate.double() - ref_rates).abs()
        loss_err = [abs(a - b) / abs(b) for a, b in zip(values[d], values["float32"])]
        out[d] = {
            "rate_abs_err_max": float(err.max()),
            "rate_abs_err_median": float(err.median()),
            "rate_range": [float(ref_rates.min()), float(ref_rates.max())],
            "loss_rel_err_max": max(loss_err),
            "loss_rel_err_median": statistics.median(loss_err),
        }
    return out


def report(measured, comp, prec, args, about) -> str:
    g = args.nproc * args.batch
    rows = []
    for n, by_mode in measured.items():
        steps = by_mode["both"][0]["step_ms"]
        for mode in MODES:
            r = by_mode[mode][0]
            rows.append(
                [
                    f"{n:.0e}",
                    mode,
                    f"{r['state_bytes'] / 1e6:.0f}",
                    f"{r['peak_rss_mb']:.0f}",
                    f"{r['peak_rss_mb'] - r['rss_before_mb']:.0f}",
                    f"{steps[mode]:.1f}",
                    f"{steps[mode] / steps['replicated']:.2f}",
                    f"{r['digest_s']:.3f}",
                    f"{r['write_s']:.2f}",
                ]
            )
        same = len({r["digest"] for mode in MODES for r in by_mode[mode]}) == 1 and all(
            r["same_state"] for r in by_mode["both"]
        )
        rows.append(["", f"digests identical across ranks and layouts: {same}"] + [""] * 7)
    lines = [
        "# DeCL's per-sample rate buffer: sharded vs replicated, 16-bit storage",
        "",
        *about,
        "- No GPU was available to this run: nothing here is measured on CUDA/NCCL.",
        "",
        f"## Measured: {args.nproc} gloo ranks on CPU, global batch {g} (local {args.batch}), d = {args.dim}",
        "",
        "Per rank (rank 0; the other ranks agree within a few MB). Peak RSS is the peak of a process that "
        "holds one layout; 'rise' is its peak over the process just before the loss was built. Step: median "
        f"of {args.steps} decl steps (forward + backward, local loss), both layouts in one process on the same "
        "batches, alternating which goes first, so that load from elsewhere hits both alike; the ratio is "
        "sharded over replicated. Digest: the per-epoch state digest. Write: this rank's checkpoint shard "
        "(sharded) or the master's whole buffer (replicated).",
        "",
        markdown_table(
            [
                "num_samples",
                "state",
                "state MB / rank",
                "peak RSS MB",
                "rise MB",
                "step ms",
                "step ratio",
                "digest s",
                "write s",
            ],
            rows,
            align="rlrrrrrrr",
        ),
        "",
        f"## Computed: bytes per rank at scale (global batch {comp[0]['global_batch']:,} for the all-reduce)",
        "",
        markdown_table(
            [
                "data",
                "W",
                "replicated fp32 GB",
                "sharded fp32 GB",
                "sharded bf16 GB",
                "replicated: estimates all-gather MB / step / rank",
                "sharded: (rates, estimates) all-reduce MB / step / rank",
            ],
            (
                [
                    r["data"],
                    r["world_size"],
                    f"{r['replicated_float32_gb']:.1f}",
                    f"{r['sharded_float32_gb']:.3f}",
                    f"{r['sharded_bfloat16_gb']:.3f}",
                    f"{r['replicated_gather_mb_per_step']:.2f}",
                    f"{r['allreduce_mb_per_step']:.2f}",
                ]
                for r in comp
            ),
            align="lrrrrrr",
        ),
        "",
        f"## 16-bit storage against float32 ({prec['num_samples']} samples, batch {prec['batch']}, "
        f"{prec['epochs']} epochs, {prec['steps']} steps, the same features for every dtype)",
        "",
        f"Stored relative log-rates range over [{prec['bfloat16']['rate_range'][0]:.2f}, "
        f"{prec['bfloat16']['rate_range'][1]:.2f}] in float32.",
        "",
        markdown_table(
            ["storage", "log-rate abs. error, max", "median", "loss rel. error, max", "median"],
            (
                [
                    d,
                    *(
                        f"{prec[d][k]:.2e}"
                        for k in ("rate_abs_err_max", "rate_abs_err_median", "loss_rel_err_max", "loss_rel_err_median")
                    ),
                ]
                for d in ("bfloat16", "float16")
            ),
            align="lrrrr",
        ),
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-samples", type=float, nargs="+", default=[1e6, 1e7, 5e7])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--batch", type=int, default=256, help="local batch per rank")
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--global-batch-at-scale", type=int, default=32768)
    add_report_arguments(p, "decl_state", "1e5 samples, 5 steps, 1 warm-up step")
    p.add_argument("--mode", choices=MODES + ("both",), help=argparse.SUPPRESS)
    torchrun.add_worker_arguments(p)
    args = p.parse_args(argv)
    if args.worker:
        args.num_samples = int(args.num_samples[0])
        worker(args)
        return 0
    if args.quick:
        args.num_samples, args.steps, args.warmup = [1e5], min(args.steps, 5), min(args.warmup, 1)
    rep = Report.at(
        report_path(args.out, HERE / "results" / "decl_state", args.quick),
        command_line("decl_state.py", sys.argv[1:] if argv is None else argv, python="python"),
    )
    measured = {}
    for n in (int(v) for v in args.num_samples):
        measured[n] = {}
        for mode in MODES + ("both",):
            print(f"measuring {mode} at num_samples={n:.0e} on {args.nproc} ranks ...", flush=True)
            measured[n][mode] = measure(n, mode, args)
    comp = computed(args.global_batch_at_scale)
    for row in comp:
        row["global_batch"] = args.global_batch_at_scale
    print("16-bit storage error ...", flush=True)
    prec = precision()
    text = report(measured, comp, prec, args, rep.about())
    rep.write(text, {"measured": {str(k): v for k, v in measured.items()}, "computed": comp, "precision": prec})
    print(text)
    return 0


# ------------------------------------------------------------------------------------------
# The README's and docs' numbers (benchmarks/quotes.py)
# ------------------------------------------------------------------------------------------
def readme_block(doc: dict) -> str:
    """The README's tables (measured per layout; computed at scale) and the 16-bit storage errors."""
    lines = [
        "| num_samples | state MB / rank, replicated → sharded | peak RSS MB, replicated → sharded "
        "| step time, sharded / replicated | digests identical |",
        "|---:|---:|---:|---:|---|",
    ]
    for n, by_mode in doc["measured"].items():
        rep, sha = by_mode["replicated"][0], by_mode["sharded"][0]
        steps = by_mode["both"][0]["step_ms"]
        same = len({r["digest"] for m in MODES for r in by_mode[m]}) == 1 and all(
            r["same_state"] for r in by_mode["both"]
        )
        lines.append(
            f"| {int(n):.0e} | {rep['state_bytes'] / 1e6:.0f} → {sha['state_bytes'] / 1e6:.0f} | "
            f"{rep['peak_rss_mb']:.0f} → {sha['peak_rss_mb']:.0f} | {steps['sharded'] / steps['replicated']:.2f} "
            f"| {'yes' if same else '**no**'} |"
        )
    comp = doc["computed"]
    lines += [
        "",
        f"Computed at scale (global batch {comp[0]['global_batch']:,}):",
        "",
        "| data | W | replicated fp32 GB / rank | sharded fp32 | sharded bf16 | sharded: all-reduce MB / step |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for data in dict.fromkeys(r["data"] for r in comp):
        rows = [r for r in comp if r["data"] == data]

        def cells(key, fmt):
            return " / ".join(format(r[key], fmt) for r in rows)

        lines.append(
            f"| {data} | {cells('world_size', 'd')} | {rows[0]['replicated_float32_gb']:.1f} | "
            f"{cells('sharded_float32_gb', '.3f')} | {cells('sharded_bfloat16_gb', '.3f')} | "
            f"{cells('allreduce_mb_per_step', '.2f')} |"
        )
    p = doc["precision"]
    lines += [
        "",
        f"16-bit storage against float32 over {p['epochs']} epochs of revisits ({p['num_samples']} samples): "
        f"{storage_errors(p)}.",
    ]
    return "\n".join(lines)


def storage_errors(p: dict) -> str:
    """How far 16-bit storage moved the stored log-rates and the loss (``p``: the JSON's ``precision``)."""
    return (
        f"stored log-rates within {p['float16']['rate_abs_err_max']:.0e} (float16) and "
        f"{p['bfloat16']['rate_abs_err_max']:.0e} (bfloat16), the loss within "
        f"{p['float16']['loss_rel_err_max']:.0e} and {p['bfloat16']['loss_rel_err_max']:.0e} relative"
    )


def docs_block(doc: dict) -> str:
    """docs/training.md's sizes: the buffer per rank at scale, the all-reduce per step, 16-bit storage errors."""
    comp, p = doc["computed"], doc["precision"]
    rep = {r["data"]: r["replicated_float32_gb"] for r in comp}
    w = max(r["world_size"] for r in comp if r["world_size"] < 512)
    sharded = ", ".join(f"{r['sharded_float32_gb'] * 1e3:.0f} MB at {r['data']}" for r in comp if r["world_size"] == w)
    return (
        f"Replicated, the float32 state is {', '.join(f'{gb:.1f} GB at {d}' for d, gb in rep.items())} on every "
        f"rank; sharded on W = {w} ranks, {sharded} per rank. The all-reduce moves at most "
        f"{max(r['allreduce_mb_per_step'] for r in comp):.1f} MB per rank per step at G = {comp[0]['global_batch']}. "
        f"16-bit storage against float32 ({p['epochs']} epochs of revisits): {storage_errors(p)} "
        "([results](../benchmarks/results/decl_state.md))."
    )


if __name__ == "__main__":
    sys.exit(main())
