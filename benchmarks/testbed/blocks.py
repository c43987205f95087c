"""The README's and docs' generated blocks of the batch-size testbed (``benchmarks/quotes.py``), each
rendered from a committed report's JSON: the verdicts, the ``dcl`` screen and sweep, ``--loss dcl`` at its
defaults, and the numbers behind the README's "which loss when".
"""

from __future__ import annotations

import json
from typing import Dict

from clip_dcl.experiment.scoring import MEAN_R1

from .objectives import DCL_DEFAULT_SIZE, RESULTS, SCREEN16_SIZE
from .report import _interval, _seeds
from .rule import MIN_SEEDS, bias_label, bias_rows, clearance, control_leads

#: how the docs phrase each reach verdict
_REACH = {"reaches": "reaches", "does not reach": "does not reach", "no verdict": "no verdict on reaching"}


def readme_block(doc: dict) -> str:
    """docs/results.md's verdicts, from a report's JSON (``doc``): per batch size the test split's verdict with
    its seeds, mean paired difference and interval, the validation split's comparison beside it (where the
    default was chosen: context only), then the temperature controls (the generated block
    ``batch-size verdicts``, ``benchmarks/quotes.py``)."""

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
            line = (
                f"- **B = {b}: `decl` {_REACH[reach['verdict']]} `clip` at {2 * b}** (test split, "
                f"{reach['n']} seeds{'' if reach['n'] >= MIN_SEEDS else f'; {MIN_SEEDS} at least for a verdict'}): "
                f"decl@{b} - clip@{2 * b} = {cell(reach)}, threshold {0.0 - 100 * reach['gain'] / 2:+.1f} (half of "
                f"`clip`'s gain from {b} to {2 * b}){_cleared(reach)}; against `clip` at {b}: {cell(beat)}, "
                f"{beat['verdict']}."
            )
        else:
            line = f"- **B = {b}: no test-split runs yet.**"
        old = rows.get((b, "reach", "validation"))
        if old:
            old_beat = rows[(b, "beat", "validation")]
            line += (
                f" On the validation split, where the default was chosen ({old['n']} seeds; context, no "
                f"verdict): {cell(old)} against `clip` at {2 * b}, {cell(old_beat)} against `clip` at {b}."
            )
        lines.append(line)
    again = [r for r in doc.get("draws", []) if r["kind"] == "reach"]
    for r in again:
        lines.append(
            f"- **Another draw of the data** (`--seed {r['data_seed']}`, B = {r['batch_size']}, test split, "
            f"{r['n']} seeds): decl@{r['batch_size']} - clip@{2 * r['batch_size']} = {cell(r)}, "
            f"{r['verdict']}."
        )
    if not again:
        lines.append(
            "- Another draw of the data (same recipe, other images): not run yet; every verdict above "
            "holds on one draw."
        )
    lead = control_leads(doc["runs"])
    said = {
        "decl - clip": "`decl`'s lead over `clip`",
        "clip at decl scale - clip": "InfoNCE trained at `decl`'s final scale, fixed, over `clip`",
        "decl - clip at decl scale": "`decl`'s lead over that InfoNCE",
        "decl at clip scale - clip": "`decl` trained at `clip`'s final scale, fixed, over `clip`",
    }
    for b, c in sorted(lead.items()):
        parts = [
            f"{what}: {cell(c[name])}, {c[name]['verdict']} (seeds {', '.join(map(str, c[name]['seeds']))})"
            for name, what in said.items()
            if name in c
        ]
        lines.append(
            f"- **Temperature controls at B = {b}** (test split, paired by seed; verdicts by the rule's beats / "
            f"trails / tie): " + "; ".join(parts) + "."
        )
    s16 = doc.get("screen16") or {}
    if s16.get("scores"):
        base = s16["scores"].get("decl default")
        said16 = [
            f"`{n}` {100 * v:.1f}" + (f" ({100 * (v - base):+.1f})" if base is not None and n != "decl default" else "")
            for n, v in s16["scores"].items()
        ]
        line = (
            f"- **The B = {SCREEN16_SIZE} screen** (validation split, seed {s16['seed']}, retrieval mean R@1 and the "
            "difference from `decl default`): " + ", ".join(said16)
        )
        if s16.get("missing"):
            line += "; not yet run: " + ", ".join(f"`{n}`" for n in s16["missing"]) + "."
        elif s16.get("best") == "decl default":
            line += "; no variant scores above the package default, so none goes on to the test split."
        else:
            tested = {r["kind"]: r for r in s16.get("verdicts", []) if r["n"]}
            line += (
                f"; the best, `{s16['best']}`, on the test split: "
                + (
                    "; ".join(
                        f"{s16['best'].split(' ', 1)[0]}@{SCREEN16_SIZE} - clip@{r['against'].split(' at ')[1]} = "
                        f"{cell(r)}, {r['verdict']}"
                        for r in tested.values()
                    )
                    if tested
                    else "not run yet"
                )
                + "."
            )
        lines.append(line)
    if not lead:
        lines.append("- Temperature controls (InfoNCE at `decl`'s scale, `decl` at `clip`'s): not run yet.")
    lines += ["", f"Status of the report: {doc['status']}"]
    return "\n".join(lines)


def dcl_readme_block(doc: dict) -> str:
    """docs/results.md's ``dcl`` screen, from ``dcl_screen.json``: each setting's validation R@1 minus ``clip``'s at
    the same batch and seed, and what passed the screen's bar."""
    idx = {(r["label"], r["batch_size"], r["seed"]): r["metrics"][MEAN_R1] for r in doc["runs"]}
    cells = [
        f"`{lab}` {100 * (v - idx[('clip', b, seed)]):+.1f} at B = {b}"
        for (lab, b, seed), v in idx.items()
        if lab != "clip" and ("clip", b, seed) in idx
    ]
    seeds = sorted({seed for (lab, b, seed) in idx})
    return (
        f"Validation split, seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}, retrieval mean R@1 "
        "minus `clip`'s at the same batch and seed, in points: "
        + "; ".join(cells)
        + ". Through the screen: "
        + (", ".join(doc["passing"]) if doc["passing"] else "none")
        + "."
    )


def dcl_default_block(doc: dict) -> str:
    """docs/results.md's check of ``--loss dcl`` with no other loss flag against ``clip``, from a report's JSON
    (:func:`dcl_default_rows`): test split first, the validation split beside it."""
    rows = {r["split"]: r for r in doc.get("dcl_default", []) if r["n"]}
    if "test" not in rows:
        return f"`--loss dcl` with no other loss flag: no test-split runs yet at B = {DCL_DEFAULT_SIZE}."
    t = rows["test"]
    text = (
        f"`python -m clip_dcl.train --loss dcl` with no other loss flag, against `clip` at B = {t['batch_size']}, "
        f"20 epochs, test split, {t['n']} seeds: retrieval mean R@1 {100 * t['mean']:+.2f} points "
        + (f"[{100 * t['lo']:+.2f}, {100 * t['hi']:+.2f}] " if t["n"] >= 2 else "")
        + f"(per seed {', '.join(f'{100 * d:+.2f}' for d in t['diffs'])}): **{t['verdict']}**."
    )
    v = rows.get("validation")
    if v:
        text += (
            f" Validation split: {100 * v['mean']:+.2f} (per seed {', '.join(f'{100 * d:+.2f}' for d in v['diffs'])})."
        )
    return text


def dcl_sweep_block(doc: dict) -> str:
    """docs/results.md's ``dcl`` sweep, from ``dcl_sweep.json``: per setting its paired difference from ``clip``
    at each batch size (test split) with the rule's reading, the sampling-bias zero-shot differences and the
    default the rule picks."""
    conf = f"{100 * doc['confidence']:.0f} %"
    lines = [
        f"Retrieval mean R@1 minus `clip`'s at the same batch, test split, points, mean [{conf} interval] "
        "(seeds, reading):",
        "",
    ]
    for label, d in doc["decision"]["settings"].items():
        cells = [
            f"B = {r['batch_size']}: {_interval(r['test_r1'])} ({_seeds(r['test_r1']['n'])}, {r['reading']})"
            for r in doc["rows"]
            if r["label"] == label
        ]
        lines.append(f"- `{label}`: " + ("; ".join(cells) or "no runs yet") + ".")
        zs = [
            f"{r['classes']} classes (true prior {r['true_tau_plus']:.3g}): {_interval(r)} ({_seeds(r['n'])})"
            for r in doc["sampling_bias"]
            if r["label"] == bias_label(label)
        ]
        if zs:
            lines.append(f"  Zero-shot top-1 minus `clip`'s on the sampling-bias data: {'; '.join(zs)}.")
    swept = {bias_label(label) for label in doc["decision"]["settings"]}
    others = [
        f"`{r['label']}` {_interval(r)} on {r['classes']} classes"
        for r in doc["sampling_bias"]
        if r["label"] not in swept and "oracle" not in r["label"] and r["n"]
    ]
    if others:
        lines.append(
            "- Other priors on the same sampling-bias data, zero-shot top-1 minus `clip`'s (context: not "
            f"in this sweep): {'; '.join(others)}."
        )
    oracle = [f"{r['classes']} classes {_interval(r)}" for r in doc["sampling_bias"] if "oracle" in r["label"]]
    if oracle:
        lines.append(
            f"- The oracle (same-class negatives dropped by the true labels) minus `clip`, zero-shot: "
            f"{'; '.join(oracle)}."
        )
    default = doc["decision"]["default"]
    lines += [
        "",
        "By the rule: "
        + (
            f"`{default}` passes and becomes the default."
            if default
            else "no setting has passed yet (the sweep is not complete)."
            if doc["decision"]["waiting"]
            else "no setting passes at every batch size; `dcl`'s default stays `tau_plus` 0."
        ),
        "",
        f"Status of the report: {doc['status']}",
    ]
    return "\n".join(lines)


def _cleared(r: dict) -> str:
    """``, the interval clearing it by 0.01 point`` for a verdict (:func:`clearance`); nothing without one."""
    c = clearance(r)
    if c is None or r["verdict"] == "no verdict":
        return ""
    return f", the interval clearing it by {100 * c:.2f} point{'' if round(100 * c, 2) == 1 else 's'}"


def which_loss_block(doc: dict) -> str:
    """The numbers behind the README's "which loss when", from this report's JSON (``doc``) and, beside it in
    the results folder, the ``dcl`` screen's (``dcl_screen.json``) and the sampling-bias benchmark's
    (``sampling_bias.json``): per batch size ``decl``'s paired lead over ``clip`` (test split), the temperature
    control, ``--loss dcl`` at its defaults, the best debiased ``dcl`` setting of the screen and the
    sampling-bias data's zero-shot difference."""
    conf = f"{100 * doc['confidence']:.0f} %"
    lines = [f"Paired differences in points, mean [{conf} interval], with the split and the seeds:", ""]
    reach = {r["batch_size"]: r for r in doc["verdicts"] if r["kind"] == "reach" and r["split"] == "test"}
    cells = [
        f"B = {b}: {_interval(r)} against a threshold of {0.0 - 100 * r['gain'] / 2:+.1f} ({r['n']} seeds, "
        f"{r['verdict']}{_cleared(r)})"
        for b, r in sorted(reach.items())
        if r["n"]
    ]
    lines.append(
        "- `decl` at B - `clip` at 2B (reaches when the interval lies above minus half of `clip`'s gain from "
        "B to 2B), retrieval mean R@1, test split: " + ("; ".join(cells) if cells else "no test-split runs yet") + "."
    )
    again = [r for r in doc.get("draws", []) if r["n"]]
    for r in again:
        other = 2 * r["batch_size"] if r["kind"] == "reach" else r["batch_size"]
        lines.append(
            f"- The same on another draw of the data (`--seed {r['data_seed']}`: other training, validation and "
            f"test images), `decl` at {r['batch_size']} - `clip` at {other}, test split: {_interval(r)} "
            + (f"against a threshold of {0.0 - 100 * r['gain'] / 2:+.1f} " if r["kind"] == "reach" else "")
            + f"({r['n']} seeds, {r['verdict']}{_cleared(r)})."
        )
    beat = {r["batch_size"]: r for r in doc["verdicts"] if r["kind"] == "beat" and r["split"] == "test"}
    cells = [f"B = {b}: {_interval(r)} ({r['n']} seeds, {r['verdict']})" for b, r in sorted(beat.items()) if r["n"]]
    lines.append(
        "- `decl` - `clip` at the same batch, retrieval mean R@1, test split: "
        + ("; ".join(cells) if cells else "no test-split runs yet")
        + "."
    )
    for b, c in sorted(control_leads(doc["runs"]).items()):
        for name, what in (
            ("clip at decl scale - clip", "InfoNCE trained at `decl`'s final temperature - `clip`"),
            ("decl - clip at decl scale", "`decl` - InfoNCE trained at `decl`'s final temperature"),
            ("decl at clip scale - clip", "`decl` trained at `clip`'s final temperature - `clip`"),
        ):
            if name not in c:
                continue
            lines.append(
                f"- {what}, B = {b}, test split: {_interval(c[name])} ({c[name]['n']} seeds, {c[name]['verdict']})."
            )
    s16 = doc.get("screen16") or {}
    for r in (r for r in s16.get("verdicts", []) if r["n"]):
        threshold = f" against a threshold of {0.0 - 100 * r['gain'] / 2:+.1f}" if r["kind"] == "reach" else ""
        lines.append(
            f"- `{r['label']}` (the best of the B = {SCREEN16_SIZE} screen on the validation split) at "
            f"{r['batch_size']} - `{r['against'].replace(' at ', '` at ')}, retrieval mean R@1, test split: "
            f"{_interval(r)}{threshold} ({r['n']} seeds, {r['verdict']}{_cleared(r)})."
        )
    dcl = {r["split"]: r for r in doc.get("dcl_default", []) if r["n"]}
    if "test" in dcl:
        r = dcl["test"]
        lines.append(
            f"- `--loss dcl` at its defaults - `clip`, B = {r['batch_size']}, retrieval mean R@1, test split: "
            f"{100 * r['mean']:+.2f}"
            + (f" [{100 * r['lo']:+.2f}, {100 * r['hi']:+.2f}]" if r["n"] >= 2 else "")
            + f" ({r['n']} seeds, {r['verdict']})."
        )
    screen_path = RESULTS / "dcl_screen.json"
    if screen_path.is_file():
        screen = json.loads(screen_path.read_text())
        idx = {(r["label"], r["batch_size"], r["seed"]): r["metrics"][MEAN_R1] for r in screen["runs"]}
        diffs = [
            (v - idx[("clip", b, seed)], lab, b)
            for (lab, b, seed), v in idx.items()
            if lab != "clip" and ("clip", b, seed) in idx
        ]
        if diffs:
            best = max(diffs)
            lines.append(
                f"- The debiased `dcl` screen ({screen['data']['num_classes']} classes, validation split, "
                f"one seed): its best setting, `{best[1]}`, - `clip` at B = {best[2]}: {100 * best[0]:+.1f}; "
                f"settings through the screen: {', '.join(screen['passing']) or 'none'}."
            )
    sweep_path = RESULTS / "dcl_sweep.json"
    if sweep_path.is_file():
        sweep = json.loads(sweep_path.read_text())
        for label, d in sweep["decision"]["settings"].items():
            cells = [
                f"B = {r['batch_size']}: {_interval(r['test_r1'])} ({_seeds(r['test_r1']['n'])}, {r['reading']})"
                for r in sweep["rows"]
                if r["label"] == label
            ]
            rule = (
                "passes"
                if d["passes"]
                else f"fails (trails at B = {', '.join(map(str, d['trails_at']))})"
                if d["trails_at"]
                else "no reading yet at every batch size"
            )
            lines.append(
                f"- The `dcl` sweep, `{label}` - `clip` at the same batch, retrieval mean R@1, test split: "
                + ("; ".join(cells) or "no runs yet")
                + f"; by the default's rule: {rule}."
            )
    zero_shot: Dict[tuple, str] = {}  # (objective, classes): its line; the sweep's reports first, then the main one
    for r in json.loads(sweep_path.read_text())["sampling_bias"] if sweep_path.is_file() else []:
        if r["label"].startswith("dcl tau+=") and r["n"]:
            zero_shot[(r["label"], r["classes"])] = _zero_shot_line(
                r["label"], r["classes"], r["true_tau_plus"], _interval(r), r["n"]
            )
    for r in bias_rows([RESULTS / "sampling_bias.json"]):
        if r["label"].startswith("dcl tau+=") and r["n"] and (r["label"], r["classes"]) not in zero_shot:
            zero_shot[(r["label"], r["classes"])] = _zero_shot_line(
                r["label"], r["classes"], r["true_tau_plus"], _interval(r), r["n"]
            )
    return "\n".join(lines + [zero_shot[k] for k in sorted(zero_shot, key=lambda k: (k[1], float(k[0].split("=")[1])))])


def _zero_shot_line(name: str, classes: int, true_tau: float, interval: str, n: int) -> str:
    """One which-loss line: a ``dcl tau+=t`` run's zero-shot top-1 minus ``clip``'s on the sampling-bias data."""
    return (
        f"- `{name.replace('tau+=', '--tau-plus ')}` - `clip`, zero-shot top-1 on the {classes}-class sampling-bias "
        f"data (true prior {true_tau:.3g}), held-out split: {interval} ({_seeds(n)})."
    )
