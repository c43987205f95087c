"""Time and peak memory of the chunked retrieval metrics against the naive full-matrix computation.

Each measurement runs in a fresh subprocess, so that its peak resident memory (``ru_maxrss``) is
its own: we report the peak minus the resident size just before the metric call (embeddings
allocated, one warm-up call on 64 pairs done), i.e. the extra memory the metric needs.

* ``chunked``: :func:`clip_dcl.eval.metrics.retrieval_metrics` (bound: 4 x chunk x N + 4 x N x D
  bytes + ~9 MB, see its docstring).
* ``naive``: OpenCLIP's ``get_clip_metrics`` (full N x N logits, then an N x N argsort).

Two memory figures for the chunked runs: ``live`` with ``MALLOC_MMAP_THRESHOLD_=65536`` (glibc
then maps every block over 64 KB separately and returns it when freed, so the peak RSS is the
live memory the bound speaks of) and ``default`` with glibc's default allocator (whose dynamic
threshold keeps freed chunk buffers in the heap, so RSS runs higher than live memory).

Usage::

    python benchmarks/retrieval_speed.py                       # 20k chunked, naive at 5k/10k/20k
    python benchmarks/retrieval_speed.py --sizes 20000 --naive-sizes 5000 --chunk-sizes 256 1024
    python benchmarks/retrieval_speed.py --output benchmarks/results/retrieval_speed.json
    python benchmarks/retrieval_speed.py --quick                # N = 2000: a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from clip_dcl.experiment.reporting import command_line, machine_info, report_path, utc_date, write_json

_CHILD = r"""
import json, sys, time, torch
from clip_dcl.experiment.memory import current_rss_mib, peak_rss_mib
mode, n, d, chunk, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(threads)
g = torch.Generator().manual_seed(0)
img = torch.nn.functional.normalize(torch.randn(n, d, generator=g), dim=-1)
txt = torch.nn.functional.normalize(img + torch.randn(n, d, generator=g), dim=-1)
if mode == "chunked":
    from clip_dcl.eval.metrics import retrieval_metrics
    fn = lambda x, y: retrieval_metrics(x, y, chunk_size=chunk)
else:
    from open_clip_train.train import get_clip_metrics
    fn = lambda x, y: get_clip_metrics(x, y, torch.tensor(1.0))
fn(img[:64], txt[:64])  # one-time costs (BLAS set-up, lazy imports) out of the measurement
before = current_rss_mib()
t = time.perf_counter()
m = fn(img, txt)
seconds = time.perf_counter() - t
print(json.dumps({"seconds": seconds, "extra_peak_mb": peak_rss_mib() - before,
                  "metrics": {k: float(v) for k, v in m.items() if "recall" not in k}}))
"""


def measure(mode: str, n: int, dim: int, chunk: int, threads: int, live: bool) -> dict:
    env = dict(os.environ)
    if live:
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    res = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, str(n), str(dim), str(chunk), str(threads)],
        capture_output=True,
        text=True,
        env=env,
    )
    row = {
        "mode": mode,
        "n": n,
        "dim": dim,
        "chunk": chunk,
        "threads": threads,
        "allocator": "live" if live else "default",
    }
    if res.returncode != 0:
        row["error"] = (res.stderr.strip().splitlines() or ["killed"])[-1]
        return row
    row.update(json.loads(res.stdout.strip().splitlines()[-1]))
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, default, what in (
        ("--sizes", [20000], "N for the chunked computation only"),
        ("--naive-sizes", [5000, 10000, 20000], "N for both computations (default 5000 10000 20000)"),
        ("--chunk-sizes", [256, 1024], "chunk sizes (default 256 1024)"),
    ):
        p.add_argument(flag, type=int, nargs="+", default=default, help=what)
    p.add_argument("--dim", type=int, default=512, help="embedding size (default 512, ViT-B)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--output", default=None, help="also write the raw results as JSON")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: N 2000, chunk 256; the JSON goes to a new temporary folder unless --output",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.naive_sizes, args.chunk_sizes = [2000], [2000], [256]
        args.output = report_path(args.output, "retrieval_speed", quick=True).with_suffix(".json")

    rows = []
    for n in sorted(set(args.sizes) | set(args.naive_sizes)):
        for chunk in args.chunk_sizes:
            for live in (True, False):
                rows.append(measure("chunked", n, args.dim, chunk, args.threads, live))
                print(json.dumps(rows[-1]), flush=True)
        if n in args.naive_sizes:
            rows.append(measure("naive", n, args.dim, 0, args.threads, True))
            print(json.dumps(rows[-1]), flush=True)

    print(f"\n{'mode':8} {'N':>7} {'chunk':>6} {'allocator':>9} {'seconds':>8} {'extra peak MB':>14} {'bound MB':>9}")
    for r in rows:
        if "error" in r:
            print(f"{r['mode']:8} {r['n']:>7} {r['chunk']:>6} {r['allocator']:>9}  failed: {r['error']}")
            continue
        if r["mode"] == "chunked":
            bound = (4 * r["chunk"] * r["n"] + 4 * r["n"] * r["dim"] + 9 * 2**20) / 2**20
        else:
            bound = 4 * r["n"] ** 2 / 2**20
        print(
            f"{r['mode']:8} {r['n']:>7} {r['chunk']:>6} {r['allocator']:>9} {r['seconds']:>8.2f} "
            f"{r['extra_peak_mb']:>14.0f} {bound:>9.0f}"
        )
    print("(bound: chunked 4 x chunk x N + 4 x N x D bytes + 9 MB; naive: the N x N float32 logits alone)\n")
    for n in args.naive_sizes:
        naive = next((r for r in rows if r["mode"] == "naive" and r["n"] == n and "error" not in r), None)
        if naive is None:
            continue
        for r in rows:
            if r["mode"] == "chunked" and r["n"] == n and r["allocator"] == "live" and "error" not in r:
                recall_keys = [k for k in naive["metrics"] if "_R@" in k]
                same_recall = all(r["metrics"][k] == naive["metrics"][k] for k in recall_keys)
                rank_diff = max(abs(r["metrics"][k] - naive["metrics"][k]) for k in naive["metrics"] if "rank" in k)
                print(
                    f"N={n} chunk={r['chunk']}: naive/chunked time {naive['seconds'] / r['seconds']:.1f}x, "
                    f"memory {naive['extra_peak_mb'] / max(r['extra_peak_mb'], 1):.0f}x; "
                    f"R@k identical: {same_recall}; max |mean/median rank difference| {rank_diff:.2g}"
                )
    if args.output:
        write_json(
            args.output,
            {
                "machine": machine_info(),
                "date": utc_date(),
                "command": command_line("retrieval_speed.py", sys.argv[1:] if argv is None else argv),
                "results": rows,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
