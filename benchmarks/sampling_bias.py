"""Sampling bias on the synthetic data: InfoNCE, ``dcl`` at several ``tau_plus``, and the oracle.

The DCL paper's Figure 2 (Chuang et al. 2020) on clip-dcl's synthetic caption shards. With ``C``
balanced latent classes a random negative shares the anchor's class with probability
``tau_plus = 1 / C``; InfoNCE (``clip``) pushes those "false negatives" away, ``dcl`` corrects its
negative term for a class prior ``--tau-plus``, and the ``unbiased`` oracle drops same-class
negatives using the true labels (the loss and its training entry point in :mod:`train_oracle`).

Every objective trains the tiny model through the real entry point (``python -m clip_dcl.train``,
or ``benchmarks/train_oracle.py`` for the oracle) on the same data, under the same budget, for
each training seed; each final checkpoint is evaluated with ``clip_dcl.experiment.evaluate``
(retrieval, zero-shot over the latent classes, ELEVATER 5-shot probe and mean classifier).

We use 4 classes by default (``tau_plus = 0.25``): with 128 pairs a batch, an anchor then meets
about 32 same-class negatives, so the bias is large, while the zero-shot task (4 classes) and the
few-shot suite stay well above chance for a tiny model in two epochs. Fewer classes (2, 0.5)
leave the zero-shot task nearly trivial; many (10, 0.1) shrink the effect towards the seed noise.

Writes ``sampling_bias.md`` (settings, machine, command, a table of the headline scores against
``tau_plus`` and the full comparison table), ``sampling_bias.json`` (raw per-seed numbers, the
training commands and curves) and ``sampling_bias.png`` (scores against the dcl ``tau_plus``;
``clip`` drawn at ``tau_plus = 0``, where dcl equals InfoNCE; the oracle as a horizontal band).
The report is rewritten after every finished run, and finished runs are reused on a re-run with
the same settings (``--work`` keeps them), so an interrupted benchmark resumes.

Run ``.venv/bin/python benchmarks/sampling_bias.py`` (``--quick``: a smoke run of a minute or two
that writes its report under ``--work``, not into ``benchmarks/results``).

``--extra`` runs the other objectives instead, against ``clip`` and ``dcl`` at the true prior measured
in the same run (report ``sampling_bias_extra.md``/``.json``): ``--dcl-clamp biased``, a fixed
``--dcl-temperature``, ``--tau-plus auto`` (beside ``dcl`` at ``tau_plus = 0.05``, the best of the main
sweep), M = 3 captions per image (``clip``, ``dcl``, ``curl``, ``decl``), hard negatives
(``--hcl-beta`` 0.5 and 1) and ``decl`` at its defaults. Its table gives each score's ratio to ``clip``'s, the
mean ``clamp_rate`` over training and the final ``tau_plus`` estimate, read from the runs' ``metrics.jsonl``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from seed_jobs import RESULTS, Sweep, Tally, add_fewshot_seeds, fewshot_draws, sweep_parser, train_job

from clip_dcl import experiment as ex
from clip_dcl.experiment import arguments
from clip_dcl.experiment.budgets import QUICK_BUDGET
from clip_dcl.experiment.figures import pyplot
from clip_dcl.experiment.stats import format_mean_std, mean_std, summarize
from clip_dcl.train.metrics import read_metrics

HERE = Path(__file__).resolve().parent
STEM = "sampling_bias"
ORACLE = "unbiased (oracle)"
#: The headline scores, in the table against tau_plus and the figure.
HEADLINE = (
    ("zeroshot/top1", "zero-shot top-1"),
    ("fewshot/average/linear_probe", "5-shot probe average"),
    ("fewshot/average/mean_classifier", "5-shot mean classifier average"),
)
FULL_BUDGET = ex.Budget(epochs=2, batch_size=128, lr=2e-3, warmup=20, seed=0, workers=1)


# ------------------------------------------------------------------------------------------
# Runs and aggregation (pure)
# ------------------------------------------------------------------------------------------
def dcl_name(tau_plus: float) -> str:
    return f"dcl tau+={tau_plus:g}"


def make_runs(tau_values: Sequence[float], oracle: bool = True) -> List[ex.Run]:
    """``clip``, ``dcl`` at each ``tau_plus`` and (optionally) the oracle, in table order.

    Raises:
        ValueError: a ``tau_plus`` outside ``(0, 1)`` or a repeated one.
    """
    for t in tau_values:
        if not (isinstance(t, (int, float)) and 0 < t < 1):
            raise ValueError(f"tau_plus {t!r} must be in (0, 1) (tau_plus = 0 is clip itself)")
    if len({f"{t:g}" for t in tau_values}) != len(tau_values):
        raise ValueError(f"repeated tau_plus values in {list(tau_values)}")
    runs = [ex.Run("clip", ("--loss", "clip"))]
    runs += [ex.Run(dcl_name(t), ("--loss", "dcl", "--tau-plus", f"{t:g}")) for t in sorted(tau_values)]
    if oracle:
        runs.append(ex.Run(ORACLE, ("--loss", "unbiased")))
    return runs


#: the fixed temperature measured by --extra (s = 1 / t = 10; CLIP starts at s = 1 / 0.07 = 14.3 and learns it)
EXTRA_TEMPERATURE = 0.1
#: the smallest tau_plus of the main sweep, measured by --extra beside the true prior and auto
SMALL_TAU = 0.05


def make_extra_runs(true_tau: float) -> List[ex.Run]:
    """The --extra variants, in table order; ``dcl`` at the true prior ``true_tau`` unless said otherwise."""
    t = f"{true_tau:g}"
    dcl = ("--loss", "dcl", "--tau-plus", t)
    m3 = ("--captions-per-image", "3")
    return [
        ex.Run("clip", ("--loss", "clip")),
        ex.Run(f"dcl tau+={t}", dcl),
        ex.Run(f"dcl tau+={t} clamp biased", dcl + ("--dcl-clamp", "biased")),
        ex.Run(f"dcl tau+={t} t={EXTRA_TEMPERATURE:g}", dcl + ("--dcl-temperature", f"{EXTRA_TEMPERATURE:g}")),
        ex.Run("dcl tau+=auto", ("--loss", "dcl", "--tau-plus", "auto")),
        # the smallest prior of the main sweep, the best there: what auto is measured against besides the truth
        ex.Run(f"dcl tau+={SMALL_TAU:g}", ("--loss", "dcl", "--tau-plus", f"{SMALL_TAU:g}")),
        ex.Run("clip M=3", ("--loss", "clip") + m3),
        ex.Run(f"dcl tau+={t} M=3", dcl + m3),
        ex.Run("curl M=3", ("--loss", "curl") + m3),
        ex.Run(f"hcl beta=0.5 tau+={t}", dcl + ("--hcl-beta", "0.5")),
        ex.Run(f"hcl beta=1 tau+={t}", dcl + ("--hcl-beta", "1")),
        # DeCL at its defaults, with one caption and with M = 3 captions per image
        ex.Run("decl", ("--loss", "decl")),
        ex.Run("decl M=3", ("--loss", "decl") + m3),
    ]


def log_means(run_dir: os.PathLike) -> Dict[str, float]:
    """Mean ``clamp_rate`` over a training's logged steps and its last ``tau_plus`` (nan when not logged), from
    the run's ``metrics.jsonl``."""
    steps = read_metrics(run_dir, "train")
    clamp = [r["clamp_rate"] for r in steps if "clamp_rate" in r]
    tau = [r["tau_plus"] for r in steps if "tau_plus" in r]
    return {
        "clamp_rate": sum(clamp) / len(clamp) if clamp else float("nan"),
        "tau_plus_final": tau[-1] if tau else float("nan"),
    }


def extra_table(
    runs: Sequence[ex.Run], summary: Dict[str, Dict[str, dict]], logs: Dict[str, List[dict]], chance: Dict[str, float]
) -> str:
    """Markdown: headline scores (mean ± std, %) with their ratio to clip's mean, clamp rate and tau estimate."""
    keys = [k for k, _ in HEADLINE] + ["retrieval/image_to_text_R@10"]
    labels = [label for _, label in HEADLINE] + ["retrieval image->text R@10"]
    rows = [["chance", "", *(f"{100 * chance.get(k, float('nan')):.1f}" for k in keys), "", ""]]
    base = summary.get("clip", {})
    for run in runs:
        if run.name not in summary:
            continue
        cells = []
        for key in keys:
            s = summary[run.name].get(key, mean_std([]))
            cell = format_mean_std(s)
            b = base.get(key, {}).get("mean", float("nan"))
            if run.name != "clip" and b and math.isfinite(b):
                cell += f" ({s['mean'] / b:.2f}x)"
            cells.append(cell)
        per_seed = logs.get(run.name, [])
        clamp = mean_std([d["clamp_rate"] for d in per_seed])
        tau = mean_std([d["tau_plus_final"] for d in per_seed])
        # dcl's floor; decl logs a Clamp_rate of its own (the log-ratio ceiling), another quantity
        clamp_cell = f"{clamp['mean']:.2f}" if clamp["n"] and "dcl" in run.flags else ""
        tau_cell = format_mean_std(tau, scale=1, digits=3) if tau["n"] else ""
        n = max(s["n"] for s in summary[run.name].values())
        rows.append([run.name, n, *cells, clamp_cell, tau_cell])
    return ex.markdown_table(["objective", "seeds", *labels, "mean clamp rate", "final tau_plus"], rows)


def run_tau_plus(run: ex.Run) -> Optional[float]:
    """The run's place on the tau_plus axis: its ``--tau-plus``, 0 for clip, None for the oracle and ``auto``."""
    flags = list(run.flags)
    if "--tau-plus" in flags:
        value = flags[flags.index("--tau-plus") + 1]
        return None if value == "auto" else float(value)  # auto: no fixed place on the axis
    return 0.0 if run.name == "clip" else None


def tau_table(runs: Sequence[ex.Run], summary: Dict[str, Dict[str, dict]], chance: Dict[str, float]) -> str:
    """Markdown: one row per run (with its tau_plus), one column per headline score, mean ± std in %."""
    rows = [["chance", "", "", *(f"{100 * chance.get(k, float('nan')):.1f}" for k, _ in HEADLINE)]]
    for run in runs:
        if run.name not in summary:
            continue
        tau = run_tau_plus(run)
        n = max(s["n"] for s in summary[run.name].values())
        rows.append(
            [
                run.name,
                "labels" if tau is None else f"{tau:g}",
                n,
                *(format_mean_std(summary[run.name][key]) for key, _ in HEADLINE),
            ]
        )
    return ex.markdown_table(["objective", "tau_plus", "seeds", *(label for _, label in HEADLINE)], rows)


# ------------------------------------------------------------------------------------------
# Figure
# ------------------------------------------------------------------------------------------
def plot_tau(
    runs: Sequence[ex.Run],
    scores: Dict[str, List[Dict[str, float]]],
    chance: Dict[str, float],
    true_tau: float,
    path: os.PathLike,
    title: str = "",
) -> Path:
    """Each headline score against the dcl tau_plus (clip at 0), with the oracle as a band."""
    fig, axes = pyplot().subplots(1, len(HEADLINE), figsize=(5.2 * len(HEADLINE), 4.4))
    curve = [r for r in runs if run_tau_plus(r) is not None and scores.get(r.name)]
    oracle = [r for r in runs if run_tau_plus(r) is None and scores.get(r.name)]
    for ax, (key, label) in zip(axes, HEADLINE):
        xs, means, stds = [], [], []
        for r in curve:
            vals = [100 * s[key] for s in scores[r.name] if math.isfinite(s.get(key, float("nan")))]
            if not vals:
                continue
            x = run_tau_plus(r)
            st = mean_std(vals)
            xs.append(x)
            means.append(st["mean"])
            stds.append(0.0 if st["n"] < 2 else st["std"])
            ax.scatter([x] * len(vals), vals, s=10, color="grey", alpha=0.6, zorder=2)
        ax.errorbar(
            xs, means, yerr=stds, fmt="o-", color="tab:blue", capsize=3, zorder=3, label="dcl (mean ± std over seeds)"
        )
        if xs and xs[0] == 0.0:
            ax.scatter([0.0], [means[0]], marker="s", s=60, color="tab:red", zorder=4, label="clip (InfoNCE)")
        for r in oracle:
            vals = [100 * s[key] for s in scores[r.name] if math.isfinite(s.get(key, float("nan")))]
            if vals:
                st = mean_std(vals)
                sd = 0.0 if st["n"] < 2 else st["std"]
                ax.axhline(st["mean"], color="tab:green", lw=1.5, label="unbiased oracle (mean ± std)")
                ax.axhspan(st["mean"] - sd, st["mean"] + sd, color="tab:green", alpha=0.15)
        ax.axvline(true_tau, color="black", ls=":", lw=1, label=f"true class prior {true_tau:.3g}")
        if key in chance:
            ax.axhline(100 * chance[key], color="black", ls="--", lw=0.8, alpha=0.6, label="chance")
        ax.set(xlabel="tau_plus of dcl (clip at 0)", ylabel="%", title=label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="best")
    return ex.save_figure(fig, path, title, title_size=9)


# ------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------
#: torch threads of the training children (set in main before the evaluation drops to one)
TRAIN_THREADS = 0


def machine() -> str:
    import open_clip

    return (
        f"{ex.machine_info()}, open_clip {open_clip.__version__}; training: {TRAIN_THREADS} torch threads, "
        "evaluation: 1"
    )


def build_parser() -> argparse.ArgumentParser:
    p = sweep_parser(
        "sampling_bias.py",
        __doc__,
        quick="tiny data, 1 short epoch, seed 0, tau_plus 0.25 only",
        num_classes=4,
        train_samples=6000,
        train_samples_help="training pairs (quick: the quick set's 256)",
        epochs_help=f"training epochs (default {FULL_BUDGET.epochs}; quick {QUICK_BUDGET.epochs})",
        seeds_help="training seeds (default 0 1 2; quick 0)",
    )
    p.add_argument(
        "--tau-plus",
        type=float,
        nargs="+",
        default=None,
        help="dcl tau_plus values (default 0.05 0.1 0.25 0.4; quick 0.25)",
    )
    p.add_argument("--no-oracle", action="store_true", help="leave out the unbiased oracle")
    p.add_argument(
        "--extra",
        action="store_true",
        help="run the other objectives (M captions, curl, hcl, tau_plus auto, clamp biased, fixed "
        "temperature, decl) against clip and dcl at the true prior; report sampling_bias_extra.md",
    )
    add_fewshot_seeds(p)
    p.add_argument(
        "--stem",
        default=None,
        help=f"report name under --results (default {STEM}, or {STEM}_extra with --extra): another "
        "data set or prior list in a report of its own",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads of each training child (0: torch's default; trainings started through "
        "clip_dcl.experiment take turns on a machine, see its machine_lock)",
    )
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args, argv = arguments.parse(build_parser(), argv)
    arguments.check_synthetic_data(args.num_classes, args.train_samples)
    arguments.check_at_least(1, epochs=args.epochs)
    arguments.check_at_least(0, threads=args.threads)
    thread_env = {}
    if args.threads:
        thread_env = {"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    import torch

    global TRAIN_THREADS
    TRAIN_THREADS = args.threads or torch.get_num_threads()
    # The evaluations run outside the training lock, beside other trainings: on a small shared CPU
    # two full thread pools slowed each other's steps about tenfold, one thread does not.
    torch.set_num_threads(1)
    base = QUICK_BUDGET if args.quick else FULL_BUDGET
    budget = dataclasses.replace(base, epochs=args.epochs or base.epochs)
    seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2])
    arguments.check_seeds(seeds)
    stem = args.stem or (STEM + "_extra" if args.extra else STEM)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", stem):
        raise SystemExit(f"--stem must be a file name without a folder, got {stem!r}")
    taus = args.tau_plus if args.tau_plus is not None else ([0.25] if args.quick else [0.05, 0.1, 0.25, 0.4])
    fewshot_seeds = fewshot_draws(args)
    if args.extra and args.tau_plus is not None:
        raise SystemExit("--extra measures dcl at the true prior 1 / --num-classes; drop --tau-plus")
    try:
        runs = make_runs(taus, oracle=not args.no_oracle)
    except ValueError as e:
        raise SystemExit(f"--tau-plus: {e}")
    work, results_dir = arguments.work_and_results(args, RESULTS)
    command = ex.command_line("sampling_bias.py", argv)
    started = datetime.now(timezone.utc)
    t_start = time.perf_counter()

    print(f"[sampling_bias] data: {args.num_classes} classes -> {work / 'data'}", flush=True)
    overrides = dict(num_classes=args.num_classes, captions_per_image=5)
    if not args.quick or args.train_samples != 6000:
        overrides["train_samples"] = args.train_samples
    data = ex.synth_data(work / "data", quick=args.quick, **overrides)
    if args.extra:
        runs = make_extra_runs(float(data["tau_plus"]))

    if not args.no_oracle:
        import train_oracle  # noqa: F401  registers the oracle's loss here too: the run cache reads its defaults

    sweep = Sweep(results_dir, data, budget, seeds, fewshot_seeds, command, started, t_start)
    entry = {ORACLE: [sys.executable, str(HERE / "train_oracle.py")]}
    tally = Tally.of(runs)
    total = len(runs) * len(seeds)
    done = 0
    # Seed-major order: every objective of seed 0 first, so a partial report compares like with like.
    for seed in seeds:
        for run in runs:
            done += 1
            more = dict(fewshot_seeds=fewshot_seeds, entry=entry.get(run.name), env=thread_env)
            out = train_job("sampling_bias", done, total, run, seed, budget, data, work, **more)
            res, metrics, secs = out.result, out.metrics, out.eval_seconds
            print(
                f"[sampling_bias]     {out.source}; training {res.seconds:.0f} s, evaluation {secs:.0f} s: "
                + ", ".join(f"{label} {100 * metrics[key]:.1f}" for key, label in HEADLINE),
                flush=True,
            )
            tally.add(run.name, res, metrics, seed, secs)
            write(sweep, runs, tally, complete=(done == total), stem=stem, extra=args.extra)
    print(f"[sampling_bias] wrote {results_dir / (stem + '.md')}, .json, .png", flush=True)
    print((results_dir / f"{stem}.md").read_text().split("## Full comparison")[0])
    return 0


def write(
    sweep: Sweep, runs: Sequence[ex.Run], tally: Tally, complete: bool, stem: str = STEM, extra: Optional[bool] = None
) -> None:
    """(Re)write the report from the runs finished so far under ``stem``; ``extra``: the other objectives' report
    (default: ``stem`` is not ``sampling_bias``)."""
    main_report = stem == STEM if extra is None else not extra
    data, budget, seeds, fewshot_seeds = sweep.data, sweep.budget, sweep.seeds, sweep.fewshot_seeds
    command, started, seconds = sweep.command, sweep.started, sweep.seconds()
    results, eval_seconds = tally.results, tally.eval_seconds
    have = tally.finished()
    chance = ex.chance_levels(data)
    keys = sorted({k for per_seed in have.values() for s in per_seed for k in s if k != "seed"})
    summary = summarize(have, keys)
    n_train = data["train"]["num_samples"]
    true_tau = float(data["tau_plus"])
    title = (
        f"{data['config']['num_classes']} latent classes (tau_plus {true_tau:.3g}), {n_train} pairs, "
        f"{budget.epochs} epochs, batch {budget.batch_size}, seeds {seeds}"
    )
    status = ex.run_status(have, complete)
    train_s = [r.seconds for n in have for r in results[n]]
    eval_s = [s for n in have for s in eval_seconds[n]]
    header = "\n".join(
        [
            (
                "# Sampling bias, the other objectives: M captions, curl, hcl, tau_plus auto, clamp, temperature, decl"
                if not main_report
                else "# Sampling bias: clip vs dcl(tau_plus) vs the unbiased oracle"
            ),
            "",
            *ex.about_lines(
                status=status,
                command=command,
                machine=machine(),
                date=f"{started:%Y-%m-%d %H:%M}; this invocation {seconds / 60:.1f} min (finished runs kept in --work "
                f"are reused); the runs' training {sum(train_s) / 60:.1f} min and evaluation {sum(eval_s) / 60:.1f} "
                "min "
                "in all (the CPU was shared with other jobs, so times are not speed measurements)",
            ),
            f"- Data: clip-dcl synthetic shards, {data['config']['num_classes']} balanced latent classes "
            f"({', '.join(data['classes']['names'])}), measured class prior tau_plus = {true_tau:.4f}; "
            f"{n_train} training pairs, {data['val']['num_samples']} held-out retrieval images "
            f"({data['config']['val_captions_per_image']} captions each), zero-shot over the "
            f"{data['zeroshot']['num_classes']} classes ({data['zeroshot']['num_images']} images), few-shot suite "
            f"{', '.join(data['fewshot']['datasets'])}.",
            f"- Training: tiny model `{budget.model}`, {budget.epochs} epochs, batch {budget.batch_size}, lr "
            f"{budget.lr}, "
            f"wd {budget.wd}, warmup {budget.warmup}, fp32 CPU, through `python -m clip_dcl.train` "
            "(oracle: `benchmarks/train_oracle.py`, the same entry point with the label table bound); "
            f"training seeds {seeds} (same data). Evaluation: `clip_dcl.experiment.evaluate`, 5-shot probe over "
            f"k-shot draws {fewshot_seeds} (reduced grid).",
            (
                "- Objectives: `clip` = OpenCLIP's InfoNCE (= dcl at tau_plus 0); `dcl tau+=t` = debiased contrastive "
                "loss "
                "with class prior t; `unbiased (oracle)` = InfoNCE whose negatives exclude the anchor's latent class "
                "(true labels; the upper reference dcl approximates)."
                if main_report
                else "- Objectives (each run's flags are in the json): `clip`; `dcl tau+=t` at the true prior; `clamp "
                "biased` = "
                "clamped rows fall back to InfoNCE; `t=` = a fixed temperature for dcl instead of the learned scale; "
                "`tau+=auto` = the prior estimated during training; `M=3` = 3 of each image's 5 captions as positives "
                "(`--captions-per-image 3`); `curl` = Arora et al.'s block loss (logistic); `hcl beta=b` = dcl with "
                "hard-negative weights exp(b l)."
            ),
            f"- Raw numbers per seed, commands and training curves: `{stem}.json`; figure: `{stem}.png`.",
        ]
    )
    logs = {n: [log_means(r.log_dir) for r in results[n]] for n in have}
    report = sweep.write_report(
        stem,
        tally,
        header,
        {
            "fewshot_seeds": fewshot_seeds,
            "command": command,
            "date": f"{started:%Y-%m-%d %H:%M} UTC",
            "machine": machine(),
            "complete": complete,
            "minutes": seconds / 60,
            "true_tau_plus": true_tau,
            "tau_plus_of_run": {r.name: run_tau_plus(r) for r in runs},
            "eval_seconds": {n: eval_seconds[n] for n in have},
            "summary": summary,
            "training_logs": logs,
        },
        roots=[HERE.parent],
    )  # the oracle's entry point: benchmarks/train_oracle.py
    ordered = [r for r in runs if r.name in have]
    if main_report:
        plot_tau(ordered, have, chance, true_tau, sweep.out / f"{stem}.png", title=title)
        headline = [
            "## Headline scores against tau_plus (%, mean ± sample std over training seeds)",
            tau_table(ordered, summary, chance),
            f"![scores against tau_plus]({stem}.png)",
        ]
    else:
        headline = [
            "## Headline scores (%, mean ± sample std over training seeds; (ratio to clip's mean in this run); "
            "mean Clamp_rate over the logged training steps; final Tau_plus estimate)",
            extra_table(ordered, summary, logs, chance),
            f"![curves and scores]({stem}.png)",
        ]
    ex.Report(sweep.out, stem, command).write(
        [
            header,
            *headline,
            "## Full comparison (%, mean ± sample std over training seeds; best mean in bold)",
            report["table"],
        ],
        sep="\n\n",
    )


# ------------------------------------------------------------------------------------------
# The README's numbers (benchmarks/quotes.py)
# ------------------------------------------------------------------------------------------
#: The README's columns.
README_SCORES = (
    ("zeroshot/top1", "zero-shot top-1"),
    ("fewshot/average/linear_probe", "5-shot probe"),
    ("retrieval/image_to_text_R@10", "image->text R@10"),
)


def readme_table(doc: dict, ratios: bool = False) -> str:
    """Markdown: per run of ``doc``, the README's scores (mean ± std over seeds, %; with ``ratios`` the ratio to
    clip's mean and dcl's mean clamp rate and final tau_plus estimate)."""
    summary, logs = doc["summary"], doc.get("training_logs", {})
    head = (
        ["objective", "seeds"]
        + [label for _, label in README_SCORES]
        + (["clamp rate", "final tau_plus"] if ratios else [])
    )
    lines = ["| " + " | ".join(head) + " |", "|---|---:|" + "---:|" * (len(head) - 2)]
    for name, per_seed in doc["runs"].items():
        cells = []
        for key, _ in README_SCORES:
            cell = format_mean_std(summary[name][key])
            base = summary["clip"][key]["mean"]
            if ratios and name != "clip" and base:
                cell += f" ({summary[name][key]['mean'] / base:.2f}x)"
            cells.append(cell)
        if ratios:
            clamp = mean_std([d["clamp_rate"] for d in logs.get(name, [])])
            tau = mean_std([d["tau_plus_final"] for d in logs.get(name, [])])
            dcl = "dcl" in per_seed[0]["flags"]
            cells += [
                f"{clamp['mean']:.2f}" if dcl and clamp["n"] else "",
                format_mean_std(tau, scale=1, digits=2) if tau["n"] else "",
            ]
        lines.append(f"| `{name}` | {len(per_seed)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def readme_block(doc: dict) -> str:
    """The README's table of the tau_plus sweep (held-out split of the synthetic data)."""
    c = doc["data"]["config"]
    return (
        f"Scores on the held-out split ({c['val_samples']} retrieval images; zero-shot over the "
        f"{c['num_classes']} classes, chance {100 * doc['chance']['zeroshot/top1']:.0f} %), %, mean ± std over seeds "
        f"{', '.join(map(str, doc['seeds']))}:\n\n" + readme_table(doc)
    )


def extra_readme_block(doc: dict) -> str:
    """The README's table of the other objectives (held-out split; ratio to clip's mean in the same run)."""
    return (
        f"Held-out split, %, mean ± std over seeds {', '.join(map(str, doc['seeds']))} (ratio to `clip`'s mean in "
        "this run); clamp rate: `dcl`'s mean `Clamp_rate` over training; final tau_plus: `--tau-plus auto`'s "
        f"last estimate (truth {doc['true_tau_plus']:g}):\n\n" + readme_table(doc, ratios=True)
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
