"""Testbed speed: a run of the testbed's recipe against today's, and whether batch size still matters on it.

The testbed answers "which loss, at which batch size" with many training runs, so the time of one
run sets how many a study can afford. This benchmark times the two recipes of
:mod:`clip_dcl.experiment.recipes` side by side in one call, on one data draw (the shards the old
recipe reads, packed once for the new one):

- ``micro-bpe`` (the testbed until 2026-11): ``clip-dcl-micro`` with OpenCLIP's 49,408-token BPE on
  webdataset shards (decode, transform and tokenise per sample, one loader worker), validation
  every epoch;
- ``micro-words`` (the default): the captions' own 745-token vocabulary and a 1-layer text tower,
  the training set packed in memory (no decode, captions tokenised once, the crop applied per
  batch), fused AdamW, validation every 4th epoch.

**Speed** (``--parts speed``): each recipe trains ``--epochs`` (default 20) at B = 32 and at B = 64
through ``python -m clip_dcl.train`` in a child process with one torch thread
(``OMP_NUM_THREADS=1``), one after the other; the time is the child's wall clock, start-up and
validation included, as a run in a study costs. The ratio new / old is taken at each batch size
within this call. **CUDA** (``--parts cuda``, only where ``torch.cuda.is_available()``): eight runs
of the new recipe at once at B = 32 on the GPU, each timed; where no GPU is visible the report says
so. **The gate** (``--parts gate``): the testbed must still reward a larger batch: ``clip`` at
B = 16 and 512 with seeds 0, 1, 2 on the new recipe, scored on the validation split (retrieval mean
R@1); the gate holds when the mean at 512 exceeds that at 16 by at least 3 points and the seeds'
ranges do not overlap. Finished gate runs are kept under ``--work`` and reused.

The report (``benchmarks/results/testbed_speed.{md,json}``) holds ``data_argv`` (the argv after
``clip-dcl`` that writes the new recipe's data into ``{DATA}``) and ``train_argv`` (the argv after
``python -m clip_dcl.train --`` of one 20-epoch B = 32 run reading ``{DATA}``, writing under
``{LOGS}``), so that anyone can rerun the recipe exactly.

    .venv/bin/python benchmarks/testbed_speed.py               # all parts (about 40 min on 2 idle cores)
    .venv/bin/python benchmarks/testbed_speed.py --quick       # smoke run, report under --work
    # a part run elsewhere (the CUDA part on a lent GPU), merged into the report with where it was made:
    python benchmarks/testbed_speed.py --parts cuda --out GPU/testbed_speed        # on the GPU machine
    .venv/bin/python benchmarks/testbed_speed.py --parts --merge benchmarks/results/testbed_speed.json \
        benchmarks/results/testbed_speed_cuda_h100.json
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from clip_dcl.experiment import arguments
from clip_dcl.experiment.recipes import DEFAULT_RECIPE, RECIPES, fill, get_recipe
from clip_dcl.experiment.reporting import Report, code_commit, command_line, markdown_table, utc_date
from clip_dcl.experiment.scoring import MEAN_R1, with_mean_r1
from clip_dcl.paths import write_json

HERE = Path(__file__).resolve().parent
STEM = "testbed_speed"
OLD = "micro-bpe"
SIZES = (32, 64)
GATE_SIZES = (16, 512)
GATE_SEEDS = (0, 1, 2)
GATE_POINTS = 0.03
#: runs of the new recipe at once on a GPU, and the time each may take (seconds)
CUDA_RUNS, CUDA_GOAL = 8, 60.0
#: the parts a call can run, and the keys of the report that hold each one
PARTS = {"speed": ("speed", "ratios"), "cuda": ("cuda", "cuda_note"), "gate": ("gate", "gate_verdict")}
#: the goal: the new recipe's run in at most this share of the old one's
GOAL = 0.33
#: a smoke run: small data written over the recipe's sizes (later flags win in both parsers)
QUICK_DATA = (
    "--train-samples",
    "512",
    "--shard-size",
    "64",
    "--val-samples",
    "128",
    "--test-samples",
    "64",
    "--zeroshot-per-class",
    "4",
    "--fewshot-train-per-class",
    "5",
    "--fewshot-test-per-class",
    "5",
)
QUICK_TRAIN = ("--train-num-samples", "512", "--val-num-samples", "128")


def make_data(folder: Path, quick: bool) -> dict:
    """The new recipe's data (the old recipe's shards plus ``train.npz``) in ``folder``; its summary."""
    argv = fill(get_recipe(DEFAULT_RECIPE).data_argv, folder) + (list(QUICK_DATA) if quick else [])
    if not (folder / "train.npz").is_file() or not (folder / "summary.json").is_file():
        subprocess.run(
            [sys.executable, "-m", "clip_dcl.cli", *argv, "--reuse", "--quiet"], check=True, stdout=subprocess.DEVNULL
        )
    summary, out = json.loads((folder / "summary.json").read_text()), folder.resolve()
    # the absolute paths the evaluators read (``clip_dcl.data.synth.generate`` returns them the same way)
    summary["out_dir"] = str(out)
    for split, key in (("train", "train_data"), ("val", "val_data"), ("test", "test_data")):
        if split in summary:
            summary[key] = str(out / summary[split]["pattern"])
    return summary


def train(
    recipe: str,
    data: Path,
    logs: Path,
    *,
    batch_size: int,
    epochs: int,
    seed: int = 0,
    name: str,
    quick: bool,
    device: str = "cpu",
    threads: int = 1,
) -> dict:
    """One run of ``recipe`` in a child process; its wall time, steps and checkpoint."""
    argv = fill(
        get_recipe(recipe).train_argv(batch_size=batch_size, seed=seed, epochs=epochs, name=name, device=device),
        data,
        logs,
    )
    argv += list(QUICK_TRAIN) if quick else []
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    log_dir = logs / name
    if log_dir.exists():
        import shutil

        shutil.rmtree(log_dir)
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "clip_dcl.train", "--", *argv], env=env, capture_output=True, text=True
    )
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(
            f"{recipe} B={batch_size} seed {seed} failed (exit {done.returncode}):\n" + done.stderr[-3000:]
        )
    samples = 512 if quick else 12000
    steps = epochs * (samples // batch_size)
    return {
        "recipe": recipe,
        "batch_size": batch_size,
        "epochs": epochs,
        "seed": seed,
        "steps": steps,
        "seconds": seconds,
        "ms_per_step": 1000 * seconds / steps,
        "threads": threads,
        "device": device,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "checkpoint": str(log_dir / "checkpoints" / f"epoch_{epochs}.pt"),
        "argv": argv,
    }


def speed(data: Path, work: Path, epochs: int, quick: bool) -> List[dict]:
    """Both recipes at every batch size of :data:`SIZES`, one after the other (the order alternates)."""
    rows = []
    for i, b in enumerate(SIZES):
        for recipe in (OLD, DEFAULT_RECIPE) if i % 2 == 0 else (DEFAULT_RECIPE, OLD):
            r = train(recipe, data, work / "speed", batch_size=b, epochs=epochs, name=f"{recipe}-b{b}", quick=quick)
            print(
                f"[testbed_speed] {recipe} B={b}: {r['seconds']:.1f} s ({r['ms_per_step']:.1f} ms a step)", flush=True
            )
            rows.append(r)
    return rows


def ratios(rows: Sequence[dict]) -> Dict[int, float]:
    """New / old wall time at each batch size."""
    by = {(r["recipe"], r["batch_size"]): r["seconds"] for r in rows}
    return {b: by[(DEFAULT_RECIPE, b)] / by[(OLD, b)] for b in SIZES if (OLD, b) in by and (DEFAULT_RECIPE, b) in by}


def cuda(data: Path, work: Path, epochs: int, quick: bool) -> Optional[List[dict]]:
    """:data:`CUDA_RUNS` runs of the new recipe at once on the GPU; None where there is none."""
    import torch

    if not torch.cuda.is_available():
        return None
    with concurrent.futures.ThreadPoolExecutor(CUDA_RUNS) as pool:
        futures = [
            pool.submit(
                train,
                DEFAULT_RECIPE,
                data,
                work / "cuda",
                batch_size=32,
                epochs=epochs,
                seed=s,
                name=f"cuda-{s}",
                quick=quick,
                device="cuda",
            )
            for s in range(CUDA_RUNS)
        ]
        return [f.result() for f in futures]


def gate_run(data: Path, summary: dict, work: Path, b: int, seed: int, epochs: int, quick: bool) -> dict:
    """``clip`` at batch ``b`` and ``seed`` on the new recipe, scored on the validation split (cached)."""
    from clip_dcl.experiment.scoring import evaluate

    cache = work / "gate" / f"b{b}-seed{seed}.json"
    if cache.is_file():
        return {**json.loads(cache.read_text()), "source": "reused"}
    r = train(
        DEFAULT_RECIPE,
        data,
        work / "gate",
        batch_size=b,
        epochs=epochs,
        seed=seed,
        name=f"b{b}-seed{seed}",
        quick=quick,
    )
    scores = with_mean_r1(evaluate(r["checkpoint"], summary, split="validation", fewshot=False, device="cpu"))
    record = {**r, "commit": code_commit(), "metrics": scores, "finished": utc_date()}
    cache.parent.mkdir(parents=True, exist_ok=True)
    write_json(cache, record)
    return {**record, "source": "trained"}


def gate(
    data: Path, summary: dict, work: Path, epochs: int, quick: bool, jobs: int, sizes: Sequence[int] = GATE_SIZES
) -> List[dict]:
    """Every gate run, ``jobs`` at once (one torch thread each)."""
    plan = [(b, s) for b in sizes for s in GATE_SEEDS]
    out = []
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for r in pool.map(lambda job: gate_run(data, summary, work, job[0], job[1], epochs, quick), plan):
            print(
                f"[testbed_speed] gate clip B={r['batch_size']} seed {r['seed']} ({r['source']}): mean R@1 "
                f"{100 * r['metrics'][MEAN_R1]:.1f}",
                flush=True,
            )
            out.append(r)
    return out


def gate_verdict(runs: Sequence[dict], sizes: Sequence[int] = GATE_SIZES, points: float = GATE_POINTS) -> dict:
    """Whether the gate holds: the mean R@1 at the largest batch exceeds that at the smallest by ``points``
    and every seed at the largest scores above every seed at the smallest."""
    lo = [r["metrics"][MEAN_R1] for r in runs if r["batch_size"] == min(sizes)]
    hi = [r["metrics"][MEAN_R1] for r in runs if r["batch_size"] == max(sizes)]
    if not lo or not hi:
        return {"holds": None, "why": "runs missing"}
    gain = sum(hi) / len(hi) - sum(lo) / len(lo)
    apart = min(hi) > max(lo)
    return {
        "holds": bool(gain >= points and apart),
        "gain": gain,
        "apart": apart,
        "small": lo,
        "large": hi,
        "points": points,
        "sizes": [min(sizes), max(sizes)],
    }


def gate_paired(runs: Sequence[dict], sizes: Sequence[int] = GATE_SIZES, confidence: float = 0.90) -> Optional[dict]:
    """The gate's runs read paired by seed (a reading the gate did not name before its runs): per seed run at
    both sizes, mean R@1 at the largest batch minus at the smallest, their mean and t-interval; None with fewer
    than two such seeds. Same seed, same initialisation: the pairing removes the seed's own share of the spread,
    which "ranges apart" over three seeds does not."""
    from clip_dcl.experiment.stats import t_interval

    at = {(r["batch_size"], r["seed"]): r["metrics"][MEAN_R1] for r in runs}
    seeds = sorted(s for (b, s) in at if b == min(sizes) and (max(sizes), s) in at)
    if len(seeds) < 2:
        return None
    diffs = [at[(max(sizes), s)] - at[(min(sizes), s)] for s in seeds]
    return {"seeds": seeds, "diffs": diffs, "confidence": confidence, **t_interval(diffs, confidence)}


def _paired_text(p: dict) -> str:
    per = ", ".join(f"{100 * d:+.1f}" for d in p["diffs"])
    return (
        f"Read paired by seed (a reading the gate did not name before its runs): per seed {per}, mean "
        f"{100 * p['mean']:+.1f} points, {100 * p['confidence']:.0f} % interval [{100 * p['lo']:+.1f}, "
        f"{100 * p['hi']:+.1f}]."
    )


def merged(doc: dict, others: Sequence[dict], ran: Sequence[str], made: dict) -> dict:
    """``doc`` with each part it did not run taken from the last of ``others`` that has it, and ``sources``:
    per part, where it was made (``made`` for the parts run in this call; an earlier merge's sources kept).
    Written by hand: nothing in the ecosystem merges our reports."""
    out = {**doc, "sources": {part: made for part in ran}}
    for part, keys in PARTS.items():
        if part in ran:
            continue
        for other in others:
            if other.get(keys[0]) is not None or keys[1] in other:
                for key in keys:
                    if key in other:
                        out[key] = other[key]
                    else:
                        out.pop(key, None)
                out["sources"][part] = other.get("sources", {}).get(part) or {
                    k: other.get(k) for k in ("command", "date", "machine", "commit")
                }
    return out


def _source(doc: dict, part: str, report: Report) -> List[str]:
    """The line that says where a part was made, when another call than the one writing the report made it."""
    src = doc.get("sources", {}).get(part)
    if not src or (src.get("command"), src.get("machine")) == (report.command, report.machine):
        return []
    return [f"Made by `{src['command']}` on {src['machine']}, {src['date']} (UTC), code {src['commit']}.", ""]


def write(report: Report, doc: dict) -> None:
    """The Markdown and JSON report of whatever parts ran."""
    lines = [
        "# Testbed speed",
        "",
        *report.about(status=doc["status"]),
        f"- Code: {doc['commit']}",
        "",
        "Recipes (`clip_dcl.experiment.recipes`):",
        "",
    ]
    lines += [f"- `{name}`: {RECIPES[name].summary}" for name in (OLD, DEFAULT_RECIPE)]
    lines += ["", "## One thread", ""]
    if doc.get("speed"):
        lines += _source(doc, "speed", report)
        rows = [
            (
                r["recipe"],
                r["batch_size"],
                r["epochs"],
                r["steps"],
                f"{r['seconds']:.1f}",
                f"{r['ms_per_step']:.2f}",
                f"{r['load_before']:.1f} / {r['load_after']:.1f}",
            )
            for r in doc["speed"]
        ]
        lines += [
            markdown_table(
                ["recipe", "B", "epochs", "steps", "wall s", "ms a step", "load avg before / after"], rows, "llrrrrr"
            ),
            "",
            "The old recipe's loader runs in a worker process beside the trainer's thread; on a machine with "
            "other load (the load averages above) it competes for the cores, which slows the old recipe more "
            "than the new one.",
            "",
        ]
        lines += [
            f"- B = {b}: new / old = **{v:.3f}**" + (f" (goal <= {GOAL})" if int(b) == 32 else "")
            for b, v in doc["ratios"].items()
        ]
    else:
        lines += ["Not run in this call."]
    lines += ["", "## CUDA", ""]
    if doc.get("cuda") is None:
        lines += [doc.get("cuda_note", "Not run in this call.")]
    else:
        worst = max(r["seconds"] for r in doc["cuda"])
        rows = [
            (
                r["seed"],
                r["steps"],
                f"{r['seconds']:.1f}",
                f"{r['ms_per_step']:.2f}",
                f"{r['load_before']:.1f} / {r['load_after']:.1f}",
            )
            for r in doc["cuda"]
        ]
        lines += _source(doc, "cuda", report)
        lines += [
            markdown_table(["seed", "steps", "wall s", "ms a step", "load avg before / after"], rows, "rrrrr"),
            "",
            f"{len(doc['cuda'])} runs at once, B = 32: slowest {worst:.1f} s (goal <= {CUDA_GOAL:.0f} s each): "
            f"**{'met' if worst <= CUDA_GOAL else 'not met'}**",
        ]
    lines += ["", "## The gate (validation split)", ""]
    g = doc.get("gate_verdict")
    if g and g.get("holds") is not None:
        lines += _source(doc, "gate", report)
        runs = doc["gate"]
        rows = [
            (r["batch_size"], r["seed"], f"{100 * r['metrics'][MEAN_R1]:.1f}", f"{r['seconds']:.0f}")
            for r in sorted(runs, key=lambda r: (r["batch_size"], r["seed"]))
        ]
        lines += [
            markdown_table(["B", "seed", "mean R@1", "train s"], rows, "rrrr"),
            "",
            f"Gain from B = {g['sizes'][0]} to {g['sizes'][-1]}: {100 * g['gain']:+.1f} points "
            f"(needed: {100 * g['points']:.0f}); seeds' ranges {'apart' if g['apart'] else 'overlap'}: "
            f"**the gate {'holds' if g['holds'] else 'fails'}**.",
        ]
        paired = gate_paired(runs, g["sizes"])
        if paired:
            lines += ["", _paired_text(paired)]
    else:
        lines += ["Not run in this call."]
    lines += [
        "",
        "## Rerun the recipe",
        "",
        "```bash",
        "clip-dcl " + " ".join(_quote(a) for a in doc["data_argv"]),
        "python -m clip_dcl.train -- " + " ".join(_quote(a) for a in doc["train_argv"]),
        "```",
    ]
    report.write(lines, doc)


def _quote(a: str) -> str:
    import shlex

    return shlex.quote(a)


def readme_block(doc: dict) -> str:
    """The testbed-speed block of docs/results.md, from the report's JSON."""
    parts = []
    if doc.get("speed"):
        by = {(r["recipe"], r["batch_size"]): r for r in doc["speed"]}
        cells = []
        for b, ratio in sorted(doc["ratios"].items(), key=lambda kv: int(kv[0])):
            old, new = by[(doc["baseline_recipe"], int(b))], by[(doc["recipe"], int(b))]
            cells.append(
                f"B = {b}: `{doc['recipe']}` {new['seconds']:.0f} s against `{doc['baseline_recipe']}` "
                f"{old['seconds']:.0f} s, **{ratio:.2f}x**" + (f" (goal <= {doc['goal']})" if int(b) == 32 else "")
            )
        epochs = doc["speed"][0]["epochs"]
        parts.append(
            f"One torch thread, {epochs} epochs a run, wall-clock time of `python -m clip_dcl.train` "
            f"start-up and validation included: " + "; ".join(cells) + "."
        )
    if doc.get("cuda") is not None:
        worst = max(r["seconds"] for r in doc["cuda"])
        where = (doc.get("sources", {}).get("cuda") or {}).get("machine") or doc.get("machine", "")
        gpu = where.split(";")[0].split(", ")[-1]  # machine_info: "CPU, N cores (...), GPU; OS, Python, torch"
        parts.append(
            f"CUDA ({gpu}): {len(doc['cuda'])} runs of `{doc['recipe']}` at once at B = 32, the slowest "
            f"{worst:.0f} s (goal <= {CUDA_GOAL:.0f} s): **{'met' if worst <= CUDA_GOAL else 'not met'}**."
        )
    elif "cuda_note" in doc:
        parts.append("CUDA: no GPU was lent to the run that wrote the report; no CUDA timing.")
    g = doc.get("gate_verdict")
    if g and g.get("holds") is not None:
        lo, hi = g["sizes"]
        parts.append(
            f"The gate on `{doc['recipe']}` (`clip`, validation split, seeds "
            f"{', '.join(str(r['seed']) for r in doc['gate'] if r['batch_size'] == lo)}): retrieval mean "
            f"R@1 {100 * sum(g['small']) / len(g['small']):.1f} at B = {lo} and "
            f"{100 * sum(g['large']) / len(g['large']):.1f} at B = {hi}, a gain of {100 * g['gain']:+.1f} "
            f"points (needed {100 * g['points']:.0f}), the seeds' ranges "
            f"{'apart' if g['apart'] else 'overlapping'}: **the gate {'holds' if g['holds'] else 'fails'}**."
        )
        paired = gate_paired(doc["gate"], g["sizes"])
        if paired:
            parts[-1] += " " + _paired_text(paired)
    return "\n\n".join(parts) + f"\n\nStatus of the report: {doc['status']}, code {doc['commit']}."


def build_parser():
    p = arguments.benchmark_parser("testbed_speed.py", __doc__)
    p.add_argument(
        "--parts",
        nargs="*",
        choices=list(PARTS),
        default=list(PARTS),
        help="the parts this call runs (none: only --merge)",
    )
    p.add_argument(
        "--merge",
        nargs="+",
        default=[],
        metavar="JSON",
        help="reports of this benchmark from other calls (a lent GPU's CUDA part, say): each part this "
        "call does not run is taken from the last of them that has it, with where it was made",
    )
    p.add_argument("--epochs", type=int, default=20, help="epochs of every run")
    p.add_argument("--jobs", type=int, default=2, help="gate runs at once (one torch thread each)")
    p.add_argument("--work", default=str(HERE / "work" / STEM), help="folder for the data and the runs")
    p.add_argument(
        "--out",
        default=None,
        help="the report's path without suffix (default benchmarks/results/testbed_speed; with --quick under --work)",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 512 pairs, 1 epoch, gate at B = 16 and 32")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args, argv = arguments.parse(build_parser(), argv)
    if args.epochs < 1 or args.jobs < 1:
        raise SystemExit("--epochs and --jobs must be >= 1")
    work = Path(args.work) / ("quick" if args.quick else "full")
    out = Path(args.out) if args.out else (work / "report" / STEM if args.quick else HERE / "results" / STEM)
    epochs = 1 if args.quick else args.epochs
    data = work / "data"
    summary = make_data(data, args.quick) if args.parts else None
    report = Report.at(out, command_line("testbed_speed.py", argv), work=work)
    new = get_recipe(DEFAULT_RECIPE)
    doc = {
        "status": "running",
        "commit": code_commit(),
        "recipes": {n: RECIPES[n].summary for n in (OLD, DEFAULT_RECIPE)},
        "recipe": DEFAULT_RECIPE,
        "baseline_recipe": OLD,
        "data_argv": list(new.data_argv),
        "train_argv": new.train_argv(batch_size=32, seed=0, epochs=20, name="testbed"),
        "goal": GOAL,
        "epochs": epochs,
        "quick": args.quick,
    }
    others = [json.loads(Path(m).read_text()) for m in args.merge]
    made = {"command": report.command, "date": report.date, "machine": report.machine, "commit": doc["commit"]}
    if not args.parts and not others:
        raise SystemExit("--parts with no part needs --merge (reports to take the parts from)")
    if "speed" in args.parts:
        doc["speed"] = speed(data, work, epochs, args.quick)
        doc["ratios"] = ratios(doc["speed"])
        write(report, doc)
    if "cuda" in args.parts:
        doc["cuda"] = cuda(data, work, epochs, args.quick)
        if doc["cuda"] is None:
            doc["cuda_note"] = "No GPU was visible to this run (torch.cuda.is_available() is false): no CUDA timing."
        write(report, doc)
    if "gate" in args.parts:
        sizes = (16, 32) if args.quick else GATE_SIZES
        doc["gate"] = gate(data, summary, work, epochs, args.quick, args.jobs, sizes)
        doc["gate_verdict"] = gate_verdict(doc["gate"], sizes)
    doc = merged(doc, others, args.parts, made)
    doc["status"] = "complete"
    write(report, doc)
    print(f"[testbed_speed] -> {report.path('.md')}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
