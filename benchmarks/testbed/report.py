"""The batch-size testbed's reports: ``batch_size.md`` (the verdicts, the controls, both splits' scores),
``dcl_screen.md`` and ``dcl_sweep.md``, each with its JSON, from the runs' records.
"""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence

from clip_dcl.experiment import reporting
from clip_dcl.experiment.figures import pyplot, save_figure
from clip_dcl.experiment.runner import Budget
from clip_dcl.experiment.scoring import MEAN_R1
from clip_dcl.experiment.stats import format_mean_std, mean_std, t_interval, wins
from clip_dcl.paths import write_json

from .objectives import (
    ARCHIVE,
    DCL_DEFAULT,
    DCL_VARIANTS,
    DECL_VARIANTS,
    HEADLINE,
    RESULTS,
    SCREEN16_SIZE,
    SCREEN16_VARIANTS,
    SCREEN_BATCH_SIZES,
    archived_runs,
    control_objectives,
    objectives,
    screen_objectives,
)
from .rule import (
    CONFIDENCE,
    DCL_RULE,
    DCL_SWEEP_SIZES,
    DCL_SWEEP_VARIANTS,
    RESOLUTION,
    RULE,
    SEED_CAP,
    beat_verdict,
    clearance,
    dcl_bias_rows,
    dcl_default_rows,
    dcl_sweep_decision,
    dcl_sweep_rows,
    draw_rows,
    gate,
    per_seed,
    plateau,
    screen16_choice,
    screen16_rows,
    verdicts,
)


def verdict_table(rows: List[dict], who: str = "decl default") -> str:
    """Markdown: one row per batch size and comparison of ``who``, with the split, seeds, interval, how far the
    interval clears its threshold (:func:`clearance`) and the verdict."""
    lines = [
        f"| B | {who} against | split | seeds | per-seed differences (points) | mean | "
        f"{100 * CONFIDENCE:.0f} % interval | threshold | interval clears it by (points) | verdict |",
        "|---:|---|---|---:|---|---:|---|---:|---:|---|",
    ]
    for r in rows:
        if not r["n"]:
            lines.append(f"| {r['batch_size']} | {r['against']} | - | 0 | - | - | - | - | - | not run |")
            continue
        threshold = -r["gain"] / 2 if r["kind"] == "reach" else 0.0
        interval = "-" if r["n"] < 2 else f"[{100 * r['lo']:+.1f}, {100 * r['hi']:+.1f}]"
        clear = clearance(r)
        clear = "-" if clear is None else f"{100 * clear:+.2f}"
        verdict = f"**{r['verdict']}**" if r["split"] == "test" else f"none (the rule would read: {r['verdict']})"
        lines.append(
            f"| {r['batch_size']} | {r['against']} | {r['split']} | {r['n']} | "
            + ", ".join(f"s{s} {100 * d:+.1f}" for s, d in zip(r["seeds"], r["diffs"]))
            + f" | {100 * r['mean']:+.1f} | {interval} | {100 * threshold:+.1f} | {clear} | {verdict} |"
        )
    return "\n".join(lines)


def progress(
    records: List[dict],
    sizes: Sequence[int],
    screen_sizes: Sequence[int] = SCREEN_BATCH_SIZES,
    screen_seed: int = 0,
    seeds: int = 3,
) -> str:
    """Where the three stages stand, from the finished runs: the gate's verdict, the screen's runs
    (every objective but ``clip`` at ``screen_sizes``, one seed) and the sweep's objectives (runs of
    the other objectives beyond the screen; complete for those with ``seeds`` seeds at every batch
    size below the largest)."""
    g = gate(records, sizes)
    done = {(r["label"], r["batch_size"], r["seed"]) for r in records}
    screen = [(lab, b, screen_seed) for lab in screen_objectives() if lab != "clip" for b in screen_sizes]
    swept = [
        lab
        for lab in screen_objectives()
        if lab != "clip"
        and all(len({s for (l2, b2, s) in done if l2 == lab and b2 == b}) >= seeds for b in sorted(sizes)[:-1])
    ]
    missing = sorted({lab for lab, b, s in screen if (lab, b, s) not in done})
    beyond = [j for j in done if j[0] != "clip" and (j[2] != screen_seed or j[1] not in screen_sizes)]
    return (
        f"gate {'passed' if g and g['passed'] else 'not yet measured'} (clip at every batch size, {seeds} seeds); "
        f"screen {sum(j in done for j in screen)} of {len(screen)} runs"
        + (f" (not yet: {', '.join(missing)})" if missing else "")
        + f"; sweep: {len(beyond)} runs beyond the screen"
        + (f", complete for {', '.join(swept)}" if swept else "")
    )


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
    head = (
        "| objective | batch | "
        + " | ".join(lab for _, lab in HEADLINE)
        + " | logit scale at the end | val R@1 change over the last fifth (points) | seeds |"
    )
    lines = [head, "|" + "---|" * (len(HEADLINE) + 5)]
    for (label, b), rs in sorted(
        groups.items(),
        key=lambda kv: (list(objectives()).index(kv[0][0]) if kv[0][0] in objectives() else 99, kv[0][1]),
    ):
        cells = [format_mean_std(mean_std([r[key].get(metric) for r in rs])) for metric, _ in HEADLINE]
        scales = ", ".join(fixed_scale(r) or f"{r['logit_scale'][-1]:.1f}" for r in rs if r["logit_scale"])
        plateaus = ", ".join(f"{p:+.1f}" for p in (plateau(r["val_r1"]) for r in rs) if p is not None) or "n/a"
        lines.append(
            f"| {label} | {b} | "
            + " | ".join(cells)
            + f" | {scales} | {plateaus} | "
            + ", ".join(str(r["seed"]) for r in rs)
            + " |"
        )
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
            diffs = [
                (s, idx[(label, b, s)] - idx[(reference, other, s)])
                for (lab, bb, s) in idx
                if lab == label and bb == b and (reference, other, s) in idx
            ]
            if not diffs:
                continue
            st = wins([d for _, d in diffs])
            rows.append(
                f"| {label} | {b} | {reference} at {other} | "
                + ", ".join(f"s{s} {100 * d:+.1f}" for s, d in sorted(diffs))
                + f" | **{100 * st['mean']:+.1f}** | {st['wins']} of {st['n']} |"
            )
    if not rows:
        return ""
    return "\n".join(
        [
            "| objective | batch | against | R@1 difference per seed (points) | mean | wins |",
            "|---|---|---|---|---|---|",
            *rows,
        ]
    )


def plot(records: List[dict], path: Path) -> Optional[Path]:
    if not records:
        return None
    fig, axes = pyplot().subplots(1, 3, figsize=(17, 4.6))
    present = {r["label"] for r in records}  # objectives first, in their order; then names no longer among them
    labels = [lab for lab in objectives() if lab in present] + sorted(present - set(objectives()))
    colour = {lab: f"C{i % 10}" for i, lab in enumerate(labels)}  # one colour per objective in every panel
    # colour: the objective; line style: the batch size, one style per size of the grid (6)
    dashes = ("-", "--", ":", "-.", (0, (6, 1, 1, 1, 1, 1)), (0, (1, 3)))
    styles = {b: dashes[i % len(dashes)] for i, b in enumerate(sorted({r["batch_size"] for r in records}))}
    for label in labels:
        rs = [r for r in records if r["label"] == label]
        bs = sorted({r["batch_size"] for r in rs})
        stats = [mean_std([r["metrics"][MEAN_R1] for r in rs if r["batch_size"] == b]) for b in bs]
        axes[0].errorbar(
            bs,
            [100 * s["mean"] for s in stats],
            yerr=[100 * (s["std"] if s["n"] > 1 else 0.0) for s in stats],
            marker="o",
            capsize=3,
            label=label,
            color=colour[label],
        )
    axes[0].set(xscale="log", xlabel="batch size", ylabel="%", title="held-out retrieval mean R@1")
    axes[0].set_xscale("log", base=2)
    # the curves: by batch size when one objective is drawn (the gate), else by objective; a legend
    # entry per objective and batch size, the seeds sharing it
    by_batch = {b: f"C{i % 10}" for i, b in enumerate(sorted({r["batch_size"] for r in records}))}
    named = set()
    for r in sorted(records, key=lambda r: (r["label"], r["batch_size"], r["seed"])):
        if r["label"] == "clip" or r["batch_size"] == min(x["batch_size"] for x in records):
            key = (r["label"], r["batch_size"])
            style = dict(
                lw=1,
                color=by_batch[r["batch_size"]] if len(labels) == 1 else colour[r["label"]],
                ls=styles[r["batch_size"]],
                label=None if key in named else f"{r['label']} B={r['batch_size']}",
            )
            named.add(key)
            axes[1].plot(range(1, len(r["val_r1"]) + 1), [100 * v for v in r["val_r1"]], **style)
            axes[2].plot(range(1, len(r["logit_scale"]) + 1), r["logit_scale"], **style)
    axes[1].set(xlabel="epoch", ylabel="%", title="validation mean R@1 per epoch (plateau)")
    axes[2].set(xlabel="epoch", ylabel="logit scale", title="logit scale per epoch (clamp at 100)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    return save_figure(fig, path, "Batch-size testbed (clip-dcl-micro, 48 classes, 32 px)")


def decisive_status(rows: List[dict]) -> str:
    """Where the verdicts stand: per batch size, the reach verdict with its split and seeds."""
    return "; ".join(
        f"B = {r['batch_size']}: {r['verdict']} ({r['n']} test-split seeds"
        + (f", the cap of {SEED_CAP} reached" if r["n"] >= SEED_CAP else "")
        + ")"
        for r in rows
        if r["kind"] == "reach" and r["split"] == "test"
    )


def code_checks_line(commits: Sequence[str], folder: Path = RESULTS) -> str:
    """What the code checks (``code_check.py``, ``results/code_check*.json``) say of the commits the runs came
    from: for each check, whether short runs of the earlier commit and a later one train to the same bits."""
    said = []
    for path in sorted(folder.glob("code_check*.json")):
        doc = json.loads(path.read_text())
        for check in doc["checks"]:
            old, new = next(iter(check["objectives"].values()))["commits"]
            if any(c[:7] in (old[:7], new[:7]) for c in commits):
                said.append(
                    f"{old} and {new} train {', '.join(f'`{o}`' for o in check['objectives'])} at "
                    f"B = {doc['batch_size']}, seed {doc['seed']}, {doc['epochs']} epochs "
                    + (
                        "to the same bits (data files, the loss at every logged step, validation and test scores)"
                        if check["identical"]
                        else f"**differently**: rerun the runs of {old}"
                    )
                    + f" ([{path.stem}.md]({path.stem}.md))"
                )
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
            lines.append(
                f"| {label} | {ref} at {other} | {st['n']} | "
                + ", ".join(f"s{s} {100 * (idx[(label, b, s)] - idx[(ref, other, s)]):+.1f}" for s in seeds)
                + f" | {100 * st['mean']:+.1f} | {interval} | {beat_verdict(st)} |"
            )
    if not lines:
        return ""
    return "\n".join(
        [
            f"| control | against | seeds | per-seed differences (points) | mean | "
            f"{100 * CONFIDENCE:.0f} % interval | verdict (the rule's beats / trails / tie) |",
            "|---|---|---:|---|---:|---|---|",
            *lines,
        ]
    )


def dcl_default_table(rows: List[dict]) -> str:
    """Markdown: :func:`dcl_default_rows`, one line per split that has runs."""
    lines = [
        f"| `{DCL_DEFAULT}` - `clip` at B = {r['batch_size']} | {r['split']} | {r['n']} | "
        + ", ".join(f"s{s} {100 * d:+.1f}" for s, d in zip(r["seeds"], r["diffs"]))
        + f" | {100 * r['mean']:+.1f} | "
        + ("-" if r["n"] < 2 else f"[{100 * r['lo']:+.1f}, {100 * r['hi']:+.1f}]")
        + f" | {r['verdict']} |"
        for r in rows
        if r["n"]
    ]
    if not lines:
        return ""
    return "\n".join(
        [
            f"| comparison | split | seeds | per-seed differences (points) | mean | "
            f"{100 * CONFIDENCE:.0f} % interval | reading |",
            "|---|---|---:|---|---:|---|---|",
            *lines,
        ]
    )


class Inputs(NamedTuple):
    """What the ``dcl`` screen's and sweep's reports are written from: the folder, the finished runs' records and
    how many were planned, the data (its config and class prior), the budget, the command, when the call started,
    the reports' file stem, and the machine (this one unless given: a report written again from its JSON)."""

    out: Path
    records: List[dict]
    planned: int
    data: dict
    budget: Budget
    command: str
    started: datetime
    stem: str
    machine: Optional[str] = None

    def status(self) -> str:
        """ "complete", or how many of the planned runs have finished."""
        n = len(self.records)
        return "complete" if n == self.planned else f"PARTIAL: {n} of {self.planned} planned runs"

    def about(self, status: str) -> List[str]:
        """The report's opening lines (`reporting.about_lines`): machine, status, command, when its runs
        finished and when this call started."""
        done = sorted(r.get("finished", "") for r in self.records) or ["-"]
        return reporting.about_lines(
            machine=self.machine,
            status=status,
            command=self.command,
            date=f"runs finished {done[0]} to {done[-1]}; report written by a call started "
            f"{self.started:%Y-%m-%d %H:%M}.",
        )

    def publish(self, parts: List[str], status: str, **fields) -> None:
        """Write ``stem``.md (``parts``, a line each) and ``stem``.json: the machine, the command and ``status``,
        then ``fields`` in their order."""
        doc = {"machine": self.machine or reporting.machine_info(), "command": self.command, "status": status}
        (self.out / f"{self.stem}.md").write_text("\n".join(parts) + "\n")
        write_json(self.out / f"{self.stem}.json", {**doc, **fields}, default=str)


def write_dcl_screen(run: Inputs) -> None:
    """The ``dcl`` screen's report: validation-split scores of every setting and its difference from ``clip``
    at the same batch and seed (the split the defaults are chosen on)."""
    out, records, data, budget = run.out, run.records, run.data, run.budget
    out.mkdir(parents=True, exist_ok=True)
    status = run.status()
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
                rows.append(
                    f"| {label} | {b} | {seed} | {100 * idx[(label, b, seed)]:.1f} | "
                    + ("-" if clip is None else f"{100 * (idx[(label, b, seed)] - clip):+.1f}")
                    + f" | {'-' if bar is None else f'{100 * bar:.1f}'} | {'yes' if ok else 'no'}"
                    + f" | {'-' if clamp is None else f'{clamp:.2f}'} |"
                )
    parts = [
        "# The `dcl` screen on the testbed (validation split)",
        "",
        *run.about(status),
        f"- Code: commit(s) {', '.join(sorted({r.get('commit', 'unrecorded') for r in records}))}.",
        f"- Data and training: as [`batch_size.md`](batch_size.md) ({budget.epochs} epochs, `{budget.model}`); "
        "**every score here is on the validation split**, the split defaults are chosen on.",
        "- Settings (each one away from the package default, `dcl top tau+ 0.021` one away from "
        "`dcl tau+ 0.021`; every flag written out):",
        *[
            f"  - `{name}`: `{' '.join(objectives()[name])}`"
            for name in DCL_VARIANTS
            if any(r["label"] == name for r in records)
        ],
        "- **The screen's bar**: a setting goes on to the sweep when its score is at least `clip`'s lowest over "
        "the validation sweep's seeds at the same batch (within the seeds' noise, or above). The bar was written "
        "after the runs had started"
        + (f"; the closest setting ends {100 * -max(gaps):.1f} points below it" if gaps and max(gaps) < 0 else "")
        + ". The default follows the sweep's "
        "rule (docs/results.md); with no setting through, `dcl`'s default is `tau_plus` 0, InfoNCE exactly.",
        f"- **Through the screen**: {', '.join(passing) if passing else 'none'}.",
        "",
        "| setting | B | seed | retrieval mean R@1 | minus `clip` (same B and seed) | bar: `clip`'s lowest seed "
        "| through | clamp rate, last fifth of training |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
        *rows,
        "",
        "## Scores (validation split)",
        "",
        table(records),
    ]
    run.publish(
        parts,
        status,
        split="validation",
        passing=passing,
        bars={str(b): v for b, v in floor.items()},
        budget=dataclasses.asdict(budget),
        data=data["config"],
        objectives=objectives(),
        runs=records,
    )


def _seeds(n: int) -> str:
    return f"{n} seed{'' if n == 1 else 's'}"


def _interval(st: dict) -> str:
    """``+m [+lo, +hi]`` in points (the interval only from two values up); ``-`` without values."""
    if not st["n"]:
        return "-"
    return f"{100 * st['mean']:+.1f}" + (f" [{100 * st['lo']:+.1f}, {100 * st['hi']:+.1f}]" if st["n"] >= 2 else "")


def write_dcl_sweep(
    run: Inputs,
    labels: Sequence[str] = DCL_SWEEP_VARIANTS,
    gathered: Optional[int] = None,
    results: Path = RESULTS,
) -> None:
    """The ``dcl`` sweep's report: per setting and batch size its paired difference from ``clip`` on the test
    split with the rule's reading (:data:`DCL_RULE`), the sampling-bias data's zero-shot differences (the
    reports in ``results``), and the default the rule picks (``gathered``: the number of finished runs a
    report-only call read, for the status)."""
    out, records, data, budget = run.out, run.records, run.data, run.budget
    out.mkdir(parents=True, exist_ok=True)
    status = run.status() if gathered is None else f"{gathered} finished runs gathered from the cache (stage dcl-sweep)"
    rows = dcl_sweep_rows(records, labels)
    commits = sorted({r.get("commit", "unrecorded") for r in records})
    bias = dcl_bias_rows(results)
    decision = dcl_sweep_decision(rows, bias, labels)
    said = []
    for label, d in decision["settings"].items():
        why = (
            "passes"
            if d["passes"]
            else f"fails: trails `clip` at B = {', '.join(map(str, d['trails_at']))}"
            if d["trails_at"]
            else f"no reading yet at B = {', '.join(map(str, d['missing']))}"
        )
        if d["trails_at"] and d["missing"]:
            why += f" (no reading yet at B = {', '.join(map(str, d['missing']))})"
        said.append(f"`{label}` {why}")
    verdict = (
        "; ".join(said)
        + ". "
        + (
            f"The rule's default: `{decision['default']}`."
            if decision["default"]
            else "No setting passes yet."
            if decision["waiting"]
            else "No setting passes: `dcl`'s default stays `tau_plus` 0 (InfoNCE exactly)."
        )
    )
    table_rows = [
        [
            f"`{r['label']}`",
            r["batch_size"],
            r["test_r1"]["n"],
            ", ".join(f"s{s} {100 * d:+.1f}" for s, d in zip(r["test_r1"]["seeds"], r["test_r1"]["diffs"])),
            _interval(r["test_r1"]),
            f"**{r['reading']}**",
            _interval(r["test_zeroshot"]),
            "-" if not r["validation_r1"]["n"] else f"{100 * r['validation_r1']['mean']:+.1f}",
            "-" if r["clamp_rate"] is None else f"{r['clamp_rate']:.2f}",
        ]
        for r in rows
    ]
    bias_rows = [
        [
            f"`{r['label']}`",
            r["classes"],
            f"{r['true_tau_plus']:.3g}",
            r["n"],
            ", ".join(f"s{s} {100 * d:+.1f}" for s, d in zip(r["seeds"], r["diffs"])),
            _interval(r),
        ]
        for r in bias
    ]
    parts = [
        "# The `dcl` sweep on the testbed (test split)",
        "",
        *run.about(status),
        f"- Code: commit(s) {', '.join(commits)} (each run's own in the JSON)." + code_checks_line(commits),
        f"- Data and training: as [`batch_size.md`](batch_size.md) ({budget.epochs} epochs, `{budget.model}`, "
        f"true prior {float(data['tau_plus']):.3f}). **The rule reads the test split**; the settings swept are "
        "those through the screen on the validation split ([`dcl_screen.md`](dcl_screen.md)).",
        "- Settings (every flag written out):",
        *[f"  - `{name}`: `{' '.join(objectives()[name])}`" for name in labels],
        f"- **The rule**: {DCL_RULE}",
        f"- **Verdict**: {verdict}",
        "",
        f"## Against `clip` at the same batch (test split, points, paired by seed; {100 * CONFIDENCE:.0f} % "
        "t-interval)",
        "",
        reporting.markdown_table(
            [
                "setting",
                "B",
                "seeds",
                "per-seed R@1 differences",
                "mean R@1 [interval]",
                "reading",
                "zero-shot top-1 [interval]",
                "validation R@1 (context)",
                "clamp rate, last fifth of training",
            ],
            table_rows,
            "lrrllllrr",
        ),
        "",
        "## Zero-shot on the sampling-bias data (held-out split, points, minus `clip`, paired by seed)",
        "",
        (
            "Each report: `benchmarks/sampling_bias.py --stem sampling_bias_dcl_<C>classes` (2 epochs at B = 128; "
            "its own JSON has every run's flags). The oracle drops same-class negatives using the true labels.\n\n"
            + reporting.markdown_table(
                ["objective", "classes", "true prior", "seeds", "per-seed differences", "mean [interval]"],
                bias_rows,
                "lrrrll",
            )
        )
        if bias_rows
        else "Not run yet (`benchmarks/sampling_bias.py --stem sampling_bias_dcl_4classes`, and with `--num-classes "
        "10`).",
        "",
        "## Scores on the test split (%, mean ± sample std over seeds)",
        "",
        table(records, "test_metrics"),
        "",
        "## Scores on the validation split (context)",
        "",
        table(records),
    ]
    run.publish(
        parts,
        status,
        split="test",
        confidence=CONFIDENCE,
        rule=DCL_RULE,
        sizes=list(DCL_SWEEP_SIZES),
        rows=rows,
        sampling_bias=bias,
        decision=decision,
        budget=dataclasses.asdict(budget),
        data=data["config"],
        objectives={n: objectives()[n] for n in labels},
        runs=records,
    )


def write(
    out: Path,
    records: List[dict],
    planned: int,
    data: dict,
    budget: Budget,
    command: str,
    started: datetime,
    stages: Sequence[str],
    sizes: Sequence[int],
    stem: str = "batch_size",
    draws: Optional[Dict[int, List[dict]]] = None,
    machine: Optional[str] = None,
) -> None:
    """The report of this call's runs: the splits, the rule, the verdicts (test split; B = 16 from the archived
    validation sweep), the verdicts on other draws of the data (``draws``: their finished runs by data seed), the
    temperature controls and both splits' scores; ``{stem}.json`` holds the numbers the docs quote
    (:func:`readme_block`)."""
    if list(stages) == ["dcl-screen"]:
        return write_dcl_screen(Inputs(out, records, planned, data, budget, command, started, stem))
    if list(stages) == ["dcl-sweep"]:
        return write_dcl_sweep(Inputs(out, records, planned, data, budget, command, started, stem))
    out.mkdir(parents=True, exist_ok=True)
    rows = verdicts(records, archived_runs(data["config"]))
    if list(stages) == ["report of finished runs"]:
        status = f"{len(records)} finished runs gathered from the cache (each run's command and commit in the JSON)"
    else:
        status = (
            "complete" if len(records) == planned else f"PARTIAL: {len(records)} of {planned} planned runs"
        ) + f" (stages: {', '.join(stages)}; finished runs are reused by later calls)"
    status += "; verdicts: " + decisive_status(rows)
    finished = sorted(r.get("finished", "") for r in records)
    train_min = sum(r["train_seconds"] for r in records) / 60
    cfg = data["config"]
    commits = sorted({r.get("commit", "unrecorded") for r in records})
    splits = {
        "train": cfg["train_samples"],
        "validation": cfg["val_samples"],
        "test": cfg.get("test_samples", 0),
        "captions_per_image": cfg["val_captions_per_image"],
        "zeroshot_per_class": cfg["zeroshot_per_class"],
    }
    parts = [
        "# Batch size on the testbed: DeCL at B against InfoNCE at B and 2B",
        "",
        *reporting.about_lines(
            machine=machine,
            status=status,
            command=command,
            date=f"runs finished {finished[0] if finished else '-'} to {finished[-1] if finished else '-'}; this "
            f"report written by a call started {started:%Y-%m-%d %H:%M}. Training time over the runs: "
            f"{train_min:.0f} min.",
        ),
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
        *[
            f"  - `{name}`: `{' '.join(flags)}`"
            for name, flags in objectives().items()
            if any(r["label"] == name for r in records)
        ],
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
    again = [
        (r["metrics"][MEAN_R1], archived[key])
        for r in records
        if (key := (r["label"], r["batch_size"], r["seed"])) in archived
    ]
    if again:
        same = sum(abs(a - b) < 5e-5 for a, b in again)
        parts += [
            "",
            f"Reproduction: {same} of {len(again)} runs trained again here score on the validation split "
            "what the validation sweep's run of the same objective, batch and seed scored (to 0.01 point): "
            "training is deterministic on this CPU, so the sweep's models are these models.",
        ]
    again_rows = draw_rows(draws or {})
    parts += ["", "## The decisive comparison on another draw of the data (test split)", ""]
    if again_rows:
        parts += [
            f"The same recipe with `clip-dcl data synth --seed {', '.join(map(str, sorted(draws)))}`: other "
            "training, validation and test images, the same rule. A verdict that holds on one draw only is "
            "reported as such.",
            "",
            verdict_table(again_rows),
        ]
    else:
        parts += ["Not run yet (`--data-seed 1`: the same recipe, other images)."]
    controls = controls_table(records)
    if controls:
        parts += [
            "",
            "## Temperature controls (test split, paired by seed)",
            "",
            "`clip at decl's scale`: InfoNCE with the logit scale fixed at the final scale of `decl default` "
            "in the validation sweep; `decl at clip's scale`: `decl default` with its scale fixed at `clip`'s. "
            "Each changes only the temperature of one arm.",
            "",
            controls,
        ]
    idx_val = per_seed(records, "metrics")
    s16 = [
        f"| {name} | {seed} | {100 * v:.1f} | {100 * (v - idx_val[('decl default', b, seed)]):+.1f} |"
        for (name, b, seed), v in sorted(idx_val.items())
        if name in SCREEN16_VARIANTS and ("decl default", b, seed) in idx_val
    ]
    choice = screen16_choice(records)
    rows16 = screen16_rows(records, choice["best"])
    if s16:
        parts += [
            "",
            f"## DeCL at B = {SCREEN16_SIZE}: the screen (validation split)",
            "",
            "Each variant changes one setting of the package default; the best goes on to the test split.",
            "",
            "| variant | seed | retrieval mean R@1 | minus `decl default` |",
            "|---|---:|---:|---:|",
            *s16,
            "",
        ]
        if any("decl schedule constant |" in row for row in s16):
            parts += [
                "`decl schedule constant` runs at `--decl-lambda 1` (the default), which is the `decl` schedule "
                "exactly: loss1 on every step, so under the default temperature mode (`infonce`) no step trains "
                "the logit scale and it keeps its initial value (the two runs score alike; the loss warns of "
                "this combination since). `decl schedule constant 0.5` mixes the two terms evenly.",
                "",
            ]
        if choice["missing"]:
            parts.append(
                "The screen is not complete (not yet run: "
                + ", ".join(f"`{n}`" for n in choice["missing"])
                + "), so no variant is chosen."
            )
        elif not rows16:
            parts.append(
                "No variant scores above the package default on the validation split: none goes on, and "
                f"B = {SCREEN16_SIZE}'s verdicts are the package default's, above."
            )
        else:
            best = choice["best"]
            parts += [
                f"The best on the validation split, `{best}`, on the test split by the same rule "
                f"(`--stage screen16-test`; the seeds its runs have):",
                "",
                verdict_table(rows16, who=best),
            ]
    dcl_rows = dcl_default_rows(records)
    dcl_table = dcl_default_table(dcl_rows)
    if dcl_table:
        parts += [
            "",
            "## `--loss dcl` with no other loss flag, against `clip` (paired by seed)",
            "",
            f"`{DCL_DEFAULT}` runs `python -m clip_dcl.train --loss dcl` with no other loss flag, so the "
            "package defaults of the commit in its record. **Trails** when the interval lies below zero, "
            "**within the seeds' noise** when it holds zero, **above** when it lies above zero; the test "
            "split is the check, the validation split context.",
            "",
            dcl_table,
        ]
    earlier = [r for r in records if r["label"] in screen_objectives()]
    g = gate(earlier, sizes)
    same, double = paired(earlier, "clip"), paired(earlier, "clip", same_b=False)
    variants = paired(earlier, "decl absolute", prefix="decl ")
    if any(x for x in (g, variants)) or any(r["label"] not in ("clip", "decl default") for r in earlier):
        parts += [
            "",
            "## The gate, screen and sweep stages of these runs (validation split: where choices are made)",
            "",
            f"- Where they stand: {progress(earlier, sizes)}.",
        ]
        if g:
            parts.append(
                f"- Gate: clip at {g['large']} minus clip at {g['small']}: {100 * g['gain']:+.1f} points of mean "
                f"R@1, seeds {'separate' if g['separate'] else 'overlapping'}: "
                f"**{'passed' if g['passed'] else 'not passed'}**."
            )
        for title, body in (
            ("Against clip at the same batch", same),
            ("Against clip at twice the batch", double),
            ("DeCL variants against the screen's base, the absolute estimate", variants),
        ):
            if body:
                parts += ["", f"### {title} (paired by seed)", "", body]
    if any(r.get("test_metrics") for r in records):
        parts += [
            "",
            "## Scores on the test split (%, mean ± sample std over seeds)",
            "",
            table(records, key="test_metrics"),
        ]
    parts += ["", "## Scores on the validation split (%, mean ± sample std over seeds)", "", table(records)]
    png = plot(records, out / f"{stem}.png")
    if png is not None:
        parts += ["", f"![R@1 against the batch size, validation curves and logit scale]({png.name})"]
    Inputs(out, records, planned, data, budget, command, started, stem, machine).publish(
        parts,
        status,
        budget=dataclasses.asdict(budget),
        data=cfg,
        splits=splits,
        rule=RULE,
        confidence=CONFIDENCE,
        resolution=RESOLUTION,
        seed_cap=SEED_CAP,
        gate=gate(records, sizes),
        verdicts=rows,
        draws=again_rows,
        dcl_default=dcl_rows,
        screen16={**choice, "verdicts": rows16},
        objectives=objectives(),
        runs=records,
    )
