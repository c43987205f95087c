"""``clip-dcl demo``: the whole job on the embedded synthetic data, on a CPU, in minutes: the data, then
``clip``, ``dcl`` (``tau_plus`` = the data's class prior) and ``decl`` trained under one seed and budget,
evaluated, and one comparison table beside chance (``demo.md``, ``demo.json``, ``demo.png``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import List, Optional

from . import experiment as ex
from .arguments import FlagParser, flag_words
from .exitcodes import stop_exit_code
from .experiment.budgets import DEMO_BUDGET, DEMO_CLASSES, QUICK_BUDGET
from .paths import write_json
from .process import Stopped, said, stop_on_signals

DESCRIPTION = (
    "The whole job on the embedded synthetic data: synthetic caption shards and evaluation sets, "
    "training of each objective with the same seed and budget, retrieval, zero-shot and few-shot "
    "evaluation, one comparison table. It prints its elapsed time at the end and records it in "
    'demo.json ("minutes"); a machine whose cores other work shares takes proportionally longer.'
)


#: What ``--quick`` prints above its table and writes into demo.md and demo.json.
SMOKE_TEST = (
    "--quick is a smoke test: one short epoch on a small set shows that every step runs, and its numbers "
    "(near chance) say nothing about which objective is better; no number is marked best. Run `clip-dcl "
    "demo` without --quick to compare them."
)


def build_parser() -> argparse.ArgumentParser:
    p = FlagParser(prog="clip-dcl demo", description=DESCRIPTION)
    p.add_argument("--out", default="demo_out", help="folder for the data, the runs and the report (default demo_out)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a tiny version for a first look and for tests: small data, one short epoch, one few-shot "
        "seed (make demo DEMO_ARGS=--quick)",
    )
    from .losses import LOSSES

    p.add_argument(
        "--losses",
        nargs="+",
        default=["clip", "dcl", "decl"],
        choices=list(LOSSES),
        help="objectives to train and compare (any registered loss; those beyond clip, dcl and decl "
        "with their own defaults; default clip dcl decl)",
    )
    p.add_argument(
        "--epochs",
        type=int,
        help=f"training epochs (default {DEMO_BUDGET.epochs}; quick {QUICK_BUDGET.epochs})",
    )
    p.add_argument("--seed", type=int, default=0, help="training seed shared by every run (default 0)")
    p.add_argument(
        "--num-classes",
        type=int,
        default=DEMO_CLASSES,
        help=f"latent classes of the synthetic data, tau_plus = 1 / classes (default {DEMO_CLASSES})",
    )
    p.add_argument(
        "--fewshot-seeds",
        type=int,
        nargs="+",
        help="k-shot draws of the few-shot probe (default 0 1 2; quick 0)",
    )
    p.add_argument(
        "--device",
        default="auto",
        help="where training and evaluation run: auto (the default; a GPU when one is visible, else the "
        "CPU), cpu, cuda, cuda:1...",
    )
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("epochs", "num_classes"):
        value = getattr(args, name)
        if value is not None and value < 1:
            print(f"clip-dcl demo: --{name.replace('_', '-')} must be >= 1, got {value}", file=sys.stderr)
            return 2
    from .data.synth import MAX_CLASSES

    if not 2 <= args.num_classes <= MAX_CLASSES:
        print(f"clip-dcl demo: --num-classes must be in [2, {MAX_CLASSES}], got {args.num_classes}", file=sys.stderr)
        return 2
    from .eval.encoding import device_problem, resolve_device

    device = resolve_device(args.device)
    device_error = device_problem(device)
    if device_error:
        print(f"clip-dcl demo: --device {args.device!r}: {device_error}", file=sys.stderr)
        return 2
    # --quick: the small budget on the demo's own model and optimizer, so that it runs the same path
    base = replace(QUICK_BUDGET, model=DEMO_BUDGET.model, extra=DEMO_BUDGET.extra) if args.quick else DEMO_BUDGET
    budget = replace(base, seed=args.seed, epochs=args.epochs if args.epochs is not None else base.epochs)
    fewshot_seeds = args.fewshot_seeds or ([0] if args.quick else [0, 1, 2])
    out = Path(args.out)
    settings = {
        "quick": args.quick,
        "losses": list(dict.fromkeys(args.losses)),
        "epochs": budget.epochs,
        "seed": args.seed,
        "num_classes": args.num_classes,
        "fewshot_seeds": fewshot_seeds,
        "device": device,
    }
    refusal = settings_problem(out, settings)
    if refusal:
        print(f"clip-dcl demo: {refusal}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / SETTINGS, settings)
    start, load_at_start = time.perf_counter(), _load_average()
    results, scores = {}, {}
    state = {"step": "writing the synthetic data", "progress": Progress(len(settings["losses"]), start)}
    try:
        with stop_on_signals():
            data = _train_and_evaluate(args, out, budget, device, fewshot_seeds, results, scores, state)
    except (KeyboardInterrupt, Stopped) as e:
        signame = e.signame if isinstance(e, Stopped) else "SIGINT"
        state["progress"].say("")
        print(stopped_line(said(signame), state, out, results), file=sys.stderr, flush=True)
        return stop_exit_code(signame)

    minutes = (time.perf_counter() - start) / 60
    header = (
        f"clip-dcl demo: tiny model, {data['train']['num_samples']} synthetic pairs, "
        f"{data['config']['num_classes']} latent classes (tau_plus = {data['tau_plus']:.3f}), "
        f"{budget.epochs} epoch(s), batch {budget.batch_size}, seed {budget.seed}; "
        f"{minutes:.1f} min in all"
    )
    smoke = SMOKE_TEST if args.quick else None
    report = ex.write_report(
        out,
        "demo",
        data=data,
        budget=budget,
        results=results,
        scores=scores,
        header=header,
        extra={
            "fewshot_seeds": fewshot_seeds,
            "minutes": minutes,
            "device": device,
            "load_average": {"start": load_at_start, "end": _load_average()},
        },
        smoke_test=smoke,
    )
    print("[demo] 4/4 comparison (percent; chance = a content-blind embedding)\n", flush=True)
    print(header + "\n")
    if smoke:
        print(smoke + "\n")
    print(report["table"] + "\n")
    print(f"[demo] wrote {report['markdown']}, {report['json']}, {report['png']}", flush=True)
    print(f'[demo] done: {minutes:.1f} minutes of wall-clock time in all ("minutes" in {report["json"]})', flush=True)
    return 0


def _train_and_evaluate(args, out: Path, budget, device: str, fewshot_seeds, results: dict, scores: dict, state: dict):
    """Steps 1-3 of the demo; the data returned, ``results``, ``scores`` and ``state`` filled as they go."""
    print(f"[demo] 1/4 synthetic data -> {out / 'data'} (training and evaluation on {device})", flush=True)
    data = ex.packed_training_set(ex.synth_data(out / "data", quick=args.quick, num_classes=args.num_classes))
    state["data"] = True
    known = {r.name: r for r in ex.default_runs(data["tau_plus"])}
    runs = [known.get(name, ex.Run(name, ("--loss", name))) for name in dict.fromkeys(args.losses)]
    progress = state["progress"]
    for i, run in enumerate(runs, 1):
        state["step"] = f"training {i}/{len(runs)} ({run.name})"
        progress.say(
            f"[demo] 2/4 training {i}/{len(runs)}: {run.name} ({' '.join(run.flags)}), {budget.epochs} "
            f"epoch(s) of {data['train']['num_samples']} samples, batch {budget.batch_size}"
        )
        progress.begin("train")
        res = ex.train(run, data, out / "runs", budget, device=device, echo=progress.echo)
        progress.end()
        progress.say(f"[demo]     {run.name}: trained in {res.seconds:.0f} s -> {res.checkpoint}; {progress.status()}")
        results[run.name] = [res]
    for i, run in enumerate(runs, 1):
        state["step"] = f"evaluating {i}/{len(runs)} ({run.name})"
        progress.say(
            f"[demo] 3/4 evaluating {i}/{len(runs)}: {run.name}: retrieval, zero-shot, 5-shot probe "
            f"({len(fewshot_seeds)} seed(s))"
        )
        progress.begin("eval")
        metrics = ex.evaluate(results[run.name][0].checkpoint, data, fewshot_seeds=fewshot_seeds, device=device)
        seconds = progress.end()
        progress.say(f"[demo]     {run.name}: evaluated in {seconds:.0f} s; {progress.status()}")
        scores[run.name] = [metrics]
    return data


#: The file in the demo's folder that records its settings: a rerun with others is refused (never mixed).
SETTINGS = "demo_settings.json"


def settings_problem(out: Path, settings: dict) -> Optional[str]:
    """Why the demo with ``settings`` cannot write into ``out`` (another run's output is there), else None."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return None
    what = "give another --out, or delete it to start again"
    if not out.is_dir():
        return f"--out {out} is a file, not a folder: {what}"
    try:
        there = json.loads((out / SETTINGS).read_text())
    except (OSError, ValueError):
        return f"{out} holds files but no {SETTINGS} (not a demo's output, or an earlier version's): {what}"
    if there == settings:
        return None
    diff = "; ".join(
        f"{_words(k, there.get(k))} there, {_words(k, v)} here" for k, v in settings.items() if there.get(k) != v
    )
    return (
        f"{out} holds a demo run with other settings ({diff}): rerun with its settings to continue it, or, "
        f"for these, {what}"
    )


def _words(key: str, value) -> str:
    """A setting as its flag's words (a list's items after the flag), or ``no --flag`` when it is off or unset."""
    flag = "--" + key.replace("_", "-")
    shown = " ".join(map(str, value)) if isinstance(value, list) else value
    return " ".join(flag_words({flag: shown})) or f"no {flag}"


#: One evaluation's time as a share of one training's, until the first evaluation is measured.
EVAL_SHARE = 0.25
_ECHOED = re.compile(r"\] epoch (\d+)/(\d+)\s+(\d+)%")


class Progress:
    """The demo's progress line: its step, the share of its work done (`done`) and the time left, estimated from
    the trainings and evaluations measured so far."""

    def __init__(self, runs: int, start: float, stream=None):
        self.runs, self.start, self.stream = runs, start, stream or sys.stdout
        self.trained: List[float] = []
        self.evaluated: List[float] = []
        self.kind, self.began, self.share, self.first = None, start, 0.0, None
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.open = False  # a terminal's progress line, written over by the next

    def begin(self, kind: str) -> None:
        self.kind, self.began, self.share, self.first = kind, time.perf_counter(), 0.0, None

    def end(self) -> float:
        seconds = time.perf_counter() - self.began
        (self.trained if self.kind == "train" else self.evaluated).append(seconds)
        self.kind = None
        return seconds

    def left(self) -> Optional[float]:
        """Seconds left (the report aside), None before the first training has logged two steps."""
        now = time.perf_counter() - self.began
        current = None  # the whole time of the first training, from its steps (the child's start-up aside)
        if self.kind == "train" and not self.trained and self.first and self.share > self.first[1]:
            t0, s0 = self.first
            current = now + (1 - self.share) * (now - t0) / (self.share - s0)
        per_train = sum(self.trained) / len(self.trained) if self.trained else current
        if per_train is None:
            return None
        per_eval = sum(self.evaluated) / len(self.evaluated) if self.evaluated else EVAL_SHARE * per_train
        left = (self.runs - len(self.trained)) * per_train + (self.runs - len(self.evaluated)) * per_eval
        if self.kind is not None:  # the step under way: what it has left in place of its whole time
            whole = per_train if self.kind == "train" else per_eval
            left += (current if current is not None else max(whole, now)) - now - whole
        return max(left, 0.0)

    def done(self) -> float:
        """The share of the demo's work done: a training is one unit, counted by its steps, an evaluation
        `EVAL_SHARE` of one. Counted in work, not time: a share of time goes backwards whenever a step takes
        longer than estimated, as the first training does (what it does after its last step is in no estimate
        made from its steps)."""
        units = len(self.trained) + EVAL_SHARE * len(self.evaluated) + (self.share if self.kind == "train" else 0.0)
        return units / (self.runs * (1 + EVAL_SHARE))

    def status(self) -> str:
        left = self.left()
        if left is None:
            return "time left: estimated once the first training has logged two steps"
        return f"{100 * self.done():.0f}% of the demo done, about {_duration(left)} left"

    def echo(self, line: str) -> None:
        """A line of the training under way, with the demo's status."""
        match = _ECHOED.search(line)
        if not match:
            return self.say(line)
        epoch, epochs, pct = (int(g) for g in match.groups())
        self.share = min(1.0, ((epoch - 1) + pct / 100) / max(epochs, 1))
        if self.first is None:
            self.first = (time.perf_counter() - self.began, self.share)
        text = f"{line}  | {self.status()}"
        if self.tty:
            self.stream.write("\r\033[K" + text)
            self.stream.flush()
            self.open = True
        else:
            self.say(text)

    def say(self, line: str) -> None:
        if self.open:
            self.stream.write("\n")
            self.open = False
        if line:
            print(line, file=self.stream, flush=True)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def stopped_line(stop: str, state: dict, out: Path, results: dict) -> str:
    """The one line of a demo stopped by Ctrl-C or SIGTERM: where it was, and what it kept."""
    if not state.get("data"):
        kept = f"nothing finished (a rerun writes the data in {out / 'data'} again)"
    else:
        kept = f"the synthetic data in {out / 'data'} (a rerun reuses them)"
    if results:
        kept += f" and the finished training(s) of {', '.join(results)} in {out / 'runs'} (a rerun trains them again)"
    return (
        f"[demo] stopped by {stop} while {state['step']}: kept {kept}; no report was written (demo.md, demo.json and "
        f"demo.png in {out} are an earlier run's, if there)"
    )


def readme_block(doc: dict) -> str:
    """The README's generated block ``demo table`` (``benchmarks/quotes.py``), from a ``demo.json``."""
    runs = doc["runs"]
    trained = " / ".join(f"{runs[name][0]['train_seconds']:.0f} s" for name in runs)
    return (
        f"A run of `clip-dcl demo` on {doc['machine']}, {doc['date']}: {doc['minutes']:.1f} minutes of wall-clock "
        f"time in all (training {trained} for {' / '.join(runs)}; times, not speed measurements: other jobs may "
        f"have shared the CPU). Its table, in percent, with the chance level of each metric:\n\n"
        f"{doc['table'].strip()}"
    )


def _load_average() -> Optional[float]:
    """The machine's 1-minute load average, None where the system has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def readme_time_block(doc: dict) -> str:
    """The README's generated block ``demo time``, on how long ``make demo`` takes, from a ``demo.json``."""
    load = doc.get("load_average") or {}
    loads = (
        f" (1-minute load average {load['start']:.1f} at its start and {load['end']:.1f} at its end)"
        if load.get("start") is not None and load.get("end") is not None
        else ""
    )
    return (
        f"The recorded run (`benchmarks/results/demo.json`) took {doc['minutes']:.1f} minutes of wall-clock "
        f"time on {doc['machine']}, {doc['date']}{loads}, the set-up of `.venv` aside. Wall-clock time "
        f"depends on what else runs: on cores that other work shares, the demo takes proportionally longer "
        f"than on idle ones (times, not speed measurements). It prints its own time at the end. `make demo "
        f"DEMO_ARGS=--quick` runs a tiny version (small data, one short epoch, one few-shot seed) for a first "
        f"look."
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
