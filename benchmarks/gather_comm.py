"""Communication of one loss step: ``--gather-with-grad`` against ``--no-grad-gather``.

Every ``torch.distributed`` collective that the loss runs in one step (forward and backward) is
counted by wrapping the module's functions (OpenCLIP's ``gather_features``, torch's autograd
all-gather and clip-dcl's own collectives all call them); DDP's all-reduce of the parameter
gradients is the same in both modes and not counted. Bytes are those each rank *sends* under the
usual ring / pairwise algorithms: all-gather of an ``S``-byte part ``(W - 1) S``; all-reduce of
``S`` bytes ``2 (W - 1) / W S``; reduce-scatter to ``S`` bytes and all-to-all of ``W`` parts of
``S``: ``(W - 1) S`` (gloo runs the autograd all-gather's backward as one scatter from each rank,
NCCL as a reduce-scatter: the same bytes).

1. **Counted** on ``--nproc`` gloo ranks (2 and 4 by default) for clip, dcl and decl (index rate,
   sharded state) at local batch ``--batch`` and d = ``--dim``, and checked against the closed
   form of :func:`predicted` (the script stops if they differ).
2. **Computed** from that closed form for G in {1024, 8192, 32768}, d in {512, 768}, W in
   {2, 8, 64} (features in bf16 as on GPUs, per-anchor scalars in float32).
3. **Step time** on gloo CPU: the loss's forward + backward, both modes in one process on the same
   inputs, alternating which goes first; the ratio is no-grad-gather over gather-with-grad.

    .venv/bin/python benchmarks/gather_comm.py                # writes results/gather_comm.md/.json
    .venv/bin/python benchmarks/gather_comm.py --quick        # smoke run, report in a temporary folder
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from clip_dcl.experiment import torchrun
from clip_dcl.experiment.reporting import Report, add_report_arguments, command_line, markdown_table, report_path
from clip_dcl.losses import create_loss

HERE = Path(__file__).resolve().parent

LOSSES = {"clip": {}, "dcl": {"tau_plus": 0.1}, "decl": {"rate": "index", "num_samples": 1_000_000}}
MODES = ("gather_with_grad", "no_grad_gather")
WRAPPED = (
    "all_gather",
    "all_reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_gather_into_tensor",
    "broadcast",
    "scatter",
)


class CollectiveCounter:
    """Wraps ``torch.distributed``'s collectives; ``sent`` holds bytes sent per rank, by operation."""

    def __init__(self, world_size: int):
        self.world = world_size
        self.sent = defaultdict(int)
        self.calls = defaultdict(int)
        self.active = False
        self._saved = {}

    def _bytes(self, name, args, kwargs):
        def size(t):
            return t.numel() * t.element_size()

        w = self.world
        if name == "all_gather":  # (outputs, input)
            return (w - 1) * size(args[1])
        if name == "all_gather_into_tensor":  # (output, input)
            return (w - 1) * size(args[1])
        if name == "all_reduce":
            return 2 * (w - 1) * size(args[0]) // w
        if name == "reduce_scatter":  # (output, inputs)
            return (w - 1) * size(args[0])
        if name == "reduce_scatter_tensor":
            return (w - 1) * size(args[0])
        if name == "all_to_all":  # (outputs, inputs): one part kept
            return sum(size(t) for t in args[1]) * (w - 1) // w
        if name == "broadcast":
            return size(args[0])
        if name == "scatter":  # (output, parts, src): the root sends every other rank its part
            src = args[2] if len(args) > 2 else kwargs.get("src")
            return (w - 1) * size(args[0]) if src == dist.get_rank() else 0
        return 0

    def __enter__(self):
        for name in WRAPPED:
            fn = getattr(dist, name)
            self._saved[name] = fn

            def wrapped(*args, _fn=fn, _name=name, **kwargs):
                if self.active:
                    self.sent[_name] += self._bytes(_name, args, kwargs)
                    self.calls[_name] += 1
                return _fn(*args, **kwargs)

            setattr(dist, name, wrapped)
        return self

    def __exit__(self, *exc):
        for name, fn in self._saved.items():
            setattr(dist, name, fn)


def predicted(loss: str, mode: str, batch: int, dim: int, world: int, feat_bytes: int = 4) -> int:
    """Bytes each rank sends in one step, in closed form (local batch ``batch``, G = W x batch)."""
    w1, g = world - 1, world * batch
    total = 2 * w1 * batch * dim * feat_bytes  # forward: all-gather of both modalities' features
    if mode == "gather_with_grad":
        total += 2 * w1 * batch * dim * feat_bytes  # backward: their gradients, reduce-scattered
    else:
        total += w1 * 4 * batch * 4  # (lse_neg, dL/dlse_neg) of both directions, float32
    if loss == "decl":  # index rate, sharded state: ids, then one all-reduce of (rates, estimates)
        total += w1 * batch * 8 + 2 * w1 * (4 * g * 4) // world
    return total


def _inputs(batch, dim, rank, seed):
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    f = F.normalize(torch.randn(batch, dim, generator=gen), dim=-1).requires_grad_()
    g = F.normalize(torch.randn(batch, dim, generator=gen), dim=-1).requires_grad_()
    ids = torch.randperm(1_000_000, generator=torch.Generator().manual_seed(seed))[rank * batch : (rank + 1) * batch]
    return f, g, ids


def worker(args) -> None:
    """One rank of :func:`launch`: leaves its record for the launcher."""
    with torchrun.process_group() as (rank, world):
        torchrun.write_rank_record(args, rank, _count_and_time(args, rank, world))


def _count_and_time(args, rank: int, world: int) -> dict:
    """Bytes and collectives of the first step of each loss and mode, then the median step times."""
    out = {"rank": rank, "world_size": world, "counted": {}, "step_ms": {}}
    with CollectiveCounter(world) as counter:
        for name, kw in LOSSES.items():
            fns = {
                mode: create_loss(
                    name,
                    rank=rank,
                    world_size=world,
                    local_loss=True,
                    gather_with_grad=mode == "gather_with_grad",
                    no_grad_gather=mode == "no_grad_gather",
                    **kw,
                )
                for mode in MODES
            }
            times = {mode: [] for mode in MODES}
            for step in range(args.warmup + args.steps + 1):
                f, g, ids = _inputs(args.batch, args.dim, rank, step)
                for mode in MODES if step % 2 == 0 else MODES[::-1]:
                    counter.active = step == 0
                    counter.sent.clear()
                    counter.calls.clear()
                    dist.barrier()
                    t0 = time.perf_counter()
                    fns[mode](f, g, torch.tensor(14.3), sample_ids=ids).backward()
                    elapsed = time.perf_counter() - t0
                    counter.active = False
                    f.grad = g.grad = None
                    if step == 0:
                        out["counted"][f"{name}/{mode}"] = {
                            "bytes": sum(counter.sent.values()),
                            "calls": dict(counter.calls),
                        }
                    elif step > args.warmup:
                        times[mode].append(elapsed)
            out["step_ms"][name] = {mode: 1e3 * statistics.median(t) for mode, t in times.items()}
    return out


def launch(nproc, args) -> dict:
    """Rank 0's record of a run on ``nproc`` gloo ranks."""
    return torchrun.launch(
        __file__,
        nproc,
        ["--batch", str(args.batch), "--dim", str(args.dim), "--steps", str(args.steps), "--warmup", str(args.warmup)],
    )[0]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, nargs="+", default=[2, 4])
    p.add_argument("--batch", type=int, default=128, help="local batch per rank")
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    add_report_arguments(p, "gather_comm", "2 ranks, local batch 16, d 32, 2 steps")
    torchrun.add_worker_arguments(p)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if args.quick:
        args.nproc, args.batch, args.dim, args.steps, args.warmup = [2], 16, 32, 2, 1
    rep = Report.at(
        report_path(args.out, HERE / "results" / "gather_comm", args.quick),
        command_line("gather_comm.py", sys.argv[1:] if argv is None else argv, python="python"),
    )
    measured = {}
    for nproc in args.nproc:
        print(f"counting on {nproc} gloo ranks ...", flush=True)
        measured[nproc] = launch(nproc, args)
        for key, rec in measured[nproc]["counted"].items():
            loss, mode = key.split("/")
            want = predicted(loss, mode, args.batch, args.dim, nproc)
            rec["predicted"] = want
            if rec["bytes"] != want:
                raise SystemExit(f"{key} on {nproc} ranks: counted {rec['bytes']} bytes, the closed form says {want}")
    computed = []
    for g in (1024, 8192, 32768):
        for d in (512, 768):
            for w in (2, 8, 64):
                row = {"G": g, "d": d, "W": w}
                for loss in LOSSES:
                    for mode in MODES:
                        row[f"{loss}/{mode}"] = predicted(loss, mode, g // w, d, w, feat_bytes=2)
                computed.append(row)
    counted = []
    for nproc, res in measured.items():
        for loss in LOSSES:
            a, b = res["counted"][f"{loss}/gather_with_grad"], res["counted"][f"{loss}/no_grad_gather"]
            t = res["step_ms"][loss]
            calls = ", ".join(f"{k} x{v}" for k, v in sorted(b["calls"].items()))
            counted.append(
                [
                    nproc,
                    loss,
                    f"{a['bytes']:,}",
                    f"{b['bytes']:,}",
                    f"{b['bytes'] / a['bytes']:.3f}",
                    calls,
                    f"{t['gather_with_grad']:.1f}",
                    f"{t['no_grad_gather']:.1f}",
                    f"{t['no_grad_gather'] / t['gather_with_grad']:.2f}",
                ]
            )
    at_scale = []
    for r in computed:
        cw, cn = r["clip/gather_with_grad"], r["clip/no_grad_gather"]
        dw, dn = r["decl/gather_with_grad"], r["decl/no_grad_gather"]
        at_scale.append(
            [
                r["G"],
                r["d"],
                r["W"],
                f"{cw / 1e6:.2f}",
                f"{cn / 1e6:.2f}",
                f"{cn / cw:.3f}",
                f"{dw / 1e6:.2f}",
                f"{dn / 1e6:.2f}",
                f"{dn / dw:.3f}",
            ]
        )
    text = "\n".join(
        [
            "# Communication per loss step: --gather-with-grad against --no-grad-gather",
            "",
            *rep.about(),
            "- No GPU was available to this run: NCCL was not measured.",
            "",
            "Bytes each rank sends per step (forward + backward of the loss; DDP's parameter all-reduce, the "
            "same in both modes, is not counted), under ring all-gather / all-reduce and pairwise "
            "reduce-scatter / all-to-all. decl: index rate, sharded state.",
            "",
            f"## Counted on gloo (float32 features, local batch {args.batch}, d = {args.dim})",
            "",
            "Every count equals the closed form used below (checked by the script).",
            "",
            markdown_table(
                [
                    "W",
                    "loss",
                    "gather-with-grad bytes",
                    "no-grad-gather bytes",
                    "ratio",
                    "collectives (no-grad)",
                    "step ms (with grad)",
                    "step ms (no grad)",
                    "step ratio",
                ],
                counted,
                align="rlrrrlrrr",
            ),
            "",
            "## Computed: MB each rank sends per step (bf16 features, float32 per-anchor scalars)",
            "",
            markdown_table(
                ["G", "d", "W", "clip with grad", "clip no-grad", "ratio", "decl with grad", "decl no-grad", "ratio"],
                at_scale,
                align="r" * 9,
            ),
            "",
            "dcl moves exactly what clip moves in both modes.",
        ]
    )
    rep.write(text, {"measured": {str(k): v for k, v in measured.items()}, "computed": computed})
    print(text)
    return 0


# ------------------------------------------------------------------------------------------
# The README's and docs' numbers (benchmarks/quotes.py)
# ------------------------------------------------------------------------------------------
#: The README's rows of the computed table: (G, d, W).
README_ROWS = ((1024, 512, 8), (8192, 768, 8), (32768, 512, 64), (32768, 768, 64))


def byte_ratios(doc: dict) -> list:
    """no-grad / with-grad bytes of every loss and row of the computed table."""
    return [r[f"{loss}/no_grad_gather"] / r[f"{loss}/gather_with_grad"] for r in doc["computed"] for loss in LOSSES]


def readme_block(doc: dict) -> str:
    """The README's table (MB per rank per step at scale), the byte ratio's range and the measured step-time ratios."""
    lines = [
        "| G | d | W | clip, with grad | clip, no-grad | decl, with grad | decl, no-grad |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["computed"]:
        if (r["G"], r["d"], r["W"]) in README_ROWS:
            lines.append(
                f"| {r['G']} | {r['d']} | {r['W']} | "
                + " | ".join(f"{r[f'{loss}/{mode}'] / 1e6:.2f}" for loss in ("clip", "decl") for mode in MODES)
                + " |"
            )
    ratios = byte_ratios(doc)
    steps = [
        t["no_grad_gather"] / t["gather_with_grad"] for m in doc["measured"].values() for t in m["step_ms"].values()
    ]
    counted_ok = all(c["bytes"] == c["predicted"] for m in doc["measured"].values() for c in m["counted"].values())
    gs, ws = sorted({r["G"] for r in doc["computed"]}), sorted({r["W"] for r in doc["computed"]})
    lines += [
        "",
        f"Bytes counted on {' and '.join(doc['measured'])} gloo ranks "
        f"{'equal' if counted_ok else '**differ from**'} the closed form. No-grad over with-grad bytes: "
        f"{min(ratios):.3f}-{max(ratios):.3f} for G {gs[0]}-{gs[-1]}, W {ws[0]}-{ws[-1]}. Step time of the loss on "
        f"gloo CPU, no-grad / with-grad: {min(steps):.2f}-{max(steps):.2f}.",
    ]
    return "\n".join(lines)


def docs_block(doc: dict) -> str:
    """docs/training.md's sentence: the byte ratio's range."""
    ratios = byte_ratios(doc)
    gs, ws = sorted({r["G"] for r in doc["computed"]}), sorted({r["W"] for r in doc["computed"]})
    ds = sorted({r["d"] for r in doc["computed"]})
    return (
        f"`--no-grad-gather` sends {min(ratios):.3f} to {max(ratios):.3f} of `--gather-with-grad`'s bytes per step "
        f"for G {gs[0]}-{gs[-1]}, d {'/'.join(map(str, ds))}, W {ws[0]}-{ws[-1]}, bf16 features "
        "([results](../benchmarks/results/gather_comm.md))."
    )


if __name__ == "__main__":
    sys.exit(main())
