"""What the benchmarks that train every objective over several seeds share (``quality.py``,
``sampling_bias.py``): one job's progress line and its training and evaluation (its scores cached under
``work/scores``), and the tally of each objective's results, scores and evaluation times."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Dict, List, Sequence

from clip_dcl import experiment as ex


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
