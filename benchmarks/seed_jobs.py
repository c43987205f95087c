"""What the benchmarks that train every objective over several seeds share (``quality.py``,
``sampling_bias.py``): their command line, one job's progress line and its training and evaluation (its scores
cached under ``work/scores``), the tally of each objective's results, scores and evaluation times, and what their
reports name (a :class:`Sweep`)."""

from __future__ import annotations

import argparse
import dataclasses
import time
from datetime import datetime
from pathlib import Path
from typing import Dict, List, Sequence

from clip_dcl import experiment as ex
from clip_dcl.experiment import arguments

#: Where the published reports go.
RESULTS = Path(__file__).resolve().parent / "results"


def sweep_parser(script: str, doc: str, **options) -> argparse.ArgumentParser:
    """The parser of ``benchmarks/<script>`` with the flags of a comparison on the synthetic data
    (:func:`clip_dcl.experiment.arguments.add_comparison_arguments`; ``options``: its defaults and helps), its runs
    under ``/tmp/clip_dcl_<script's name>`` and its report under :data:`RESULTS`."""
    p = arguments.benchmark_parser(script, doc)
    work = f"/tmp/clip_dcl_{Path(script).stem}"
    arguments.add_comparison_arguments(p, work=work, results=str(RESULTS), **options)
    return p


def add_fewshot_seeds(p: argparse.ArgumentParser) -> None:
    """``--fewshot-seeds``, read by :func:`fewshot_draws`."""
    p.add_argument(
        "--fewshot-seeds",
        type=int,
        nargs="+",
        default=None,
        help="k-shot draws of the 5-shot probe (default 0 1 2; quick 0)",
    )


def fewshot_draws(args: argparse.Namespace) -> List[int]:
    """The k-shot draws of the 5-shot probe: ``--fewshot-seeds``, else 0 for a smoke run and 0 1 2 otherwise."""
    return args.fewshot_seeds or ([0] if args.quick else [0, 1, 2])


@dataclasses.dataclass
class Tally:
    """Per objective, in the order its seeds finished: its training results, its scores (each with its seed) and
    the seconds each evaluation took."""

    results: Dict[str, List[ex.TrainResult]]
    scores: Dict[str, List[Dict[str, float]]]
    eval_seconds: Dict[str, List[float]]

    @classmethod
    def of(cls, runs: Sequence[ex.Run]) -> "Tally":
        return cls(*({r.name: [] for r in runs} for _ in range(3)))

    def add(self, name: str, result: ex.TrainResult, scores: Dict[str, float], seed: int, seconds: float) -> None:
        self.results[name].append(result)
        self.scores[name].append({**scores, "seed": seed})
        self.eval_seconds[name].append(seconds)

    def finished(self) -> Dict[str, List[Dict[str, float]]]:
        """The scores of the objectives with at least one finished seed."""
        return {n: v for n, v in self.scores.items() if v}


@dataclasses.dataclass
class Sweep:
    """One call of a benchmark, as its report names it: the report's folder ``out``, the data, budget and training
    seeds, the k-shot draws of the few-shot probe, the command, and when the call started (``started``, and
    ``clock``, :func:`time.perf_counter` then)."""

    out: Path
    data: dict
    budget: ex.Budget
    seeds: List[int]
    fewshot_seeds: List[int]
    command: str
    started: datetime
    clock: float

    def seconds(self) -> float:
        """Wall seconds of this call so far."""
        return time.perf_counter() - self.clock

    def write_report(self, stem: str, tally: Tally, header: str, extra: dict, **more) -> Dict[str, Path]:
        """:func:`clip_dcl.experiment.write_report` of the finished objectives into ``out``, the JSON's ``extra``
        led by the training seeds (``more``: that function's other keywords)."""
        have = tally.finished()
        self.out.mkdir(parents=True, exist_ok=True)
        return ex.write_report(
            self.out,
            stem,
            data=self.data,
            budget=self.budget,
            results={n: tally.results[n] for n in have},
            scores=have,
            header=header,
            extra={"seeds": self.seeds, **extra},
            **more,
        )


def train_job(
    tag: str, done: int, total: int, run: ex.Run, seed: int, budget: ex.Budget, data: dict, work: Path, **more
):
    """Say ``[tag] done/total`` with the run, its seed and budget, then train and evaluate it at ``seed``
    (`clip_dcl.experiment.train_and_evaluate`, its logs under ``work/runs/seed<seed>`` and its scores cached in
    ``work/scores``; ``more``: that function's keywords)."""
    print(
        f"[{tag}] {done}/{total} {run.name} ({' '.join(run.flags)}), seed {seed}, "
        f"{budget.epochs} epoch(s) of {data['train']['num_samples']} pairs",
        flush=True,
    )
    cache = work / "scores" / f"{run.slug}-seed{seed}.json"
    return ex.train_and_evaluate(
        run, data, work / "runs" / f"seed{seed}", dataclasses.replace(budget, seed=seed), cache, **more
    )
