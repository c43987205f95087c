"""Exploratory readings of the Fashion-MNIST screen: per setting, what the study report's single metric leaves out.

    python benchmarks/fmnist_readings.py --work benchmarks/studies/fmnist_screen.work

Reads the screen's work folder (``clip-dcl study run benchmarks/studies/fmnist_screen.toml --work ...``) and
writes ``benchmarks/results/fmnist_readings.{md,json}``, every number on the **validation split** (the screen's
test scores are never read: the test images are the official ones every draw shares, read once, by the
confirmatory study):

- per arm and seed: zero-shot top-1 and top-5 with the real class names, retrieval mean R@1, the final logit
  scale (OpenCLIP's log), and for ``--tau-plus auto`` the prior it estimated;
- InfoNCE's temperature tuning: every InfoNCE setting's mean and per-seed scores, the one chosen, and the
  spread of the seeds against the spread of the settings;
- what ``--tau-plus auto`` estimated on these images against the data's true prior (``sum_c p_c^2`` of the
  training labels, from the data's ``summary.json``).

Retrieval on these captions has near-duplicate targets: a caption names the class and two to four coarse
attributes, so other images of the same class often carry a caption with the same words. The evaluator counts
a tie against the query (a false item scoring equal to the true one ranks above it), so an identical caption
of another image costs the image-to-text rank; retrieval is reported, never the metric a choice is made on.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

import tomllib

from clip_dcl.experiment.reporting import about_lines, code_commit, machine_info, utc_date
from clip_dcl.paths import write_json

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SCREEN = ROOT / "benchmarks" / "studies" / "fmnist_screen.toml"
#: what the screen's committed records hold: OpenCLIP's gzipped out.log, from before runs wrote metrics.jsonl
_LOGGED = {"logit_scale": re.compile(r"Logit Scale: ([0-9.]+)"), "tau_plus": re.compile(r"Tau_plus: ([0-9.eE+-]+)")}


def logged_values(folder: Path, key: str) -> list:
    """``key``'s value in each training record of the run's ``metrics.jsonl``; for a committed record
    older than that file, the values its gzipped ``out.log`` shows."""
    import gzip

    from clip_dcl.train.metrics import read_metrics

    if (folder / "metrics.jsonl").is_file():
        return [r[key] for r in read_metrics(folder, "train") if key in r]
    gz = folder / "out.log.gz"
    if not gz.is_file():
        return []
    return [float(v) for v in _LOGGED[key].findall(gzip.decompress(gz.read_bytes()).decode(errors="replace"))]


def read_runs(work: Path, arms: dict) -> list:
    """One row per finished run of the screen: its validation scores and what its log says."""
    rows = []
    for arm, flags in arms.items():
        for folder in sorted((work / "runs" / arm).glob("seed*")):
            scores = folder / "scores-validation.json"
            if not scores.is_file():
                continue
            v = json.loads(scores.read_text())
            taus = logged_values(folder, "tau_plus")
            scales = logged_values(folder, "logit_scale")
            if "--dcl-temperature" in flags:  # the loss's own fixed scale; the model's logged one gets no gradient
                scales = [1.0 / float(flags[flags.index("--dcl-temperature") + 1])]
            rows.append(
                {
                    "arm": arm,
                    "seed": int(folder.name[4:]),
                    "flags": flags,
                    "zeroshot_top1": 100 * v["zeroshot/top1"],
                    "zeroshot_top5": 100 * v["zeroshot/top5"],
                    "retrieval_mean_R@1": 100 * v["retrieval/mean_R@1"],
                    "final_logit_scale": scales[-1] if scales else None,
                    # the last tenth of training's logged estimates: where the moving average has settled
                    "tau_plus_estimate": statistics.mean(taus[-max(1, len(taus) // 10) :]) if taus else None,
                    "tau_plus_logged": len(taus),
                }
            )
    return rows


def is_infonce(flags: list) -> bool:
    loss = flags[flags.index("--loss") + 1]
    return loss == "clip" or (loss == "dcl" and flags[flags.index("--tau-plus") + 1] in ("0", "0.0"))


def summarise(rows: list) -> dict:
    by_arm = {}
    for r in rows:
        by_arm.setdefault(r["arm"], []).append(r)
    arms = {}
    for arm, rs in by_arm.items():
        top1 = [r["zeroshot_top1"] for r in rs]
        arms[arm] = {
            "seeds": [r["seed"] for r in rs],
            "zeroshot_top1": top1,
            "mean_top1": statistics.mean(top1),
            "mean_top5": statistics.mean(r["zeroshot_top5"] for r in rs),
            "mean_retrieval_R@1": statistics.mean(r["retrieval_mean_R@1"] for r in rs),
            "final_logit_scale": [r["final_logit_scale"] for r in rs],
            "tau_plus_estimate": [r["tau_plus_estimate"] for r in rs if r["tau_plus_estimate"] is not None],
            "flags": rs[0]["flags"],
        }
    return arms


def tuning(arms: dict, b: int) -> dict:
    """The InfoNCE settings at ``b``: their means, the chosen one, the settings' range against the seeds' spread."""
    names = [a for a, s in arms.items() if a.endswith(f"-b{b}") and is_infonce(s["flags"])]
    if not names:
        return {}
    means = {a: arms[a]["mean_top1"] for a in names}
    chosen = max(means, key=means.get)
    seed_sd = [statistics.stdev(arms[a]["zeroshot_top1"]) for a in names if len(arms[a]["zeroshot_top1"]) > 1]
    return {
        "settings": names,
        "means": means,
        "chosen": chosen,
        "range_of_means": max(means.values()) - min(means.values()),
        "mean_seed_sd": statistics.mean(seed_sd) if seed_sd else None,
    }


def markdown(doc: dict) -> str:
    out = [
        "# Fashion-MNIST screen: readings (exploratory, validation split)",
        "",
        *about_lines(command=doc["command"], date=doc["date"], machine=doc["machine"], status=doc["status"]),
        f"- Code: {doc['commit']}",
        f"- Plan: `benchmarks/studies/fmnist_screen.toml` (its verdict table: [fmnist_screen.md](fmnist_screen.md)); "
        f"data: {doc['data']}",
        "- Every number is on the validation split (2,000 images held out of the official training set); the "
        "screen chooses, it makes no claim.",
        "",
        "Retrieval counts a tie against the query: another image's caption scoring equal to the true one ranks "
        "above it, and captions here repeat (the class name and two to four coarse attributes), so retrieval is "
        "reported, never chosen on.",
        "",
        "## Every setting",
        "",
        "| arm | seeds | zero-shot top-1 per seed | mean top-1 | mean top-5 | mean retrieval R@1 | final logit scale "
        "(fixed: 1/--dcl-temperature) |",
        "|---|---:|---|---:|---:|---:|---|",
    ]
    for arm, s in doc["arms"].items():
        per = ", ".join(f"{v:.2f}" for v in s["zeroshot_top1"])
        scales = ", ".join(f"{v:.1f}" for v in s["final_logit_scale"] if v is not None)
        out.append(
            f"| {arm} | {len(s['seeds'])} | {per} | {s['mean_top1']:.2f} | {s['mean_top5']:.2f} | "
            f"{s['mean_retrieval_R@1']:.2f} | {scales} |"
        )
    out += ["", "## InfoNCE's temperature, tuned", ""]
    for b, t in doc["tuning"].items():
        if not t:
            continue
        line = (
            f"- B = {b}: {len(t['settings'])} settings ({', '.join(t['settings'])}); chosen **{t['chosen']}** "
            f"({t['means'][t['chosen']]:.2f}); the settings' means span {t['range_of_means']:.2f} points"
        )
        if t["mean_seed_sd"] is None:
            line += "; one seed a setting so far: no spread of the seeds to set it against."
        else:
            line += (
                f", while the seeds of one setting have a spread (sd) of {t['mean_seed_sd']:.2f} points on "
                "average: "
                + (
                    "the grid's differences are within twice the seeds' spread, so the choice is close to a coin's."
                    if t["range_of_means"] < 2 * t["mean_seed_sd"]
                    else "the grid's differences exceed twice the seeds' spread."
                )
            )
        out.append(line)
    auto = doc["auto_prior"]
    out += ["", "## What `--tau-plus auto` estimates", ""]
    if auto["estimates"]:
        out.append(
            f"The data's true prior is tau+ = {auto['true']:.4f} (`sum_c p_c^2` of the training labels; "
            f"{auto['true_distinct']:.4f} over pairs of distinct samples). `--tau-plus auto` "
            f"({', '.join(auto['arms'])}) estimated, over the last tenth of training: "
            + ", ".join(f"{v:.4f}" for v in auto["estimates"])
            + f" (mean {auto['mean']:.4f}, {auto['mean'] / auto['true']:.1f} times the true prior)."
        )
    else:
        out.append("No `--tau-plus auto` run has finished.")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--work", required=True, help="the screen's work folder")
    p.add_argument("--out", default=str(RESULTS / "fmnist_readings"), help="output path without extension")
    args = p.parse_args(argv)
    work = Path(args.work)
    plan = tomllib.loads(SCREEN.read_text())
    arms_flags = {a["name"]: a["flags"] for a in plan["arms"]}
    rows = read_runs(work, arms_flags)
    if not rows:
        p.error(f"--work {args.work}: no scored run of the screen there")
    arms = summarise(rows)
    summary = json.loads((work / "data" / "summary.json").read_text())
    auto_arms = [a for a, s in arms.items() if "auto" in s["flags"]]
    estimates = [v for a in auto_arms for v in arms[a]["tau_plus_estimate"]]
    planned = len(arms_flags) * len(plan["seeds"])
    doc = {
        "status": "complete" if len(rows) == planned else f"incomplete ({len(rows)} of {planned} runs)",
        "command": f"python benchmarks/fmnist_readings.py --work {args.work}",
        "date": utc_date(),
        "machine": machine_info(),
        "commit": code_commit(),
        "split": "validation",
        "data": f"clip-dcl data fashion-mnist, draw {summary['config']['seed']}, "
        f"{summary['train']['num_samples']} training pairs, {summary['val']['num_samples']} validation images",
        "runs": rows,
        "arms": arms,
        "tuning": {b: tuning(arms, b) for b in (32, 64)},
        "auto_prior": {
            "true": summary["tau_plus"],
            "true_distinct": summary["same_class_rate_distinct_pairs"],
            "arms": auto_arms,
            "estimates": estimates,
            "mean": statistics.mean(estimates) if estimates else None,
        },
    }
    out = Path(args.out)
    write_json(out.with_suffix(".json"), doc)
    out.with_suffix(".md").write_text(markdown(doc))
    print(f"wrote {out.with_suffix('.md')} and .json ({doc['status']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())


def readme_block(doc: dict) -> str:
    """docs/results.md's block: the screen's readings in a few lines (exploratory; every number from the JSON)."""
    arms = doc["arms"]
    if not arms:
        return "No run of the Fashion-MNIST screen has finished."
    lines = [
        f"Exploratory, validation split ({doc['data']}; {doc['status']}). Mean validation zero-shot top-1 over "
        "the seeds, and each setting's mean paired difference against `clip` at the same batch (two seeds: their "
        "90 % intervals, wide, are in the screen's report; no setting is judged here):",
        "",
    ]
    for b in (32, 64):
        clip = arms.get(f"clip-b{b}")
        if clip is None:
            continue
        parts = []
        for arm, s in arms.items():
            if not arm.endswith(f"-b{b}") or arm == f"clip-b{b}":
                continue
            paired = [
                v - clip["zeroshot_top1"][clip["seeds"].index(k)]
                for k, v in zip(s["seeds"], s["zeroshot_top1"])
                if k in clip["seeds"]
            ]
            parts.append(f"`{arm[: -len(f'-b{b}')]}` {s['mean_top1']:.1f} ({statistics.mean(paired):+.1f})")
        lines.append(f"- B = {b}: `clip` {clip['mean_top1']:.1f}; " + ", ".join(parts) + ".")
    auto = doc["auto_prior"]
    if auto["estimates"]:
        lines += [
            "",
            f"`--tau-plus auto` settled at {auto['mean']:.3f} on average (seeds: "
            + ", ".join(f"{v:.3f}" for v in auto["estimates"])
            + f") where the true prior is {auto['true']:.3f}.",
        ]
    for b, t in doc["tuning"].items():
        if t:
            lines.append(
                f"InfoNCE's temperature at B = {b}: {len(t['settings'])} settings, their means within "
                f"{t['range_of_means']:.1f} points; chosen `{t['chosen']}`."
            )
    return "\n".join(lines)
