"""Forward+backward time and peak memory of ``dcl`` and ``decl`` against OpenCLIP's ``ClipLoss``.

Single process, global batch G in {4096, 8192, 16384}, embedding dim 512, on the CPU and on CUDA
when present; every loss with the whole logit matrix (``tile=0``) and tiled (``tile=1024``). Times
are medians over interleaved repetitions (every loss once per round, so drift hits all alike); the
ratio column divides by ``ClipLoss`` measured in the same run. Peak memory is the extra peak over
the inputs: on CUDA ``torch.cuda.max_memory_allocated``; on the CPU
the peak resident set of a fresh child process per (loss, G), minus its resident set just before
the call (the CPU allocator has no peak counter). ``--peak-batches`` measures only the tiled losses'
memory at larger G, and the batch ceiling of each loss, the largest G whose forward and backward fit
in 4 GiB over the inputs, comes from a fit of its measured peaks (``a G^2 + b G`` for the whole
matrix, ``a G + b`` tiled).

``--precision amp_bf16`` runs every forward under ``torch.autocast(dtype=torch.bfloat16)``, as OpenCLIP's
``--precision amp_bf16`` trains: ``ClipLoss`` then takes its logits in bfloat16, ours in float32 (computed
outside autocast). On CUDA the matmuls may use TF32, as OpenCLIP's training allows
(``torch.backends.cuda.matmul.allow_tf32``).

    .venv/bin/python benchmarks/loss_speed.py                 # full run, writes results/loss_speed.md, .json
    .venv/bin/python benchmarks/loss_speed.py --quick         # G=256,1024, fewer repetitions, a temporary folder
    python benchmarks/loss_speed.py --batches 16384 --losses "clip (OpenCLIP ClipLoss)" "dcl tile=1024" --output X.md
    python benchmarks/loss_speed.py --devices cuda --precision amp_bf16 --batches 4096 16384 32768 --output X.md
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from clip_dcl.experiment.memory import MIB, current_rss_bytes, peak_rss_bytes
from clip_dcl.experiment.reporting import Report, command_line, markdown_table, report_path
from clip_dcl.losses import create_loss

DIM = 512
#: the column-tile width of the tiled rows
TILE = 1024
_INDEX = {"rate": "index", "num_samples": 1_000_000}
#: every loss twice: the whole logit matrix (tile=0) and tiled (tile=TILE); clip's tiled twin is InfoNCEFromStats
LOSSES = {
    "clip (OpenCLIP ClipLoss)": ("clip", {"tile": 0}),
    f"clip tile={TILE}": ("clip", {"tile": TILE}),
    "dcl": ("dcl", {"tau_plus": 0.1, "tile": 0}),
    f"dcl tile={TILE}": ("dcl", {"tau_plus": 0.1, "tile": TILE}),
    "dcl HCL beta=1": ("dcl", {"tau_plus": 0.1, "beta": 1.0, "tile": 0}),
    f"dcl HCL beta=1 tile={TILE}": ("dcl", {"tau_plus": 0.1, "beta": 1.0, "tile": TILE}),
    "decl rate=index": ("decl", {**_INDEX, "tile": 0}),
    f"decl rate=index tile={TILE}": ("decl", {**_INDEX, "tile": TILE}),
    "decl rate=queue (Q=4096)": ("decl", {"rate": "queue", "queue_size": 4096, "tile": 0}),
    f"decl rate=queue (Q=4096) tile={TILE}": ("decl", {"rate": "queue", "queue_size": 4096, "tile": TILE}),
    "decl rate=batch": ("decl", {"rate": "batch", "tile": 0}),
    f"decl rate=batch tile={TILE}": ("decl", {"rate": "batch", "tile": TILE}),
}
BASELINE = "clip (OpenCLIP ClipLoss)"
#: the losses of the batch ceiling (the largest G whose forward and backward fit in CEILING bytes)
CEILING_LOSSES = (BASELINE, "dcl", "dcl HCL beta=1", "decl rate=index") + tuple(
    f"{n} tile={TILE}" for n in ("clip", "dcl", "dcl HCL beta=1", "decl rate=index")
)
CEILING = 4 * 2**30
PRECISIONS = ("fp32", "amp_bf16")
#: the precision every step runs at (``--precision``; set once by :func:`main`, read by the child processes too)
PRECISION = "fp32"
#: the interpreter of the per-loss child processes that measure peak memory
PYTHON = sys.executable


def autocast(device):
    """``torch.autocast`` in bfloat16 on ``device`` under ``--precision amp_bf16``; nothing under fp32."""
    if PRECISION == "amp_bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def make_inputs(batch, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    f = F.normalize(torch.randn(batch, DIM, generator=gen), dim=-1).to(device).requires_grad_()
    g = F.normalize(torch.randn(batch, DIM, generator=gen), dim=-1).to(device).requires_grad_()
    s = torch.tensor(14.3, device=device, requires_grad=True)
    ids = torch.randperm(1_000_000, generator=gen)[:batch].to(device)
    return f, g, s, ids


def step(loss_fn, f, g, s, ids):
    with autocast(f.device):
        loss = loss_fn(f, g, s, sample_ids=ids)
    loss.backward()
    f.grad = g.grad = s.grad = None


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_losses(batch, device, rounds, names=None):
    f, g, s, ids = make_inputs(batch, device)
    warm = make_inputs(min(batch, 1024), device)  # kernels and thread pools loaded, a first batch queued
    fns = {name: create_loss(loss, **kw).to(device) for name, (loss, kw) in LOSSES.items() if name in (names or LOSSES)}
    for fn in fns.values():
        step(fn, *warm)
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            sync(device)
            t0 = time.perf_counter()
            step(fn, f, g, s, ids)
            sync(device)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) for name, v in times.items()}


def peak_memory_cuda(name, batch, device):
    loss, kw = LOSSES[name]
    f, g, s, ids = make_inputs(batch, device)
    fn = create_loss(loss, **kw).to(device)
    step(fn, f, g, s, ids)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step(fn, f, g, s, ids)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def saved_for_backward_bytes(name, batch, device):
    """Bytes of the distinct storages autograd keeps between forward and backward (exact): all of them, and those
    beyond the loss's inputs (the features and the scale, which the caller holds whether or not they are saved)."""
    loss, kw = LOSSES[name]
    f, g, s, ids = make_inputs(batch, device)
    fn = create_loss(loss, **kw).to(device)
    step(fn, f, g, s, ids)
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast(device):
        fn(f, g, s, sample_ids=ids)
    inputs = {t.untyped_storage().data_ptr() for t in (f, g, s)}
    return sum(storages.values()), sum(v for k, v in storages.items() if k not in inputs)


def saved_fields(name, batch, device):
    total, beyond = saved_for_backward_bytes(name, batch, device)
    return {"saved_bytes": total, "saved_beyond_inputs_bytes": beyond}


def peak_memory_cpu_child(name, batch):
    """Run in a fresh process: extra peak RSS of one forward+backward, in bytes."""
    loss, kw = LOSSES[name]
    fn = create_loss(loss, **kw)
    step(fn, *make_inputs(16, torch.device("cpu"), seed=1))  # load kernels and thread pools first
    f, g, s, ids = make_inputs(batch, torch.device("cpu"))
    if loss == "decl" and kw.get("rate") == "queue":
        step(fn, f, g, s, ids)  # a full queue, as in steady state
    rss_before = current_rss_bytes()
    step(fn, f, g, s, ids)
    return max(0, peak_rss_bytes() - rss_before)


def peak_memory_cpu(name, batch):
    out = subprocess.run(
        [PYTHON, __file__, "--precision", PRECISION, "--child-memory", name, str(batch)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--quick", action="store_true", help="G=256,1024 only, 3 rounds")
    parser.add_argument("--batches", type=int, nargs="+", default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument(
        "--devices",
        nargs="+",
        choices=("cpu", "cuda"),
        default=None,
        help="where to time (default: the CPU, and CUDA when present)",
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help="fp32, or amp_bf16: every forward under bfloat16 autocast, as OpenCLIP trains with it",
    )
    parser.add_argument(
        "--output",
        default=None,
        help="the report's Markdown; its JSON goes beside it (default results/loss_speed.md; "
        "with --quick a temporary folder)",
    )
    parser.add_argument(
        "--losses",
        nargs="+",
        choices=tuple(LOSSES),
        default=None,
        help="the rows to run (default: all; the baseline always)",
    )
    parser.add_argument(
        "--peak-batches",
        type=int,
        nargs="*",
        default=None,
        help="larger G at which only the tiled losses' memory is measured (CPU; default 32768, none with --quick or "
        "--batches)",
    )
    parser.add_argument("--child-memory", nargs=2, metavar=("LOSS", "G"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global PRECISION
    PRECISION = args.precision
    if args.child_memory:
        print(peak_memory_cpu_child(args.child_memory[0], int(args.child_memory[1])))
        return 0
    batches = args.batches or ([256, 1024] if args.quick else [4096, 8192, 16384])
    chosen = [n for n in LOSSES if n == BASELINE or args.losses is None or n in args.losses]
    peak_batches = args.peak_batches
    if peak_batches is None:
        peak_batches = [] if args.quick or args.batches else [32768]
    names = args.devices or ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if "cuda" in names and not torch.cuda.is_available():
        parser.error("--devices cuda: torch.cuda.is_available() is False on this machine")
    if "cuda" in names:
        torch.backends.cuda.matmul.allow_tf32 = True  # as OpenCLIP's training sets it
        torch.backends.cudnn.allow_tf32 = True
    devices = [torch.device(n) for n in names]
    rows = []
    for device in devices:
        for batch in batches:
            rounds = args.rounds or (3 if args.quick else (5 if batch >= 4096 and device.type == "cpu" else 10))
            print(f"[{device.type}] G={batch}: timing {len(chosen)} losses x {rounds} rounds ...", flush=True)
            times = time_losses(batch, device, rounds, chosen)
            for name in chosen:
                mem = peak_memory_cuda(name, batch, device) if device.type == "cuda" else peak_memory_cpu(name, batch)
                rows.append(
                    {
                        "device": device.type,
                        "G": batch,
                        "loss": name,
                        "seconds": times[name],
                        "peak_extra_bytes": mem,
                        **saved_fields(name, batch, device),
                    }
                )
    peak_rows = []
    for batch in peak_batches if any(d.type == "cpu" for d in devices) else []:
        for name in chosen:
            if LOSSES[name][1].get("tile"):
                print(f"[cpu] G={batch}: peak memory of {name} ...", flush=True)
                peak_rows.append(
                    {
                        "device": "cpu",
                        "G": batch,
                        "loss": name,
                        "peak_extra_bytes": peak_memory_cpu(name, batch),
                        **saved_fields(name, batch, torch.device("cpu")),
                    }
                )
    ceilings = batch_ceilings(rows + peak_rows, chosen)
    base = {(r["device"], r["G"]): r for r in rows if r["loss"] == BASELINE}

    def cells(r):
        b = base[(r["device"], r["G"])]
        mem_ratio = r["peak_extra_bytes"] / b["peak_extra_bytes"] if b["peak_extra_bytes"] else float("nan")
        return [
            r["device"],
            r["G"],
            r["loss"],
            f"{1000 * r['seconds']:.1f}",
            f"{r['seconds'] / b['seconds']:.2f}x",
            f"{r['saved_bytes'] / MIB:.1f}",
            f"{r['saved_bytes'] / b['saved_bytes']:.3f}x",
            f"{r['saved_beyond_inputs_bytes'] / b['saved_beyond_inputs_bytes']:.4f}x",
            f"{r['peak_extra_bytes'] / MIB:.1f}",
            f"{mem_ratio:.2f}x",
        ]

    table = markdown_table(
        [
            "device",
            "G",
            "loss",
            "fwd+bwd ms",
            "time / ClipLoss",
            "saved for backward MiB",
            "saved / ClipLoss",
            "beyond the inputs / ClipLoss",
            "extra peak MiB",
            "peak / ClipLoss",
        ],
        map(cells, rows),
    )
    peak_table = markdown_table(
        ["G", "loss", "saved for backward MiB", "beyond the inputs MiB", "extra peak MiB"],
        [
            [
                r["G"],
                r["loss"],
                f"{r['saved_bytes'] / MIB:.1f}",
                f"{r['saved_beyond_inputs_bytes'] / MIB:.2f}",
                f"{r['peak_extra_bytes'] / MIB:.1f}",
            ]
            for r in peak_rows
        ],
    )
    ceiling_table = markdown_table(
        ["loss", "batch ceiling G (fit)", "fit", "largest G measured", "its extra peak MiB"],
        [
            [
                c["loss"],
                f"{c['ceiling']:,}",
                c["model"],
                f"{c['largest_measured']:,}",
                f"{c['largest_measured_peak_bytes'] / MIB:.1f}",
            ]
            for c in ceilings
        ],
    )
    print(table)
    if peak_rows:
        print(peak_table)
    print(ceiling_table)
    report = Report.at(
        report_path(
            args.output and Path(args.output).with_suffix(""),
            Path(__file__).parent / "results" / "loss_speed",
            args.quick,
        ),
        command_line("loss_speed.py", sys.argv[1:] if argv is None else argv, python="python"),
    )
    md = report.write(
        [
            "# Loss forward+backward: time and peak memory against OpenCLIP's ClipLoss",
            "",
            *report.about(),
            f"- embedding dim {DIM}, one process, float32 features, precision {PRECISION}"
            + (" (every forward under bfloat16 autocast)" if PRECISION == "amp_bf16" else "")
            + (
                "; TF32 matmuls allowed on CUDA, as OpenCLIP's training sets"
                if any(d.type == "cuda" for d in devices)
                else ""
            )
            + f"; devices: {', '.join(_device_name(d) for d in devices)}; medians over interleaved rounds;",
            "- saved for backward: the distinct storages autograd keeps between forward and backward",
            "  (exact; the G x G logits are 4 G^2 bytes: 64 MiB at G=4096); beyond the inputs: less the",
            "  storages of the features and the scale the loss was given (2 G d 4 bytes: 32 MiB at G=8192),",
            "  which the caller holds whether or not autograd keeps them;",
            "- extra peak: over the inputs (CUDA allocator peak, or a child process's peak RSS on CPU, which",
            "  is noisy at small G, where allocator and thread-pool start-up dominate);",
            f"- `tile={TILE}`: the statistics over column tiles of {TILE} logits, recomputed in backward"
            " (`clip_dcl.losses.tiled`); `clip tile=...` is `InfoNCEFromStats`, the other rows keep the whole matrix;",
            f"- raw numbers: `{report.stem}.json`.",
            "",
            table,
            *(["", "## Tiled losses at larger G (CPU; memory only)", "", peak_table] if peak_rows else []),
            "",
            f"## Batch ceiling: the largest G whose forward and backward fit in {CEILING / 2**30:g} GiB",
            "",
            "From a least-squares fit of each loss's measured extra peaks on the CPU: `a G^2 + b G` with the",
            "whole matrix, `a G + b` tiled (its memory is linear in G); an extrapolation where the ceiling lies",
            "beyond the largest G measured, which the last two columns give.",
            "",
            ceiling_table,
        ],
        {
            "dim": DIM,
            "tile": TILE,
            "precision": PRECISION,
            "devices": [_device_name(d) for d in devices],
            "rows": rows,
            "peak_rows": peak_rows,
            "ceiling_bytes": CEILING,
            "ceilings": ceilings,
        },
    )
    print(f"wrote {md}, {report.stem}.json")
    return 0


def batch_ceilings(rows, names):
    """Per loss with CPU peaks at two G or more: the largest G whose fitted extra peak is at most `CEILING`."""
    out = []
    for name in names:
        points = sorted((r["G"], r["peak_extra_bytes"]) for r in rows if r["loss"] == name and r["device"] == "cpu")
        if name not in CEILING_LOSSES or len({g for g, _ in points}) < 2:
            continue
        tiled = bool(LOSSES[name][1].get("tile"))
        # least squares of peak = a G^2 + b G (whole matrix) or a G + b (tiled)
        x = torch.tensor([[g * g, g] if not tiled else [g, 1] for g, _ in points], dtype=torch.float64)
        y = torch.tensor([p for _, p in points], dtype=torch.float64)
        a, b = torch.linalg.lstsq(x, y[:, None]).solution[:, 0].tolist()
        if tiled:
            ceiling = (CEILING - b) / a
        else:
            ceiling = (-b + math.sqrt(b * b + 4 * a * CEILING)) / (2 * a)
        out.append(
            {
                "loss": name,
                "ceiling": math.floor(ceiling * (1 + 1e-9)) // 256 * 256,  # down to 256: a fit, not a bisection
                "model": "a G + b" if tiled else "a G^2 + b G",
                "coefficients": [a, b],
                "largest_measured": points[-1][0],
                "largest_measured_peak_bytes": points[-1][1],
            }
        )
    return out


def _ratio(doc, name, key, batch):
    rows = {r["loss"]: r for r in doc["rows"] if r["device"] == "cpu" and r["G"] == batch}
    return rows[name][key] / rows[BASELINE][key]


def readme_block(doc) -> str:
    """The README's sentence on the tiled losses' memory and time (from ``loss_speed.json``)."""
    batches = sorted({r["G"] for r in doc["rows"] if r["device"] == "cpu"})
    batch = 8192 if 8192 in batches else batches[-1]
    tile = doc["tile"]
    ours = [
        ("`dcl`", f"dcl tile={tile}"),
        ("HCL", f"dcl HCL beta=1 tile={tile}"),
        ("`decl`", f"decl rate=index tile={tile}"),
    ]
    peaks = ", ".join(f"{label} {_ratio(doc, name, 'peak_extra_bytes', batch):.2f}x" for label, name in ours)
    times = [_ratio(doc, name, "seconds", batch) for _, name in ours]
    ceilings = {c["loss"]: c for c in doc.get("ceilings", [])}
    text = (
        f"With `--loss-tile {tile}` every loss computes the logits' statistics over column tiles of {tile}, "
        "recomputed in backward "
        "([training.md](docs/training.md#the-loss-over-column-tiles---loss-tile)): "
        f"at G = {batch:,} (one process, d = {doc['dim']}) the extra peak memory "
        f"against OpenCLIP's `ClipLoss` is {peaks}, in {min(times):.2f}x to {max(times):.2f}x its time"
    )
    name = f"decl rate=index tile={tile}"
    if BASELINE in ceilings and name in ceilings:
        base, ours_c = ceilings[BASELINE], ceilings[name]
        text += (
            f"; the largest G whose forward and backward fit in {doc['ceiling_bytes'] / 2**30:g} GiB, from fits of "
            f"the measured peaks, is {base['ceiling']:,} for `ClipLoss` (measured to G = "
            f"{base['largest_measured']:,}) and {ours_c['ceiling']:,} for tiled `decl` (its memory linear in G, "
            f"measured to G = {ours_c['largest_measured']:,})"
        )
    return text + f" ([results](benchmarks/results/loss_speed.md), {doc['date'][:10]}, {doc['machine']})."


def peak_block(doc) -> str:
    """The README's figure of the tiled losses' memory at the largest G (from ``loss_speed_32k.json``)."""
    rows = sorted(doc["peak_rows"], key=lambda r: r["G"])
    last = rows[-1]
    return (
        f"At G = {last['G']:,}, `{last['loss']}` peaks at {last['peak_extra_bytes'] / MIB:,.0f} MiB over its inputs "
        f"on the CPU, where the four G x G float32 matrices that `ClipLoss`'s peak holds take "
        f"{16 * last['G'] ** 2 / 2**30:,.0f} GiB ([results](benchmarks/results/loss_speed_32k.md), {doc['date'][:10]})."
    )


def default_block(doc) -> str:
    """The README's sentence on the CPU's default tile (`clip_dcl.losses.tiled.DEFAULT_TILE`), from the small
    batches' ``loss_speed_small.json`` and the large ones' ``loss_speed.json``: where each loss took less time tiled
    than with the whole matrix."""
    import json

    from clip_dcl.losses.tiled import DEFAULT_TILE

    large = json.loads((Path(__file__).parent / "results" / "loss_speed.json").read_text())
    start, tile = DEFAULT_TILE["cpu"]
    losses = [("`dcl`", "dcl"), ("HCL", "dcl HCL beta=1"), ("`decl`", "decl rate=index")]

    def faster_tiled(d, batch):  # the losses whose tiled row took less time than their whole-matrix row
        return [
            label
            for label, name in losses
            if _ratio(d, f"{name} tile={tile}", "seconds", batch) < _ratio(d, name, "seconds", batch)
        ]

    def listed(gs):
        return ", ".join(f"{g:,}" for g in gs[:-1]) + (" and " if len(gs) > 1 else "") + f"{gs[-1]:,}"

    above = sorted({r["G"] for r in large["rows"] if r["device"] == "cpu" and r["G"] >= start})
    below = sorted({r["G"] for r in doc["rows"] if r["device"] == "cpu" and r["G"] < start})
    every = all(len(faster_tiled(large, g)) == len(losses) for g in above)
    whole = [label for label, _ in losses if all(label not in faster_tiled(doc, g) for g in below)]
    return (
        f"The default follows the measurements: on a CPU a square logit matrix of {start:,} columns or more takes "
        f"tiles of {tile} (at G = {listed(above)} the tiles took less time than the whole matrix for "
        f"{'every loss' if every else 'some losses'}: [results](benchmarks/results/loss_speed.md)), a smaller one the "
        f"whole matrix (at G = {listed(below)} it took less time for {' and '.join(whole) or 'no loss'}; "
        f"[results](benchmarks/results/loss_speed_small.md), {doc['date'][:10]}); on a GPU the whole matrix, until "
        "the tiled code is measured there."
    )


def _device_name(device):
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


if __name__ == "__main__":
    sys.exit(main())
