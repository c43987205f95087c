"""Train several objectives on one data set and compare them: the engine of ``clip-dcl demo``.

A comparison is a list of :class:`Run` (a label and the ``--loss ...`` flags of one objective)
trained under the same seed, data, model and budget (:class:`Budget`) through the real training
entry point, ``python -m clip_dcl.train``, in a child process (as a user would launch it), then
evaluated with the package's evaluators on the synthetic data's held-out splits:

* retrieval R@1/5/10 on the validation shards (several captions per image);
* zero-shot top-1/top-5 and mean per-class recall over the latent classes;
* the ELEVATER 5-shot linear probe (reduced grid by default) and the mean classifier over the
  few-shot suite.

Beside every score, :func:`chance_levels` gives what a random embedding would score, worked out
from the data's sizes (not measured). The report is a Markdown table, a JSON document with the
raw numbers and settings, and a PNG with the training curves and the scores
(:func:`write_report`). The benchmarks in ``benchmarks/`` reuse the same pieces with more seeds.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

#: The model every demo run trains (registered by clip_dcl.models).
DEFAULT_MODEL = "clip-dcl-tiny"


@dataclass(frozen=True)
class Run:
    """One objective of a comparison: a table label and its ``clip_dcl.train`` flags."""

    name: str
    flags: tuple = ()

    @property
    def slug(self) -> str:
        """A folder name for the run's logs."""
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", self.name).strip("-") or "run"


@dataclass(frozen=True)
class Budget:
    """What every run of a comparison shares; maps one to one onto OpenCLIP's flags."""

    epochs: int = 4
    batch_size: int = 128
    lr: float = 1e-3
    wd: float = 0.1
    warmup: int = 20
    seed: int = 0
    workers: int = 1
    model: str = DEFAULT_MODEL
    log_every_n_steps: int = 5
    #: OpenCLIP flags added verbatim (e.g. ``("--lr-scheduler", "const")``)
    extra: tuple = ()

    def validate(self) -> None:
        for name in ("epochs", "batch_size", "log_every_n_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 1")
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr!r} must be > 0")
        if self.workers < 0 or self.warmup < 0:
            raise ValueError(f"workers={self.workers!r} and warmup={self.warmup!r} must be >= 0")


def machine_info() -> str:
    """One line naming this machine for results files: CPU model, cores, GPU, OS, Python, torch."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{cpu}, {os.cpu_count()} CPU cores ({torch.get_num_threads()} torch threads), {gpu}; "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}, torch {torch.__version__}")


def default_runs(tau_plus: float) -> List[Run]:
    """The three objectives under their package defaults; ``dcl`` gets the data's own class prior."""
    return [
        Run("clip", ("--loss", "clip")),
        Run("dcl", ("--loss", "dcl", "--tau-plus", f"{tau_plus:.6g}")),
        Run("decl", ("--loss", "decl", "--decl-rate", "index")),
    ]


# ------------------------------------------------------------------------------------------
# Training
# ------------------------------------------------------------------------------------------
def train_command(run: Run, data: dict, logs: os.PathLike, budget: Budget,
                  entry: Optional[Sequence[str]] = None) -> List[str]:
    """The ``python -m clip_dcl.train -- ...`` command line of ``run`` (``data``: a synth summary).

    ``entry`` replaces ``[python, "-m", "clip_dcl.train"]``, e.g. with a script that registers
    an extra loss before calling :func:`clip_dcl.train.main`.
    """
    return [
        *(entry or [sys.executable, "-m", "clip_dcl.train"]), "--",
        "--model", budget.model,
        "--train-data", data["train_data"], "--val-data", data["val_data"],
        "--dataset-type", "webdataset",
        "--train-num-samples", str(data["train"]["num_samples"]),
        "--val-num-samples", str(data["val"]["num_samples"]),
        "--batch-size", str(budget.batch_size), "--epochs", str(budget.epochs),
        "--lr", repr(budget.lr), "--wd", repr(budget.wd), "--warmup", str(budget.warmup),
        "--seed", str(budget.seed), "--workers", str(budget.workers),
        "--precision", "fp32", "--device", "cpu",
        "--logs", str(logs), "--name", run.slug,
        "--log-every-n-steps", str(budget.log_every_n_steps),
        "--save-frequency", "1", "--zeroshot-frequency", "0", "--val-frequency", "1",
        "--report-to", "",
        *budget.extra, *run.flags,
    ]


@dataclass
class TrainResult:
    run: Run
    checkpoint: Path
    log_dir: Path
    seconds: float
    command: List[str]
    curves: Dict[str, list] = field(default_factory=dict)
    val: List[dict] = field(default_factory=list)


@contextmanager
def machine_lock(echo: Callable[[str], None] = print):
    """Hold a machine-wide lock while a training child runs (POSIX ``flock``).

    Two trainings sharing a small CPU run several times slower each than one after the other
    (their thread pools fight for the cores), so comparisons started side by side on one
    machine take turns. The lock file is ``$CLIP_DCL_TRAIN_LOCK`` (default
    ``<tmp>/clip-dcl-train.lock``); set the variable to an empty string to run side by side.
    """
    path = os.environ.get("CLIP_DCL_TRAIN_LOCK", os.path.join(tempfile.gettempdir(), "clip-dcl-train.lock"))
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        path = ""
    if not path:
        yield
        return
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            echo(f"  waiting for another clip-dcl training on this machine to finish (lock {path})")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


_PROGRESS = re.compile(r"Train Epoch: (\d+) \[\s*(\d+)/(\d+) \((\d+)%\)\].*?\bLoss: (\S+)")


def train(run: Run, data: dict, logs: os.PathLike, budget: Budget, *, echo: Callable[[str], None] = print,
          env: Optional[dict] = None, entry: Optional[Sequence[str]] = None) -> TrainResult:
    """Train ``run`` in a child process; stream its progress through ``echo``; return its results.

    An earlier run of the same name under ``logs`` is replaced (OpenCLIP refuses to reuse a
    folder). The child's full output is kept in ``logs/<name>/stdout.txt``; on failure its tail
    is raised in a ``RuntimeError``. Runs take turns with other trainings started through this
    function on the same machine (:func:`machine_lock`).
    """
    budget.validate()
    logs = Path(logs)
    log_dir = logs / run.slug
    cmd = train_command(run, data, logs, budget, entry)
    child_env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1", **(env or {})}
    with machine_lock(echo):
        # Only once it is this run's turn: a run stopped while waiting leaves the earlier one intact.
        if log_dir.exists():
            shutil.rmtree(log_dir)
        logs.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        code, lines = _stream(cmd, child_env, run, budget, echo, start)
    seconds = time.perf_counter() - start
    log_dir.mkdir(parents=True, exist_ok=True)  # absent when the child failed before OpenCLIP started
    (log_dir / "stdout.txt").write_text("\n".join(lines) + "\n")
    tail = lines[-60:]
    checkpoint = log_dir / "checkpoints" / f"epoch_{budget.epochs}.pt"
    if code != 0 or not checkpoint.is_file():
        raise RuntimeError(f"training {run.name!r} failed (exit code {code}): {' '.join(cmd)}\n"
                           + "\n".join(tail))
    return TrainResult(run, checkpoint, log_dir, seconds, cmd, read_curves(log_dir / "out.log"),
                       read_val(log_dir / "checkpoints" / "results.jsonl"))


def _stream(cmd, env, run: Run, budget: Budget, echo, start: float):
    """Run ``cmd``; echo its progress lines; return the exit code and the output's lines."""
    lines: List[str] = []
    last_echo = 0.0
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    with proc.stdout:
        for line in proc.stdout:
            lines.append(line.rstrip())
            match = _PROGRESS.search(line)
            now = time.perf_counter()
            if match and (now - last_echo > 5 or match.group(4) == "100"):
                epoch, pct, loss = int(match.group(1)), int(match.group(4)), float(match.group(5))
                echo(f"  [{run.name}] epoch {epoch + 1}/{budget.epochs} {pct:3d}%  loss {loss:.4f}  "
                     f"({now - start:.0f} s)")
                last_echo = now
            elif "Eval Epoch:" in line and "R@1" in line:
                found = dict(re.findall(r"(\w+_R@1|clip_val_loss): (\S+)", line))
                echo(f"  [{run.name}] validation: " + ", ".join(f"{k} {float(v):.4f}" for k, v in found.items()))
    return proc.wait(), lines


def read_curves(out_log: os.PathLike) -> Dict[str, list]:
    """Training loss against epochs from OpenCLIP's ``out.log``: ``{"epoch", "loss"[, "loss2"]}``.

    ``epoch`` is fractional (epoch index plus the share of the epoch done at the logged step);
    ``loss`` is the step's total loss as OpenCLIP logs it; ``loss2`` is DeCL's InfoNCE term, when
    logged (DeCL's total moves between its two terms as ``lambda_t`` changes).
    """
    curves: Dict[str, list] = {"epoch": [], "loss": []}
    path = Path(out_log)
    if not path.is_file():
        return curves
    for line in path.read_text(errors="replace").splitlines():
        match = _PROGRESS.search(line)
        if match:
            done, total = int(match.group(2)), int(match.group(3))
            curves["epoch"].append(int(match.group(1)) + (done / total if total else 0.0))
            curves["loss"].append(float(match.group(5)))
            loss2 = re.search(r"\bLoss2: (\S+)", line)
            if loss2:
                curves.setdefault("loss2", []).append(float(loss2.group(1)))
    return curves


def read_val(results_jsonl: os.PathLike) -> List[dict]:
    """The per-epoch validation records OpenCLIP appends to ``checkpoints/results.jsonl``."""
    path = Path(results_jsonl)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def synth_data(out_dir: os.PathLike, *, quick: bool = False, verbose: bool = True, **overrides) -> dict:
    """The synthetic data set under ``out_dir``: reused when written with the same config, else
    written afresh (``out_dir`` holds outputs of a comparison, nothing else)."""
    from .data.synth import generate

    try:
        return generate(out_dir, quick=quick, reuse=True, verbose=verbose, **overrides)
    except FileExistsError:
        return generate(out_dir, quick=quick, overwrite=True, verbose=verbose, **overrides)


#: Version of what :func:`evaluate` reports; bumped when an evaluator changes its numbers, so that
#: cached runs (:func:`train_and_evaluate`) are evaluated again. 2: the few-shot probe ignores
#: diverged heads.
EVALUATOR = 2


@dataclass
class Outcome:
    """A trained and evaluated run (:func:`train_and_evaluate`)."""

    result: TrainResult
    metrics: Dict[str, float]
    eval_seconds: float
    #: UTC time the evaluation finished, ``YYYY-MM-DD HH:MM``
    finished: str
    #: "trained", "evaluated" (cached training, evaluated again) or "reused"
    source: str


def train_and_evaluate(run: Run, data: dict, logs: os.PathLike, budget: Budget, cache: os.PathLike, *,
                       fewshot_seeds: Sequence[int] = (0, 1, 2), entry: Optional[Sequence[str]] = None,
                       env: Optional[dict] = None, echo: Callable[[str], None] = print) -> Outcome:
    """:func:`train` then :func:`evaluate`, remembered in the JSON file ``cache``.

    A later call with the same run flags, budget, data config and few-shot seeds reuses the
    cached training, and its scores too unless :data:`EVALUATOR` changed since (then the
    checkpoint is evaluated again), so that an interrupted benchmark resumes where it stopped.
    """
    cache = Path(cache)
    # compared as JSON holds it (tuples come back as lists)
    key = json.loads(json.dumps({"flags": list(run.flags), "budget": dataclasses.asdict(budget),
                                 "data": data["config"], "fewshot_seeds": list(fewshot_seeds)}))
    doc = json.loads(cache.read_text()) if cache.is_file() else {}
    res = None
    if doc.get("settings") == key and Path(doc.get("checkpoint", "")).is_file():
        res = TrainResult(run, Path(doc["checkpoint"]), Path(doc["log_dir"]), doc["seconds"], doc["command"],
                          doc["curves"], doc["val"])
        if doc.get("evaluator") == EVALUATOR:
            return Outcome(res, doc["metrics"], doc["eval_seconds"], doc["finished"], "reused")
    source = "evaluated" if res is not None else "trained"
    if res is None:
        res = train(run, data, logs, budget, echo=echo, env=env, entry=entry)
    t0 = time.perf_counter()
    metrics = evaluate(res.checkpoint, data, fewshot_seeds=fewshot_seeds)
    secs = time.perf_counter() - t0
    finished = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({
        "settings": key, "evaluator": EVALUATOR, "checkpoint": str(res.checkpoint), "log_dir": str(res.log_dir),
        "seconds": res.seconds, "command": res.command, "curves": res.curves, "val": res.val, "metrics": metrics,
        "eval_seconds": secs, "finished": finished}, default=str) + "\n")
    return Outcome(res, metrics, secs, finished, source)


# ------------------------------------------------------------------------------------------
# Evaluation
# ------------------------------------------------------------------------------------------
def evaluate(checkpoint: os.PathLike, data: dict, *, shots: int = 5, fewshot_seeds: Sequence[int] = (0, 1, 2),
             grid: str = "reduced", batch_size: int = 256, progress: bool = False) -> Dict[str, float]:
    """Retrieval, zero-shot and few-shot scores of a checkpoint on a synthetic data set.

    Keys: ``retrieval/<metric>``, ``zeroshot/<metric>``, ``fewshot/<data set>/<score>`` (the
    evaluators' own names under a prefix).
    """
    from .checkpoint import load_checkpoint
    from .eval.fewshot import evaluate_fewshot
    from .eval.retrieval import evaluate_retrieval
    from .eval.zeroshot import evaluate_zeroshot

    root = Path(data["out_dir"])
    model, preprocess, tokenizer = load_checkpoint(checkpoint)
    out: Dict[str, float] = {}
    ret = evaluate_retrieval(model, preprocess, tokenizer, data["val_data"], batch_size=batch_size,
                             progress=progress)
    out.update({f"retrieval/{k}": float(v) for k, v in ret.items()})
    zs = evaluate_zeroshot(model, preprocess, tokenizer, root / data["zeroshot"]["dir"], batch_size=batch_size,
                           progress=progress)
    out.update({f"zeroshot/{k}": float(v) for k, v in zs.items()})
    fs = evaluate_fewshot(model, preprocess, tokenizer, root / data["fewshot"]["dir"], shots=shots,
                          seeds=tuple(fewshot_seeds), grid=grid, batch_size=batch_size, progress=progress)
    out.update({f"fewshot/{k}": float(v) for k, v in fs.items()})
    return out


def _any_hit_chance(num_candidates: int, num_true: int, k: int) -> float:
    """P(at least one of ``num_true`` relevant items in a uniformly random top ``k``)."""
    k = min(k, num_candidates)
    miss = 1.0
    for i in range(k):
        miss *= max(0, num_candidates - num_true - i) / (num_candidates - i)
    return 1.0 - miss


def chance_levels(data: dict) -> Dict[str, float]:
    """What an embedding unrelated to the content scores on each headline metric, in expectation.

    Retrieval: every image has ``m`` captions among ``M = m * N`` (image -> text hits if any of
    its ``m`` is in the top k: ``1 - C(M - m, k) / C(M, k)``); text -> image ``k / N``.
    Classification on balanced classes: top-k ``k / C``, mean per-class recall ``1 / C``.
    Few-shot: ``1 / C`` for accuracy and mean per-class recall (the synthetic suite and the
    digits are balanced or near it, so accuracy's chance is the same to within a point).
    """
    n_img = int(data["val"]["num_samples"])
    m = int(data["config"]["val_captions_per_image"])
    chance: Dict[str, float] = {}
    for k in (1, 5, 10):
        chance[f"retrieval/image_to_text_R@{k}"] = _any_hit_chance(n_img * m, m, k)
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
    rows += [("fewshot/average/linear_probe", "5-shot probe average"),
             ("fewshot/average/mean_classifier", "5-shot mean classifier average")]
    return rows


# ------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------
def _cell(values: Sequence[float]) -> str:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return "nan"
    mean = sum(finite) / len(finite)
    if len(finite) == 1:
        return f"{100 * mean:.1f}"
    std = math.sqrt(sum((v - mean) ** 2 for v in finite) / (len(finite) - 1))
    return f"{100 * mean:.1f} ± {100 * std:.1f}"


def comparison_table(scores: Dict[str, List[Dict[str, float]]], rows: Sequence[tuple],
                     chance: Dict[str, float]) -> str:
    """Markdown: one row per metric, one column per run (mean ± sample std over seeds), in percent.

    ``scores``: run name -> one metrics dict per seed. The best mean of a row is in bold.
    """
    names = list(scores)
    header = "| metric (%) | chance | " + " | ".join(names) + " |"
    lines = [header, "|" + "---|" * (len(names) + 2)]
    for key, label in rows:
        values = {n: [s.get(key, float("nan")) for s in scores[n]] for n in names}
        means = {n: (sum(v) / len(v) if v and all(math.isfinite(x) for x in v) else float("nan"))
                 for n, v in values.items()}
        finite = [m for m in means.values() if math.isfinite(m)]
        best = max(finite) if finite else None
        cells = []
        for n in names:
            cell = _cell(values[n])
            cells.append(f"**{cell}**" if best is not None and means[n] == best and len(names) > 1 else cell)
        level = chance.get(key)
        lines.append(f"| {label} | {'' if level is None else f'{100 * level:.1f}'} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: Dict[str, List[TrainResult]], scores: Dict[str, List[Dict[str, float]]],
         rows: Sequence[tuple], chance: Dict[str, float], path: os.PathLike, title: str = "") -> Path:
    """A PNG: training loss and validation R@1 per epoch (left), headline scores per run (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8), gridspec_kw={"width_ratios": [1, 1, 2]})
    names = list(results)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, name in enumerate(names):
        colour = colours[i % len(colours)]
        for j, res in enumerate(results[name]):
            label = name if j == 0 else None
            curve = res.curves.get("loss2") or res.curves["loss"]
            label = f"{name} (InfoNCE term)" if j == 0 and "loss2" in res.curves else label
            axes[0].plot(res.curves["epoch"], curve, color=colour, alpha=0.8, lw=1, label=label)
            if res.val:
                ep = [r.get("epoch", k + 1) for k, r in enumerate(res.val)]
                r1 = [(r.get("image_to_text_R@1", np.nan) + r.get("text_to_image_R@1", np.nan)) / 2 for r in res.val]
                axes[1].plot(ep, [100 * v for v in r1], "o-", color=colour, alpha=0.8, label=label)
    axes[0].set(xlabel="epoch", ylabel="loss (each objective's own)", title="training loss")
    axes[1].set(xlabel="epoch", ylabel="mean R@1 (%)", title="validation retrieval (OpenCLIP, 1 caption)")
    for ax in axes[:2]:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)

    ax = axes[2]
    width = 0.8 / max(1, len(names))
    x = np.arange(len(rows))
    for i, name in enumerate(names):
        means = [100 * np.nanmean([s.get(k, np.nan) for s in scores[name]]) for k, _ in rows]
        errs = [100 * (np.nanstd([s.get(k, np.nan) for s in scores[name]], ddof=1) if len(scores[name]) > 1 else 0)
                for k, _ in rows]
        ax.bar(x + (i - (len(names) - 1) / 2) * width, means, width, yerr=errs, label=name,
               color=colours[i % len(colours)], capsize=2)
    ax.scatter(x, [100 * chance.get(k, np.nan) for k, _ in rows], marker="_", s=300, color="black",
               label="chance", zorder=3)
    ax.set_xticks(x, [label for _, label in rows], rotation=60, ha="right", fontsize=7)
    ax.set(ylabel="%", title="held-out scores")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path, title)


def save_figure(fig, path: os.PathLike, title: str = "", title_size=None) -> Path:
    """Title, lay out and write a matplotlib figure as a PNG (folders created), then free it."""
    import matplotlib.pyplot as plt

    if title:
        fig.suptitle(title, fontsize=title_size)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(out_dir: os.PathLike, stem: str, *, data: dict, budget: Budget,
                 results: Dict[str, List[TrainResult]], scores: Dict[str, List[Dict[str, float]]],
                 header: str = "", extra: Optional[dict] = None) -> Dict[str, Path]:
    """Write ``<stem>.md`` (table), ``<stem>.json`` (raw numbers, commands) and ``<stem>.png``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = headline_metrics(data)
    chance = chance_levels(data)
    table = comparison_table(scores, rows, chance)
    png = plot(results, scores, rows, chance, out / f"{stem}.png", title=header.splitlines()[0] if header else "")
    md = out / f"{stem}.md"
    about = (f"- machine: {machine_info()}\n- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n"
             f"- command: `{' '.join([Path(sys.argv[0]).name] + sys.argv[1:])}`\n"
             f"- raw numbers, commands and curves: `{stem}.json`\n")
    md.write_text((header + "\n\n" if header else "") + about + "\n" + table + "\n\n"
                  + f"![curves and scores]({png.name})\n")
    doc = {
        "machine": machine_info(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "budget": dataclasses.asdict(budget),
        "data": {k: data[k] for k in ("out_dir", "train_data", "val_data", "tau_plus", "config") if k in data},
        "chance": chance,
        "runs": {
            name: [{"flags": list(r.run.flags), "seed": s.get("seed"), "checkpoint": str(r.checkpoint),
                    "train_seconds": r.seconds, "command": r.command, "curves": r.curves, "val": r.val,
                    "metrics": {k: v for k, v in s.items() if k != "seed"}}
                   for r, s in zip(results[name], scores[name])]
            for name in results
        },
        **(extra or {}),
    }
    js = out / f"{stem}.json"
    js.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return {"markdown": md, "json": js, "png": png, "table": table}
