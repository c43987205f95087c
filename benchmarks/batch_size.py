"""Batch size on a testbed where it matters: does DeCL at batch B reach InfoNCE at 2B?

The DeCL paper's claim is that its decomposed loss, whose minibatch gradient is unbiased, makes a
small batch train like a large one. That needs a testbed where InfoNCE itself gains from a larger
batch, trained to a plateau:

- **data**: ``clip-dcl data synth --image-size 32 --num-classes 48 --train-samples 12000``: 48
  shape x colour classes crossed with size, count, position and background, so thousands of
  concepts; a caption differing from the anchor's in one attribute is rare in a batch of 16 and
  common in one of 512;
- **model**: ``clip-dcl-micro`` (2+2-layer ViT at 32 px, width 64, text context 24, embedding 64);
- **budget**: ``--epochs`` (default 20) at lr 1e-3, wd 0.1, warm-up 50 steps, the same number of
  epochs at every batch size; validation after every epoch, so the report shows whether the
  validation R@1 is flat over the last fifth of training (the plateau check);
- **splits**: the 12,000 training images; the **validation** split (1,000 images, 5 captions each,
  and 20 zero-shot images per class), which every choice reads (defaults, variants, the per-epoch
  curves); the **test** split (``--test-samples 1000``: 1,000 other images and another 20 per
  class, from seed streams of their own), which only the quoted verdicts read;
- **primary metric**: retrieval mean R@1 (image->text and text->image); zero-shot top-1 over the 48
  classes second.

Stages (``--stage``), each resumable (every finished run is cached under ``--work`` by its flags,
budget and data, and reused):

1. ``gate``: ``clip`` at every ``--batch-sizes`` with every ``--seeds``. The gate passes when the
   mean R@1 at the largest batch exceeds that at the smallest by at least 3 points and the seeds'
   ranges do not overlap.
2. ``screen``: every DeCL variant of :data:`DECL_VARIANTS`, ``dcl`` at tau_plus 0.05 and ``clip``,
   one seed, at ``--screen-batch-sizes``. Each variant differs in one setting from the package
   default the screen ran against (:data:`SCREEN_BASE`: the absolute estimate; the package default
   is now the relative estimate, chosen by the sweep), every flag written out from the loss
   registry's flag table.
3. ``sweep``: ``clip``, ``dcl`` and ``--sweep-variants`` (default :data:`SWEEP_VARIANTS`, which the
   screen picked) at every batch size and seed.
4. ``decisive``: the verdicts, on the test split: at each of ``--decisive-batch-sizes`` (32, 64),
   ``decl default`` at B, ``clip`` at B and ``clip`` at 2B, seed after seed (from ``--seeds``, at
   most :data:`SEED_CAP`), until :func:`reach_verdict` gives a verdict at that B.
5. ``controls``: the temperature controls at the decisive batch sizes: InfoNCE with its scale fixed
   at ``decl``'s final one, and ``decl`` with its scale fixed at ``clip``'s (the final scales are
   read from the validation sweep).
6. ``dcl-screen``: every ``dcl`` setting of :data:`DCL_VARIANTS` at ``--screen-batch-sizes`` (the
   largest first), ``--screen-seed``, judged on the validation split against ``clip`` at the same
   batch and seed.
7. ``dcl-sweep``: the settings through that screen (``--dcl-sweep-variants``, default
   :data:`DCL_SWEEP_VARIANTS`) and ``clip`` at every ``--batch-sizes`` (largest first) and ``--seeds``,
   read on the test split by :data:`DCL_RULE` (report ``dcl_sweep.{md,json}``, beside the
   sampling-bias data's zero-shot reports of :data:`DCL_BIAS_REPORTS`).
8. ``screen16``: ``decl default``, ``clip`` and each setting of :data:`SCREEN16_VARIANTS` at B = 16,
   ``--screen-seed``, on the validation split; ``screen16-test``: the best of them (refused until the
   screen is complete, or when no variant scores above the package default) at B = 16 beside ``clip``
   at 16 and 32 with ``--seeds``, read on the test split by the decisive rule.

The gate, screen and sweep of the 2026-11 reports ran before the test split existed: their scores
are on the validation split, kept in ``results/batch_size_validation_sweep.{md,json}``.

``--jobs 2`` trains two runs side by side (one torch thread each; on a 2-core machine that is
faster than one after the other for a model this small). The report,
``benchmarks/results/batch_size.{md,json,png}``, is rewritten after every run, with its status.

Run ``.venv/bin/python benchmarks/batch_size.py --stage screen`` (each run is 5-40 min on 2 CPU
cores, longer at small batches); ``--quick`` is a smoke run that reports under ``--work``.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import hashlib
import json
import re
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from clip_dcl import experiment as ex
from clip_dcl.experiment import arguments
from clip_dcl.experiment.commands import loss_flags
from clip_dcl.experiment.figures import pyplot
from clip_dcl.experiment.scoring import MEAN_R1, with_mean_r1
from clip_dcl.experiment.stats import format_mean_std, mean_std, wins

HERE = Path(__file__).resolve().parent
STEM = "batch_size"
MODEL = "clip-dcl-micro"
DATA = dict(image_size=32, num_classes=48, train_samples=12000, test_samples=1000)
QUICK_DATA = dict(image_size=32, num_classes=48, test_samples=64)
HEADLINE = ((MEAN_R1, "retrieval mean R@1"), ("zeroshot/top1", "zero-shot top-1"))
BATCH_SIZES = (16, 32, 64, 128, 256, 512)
SCREEN_BATCH_SIZES = (16, 64)
#: the sweep's DeCL variants, picked by the 20-epoch screen (seed 0, report ``batch_size.md``): the
#: package default (the relative estimate, best at B = 16 with 19.0 R@1), the absolute estimate (the
#: default when the screen ran) and the batch rate (best at B = 64, 41.7); the queue and
#: read-then-update collapsed there
SWEEP_VARIANTS = ("decl default", "decl absolute", "decl batch")
GATE_POINTS = 0.03
#: the validation-split sweep of the gate, screen and sweep stages (scored before the test split existed)
ARCHIVE = HERE / "results" / "batch_size_validation_sweep.json"

# ------------------------------------------------------------------------------------------
# The decision rule, fixed before the decisive runs (the report and docs/results.md print it from here)
# ------------------------------------------------------------------------------------------
#: the data's seed (``clip-dcl data synth --seed``): draw 0 holds every split the verdicts read; another draw,
#: same recipe, repeats the decisive comparison (``--data-seed``) in a data folder of its own
DATA_SEED = 0
DECISIVE_SIZES = (32, 64)
#: the batch sizes the verdict table covers (16 from the validation sweep: no test-split runs there)
VERDICT_SIZES = (16, 32, 64)
CONFIDENCE = 0.90
#: the evaluation's resolution: about one point of mean R@1 on 1,000 images (fractions here)
RESOLUTION = 0.01
MIN_SEEDS = 3
SEED_CAP = 10
RULE = (
    f"Differences are paired by seed (same data order and initialisation) and summarised by their mean and "
    f"{100 * CONFIDENCE:.0f} % t-interval over seeds. **Reaches** `clip` at 2B: the interval of decl@B - clip@2B lies "
    f"above minus half of `clip`'s own gain from B to 2B (mean over the same seeds); **does not reach**: it lies "
    f"below; otherwise no verdict. **Beats** `clip` at B: the interval of decl@B - clip@B lies above zero and the "
    f"mean exceeds the resolution ({100 * RESOLUTION:.0f} point of R@1 on 1,000 images); **trails**: the mirror "
    f"image; an interval on one side of zero whose mean is inside the resolution is a **tie**, never a win; an "
    f"interval across zero gives no verdict. Seeds are added "
    f"({MIN_SEEDS} at least, {SEED_CAP} at most) until the reach verdict is given.")


# ------------------------------------------------------------------------------------------
# The objectives, every flag written out from the loss registry (clip_dcl.experiment.commands)
# ------------------------------------------------------------------------------------------
#: the package default when the screen ran: the screen's variants change one setting of it, and
#: keep their flags (so their cached runs) whatever the package default is now
SCREEN_BASE = {"estimate": "absolute"}
#: DeCL variants: the package default, then the screen's, each one setting away from SCREEN_BASE.
DECL_VARIANTS = {
    "decl default": {},
    "decl absolute": dict(SCREEN_BASE),
    "decl FastCLIP gamma (cosine to 0.2)": {**SCREEN_BASE, "gamma": 0.2, "gamma_schedule": "cosine"},
    "decl queue": {**SCREEN_BASE, "rate": "queue"},
    "decl read-then-update": {**SCREEN_BASE, "include_current": False},
    "decl batch": {**SCREEN_BASE, "rate": "batch"},
    "decl scale learned by both terms": {**SCREEN_BASE, "temperature_mode": "learned"},
    "decl RGCL-g temperature": {**SCREEN_BASE, "temperature_mode": "rgclg"},
}
#: B = 16, where no variant reached ``clip`` on the validation split: settings of the package default's
#: relative estimate screened there (``--stage screen16``, validation split, one seed), each one setting away
#: from the package default; the best goes on to the test split with the seeds the rule needs
SCREEN16_VARIANTS = {
    "decl gamma 0.5": {"gamma": 0.5},
    "decl gamma 0.2": {"gamma": 0.2},
    "decl schedule decl": {"schedule": "decl"},
    "decl schedule harmonic": {"schedule": "harmonic"},
    "decl schedule constant": {"schedule": "constant"},  # at lambda 1 (the default): the decl schedule exactly
    "decl schedule constant 0.5": {"schedule": "constant", "lam": 0.5},
}
SCREEN16_SIZE = 16
BASELINES = {"clip": ("--loss", "clip")}
#: ``--loss dcl`` with no other loss flag, whatever the package defaults are when it runs (its
#: record's commit says which): checked against ``clip`` at :data:`DCL_DEFAULT_SIZE` on the test split
DCL_DEFAULT = "dcl package default"
DCL_DEFAULT_SIZE = 64
#: ``dcl``'s package defaults when its screen ran: every ``dcl`` objective here spells them out, so that
#: a cached run keeps its meaning whatever the package default becomes
DCL_SCREEN_BASE = {"tau_plus": 0.1, "clamp": "clamp", "same_class": "positive"}
#: ``dcl`` settings screened on the validation split (``--stage dcl-screen``): each one setting away from
#: :data:`DCL_SCREEN_BASE`, in the order they run; ``dcl top tau+ 0.021`` is one setting from ``dcl tau+ 0.021``
DCL_VARIANTS = {
    "dcl top": {"same_class": "top"},
    "dcl top tau+ 0.021": {"same_class": "top", "tau_plus": 0.021},
    "dcl biased clamp": {"clamp": "biased"},
    "dcl tau+ 0.021": {"tau_plus": 0.021},
    "dcl tau+ 0.01": {"tau_plus": 0.01},
    "dcl temperature 0.1": {"temperature": 0.1},
    "dcl temperature 0.5": {"temperature": 0.5},
    "dcl tau+ auto": {"tau_plus": "auto"},
    "dcl default": {},
}
#: the ``dcl`` settings through the screen's bar, swept at every batch size and seed against ``clip`` on the
#: test split (``--stage dcl-sweep``): one passed (``dcl tau+ 0.01``); the next best trailed ``clip`` by 11 points
DCL_SWEEP_VARIANTS = ("dcl tau+ 0.01",)
DCL_SWEEP_SIZES = (16, 32, 64, 128, 256)


def archived_runs(data_config: Optional[dict] = None) -> List[dict]:
    """The validation-split runs of the gate, screen and sweep (:data:`ARCHIVE`), each marked with its split;
    none when ``data_config`` (the testbed's, test split aside) is not the data they trained on."""
    if not ARCHIVE.is_file():
        return []
    doc = json.loads(ARCHIVE.read_text())
    if data_config is not None and {k: v for k, v in data_config.items() if k != "test_samples"} != doc["data"]:
        return []
    return [{**r, "split": "validation", "source": "archived"} for r in doc["runs"]]


def data_dir(work: Path, seed: int = DATA_SEED) -> Path:
    """The folder of draw ``seed`` of the testbed's data under ``work`` (draw 0 in ``data``, as it always was)."""
    return work / ("data" if seed == DATA_SEED else f"data-seed{seed}")


def other_draws(work: Path, budget: ex.Budget) -> Dict[int, List[dict]]:
    """The finished runs of every draw of the data under ``work`` but draw 0, by the draw's seed."""
    out = {}
    for summary in sorted(work.glob("data-seed*/summary.json")):
        data = json.loads(summary.read_text())
        runs = finished_runs(work, data, budget)
        if runs:
            out[data["config"]["seed"]] = runs
    return out


def draw_rows(draws: Dict[int, List[dict]], sizes: Sequence[int] = DECISIVE_SIZES) -> List[dict]:
    """The decisive comparisons (reach and beat, test split, :data:`RULE`) on each other draw of the data."""
    return [{**r, "data_seed": seed} for seed, records in sorted(draws.items()) for b in sizes
            for r in judged(records, "decl default", b) if r["n"]]


def final_scale(label: str, b: int) -> Optional[float]:
    """The mean final logit scale of ``label`` at batch ``b`` over the validation sweep's seeds."""
    ends = [r["logit_scale"][-1] for r in archived_runs() if r["label"] == label and r["batch_size"] == b
            and r["logit_scale"]]
    return round(sum(ends) / len(ends), 1) if ends else None


def control_objectives() -> Dict[str, tuple]:
    """The temperature controls at each decisive batch size: InfoNCE (``dcl`` at ``tau_plus`` 0, which is
    InfoNCE exactly) at ``decl default``'s final scale, and ``decl default`` at ``clip``'s, both fixed."""
    out = {}
    for b in DECISIVE_SIZES:
        decl_s, clip_s = final_scale("decl default", b), final_scale("clip", b)
        if decl_s:  # without --dcl-same-class, which a prior of 0 leaves unused: the flags the arm first ran with
            flags = loss_flags("dcl", tau_plus=0.0, temperature=round(1 / decl_s, 5))
            at = flags.index("--dcl-same-class") if "--dcl-same-class" in flags else None
            out[f"clip at decl's scale (B={b})"] = flags if at is None else flags[:at] + flags[at + 2:]
        if clip_s:
            out[f"decl at clip's scale (B={b})"] = loss_flags("decl", temperature_mode="fixed",
                                                              temperature=round(1 / clip_s, 5))
    return out


def screen_objectives() -> List[str]:
    """The objectives of the gate, screen and sweep (every one but the temperature controls and the ``dcl``
    screen, which came later)."""
    later = {**control_objectives(), **DCL_VARIANTS, DCL_DEFAULT: (), **SCREEN16_VARIANTS}
    return [name for name in objectives() if name not in later]


def objectives() -> Dict[str, tuple]:
    out = dict(BASELINES)
    out["dcl tau+ 0.05"] = loss_flags("dcl", **{**DCL_SCREEN_BASE, "tau_plus": 0.05})
    out.update({name: loss_flags("decl", **settings) for name, settings in DECL_VARIANTS.items()})
    out.update(control_objectives())
    out.update({name: loss_flags("dcl", **{**DCL_SCREEN_BASE, **settings}) for name, settings in DCL_VARIANTS.items()})
    out[DCL_DEFAULT] = ("--loss", "dcl")
    out.update({name: loss_flags("decl", **settings) for name, settings in SCREEN16_VARIANTS.items()})
    return out


# ------------------------------------------------------------------------------------------
# Runs
# ------------------------------------------------------------------------------------------
def scale_curve(out_log: Path) -> List[float]:
    """The logit scale OpenCLIP logged last in each epoch."""
    last: Dict[int, float] = {}
    for line in out_log.read_text(errors="replace").splitlines():
        m = re.search(r"Train Epoch: (\d+) .*Logit Scale: (\S+)", line)
        if m:
            last[int(m.group(1))] = float(m.group(2))
    return [last[e] for e in sorted(last)]


def late_clamp_rate(out_log: Path, epochs: int) -> Optional[float]:
    """Mean of the logged ``Clamp_rate`` over the last fifth of training (``dcl``: the rows at the floor)."""
    values = [float(m.group(2)) for m in (re.search(r"Train Epoch: (\d+) .*Clamp_rate: (\S+)", line)
                                         for line in out_log.read_text(errors="replace").splitlines())
              if m and int(m.group(1)) >= epochs - max(1, epochs // 5)]
    return sum(values) / len(values) if values else None


def evaluate(checkpoint: Path, data: dict) -> Dict[str, Dict[str, float]]:
    """Retrieval and zero-shot scores of a checkpoint on each split the data has: ``{"validation": ...,
    "test": ...}`` (:func:`clip_dcl.experiment.scoring.evaluate` without the few-shot probe, on the CPU)."""
    from clip_dcl.experiment.scoring import evaluate as score

    splits = ["validation", "test"] if "test_data" in data else ["validation"]
    return {split: with_mean_r1(score(checkpoint, data, split=split, fewshot=False, device="cpu")) for split in splits}


def code_commit() -> str:
    """The commit the code of this run is at (with ``+changes`` when the tree differs from it)."""
    import subprocess

    def git(*a):
        return subprocess.run(["git", *a], cwd=HERE, capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short=10", "HEAD") or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def shared_budget(budget: dict) -> dict:
    """A budget's settings that every run of a report shares (its batch size and seed aside)."""
    return {k: v for k, v in budget.items() if k not in ("batch_size", "seed")}


def finished_runs(work: Path, data: dict, budget: ex.Budget) -> List[dict]:
    """Every cached run under ``work`` trained on ``data`` with ``budget`` (any batch size and seed),
    labelled by the objective whose flags it has."""
    by_flags = {tuple(flags): name for name, flags in objectives().items()}
    want = shared_budget(json.loads(json.dumps(dataclasses.asdict(budget))))
    out = []
    for path in sorted((work / "scores").glob("*.json")):
        doc = json.loads(path.read_text())
        settings = doc.get("settings", {})
        got = shared_budget(settings.get("budget", {}))
        label = by_flags.get(tuple(settings.get("flags", ())))
        if got == want and settings.get("data") == json.loads(json.dumps(data["config"])) and label:
            out.append({**doc["record"], "label": label, "source": "reused"})
    return out


def finished_training(run: ex.Run, data: dict, logs: Path, budget: ex.Budget) -> Optional[ex.TrainResult]:
    """A training of ``run`` that finished under ``logs`` but was not scored (the call stopped after it)."""
    log_dir = logs / run.slug
    ckpt, out_log = log_dir / "checkpoints" / f"epoch_{budget.epochs}.pt", log_dir / "out.log"
    if not (ckpt.is_file() and (log_dir / "stdout.txt").is_file() and out_log.is_file()):
        return None
    stamps = re.findall(r"^(\d{4}-\d\d-\d\d,\d\d:\d\d:\d\d)", out_log.read_text(), flags=re.M)
    fmt = "%Y-%m-%d,%H:%M:%S"
    seconds = ((datetime.strptime(stamps[-1], fmt) - datetime.strptime(stamps[0], fmt)).total_seconds()
               if stamps else float("nan"))
    return ex.TrainResult(run, ckpt, log_dir, seconds, ex.train_command(run, data, logs, budget, device="cpu"),
                          ex.read_curves(out_log), ex.read_val(log_dir / "checkpoints" / "results.jsonl"))


def cache_entry(flags: Sequence[str], data: dict, budget: ex.Budget, work: Path) -> tuple:
    """The settings a run is cached by (flags, budget, data), their digest and the run's score file."""
    key = json.loads(json.dumps({"flags": list(flags), "budget": dataclasses.asdict(budget),
                                 "data": data["config"]}))
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return key, digest, work / "scores" / f"{digest}-b{budget.batch_size}-seed{budget.seed}.json"


def restore_cache(reports: Sequence[Path], work: Path, data: dict, budget: ex.Budget) -> int:
    """Write the score cache of every run in the report JSONs ``reports`` that trained on ``data`` with
    ``budget`` (batch size and seed aside), so that a fresh machine resumes the stages from the committed
    reports instead of retraining their runs (training is deterministic on CPU: the report's
    "Reproduction" line checks it). Runs already cached are left alone; returns how many were written."""
    want = shared_budget(json.loads(json.dumps(dataclasses.asdict(budget))))
    written = 0
    for path in reports:
        doc = json.loads(Path(path).read_text())
        got = shared_budget(doc.get("budget", {}))
        if doc.get("data") != json.loads(json.dumps(data["config"])) or got != want:
            print(f"[batch_size] {path}: other data or budget than this call's; nothing restored from it")
            continue
        for r in doc["runs"]:
            run_budget = dataclasses.replace(budget, batch_size=r["batch_size"], seed=r["seed"])
            key, _, cache = cache_entry(r["flags"], data, run_budget, work)
            if cache.is_file():
                continue
            record = {k: v for k, v in r.items() if k not in ("source", "split")}
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps({"settings": key, "record": record}, indent=1) + "\n")
            written += 1
    return written


def run_one(label: str, flags: tuple, data: dict, budget: ex.Budget, work: Path, threads: int) -> dict:
    """Train and evaluate one run, or reuse its cache; the record of the report."""
    key, digest, cache = cache_entry(flags, data, budget, work)
    if cache.is_file():
        doc = json.loads(cache.read_text())
        if doc.get("settings") == key:
            return {**doc["record"], "label": label, "source": "reused"}
    logs = work / "runs" / digest
    run = ex.Run(f"b{budget.batch_size}-seed{budget.seed}", flags)
    res = finished_training(run, data, logs, budget)
    if res is None:
        env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        res = ex.train(run, data, logs, budget, env=env, lock=False, device="cpu", echo=lambda s: None)
    t0 = time.perf_counter()
    scores = evaluate(res.checkpoint, data)
    metrics = scores["validation"]
    val = [with_mean_r1({f"retrieval/{k}": v for k, v in r.items() if isinstance(v, (int, float))})
           for r in res.val]
    record = {"label": label, "flags": list(flags), "batch_size": budget.batch_size, "seed": budget.seed,
              "epochs": budget.epochs, "metrics": metrics, "test_metrics": scores.get("test"),
              "commit": code_commit(), "val_r1": [v[MEAN_R1] for v in val],
              "logit_scale": scale_curve(res.log_dir / "out.log"),
              "clamp_rate": late_clamp_rate(res.log_dir / "out.log", budget.epochs), "train_seconds": res.seconds,
              "eval_seconds": time.perf_counter() - t0, "command": res.command,
              "finished": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")}
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"settings": key, "record": record}, indent=1) + "\n")
    return {**record, "source": "trained"}


# ------------------------------------------------------------------------------------------
# Statistics and the report
# ------------------------------------------------------------------------------------------
def plateau(curve: Sequence[float]) -> Optional[float]:
    """Change of the validation R@1 over the last fifth of training (points; small = a plateau)."""
    if len(curve) < 5:
        return None
    tail = curve[-max(2, len(curve) // 5):]
    return 100 * (tail[-1] - tail[0])


def gate(records: List[dict], sizes: Sequence[int]) -> Optional[dict]:
    """``clip``'s R@1 at the largest batch minus the smallest, and whether the seeds' ranges overlap."""
    by_b = {b: [r["metrics"][MEAN_R1] for r in records if r["label"] == "clip" and r["batch_size"] == b]
            for b in (min(sizes), max(sizes))}
    lo, hi = by_b[min(sizes)], by_b[max(sizes)]
    if not lo or not hi:
        return None
    gain = sum(hi) / len(hi) - sum(lo) / len(lo)
    separate = min(hi) > max(lo)
    return {"small": min(sizes), "large": max(sizes), "gain": gain, "separate": separate,
            "seeds": (len(lo), len(hi)), "passed": gain >= GATE_POINTS and separate and min(len(lo), len(hi)) >= 3}


def planned_runs(stages: Sequence[str], sizes: Sequence[int] = BATCH_SIZES, seeds: Sequence[int] = (0, 1, 2),
                 screen_sizes: Sequence[int] = SCREEN_BATCH_SIZES, screen_seed: int = 0,
                 screen_variants: Optional[Sequence[str]] = None,
                 sweep_variants: Sequence[str] = SWEEP_VARIANTS, decisive_sizes: Sequence[int] = DECISIVE_SIZES,
                 decisive_seeds: Sequence[int] = tuple(range(SEED_CAP)),
                 dcl_sweep_variants: Sequence[str] = DCL_SWEEP_VARIANTS,
                 screen16_best: Optional[str] = None) -> List[tuple]:
    """The (objective, batch, seed) runs the stages plan, in order, each once: the gate (``clip`` at
    every batch size and seed), the screen (``screen_variants``, default every objective, at
    ``screen_sizes`` with one seed) and the sweep (``clip``, ``dcl`` at 0.05 and ``sweep_variants``
    at every seed and batch size, the largest for ``clip`` only), the decisive stage (:func:`decisive_runs`;
    the driver skips those whose batch sizes are decided), ``--loss dcl`` at its package defaults beside
    ``clip`` (:data:`DCL_DEFAULT_SIZE`, ``seeds``), the temperature controls (``seeds``), the ``dcl`` sweep
    (``dcl_sweep_variants`` and ``clip`` at every batch size, the largest first, and seed) and the B = 16
    screen's best on the test split (``screen16_best`` at 16 beside ``clip`` at 16 and 32, ``seeds``)."""
    runs = []
    if "gate" in stages:
        runs += [("clip", b, s) for s in seeds for b in sizes]
    if "screen" in stages:
        runs += [(label, b, screen_seed) for label in (screen_variants or screen_objectives()) for b in screen_sizes]
    if "sweep" in stages:
        runs += [(label, b, s) for label in ["clip", "dcl tau+ 0.05", *sweep_variants] for s in seeds
                 for b in sizes if label == "clip" or b != max(sizes)]
    if "decisive" in stages:
        runs += decisive_runs(decisive_sizes, decisive_seeds)
    if "dcl-screen" in stages:  # clip last: a decisive call beside this one may have trained it by then
        chosen = [v for v in DCL_VARIANTS if not screen_variants or v in screen_variants]
        runs += [(label, b, screen_seed) for b in sorted(screen_sizes, reverse=True) for label in chosen]
        runs += [("clip", b, screen_seed) for b in sorted(screen_sizes, reverse=True)]
    if "screen16" in stages:  # the package default beside its variants, same seed
        runs += [(label, SCREEN16_SIZE, screen_seed) for label in ("decl default", "clip", *SCREEN16_VARIANTS)]
    if "screen16-test" in stages and screen16_best:  # the driver refuses the stage without one
        runs += [(label, b, s) for s in seeds
                 for label, b in ((screen16_best, SCREEN16_SIZE), ("clip", SCREEN16_SIZE), ("clip", 2 * SCREEN16_SIZE))]
    if "dcl-default" in stages:
        runs += [(label, DCL_DEFAULT_SIZE, s) for s in seeds for label in (DCL_DEFAULT, "clip")]
    if "controls" in stages:
        runs += [(label, b, s) for s in seeds for b in decisive_sizes
                 for label in (f"clip at decl's scale (B={b})", f"decl at clip's scale (B={b})")]
    if "dcl-sweep" in stages:
        runs += [(label, b, s) for b in sorted(sizes, reverse=True) for s in seeds
                 for label in (*dcl_sweep_variants, "clip")]
    return list(dict.fromkeys(runs))


# ------------------------------------------------------------------------------------------
# Verdicts (the rule in RULE)
# ------------------------------------------------------------------------------------------
def t_interval(diffs: Sequence[float], confidence: float = CONFIDENCE) -> Dict[str, float]:
    """Mean of paired differences and its two-sided ``confidence`` t-interval over seeds (scipy's t;
    nan bounds below two seeds)."""
    from scipy import stats

    st = mean_std(diffs)
    half = (float(stats.t.ppf((1 + confidence) / 2, st["n"] - 1)) * st["std"] / st["n"] ** 0.5
            if st["n"] > 1 else float("nan"))
    return {"mean": st["mean"], "lo": st["mean"] - half, "hi": st["mean"] + half, "n": st["n"]}


def per_seed(records: List[dict], key: str = "test_metrics") -> Dict[tuple, float]:
    """``{(label, batch, seed): mean R@1}`` of the records that have ``key`` (a split's metrics)."""
    return {(r["label"], r["batch_size"], r["seed"]): r[key][MEAN_R1] for r in records if r.get(key)}


def comparison(records: List[dict], label: str, b: int, other: int, key: str = "test_metrics",
               reference: str = "clip") -> dict:
    """``label`` at ``b`` minus ``reference`` at ``other``, paired by seed: the seeds, the per-seed
    differences, their interval, and ``clip``'s own gain from ``b`` to ``2 b`` on the same seeds."""
    idx = per_seed(records, key)
    seeds = sorted(s for (lab, bb, s) in idx if lab == label and bb == b and (reference, other, s) in idx
                   and (reference, b, s) in idx and (reference, 2 * b, s) in idx)
    diffs = [idx[(label, b, s)] - idx[(reference, other, s)] for s in seeds]
    gains = [idx[(reference, 2 * b, s)] - idx[(reference, b, s)] for s in seeds]
    return {"label": label, "batch_size": b, "against": f"{reference} at {other}", "seeds": seeds, "diffs": diffs,
            "gain": mean_std(gains)["mean"], **t_interval(diffs)}


def reach_verdict(c: dict) -> str:
    """"reaches", "does not reach" or "no verdict": the interval of decl@B - clip@2B against minus half of
    ``clip``'s gain from B to 2B (no verdict below :data:`MIN_SEEDS` seeds)."""
    if c["n"] < MIN_SEEDS:
        return "no verdict"
    margin = -c["gain"] / 2
    return "reaches" if c["lo"] > margin else "does not reach" if c["hi"] < margin else "no verdict"


def beat_verdict(c: dict) -> str:
    """"beats" or "trails" (the interval on one side of zero), "tie" (that, with a mean inside
    :data:`RESOLUTION`) or "no verdict" (an interval across zero) for decl@B - clip@B."""
    if c["n"] < MIN_SEEDS or c["lo"] <= 0 <= c["hi"]:
        return "no verdict"
    if abs(c["mean"]) < RESOLUTION:
        return "tie"
    return "beats" if c["lo"] > 0 else "trails"


def judged(records: List[dict], label: str, b: int, split: str = "test") -> List[dict]:
    """The rule's two comparisons of ``label`` at ``b`` on ``split``: reach (against ``clip`` at ``2 b``) and
    beat (against ``clip`` at ``b``), each with its ``kind``, ``split`` and verdict."""
    key = "test_metrics" if split == "test" else "metrics"
    rows = []
    for kind, other, judge in (("reach", 2 * b, reach_verdict), ("beat", b, beat_verdict)):
        c = comparison(records, label, b, other, key=key)
        rows.append({**c, "kind": kind, "split": split, "verdict": judge(c)})
    return rows


def verdicts(records: List[dict], archived: Sequence[dict] = (), label: str = "decl default") -> List[dict]:
    """Per batch size of :data:`VERDICT_SIZES`, the reach and beat comparisons of ``label`` on the test
    split (the verdicts), then on the validation split of the archived sweep (``archived``, where the
    defaults were chosen: context, never a verdict); each row with its ``split``."""
    rows = []
    for b in VERDICT_SIZES:
        old = judged(list(archived), label, b, split="validation") if archived else []
        for i, row in enumerate(judged(records, label, b)):
            rows += [row] + ([old[i]] if old and old[i]["n"] else [])
    return rows


def decided(records: List[dict], b: int) -> bool:
    """Whether the reach verdict at ``b`` is given on the test split, or the seed cap is reached."""
    c = comparison(records, "decl default", b, 2 * b)
    return reach_verdict(c) != "no verdict" or c["n"] >= SEED_CAP


def decisive_runs(sizes: Sequence[int] = DECISIVE_SIZES, seeds: Sequence[int] = tuple(range(SEED_CAP))) -> List[tuple]:
    """The decisive stage's runs, seed after seed: at each ``b``, ``decl default`` and ``clip`` at ``b``,
    ``clip`` at ``2 b``; each once (``clip`` at 64 serves B = 32 and 64)."""
    runs = [(label, bb, s) for s in seeds for b in sizes
            for label, bb in (("clip", b), ("decl default", b), ("clip", 2 * b))]
    return list(dict.fromkeys(runs))


def screen16_choice(records: List[dict], seed: int = 0) -> dict:
    """The B = 16 screen on the validation split: the score of ``decl default`` and of each of
    :data:`SCREEN16_VARIANTS` at ``seed``, those not run yet, and the best (None until every one has run;
    ``decl default`` when no variant scores above it)."""
    val = per_seed(records, "metrics")
    names = ("decl default", *SCREEN16_VARIANTS)
    scores = {n: val[(n, SCREEN16_SIZE, seed)] for n in names if (n, SCREEN16_SIZE, seed) in val}
    missing = [n for n in names if n not in scores]
    return {"seed": seed, "scores": scores, "missing": missing,
            "best": None if missing else max(scores, key=scores.get)}


def screen16_rows(records: List[dict], best: Optional[str]) -> List[dict]:
    """The screen's best variant at B = 16 against ``clip`` at 32 (reach) and at 16 (beat), test split,
    :data:`RULE`; none when the best is the package default (its verdicts are the decisive table's)."""
    if not best or best == "decl default":
        return []
    return judged(records, best, SCREEN16_SIZE)


def known_runs(cached: List[dict], records: List[dict]) -> List[dict]:
    """The cache's finished runs with this call's in their place (one record per objective, batch and seed)."""
    mine = {(r["label"], r["batch_size"], r["seed"]) for r in records}
    return [r for r in cached if (r["label"], r["batch_size"], r["seed"]) not in mine] + list(records)


def needed(job: tuple, records: List[dict], sizes: Sequence[int] = DECISIVE_SIZES) -> bool:
    """Whether a decisive run still serves an undecided batch size (``clip`` at 64 serves 32 and 64)."""
    label, b, _ = job
    users = [x for x in sizes if (label == "decl default" and b == x) or (label == "clip" and b in (x, 2 * x))]
    return any(not decided(records, x) for x in users)


def clearance(r: dict) -> Optional[float]:
    """How far a comparison's interval lies past its threshold (fraction; positive: the side its verdict names,
    negative: short of either side by that much), or None below two seeds."""
    if r["n"] < 2:
        return None
    threshold = -r["gain"] / 2 if r["kind"] == "reach" else 0.0
    return max(r["lo"] - threshold, threshold - r["hi"])


def verdict_table(rows: List[dict], who: str = "decl default") -> str:
    """Markdown: one row per batch size and comparison of ``who``, with the split, seeds, interval, how far the
    interval clears its threshold (:func:`clearance`) and the verdict."""
    lines = [f"| B | {who} against | split | seeds | per-seed differences (points) | mean | "
             f"{100 * CONFIDENCE:.0f} % interval | threshold | interval clears it by (points) | verdict |",
             "|---:|---|---|---:|---|---:|---|---:|---:|---|"]
    for r in rows:
        if not r["n"]:
            lines.append(f"| {r['batch_size']} | {r['against']} | - | 0 | - | - | - | - | - | not run |")
            continue
        threshold = -r["gain"] / 2 if r["kind"] == "reach" else 0.0
        interval = "-" if r["n"] < 2 else f"[{100 * r['lo']:+.1f}, {100 * r['hi']:+.1f}]"
        clear = clearance(r)
        clear = "-" if clear is None else f"{100 * clear:+.2f}"
        verdict = f"**{r['verdict']}**" if r["split"] == "test" else f"none (the rule would read: {r['verdict']})"
        lines.append(f"| {r['batch_size']} | {r['against']} | {r['split']} | {r['n']} | "
                     + ", ".join(f"s{s} {100 * d:+.1f}" for s, d in zip(r["seeds"], r["diffs"]))
                     + f" | {100 * r['mean']:+.1f} | {interval} | {100 * threshold:+.1f} | {clear} | {verdict} |")
    return "\n".join(lines)


def progress(records: List[dict], sizes: Sequence[int], screen_sizes: Sequence[int] = SCREEN_BATCH_SIZES,
             screen_seed: int = 0, seeds: int = 3) -> str:
    """Where the three stages stand, from the finished runs: the gate's verdict, the screen's runs
    (every objective but ``clip`` at ``screen_sizes``, one seed) and the sweep's objectives (runs of
    the other objectives beyond the screen; complete for those with ``seeds`` seeds at every batch
    size below the largest)."""
    g = gate(records, sizes)
    done = {(r["label"], r["batch_size"], r["seed"]) for r in records}
    screen = [(lab, b, screen_seed) for lab in screen_objectives() if lab != "clip" for b in screen_sizes]
    swept = [lab for lab in screen_objectives() if lab != "clip"
             and all(len({s for (l2, b2, s) in done if l2 == lab and b2 == b}) >= seeds for b in sorted(sizes)[:-1])]
    missing = sorted({lab for lab, b, s in screen if (lab, b, s) not in done})
    beyond = [j for j in done if j[0] != "clip" and (j[2] != screen_seed or j[1] not in screen_sizes)]
    return (f"gate {'passed' if g and g['passed'] else 'not yet measured'} (clip at every batch size, {seeds} seeds); "
            f"screen {sum(j in done for j in screen)} of {len(screen)} runs"
            + (f" (not yet: {', '.join(missing)})" if missing else "")
            + f"; sweep: {len(beyond)} runs beyond the screen" + (f", complete for {', '.join(swept)}" if swept else ""))


def fixed_scale(record: dict) -> Optional[str]:
    """``"s (fixed)"`` for a run whose loss fixed its temperature (the model's own scale then stays unused)."""
    flags = list(record.get("flags", ()))
    for flag in ("--dcl-temperature", "--decl-temperature"):
        if flag in flags and (flag == "--dcl-temperature" or "fixed" in flags):
            return f"{1 / float(flags[flags.index(flag) + 1]):.1f} (fixed)"
    return None


def table(records: List[dict], key: str = "metrics") -> str:
    """One row per (objective, batch): mean ± std over seeds of each headline score on one split (``key``:
    ``metrics``, the validation split, or ``test_metrics``), the final logit scale, the plateau check, seeds."""
    groups: Dict[tuple, List[dict]] = {}
    for r in records:
        if r.get(key):
            groups.setdefault((r["label"], r["batch_size"]), []).append(r)
    head = "| objective | batch | " + " | ".join(lab for _, lab in HEADLINE) + \
           " | logit scale at the end | val R@1 change over the last fifth (points) | seeds |"
    lines = [head, "|" + "---|" * (len(HEADLINE) + 5)]
    for (label, b), rs in sorted(groups.items(), key=lambda kv: (list(objectives()).index(kv[0][0])
                                                                   if kv[0][0] in objectives() else 99, kv[0][1])):
        cells = [format_mean_std(mean_std([r[key].get(metric) for r in rs])) for metric, _ in HEADLINE]
        scales = ", ".join(fixed_scale(r) or f"{r['logit_scale'][-1]:.1f}" for r in rs if r["logit_scale"])
        plateaus = ", ".join(f"{p:+.1f}" for p in (plateau(r["val_r1"]) for r in rs) if p is not None) or "n/a"
        lines.append(f"| {label} | {b} | " + " | ".join(cells) + f" | {scales} | {plateaus} | "
                     + ", ".join(str(r["seed"]) for r in rs) + " |")
    return "\n".join(lines)


def paired(records: List[dict], reference: str, same_b: bool = True, prefix: str = "") -> str:
    """Per objective (those whose name starts with ``prefix``) and batch: R@1 minus ``reference``
    at the same batch (or at twice the batch), paired by seed."""
    idx = {(r["label"], r["batch_size"], r["seed"]): r["metrics"][MEAN_R1] for r in records}
    rows = []
    for label in objectives():
        if label == reference or not label.startswith(prefix):
            continue
        for b in sorted({r["batch_size"] for r in records if r["label"] == label}):
            other = b if same_b else 2 * b
            diffs = [(s, idx[(label, b, s)] - idx[(reference, other, s)]) for (lab, bb, s) in idx
                     if lab == label and bb == b and (reference, other, s) in idx]
            if not diffs:
                continue
            st = wins([d for _, d in diffs])
            rows.append(f"| {label} | {b} | {reference} at {other} | "
                        + ", ".join(f"s{s} {100 * d:+.1f}" for s, d in sorted(diffs))
                        + f" | **{100 * st['mean']:+.1f}** | {st['wins']} of {st['n']} |")
    if not rows:
        return ""
    return "\n".join(["| objective | batch | against | R@1 difference per seed (points) | mean | wins |",
                      "|---|---|---|---|---|---|", *rows])


def plot(records: List[dict], path: Path) -> Optional[Path]:
    if not records:
        return None
    fig, axes = pyplot().subplots(1, 3, figsize=(17, 4.6))
    labels = [lab for lab in objectives() if any(r["label"] == lab for r in records)]
    colour = {lab: f"C{i % 10}" for i, lab in enumerate(labels)}  # one colour per objective in every panel
    # colour: the objective; line style: the batch size, one style per size of the grid (6)
    dashes = ("-", "--", ":", "-.", (0, (6, 1, 1, 1, 1, 1)), (0, (1, 3)))
    styles = {b: dashes[i % len(dashes)] for i, b in enumerate(sorted({r["batch_size"] for r in records}))}
    for label in labels:
        rs = [r for r in records if r["label"] == label]
        bs = sorted({r["batch_size"] for r in rs})
        stats = [mean_std([r["metrics"][MEAN_R1] for r in rs if r["batch_size"] == b]) for b in bs]
        axes[0].errorbar(bs, [100 * s["mean"] for s in stats],
                         yerr=[100 * (s["std"] if s["n"] > 1 else 0.0) for s in stats], marker="o", capsize=3,
                         label=label, color=colour[label])
    axes[0].set(xscale="log", xlabel="batch size", ylabel="%", title="held-out retrieval mean R@1")
    axes[0].set_xscale("log", base=2)
    # the curves: by batch size when one objective is drawn (the gate), else by objective; a legend
    # entry per objective and batch size, the seeds sharing it
    by_batch = {b: f"C{i % 10}" for i, b in enumerate(sorted({r["batch_size"] for r in records}))}
    named = set()
    for r in sorted(records, key=lambda r: (r["label"], r["batch_size"], r["seed"])):
        if r["label"] == "clip" or r["batch_size"] == min(x["batch_size"] for x in records):
            key = (r["label"], r["batch_size"])
            style = dict(lw=1, color=by_batch[r["batch_size"]] if len(labels) == 1 else colour[r["label"]],
                         ls=styles[r["batch_size"]], label=None if key in named else f"{r['label']} B={r['batch_size']}")
            named.add(key)
            axes[1].plot(range(1, len(r["val_r1"]) + 1), [100 * v for v in r["val_r1"]], **style)
            axes[2].plot(range(1, len(r["logit_scale"]) + 1), r["logit_scale"], **style)
    axes[1].set(xlabel="epoch", ylabel="%", title="validation mean R@1 per epoch (plateau)")
    axes[2].set(xlabel="epoch", ylabel="logit scale", title="logit scale per epoch (clamp at 100)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    return ex.save_figure(fig, path, "Batch-size testbed (clip-dcl-micro, 48 classes, 32 px)")


def decisive_status(rows: List[dict]) -> str:
    """Where the verdicts stand: per batch size, the reach verdict with its split and seeds."""
    return "; ".join(f"B = {r['batch_size']}: {r['verdict']} ({r['n']} test-split seeds"
                     + (f", the cap of {SEED_CAP} reached" if r["n"] >= SEED_CAP else "")
                     + ")" for r in rows if r["kind"] == "reach" and r["split"] == "test")


def code_checks_line(commits: Sequence[str], folder: Path = HERE / "results") -> str:
    """What the code checks (``code_check.py``, ``results/code_check*.json``) say of the commits the runs came
    from: for each check, whether short runs of the earlier commit and a later one train to the same bits."""
    said = []
    for path in sorted(folder.glob("code_check*.json")):
        doc = json.loads(path.read_text())
        for check in doc["checks"]:
            old, new = next(iter(check["objectives"].values()))["commits"]
            if any(c[:7] in (old[:7], new[:7]) for c in commits):
                said.append(f"{old} and {new} train {', '.join(f'`{o}`' for o in check['objectives'])} at "
                            f"B = {doc['batch_size']}, seed {doc['seed']}, {doc['epochs']} epochs "
                            + ("to the same bits (data files, the loss at every logged step, validation and test "
                               "scores)" if check["identical"] else "**differently**: rerun the runs of "
                               f"{old}") + f" ([{path.stem}.md]({path.stem}.md))")
    return (" Code checks: " + "; ".join(said) + ".") if said else ""


def controls_table(records: List[dict]) -> str:
    """Markdown: each temperature control against ``clip`` and ``decl default`` at its batch (test split,
    paired by seed)."""
    idx = per_seed(records)
    lines = []
    for label in control_objectives():
        b = int(re.search(r"B=(\d+)", label).group(1))
        for ref, other in (("clip", b), ("decl default", b), ("clip", 2 * b)):
            seeds = sorted(s for (lab, bb, s) in idx if lab == label and bb == b and (ref, other, s) in idx)
            if not seeds:
                continue
            st = t_interval([idx[(label, b, s)] - idx[(ref, other, s)] for s in seeds])
            interval = "-" if st["n"] < 2 else f"[{100 * st['lo']:+.1f}, {100 * st['hi']:+.1f}]"
            lines.append(f"| {label} | {ref} at {other} | {st['n']} | "
                         + ", ".join(f"s{s} {100 * (idx[(label, b, s)] - idx[(ref, other, s)]):+.1f}" for s in seeds)
                         + f" | {100 * st['mean']:+.1f} | {interval} | {beat_verdict(st)} |")
    if not lines:
        return ""
    return "\n".join([f"| control | against | seeds | per-seed differences (points) | mean | "
                      f"{100 * CONFIDENCE:.0f} % interval | verdict (the rule's beats / trails / tie) |",
                      "|---|---|---:|---|---:|---|---|", *lines])


def dcl_default_rows(records: List[dict]) -> List[dict]:
    """``--loss dcl`` at its package defaults minus ``clip`` at :data:`DCL_DEFAULT_SIZE`, paired by seed, on the
    test split (the check) and the validation split (context): each with its seeds, per-seed differences,
    interval and the rule's reading: **trails** when the interval lies below zero, **within the seeds' noise**
    when it holds zero, **above** when it lies above zero (below :data:`MIN_SEEDS` seeds: no verdict)."""
    rows = []
    for split, key in (("test", "test_metrics"), ("validation", "metrics")):
        idx = per_seed(records, key)
        seeds = sorted(s for (lab, b, s) in idx if lab == DCL_DEFAULT and b == DCL_DEFAULT_SIZE
                       and ("clip", b, s) in idx)
        diffs = [idx[(DCL_DEFAULT, DCL_DEFAULT_SIZE, s)] - idx[("clip", DCL_DEFAULT_SIZE, s)] for s in seeds]
        st = t_interval(diffs)
        rows.append({"split": split, "batch_size": DCL_DEFAULT_SIZE, "seeds": seeds, "diffs": diffs, **st,
                     "verdict": noise_reading(st)})
    return rows


def noise_reading(st: dict) -> str:
    """The ``dcl`` rule's reading of a paired interval against ``clip``: **trails** when it lies below zero,
    **above** when it lies above, **within the seeds' noise** when it holds zero; below :data:`MIN_SEEDS`
    seeds, no verdict."""
    if st["n"] < MIN_SEEDS:
        return "no verdict"
    return "trails" if st["hi"] < 0 else "above" if st["lo"] > 0 else "within the seeds' noise"


def dcl_default_table(rows: List[dict]) -> str:
    """Markdown: :func:`dcl_default_rows`, one line per split that has runs."""
    lines = [f"| `{DCL_DEFAULT}` - `clip` at B = {r['batch_size']} | {r['split']} | {r['n']} | "
             + ", ".join(f"s{s} {100 * d:+.1f}" for s, d in zip(r["seeds"], r["diffs"]))
             + f" | {100 * r['mean']:+.1f} | "
             + ("-" if r["n"] < 2 else f"[{100 * r['lo']:+.1f}, {100 * r['hi']:+.1f}]") + f" | {r['verdict']} |"
             for r in rows if r["n"]]
    if not lines:
        return ""
    return "\n".join([f"| comparison | split | seeds | per-seed differences (points) | mean | "
                      f"{100 * CONFIDENCE:.0f} % interval | reading |", "|---|---|---:|---|---:|---|---|", *lines])


def write_dcl_screen(out: Path, records: List[dict], planned: int, data: dict, budget: ex.Budget, command: str,
                     started: datetime, stem: str) -> None:
    """The ``dcl`` screen's report: validation-split scores of every setting and its difference from ``clip``
    at the same batch and seed (the split the defaults are chosen on)."""
    out.mkdir(parents=True, exist_ok=True)
    status = "complete" if len(records) == planned else f"PARTIAL: {len(records)} of {planned} planned runs"
    finished = sorted(r.get("finished", "") for r in records)
    idx = per_seed(records, "metrics")
    # the screen's bar: clip's lowest validation score over the sweep's seeds at that batch (the seeds' noise)
    floor = {}
    for r in archived_runs(data["config"]):
        if r["label"] == "clip":
            floor[r["batch_size"]] = min(floor.get(r["batch_size"], 1.0), r["metrics"][MEAN_R1])
    rows, passing, gaps = [], [], []
    for label in DCL_VARIANTS:
        for b in sorted({r["batch_size"] for r in records if r["label"] == label}):
            for seed in sorted(s for (lab, bb, s) in idx if lab == label and bb == b):
                clip = idx.get(("clip", b, seed))
                rec = next(r for r in records if (r["label"], r["batch_size"], r["seed"]) == (label, b, seed))
                clamp = rec.get("clamp_rate")
                bar = floor.get(b)
                ok = bar is not None and idx[(label, b, seed)] >= bar
                if bar is not None:
                    gaps.append(idx[(label, b, seed)] - bar)
                if ok:
                    passing.append(f"{label} at B = {b}")
                rows.append(f"| {label} | {b} | {seed} | {100 * idx[(label, b, seed)]:.1f} | "
                            + ("-" if clip is None else f"{100 * (idx[(label, b, seed)] - clip):+.1f}")
                            + f" | {'-' if bar is None else f'{100 * bar:.1f}'} | {'yes' if ok else 'no'}"
                            + f" | {'-' if clamp is None else f'{clamp:.2f}'} |")
    parts = ["# The `dcl` screen on the testbed (validation split)", "",
             *ex.about_lines(status=status, command=command,
                             date=f"runs finished {finished[0] if finished else '-'} to "
                                  f"{finished[-1] if finished else '-'}; report written by a call started "
                                  f"{started:%Y-%m-%d %H:%M}."),
             f"- Code: commit(s) {', '.join(sorted({r.get('commit', 'unrecorded') for r in records}))}.",
             f"- Data and training: as [`batch_size.md`](batch_size.md) ({budget.epochs} epochs, `{budget.model}`); "
             "**every score here is on the validation split**, the split defaults are chosen on.",
             "- Settings (each one away from the package default, `dcl top tau+ 0.021` one away from "
             "`dcl tau+ 0.021`; every flag written out):",
             *[f"  - `{name}`: `{' '.join(objectives()[name])}`" for name in DCL_VARIANTS
               if any(r["label"] == name for r in records)],
             "- **The screen's bar**: a setting goes on to the sweep when its score is at least `clip`'s lowest over "
             "the validation sweep's seeds at the same batch (within the seeds' noise, or above). The bar was written "
             "after the runs had started" + (f"; the closest setting ends {100 * -max(gaps):.1f} points below it"
                                            if gaps and max(gaps) < 0 else "") + ". The default follows the sweep's "
             "rule (docs/results.md); with no setting through, `dcl`'s default is `tau_plus` 0, InfoNCE exactly.",
             f"- **Through the screen**: {', '.join(passing) if passing else 'none'}.",
             "", "| setting | B | seed | retrieval mean R@1 | minus `clip` (same B and seed) | bar: `clip`'s lowest seed "
             "| through | clamp rate, last fifth of training |", "|---|---:|---:|---:|---:|---:|---|---:|", *rows,
             "", "## Scores (validation split)", "", table(records)]
    (out / f"{stem}.md").write_text("\n".join(parts) + "\n")
    doc = {"machine": ex.machine_info(), "command": command, "status": status, "split": "validation", "passing": passing,
           "bars": {str(b): v for b, v in floor.items()},
           "budget": dataclasses.asdict(budget), "data": data["config"], "objectives": objectives(), "runs": records}
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")


#: the rule that picks ``dcl``'s defaults from the sweep (stated in the issue that asked for the sweep, before it ran)
DCL_RULE = (
    f"A `dcl` setting can be the default when at no batch size of the sweep it trails `clip` by more than the "
    f"seeds' noise: at every batch size ({', '.join(map(str, DCL_SWEEP_SIZES))}) the {100 * CONFIDENCE:.0f} % "
    f"t-interval of its retrieval mean R@1 minus `clip`'s (test split, paired by seed, {MIN_SEEDS} seeds at least) "
    "holds zero or lies above it. Among the settings that pass, the default is the one with the best zero-shot "
    "top-1 on the sampling-bias data (4 and 10 classes). If none passes, `dcl`'s default stays `tau_plus` 0 "
    "(InfoNCE exactly) and the README and `--help` say so.")
#: the sampling-bias reports of the ``dcl`` sweep (``benchmarks/sampling_bias.py --stem ...``), by class count
DCL_BIAS_REPORTS = {4: "sampling_bias_dcl_4classes.json", 10: "sampling_bias_dcl_10classes.json"}


def dcl_sweep_rows(records: List[dict], labels: Sequence[str] = DCL_SWEEP_VARIANTS) -> List[dict]:
    """Per ``dcl`` setting and batch size: minus ``clip`` at the same batch, paired by seed, on the test split
    (retrieval mean R@1: the rule's; zero-shot top-1 beside it) with its reading (:func:`noise_reading`), the
    validation split's mean difference (context) and the mean clamp rate over the last fifth of training."""
    rows = []
    for label in labels:
        for b in sorted({r["batch_size"] for r in records if r["label"] == label}):
            row = {"label": label, "batch_size": b}
            for split, key in (("test", "test_metrics"), ("validation", "metrics")):
                idx = {(r["label"], r["seed"]): r for r in records if r["batch_size"] == b and r.get(key)}
                seeds = sorted(s for (lab, s) in idx if lab == label and ("clip", s) in idx)
                for metric, name in ((MEAN_R1, "r1"), ("zeroshot/top1", "zeroshot")):
                    both = [s for s in seeds if metric in idx[(label, s)][key] and metric in idx[("clip", s)][key]]
                    diffs = [idx[(label, s)][key][metric] - idx[("clip", s)][key][metric] for s in both]
                    row[f"{split}_{name}"] = {"seeds": both, "diffs": diffs, **t_interval(diffs)}
            row["reading"] = noise_reading(row["test_r1"])
            clamps = [r["clamp_rate"] for r in records if r["label"] == label and r["batch_size"] == b
                      and r.get("clamp_rate") is not None]
            row["clamp_rate"] = sum(clamps) / len(clamps) if clamps else None
            rows.append(row)
    return rows


def dcl_bias_rows(folder: Path = HERE / "results") -> List[dict]:
    """:func:`bias_rows` of the sampling-bias reports of :data:`DCL_BIAS_REPORTS` found in ``folder``."""
    return bias_rows([folder / name for _, name in sorted(DCL_BIAS_REPORTS.items())])


def bias_rows(paths: Sequence[Path]) -> List[dict]:
    """Per sampling-bias report of ``paths`` that exists and per objective but ``clip``: its zero-shot top-1
    minus ``clip``'s, paired by seed (the held-out split), with the data's class count and true prior."""
    rows = []
    for path in paths:
        if not path.is_file():
            continue
        doc = json.loads(path.read_text())
        clip = {r["seed"]: r["metrics"]["zeroshot/top1"] for r in doc["runs"].get("clip", [])}
        for label, runs in doc["runs"].items():
            if label == "clip":
                continue
            pairs = [(r["seed"], r["metrics"]["zeroshot/top1"] - clip[r["seed"]]) for r in runs if r["seed"] in clip]
            rows.append({"classes": doc["data"]["config"]["num_classes"], "true_tau_plus": doc["true_tau_plus"],
                         "label": label, "report": path.name, "complete": doc.get("complete", False),
                         "seeds": [s for s, _ in pairs], "diffs": [d for _, d in pairs],
                         **t_interval([d for _, d in pairs])})
    return rows


def bias_label(label: str) -> str:
    """The sampling-bias report's name of a sweep setting (``dcl tau+ 0.01`` -> ``dcl tau+=0.01``)."""
    tau = DCL_VARIANTS.get(label, {}).get("tau_plus")
    return f"dcl tau+={tau:g}" if isinstance(tau, float) else label


def dcl_sweep_decision(rows: List[dict], bias: List[dict], labels: Sequence[str] = DCL_SWEEP_VARIANTS) -> dict:
    """:data:`DCL_RULE` applied: per setting ``passes`` (a reading at every sweep size, none **trails**),
    ``trails_at`` and ``missing`` (sizes without the rule's seeds); ``default``: the passing setting with the
    best mean zero-shot difference over the sampling-bias reports (None when none passes); ``waiting``: a
    setting still lacks a reading and trails nowhere yet."""
    out = {}
    for label in labels:
        mine = {r["batch_size"]: r for r in rows if r["label"] == label}
        missing = [b for b in DCL_SWEEP_SIZES if b not in mine or mine[b]["reading"] == "no verdict"]
        trails = [b for b in DCL_SWEEP_SIZES if b in mine and mine[b]["reading"] == "trails"]
        zs = [r["mean"] for r in bias if r["label"] == bias_label(label) and r["n"]]
        out[label] = {"passes": not missing and not trails, "trails_at": trails, "missing": missing,
                      "bias_zeroshot": sum(zs) / len(zs) if zs else None}
    passing = [lab for lab, d in out.items() if d["passes"]]
    best = max(passing, key=lambda lab: out[lab]["bias_zeroshot"] if out[lab]["bias_zeroshot"] is not None
               else float("-inf"), default=None)
    return {"settings": out, "default": best,
            "waiting": any(d["missing"] and not d["trails_at"] for d in out.values())}


def _seeds(n: int) -> str:
    return f"{n} seed{'' if n == 1 else 's'}"


def write_dcl_sweep(out: Path, records: List[dict], planned: int, data: dict, budget: ex.Budget, command: str,
                    started: datetime, stem: str, labels: Sequence[str] = DCL_SWEEP_VARIANTS,
                    gathered: Optional[int] = None) -> None:
    """The ``dcl`` sweep's report: per setting and batch size its paired difference from ``clip`` on the test
    split with the rule's reading (:data:`DCL_RULE`), the sampling-bias data's zero-shot differences, and the
    default the rule picks (``gathered``: the number of cached runs a report-only call read, for the status)."""
    out.mkdir(parents=True, exist_ok=True)
    status = ("complete" if len(records) == planned else f"PARTIAL: {len(records)} of {planned} planned runs"
              ) if gathered is None else f"{gathered} finished runs gathered from the cache (stage dcl-sweep)"
    finished = sorted(r.get("finished", "") for r in records)
    rows = dcl_sweep_rows(records, labels)
    commits = sorted({r.get("commit", "unrecorded") for r in records})
    bias = dcl_bias_rows(out)
    decision = dcl_sweep_decision(rows, bias, labels)
    said = []
    for label, d in decision["settings"].items():
        why = ("passes" if d["passes"] else
               f"fails: trails `clip` at B = {', '.join(map(str, d['trails_at']))}" if d["trails_at"] else
               f"no reading yet at B = {', '.join(map(str, d['missing']))}")
        if d["trails_at"] and d["missing"]:
            why += f" (no reading yet at B = {', '.join(map(str, d['missing']))})"
        said.append(f"`{label}` {why}")
    verdict = ("; ".join(said) + ". "
               + (f"The rule's default: `{decision['default']}`." if decision["default"] else
                  "No setting passes yet." if decision["waiting"] else
                  "No setting passes: `dcl`'s default stays `tau_plus` 0 (InfoNCE exactly)."))
    table_rows = [[f"`{r['label']}`", r["batch_size"], r["test_r1"]["n"],
                   ", ".join(f"s{s} {100 * d:+.1f}" for s, d in zip(r["test_r1"]["seeds"], r["test_r1"]["diffs"])),
                   _interval(r["test_r1"]), f"**{r['reading']}**", _interval(r["test_zeroshot"]),
                   "-" if not r["validation_r1"]["n"] else f"{100 * r['validation_r1']['mean']:+.1f}",
                   "-" if r["clamp_rate"] is None else f"{r['clamp_rate']:.2f}"] for r in rows]
    bias_rows = [[f"`{r['label']}`", r["classes"], f"{r['true_tau_plus']:.3g}", r["n"],
                  ", ".join(f"s{s} {100 * d:+.1f}" for s, d in zip(r["seeds"], r["diffs"])), _interval(r)]
                 for r in bias]
    parts = ["# The `dcl` sweep on the testbed (test split)", "",
             *ex.about_lines(status=status, command=command,
                             date=f"runs finished {finished[0] if finished else '-'} to "
                                  f"{finished[-1] if finished else '-'}; report written by a call started "
                                  f"{started:%Y-%m-%d %H:%M}."),
             f"- Code: commit(s) {', '.join(commits)} (each run's own in the JSON)." + code_checks_line(commits),
             f"- Data and training: as [`batch_size.md`](batch_size.md) ({budget.epochs} epochs, `{budget.model}`, "
             f"true prior {float(data['tau_plus']):.3f}). **The rule reads the test split**; the settings swept are "
             "those through the screen on the validation split ([`dcl_screen.md`](dcl_screen.md)).",
             "- Settings (every flag written out):",
             *[f"  - `{name}`: `{' '.join(objectives()[name])}`" for name in labels],
             f"- **The rule**: {DCL_RULE}",
             f"- **Verdict**: {verdict}",
             "", f"## Against `clip` at the same batch (test split, points, paired by seed; {100 * CONFIDENCE:.0f} % "
             "t-interval)", "",
             ex.markdown_table(["setting", "B", "seeds", "per-seed R@1 differences", "mean R@1 [interval]", "reading",
                                "zero-shot top-1 [interval]", "validation R@1 (context)",
                                "clamp rate, last fifth of training"], table_rows, "lrrllllrr"),
             "", "## Zero-shot on the sampling-bias data (held-out split, points, minus `clip`, paired by seed)", "",
             ("Each report: `benchmarks/sampling_bias.py --stem sampling_bias_dcl_<C>classes` (2 epochs at B = 128; "
              "its own JSON has every run's flags). The oracle drops same-class negatives using the true labels.\n\n"
              + ex.markdown_table(["objective", "classes", "true prior", "seeds", "per-seed differences",
                                   "mean [interval]"], bias_rows, "lrrrll")) if bias_rows else
             "Not run yet (`benchmarks/sampling_bias.py --stem sampling_bias_dcl_4classes`, and with `--num-classes 10`).",
             "", "## Scores on the test split (%, mean ± sample std over seeds)", "", table(records, "test_metrics"),
             "", "## Scores on the validation split (context)", "", table(records)]
    (out / f"{stem}.md").write_text("\n".join(parts) + "\n")
    doc = {"machine": ex.machine_info(), "command": command, "status": status, "split": "test",
           "confidence": CONFIDENCE, "rule": DCL_RULE, "sizes": list(DCL_SWEEP_SIZES), "rows": rows,
           "sampling_bias": bias, "decision": decision, "budget": dataclasses.asdict(budget),
           "data": data["config"], "objectives": {n: objectives()[n] for n in labels}, "runs": records}
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")


def dcl_sweep_block(doc: dict) -> str:
    """docs/results.md's ``dcl`` sweep, from ``dcl_sweep.json``: per setting its paired difference from ``clip``
    at each batch size (test split) with the rule's reading, the sampling-bias zero-shot differences and the
    default the rule picks."""
    conf = f"{100 * doc['confidence']:.0f} %"
    lines = [f"Retrieval mean R@1 minus `clip`'s at the same batch, test split, points, mean [{conf} interval] "
             "(seeds, reading):", ""]
    for label, d in doc["decision"]["settings"].items():
        cells = [f"B = {r['batch_size']}: {_interval(r['test_r1'])} ({_seeds(r['test_r1']['n'])}, {r['reading']})"
                 for r in doc["rows"] if r["label"] == label]
        lines.append(f"- `{label}`: " + ("; ".join(cells) or "no runs yet") + ".")
        zs = [f"{r['classes']} classes (true prior {r['true_tau_plus']:.3g}): {_interval(r)} ({_seeds(r['n'])})"
              for r in doc["sampling_bias"] if r["label"] == bias_label(label)]
        if zs:
            lines.append(f"  Zero-shot top-1 minus `clip`'s on the sampling-bias data: {'; '.join(zs)}.")
    swept = {bias_label(label) for label in doc["decision"]["settings"]}
    others = [f"`{r['label']}` {_interval(r)} on {r['classes']} classes" for r in doc["sampling_bias"]
              if r["label"] not in swept and "oracle" not in r["label"] and r["n"]]
    if others:
        lines.append("- Other priors on the same sampling-bias data, zero-shot top-1 minus `clip`'s (context: not "
                     f"in this sweep): {'; '.join(others)}.")
    oracle = [f"{r['classes']} classes {_interval(r)}" for r in doc["sampling_bias"] if "oracle" in r["label"]]
    if oracle:
        lines.append(f"- The oracle (same-class negatives dropped by the true labels) minus `clip`, zero-shot: "
                     f"{'; '.join(oracle)}.")
    default = doc["decision"]["default"]
    lines += ["", "By the rule: " + (f"`{default}` passes and becomes the default." if default else
                                      "no setting has passed yet (the sweep is not complete)." if doc["decision"]["waiting"] else
                                      "no setting passes at every batch size; `dcl`'s default stays `tau_plus` 0."),
              "", f"Status of the report: {doc['status']}"]
    return "\n".join(lines)


def write(out: Path, records: List[dict], planned: int, data: dict, budget: ex.Budget, command: str,
          started: datetime, stages: Sequence[str], sizes: Sequence[int], stem: str = STEM,
          draws: Optional[Dict[int, List[dict]]] = None) -> None:
    """The report of this call's runs: the splits, the rule, the verdicts (test split; B = 16 from the archived
    validation sweep), the verdicts on other draws of the data (``draws``: their finished runs by data seed), the
    temperature controls and both splits' scores; ``{stem}.json`` holds the numbers the docs quote
    (:func:`readme_block`)."""
    if list(stages) == ["dcl-screen"]:
        return write_dcl_screen(out, records, planned, data, budget, command, started, stem)
    if list(stages) == ["dcl-sweep"]:
        return write_dcl_sweep(out, records, planned, data, budget, command, started, stem)
    out.mkdir(parents=True, exist_ok=True)
    rows = verdicts(records, archived_runs(data["config"]))
    if list(stages) == ["report of finished runs"]:
        status = f"{len(records)} finished runs gathered from the cache (each run's command and commit in the JSON)"
    else:
        status = (("complete" if len(records) == planned else f"PARTIAL: {len(records)} of {planned} planned runs")
                  + f" (stages: {', '.join(stages)}; finished runs are reused by later calls)")
    status += "; verdicts: " + decisive_status(rows)
    finished = sorted(r.get("finished", "") for r in records)
    train_min = sum(r["train_seconds"] for r in records) / 60
    cfg = data["config"]
    commits = sorted({r.get("commit", "unrecorded") for r in records})
    splits = {"train": cfg["train_samples"], "validation": cfg["val_samples"], "test": cfg.get("test_samples", 0),
              "captions_per_image": cfg["val_captions_per_image"], "zeroshot_per_class": cfg["zeroshot_per_class"]}
    parts = [
        "# Batch size on the testbed: DeCL at B against InfoNCE at B and 2B",
        "",
        *ex.about_lines(
            status=status, command=command,
            date=f"runs finished {finished[0] if finished else '-'} to {finished[-1] if finished else '-'}; this "
            f"report written by a call started {started:%Y-%m-%d %H:%M}. Training time over the runs: "
            f"{train_min:.0f} min."),
        f"- Code: the runs ran at commit(s) {', '.join(commits)} (each run's own in the JSON)."
        + code_checks_line(commits),
        f"- Data: `clip-dcl data synth --image-size {cfg['image_size']} --num-classes {cfg['num_classes']} "
        f"--train-samples {cfg['train_samples']} --test-samples {cfg.get('test_samples', 0)}` "
        f"(tau_plus {float(data['tau_plus']):.3f}).",
        f"- **Splits**: {splits['train']:,} training images; the **validation** split, {splits['validation']:,} "
        f"images x {splits['captions_per_image']} captions and {splits['zeroshot_per_class']} zero-shot images per "
        "class, read by every choice (the defaults, the variants, the screen, the per-epoch curves); the **test** "
        f"split, {splits['test']:,} other images x {splits['captions_per_image']} captions and another "
        f"{splits['zeroshot_per_class']} per class, read only for the verdicts below. The three come from "
        "disjoint seed streams of the data writer.",
        f"- Training: `{budget.model}`, {budget.epochs} epochs at every batch size, lr {budget.lr}, wd {budget.wd}, "
        f"warm-up {budget.warmup} steps, fp32 CPU, `python -m clip_dcl.train`, validation every epoch.",
        f"- **Tuning budget**: `decl default` was chosen among {len(DECL_VARIANTS)} DeCL settings on the validation "
        "split (the screen of the archived sweep); `clip` got no tuning (OpenCLIP's defaults); the temperature "
        "controls below are the one tuning either arm got on the other's behalf.",
        "- Objectives (every flag written out from the loss registry, so a cached run keeps its meaning):",
        *[f"  - `{name}`: `{' '.join(flags)}`" for name, flags in objectives().items()
          if any(r["label"] == name for r in records)],
        f"- Raw numbers, commands and curves: `{stem}.json`; figure `{stem}.png`. The gate, screen and sweep of "
        "the validation split (before the test split existed): "
        f"[`{ARCHIVE.stem}.md`]({ARCHIVE.stem}.md).",
        "",
        "## The decision rule (fixed before the decisive runs)",
        "",
        RULE,
        "",
        "## Verdicts: `decl default` against `clip` (retrieval mean R@1)",
        "",
        "Each verdict is on the test split. Beside it, for context, the same comparison on the validation "
        "split of the earlier sweep: `decl`'s default was chosen on those images, so those rows are no verdict.",
        "",
        "How to read a verdict reached by a small clearance: the decisive stage adds seeds one at a time and stops at "
        f"the first verdict, and an interval read after every seed covers the true difference less often than its "
        f"nominal {100 * CONFIDENCE:.0f} %. A clearance of a few hundredths of a point means one more seed could have "
        "taken the verdict away; such a verdict needs the second draw of the data, or more seeds, before it carries "
        "a claim.",
        "",
        verdict_table(rows),
    ]
    archived = {(r["label"], r["batch_size"], r["seed"]): r["metrics"][MEAN_R1] for r in archived_runs(cfg)}
    again = [(r["metrics"][MEAN_R1], archived[key]) for r in records
             if (key := (r["label"], r["batch_size"], r["seed"])) in archived]
    if again:
        same = sum(abs(a - b) < 5e-5 for a, b in again)
        parts += ["", f"Reproduction: {same} of {len(again)} runs trained again here score on the validation split "
                  "what the validation sweep's run of the same objective, batch and seed scored (to 0.01 point): "
                  "training is deterministic on this CPU, so the sweep's models are these models."]
    again_rows = draw_rows(draws or {})
    parts += ["", "## The decisive comparison on another draw of the data (test split)", ""]
    if again_rows:
        parts += [f"The same recipe with `clip-dcl data synth --seed {', '.join(map(str, sorted(draws)))}`: other "
                  "training, validation and test images, the same rule. A verdict that holds on one draw only is "
                  "reported as such.", "", verdict_table(again_rows)]
    else:
        parts += ["Not run yet (`--data-seed 1`: the same recipe, other images)."]
    controls = controls_table(records)
    if controls:
        parts += ["", "## Temperature controls (test split, paired by seed)", "",
                  "`clip at decl's scale`: InfoNCE with the logit scale fixed at the final scale of `decl default` "
                  "in the validation sweep; `decl at clip's scale`: `decl default` with its scale fixed at `clip`'s. "
                  "Each changes only the temperature of one arm.", "", controls]
    idx_val = per_seed(records, "metrics")
    s16 = [f"| {name} | {seed} | {100 * v:.1f} | {100 * (v - idx_val[('decl default', b, seed)]):+.1f} |"
           for (name, b, seed), v in sorted(idx_val.items())
           if name in SCREEN16_VARIANTS and ("decl default", b, seed) in idx_val]
    choice = screen16_choice(records)
    rows16 = screen16_rows(records, choice["best"])
    if s16:
        parts += ["", f"## DeCL at B = {SCREEN16_SIZE}: the screen (validation split)", "",
                  "Each variant changes one setting of the package default; the best goes on to the test split.", "",
                  "| variant | seed | retrieval mean R@1 | minus `decl default` |", "|---|---:|---:|---:|", *s16, ""]
        if any("decl schedule constant |" in row for row in s16):
            parts += ["`decl schedule constant` runs at `--decl-lambda 1` (the default), which is the `decl` schedule "
                      "exactly: loss1 on every step, so under the default temperature mode (`infonce`) no step trains "
                      "the logit scale and it keeps its initial value (the two runs score alike; the loss warns of "
                      "this combination since). `decl schedule constant 0.5` mixes the two terms evenly.", ""]
        if choice["missing"]:
            parts.append("The screen is not complete (not yet run: " + ", ".join(f"`{n}`" for n in choice["missing"])
                         + "), so no variant is chosen.")
        elif not rows16:
            parts.append("No variant scores above the package default on the validation split: none goes on, and "
                         f"B = {SCREEN16_SIZE}'s verdicts are the package default's, above.")
        else:
            best = choice["best"]
            parts += [f"The best on the validation split, `{best}`, on the test split by the same rule "
                      f"(`--stage screen16-test`; the seeds its runs have):", "", verdict_table(rows16, who=best)]
    dcl_rows = dcl_default_rows(records)
    dcl_table = dcl_default_table(dcl_rows)
    if dcl_table:
        parts += ["", "## `--loss dcl` with no other loss flag, against `clip` (paired by seed)", "",
                  f"`{DCL_DEFAULT}` runs `python -m clip_dcl.train --loss dcl` with no other loss flag, so the "
                  "package defaults of the commit in its record. **Trails** when the interval lies below zero, "
                  "**within the seeds' noise** when it holds zero, **above** when it lies above zero; the test "
                  "split is the check, the validation split context.", "", dcl_table]
    earlier = [r for r in records if r["label"] in screen_objectives()]
    g = gate(earlier, sizes)
    same, double = paired(earlier, "clip"), paired(earlier, "clip", same_b=False)
    variants = paired(earlier, "decl absolute", prefix="decl ")
    if any(x for x in (g, variants)) or any(r["label"] not in ("clip", "decl default") for r in earlier):
        parts += ["", "## The gate, screen and sweep stages of these runs (validation split: where choices are made)", "",
                  f"- Where they stand: {progress(earlier, sizes)}."]
        if g:
            parts.append(f"- Gate: clip at {g['large']} minus clip at {g['small']}: {100 * g['gain']:+.1f} points of mean "
                         f"R@1, seeds {'separate' if g['separate'] else 'overlapping'}: "
                         f"**{'passed' if g['passed'] else 'not passed'}**.")
        for title, body in (("Against clip at the same batch", same), ("Against clip at twice the batch", double),
                            ("DeCL variants against the screen's base, the absolute estimate", variants)):
            if body:
                parts += ["", f"### {title} (paired by seed)", "", body]
    if any(r.get("test_metrics") for r in records):
        parts += ["", "## Scores on the test split (%, mean ± sample std over seeds)", "",
                  table(records, key="test_metrics")]
    parts += ["", "## Scores on the validation split (%, mean ± sample std over seeds)", "", table(records)]
    png = plot(records, out / f"{stem}.png")
    if png is not None:
        parts += ["", f"![R@1 against the batch size, validation curves and logit scale]({png.name})"]
    (out / f"{stem}.md").write_text("\n".join(parts) + "\n")
    doc = {"machine": ex.machine_info(), "command": command, "status": status, "budget": dataclasses.asdict(budget),
           "data": cfg, "splits": splits, "rule": RULE, "confidence": CONFIDENCE, "resolution": RESOLUTION,
           "seed_cap": SEED_CAP, "verdicts": rows, "draws": again_rows, "dcl_default": dcl_rows,
           "screen16": {**choice, "verdicts": rows16}, "objectives": objectives(), "runs": records}
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")


# ------------------------------------------------------------------------------------------
# The docs' answer, generated from the report's JSON (docs/results.md and the README)
# ------------------------------------------------------------------------------------------
#: how the docs phrase each reach verdict
_REACH = {"reaches": "reaches", "does not reach": "does not reach", "no verdict": "no verdict on reaching"}


def control_leads(records: List[dict]) -> Dict[int, Dict[str, dict]]:
    """Per decisive batch size with a temperature control run: ``decl``'s lead over ``clip`` (on the seeds a
    control ran), over InfoNCE at ``decl``'s scale, InfoNCE at ``decl``'s scale over ``clip``, and ``decl`` at
    ``clip``'s scale over ``clip``; each paired by seed on the test split over the seeds both of its arms have
    (:func:`t_interval` plus the per-seed ``diffs``, the ``seeds`` and the :func:`beat_verdict`)."""
    idx = per_seed(records)
    out = {}
    for b in DECISIVE_SIZES:
        arms = {"clip": ("clip", b), "decl": ("decl default", b), "clip at decl scale": (f"clip at decl's scale (B={b})", b),
                "decl at clip scale": (f"decl at clip's scale (B={b})", b)}
        controlled = {s for (lab, bb, s) in idx if (lab, bb) in (arms["clip at decl scale"], arms["decl at clip scale"])}
        comparisons = {}
        for name, (x, y) in {"decl - clip": ("decl", "clip"), "decl - clip at decl scale": ("decl", "clip at decl scale"),
                             "clip at decl scale - clip": ("clip at decl scale", "clip"),
                             "decl at clip scale - clip": ("decl at clip scale", "clip")}.items():
            seeds = sorted(s for s in controlled if (*arms[x], s) in idx and (*arms[y], s) in idx)
            if seeds:
                diffs = [idx[(*arms[x], s)] - idx[(*arms[y], s)] for s in seeds]
                st = t_interval(diffs)
                comparisons[name] = {**st, "diffs": diffs, "seeds": seeds, "verdict": beat_verdict(st)}
        if any(name != "decl - clip" for name in comparisons):
            out[b] = comparisons
    return out


def readme_block(doc: dict) -> str:
    """docs/results.md's verdicts, from a report's JSON (``doc``): per batch size the test split's verdict with
    its seeds, mean paired difference and interval, the validation split's comparison beside it (where the
    default was chosen: context only), then the temperature controls (the generated block
    ``batch-size verdicts``, :mod:`clip_dcl.experiment.quotes`)."""
    def cell(r):
        seeds = ", ".join(f"{100 * d:+.1f}" for d in r["diffs"])
        interval = f" [{100 * r['lo']:+.1f}, {100 * r['hi']:+.1f}]" if r["n"] >= 2 else ""
        return f"{100 * r['mean']:+.1f}{interval} (per seed {seeds})"

    conf = f"{100 * doc['confidence']:.0f} %"
    lines = [f"Paired differences of retrieval mean R@1 in points, mean [{conf} interval]:", ""]
    rows: Dict[tuple, dict] = {(r["batch_size"], r["kind"], r["split"]): r for r in doc["verdicts"]}
    for b in sorted({r["batch_size"] for r in doc["verdicts"]}):
        reach, beat = rows[(b, "reach", "test")], rows[(b, "beat", "test")]
        if reach["n"]:
            line = (f"- **B = {b}: `decl` {_REACH[reach['verdict']]} `clip` at {2 * b}** (test split, "
                    f"{reach['n']} seeds{'' if reach['n'] >= MIN_SEEDS else f'; {MIN_SEEDS} at least for a verdict'}): "
                    f"decl@{b} - clip@{2 * b} = {cell(reach)}, threshold {0.0 - 100 * reach['gain'] / 2:+.1f} (half of "
                    f"`clip`'s gain from {b} to {2 * b}){_cleared(reach)}; against `clip` at {b}: {cell(beat)}, "
                    f"{beat['verdict']}.")
        else:
            line = f"- **B = {b}: no test-split runs yet.**"
        old = rows.get((b, "reach", "validation"))
        if old:
            old_beat = rows[(b, "beat", "validation")]
            line += (f" On the validation split, where the default was chosen ({old['n']} seeds; context, no "
                     f"verdict): {cell(old)} against `clip` at {2 * b}, {cell(old_beat)} against `clip` at {b}.")
        lines.append(line)
    again = [r for r in doc.get("draws", []) if r["kind"] == "reach"]
    for r in again:
        lines.append(f"- **Another draw of the data** (`--seed {r['data_seed']}`, B = {r['batch_size']}, test split, "
                     f"{r['n']} seeds): decl@{r['batch_size']} - clip@{2 * r['batch_size']} = {cell(r)}, "
                     f"{r['verdict']}.")
    if not again:
        lines.append("- Another draw of the data (same recipe, other images): not run yet; every verdict above "
                     "holds on one draw.")
    lead = control_leads(doc["runs"])
    said = {"decl - clip": "`decl`'s lead over `clip`", "clip at decl scale - clip": "InfoNCE trained at `decl`'s "
            "final scale, fixed, over `clip`", "decl - clip at decl scale": "`decl`'s lead over that InfoNCE",
            "decl at clip scale - clip": "`decl` trained at `clip`'s final scale, fixed, over `clip`"}
    for b, c in sorted(lead.items()):
        parts = [f"{what}: {cell(c[name])}, {c[name]['verdict']} (seeds {', '.join(map(str, c[name]['seeds']))})"
                 for name, what in said.items() if name in c]
        lines.append(f"- **Temperature controls at B = {b}** (test split, paired by seed; verdicts by the rule's beats / "
                     f"trails / tie): " + "; ".join(parts) + ".")
    s16 = doc.get("screen16") or {}
    if s16.get("scores"):
        base = s16["scores"].get("decl default")
        said16 = [f"`{n}` {100 * v:.1f}" + (f" ({100 * (v - base):+.1f})" if base is not None and n != "decl default" else "")
                  for n, v in s16["scores"].items()]
        line = (f"- **The B = {SCREEN16_SIZE} screen** (validation split, seed {s16['seed']}, retrieval mean R@1 and the "
                "difference from `decl default`): " + ", ".join(said16))
        if s16.get("missing"):
            line += "; not yet run: " + ", ".join(f"`{n}`" for n in s16["missing"]) + "."
        elif s16.get("best") == "decl default":
            line += "; no variant scores above the package default, so none goes on to the test split."
        else:
            tested = {r["kind"]: r for r in s16.get("verdicts", []) if r["n"]}
            line += f"; the best, `{s16['best']}`, on the test split: " + (
                "; ".join(f"{s16['best'].split(' ', 1)[0]}@{SCREEN16_SIZE} - clip@{r['against'].split(' at ')[1]} = "
                          f"{cell(r)}, {r['verdict']}" for r in tested.values()) if tested else "not run yet") + "."
        lines.append(line)
    if not lead:
        lines.append("- Temperature controls (InfoNCE at `decl`'s scale, `decl` at `clip`'s): not run yet.")
    lines += ["", f"Status of the report: {doc['status']}"]
    return "\n".join(lines)


def dcl_readme_block(doc: dict) -> str:
    """docs/results.md's ``dcl`` screen, from ``dcl_screen.json``: each setting's validation R@1 minus ``clip``'s at
    the same batch and seed, and what passed the screen's bar."""
    idx = {(r["label"], r["batch_size"], r["seed"]): r["metrics"][MEAN_R1] for r in doc["runs"]}
    cells = [f"`{lab}` {100 * (v - idx[('clip', b, seed)]):+.1f} at B = {b}"
             for (lab, b, seed), v in idx.items() if lab != "clip" and ("clip", b, seed) in idx]
    seeds = sorted({seed for (lab, b, seed) in idx})
    return (f"Validation split, seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}, retrieval mean R@1 "
            "minus `clip`'s at the same batch and seed, in points: " + "; ".join(cells) + ". Through the screen: "
            + (", ".join(doc["passing"]) if doc["passing"] else "none") + ".")


def dcl_default_block(doc: dict) -> str:
    """docs/results.md's check of ``--loss dcl`` with no other loss flag against ``clip``, from a report's JSON
    (:func:`dcl_default_rows`): test split first, the validation split beside it."""
    rows = {r["split"]: r for r in doc.get("dcl_default", []) if r["n"]}
    if "test" not in rows:
        return f"`--loss dcl` with no other loss flag: no test-split runs yet at B = {DCL_DEFAULT_SIZE}."
    t = rows["test"]
    text = (f"`python -m clip_dcl.train --loss dcl` with no other loss flag, against `clip` at B = {t['batch_size']}, "
            f"20 epochs, test split, {t['n']} seeds: retrieval mean R@1 {100 * t['mean']:+.2f} points "
            + (f"[{100 * t['lo']:+.2f}, {100 * t['hi']:+.2f}] " if t["n"] >= 2 else "")
            + f"(per seed {', '.join(f'{100 * d:+.2f}' for d in t['diffs'])}): **{t['verdict']}**.")
    v = rows.get("validation")
    if v:
        text += (f" Validation split: {100 * v['mean']:+.2f} (per seed "
                 f"{', '.join(f'{100 * d:+.2f}' for d in v['diffs'])}).")
    return text


def _cleared(r: dict) -> str:
    """``, the interval clearing it by 0.01 point`` for a verdict (:func:`clearance`); nothing without one."""
    c = clearance(r)
    if c is None or r["verdict"] == "no verdict":
        return ""
    return f", the interval clearing it by {100 * c:.2f} point{'' if round(100 * c, 2) == 1 else 's'}"


def _interval(st: dict) -> str:
    """``+m [+lo, +hi]`` in points (the interval only from two values up); ``-`` without values."""
    if not st["n"]:
        return "-"
    return f"{100 * st['mean']:+.1f}" + (f" [{100 * st['lo']:+.1f}, {100 * st['hi']:+.1f}]" if st["n"] >= 2 else "")


def which_loss_block(doc: dict) -> str:
    """The numbers behind the README's "which loss when", from this report's JSON (``doc``) and, beside it in
    the results folder, the ``dcl`` screen's (``dcl_screen.json``) and the sampling-bias benchmark's
    (``sampling_bias.json``): per batch size ``decl``'s paired lead over ``clip`` (test split), the temperature
    control, ``--loss dcl`` at its defaults, the best debiased ``dcl`` setting of the screen and the
    sampling-bias data's zero-shot difference."""
    conf = f"{100 * doc['confidence']:.0f} %"
    lines = [f"Paired differences in points, mean [{conf} interval], with the split and the seeds:", ""]
    reach = {r["batch_size"]: r for r in doc["verdicts"] if r["kind"] == "reach" and r["split"] == "test"}
    cells = [f"B = {b}: {_interval(r)} against a threshold of {0.0 - 100 * r['gain'] / 2:+.1f} ({r['n']} seeds, "
             f"{r['verdict']}{_cleared(r)})" for b, r in sorted(reach.items()) if r["n"]]
    lines.append("- `decl` at B - `clip` at 2B (reaches when the interval lies above minus half of `clip`'s gain from "
                 "B to 2B), retrieval mean R@1, test split: " + ("; ".join(cells) if cells else "no test-split runs yet")
                 + ".")
    again = [r for r in doc.get("draws", []) if r["n"]]
    for r in again:
        other = 2 * r["batch_size"] if r["kind"] == "reach" else r["batch_size"]
        lines.append(f"- The same on another draw of the data (`--seed {r['data_seed']}`: other training, validation and "
                     f"test images), `decl` at {r['batch_size']} - `clip` at {other}, test split: {_interval(r)} "
                     + (f"against a threshold of {0.0 - 100 * r['gain'] / 2:+.1f} " if r["kind"] == "reach" else "")
                     + f"({r['n']} seeds, {r['verdict']}{_cleared(r)}).")
    beat = {r["batch_size"]: r for r in doc["verdicts"] if r["kind"] == "beat" and r["split"] == "test"}
    cells = [f"B = {b}: {_interval(r)} ({r['n']} seeds, {r['verdict']})" for b, r in sorted(beat.items()) if r["n"]]
    lines.append("- `decl` - `clip` at the same batch, retrieval mean R@1, test split: "
                 + ("; ".join(cells) if cells else "no test-split runs yet") + ".")
    for b, c in sorted(control_leads(doc["runs"]).items()):
        for name, what in (("clip at decl scale - clip", "InfoNCE trained at `decl`'s final temperature - `clip`"),
                           ("decl - clip at decl scale", "`decl` - InfoNCE trained at `decl`'s final temperature"),
                           ("decl at clip scale - clip", "`decl` trained at `clip`'s final temperature - `clip`")):
            if name not in c:
                continue
            lines.append(f"- {what}, B = {b}, test split: {_interval(c[name])} ({c[name]['n']} seeds, "
                         f"{c[name]['verdict']}).")
    s16 = doc.get("screen16") or {}
    for r in (r for r in s16.get("verdicts", []) if r["n"]):
        threshold = f" against a threshold of {0.0 - 100 * r['gain'] / 2:+.1f}" if r["kind"] == "reach" else ""
        lines.append(f"- `{r['label']}` (the best of the B = {SCREEN16_SIZE} screen on the validation split) at "
                     f"{r['batch_size']} - `{r['against'].replace(' at ', '` at ')}, retrieval mean R@1, test split: "
                     f"{_interval(r)}{threshold} ({r['n']} seeds, {r['verdict']}{_cleared(r)}).")
    dcl = {r["split"]: r for r in doc.get("dcl_default", []) if r["n"]}
    if "test" in dcl:
        r = dcl["test"]
        lines.append(f"- `--loss dcl` at its defaults - `clip`, B = {r['batch_size']}, retrieval mean R@1, test split: "
                     f"{100 * r['mean']:+.2f}" + (f" [{100 * r['lo']:+.2f}, {100 * r['hi']:+.2f}]" if r["n"] >= 2 else "")
                     + f" ({r['n']} seeds, {r['verdict']}).")
    screen_path = HERE / "results" / "dcl_screen.json"
    if screen_path.is_file():
        screen = json.loads(screen_path.read_text())
        idx = {(r["label"], r["batch_size"], r["seed"]): r["metrics"][MEAN_R1] for r in screen["runs"]}
        diffs = [(v - idx[("clip", b, seed)], lab, b) for (lab, b, seed), v in idx.items()
                 if lab != "clip" and ("clip", b, seed) in idx]
        if diffs:
            best = max(diffs)
            lines.append(f"- The debiased `dcl` screen ({screen['data']['num_classes']} classes, validation split, "
                         f"one seed): its best setting, `{best[1]}`, - `clip` at B = {best[2]}: {100 * best[0]:+.1f}; "
                         f"settings through the screen: {', '.join(screen['passing']) or 'none'}.")
    sweep_path = HERE / "results" / "dcl_sweep.json"
    if sweep_path.is_file():
        sweep = json.loads(sweep_path.read_text())
        for label, d in sweep["decision"]["settings"].items():
            cells = [f"B = {r['batch_size']}: {_interval(r['test_r1'])} ({_seeds(r['test_r1']['n'])}, {r['reading']})"
                     for r in sweep["rows"] if r["label"] == label]
            rule = ("passes" if d["passes"] else f"fails (trails at B = {', '.join(map(str, d['trails_at']))})"
                    if d["trails_at"] else "no reading yet at every batch size")
            lines.append(f"- The `dcl` sweep, `{label}` - `clip` at the same batch, retrieval mean R@1, test split: "
                         + ("; ".join(cells) or "no runs yet") + f"; by the default's rule: {rule}.")
    zero_shot: Dict[tuple, str] = {}  # (objective, classes): its line; the sweep's reports first, then the main one
    for r in (json.loads(sweep_path.read_text())["sampling_bias"] if sweep_path.is_file() else []):
        if r["label"].startswith("dcl tau+=") and r["n"]:
            zero_shot[(r["label"], r["classes"])] = _zero_shot_line(r["label"], r["classes"], r["true_tau_plus"],
                                                                    _interval(r), r["n"])
    for r in bias_rows([HERE / "results" / "sampling_bias.json"]):
        if r["label"].startswith("dcl tau+=") and r["n"] and (r["label"], r["classes"]) not in zero_shot:
            zero_shot[(r["label"], r["classes"])] = _zero_shot_line(r["label"], r["classes"], r["true_tau_plus"],
                                                                    _interval(r), r["n"])
    return "\n".join(lines + [zero_shot[k] for k in sorted(zero_shot, key=lambda k: (k[1], float(k[0].split("=")[1])))])


def _zero_shot_line(name: str, classes: int, true_tau: float, interval: str, n: int) -> str:
    """One which-loss line: a ``dcl tau+=t`` run's zero-shot top-1 minus ``clip``'s on the sampling-bias data."""
    return (f"- `{name.replace('tau+=', '--tau-plus ')}` - `clip`, zero-shot top-1 on the {classes}-class sampling-bias "
            f"data (true prior {true_tau:.3g}), held-out split: {interval} ({_seeds(n)}).")


# ------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = arguments.benchmark_parser("batch_size.py", __doc__)
    p.add_argument("--stage", nargs="+", choices=("gate", "screen", "sweep", "decisive", "controls", "dcl-screen", "dcl-default", "screen16",
                                                       "dcl-sweep", "screen16-test"),
                   default=["decisive"])
    p.add_argument("--decisive-batch-sizes", type=int, nargs="+", default=list(DECISIVE_SIZES))
    p.add_argument("--decisive-seeds", type=int, nargs="+", default=list(range(SEED_CAP)),
                   help="decisive: seeds in the order they are added, until each batch size has its verdict")
    p.add_argument("--data-seed", type=int, default=DATA_SEED,
                   help="draw of the data (same recipe); another draw than 0 writes its own data folder and report "
                        "(<stem>_draw<seed>), and the report of draw 0 reads its verdicts beside its own")
    p.add_argument("--quick", action="store_true", help="smoke run: 256 pairs, 1 epoch; report under --work")
    p.add_argument("--work", default="/tmp/clip_dcl_testbed", help="folder of the data, runs and caches")
    p.add_argument("--results", default=None, help=f"report folder (default {HERE / 'results'})")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=list(BATCH_SIZES))
    p.add_argument("--screen-batch-sizes", type=int, nargs="+", default=list(SCREEN_BATCH_SIZES))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--screen-seed", type=int, default=0)
    p.add_argument("--variants", nargs="+", default=None, help="screen: objectives to run (default: all)")
    p.add_argument("--sweep-variants", nargs="+", default=list(SWEEP_VARIANTS), help="sweep: DeCL variants")
    p.add_argument("--dcl-sweep-variants", nargs="+", default=list(DCL_SWEEP_VARIANTS),
                   help="dcl-sweep: dcl settings (from the screen's)")
    p.add_argument("--jobs", type=int, default=2, help="trainings side by side")
    p.add_argument("--threads", type=int, default=1, help="torch threads per training")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: write the report from every finished run under --work with this budget")
    p.add_argument("--stem", default=STEM)
    p.add_argument("--restore-from", nargs="+", default=[], metavar="REPORT.json",
                   help="first write the score cache of the runs in these reports (e.g. the committed "
                        "results/batch_size.json), so a fresh machine reuses them instead of retraining")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args, argv = arguments.parse(build_parser(), argv)
    names = objectives()
    for name in (args.variants or []) + args.sweep_variants + args.dcl_sweep_variants:
        if name not in names:
            raise SystemExit(f"unknown objective {name!r}; choose from {list(names)}")
    if args.epochs < 1 or args.jobs < 1 or args.threads < 1:
        raise SystemExit("--epochs, --jobs and --threads must be >= 1")
    if args.quick:
        args.batch_sizes, args.screen_batch_sizes, args.seeds = [16, 32], [16], args.seeds[:2]
    work, results = arguments.work_and_results(args, HERE / "results")
    if args.data_seed < 0:
        raise SystemExit(f"--data-seed must be >= 0, got {args.data_seed}")
    if args.data_seed != DATA_SEED and args.stem == STEM:
        args.stem = f"{STEM}_draw{args.data_seed}"
    data = ex.synth_data(data_dir(work, args.data_seed), quick=args.quick, verbose=False, seed=args.data_seed,
                         **(QUICK_DATA if args.quick else DATA))
    if max(args.batch_sizes + args.screen_batch_sizes) > data["train"]["num_samples"]:
        raise SystemExit(f"a batch is larger than the {data['train']['num_samples']} training pairs")
    budget = ex.Budget(epochs=1 if args.quick else args.epochs, lr=1e-3, wd=0.1, warmup=50, model=MODEL,
                       log_every_n_steps=50, workers=1)
    if args.restore_from:
        print(f"[batch_size] restored {restore_cache(args.restore_from, work, data, budget)} runs' scores "
              f"from {', '.join(map(str, args.restore_from))}", flush=True)
    best16 = None
    if "screen16-test" in args.stage and not args.report_only:  # chosen on the validation split only
        choice = screen16_choice(finished_runs(work, data, budget), args.screen_seed)
        if choice["missing"]:
            raise SystemExit("--stage screen16-test: the B = 16 screen is not complete (not yet run: "
                             + ", ".join(choice["missing"]) + "); run --stage screen16 first")
        if choice["best"] == "decl default":
            raise SystemExit("--stage screen16-test: no variant of the B = 16 screen scores above the package "
                             "default on the validation split; none goes on to the test split")
        best16 = choice["best"]
        print(f"[batch_size] the B = 16 screen's best on the validation split: {best16}", flush=True)
    jobs = [(label, names[label], b, s) for label, b, s in planned_runs(
        args.stage, args.batch_sizes, args.seeds, args.screen_batch_sizes, args.screen_seed,
        args.variants, args.sweep_variants, args.decisive_batch_sizes, args.decisive_seeds,
        args.dcl_sweep_variants, best16)]
    command = ex.command_line("batch_size.py", argv)
    started = datetime.now(timezone.utc)
    if args.report_only:  # the dcl screen's runs in its own report (--stage dcl-screen), the rest in this one
        records = finished_runs(work, data, budget)
        if "dcl-sweep" in args.stage:  # the sweep's settings at its batch sizes, and clip where they have a seed
            mine = [r for r in records if r["label"] in args.dcl_sweep_variants and r["batch_size"] in args.batch_sizes]
            have = {(r["batch_size"], r["seed"]) for r in mine}
            records = mine + [r for r in records if r["label"] == "clip" and (r["batch_size"], r["seed"]) in have]
            write_dcl_sweep(results, records, len(records), data, budget, command, started, args.stem,
                            args.dcl_sweep_variants, gathered=len(records))
            print(f"[batch_size] {len(records)} finished runs -> {results / (args.stem + '.md')}")
            return 0
        screen = "dcl-screen" in args.stage
        if screen:
            records = [r for r in records if r["label"] in DCL_VARIANTS or (
                r["label"] == "clip" and r["batch_size"] in args.screen_batch_sizes and r["seed"] == args.screen_seed)]
        else:
            records = [r for r in records if r["label"] not in DCL_VARIANTS]
        write(results, records, len(records), data, budget, command, started,
              ["dcl-screen"] if screen else ["report of finished runs"], args.batch_sizes, args.stem,
              draws=other_draws(work, budget) if args.data_seed == DATA_SEED else None)
        print(f"[batch_size] {len(records)} finished runs -> {results / (args.stem + '.md')}")
        return 0
    records: List[dict] = []
    lock = threading.Lock()

    def one(job):
        label, flags, b, seed = job
        rec = run_one(label, flags, data, dataclasses.replace(budget, batch_size=b, seed=seed), work, args.threads)
        with lock:
            records.append(rec)
            print(f"[batch_size] {len(records)}/{len(jobs)} {label} B={b} seed {seed} ({rec['source']}, "
                  f"{rec['train_seconds'] / 60:.1f} min): mean R@1 {100 * rec['metrics'][MEAN_R1]:.1f}, zero-shot "
                  f"{100 * rec['metrics']['zeroshot/top1']:.1f}, logit scale "
                  f"{rec['logit_scale'][-1] if rec['logit_scale'] else float('nan'):.1f}", flush=True)
            write(results, records, len(jobs), data, budget, command, started, args.stage, args.batch_sizes,
                  args.stem)

    decisive = set(decisive_runs(args.decisive_batch_sizes, args.decisive_seeds)) if "decisive" in args.stage else set()
    # the stopping rule reads every seed the cache holds, not only this call's (--decisive-seeds 4 5 after 0-3)
    cached = finished_runs(work, data, budget) if decisive else []
    pending = list(jobs)

    def next_job():
        """The next planned run, skipping decisive runs whose batch sizes have their verdict (read from the
        runs finished so far, so a seed is added only while a verdict is missing)."""
        with lock:
            while pending:
                job = pending.pop(0)
                if (job[0], job[2], job[3]) not in decisive or needed((job[0], job[2], job[3]),
                                                                       known_runs(cached, records),
                                                                       args.decisive_batch_sizes):
                    return job
                print(f"[batch_size] skipped {job[0]} B={job[2]} seed {job[3]}: its batch sizes have their verdict",
                      flush=True)
            return None

    def worker():
        while (job := next_job()) is not None:
            one(job)

    print(f"[batch_size] {len(jobs)} runs planned, {args.jobs} at a time -> {results / (args.stem + '.md')}",
          flush=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for fut in [pool.submit(worker) for _ in range(args.jobs)]:
            fut.result()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
