"""Quality table: the demo's clip / dcl / decl comparison over several training seeds, and a DeCL ablation.

The comparison of ``clip-dcl demo`` (:mod:`clip_dcl.demo`): the tiny model trained on the
synthetic caption shards (10 balanced latent classes) with ``clip`` (OpenCLIP's InfoNCE), ``dcl``
(``--tau-plus`` = the data's measured class prior) and ``decl`` (the package defaults: rate
``index``, schedule ``alternate``, ``u`` at its mean), each through the real entry point
``python -m clip_dcl.train``, under the demo's budget, once per training seed; each final checkpoint
is evaluated with :func:`clip_dcl.experiment.evaluate` (retrieval R@1/5/10 on the held-out split,
zero-shot over the latent classes, ELEVATER 5-shot linear probe and mean classifier).

The DeCL ablation changes one setting of the default ``decl`` at a time: ``--decl-rate queue``,
``--decl-rate batch``, ``--decl-schedule decl``, ``--decl-schedule harmonic`` (and, on request,
``--decl-sample-u``, u drawn from its Gamma). It runs on the ablation seeds (a subset of the training seeds) and is
compared with the main comparison's ``decl`` run of the same seed, which is the same training.

Beside mean ± sample std over seeds, a paired comparison gives, for each objective against its
reference (``clip`` for the main comparison, the default ``decl`` for the ablation), the per-seed
differences of the headline scores (5-shot probe average, zero-shot top-1, retrieval mean R@1 =
the mean of image->text and text->image R@1) and how many seeds it wins: seeds share the data and
the initialisation, so the paired differences are less noisy than the two spreads suggest.

Writes ``quality.md`` (settings, machine, date, command, timings, the tables), ``quality.json``
(raw per-seed numbers, commands, curves) and ``quality.png`` (training curves, validation R@1 and
the held-out scores). The report is rewritten after every finished run, and finished runs are
reused on a re-run with the same settings (kept under ``--work``), so an interrupted run resumes.

Run ``.venv/bin/python benchmarks/quality.py`` (``--quick``: a smoke run of a minute or two on tiny
data that writes its report under ``--work``, not into ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from seed_jobs import RESULTS, Sweep, Tally, add_fewshot_seeds, fewshot_draws, sweep_parser, train_job

from clip_dcl import experiment as ex
from clip_dcl.experiment import arguments
from clip_dcl.experiment.budgets import DEMO_BUDGET, DEMO_CLASSES, QUICK_BUDGET
from clip_dcl.experiment.scoring import MEAN_R1, with_mean_r1
from clip_dcl.experiment.stats import paired_differences, summarize
from clip_dcl.paths import write_json

STEM = "quality"
#: The scores of the paired comparison.
HEADLINE = (
    ("fewshot/average/linear_probe", "5-shot probe average"),
    ("zeroshot/top1", "zero-shot top-1"),
    (MEAN_R1, "retrieval mean R@1"),
)
#: The default decl of the main comparison (ex.default_runs) and the reference of the ablation.
DECL = "decl"
#: The ablation's reference in its table: the main decl run, or decl trained again at the ablation's budget.
ABL_REF = f"{DECL} (default)"
#: Ablation variants: name (the run is labelled ``decl <name>``) -> flags replacing or added to the default decl's.
ABLATIONS = {
    "rate=queue": ("--decl-rate", "queue"),
    "rate=batch": ("--decl-rate", "batch"),
    "schedule=decl": ("--decl-schedule", "decl"),
    "schedule=harmonic": ("--decl-schedule", "harmonic"),
    "u=gamma": ("--decl-sample-u",),
}
DEFAULT_ABLATIONS = ("rate=queue", "rate=batch", "schedule=decl", "schedule=harmonic")


# ------------------------------------------------------------------------------------------
# Runs and aggregation (pure)
# ------------------------------------------------------------------------------------------
def ablation_runs(names: Sequence[str], decl: ex.Run) -> List[ex.Run]:
    """The ablation variants ``names`` (keys of :data:`ABLATIONS`) of the default ``decl`` run.

    Each changes one setting: a flag the default already carries (``--decl-rate index``) gets
    the new value, any other flag is appended.

    Raises:
        ValueError: an unknown or repeated variant name.
    """
    unknown = [n for n in names if n not in ABLATIONS]
    if unknown:
        raise ValueError(f"unknown ablation(s) {unknown}; choose from {list(ABLATIONS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"repeated ablation in {list(names)}")
    runs = []
    for name in names:
        change = ABLATIONS[name]
        flags = list(decl.flags)
        if change[0] in flags and len(change) == 2:
            flags[flags.index(change[0]) + 1] = change[1]
        else:
            flags += change
        runs.append(ex.Run(f"{DECL} {name}", tuple(flags)))
    return runs


def paired_table(paired: Dict[str, Dict[str, dict]], reference: str, headline: Sequence[tuple] = HEADLINE) -> str:
    """Markdown: one row per run; per headline score the per-seed differences (percentage points),
    their mean and the seeds won against ``reference``."""

    def cells(per_key):
        for key, _ in headline:
            d = per_key.get(key)
            if not d or not d["n"]:
                yield "n/a"
                continue
            seeds = ", ".join(f"s{s} {100 * v:+.1f}" for s, v in zip(d["seeds"], d["diffs"]))
            yield f"{seeds} / **{100 * d['mean']:+.1f}** / {d['wins']} of {d['n']}"

    return ex.markdown_table(
        [f"objective - {reference}", *(f"{label}: per seed / mean / wins" for _, label in headline)],
        ([name, *cells(per_key)] for name, per_key in paired.items()),
    )


def full_loss_flags(flags: Sequence[str]) -> List[str]:
    """``flags`` (a run's ``--loss ...``) with every setting of its loss written out: the value given, else the
    package default (:func:`clip_dcl.experiment.loss_flags`), so that a report says which ``--decl-estimate`` (and
    every other default that may change later) its runs trained with. A cached run is reused only while its
    loss's defaults are unchanged (:func:`clip_dcl.experiment.train_and_evaluate`), so the defaults at report time
    are those it ran with."""
    from clip_dcl.losses import LOSSES
    from clip_dcl.train.flags import build_parser
    from clip_dcl.train.loss_flags import flag_owners

    owners = flag_owners()
    given = vars(build_parser().parse_known_args(list(flags))[0])
    name = given.get("loss") or "clip"
    own = {f.kwarg for f in LOSSES[name].flags}
    settings = {owners[d][1]: v for d, v in given.items() if d in owners and v is not None and owners[d][1] in own}
    return list(ex.loss_flags(name, **settings))


def table_rows(data: dict) -> List[tuple]:
    """The experiment's headline rows plus the retrieval mean R@1."""
    rows = ex.headline_metrics(data)
    return rows[:6] + [(MEAN_R1, "retrieval mean R@1")] + rows[6:]


# ------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------
def time_fewshot(checkpoint: Path, data: dict, fewshot_seeds: Sequence[int]) -> float:
    """Seconds of the few-shot part of :func:`clip_dcl.experiment.evaluate` alone (same arguments)."""
    from clip_dcl.checkpoint import load_checkpoint
    from clip_dcl.eval.fewshot import evaluate_fewshot

    model, preprocess, tokenizer = load_checkpoint(checkpoint)
    t0 = time.perf_counter()
    evaluate_fewshot(
        model,
        preprocess,
        tokenizer,
        Path(data["out_dir"]) / data["fewshot"]["dir"],
        shots=5,
        seeds=tuple(fewshot_seeds),
        grid="reduced",
        batch_size=256,
        progress=False,
    )
    return time.perf_counter() - t0


def build_parser() -> argparse.ArgumentParser:
    p = sweep_parser(
        "quality.py",
        __doc__,
        quick="tiny data, 1 short epoch, seeds 0 1, one ablation",
        num_classes=DEMO_CLASSES,
        train_samples=None,
        train_samples_help="training pairs (default: the demo's data set)",
        epochs_help=f"training epochs (default the demo's {DEMO_BUDGET.epochs}; quick {QUICK_BUDGET.epochs})",
        seeds_help="training seeds (default 0 1 2; quick 0 1)",
    )
    p.add_argument(
        "--ablations",
        nargs="*",
        default=None,
        choices=list(ABLATIONS),
        help=f"DeCL variants (default {' '.join(DEFAULT_ABLATIONS)}; quick: rate=batch)",
    )
    p.add_argument(
        "--ablation-seeds",
        type=int,
        nargs="+",
        default=None,
        help="training seeds of the ablation, among --seeds (default 0)",
    )
    p.add_argument(
        "--ablation-epochs",
        type=int,
        default=None,
        help="training epochs of the ablation (default: the main comparison's); when they differ, the "
        "default decl is trained again at that budget as the ablation's reference",
    )
    add_fewshot_seeds(p)
    p.add_argument(
        "--objectives",
        nargs="+",
        default=None,
        choices=("clip", "dcl", "decl"),
        help="objectives of the main comparison (default: all three; clip is the paired reference)",
    )
    p.add_argument(
        "--eval-threads",
        type=int,
        default=1,
        help="torch threads of the evaluations, which run beside other trainings on a shared machine",
    )
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args, argv = arguments.parse(build_parser(), argv)
    arguments.check_synthetic_data(args.num_classes, args.train_samples)
    arguments.check_at_least(1, epochs=args.epochs, eval_threads=args.eval_threads)
    seeds = args.seeds if args.seeds is not None else ([0, 1] if args.quick else [0, 1, 2])
    arguments.check_seeds(seeds)
    arguments.check_at_least(1, ablation_epochs=args.ablation_epochs)
    ablation_seeds = args.ablation_seeds if args.ablation_seeds is not None else [0]
    arguments.check_seeds(ablation_seeds, "ablation_seeds")
    names = (
        args.ablations if args.ablations is not None else (["rate=batch"] if args.quick else list(DEFAULT_ABLATIONS))
    )
    fewshot_seeds = fewshot_draws(args)
    import torch

    # The evaluations run outside the machine's training lock, beside other trainings: one thread
    # keeps them from fighting a training's thread pool for a small CPU.
    torch.set_num_threads(args.eval_threads)
    base = QUICK_BUDGET if args.quick else DEMO_BUDGET
    budget = dataclasses.replace(base, epochs=args.epochs or base.epochs)
    abl_budget = dataclasses.replace(budget, epochs=args.ablation_epochs or budget.epochs)
    if abl_budget == budget and not set(ablation_seeds) <= set(seeds):
        raise SystemExit(
            f"--ablation-seeds must be among --seeds {seeds} (at the main budget the ablation's "
            f"reference is the main comparison's decl run of the same seed), got {ablation_seeds}"
        )
    work, results_dir = arguments.work_and_results(args, RESULTS)
    command = ex.command_line("quality.py", argv)
    started = datetime.now(timezone.utc)
    t_start = time.perf_counter()

    print(f"[quality] data: {args.num_classes} classes -> {work / 'data'}", flush=True)
    overrides = dict(num_classes=args.num_classes)
    if args.train_samples is not None:
        overrides["train_samples"] = args.train_samples
    # trained as the demo trains: on the training shards packed once into memory
    data = ex.packed_training_set(ex.synth_data(work / "data", quick=args.quick, **overrides))
    main_runs = ex.default_runs(data["tau_plus"])
    decl = next(r for r in main_runs if r.name == DECL)
    if args.objectives:
        main_runs = [r for r in main_runs if r.name in args.objectives]
    try:
        abl_runs = ablation_runs(names, decl)
    except ValueError as e:
        raise SystemExit(f"--ablations: {e}")
    # At another budget than the main comparison's, the ablation trains its own default decl.
    abl_list = abl_runs if abl_budget == budget else [ex.Run(ABL_REF, decl.flags)] + abl_runs

    def settings_of(b: ex.Budget) -> dict:
        doc = {"budget": dataclasses.asdict(b), "data": data["config"], "fewshot_seeds": fewshot_seeds}
        return json.loads(json.dumps(doc))  # as the cache files hold it (tuples become lists)

    settings = settings_of(budget)
    sweep = Sweep(results_dir, data, budget, seeds, fewshot_seeds, command, started, t_start)
    ablation = Ablation(abl_list, abl_budget, ablation_seeds)
    # Every main objective of a seed before the next seed (a partial report compares like with
    # like), then the ablation variants.
    jobs = [(run, seed, budget) for seed in seeds for run in main_runs] + [
        (run, seed, abl_budget) for seed in ablation_seeds for run in abl_list
    ]
    tally = Tally.of(main_runs + abl_list)
    finish_times: List[str] = []
    timing_file = work / "scores" / "fewshot_timing.json"
    timing: dict = {}
    if timing_file.is_file():
        timing = json.loads(timing_file.read_text())
        timing = timing if timing.get("settings") == settings else {}
    for done, (run, seed, job_budget) in enumerate(jobs, 1):
        out = train_job("quality", done, len(jobs), run, seed, job_budget, data, work, fewshot_seeds=fewshot_seeds)
        res, metrics, secs, finished = out.result, out.metrics, out.eval_seconds, out.finished
        if out.source != "reused":
            if not timing:
                # The few-shot probe's share of an evaluation, measured once on this checkpoint.
                timing = {
                    "checkpoint": str(res.checkpoint),
                    "evaluate_seconds": secs,
                    "fewshot_seconds": time_fewshot(res.checkpoint, data, fewshot_seeds),
                    "fewshot_seeds": fewshot_seeds,
                    "torch_threads": args.eval_threads,
                    "settings": settings,
                }
                write_json(timing_file, timing, indent=None)
            shown = with_mean_r1(metrics)
            print(
                f"[quality]     trained {res.seconds:.0f} s, evaluated {secs:.0f} s: "
                + ", ".join(f"{label} {100 * shown[key]:.1f}" for key, label in HEADLINE),
                flush=True,
            )
        tally.add(run.name, res, with_mean_r1(metrics), seed, secs)
        finish_times.append(finished)
        write(sweep, main_runs, ablation, tally, timing, finish_times, complete=(done == len(jobs)))
    print(f"[quality] wrote {results_dir / (STEM + '.md')}, .json, .png", flush=True)
    print((results_dir / f"{STEM}.md").read_text().split("![")[0])
    return 0


@dataclasses.dataclass
class Ablation:
    """The DeCL ablation as trained: its runs (led by the default decl when it trains its own reference), budget
    and training seeds."""

    runs: List[ex.Run]
    budget: ex.Budget
    seeds: List[int]


def write(
    sweep: Sweep, main_runs, ablation: Ablation, tally: Tally, timing: dict, finish_times: List[str], complete: bool
) -> None:
    """(Re)write the report from the runs finished so far."""
    data, budget, seeds, fewshot_seeds = sweep.data, sweep.budget, sweep.seeds, sweep.fewshot_seeds
    abl_runs, abl_budget, ablation_seeds = ablation.runs, ablation.budget, ablation.seeds
    seconds, started = sweep.seconds(), sweep.started
    results, eval_seconds = tally.results, tally.eval_seconds
    have = tally.finished()
    rows = table_rows(data)
    chance = with_mean_r1(ex.chance_levels(data))
    keys = [k for k, _ in HEADLINE]
    main_have = {r.name: have[r.name] for r in main_runs if r.name in have}
    paired_main = paired_differences(main_have, "clip", keys) if "clip" in main_have else {}
    # The ablation's reference: the default decl on the ablation seeds, at the ablation's budget.
    abl_have = {}
    if abl_budget == budget and DECL in have:
        abl_have[ABL_REF] = [s for s in have[DECL] if s["seed"] in ablation_seeds]
    abl_have.update({r.name: have[r.name] for r in abl_runs if r.name in have})
    paired_abl = paired_differences(abl_have, ABL_REF, keys) if len(abl_have) > 1 and ABL_REF in abl_have else {}
    summary = summarize(have, [k for k, _ in rows])
    train_s = sum(r.seconds for rs in results.values() for r in rs)
    eval_s = sum(s for v in eval_seconds.values() for s in v)
    status = ex.run_status(have, complete)
    n_train = data["train"]["num_samples"]
    tau = float(data["tau_plus"])
    if timing:
        fs = (
            f"the 5-shot probe over {len(timing['fewshot_seeds'])} k-shot draw(s) alone took "
            f"{timing['fewshot_seconds']:.1f} s of a {timing['evaluate_seconds']:.1f} s evaluation "
            f"({100 * timing['fewshot_seconds'] / timing['evaluate_seconds']:.0f} %; measured once, "
            f"{timing['torch_threads']} torch thread(s))"
        )
    else:
        fs = "few-shot share not measured (all runs reused)"
    title = f"Quality: clip vs dcl vs decl over {len(seeds)} training seeds, and a DeCL ablation"
    span = f"runs finished {min(finish_times)} to {max(finish_times)}" if finish_times else "no run finished yet"
    header = "\n".join(
        [
            title,
            "",
            *ex.about_lines(
                status=status,
                command=sweep.command,
                date=f"{span} (report written by a call started {started:%Y-%m-%d %H:%M}, {seconds / 60:.1f} min "
                f"wall; runs finished by an earlier call with the same settings are reused). Time over all runs: "
                f"training {train_s / 60:.1f} min, evaluation {eval_s / 60:.1f} min; {fs}. The CPU was shared with "
                "other jobs (trainings take turns through clip_dcl.experiment's machine lock), so times are not speed "
                "measurements.",
            ),
            f"- Data: clip-dcl synthetic shards (the demo's), {data['config']['num_classes']} balanced latent classes, "
            f"measured class prior tau_plus = {tau:.4f}; {n_train} training pairs, {data['val']['num_samples']} "
            f"held-out retrieval images ({data['config']['val_captions_per_image']} captions each), zero-shot over "
            f"the {data['zeroshot']['num_classes']} classes ({data['zeroshot']['num_images']} images), few-shot "
            f"suite {', '.join(data['fewshot']['datasets'])}.",
            f"- Training ({'the demo budget' if budget == DEMO_BUDGET else 'not the demo budget'}): tiny model "
            f"`{budget.model}`, {budget.epochs} epochs, batch "
            f"{budget.batch_size}, lr {budget.lr}, wd {budget.wd}, warmup {budget.warmup}, fp32 CPU, through "
            f"`python -m clip_dcl.train`; training seeds {seeds} on the same data. Evaluation: "
            f"`clip_dcl.experiment.evaluate` (5-shot probe: reduced grid, k-shot draws {fewshot_seeds}).",
            f"- Objectives: `clip` = OpenCLIP's InfoNCE; `dcl` = debiased contrastive loss with tau_plus = {tau:.4g} "
            "(the data's prior); `decl` = DeCL with the package defaults (every loss's full flags, the estimate among "
            "them, are the JSON's `loss_flags`). "
            f"Ablation: one decl setting changed at a time, training seeds {ablation_seeds}, "
            + (
                "against the main comparison's decl run of the same seed (the same training). "
                if abl_budget == budget
                else f"{abl_budget.epochs} epochs (the main comparison's other settings), against the default decl "
                "trained again at that budget and seed. "
            )
            + "With the default lambda 1, "
            "`schedule=harmonic` is lambda_t = 1/t: DeCL's decomposed loss at the first steps, then almost pure "
            "InfoNCE.",
            "- Sizing: the main comparison runs at the demo's own budget, not a larger one: at about 200 s a "
            "training alone on this 2-core CPU, nine trainings already take half an hour; the ablation is sized "
            "down to one seed (and, with --ablation-epochs, fewer epochs) to fit. Read one-seed ablation "
            "differences against the decl seed spread given with its table.",
            f"- Raw numbers per seed, commands, curves: `{STEM}.json`; figure: `{STEM}.png`.",
        ]
    )
    sweep.write_report(
        STEM,
        tally,
        header,
        {
            "ablation_seeds": ablation_seeds,
            "ablation_budget": dataclasses.asdict(abl_budget),
            "fewshot_seeds": fewshot_seeds,
            "complete": complete,
            "wall_minutes_of_this_call": seconds / 60,
            "train_minutes": train_s / 60,
            "eval_minutes": eval_s / 60,
            "finished": finish_times,
            "loss_flags": {r.name: full_loss_flags(r.flags) for r in [*main_runs, *abl_runs] if r.name in have},
            "fewshot_timing": {k: v for k, v in timing.items() if k != "settings"},
            "eval_seconds": {n: eval_seconds[n] for n in have},
            "summary": summary,
            "paired_vs_clip": paired_main,
            "paired_vs_default_decl": paired_abl,
        },
    )
    main_table = ex.comparison_table(main_have, rows, chance) if main_have else "(no run finished yet)"
    parts = [
        header,
        f"## Main comparison (%, mean ± sample std over training seeds {seeds}; best mean in bold)",
        main_table,
        "## Paired comparison against clip (percentage points, objective minus clip on the same seed)",
        paired_table(paired_main, "clip") if paired_main else "(clip and another objective needed)",
    ]
    if abl_runs:
        decl_spread = summary.get(DECL, {})
        spread = ", ".join(
            f"{label} {100 * decl_spread[k]['std']:.1f}"
            for k, label in HEADLINE
            if k in decl_spread and decl_spread[k]["n"] > 1
        )
        parts += [
            f"## DeCL ablation (%, {abl_budget.epochs} epochs, training seed(s) {ablation_seeds}; best in bold)",
            (
                f"Seed-to-seed spread of the default decl in the main comparison ({budget.epochs} epochs; sample "
                f"std, points): {spread}; an ablation difference smaller than that is within the seed noise."
                if spread
                else ""
            ),
            ex.comparison_table(abl_have, rows, chance) if len(abl_have) > 1 else "(no ablation run finished yet)",
            "### Paired against the default decl (percentage points, same seed)",
            paired_table(paired_abl, ABL_REF) if paired_abl else "(no ablation run finished yet)",
        ]
    parts.append(f"![training curves, validation R@1 and held-out scores]({STEM}.png)")
    ex.Report(sweep.out, STEM, sweep.command).write("# " + "\n\n".join(p for p in parts if p))


# ------------------------------------------------------------------------------------------
# The README's numbers (benchmarks/quotes.py)
# ------------------------------------------------------------------------------------------
#: A difference below this (a fraction; one point of R@1 on 1,000 images) is a tie (shared/spec/evidence.md).
RESOLUTION = 0.01


def decl_estimate(doc: dict, name: str = DECL) -> str:
    """Which estimate ``name`` ran with: from its full flags, else from the note added to an older JSON."""
    flags = doc.get("loss_flags", {}).get(name)
    if flags and "--decl-estimate" in flags:
        return f"`--decl-estimate {flags[flags.index('--decl-estimate') + 1]}`"
    note = doc.get("decl_estimate", {})
    if name in note:
        return f"the {note[name]} estimate (not recorded by the run; from git history, see the JSON)"
    return "an estimate the run did not record"


def readme_block(doc: dict) -> str:
    """The README's table: headline scores (mean ± std) and the paired differences against clip, differences below
    the evaluation's resolution counted as ties."""
    s, paired, c = doc["summary"], doc["paired_vs_clip"], doc["data"]["config"]
    names = list(doc["runs"])
    lines = [
        f"Held-out split of the demo's synthetic data ({c['num_classes']} classes, {c['val_samples']} retrieval "
        f"images), `{doc['budget']['model']}`, {doc['budget']['epochs']} epochs at batch "
        f"{doc['budget']['batch_size']}, "
        f"seeds {', '.join(map(str, doc['seeds']))}; `{DECL}` ran with {decl_estimate(doc)}. %, mean ± sample std:",
        "",
        "| objective | " + " | ".join(label for _, label in HEADLINE) + " |",
        "|---|" + "---:|" * len(HEADLINE),
    ]
    for n in names:
        lines.append(f"| `{n}` | " + " | ".join(ex.format_mean_std(s[n][k]) for k, _ in HEADLINE) + " |")
    lines += [
        "",
        f"Paired by seed against `clip` (points; a difference below {100 * RESOLUTION:.0f} point is a tie):",
        "",
        "| objective - clip | " + " | ".join(label for _, label in HEADLINE) + " |",
        "|---|" + "---|" * len(HEADLINE),
    ]
    for n, per_key in paired.items():
        cells = []
        for k, _ in HEADLINE:
            d = per_key[k]["diffs"]
            up, down = sum(x >= RESOLUTION for x in d), sum(x <= -RESOLUTION for x in d)
            mean = per_key[k]["mean"]
            cells.append(
                f"{100 * mean:+.1f}{' (tie)' if abs(mean) < RESOLUTION else ''}; "
                f"per seed {', '.join(f'{100 * x:+.1f}' for x in d)}: {up} above, {down} below, "
                f"{len(d) - up - down} tied"
            )
        lines.append(f"| `{n}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
