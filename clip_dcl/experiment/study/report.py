"""A study's report, ``STUDY.md``, ``STUDY.json`` and ``STUDY.png``: per comparison the paired differences per
seed, their interval and the verdict by the plan's rule with its reason in words, in points.

Verdicts come only from a complete look, and the test split is read only then (an exploratory plan reads
the validation split only); before, the report shows the validation split's differences, never a verdict.
Runs of different recipes or hardware are paired only where the plan's ``pair_across`` says so.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ...paths import shown_text
from ..figures import pyplot, save_figure
from ..reporting import Report, git, markdown_table
from ..stats import t_interval
from . import attempts as A
from . import work as W
from .plan import Comparison, Plan, PlanError
from .power import planned_power
from .rule import _pt, judge, reason
from .seal import check_seal

RULE_TEXT = {
    "beats": "**beats**: the interval lies above zero and the mean exceeds the resolution ({res}); **trails**: the "
    "mirror image; an interval on one side of zero whose mean is inside the resolution is a **tie**; an "
    "interval across zero gives **no verdict**",
    "reaches": "**reaches**: the interval lies above minus the margin; **does not reach**: it lies below; otherwise "
    "**no verdict**",
    "matches": "**matches**: the interval lies inside plus or minus the margin; **differs**: it lies wholly "
    "outside; otherwise **no verdict**",
}


def plan_committed(plan: Plan, commit: Optional[str]) -> Optional[str]:
    """When (UTC, ``YYYY-MM-DD HH:MM:SS``) the plan file was last committed at or before ``commit`` (the seal's),
    provided the file committed there is this plan (comments may differ), else None: a commit's date, unlike a
    seal's, makes "planned before its first run" checkable by anyone."""
    from .plan import parse_plan

    source = Path(plan.source).resolve()
    if not commit or not source.is_file():
        return None
    ref = commit.split("+")[0]
    text = git("show", f"{ref}:./{source.name}", cwd=source.parent)
    try:
        if text is None or parse_plan(text, str(source)).canonical() != plan.canonical():
            return None
    except ValueError:  # PlanError, or a file that is no plan
        return None
    date = "--date=format-local:%Y-%m-%d %H:%M:%S"
    return (
        git("log", "-1", "--format=%cd", date, ref, "--", source.name, cwd=source.parent, TZ="UTC") or ""
    ).strip() or None


def progress(plan: Plan, work: Path) -> Dict[str, object]:
    """Which runs have their scores, and the looks complete (``complete_looks``: how many, in order)."""
    done = {(a, s) for a, s in plan.runs() if W.finished(work, a, s)}
    complete = 0
    for n, _ in plan.design():
        if all(job in done for job in plan.runs() if job[1] in plan.seeds[:n]):
            complete += 1
        else:
            break
    return {"done": done, "n_done": len(done), "n_planned": len(plan.runs()), "complete_looks": complete}


def _pairs(plan: Plan, work: Path, a: str, b: str, seeds, split: str) -> Tuple[List[int], List[float], List[str]]:
    """Seeds, differences ``a - b`` of the plan's metric on ``split`` and the seeds left out (with why)."""
    out_seeds, diffs, left = [], [], []
    for seed in seeds:
        sa, sb = W.read_scores(work, a, seed, split), W.read_scores(work, b, seed, split)
        if sa is None or sb is None or plan.metric not in sa or plan.metric not in sb:
            continue
        ra, rb = W.read_record(work, a, seed) or {}, W.read_record(work, b, seed) or {}
        if ra.get("recipe") != rb.get("recipe") and "recipes" not in plan.pair_across:
            left.append(f"seed {seed}: recipes differ ({ra.get('recipe')}, {rb.get('recipe')})")
            continue
        if ra.get("hardware") != rb.get("hardware") and "machines" not in plan.pair_across:
            left.append(f"seed {seed}: machines differ ({ra.get('hardware')}; {rb.get('hardware')})")
            continue
        out_seeds.append(seed)
        diffs.append(sa[plan.metric] - sb[plan.metric])
    return out_seeds, diffs, left


def _margin(plan: Plan, work: Path, c: Comparison, seeds, split: str) -> Optional[float]:
    """The comparison's margin: as stated, or its share of the mean paired gain over the same seeds."""
    if c.margin_gain is None:
        return c.margin
    low, high, share = c.margin_gain
    _, gains, _ = _pairs(plan, work, high, low, seeds, split)
    return share * t_interval(gains)["mean"] if gains else None


def judged(plan: Plan, work: Path, c: Comparison, seeds, split: str, confidence: float) -> dict:
    """One comparison on ``split`` over ``seeds``: seeds, per-seed differences, interval, margin, verdict."""
    got, diffs, left = _pairs(plan, work, c.a, c.b, seeds, split)
    margin = _margin(plan, work, c, got, split)
    if c.rule != "beats" and (margin is None or (c.rule == "matches" and not margin > 0)):
        row = {**t_interval(diffs, confidence), "margin": margin, "verdict": "no verdict"}
        left = left + [f"no margin > 0 from the runs ({margin})"]
    else:
        row = judge(c.rule, diffs, confidence, resolution=plan.resolution, margin=margin)
    if left:
        row["verdict"] = "no verdict"
    return {"seeds": got, "diffs": diffs, "left_out": left, "split": split, "confidence": confidence, **row}


def decisions(plan: Plan, work: Path, state: Optional[dict] = None) -> List[dict]:
    """Per comparison: its rows at each complete look (test split) and ``final`` (the first look with a
    verdict, or the last look; None while undecided with looks to come)."""
    state = state or progress(plan, work)
    design = plan.design()
    out = []
    for c in plan.comparisons:
        looks, final = [], None
        for k, (n, alpha) in enumerate(design[: state["complete_looks"]], start=1):
            seeds = [s for s in plan.seeds[:n] if s in plan.comparison_seeds(c)]
            row = {"look": k, "alpha": alpha, **judged(plan, work, c, seeds, plan.split, 1 - alpha)}
            looks.append(row)
            if row["verdict"] != "no verdict" or k == len(design):
                final = row
                break
        out.append(
            {
                "a": c.a,
                "b": c.b,
                "rule": c.rule,
                "label": c.label,
                "looks": looks,
                "final": final,
                "planned": _planned(plan, c),
            }
        )
    return out


def _planned(plan: Plan, c: Comparison) -> dict:
    """What ``study check`` said of the comparison's seeds (:func:`~.power.planned_power`), kept in the report."""
    try:
        return planned_power(plan, c)
    except (PlanError, OSError, ValueError) as e:  # an earlier study's STUDY.json gone or unreadable
        return {"unchecked": str(e)}


def planned_text(c: dict) -> str:
    """The comparison's planned power in words, ``check``'s shortfall named."""
    p = c.get("planned") or {}
    if "power" not in p:
        return f"not planned: {p.get('unchecked', 'no paired spread given')}"
    need = p["need"] if p["need"] else "more than 1000"
    text = (
        f"power {p['power']:.2f} with its {p['n']} seeds (paired sd {_points(p['sd'], False)} points from "
        f"{p['where']}, true difference assumed {_points(p['expected'])} points); {need} seeds give "
        f"{p['target']:g}"
    )
    return text + (
        " -- TOO FEW SEEDS: a real difference of that size would often give no verdict" if p["short"] else ""
    )


def all_decided(rows: List[dict]) -> bool:
    return all(r["final"] is not None for r in rows)


def _points(x: Optional[float], sign: bool = True) -> str:
    return "-" if x is None or x != x else _pt(x, sign)


def _interval(r: dict) -> str:
    return "-" if r["n"] < 2 else f"[{_points(r['lo'])}, {_points(r['hi'])}]"


def _per_seed(r: dict) -> str:
    return ", ".join(f"s{s} {_points(d)}" for s, d in zip(r["seeds"], r["diffs"])) or "-"


def _threshold(rule: str, margin: Optional[float], resolution: float) -> str:
    """The bar a comparison's interval is read against, in points (see :data:`GLOSSARY`)."""
    if rule == "beats":
        return f"zero, and the mean past ±{_points(resolution, False)}"
    if margin is None:
        return "-"
    return f"{_points(-margin)} (minus the margin)" if rule == "reaches" else f"±{_points(margin, False)} (the margin)"


def why(c: dict, r: dict, resolution: float) -> str:
    """Why row ``r`` of comparison ``c`` has its verdict, in words."""
    if r.get("left_out"):
        return "seeds left out (" + "; ".join(r["left_out"]) + ")"
    return reason(c["rule"], r, resolution)


def verdict_line(c: dict, doc: dict) -> str:
    """One comparison's final row in one line, its numbers in points and its verdict with the reason."""
    r = c["final"]
    looks = len(doc.get("looks") or [1])
    look = f", look {r['look']} of {looks}" if looks > 1 else ""
    interval = "no interval" if r["n"] < 2 else f"{100 * r['confidence']:.0f} % interval {_interval(r)}"
    return (
        f"{c['label']} ({r['split']} split, {r['n']} seeds{look}): mean {_points(r['mean'])} points, {interval} "
        f"-> {r['verdict']}: {why(c, r, doc['resolution'])}"
    )


#: What the report's words mean, for a reader who has not met the rule; it opens the report.
GLOSSARY = [
    "- **points**: every number is the metric in percentage points; a difference `a - b` is taken seed by seed "
    "(both arms trained with the same seed) and averaged.",
    "- **interval**: the range that holds the true mean difference at the plan's confidence (a Student "
    "t-interval over the per-seed differences); the more the seeds disagree, or the fewer they are, the wider.",
    "- **resolution**: the smallest difference the plan counts as real; a mean within ±resolution is a tie, "
    "never a win.",
    "- **margin** (reaches, matches): how far below zero (reaches) or around zero (matches) a difference may lie "
    "and still count, fixed in the plan before any run.",
    "- **look**: a point, fixed in the plan, at which the report may judge (a number of seeds); a one-look plan "
    "judges once, when every run has its scores. Each extra look costs confidence, so each is judged at a "
    "stricter interval.",
    "- **no verdict**: the interval crosses the bar it is read against; the data cannot tell, and more seeds might.",
]


def build(plan: Plan, work: Path) -> dict:
    """Everything the report says, as one JSON document (the test split read only at complete looks)."""
    work = Path(work)
    seal = check_seal(plan, work)
    state = progress(plan, work)
    rows = decisions(plan, work, state)
    design = plan.design()
    tested = (
        set(plan.seeds[: design[state["complete_looks"] - 1][0]])
        if state["complete_looks"] and not plan.exploratory
        else set()
    )
    runs = []
    for arm, seed in plan.runs():
        rec = W.read_record(work, arm, seed)
        if rec is None:
            runs.append({"arm": arm, "seed": seed, "finished": False})
            continue
        val = W.read_scores(work, arm, seed, "validation") or {}
        test = W.read_scores(work, arm, seed, "test") if seed in tested else None
        runs.append(
            {
                **rec,
                "arm": arm,
                "seed": seed,
                "finished": (arm, seed) in state["done"],
                "validation": val,
                **({"test": test} if test is not None else {}),
            }
        )
    validation = [
        {"label": c.label, **judged(plan, work, c, plan.comparison_seeds(c), "validation", plan.confidence)}
        for c in plan.comparisons
    ]
    for v in validation:
        v.pop("verdict")  # the validation split chooses; it never judges
    failed = [a for a in A.attempts(work) if a["exit"] != 0]
    reruns = [
        {
            "arm": a["arm"],
            "seed": a["seed"],
            "failed": a["started"],
            "exit": a["exit"],
            **({"stopped": a["stopped"]} if a.get("stopped") else {}),
        }
        for a in failed
    ]
    reruns += [{"arm": r["arm"], "seed": r["seed"], "resumed": True} for r in runs if r.get("resumed")]
    starts = [a["started"] for a in A.attempts(work) if a.get("started")]
    starts += [r["started"] for r in runs if r.get("started")]
    decided = all_decided(rows)
    if decided and state["n_done"] == state["n_planned"]:
        status = "complete"
    elif decided:
        status = (
            f"complete: every comparison decided at a look ({state['n_done']} of {state['n_planned']} runs; "
            "later looks' runs not needed)"
        )
    else:
        status = f"incomplete: {state['n_done']} of {state['n_planned']} runs"
        if state["complete_looks"]:
            status += f" (look {state['complete_looks']} of {len(design)} complete)"
    return {
        "title": plan.title or Path(plan.source).stem,
        "status": status,
        "plan": plan.source,
        "plan_sha256": plan.sha256,
        "sealed": seal and seal["sealed"],
        "sealed_commit": seal and seal["commit"],
        "plan_committed": plan_committed(plan, seal and seal["commit"]),
        "first_run": min(starts, default=None),
        "recipe": plan.recipe,
        "split": plan.split,
        "exploratory": plan.exploratory,
        "design": plan.design_text(),
        "looks": [list(x) for x in design],
        "metric": plan.metric,
        "confidence": plan.confidence,
        "resolution": plan.resolution,
        "pair_across": list(plan.pair_across),
        "runs_done": state["n_done"],
        "runs_planned": state["n_planned"],
        "comparisons": rows,
        "validation": validation,
        "reruns": reruns,
        "runs": runs,
        "plan_canonical": plan.canonical(),
    }


def provenance(doc: dict) -> str:
    """Where and when the plan was fixed, against its first run, in words: its commit date where git holds
    the plan at the seal's commit (:func:`plan_committed`), else that it was not committed."""
    sealed, commit, first = doc.get("sealed"), doc.get("sealed_commit"), doc.get("first_run")
    if not sealed:
        return "not sealed yet"
    committed = doc.get("plan_committed")
    if committed:
        when = "before" if first is None or committed < first else "after"
        return (
            f"committed {committed[:16]}, {when} its first run ({first or 'none yet'}); sealed {sealed} at commit "
            f"{commit}"
        )
    # A seal's date is a local file's word, and its commit is the code's: neither vouches for the plan.
    return (
        f"the plan was not committed to git, so no date of record shows it fixed before its runs; its work "
        f"folder was sealed {sealed} (clip-dcl at commit {commit or '-'})" + (f", first run {first}" if first else "")
    )


def _rerun_text(r: dict) -> str:
    """How an earlier attempt of a run ended, or that the run resumed from a checkpoint."""
    if r.get("resumed"):
        return "resumed from a checkpoint"
    if r.get("stopped"):
        return f"stopped by {r['stopped']} {r['failed']}, exit {r['exit']}"
    return f"failed {r['failed']}, exit {r['exit']}"


def markdown(doc: dict, plan: Plan, figure_name: str = "STUDY.png") -> List[str]:
    """The report's Markdown lines from :func:`build`'s document."""
    done = [r for r in doc["runs"] if r.get("commit")]
    commits = Counter(r["commit"] for r in done)
    machines = Counter(r.get("hardware", "?") for r in done)
    rules = sorted({c.rule for c in plan.comparisons}, key=list(RULE_TEXT).index)
    lines = [
        f"# Study: {doc['title']}",
        "",
        f"- Status: **{doc['status']}**",
        "",
        "## How to read it",
        "",
        *GLOSSARY,
        "",
        "## The plan and its runs",
        "",
        f"- Plan: `{doc['plan']}` (sha256 {doc['plan_sha256'][:12]}), {provenance(doc)}; recipe `{doc['recipe']}`",
        f"- Design: {doc['design']}",
        f"- Metric: `{doc['metric']}` in points (percent); resolution ±{_points(doc['resolution'], False)} points",
        "- Runs' commits: " + (", ".join(f"{c} ({n} runs)" for c, n in commits.items()) or "none yet"),
        "- Runs' machines: "
        + ("; ".join(f"{m} ({n} runs)" for m, n in machines.items()) or "none yet")
        + ("" if not doc["pair_across"] else f" (the plan pairs across {', '.join(doc['pair_across'])})"),
        "- Rerun runs: "
        + (", ".join(f"{r['arm']} seed {r['seed']} (" + _rerun_text(r) + ")" for r in doc["reruns"]) or "none"),
        "- The rule (paired by seed; mean difference and its t-interval): "
        + "; ".join(RULE_TEXT[r].format(res=_points(doc["resolution"], False) + " points") for r in rules)
        + ".",
        f"- Planned power (as `clip-dcl study check` computed it, at {100 * doc['confidence']:.0f} %, one look):",
        *[f"  - {c['label']}: {planned_text(c)}" for c in doc["comparisons"]],
        "",
    ]
    short = [c["label"] for c in doc["comparisons"] if (c.get("planned") or {}).get("short")]
    if short:  # check's warning, kept where the verdicts are read
        lines[2:3] = [lines[2], f"- Too few seeds for power {plan.power:g}: {', '.join(short)} (see Planned power)"]
    tested = [c for c in doc["comparisons"] if c["looks"]]
    if tested:
        lines += [
            "## Verdicts (test split)"
            if not doc["exploratory"]
            else "## Readings (validation split: an exploratory study chooses, it makes no claim)",
            "",
        ]
        table = []
        for c in doc["comparisons"]:
            for r in c["looks"]:
                final = c["final"] is r
                table.append(
                    [
                        f"{c['a']} - {c['b']} ({c['rule']})",
                        f"{r['look']} at {100 * (1 - r['alpha']):.3g} %",
                        r["n"],
                        _per_seed(r),
                        _points(r["mean"]),
                        _interval(r),
                        _threshold(c["rule"], r["margin"], doc["resolution"]),
                        f"**{r['verdict']}**" if final else f"{r['verdict']} (look goes on)",
                    ]
                )
            if not c["looks"]:
                table.append([f"{c['a']} - {c['b']} ({c['rule']})", "-", 0, "-", "-", "-", "-", "not judged yet"])
        lines += [
            markdown_table(
                [
                    "comparison",
                    "look, interval",
                    "seeds",
                    "per-seed differences (points)",
                    "mean",
                    "interval",
                    "read against (points)",
                    "verdict",
                ],
                table,
                "llrlrlll",
            ),
            "",
        ]
        lines += [
            f"- {c['label']}: **{c['final']['verdict']}**: {why(c, c['final'], doc['resolution'])}."
            for c in doc["comparisons"]
            if c["final"]
        ] + [""]
        notes = [
            f"- {c['label']}: left out " + "; ".join(r["left_out"])
            for c in doc["comparisons"]
            for r in c["looks"]
            if r["left_out"]
        ]
        lines += notes + ([""] if notes else [])
    else:
        lines += [
            f"**{doc['status']}**: no verdict and no "
            + ("reading" if doc["exploratory"] else "test-split score")
            + " until every planned run of a look has its scores.",
            "",
        ]
    if not doc["exploratory"] or not tested:
        lines += [
            "## Validation split (for choices; never a verdict)",
            "",
            markdown_table(
                [
                    "comparison",
                    "seeds",
                    "per-seed differences (points)",
                    "mean",
                    f"{100 * doc['confidence']:.0f} % interval",
                ],
                [[v["label"], v["n"], _per_seed(v), _points(v["mean"]), _interval(v)] for v in doc["validation"]],
                "lrlrl",
            ),
            "",
        ]
    show_test = any("test" in r for r in doc["runs"])
    head = ["arm", "seed", "recipe", "commit", "started", f"validation {doc['metric']}"]
    rows = []
    for r in doc["runs"]:
        cells = [
            r["arm"],
            r["seed"],
            r.get("recipe", "-"),
            r.get("commit", "-"),
            r.get("started") or "-",
            _points(r.get("validation", {}).get(doc["metric"]), False) if r.get("finished") else "not run",
        ]
        if show_test:
            cells.append(_points(r["test"].get(doc["metric"]), False) if "test" in r else "-")
        rows.append(cells)
    lines += [
        "## Runs",
        "",
        markdown_table(head + ([f"test {doc['metric']}"] if show_test else []), rows),
        "",
        f"![every comparison on one axis: seeds, mean, interval, zero and margins]({figure_name})",
    ]
    return lines


def forest_rows(doc: dict) -> List[dict]:
    """The rows of :func:`figure`, top to bottom, in points: per comparison its final or last look, else its
    validation split's row, and the bars it is read against."""
    rows = []
    for c, v in zip(doc["comparisons"], doc["validation"]):
        r = c["final"] or (c["looks"][-1] if c["looks"] else None)
        split = doc["split"] if r else "validation"
        verdict = r["verdict"] if r else "no verdict (validation split: for choices)"
        r = r or v
        margin = r.get("margin")
        bars = []
        if c["rule"] == "reaches" and margin is not None:
            bars = [-100 * margin]
        elif c["rule"] == "matches" and margin is not None:
            bars = [-100 * margin, 100 * margin]
        rows.append(
            {
                "label": c["label"],
                "rule": c["rule"],
                "split": split,
                "verdict": verdict,
                "n": r["n"],
                "seeds": [100 * d for d in r["diffs"]],
                "mean": 100 * r["mean"] if r["n"] else None,
                "interval": (100 * r["lo"], 100 * r["hi"]) if r["n"] >= 2 else None,
                "bars": bars,
            }
        )
    return rows


def figure(doc: dict, path: Path) -> Path:
    """One forest plot of every comparison on a shared axis of differences ``a - b`` in points."""
    plt = pyplot()
    rows = forest_rows(doc)
    fig, ax = plt.subplots(figsize=(9.5, 1.5 + 0.6 * len(rows)))  # the height from the rows: one or twenty
    labelled = set()

    def once(name: str) -> Optional[str]:  # each legend entry once
        if name in labelled:
            return None
        labelled.add(name)
        return name

    res = 100 * doc["resolution"]
    for i, row in enumerate(rows):
        y = len(rows) - 1 - i  # the plan's first comparison on top
        if row["rule"] == "beats" and res > 0:
            ax.fill_betweenx(
                [y - 0.35, y + 0.35], -res, res, color="grey", alpha=0.18, lw=0, label=once("± resolution (beats)")
            )
        for x in row["bars"]:
            ax.plot([x, x], [y - 0.35, y + 0.35], color="C2", ls="--", lw=1.5, label=once("margin"))
        k = len(row["seeds"])
        offsets = [0.0] if k == 1 else [-0.2 + 0.4 * j / (k - 1) for j in range(k)]  # spread, so dots do not hide
        ax.scatter(
            row["seeds"], [y + o for o in offsets], s=16, color="C0", alpha=0.75, zorder=3, label=once("one seed")
        )
        if row["interval"] is not None:
            lo, hi = row["interval"]
            ax.errorbar(
                [row["mean"]],
                [y],
                xerr=[[row["mean"] - lo], [hi - row["mean"]]],
                fmt="s",
                color="C3",
                ms=7,
                capsize=5,
                lw=2,
                zorder=4,
                label=once(f"mean, {100 * doc['confidence']:.0f} % interval"),
            )
        elif row["mean"] is not None:
            ax.plot([row["mean"]], [y], "s", color="C3", ms=7, zorder=4)
    ax.axvline(0, color="black", lw=1)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(
        [f"{r['label']}\n{r['verdict']} ({r['split']}, {r['n']} seeds)" for r in reversed(rows)], fontsize=9
    )
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_xlabel(f"a - b, {doc['metric']} in points (paired by seed)")
    ax.grid(axis="x", alpha=0.3)
    if labelled:  # right of the axes, outside them: it hides no row and no label, whatever the rows
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=False)
    return save_figure(fig, path, doc["title"])


def write_report(
    plan: Plan, work: Path, out: Optional[Path] = None, command: str = "", name: str = "STUDY"
) -> Dict[str, object]:
    """Write ``NAME.md/.json/.png`` into ``out`` (default ``work``); return the document and the paths. The
    command names ``work`` as :func:`~clip_dcl.paths.shown_text` does (never a path of the machine)."""
    work = Path(work)
    out = Path(out) if out else work
    doc = build(plan, work)
    report = Report(out, name, command=shown_text(command or "clip-dcl study report", [work]))
    png = figure(doc, report.png)
    lines = markdown(doc, plan, figure_name=png.name)
    md = report.write([*lines[:3], *report.about()[:2], *lines[3:]], doc)  # the command and date after the status
    return {"doc": doc, "markdown": md, "json": report.path(".json"), "png": png}
