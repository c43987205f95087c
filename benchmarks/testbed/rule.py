"""The batch-size testbed's decision rule (:data:`RULE`) and the readings of its reports.

``decl`` at batch B **reaches** ``clip`` at 2B when the paired interval of decl@B - clip@2B lies above minus
half of ``clip``'s own gain from B to 2B; it **beats** ``clip`` at B by the study rule's ``beats``
(:func:`clip_dcl.experiment.study.rule.verdict`), with :data:`MIN_SEEDS` seeds at least. The ``dcl`` sweep reads
its paired intervals against zero (:func:`noise_reading`, :data:`DCL_RULE`). Everything here is a function of
the runs' records (dicts with ``label``, ``batch_size``, ``seed``, ``metrics`` and ``test_metrics``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from clip_dcl.experiment.scoring import MEAN_R1
from clip_dcl.experiment.stats import mean_std, t_interval
from clip_dcl.experiment.study.rule import verdict

from .objectives import (
    DCL_DEFAULT,
    DCL_DEFAULT_SIZE,
    DCL_SWEEP_SIZES,
    DCL_SWEEP_VARIANTS,
    DCL_VARIANTS,
    DECISIVE_SIZES,
    GATE_POINTS,
    RESULTS,
    SCREEN16_SIZE,
    SCREEN16_VARIANTS,
    VERDICT_SIZES,
)

CONFIDENCE = 0.90
#: the evaluation's resolution: about one point of mean R@1 on 1,000 images (fractions here)
RESOLUTION = 0.01
MIN_SEEDS = 3
SEED_CAP = 10
#: the rule as the archived testbed applied it (past tense: the testbed no longer runs; docs/results.md says
#: what replaced it)
RULE = (
    f"Differences were paired by seed (same data order and initialisation) and summarised by their mean and "
    f"{100 * CONFIDENCE:.0f} % t-interval over seeds. **Reaches** `clip` at 2B: the interval of decl@B - clip@2B lay "
    f"above minus half of `clip`'s own gain from B to 2B (mean over the same seeds); **does not reach**: it lay "
    f"below; otherwise no verdict. **Beats** `clip` at B: the interval of decl@B - clip@B lay above zero and the "
    f"mean exceeded the resolution ({100 * RESOLUTION:.0f} point of R@1 on 1,000 images); **trails**: the mirror "
    f"image; an interval on one side of zero whose mean was inside the resolution was a **tie**, never a win; an "
    f"interval across zero gave no verdict. Seeds were added one at a time on the test split "
    f"({MIN_SEEDS} at least, {SEED_CAP} at most) until the reach verdict was given, a stopping rule that inflates "
    f"the false-verdict rate; the testbed is archived, and the confirmatory study, its seeds fixed before its "
    f"first run, decides instead (docs/results.md)."
)


def plateau(curve: Sequence[float]) -> Optional[float]:
    """Change of the validation R@1 over the last fifth of training (points; small = a plateau)."""
    if len(curve) < 5:
        return None
    tail = curve[-max(2, len(curve) // 5) :]
    return 100 * (tail[-1] - tail[0])


def gate(records: List[dict], sizes: Sequence[int]) -> Optional[dict]:
    """``clip``'s R@1 at the largest batch minus the smallest, and whether the seeds' ranges overlap."""
    by_b = {
        b: [r["metrics"][MEAN_R1] for r in records if r["label"] == "clip" and r["batch_size"] == b]
        for b in (min(sizes), max(sizes))
    }
    lo, hi = by_b[min(sizes)], by_b[max(sizes)]
    if not lo or not hi:
        return None
    gain = sum(hi) / len(hi) - sum(lo) / len(lo)
    separate = min(hi) > max(lo)
    return {
        "small": min(sizes),
        "large": max(sizes),
        "gain": gain,
        "separate": separate,
        "seeds": (len(lo), len(hi)),
        "passed": gain >= GATE_POINTS and separate and min(len(lo), len(hi)) >= 3,
    }


def per_seed(records: List[dict], key: str = "test_metrics") -> Dict[tuple, float]:
    """``{(label, batch, seed): mean R@1}`` of the records that have ``key`` (a split's metrics)."""
    return {(r["label"], r["batch_size"], r["seed"]): r[key][MEAN_R1] for r in records if r.get(key)}


def comparison(
    records: List[dict], label: str, b: int, other: int, key: str = "test_metrics", reference: str = "clip"
) -> dict:
    """``label`` at ``b`` minus ``reference`` at ``other``, paired by seed: the seeds, the per-seed
    differences, their interval, and ``clip``'s own gain from ``b`` to ``2 b`` on the same seeds."""
    idx = per_seed(records, key)
    seeds = sorted(
        s
        for (lab, bb, s) in idx
        if lab == label
        and bb == b
        and (reference, other, s) in idx
        and (reference, b, s) in idx
        and (reference, 2 * b, s) in idx
    )
    diffs = [idx[(label, b, s)] - idx[(reference, other, s)] for s in seeds]
    gains = [idx[(reference, 2 * b, s)] - idx[(reference, b, s)] for s in seeds]
    return {
        "label": label,
        "batch_size": b,
        "against": f"{reference} at {other}",
        "seeds": seeds,
        "diffs": diffs,
        "gain": mean_std(gains)["mean"],
        **t_interval(diffs),
    }


def reach_verdict(c: dict) -> str:
    """ "reaches", "does not reach" or "no verdict": the interval of decl@B - clip@2B against minus half of
    ``clip``'s gain from B to 2B (the study rule's ``reaches``; no verdict below :data:`MIN_SEEDS` seeds)."""
    return verdict("reaches", c, margin=c["gain"] / 2, min_seeds=MIN_SEEDS)


def beat_verdict(c: dict) -> str:
    """ "beats" or "trails" (the interval on one side of zero), "tie" (that, with a mean inside
    :data:`RESOLUTION`) or "no verdict" (an interval across zero) for decl@B - clip@B (the study rule's ``beats``)."""
    return verdict("beats", c, resolution=RESOLUTION, min_seeds=MIN_SEEDS)


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


def draw_rows(draws: Dict[int, List[dict]], sizes: Sequence[int] = DECISIVE_SIZES) -> List[dict]:
    """The decisive comparisons (reach and beat, test split, :data:`RULE`) on each other draw of the data."""
    return [
        {**r, "data_seed": seed}
        for seed, records in sorted(draws.items())
        for b in sizes
        for r in judged(records, "decl default", b)
        if r["n"]
    ]


def screen16_choice(records: List[dict], seed: int = 0) -> dict:
    """The B = 16 screen on the validation split: the score of ``decl default`` and of each of
    :data:`SCREEN16_VARIANTS` at ``seed``, those not run yet, and the best (None until every one has run;
    ``decl default`` when no variant scores above it)."""
    val = per_seed(records, "metrics")
    names = ("decl default", *SCREEN16_VARIANTS)
    scores = {n: val[(n, SCREEN16_SIZE, seed)] for n in names if (n, SCREEN16_SIZE, seed) in val}
    missing = [n for n in names if n not in scores]
    return {
        "seed": seed,
        "scores": scores,
        "missing": missing,
        "best": None if missing else max(scores, key=scores.get),
    }


def screen16_rows(records: List[dict], best: Optional[str]) -> List[dict]:
    """The screen's best variant at B = 16 against ``clip`` at 32 (reach) and at 16 (beat), test split,
    :data:`RULE`; none when the best is the package default (its verdicts are the decisive table's)."""
    if not best or best == "decl default":
        return []
    return judged(records, best, SCREEN16_SIZE)


def clearance(r: dict) -> Optional[float]:
    """How far a comparison's interval lies past its threshold (fraction; positive: the side its verdict names,
    negative: short of either side by that much), or None below two seeds."""
    if r["n"] < 2:
        return None
    threshold = -r["gain"] / 2 if r["kind"] == "reach" else 0.0
    return max(r["lo"] - threshold, threshold - r["hi"])


def control_leads(records: List[dict]) -> Dict[int, Dict[str, dict]]:
    """Per decisive batch size with a temperature control run: ``decl``'s lead over ``clip`` (on the seeds a
    control ran), over InfoNCE at ``decl``'s scale, InfoNCE at ``decl``'s scale over ``clip``, and ``decl`` at
    ``clip``'s scale over ``clip``; each paired by seed on the test split over the seeds both of its arms have
    (:func:`t_interval` plus the per-seed ``diffs``, the ``seeds`` and the :func:`beat_verdict`)."""
    idx = per_seed(records)
    out = {}
    for b in DECISIVE_SIZES:
        arms = {
            "clip": ("clip", b),
            "decl": ("decl default", b),
            "clip at decl scale": (f"clip at decl's scale (B={b})", b),
            "decl at clip scale": (f"decl at clip's scale (B={b})", b),
        }
        controlled = {
            s for (lab, bb, s) in idx if (lab, bb) in (arms["clip at decl scale"], arms["decl at clip scale"])
        }
        comparisons = {}
        for name, (x, y) in {
            "decl - clip": ("decl", "clip"),
            "decl - clip at decl scale": ("decl", "clip at decl scale"),
            "clip at decl scale - clip": ("clip at decl scale", "clip"),
            "decl at clip scale - clip": ("decl at clip scale", "clip"),
        }.items():
            seeds = sorted(s for s in controlled if (*arms[x], s) in idx and (*arms[y], s) in idx)
            if seeds:
                diffs = [idx[(*arms[x], s)] - idx[(*arms[y], s)] for s in seeds]
                st = t_interval(diffs)
                comparisons[name] = {**st, "diffs": diffs, "seeds": seeds, "verdict": beat_verdict(st)}
        if any(name != "decl - clip" for name in comparisons):
            out[b] = comparisons
    return out


def dcl_default_rows(records: List[dict]) -> List[dict]:
    """``--loss dcl`` at its package defaults minus ``clip`` at :data:`DCL_DEFAULT_SIZE`, paired by seed, on the
    test split (the check) and the validation split (context): each with its seeds, per-seed differences,
    interval and the rule's reading: **trails** when the interval lies below zero, **within the seeds' noise**
    when it holds zero, **above** when it lies above zero (below :data:`MIN_SEEDS` seeds: no verdict)."""
    rows = []
    for split, key in (("test", "test_metrics"), ("validation", "metrics")):
        idx = per_seed(records, key)
        seeds = sorted(
            s for (lab, b, s) in idx if lab == DCL_DEFAULT and b == DCL_DEFAULT_SIZE and ("clip", b, s) in idx
        )
        diffs = [idx[(DCL_DEFAULT, DCL_DEFAULT_SIZE, s)] - idx[("clip", DCL_DEFAULT_SIZE, s)] for s in seeds]
        st = t_interval(diffs)
        rows.append(
            {
                "split": split,
                "batch_size": DCL_DEFAULT_SIZE,
                "seeds": seeds,
                "diffs": diffs,
                **st,
                "verdict": noise_reading(st),
            }
        )
    return rows


def noise_reading(st: dict) -> str:
    """The ``dcl`` rule's reading of a paired interval against ``clip``: **trails** when it lies below zero,
    **above** when it lies above, **within the seeds' noise** when it holds zero; below :data:`MIN_SEEDS`
    seeds, no verdict."""
    if st["n"] < MIN_SEEDS:
        return "no verdict"
    return "trails" if st["hi"] < 0 else "above" if st["lo"] > 0 else "within the seeds' noise"


#: the rule that picks ``dcl``'s defaults from the sweep (stated in the issue that asked for the sweep, before it ran)
DCL_RULE = (
    f"A `dcl` setting can be the default when at no batch size of the sweep it trails `clip` by more than the "
    f"seeds' noise: at every batch size ({', '.join(map(str, DCL_SWEEP_SIZES))}) the {100 * CONFIDENCE:.0f} % "
    f"t-interval of its retrieval mean R@1 minus `clip`'s (test split, paired by seed, {MIN_SEEDS} seeds at least) "
    "holds zero or lies above it. Among the settings that pass, the default is the one with the best zero-shot "
    "top-1 on the sampling-bias data (4 and 10 classes). If none passes, `dcl`'s default stays `tau_plus` 0 "
    "(InfoNCE exactly) and the README and `--help` say so."
)
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
            clamps = [
                r["clamp_rate"]
                for r in records
                if r["label"] == label and r["batch_size"] == b and r.get("clamp_rate") is not None
            ]
            row["clamp_rate"] = sum(clamps) / len(clamps) if clamps else None
            rows.append(row)
    return rows


def dcl_bias_rows(folder: Path = RESULTS) -> List[dict]:
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
            rows.append(
                {
                    "classes": doc["data"]["config"]["num_classes"],
                    "true_tau_plus": doc["true_tau_plus"],
                    "label": label,
                    "report": path.name,
                    "complete": doc.get("complete", False),
                    "seeds": [s for s, _ in pairs],
                    "diffs": [d for _, d in pairs],
                    **t_interval([d for _, d in pairs]),
                }
            )
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
        out[label] = {
            "passes": not missing and not trails,
            "trails_at": trails,
            "missing": missing,
            "bias_zeroshot": sum(zs) / len(zs) if zs else None,
        }
    passing = [lab for lab, d in out.items() if d["passes"]]
    best = max(
        passing,
        key=lambda lab: out[lab]["bias_zeroshot"] if out[lab]["bias_zeroshot"] is not None else float("-inf"),
        default=None,
    )
    return {"settings": out, "default": best, "waiting": any(d["missing"] and not d["trails_at"] for d in out.values())}
