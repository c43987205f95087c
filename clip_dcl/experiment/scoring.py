"""Evaluating trained runs and putting their scores next to chance (what a random embedding would score,
worked out from the data's sizes)."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from ..paths import write_json
from . import runner
from .commands import defaults_of
from .runner import Budget, Run, TrainResult

#: Version of what `evaluate` reports, bumped when an evaluator changes its numbers so that cached runs are
#: evaluated again. 2: the few-shot probe ignores diverged heads.
EVALUATOR = 2


@dataclass
class Outcome:
    result: TrainResult
    metrics: Dict[str, float]
    eval_seconds: float
    #: UTC time the evaluation finished, ``YYYY-MM-DD HH:MM``
    finished: str
    #: "trained", "evaluated" (cached training, evaluated again) or "reused"
    source: str


def train_and_evaluate(
    run: Run,
    data: dict,
    logs: os.PathLike,
    budget: Budget,
    cache: os.PathLike,
    *,
    fewshot_seeds: Sequence[int] = (0, 1, 2),
    entry: Optional[Sequence[str]] = None,
    env: Optional[dict] = None,
    echo: Callable[[str], None] = print,
    device: str = "auto",
) -> Outcome:
    """`train` then `evaluate`, remembered in the JSON file ``cache``: a later call with the same settings
    reuses the training, and its scores unless `EVALUATOR` changed, so that a benchmark resumes."""
    cache = Path(cache)
    # compared as JSON holds it (tuples come back as lists); a loss's defaults too: ``--loss decl`` changes
    # meaning when a default changes
    defaults = defaults_of(run.flags)
    key = json.loads(
        json.dumps(
            {
                "flags": list(run.flags),
                "budget": dataclasses.asdict(budget),
                "data": data["config"],
                "fewshot_seeds": list(fewshot_seeds),
                **({"loss_defaults": defaults} if defaults else {}),
            }
        )
    )
    doc = json.loads(cache.read_text()) if cache.is_file() else {}
    res = None
    if doc.get("settings") == key and Path(doc.get("checkpoint", "")).is_file():
        res = TrainResult(
            run,
            Path(doc["checkpoint"]),
            Path(doc["log_dir"]),
            doc["seconds"],
            doc["command"],
            doc["curves"],
            doc["val"],
        )
        if doc.get("evaluator") == EVALUATOR:
            return Outcome(res, doc["metrics"], doc["eval_seconds"], doc["finished"], "reused")
    source = "evaluated" if res is not None else "trained"
    if res is None:
        res = runner.train(run, data, logs, budget, echo=echo, env=env, entry=entry, device=device)
    t0 = time.perf_counter()
    metrics = evaluate(res.checkpoint, data, fewshot_seeds=fewshot_seeds, device=device)
    secs = time.perf_counter() - t0
    finished = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    cache.parent.mkdir(parents=True, exist_ok=True)
    trained = {f.name: getattr(res, f.name) for f in dataclasses.fields(res) if f.name != "run"}
    evaluated = {"metrics": metrics, "eval_seconds": secs, "finished": finished}
    write_json(cache, {"settings": key, "evaluator": EVALUATOR, **trained, **evaluated}, indent=None, default=str)
    return Outcome(res, metrics, secs, finished, source)


def evaluate(
    checkpoint: os.PathLike,
    data: dict,
    *,
    shots: int = 5,
    fewshot_seeds: Sequence[int] = (0, 1, 2),
    grid: str = "reduced",
    batch_size: int = 256,
    progress: bool = False,
    device: str = "auto",
    split: str = "validation",
    fewshot: bool = True,
) -> Dict[str, float]:
    """Retrieval, zero-shot and few-shot scores of a checkpoint on a synthetic data set: the evaluators' own
    keys under ``retrieval/``, ``zeroshot/`` (where ``data`` has a zero-shot set) and ``fewshot/``."""
    if split not in ("validation", "test"):
        raise ValueError(f"split={split!r}: choose 'validation' or 'test'")
    if split == "test" and "test_data" not in data:
        raise ValueError(f"split='test': the data under {data.get('out_dir')} were written without a test split")
    from ..checkpoint import load_checkpoint
    from ..eval.encoding import EvalOptions, resolve_device
    from ..eval.fewshot import evaluate_fewshot
    from ..eval.retrieval import evaluate_retrieval
    from ..eval.zeroshot import evaluate_zeroshot

    root = Path(data["out_dir"])
    device = resolve_device(device)
    model, preprocess, tokenizer = load_checkpoint(checkpoint, device)
    out: Dict[str, float] = {}
    options = EvalOptions(batch_size=batch_size, progress=progress, device=device)
    pairs, zeroshot = (
        (data["val_data"], data.get("zeroshot"))
        if split == "validation"
        else (data["test_data"], data.get("zeroshot_test"))
    )
    ret = evaluate_retrieval(model, preprocess, tokenizer, pairs, options=options)
    out.update({f"retrieval/{k}": float(v) for k, v in ret.items()})
    if zeroshot is not None:  # a study on a user's shards may have no zero-shot set (an absolute "dir" stays itself)
        zs = evaluate_zeroshot(model, preprocess, tokenizer, root / zeroshot["dir"], options=options)
        out.update({f"zeroshot/{k}": float(v) for k, v in zs.items()})
    if not fewshot:
        return out
    fs = evaluate_fewshot(
        model,
        preprocess,
        tokenizer,
        root / data["fewshot"]["dir"],
        shots=shots,
        seeds=tuple(fewshot_seeds),
        grid=grid,
        options=options,
    )
    out.update({f"fewshot/{k}": float(v) for k, v in fs.items()})
    return out


def chance_levels(data: dict) -> Dict[str, float]:
    """What an embedding unrelated to the content scores on each headline metric, in expectation.

    Retrieval: every image has ``m`` captions among ``M = m * N`` (image -> text hits if any of
    its ``m`` is in the top k: ``1 - C(M - m, k) / C(M, k)``); text -> image ``k / N``.
    Classification on balanced classes: top-k ``k / C``, mean per-class recall ``1 / C``.
    Few-shot: ``1 / C`` for accuracy and mean per-class recall (the synthetic suite and the
    digits are balanced or near it, so accuracy's chance is the same to within a point).
    """
    from ..eval.metrics import any_hit_chance

    n_img = int(data["val"]["num_samples"])
    m = int(data["config"]["val_captions_per_image"])
    chance: Dict[str, float] = {}
    for k in (1, 5, 10):
        chance[f"retrieval/image_to_text_R@{k}"] = any_hit_chance(n_img * m, m, k)
        chance[f"retrieval/text_to_image_R@{k}"] = min(1.0, k / n_img)
    c = int(data["zeroshot"]["num_classes"])
    chance["zeroshot/top1"] = 1 / c
    chance["zeroshot/top5"] = min(1.0, 5 / c)
    chance["zeroshot/mean_per_class_recall"] = 1 / c
    per_set = []
    for name, spec in data["fewshot"]["datasets"].items():
        level = 1 / int(spec["num_classes"])
        per_set.append(level)
        for score in ("linear_probe", "mean_classifier", "zeroshot"):
            chance[f"fewshot/{name}/{score}"] = level
    if per_set:
        for score in ("linear_probe", "mean_classifier", "zeroshot"):
            chance[f"fewshot/average/{score}"] = sum(per_set) / len(per_set)
    return chance


def headline_metrics(data: dict) -> List[tuple]:
    """``(key, label)`` of the rows of the comparison table, in order."""
    rows = [(f"retrieval/image_to_text_R@{k}", f"retrieval image->text R@{k}") for k in (1, 5, 10)]
    rows += [(f"retrieval/text_to_image_R@{k}", f"retrieval text->image R@{k}") for k in (1, 5, 10)]
    rows.append(("zeroshot/top1", "zero-shot top-1"))
    if int(data["zeroshot"]["num_classes"]) > 5:  # top-5 of 5 classes or fewer is 100 % by definition
        rows.append(("zeroshot/top5", "zero-shot top-5"))
    rows.append(("zeroshot/mean_per_class_recall", "zero-shot mean per-class recall"))
    for name in data["fewshot"]["datasets"]:
        rows.append((f"fewshot/{name}/linear_probe", f"5-shot probe {name}"))
    rows += [
        ("fewshot/average/linear_probe", "5-shot probe average"),
        ("fewshot/average/mean_classifier", "5-shot mean classifier average"),
    ]
    return rows


#: The mean of the image->text and text->image R@1: one retrieval score for a paired comparison.
MEAN_R1 = "retrieval/mean_R@1"


def with_mean_r1(metrics: Dict[str, float]) -> Dict[str, float]:
    """``metrics`` plus :data:`MEAN_R1` (nan when either R@1 is missing)."""
    i2t, t2i = metrics.get("retrieval/image_to_text_R@1"), metrics.get("retrieval/text_to_image_R@1")
    out = dict(metrics)
    out[MEAN_R1] = (i2t + t2i) / 2 if i2t is not None and t2i is not None else float("nan")
    return out
