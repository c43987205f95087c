"""Training throughput (samples/s) of ``dcl`` and ``decl`` against OpenCLIP's own loss, and of clip-dcl's
training loop against OpenCLIP's own trainer, end to end.

What is timed is a whole training step as a user runs it: ``python -m clip_dcl.train`` in a child
process (data loading, forward, loss, backward, optimizer step), one child per (round, objective),
all with the same model, data, seed, batch size and precision. The objectives are ``--loss clip``
(OpenCLIP's ``ClipLoss``, the baseline), ``--loss dcl`` (``--tau-plus`` = the data's class prior)
and ``--loss decl`` with each rate estimator (``--decl-rate index``, ``queue``, ``batch``).

One more child per round runs OpenCLIP's own trainer (:data:`OPENCLIP`: ``open_clip_train.main``, its
``train_one_epoch`` and its ``ClipLoss``) on the same OpenCLIP flags minus ``--loss clip``, with clip-dcl's
model configs registered first so that ``clip-dcl-tiny`` exists. ``clip`` over it, within a round, says
whether clip-dcl's own loop is as fast as OpenCLIP's on the same model, data and flags.

Step times are the trainers' own: with ``--log-every-n-steps 1`` every step's record in a clip-dcl run's
``metrics.jsonl`` holds the loop's ``batch_time`` and ``samples_per_second``, the wall time from the end of
the previous step to the end of this one (so the wait for the data loader is included), over one step
(:func:`clip_dcl.experiment.read_step_times`). OpenCLIP's main writes no ``metrics.jsonl``: its step
lines in ``out.log`` give the same quantity (:func:`read_logged_steps`). Start-up (imports, model, data
pipeline) never enters; the first ``--warmup-steps`` of every child are dropped (the shuffle buffer filling,
allocator and thread pool warm-up, on CUDA kernel selection), and so are the last two per loader
worker (:attr:`Setup.tail_steps`: prefetched batches, trained after the workers stop). Per child
the median samples/s over the remaining steps is robust to a burst of load from elsewhere; the
throughput over all of them (samples over summed time) is recorded beside it.

Runs are interleaved: every round trains each objective (and OpenCLIP's trainer) once, and the order
rotates by one each round, so that slow drift of the machine hits every child alike. The ratio to
``clip`` is taken within a round (:func:`summarize`), and so is every row's ratio to OpenCLIP's trainer
(:func:`to_reference`); the report gives the median over rounds and the range. The goal stated for the
project is a ratio of at least 0.97: each objective against ``clip``, and ``clip`` against OpenCLIP's.

On a CPU (the default, and what a laptop user sees) the model is the tiny registered
``clip-dcl-tiny`` (64x64 images) at fp32 on synthetic shards from
:func:`clip_dcl.data.synth.generate`; the loss is then a small share of a step, and the numbers
say how much the objective and its sample-id plumbing cost in a real step. ``--device cuda``
(only where ``torch.cuda.is_available()``) trains OpenCLIP's ``ViT-B-32`` at 224 px with
``--precision amp_bf16`` on synthetic shards drawn at 224 px. With ``--log-every-n-steps 1``
both loops read the loss every step, which waits for the GPU, so the logged step time is the device
time and not only the launch time.

Trainings started through :mod:`clip_dcl.experiment` on this machine take turns under a lock
(:func:`clip_dcl.experiment.machine_lock`); the benchmark holds it for all its rounds, so that the
comparison does not share the cores with another training started that way. Other load is not
controlled: the report records the load average before and after and per child. Ratios from
interleaved runs are robust to steady load and noisy under bursty load.

    .venv/bin/python benchmarks/train_throughput.py               # CPU, writes results/train_throughput.*
    .venv/bin/python benchmarks/train_throughput.py --quick       # smoke run, report under --work
    .venv/bin/python benchmarks/train_throughput.py --device cuda # ViT-B-32 at 224 px, amp_bf16
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from clip_dcl import experiment as ex
from clip_dcl.experiment import Run, StepTime, read_step_times
from clip_dcl.experiment.figures import pyplot
from clip_dcl.experiment.reporting import Report, markdown_table

HERE = Path(__file__).resolve().parent
STEM = "train_throughput"
BASELINE = "clip"
#: The row of OpenCLIP's own trainer: ``BASELINE`` over it is clip-dcl's loop against OpenCLIP's.
OPENCLIP = "openclip (its own main and loop)"
#: The project's goal: every objective at >= this share of the baseline's samples/s, and the baseline
#: at >= this share of OpenCLIP's own trainer's.
GOAL = 0.97
#: The OpenCLIP child's program (``python -c``): clip-dcl's model configs registered, then OpenCLIP's own
#: ``main`` on the words after ``--``; its return value (None when done, -1 on a taken ``--name``) the exit code.
OPENCLIP_MAIN = (
    "import sys; from clip_dcl.models import register_builtin_configs; register_builtin_configs(); "
    "import open_clip_train.main as m; a = sys.argv[1:]; sys.exit(m.main(a[1:] if a[:1] == ['--'] else a))"
)


def objectives(tau_plus: float) -> List[Run]:
    """``clip`` (the baseline, first), ``dcl`` with the data's class prior, ``decl`` with each rate."""
    if not 0.0 <= tau_plus < 1.0:
        raise ValueError(f"tau_plus={tau_plus!r} must be in [0, 1)")
    return [
        Run(BASELINE, ("--loss", "clip")),
        Run("dcl", ("--loss", "dcl", "--tau-plus", f"{tau_plus:.6g}")),
        Run("decl rate=index", ("--loss", "decl", "--decl-rate", "index")),
        Run("decl rate=queue", ("--loss", "decl", "--decl-rate", "queue")),
        Run("decl rate=batch", ("--loss", "decl", "--decl-rate", "batch")),
    ]


def runs(tau_plus: float) -> List[Run]:
    """What each round trains: the :func:`objectives`, then OpenCLIP's own trainer (no clip-dcl flags)."""
    return objectives(tau_plus) + [Run(OPENCLIP)]


def round_order(items: Sequence, round_index: int) -> list:
    """``items`` rotated left by ``round_index``: round r starts with item ``r mod n``."""
    if not items:
        return []
    k = round_index % len(items)
    return list(items[k:]) + list(items[:k])


@dataclass(frozen=True)
class Setup:
    """Everything the children share: device, model, precision, batch, steps, data loader workers."""

    device: str = "cpu"
    model: str = "clip-dcl-tiny"
    image_size: int = 64
    precision: str = "fp32"
    batch_size: int = 128
    warmup_steps: int = 5
    steps: int = 20
    workers: int = 1
    seed: int = 0
    #: torch threads of each child (0: torch's default)
    threads: int = 0

    def validate(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device={self.device!r} must be 'cpu' or 'cuda'")
        for name in ("batch_size", "steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 1")
        for name in ("warmup_steps", "workers", "seed", "threads"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 0")

    @property
    def tail_steps(self) -> int:
        """Last steps of a child that are not timed: their batches were decoded before the loader
        workers stopped (``DataLoader``'s ``prefetch_factor`` 2 per worker), so these steps run
        without the workers competing for the cores, faster than any steady step."""
        return 2 * self.workers

    @property
    def train_steps(self) -> int:
        return self.warmup_steps + self.steps + self.tail_steps

    @property
    def budget(self) -> ex.Budget:
        """The training flags every child shares: one epoch, a loss line per step."""
        return ex.Budget(
            epochs=1,
            batch_size=self.batch_size,
            lr=1e-3,
            wd=0.1,
            warmup=2,
            seed=self.seed,
            workers=self.workers,
            model=self.model,
            log_every_n_steps=1,
        )

    @property
    def child_options(self) -> dict:
        """:func:`clip_dcl.experiment.train`'s options of a timed child: ``device`` and ``precision``,
        an epoch of exactly :attr:`train_steps` steps, no validation."""
        return {
            "precision": self.precision,
            "device": self.device,
            "num_samples": self.batch_size * self.train_steps,
            "validate": False,
        }


CPU_SETUP = Setup()
QUICK_SETUP = Setup(batch_size=32, warmup_steps=2, steps=6)
CUDA_SETUP = Setup(
    device="cuda",
    model="ViT-B-32",
    image_size=224,
    precision="amp_bf16",
    batch_size=256,
    warmup_steps=10,
    steps=40,
    workers=8,
)


# ------------------------------------------------------------------------------------------
# Statistics (pure)
# ------------------------------------------------------------------------------------------
#: The timing part of a training step's log line, as OpenCLIP's ``train_one_epoch`` writes it and clip-dcl's
#: loop keeps it: ``Train Epoch: 0 [ 256/3456 (7%)] Data (t): 0.004 Batch (t): 0.491, 260.412/s, ...``
STEP_LINE = re.compile(
    r"Train Epoch: (?P<epoch>\d+) \[\s*(?P<done>\d+)/\d+ \(\d+%\)\] "
    r"Data \(t\): (?P<data>[\d.]+) Batch \(t\): (?P<batch>[\d.]+), (?P<rate>[\d.eE+-]+)/s\b"
)


def read_logged_steps(log: os.PathLike) -> List[StepTime]:
    """The training steps of a run's log (``out.log``), in order: how OpenCLIP's own main, which writes no
    ``metrics.jsonl``, is timed. A line's samples/s is ``batch / batch_time`` over the steps since the previous
    line (one with ``--log-every-n-steps 1``), printed to 6 significant digits; ``Batch (t)`` and ``Data (t)``
    only to the millisecond."""
    steps = []
    for line in Path(log).read_text(errors="replace").splitlines():
        m = STEP_LINE.search(line)
        if m:
            steps.append(
                StepTime(int(m["epoch"]), int(m["done"]), float(m["data"]), float(m["batch"]), float(m["rate"]))
            )
    return steps


def steady_rates(steps: Sequence[StepTime], warmup_steps: int, tail_steps: int = 0) -> List[float]:
    """Samples/s of the steps between the first ``warmup_steps`` and the last ``tail_steps`` lines.

    Every line must stand for one step.

    Raises ``ValueError`` when the log's step counter shows that lines stand for several steps
    (``--log-every-n-steps`` above 1), or when no step is left after the warm-up.
    """
    if warmup_steps < 0 or tail_steps < 0:
        raise ValueError(f"warmup_steps={warmup_steps!r} and tail_steps={tail_steps!r} must be >= 0")
    done = [s.samples_done for s in steps if s.epoch == steps[0].epoch] if steps else []
    increments = {b - a for a, b in zip(done, done[1:])}
    if len(increments) > 1 or (done and increments and done[0] != next(iter(increments))):
        raise ValueError(
            f"training lines are not one per step (samples done: {done[:6]}...); run with --log-every-n-steps 1"
        )
    kept = [s.samples_per_second for s in steps[warmup_steps : len(steps) - tail_steps]]
    if not kept:
        raise ValueError(
            f"{len(steps)} training step(s) logged, none left after {warmup_steps} warm-up and "
            f"{tail_steps} tail step(s)"
        )
    return kept


def throughput(rates: Sequence[float]) -> float:
    """Samples over total time of equal-size steps: the harmonic mean of per-step samples/s."""
    return len(rates) / sum(1.0 / r for r in rates)


def upper_quartile(values: Sequence[float]) -> float:
    """The 75th percentile (``statistics.quantiles``' default exclusive method; the value itself for one)."""
    if len(values) < 2:
        return float(values[0])
    return statistics.quantiles(values, n=4)[2]


def summarize(rounds: Sequence[Dict[str, Sequence[float]]], baseline: str = BASELINE) -> Dict[str, dict]:
    """Per objective: samples/s per round and overall, and the ratio to ``baseline`` within each round.

    ``rounds``: one ``{objective: steady per-step samples/s}`` per round. A round's figure for an
    objective is the median of its steps (robust to a burst of outside load). Returned per
    objective: ``per_round`` (those medians), ``median`` / ``min`` / ``max`` over rounds,
    ``throughput`` (samples over time, all its steps pooled), ``ratios`` (per round, divided by the
    baseline's median in the same round) and ``ratio_median`` / ``ratio_min`` / ``ratio_max``.
    ``fast_ratios`` / ``fast_ratio_median`` do the same with each child's upper quartile of
    samples/s (its faster steps): a cost figure less moved by outside load, which only slows steps.
    Objectives missing from a round (a failed child) only lose that round.
    """
    if not rounds or not any(baseline in r for r in rounds):
        raise ValueError(f"no round holds the baseline {baseline!r}")
    names: List[str] = []
    for r in rounds:
        names += [n for n in r if n not in names]
    out: Dict[str, dict] = {}
    for name in names:
        per_round, ratios, fast_ratios, pooled = [], [], [], []
        for r in rounds:
            if not r.get(name):
                continue
            med = statistics.median(r[name])
            per_round.append(med)
            pooled += list(r[name])
            if r.get(baseline):
                ratios.append(med / statistics.median(r[baseline]))
                fast_ratios.append(upper_quartile(r[name]) / upper_quartile(r[baseline]))
        out[name] = {
            "per_round": per_round,
            "median": statistics.median(per_round),
            "min": min(per_round),
            "max": max(per_round),
            "throughput": throughput(pooled),
            "ratios": ratios,
            "ratio_median": statistics.median(ratios) if ratios else math.nan,
            "ratio_min": min(ratios) if ratios else math.nan,
            "ratio_max": max(ratios) if ratios else math.nan,
            "fast_ratios": fast_ratios,
            "fast_ratio_median": statistics.median(fast_ratios) if fast_ratios else math.nan,
        }
    return out


#: The fields of :func:`summarize` that are ratios to its baseline.
RATIO_FIELDS = ("ratios", "ratio_median", "ratio_min", "ratio_max", "fast_ratios", "fast_ratio_median")


def to_reference(rounds: Sequence[Dict[str, Sequence[float]]], reference: str = OPENCLIP) -> Dict[str, dict]:
    """Per row, its ratios to ``reference`` within each round (:data:`RATIO_FIELDS` of :func:`summarize`);
    ``{}`` when no round holds ``reference``. ``to_reference(rounds)[BASELINE]`` is clip-dcl's loop against
    OpenCLIP's."""
    if not any(r.get(reference) for r in rounds):
        return {}
    return {name: {k: s[k] for k in RATIO_FIELDS} for name, s in summarize(rounds, reference).items()}


def per_round_rates(records: Sequence[dict]) -> List[Dict[str, List[float]]]:
    """``{objective: steady samples/s}`` of each round that holds a child, in round order."""
    rounds: Dict[int, Dict[str, List[float]]] = {}
    for rec in records:
        rounds.setdefault(rec["round"], {})[rec["objective"]] = rec["steady_samples_per_second"]
    return [rounds[r] for r in sorted(rounds)]


def spread(values: Sequence[float]) -> float:
    """(max - min) / median: how far a row's round medians moved, the noise floor of a ratio."""
    return (max(values) - min(values)) / statistics.median(values) if values else math.nan


# ------------------------------------------------------------------------------------------
# Children
# ------------------------------------------------------------------------------------------
def entry(objective: Run) -> Optional[List[str]]:
    """The program a child runs: OpenCLIP's own main for :data:`OPENCLIP`, else None (``python -m clip_dcl.train``)."""
    return [sys.executable, "-c", OPENCLIP_MAIN] if objective.name == OPENCLIP else None


def child_command(objective: Run, data: dict, setup: Setup, logs: os.PathLike) -> List[str]:
    """``python -m clip_dcl.train -- ...`` of one timed child: one epoch of ``setup.train_steps`` steps
    (``python -c OPENCLIP_MAIN -- ...`` with the same OpenCLIP flags for :data:`OPENCLIP`).

    No validation or zero-shot evaluation: the child does nothing but train (both trainers still write
    the final checkpoint under ``logs``, after the timed steps). ``--dataset-resampled`` lets the
    epoch hold exactly the steps asked for, whatever the shard sizes and the loader workers.
    """
    return ex.train_command(objective, data, logs, setup.budget, entry(objective), **setup.child_options)


def run_child(objective: Run, data: dict, setup: Setup, logs: Path, echo: Callable[[str], None] = print) -> dict:
    """Train one child under ``logs`` (the caller holds the machine lock, if any); return its
    command, wall seconds, load average before and after, and step times."""
    env = {"OMP_NUM_THREADS": str(setup.threads), "MKL_NUM_THREADS": str(setup.threads)} if setup.threads else None
    load_before = os.getloadavg()
    res = ex.train(
        objective,
        data,
        logs,
        setup.budget,
        echo=echo,
        env=env,
        entry=entry(objective),
        lock=False,
        **setup.child_options,
    )
    steps = read_logged_steps(res.log_dir / "out.log") if objective.name == OPENCLIP else read_step_times(res.log_dir)
    shutil.rmtree(res.log_dir / "checkpoints", ignore_errors=True)  # only the timing is kept
    return {
        "command": res.command,
        "wall_seconds": res.seconds,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "steps": [dataclasses.asdict(s) for s in steps],
    }


def measure(
    objs: Sequence[Run], data: dict, setup: Setup, rounds: int, work: Path, echo: Callable[[str], None] = print
) -> List[dict]:
    """Train every objective once per round, order rotated each round; one record per child.

    A child's output stays in ``work/runs/round<r>/<objective>/stdout.txt``.
    """
    records = []
    for r in range(rounds):
        for obj in round_order(objs, r):
            res = run_child(obj, data, setup, work / "runs" / f"round{r}", echo)
            rates = steady_rates([StepTime(**s) for s in res["steps"]], setup.warmup_steps, setup.tail_steps)
            echo(
                f"  round {r + 1}/{rounds}  {obj.name:<16} median {statistics.median(rates):8.1f} samples/s "
                f"over {len(rates)} steps  (child {res['wall_seconds']:.0f} s, load {res['load_before'][0]:.2f})"
            )
            records.append(
                {
                    "round": r,
                    "objective": obj.name,
                    "flags": list(obj.flags),
                    "command": res["command"],
                    "steady_samples_per_second": rates,
                    **res,
                }
            )
    return records


# ------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------
def table(summary: Dict[str, dict], objs: Sequence[Run], to_openclip: Optional[Dict[str, dict]] = None) -> str:
    """One row per objective (and OpenCLIP's trainer): samples/s, ratios to ``clip`` and to ``openclip``, and
    the goal: each objective against ``clip``, ``clip`` (our loop) against ``openclip`` (OpenCLIP's)."""
    to_openclip = to_openclip or {}
    rows = []
    for obj in objs:
        s = summary.get(obj.name)
        if not s:
            continue
        o = to_openclip.get(obj.name)
        if obj.name == OPENCLIP:
            meets = "reference"
        elif obj.name == BASELINE:
            meets = "baseline" if o is None else ("yes" if o["ratio_median"] >= GOAL else "**no**") + " (/ openclip)"
        else:
            meets = "yes" if s["ratio_median"] >= GOAL else "**no**"
        rows.append(
            [
                obj.name,
                f"{s['median']:.1f}",
                f"{s['min']:.1f} - {s['max']:.1f}",
                f"{s['throughput']:.1f}",
                f"{s['ratio_median']:.3f}",
                f"{s['ratio_min']:.3f} - {s['ratio_max']:.3f}",
                f"{s['fast_ratio_median']:.3f}",
                "-" if o is None else f"{o['ratio_median']:.3f} ({o['ratio_min']:.3f} - {o['ratio_max']:.3f})",
                meets,
            ]
        )
    return markdown_table(
        [
            "objective",
            "samples/s (median over rounds)",
            "range over rounds",
            "samples/s (pooled)",
            "/ clip (median of per-round ratios)",
            "ratio range",
            "/ clip, faster steps (upper quartile)",
            "/ openclip (median of per-round ratios; range)",
            f">= {GOAL}x",
        ],
        rows,
    )


def loop_reading(summary: Dict[str, dict], to_openclip: Dict[str, dict]) -> Optional[dict]:
    """``clip`` over ``openclip`` read once for the report's line, its notes and the docs' sentence: the per-round
    ratios, the pooled ratio, the noise floor (the larger round-to-round spread of the two rows) and the verdict
    (a gap within the floor whose rounds differ in sign is no measurable difference); None when not timed."""
    if BASELINE not in to_openclip or OPENCLIP not in summary:
        return None
    o = to_openclip[BASELINE]
    floor = max(spread(summary[BASELINE]["per_round"]), spread(summary[OPENCLIP]["per_round"]))
    gap = o["ratio_median"] - 1.0
    one_side = len(o["ratios"]) > 1 and (all(r < 1 for r in o["ratios"]) or all(r > 1 for r in o["ratios"]))
    if abs(gap) > floor:
        verdict = f"{'slower' if gap < 0 else 'faster'} by {100 * abs(gap):.1f} %, beyond the noise floor"
    elif one_side:
        verdict = (
            f"a gap of {100 * abs(gap):.1f} %, within the noise floor, but {'OpenCLIP' if gap < 0 else 'clip-dcl'}'s "
            f"loop was the faster in every round ({len(o['ratios'])} of {len(o['ratios'])})"
        )
    else:
        verdict = "within the noise floor, and the rounds differ in sign: no measurable difference"
    return {
        **o,
        "pooled": summary[BASELINE]["throughput"] / summary[OPENCLIP]["throughput"],
        "floor": floor,
        "openclip_faster": sum(r < 1 for r in o["ratios"]),
        "verdict": verdict,
    }


def loop_line(summary: Dict[str, dict], to_openclip: Dict[str, dict]) -> str:
    """The loop comparison in one line: ``clip`` over ``openclip`` within a round, its range, the goal."""
    r = loop_reading(summary, to_openclip)
    if r is None:
        return f"Loop comparison: no round timed both `{BASELINE}` and `{OPENCLIP}`."
    return (
        f"**clip-dcl's loop against OpenCLIP's:** `{BASELINE}` / `{OPENCLIP}` = {r['ratio_median']:.3f} "
        f"(median of {len(r['ratios'])} per-round ratios, range {r['ratio_min']:.3f} - {r['ratio_max']:.3f}; "
        f"faster steps {r['fast_ratio_median']:.3f}; pooled samples/s {r['pooled']:.3f}); OpenCLIP's the faster in "
        f"{r['openclip_faster']} of {len(r['ratios'])} rounds; noise floor {100 * r['floor']:.1f} % (the larger "
        f"max - min over the two rows' round medians): {r['verdict']}. Goal >= {GOAL}: "
        f"{'met' if r['ratio_median'] >= GOAL else '**missed**'} by the median, "
        f"{'met' if r['pooled'] >= GOAL else '**missed**'} pooled (the pooled figure counts every slow step, "
        "the medians hardly any)."
    )


def slowest_steps(records: Sequence[dict], setup: Setup) -> Dict[str, str]:
    """Per row: its children's slowest timed step (samples/s, median over children) and the step of the epoch
    where it fell most often: a recurring stall shows as one step in every child."""
    out = {}
    for name in dict.fromkeys(rec["objective"] for rec in records):
        rates, where = [], []
        for rec in records:
            if rec["objective"] == name:
                y = rec["steady_samples_per_second"]
                rates.append(min(y))
                where.append(setup.warmup_steps + y.index(min(y)))
        step = statistics.mode(where)
        out[name] = f"{statistics.median(rates):.0f} (step {step} in {where.count(step)} of {len(where)})"
    return out


def plot(
    records: Sequence[dict],
    summary: Dict[str, dict],
    objs: Sequence[Run],
    report: Report,
    title: str,
    to_openclip: Optional[Dict[str, dict]] = None,
) -> Path:
    """Left: per-step samples/s of every child (one dot per step) and each round's median.
    Right: each round's ratio to clip, the median over rounds, and the 0.97 goal; in OpenCLIP's column
    ``clip`` / ``openclip`` instead (our loop against OpenCLIP's, read against the same goal)."""
    to_openclip = to_openclip or {}
    names = [o.name for o in objs if o.name in summary]
    fig, (ax0, ax1) = pyplot().subplots(1, 2, figsize=(13, 4.6))
    rounds = sorted({rec["round"] for rec in records})
    for i, name in enumerate(names):
        for rec in records:
            if rec["objective"] != name:
                continue
            off = (rec["round"] - (len(rounds) - 1) / 2) * 0.8 / max(1, len(rounds))
            y = rec["steady_samples_per_second"]
            ax0.scatter(
                [i + off] * len(y),
                y,
                s=6,
                alpha=0.35,
                color=f"C{rec['round']}",
                label=f"round {rec['round'] + 1}" if i == 0 else None,
            )
            ax0.plot([i + off - 0.05, i + off + 0.05], [statistics.median(y)] * 2, color="black", lw=2)
    ax0.set_xticks(range(len(names)), names, rotation=20)
    ax0.set(ylabel="samples/s per step (after warm-up)", title="per-step throughput (bars: round medians)")
    ax0.grid(axis="y", alpha=0.3)
    ax0.legend(fontsize=8)
    ticks = []
    for i, name in enumerate(names):
        loop = name == OPENCLIP and BASELINE in to_openclip
        s = to_openclip[BASELINE] if loop else summary[name]
        ratios = s["ratios"]
        ax1.scatter(
            [i] * len(ratios),
            ratios,
            color="C1" if loop else "C0",
            alpha=0.7,
            label="clip / openclip per round" if loop else ("per round" if i == 0 else None),
        )
        ax1.plot([i - 0.25, i + 0.25], [s["ratio_median"]] * 2, color="black", lw=2, label="median" if i == 0 else None)
        ticks.append("clip / openclip" if loop else name)
    ax1.axhline(GOAL, color="red", ls="--", lw=1, label=f"goal {GOAL}x")
    ax1.axhline(1.0, color="grey", lw=0.8)
    ax1.set_xticks(range(len(names)), ticks, rotation=20)
    ax1.set(
        ylabel="samples/s / clip's in the same round",
        title="ratio to OpenCLIP's loss; clip-dcl's loop / OpenCLIP's",
    )
    ax1.grid(axis="y", alpha=0.3)
    ax1.legend(fontsize=8)
    return report.figure(fig, title)


def write_report(
    report: Report, records: List[dict], objs: Sequence[Run], setup: Setup, rounds: int, data: dict, about: dict
) -> Dict[str, Path]:
    """``train_throughput.md`` (settings, machine, command, table), ``.json`` (raw steps), ``.png``."""
    per_round = per_round_rates(records)
    summary = summarize(per_round)
    to_openclip = to_reference(per_round)
    device_words = about["gpu"] if setup.device == "cuda" else "CPU"
    title = (
        f"training throughput, {setup.model} {setup.precision} on {device_words}, batch {setup.batch_size}, "
        f"{rounds} rounds"
    )
    png = plot(records, summary, objs, report, title, to_openclip)
    data_time = {
        name: statistics.median(
            s["data_seconds"]
            for rec in records
            if rec["objective"] == name
            for s in rec["steps"][setup.warmup_steps : len(rec["steps"]) - setup.tail_steps]
        )
        for name in summary
    }
    wall = {
        name: statistics.median(rec["wall_seconds"] for rec in records if rec["objective"] == name) for name in summary
    }
    lines = [
        f"# Training throughput: dcl and decl against OpenCLIP's loss, clip-dcl's loop against OpenCLIP's "
        f"({setup.device})",
        "",
        *report.about(),
        f"- load average (1/5/15 min) before: {fmt_load(about['load_before'])}; after: {fmt_load(about['load_after'])}",
        f"- setup: `python -m clip_dcl.train` children, and `{OPENCLIP}`: OpenCLIP's `open_clip_train.main` "
        "(its `train_one_epoch`, its `ClipLoss`) with the same OpenCLIP flags and no `--loss`; "
        f"model `{setup.model}` ({setup.image_size} px synthetic "
        f"shards), `--precision {setup.precision} --device {setup.device}`, batch {setup.batch_size}, "
        f"{setup.workers} loader worker(s), seed {setup.seed}, torch threads per child: "
        f"{setup.threads or 'torch default'}; each child trains {setup.train_steps} steps: the first "
        f"{setup.warmup_steps} (warm-up) and the last {setup.tail_steps} (already prefetched when the loader "
        f"stops, so they run without it) are dropped, {setup.steps} are timed (each loop's per-step "
        f"`Batch (t)` and samples/s with `--log-every-n-steps 1`, data wait included: clip-dcl's from its "
        "`metrics.jsonl`, OpenCLIP's from its `out.log`)",
        f"- {rounds} rounds x {len(objs)} children, interleaved, order rotated by one each round; ratios are "
        f"taken within a round; raw per-step numbers and commands: `{STEM}.json`",
        f"- goal: >= {GOAL}x the samples/s of `--loss clip` for each objective, and `--loss clip` (clip-dcl's loop) "
        f"at >= {GOAL}x `{OPENCLIP}`",
        "",
        table(summary, objs, to_openclip),
        "",
        *([loop_line(summary, to_openclip), ""] if OPENCLIP in summary else []),
        "Median data-loader wait per step (s): "
        + ", ".join(f"{n} {data_time[n]:.3f}" for n in summary)
        + ". Median child wall time including start-up (s): "
        + ", ".join(f"{n} {wall[n]:.1f}" for n in summary)
        + ". Slowest timed step, samples/s (median over rounds; the epoch's step where it fell most often: a "
        "stall at one step in every child of a row is that program's own, not outside load): "
        + ", ".join(f"{n} {v}" for n, v in slowest_steps(records, setup).items())
        + ".",
        "",
        f"![per-step throughput and ratios]({png.name})",
        "",
        about.get("notes", ""),
    ]
    doc = {
        **{k: v for k, v in about.items() if k != "notes"},
        "setup": dataclasses.asdict(setup),
        "rounds": rounds,
        "goal": GOAL,
        "baseline": BASELINE,
        "reference": OPENCLIP,
        "data": {k: data.get(k) for k in ("out_dir", "train_data", "tau_plus")},
        "summary": summary,
        "to_openclip": to_openclip,
        "children": records,
    }
    md = report.write(lines, doc)
    return {"markdown": md, "json": report.path(".json"), "png": png, "summary": summary, "to_openclip": to_openclip}


def notes(records: Sequence[dict], setup: Setup, about: dict) -> str:
    """How to read the table: the baseline's own spread over rounds (the noise floor), the loop comparison and
    what differs between the two loops, load, the GPU path."""
    per_round = per_round_rates(records)
    summary = summarize(per_round)
    to_openclip = to_reference(per_round)
    floor = spread(summary[BASELINE]["per_round"])
    loads = [r["load_before"][0] for r in records]
    lines = [
        "## Reading it",
        "",
        f"- Noise floor: `clip` itself moved by {100 * floor:.1f} % (max - min over its round medians) from "
        "round to round; a ratio within about that distance of 1.0 is no measurable difference.",
    ]
    reading = loop_reading(summary, to_openclip)
    if reading is not None:
        lines += [
            f"- Loop: `clip` / `openclip` (clip-dcl's loop with `--loss clip` over OpenCLIP's own main and loop, "
            f"same flags, same `ClipLoss`; the line under the table): {reading['verdict']}.",
            "- What the two do differently per step, besides the loss: clip-dcl's loader makes each sample's id "
            "in the worker and carries it in the batch, counts skipped samples and seeds its shuffles from "
            "`--seed` (OpenCLIP's sample shuffle is not seeded from it, so its children read the same shards in "
            "another order); clip-dcl's loop asks at each step boundary whether to stop or save, counts "
            "non-finite losses, and appends one `metrics.jsonl` record per logged step (here every step), where "
            "OpenCLIP writes its log line only. Both read the loss and the logit scale on every logged step. "
            "Start-up (imports, model, data pipeline) is not timed; the wall times above include it.",
        ]
    lines += [
        f"- Load: 1-minute load average {min(loads):.2f} - {max(loads):.2f} when the children started. "
        + (
            "The benchmark held the clip-dcl training lock, so no other training started through "
            "`clip_dcl.experiment` ran beside it, but other work on the machine (evaluations of other "
            "benchmarks) was not stopped. "
            if about.get("locked")
            else "Run with `--no-lock`: other trainings may have run beside it. "
        )
        + "Ratios from interleaved rounds are robust to steady load and noisy under bursty load; the "
        "upper-quartile column is less moved by bursts.",
    ]
    if setup.device == "cpu":
        lines += [
            f"- {setup.model} at {setup.image_size} px is small: the step is dominated by the encoders and the "
            "JPEG decoding of the loader worker (which shares the cores), and the loss is a few milliseconds "
            "of it at this batch (see `loss_speed.md` for the loss alone).",
            "- GPU: not run here (no GPU on this machine). `--device cuda` times OpenCLIP's ViT-B-32 at 224 px "
            "with `--precision amp_bf16`, batch 256, 8 loader workers, on synthetic shards drawn at 224 px, "
            "with the same OpenCLIP row.",
        ]
    return "\n".join(lines)


def fmt_load(load: Sequence[float]) -> str:
    return "/".join(f"{x:.2f}" for x in load)


# ------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], allow_abbrev=False, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: batch 32, 2 warm-up + 6 timed steps, 1 round; report under --work",
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cpu: clip-dcl-tiny fp32; cuda: ViT-B-32 at 224 px, amp_bf16 (needs a GPU)",
    )
    p.add_argument("--rounds", type=int, default=None, help="rounds (default: 5, 1 with --quick)")
    p.add_argument("--batch-size", type=int, default=None, help="per-step batch (default: 128 cpu, 256 cuda)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per child (default: 20 cpu, 40 cuda)")
    p.add_argument("--warmup-steps", type=int, default=None, help="steps dropped per child (default: 5 cpu, 10 cuda)")
    p.add_argument("--workers", type=int, default=None, help="data loader workers (default: 1 cpu, 8 cuda)")
    p.add_argument("--model", default=None, help="OpenCLIP model name (default: clip-dcl-tiny cpu, ViT-B-32 cuda)")
    p.add_argument("--threads", type=int, default=0, help="torch threads per child (0: torch's default)")
    p.add_argument(
        "--only",
        nargs="+",
        default=None,
        metavar="NAME",
        help=f"time only these objectives (clip and {OPENCLIP!r} are always added), e.g. --only dcl 'decl rate=index'",
    )
    p.add_argument(
        "--no-lock",
        action="store_true",
        help="do not wait for other clip-dcl trainings on this machine (clip_dcl.experiment.machine_lock)",
    )
    p.add_argument(
        "--work",
        default=os.path.join(tempfile.gettempdir(), "clip_dcl_train_throughput"),
        help="synthetic data and child logs go here",
    )
    p.add_argument(
        "--out-dir",
        default=None,
        help="report folder (default: benchmarks/results, or WORK/<mode>/report with --quick)",
    )
    return p


def make_setup(args) -> Setup:
    base = CUDA_SETUP if args.device == "cuda" else (QUICK_SETUP if args.quick else CPU_SETUP)
    if args.quick and args.device == "cuda":
        base = dataclasses.replace(base, warmup_steps=3, steps=6, batch_size=64)
    fields = {
        "batch_size": args.batch_size,
        "steps": args.steps,
        "warmup_steps": args.warmup_steps,
        "workers": args.workers,
        "model": args.model,
    }
    setup = dataclasses.replace(base, threads=args.threads, **{k: v for k, v in fields.items() if v is not None})
    setup.validate()
    return setup


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    setup = make_setup(args)
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 5)
    if rounds < 1:
        raise SystemExit(f"--rounds must be >= 1, got {rounds}")
    known = {o.name for o in runs(0.0)}
    bad = [n for n in args.only or () if n not in known]
    if bad:
        raise SystemExit(f"--only: unknown objective(s) {bad}; known: {sorted(known)}")
    import torch

    if setup.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch.cuda.is_available() is False on this machine")

    from clip_dcl.data.synth import generate

    mode = f"{'quick' if args.quick else 'full'}-{setup.device}"
    work = Path(args.work) / mode
    out_dir = Path(args.out_dir) if args.out_dir else (work / "report" if args.quick else HERE / "results")
    # Resampled shards: a few shards of any size do; twice a step's worth per worker keeps them varied.
    samples = max(setup.batch_size * max(2, setup.workers) * 2, 512)
    data = generate(
        work / f"data-{setup.image_size}px",
        quick=True,
        reuse=True,
        image_size=setup.image_size,
        train_samples=samples,
        shard_size=math.ceil(samples / max(4, setup.workers)),
        num_classes=10,
    )
    objs = runs(float(data["tau_plus"]))
    if args.only:
        objs = [o for o in objs if o.name in (BASELINE, OPENCLIP) or o.name in args.only]

    report = Report(
        out_dir, STEM, ex.command_line("train_throughput.py", sys.argv[1:] if argv is None else argv), work=work
    )
    print(
        f"{len(objs)} children x {rounds} rounds, {setup.train_steps} steps each "
        f"({setup.warmup_steps} warm-up, {setup.tail_steps} tail) at batch {setup.batch_size} on {setup.device}",
        flush=True,
    )
    lock = contextlib.nullcontext() if args.no_lock else ex.machine_lock(lambda m: print(m, flush=True))
    with lock:
        load_before = os.getloadavg()
        start = time.perf_counter()
        records = measure(objs, data, setup, rounds, work, echo=lambda m: print(m, flush=True))
        load_after = os.getloadavg()
    about = {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU",
        "load_before": list(load_before),
        "load_after": list(load_after),
        "measure_seconds": time.perf_counter() - start,
        "locked": not args.no_lock,
    }
    about["notes"] = notes(records, setup, about)
    written = write_report(report, records, objs, setup, rounds, data, about)
    print(table(written["summary"], objs, written["to_openclip"]))
    if OPENCLIP in written["summary"]:
        print(loop_line(written["summary"], written["to_openclip"]))
    print(f"wrote {written['markdown']}, {written['json'].name}, {written['png'].name}")
    return 0


# ------------------------------------------------------------------------------------------
# The README's numbers (benchmarks/quotes.py)
# ------------------------------------------------------------------------------------------
def readme_block(doc: dict) -> str:
    """The README's sentences: the baseline's samples/s and spread, each objective's median ratio to it, and
    the baseline's ratio to OpenCLIP's own trainer (clip-dcl's loop against OpenCLIP's) where it was timed."""
    s, setup, base = doc["summary"], doc["setup"], doc["baseline"]
    ref = doc.get("reference")
    b = s[base]
    ratios = ", ".join(f"`{name}` {v['ratio_median']:.2f}" for name, v in s.items() if name not in (base, ref))
    rounds = len(b["per_round"])
    text = (
        f"On {doc['machine'].split(';')[0]} with `{setup['model']}` at batch {setup['batch_size']} "
        f"({setup['device']}, {setup['precision']}), `{base}` runs {b['median']:.0f} samples/s (median over {rounds} "
        f"rounds; its own rounds spread by {100 * spread(b['per_round']):.1f} %). Median ratios to it: "
        f"{ratios} (goal: at least {doc['goal']:.2f})."
    )
    loop = loop_reading(s, doc.get("to_openclip", {})) if ref else None
    if loop:
        text += (
            f" Against OpenCLIP's own trainer (`open_clip_train.main`, same flags, {s[ref]['median']:.0f} samples/s), "
            f"clip-dcl's loop with `--loss {base}` runs at {loop['ratio_median']:.2f} of its samples/s "
            f"(per round {loop['ratio_min']:.2f} - {loop['ratio_max']:.2f}, OpenCLIP's the faster in "
            f"{loop['openclip_faster']} of {len(loop['ratios'])}; noise floor {100 * loop['floor']:.1f} %): "
            f"{loop['verdict']}."
        )
    return text


if __name__ == "__main__":
    sys.exit(main())
