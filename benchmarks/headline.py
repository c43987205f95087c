"""The README's headline: the confirmatory study's verdicts, rendered from its report's JSON.

``benchmarks/studies/confirmatory.toml`` names its arms ``decl-bB``, ``clip-bB``, ``clip-b2B`` and
``tuned-bB`` (InfoNCE with its temperature tuned) for each batch size B, and compares, per B, ``decl``
with ``clip`` at B (beats), with the tuned InfoNCE at B (beats) and with ``clip`` at 2B (reaches).
:func:`readme_block` turns ``benchmarks/results/confirmatory.json`` (the study's ``STUDY.json``, copied by
``clip-dcl study report ... --out``) into the README's block: while runs are missing it says how many and
gives no number; once the study is complete, one line per comparison (per-seed differences, interval,
verdict) and, per batch size, one plain line on what to train, read off the verdicts by :func:`advice`.
Nothing in it is typed: it is rendered by ``python benchmarks/quotes.py``.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Dict, List, Optional, Tuple

from clip_dcl.experiment.study.report import provenance

PLAN = "benchmarks/studies/confirmatory.toml"
_ARM = re.compile(r"^(decl|clip|tuned)-b(\d+)$")


def _pts(x: float) -> str:
    return f"{100 * x:+.1f}"


def _arm(name: str) -> Tuple[str, int]:
    m = _ARM.match(name)
    if not m:
        raise ValueError(f"confirmatory arm {name!r} is not named decl-bB, clip-bB or tuned-bB")
    return m.group(1), int(m.group(2))


def _flags(doc: dict) -> Dict[str, List[str]]:
    return {a["name"]: list(a.get("flags", [])) for a in doc["plan_canonical"]["arms"]}


def _verdicts(doc: dict) -> Dict[int, Dict[str, dict]]:
    """Per batch size B: ``{"clip": row, "tuned": row, "2B": row}``, the final row of ``decl-bB`` against each."""
    out: Dict[int, Dict[str, dict]] = {}
    for c in doc["comparisons"]:
        kind_a, b_a = _arm(c["a"])
        kind_b, b_b = _arm(c["b"])
        if kind_a != "decl":
            raise ValueError(f"confirmatory comparison {c['label']!r}: the headline reads decl - X only")
        key = "2B" if (kind_b == "clip" and b_b == 2 * b_a) else kind_b if b_b == b_a else None
        if key is None:
            raise ValueError(
                f"confirmatory comparison {c['label']!r} is not decl against clip or tuned at B or clip at 2B"
            )
        out.setdefault(b_a, {})[key] = c["final"] and {**c["final"], "a": c["a"], "b": c["b"]}
    return out


def planned_power(doc: dict, row: dict) -> Optional[float]:
    """The power the plan gave ``row``'s comparison (its expected difference, paired spread and seed count, as
    the plan's comments state it); None when the plan gives no spread."""
    from clip_dcl.experiment.study.rule import planned_power as power_of

    for c in doc["plan_canonical"].get("comparisons", []):
        if (c["a"], c["b"]) == (row.get("a"), row.get("b")) and c.get("paired_sd") and c.get("seeds"):
            return power_of(
                c["rule"],
                int(c["seeds"]),
                c["paired_sd"],
                doc.get("confidence", 0.9),
                c.get("expected") or 0.0,
                c.get("margin"),
            )
    return None


def caveat(doc: dict, row: dict) -> str:
    """What a verdict's words alone would leave out, from its numbers: a reach with no verdict whose interval lies
    below zero, and a positive verdict the plan gave little power (such verdicts overstate the gap)."""
    notes = []
    if row["verdict"] == "no verdict" and row.get("margin") is not None:
        notes.append("the interval straddles the bar" + ("; it lies wholly below zero" if row["hi"] < 0 else ""))
    p = planned_power(doc, row)
    if p is not None and p < 0.5 and row["verdict"] not in ("no verdict", "tie"):
        notes.append(
            f"planned power {p:.2f}: a verdict reached at low power tends to overstate the gap, so read "
            "its interval's near end rather than its mean"
        )
    return "".join(f"; {n}" for n in notes)


def advice(batch: int, rows: Dict[str, Optional[dict]], tuned_flags: List[str]) -> str:
    """One plain line on what to train at ``batch``, read off the three verdicts (``rows``: the final rows of
    ``decl`` against ``clip``, the tuned InfoNCE and ``clip`` at 2B)."""
    v = {k: (r or {}).get("verdict", "no verdict") for k, r in rows.items()}
    tuned = "`" + " ".join(tuned_flags) + "`"
    if v.get("tuned") == "beats":
        line = f"train `--loss decl`: it beat InfoNCE with its temperature tuned ({tuned})"
        if v.get("2B") == "reaches":
            line += f", and reached `clip` at B = {2 * batch}"
        return line + "."
    if v.get("tuned") == "trails":
        return f"train InfoNCE at the tuned temperature ({tuned}): it beat `--loss decl`."
    if v.get("clip") == "beats" and "tuned" not in v:
        return (
            "train `--loss decl`: it beat `clip` (this study has no tuned InfoNCE, so the gain may be a temperature's)."
        )
    if v.get("clip") == "beats":
        return (
            f"`--loss decl` beat `clip` but not the tuned InfoNCE ({tuned}): train either; the gain over `clip` "
            f"is not shown to be more than a temperature's."
        )
    return f"no loss is shown better than `clip` here: keep `--loss clip` (or the tuned temperature, {tuned})."


def docs_block(doc: dict) -> str:
    """:func:`readme_block` for a page of ``docs/`` (its links one folder up)."""
    return readme_block(doc, link_prefix="../")


def readme_block(doc: dict, link_prefix: str = "") -> str:
    """The headline block from the confirmatory study's JSON (see the module's text); ``link_prefix`` leads
    the plan's link from the page that holds the block to the repository root."""
    plan = link_prefix + doc.get("plan", PLAN)
    head = (
        f"The confirmatory study ([plan]({plan}), {provenance(doc)}; recipe `{doc['recipe']}`; {doc['design']}; "
        f"metric `{doc['metric']}`, test split): "
    )
    if doc["exploratory"]:
        raise ValueError(f"{plan} is exploratory: the headline takes a confirmatory study's verdicts only")
    if not doc["status"].startswith("complete"):
        return head + (
            f"**{doc['status']}**. Its verdicts appear here when every planned run has its scores; "
            "until then it states nothing."
        )
    flags = _flags(doc)
    lines = [head + f"**{doc['status']}**. Paired differences in points, `a - b`, mean [interval], per seed:", ""]
    names = {"clip": "`clip` at B", "tuned": "InfoNCE tuned at B", "2B": "`clip` at 2B"}
    per_b = _verdicts(doc)
    for batch in sorted(per_b):
        parts = []
        for key in ("clip", "tuned", "2B"):
            r = per_b[batch].get(key)
            if r is None:
                continue
            seeds = ", ".join(_pts(d) for d in r["diffs"])
            bar = "" if r.get("margin") is None else f", bar {_pts(-r['margin'])}"
            parts.append(
                f"- {names[key]}: {_pts(r['mean'])} [{_pts(r['lo'])}, {_pts(r['hi'])}] ({r['n']} seeds: "
                f"{seeds}{bar}): **{r['verdict']}**{caveat(doc, r)}"
            )
        lines += [f"`decl` at B = {batch} against", *parts, ""]
    lines.append("What to train, from these verdicts:")
    lines.append("")
    for batch in sorted(per_b):
        tuned = flags.get(f"tuned-b{batch}", [])
        lines.append(f"- B = {batch}: " + advice(batch, per_b[batch], tuned))
    return "\n".join(lines)


_SCENES = (
    "four real photographs a scene in a 2 x 2 grid, captions naming each item, its cell and two measured "
    "attributes (`fscenes4-words`)"
)
#: the confirmatory studies whose verdicts the README's table gives: (name, what its testbed is, report JSON,
#: plan); a testbed's later study is named "testbed, what sets it apart"
TESTBEDS = (
    (
        "synthetic",
        "coloured shapes, many latent classes, template captions (`micro-words`)",
        "benchmarks/results/confirmatory.json",
        "benchmarks/studies/confirmatory.toml",
    ),
    (
        "Fashion-MNIST",
        "real photographs, 10 classes, captions from their pixels (`fmnist-words`)",
        "benchmarks/results/fmnist_confirmatory.json",
        "benchmarks/studies/fmnist_confirmatory.toml",
    ),
    (
        "Fashion-MNIST scenes",
        _SCENES,
        "benchmarks/results/fscenes_confirmatory.json",
        "benchmarks/studies/fscenes_confirmatory.toml",
    ),
    (
        "Fashion-MNIST scenes, powered",
        _SCENES,
        "benchmarks/results/fscenes_powered.json",
        "benchmarks/studies/fscenes_powered.toml",
    ),
)
_METRIC_NAMES = {"retrieval/mean_R@1": "retrieval mean R@1", "zeroshot/top1": "zero-shot top-1"}


def verdict_table(studies: List[Tuple[str, str, dict]]) -> str:
    """One Markdown table of every confirmatory verdict of ``studies`` (``(testbed, plan path, report JSON)``),
    a row per comparison naming its testbed, metric, split, seeds and interval, the plans linked; a study with
    runs missing gets one row saying so and no number."""
    lines = [
        "| testbed | `a - b` | metric, split | seeds | mean [90 % interval], points | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for testbed, plan, doc in studies:
        if doc["exploratory"]:
            raise ValueError(f"{plan} is exploratory: the verdict table takes confirmatory studies only")
        where = f"[{testbed}]({plan})"
        metric = _METRIC_NAMES.get(doc["metric"], doc["metric"])
        if not doc["status"].startswith("complete"):
            lines.append(
                f"| {where} | {doc['status']}: no verdict is read before every planned run has its scores "
                f"| {metric}, {doc['split']} | | | |"
            )
            continue
        for c in doc["comparisons"]:
            r = c["final"]
            seeds = f"{r['n']} ({min(r['seeds'])}-{max(r['seeds'])})"
            bar = "" if r.get("margin") is None else f"; bar {_pts(-r['margin'])}"
            lines.append(
                f"| {where} | `{c['a']}` - `{c['b']}` ({c['rule']}) | {metric}, {r['split']} | {seeds} | "
                f"{_pts(r['mean'])} [{_pts(r['lo'])}, {_pts(r['hi'])}]{bar} | **{r['verdict']}** |"
            )
    return "\n".join(lines)


def verdict_table_block(doc: dict) -> str:
    """The README's table of confirmatory verdicts on every testbed of :data:`TESTBEDS`: ``doc`` is the first
    one's report JSON (the generator hands each block one file), the others are read from the repository; a
    testbed whose report is not committed yet gets one row saying so."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    studies, missing = [], []
    for i, (name, what, report, plan) in enumerate(TESTBEDS):
        path = root / report
        if i == 0:
            studies.append((name, plan, doc))
        elif path.is_file():
            studies.append((name, plan, json.loads(path.read_text())))
        else:
            missing.append(f"| [{name}]({plan}) | not run yet: no verdict | | | | |")
    testbeds = dict.fromkeys((name.split(",")[0], what) for name, what, _, _ in TESTBEDS)
    legend = "; ".join(f"**{name}**: {what}" for name, what in testbeds)
    arms = []
    for name, plan, d in studies:  # what the arms named for a role (tuned, debiased) train, at their first batch
        seen = {}
        for a in d["plan_canonical"]["arms"]:
            role = a["name"].rsplit("-b", 1)[0]
            if role in ("tuned", "debiased") and role not in seen:
                seen[role] = f"`{role}` is `{' '.join(a.get('flags', []))}` at B = {a['name'].rsplit('-b', 1)[1]}"
        line = f"{name.split(',')[0]}: " + "; ".join(seen.values())
        if seen and line not in arms:  # a testbed's later study with the same arms: said once
            arms.append(line)
    lines = [verdict_table(studies), *missing, "", f"Testbeds: {legend}."]
    if arms:
        lines.append("Arms (the plans give every arm's flags): " + ". ".join(arms) + ".")
    return "\n".join(lines)


#: the scene testbed's first confirmatory study (few seeds), which :func:`scenes_block` keeps beside the later one
SCENES_FIRST = ("benchmarks/results/fscenes_confirmatory.json", "benchmarks/studies/fscenes_confirmatory.toml")


def _target(c: dict) -> str:
    """What ``decl`` is held against in comparison ``c``, in words: "`clip` at B = 32", "the tuned InfoNCE at
    B = 64", "`clip` at B = 64 from B = 32"."""
    kind, batch = _arm(c["b"])
    own = _arm(c["a"])[1]
    who = "`clip`" if kind == "clip" else "the tuned InfoNCE" if kind == "tuned" else f"`{kind}`"
    return f"{who} at B = {batch}" + ("" if batch == own else f" from B = {own}")


def _draw(doc: dict) -> str:
    command = doc["plan_canonical"].get("data", {}).get("command", [])
    return f"data draw {command[command.index('--seed') + 1]}" if "--seed" in command else "the default data draw"


def _beyond(r: dict, resolution: float) -> str:
    """How many seeds differ by more than the resolution, each way ("k of n seeds" counts only those)."""
    ahead = sum(round(d, 9) > resolution for d in r["diffs"])
    behind = sum(round(d, 9) < -resolution for d in r["diffs"])
    return f"`decl` ahead by more than the resolution in {ahead} of {r['n']} seeds" + (
        f", behind by more in {behind}" if behind else ""
    )


#: why a verdict of ``beats`` reads as it does, briefly (clip_dcl.experiment.study.rule.reason says it in full)
_WHY = {
    "beats": "the interval above zero, the mean past the resolution",
    "trails": "the interval below zero, the mean past the resolution",
    "tie": "the interval on one side of zero, its mean inside the resolution: a tie, not a win",
    "no verdict": "the interval crosses zero",
}


def _planned_words(doc: dict) -> str:
    rows = [c for c in doc["comparisons"] if "power" in c.get("planned", {})]
    if not rows:
        return "no planned power"
    seeds = " and ".join(f"{c['planned']['n']} against {_target(c)}" for c in rows)
    powers = " and ".join(f"{c['planned']['power']:.2f}" for c in rows)
    expected = {c["planned"]["expected"] for c in rows}
    at = f" at a true difference of {_pts(expected.pop())} points" if len(expected) == 1 else ""
    return f"seeds {seeds}, planned power {powers}{at}"


def scene_study_line(doc: dict, plan: str, link_prefix: str = "") -> str:
    """The later scene study in words: its plan, data draw, seeds and planned power, then per comparison its
    interval, verdict and why, and how many seeds differ by more than the resolution (while runs are missing:
    its status, and no number)."""
    res = doc["resolution"]
    head = f"[plan]({link_prefix}{plan}), {_draw(doc)}; {_planned_words(doc)}; resolution {100 * res:g} points"
    if not doc["status"].startswith("complete"):
        return f"{head}: **{doc['status']}**; it states nothing until every planned run has its scores"
    parts = []
    for c in doc["comparisons"]:
        r = c["final"]
        why = _WHY.get(r["verdict"], "") if c["rule"] == "beats" else ""
        parts.append(
            f"against {_target(c)} {_pts(r['mean'])} [{_pts(r['lo'])}, {_pts(r['hi'])}], **{r['verdict']}** ("
            + "; ".join(x for x in (why, _beyond(r, res) if c["rule"] == "beats" else "") if x)
            + ")"
        )
    splits = sorted({c["final"]["split"] for c in doc["comparisons"]})
    return f"{head}; {', '.join(splits)} split, {100 * doc['confidence']:g} % intervals, points: " + "; ".join(parts)


def scene_summary_line(doc: dict, plan: str, link_prefix: str = "") -> str:
    """A scene study's verdicts grouped, in words ("**no verdict** against `clip` at B = 32 and ..."), with its
    seeds and the planned power its plan gave them."""
    if not doc["status"].startswith("complete"):
        return f"[plan]({link_prefix}{plan}), {_draw(doc)}: **{doc['status']}**; it states nothing yet"
    by: Dict[str, List[str]] = {}
    for c in doc["comparisons"]:
        by.setdefault(c["final"]["verdict"], []).append(_target(c))
    said = "; ".join(
        f"**{v}** {'against ' if v in _WHY else ''}{', '.join(t[:-1]) + ' and ' if len(t) > 1 else ''}{t[-1]}"
        for v, t in by.items()
    )
    seeds = sorted({c["final"]["n"] for c in doc["comparisons"]})
    powers = [c["planned"]["power"] for c in doc["comparisons"] if "power" in c.get("planned", {})]
    power = f"; planned power {min(powers):.2f} to {max(powers):.2f}" if powers else ""
    splits = sorted({c["final"]["split"] for c in doc["comparisons"]})
    return (
        f"[plan]({link_prefix}{plan}), {_draw(doc)}, {' or '.join(map(str, seeds))} seeds{power}; "
        f"{', '.join(splits)} split: {said}"
    )


def _batches(doc: dict) -> str:
    sizes = sorted({_arm(c["a"])[1] for c in doc["comparisons"]})
    return ", ".join(map(str, sizes[:-1])) + " and " + str(sizes[-1]) if len(sizes) > 1 else str(sizes[0])


def _enough(doc: dict) -> str:
    """Whether the plan's seeds were as many as its power asked for (`study check`'s TOO FEW SEEDS), in words."""
    planned = [c["planned"] for c in doc["comparisons"] if "power" in c.get("planned", {})]
    if not planned:
        return "its seeds not planned for a power"
    short = sum(p["short"] for p in planned)
    if not short:
        return "as many seeds as its plan's power asked for"
    return "fewer seeds than its plan's power asked for" + ("" if short == len(planned) else " in some comparisons")


def scenes_block(doc: dict, link_prefix: str = "") -> str:
    """The README's sentence on the scene testbed (real pixels where the batch mattered), from the later,
    powered study's JSON (``doc``) with the first study's (:data:`SCENES_FIRST`, read from the repository)
    beside it."""
    import json
    from pathlib import Path

    first_report, first_plan = SCENES_FIRST
    first = json.loads((Path(__file__).resolve().parents[1] / first_report).read_text())
    for d in (doc, first):
        if d["exploratory"]:
            raise ValueError(f"{d['plan']} is exploratory: the scene sentence takes confirmatory studies only")
    return "\n".join(
        [
            "- **Fashion-MNIST scenes** (four real photographs a scene in a two-by-two grid, captions naming each",
            "  item, its cell and two measured attributes; retrieval mean R@1), where `clip` gained with the batch",
            "  in the testbed's gate: does `decl` beat `clip` and the tuned InfoNCE? Two studies, each on a data",
            "  draw of its own:",
            f"  - the second, at B = {_batches(doc)}, {_enough(doc)}: "
            + scene_study_line(doc, doc["plan"], link_prefix)
            + ".",
            f"  - the first, at B = {_batches(first)}, with the seeds two cores could run in a session, "
            f"{_enough(first)}: " + scene_summary_line(first, first_plan, link_prefix) + ".",
        ]
    )


def scenes_brief(doc: dict) -> str:
    """One paragraph for "Which loss when": what the later scene study found (``doc``: its JSON), its verdicts and
    intervals, or while runs are missing that it states nothing yet."""
    head = (
        f"On the Fashion-MNIST scenes, the second confirmatory study (B = {_batches(doc)}, {_enough(doc)}, "
        f"{_draw(doc)}; [report](benchmarks/results/{PurePosixPath(doc['plan']).stem}.md))"
    )
    if not doc["status"].startswith("complete"):
        return f"{head} is **{doc['status']}**: no verdict is read before every planned run has its scores."
    said = [
        f"against {_target(c)} **{c['final']['verdict']}** ({_pts(c['final']['mean'])} "
        f"[{_pts(c['final']['lo'])}, {_pts(c['final']['hi'])}] points, {c['final']['n']} seeds)"
        for c in doc["comparisons"]
    ]
    splits = sorted({c["final"]["split"] for c in doc["comparisons"]})
    return f"{head}, {', '.join(splits)} split: `decl` " + "; ".join(said) + "."
