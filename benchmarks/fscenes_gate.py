"""The scene testbed's gates: does `clip` gain from a bigger batch on Fashion-MNIST scenes? (exploratory, validation)

    python benchmarks/fscenes_gate.py                       # every gate's committed records
    python benchmarks/fscenes_gate.py --work benchmarks/studies/fscenes_gate.toml=benchmarks/work/fscenes_gate --keep

Each gate is a study plan ``benchmarks/studies/fscenes_gate*.toml`` (one scene variant, `clip` at B = 16 ... 256,
three seeds); its runs are read from ``benchmarks/studies/<plan>.work`` (the committed records) unless
``--work PLAN=DIR`` names another folder (``--keep`` copies that folder's records there first). Writes
``benchmarks/results/fscenes_gate.{md,json}`` holding every
gate tried, each with its verdict under the rule its plan states before the runs:

- **pass**: retrieval mean R@1 on the validation scenes gains at least 3 points from B = 16 to B = 256 (the
  means over the seeds), and every seed of B = 256 scores above every seed of B = 16;
- **fail** otherwise; **no verdict** while a run of B = 16 or B = 256 is missing.

The test scores the runs also hold are never read here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import tomllib

from clip_dcl.experiment.recipes import get_recipe
from clip_dcl.experiment.reporting import about_lines, code_commit, machine_info, utc_date
from clip_dcl.experiment.stats import t_interval
from clip_dcl.paths import shown_text, write_json

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
STUDIES = ROOT / "benchmarks" / "studies"
#: the rule, in points of retrieval mean R@1
MIN_GAIN = 3.0
SMALL, LARGE = 16, 256


def keep_records(work: Path, records: Path) -> int:
    """Copy a gate's records (no data, no checkpoints) from its work folder into ``records``: the seal, the
    attempts, the plan, the data's summary and per finished run ``run.json``, both score files, ``params.txt`` and
    OpenCLIP's ``out.log`` gzipped, their paths as `clip_dcl.paths.shown_text` writes them. Returns the runs
    copied."""
    import gzip
    import shutil

    for name in ("SEAL.json", "attempts.jsonl", "plan.toml", "data/summary.json"):
        if (work / name).is_file():
            (records / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(work / name, records / name)
    copied = 0
    for run in sorted((work / "runs").glob("*/seed*")):
        if not (run / "run.json").is_file():
            continue
        dest = records / run.relative_to(work)
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("run.json", "scores-validation.json", "scores-test.json"):
            if (run / name).is_file():
                shutil.copyfile(run / name, dest / name)
        if (run / "params.txt").is_file():
            (dest / "params.txt").write_text(shown_text((run / "params.txt").read_text(), [work]))
        if (run / "out.log").is_file():
            with (
                open(dest / "out.log.gz", "wb") as raw,
                gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f,
            ):
                f.write(shown_text((run / "out.log").read_text(errors="replace"), [work]).encode())
        copied += 1
    return copied


def read_gate(plan_path: Path, work: Path) -> dict:
    """One gate: its plan's arms and data, every finished run's validation score and training time, its verdict."""
    plan = tomllib.loads(plan_path.read_text())
    recipe = get_recipe(plan["recipe"])
    arms = {a["name"]: a for a in plan["arms"]}
    runs = []
    for name, arm in arms.items():
        for seed in plan["seeds"]:
            folder = work / "runs" / name / f"seed{seed}"
            scores, record = folder / "scores-validation.json", folder / "run.json"
            if not (scores.is_file() and record.is_file()):
                continue
            v, r = json.loads(scores.read_text()), json.loads(record.read_text())
            runs.append(
                {
                    "arm": name,
                    "batch_size": arm["batch_size"],
                    "seed": seed,
                    "retrieval_mean_R@1": 100 * v["retrieval/mean_R@1"],
                    "image_to_text_R@1": 100 * v["retrieval/image_to_text_R@1"],
                    "text_to_image_R@1": 100 * v["retrieval/text_to_image_R@1"],
                    "zeroshot_top1": 100 * v["zeroshot/top1"] if "zeroshot/top1" in v else None,
                    "train_seconds": r.get("train_seconds"),
                    "commit": r.get("commit"),
                    "machine": r.get("machine"),
                    "threads": r.get("threads"),
                    "flags": recipe.train_argv(
                        batch_size=arm["batch_size"], seed=seed, epochs=plan["train"]["epochs"], objective=arm["flags"]
                    ),
                }
            )
    by_b: dict = {}
    for r in runs:
        by_b.setdefault(r["batch_size"], []).append(r)
    batches = {
        b: {
            "seeds": [r["seed"] for r in rs],
            "R@1": [r["retrieval_mean_R@1"] for r in rs],
            "mean_R@1": statistics.mean(r["retrieval_mean_R@1"] for r in rs),
            "mean_zeroshot_top1": statistics.mean(r["zeroshot_top1"] for r in rs)
            if all(r["zeroshot_top1"] is not None for r in rs)
            else None,
            "mean_train_seconds": statistics.mean(r["train_seconds"] for r in rs)
            if all(r["train_seconds"] for r in rs)
            else None,
        }
        for b, rs in sorted(by_b.items())
    }
    planned = len(arms) * len(plan["seeds"])
    gate = {
        "plan": str(plan_path.relative_to(ROOT)),
        "title": plan["title"],
        "recipe": plan["recipe"],
        "epochs": plan["train"]["epochs"],
        "seeds": plan["seeds"],
        "metric": plan["metric"],
        "split": "validation",
        "runs_planned": planned,
        "runs_finished": len(runs),
        "status": "complete" if len(runs) == planned else f"incomplete ({len(runs)} of {planned} runs)",
        "batches": batches,
        "runs": runs,
    }
    summary = work / "data" / "summary.json"
    if summary.is_file():
        s = json.loads(summary.read_text())
        gate["data"] = {
            "command": recipe.data_argv,
            "config": s["config"],
            "scene_classes": s.get("scene_classes"),
            "train": s["train"]["num_samples"],
            "validation": s["val"]["num_samples"],
        }
    small, large = batches.get(SMALL), batches.get(LARGE)
    if not (small and large and len(small["R@1"]) == len(large["R@1"]) == len(plan["seeds"])):
        gate["verdict"] = "no verdict"
        return gate
    gain = large["mean_R@1"] - small["mean_R@1"]
    paired = [a - b for a, b in zip(large["R@1"], small["R@1"])]
    separated = min(large["R@1"]) > max(small["R@1"])
    gate.update(
        {
            "gain": gain,
            "paired_gain": t_interval(paired),
            "every_large_above_every_small": separated,
            "verdict": "pass" if gain >= MIN_GAIN and separated else "fail",
        }
    )
    return gate


def markdown(doc: dict) -> str:
    out = [
        "# The scene testbed's gates (exploratory, validation split)",
        "",
        *about_lines(command=doc["command"], date=doc["date"], machine=doc["machine"], status=doc["status"]),
        f"- Code: {doc['commit']}",
        f"- Rule (stated in each plan before its runs): retrieval mean R@1 on the validation scenes gains at least "
        f"{MIN_GAIN:g} points from B = {SMALL} to B = {LARGE} (means over the seeds), and every seed of B = {LARGE} "
        f"scores above every seed of B = {SMALL}. `clip` only; nothing here judges a loss.",
        "- Training times are those of the runs as they ran (one torch thread each, two runs at once, on a machine "
        "other work shared): a measure of that day's load as much as of the recipe's cost.",
        "",
    ]
    for k, g in enumerate(doc["gates"], 1):
        out += [
            f"## Gate {k}: {g['verdict']}",
            "",
            f"- {g['title']}",
            f"- Plan: `{g['plan']}` ({g['status']}); "
            f"recipe `{g['recipe']}`, {g['epochs']} epochs, seeds {', '.join(map(str, g['seeds']))}",
        ]
        if "data" in g:
            c = g["data"]["config"]
            out.append(
                f"- Data: `clip-dcl {' '.join(g['data']['command'])}` (draw {c['seed']}; {c['min_items']}-"
                f"{c['max_items']} items on a {c['grid']} x {c['grid']} grid at {c['image_size']} px, "
                f"{c['min_attributes']}-{c['max_attributes']} attributes an item; {g['data']['train']} training "
                f"scenes, {g['data']['scene_classes']} scene classes among them; {g['data']['validation']} "
                "validation scenes, one distinct caption each)"
            )
        out += [
            "",
            "| B | seeds | retrieval mean R@1 per seed | mean | zero-shot top-1 (top-left item), mean | "
            "training time a run, mean (s) |",
            "|---:|---:|---|---:|---:|---:|",
        ]
        for b, s in g["batches"].items():
            zs = f"{s['mean_zeroshot_top1']:.2f}" if s["mean_zeroshot_top1"] is not None else "-"
            sec = f"{s['mean_train_seconds']:.0f}" if s["mean_train_seconds"] else "-"
            out.append(
                f"| {b} | {len(s['seeds'])} | {', '.join(f'{v:.2f}' for v in s['R@1'])} | {s['mean_R@1']:.2f} | "
                f"{zs} | {sec} |"
            )
        if g["batches"]:
            best = max(g["batches"], key=lambda x: g["batches"][x]["mean_R@1"])
            out += [
                "",
                f"The highest mean is at B = {best} ({g['batches'][best]['mean_R@1']:.2f})"
                + (
                    f"; B = {LARGE} is {g['batches'][best]['mean_R@1'] - g['batches'][LARGE]['mean_R@1']:.2f} points "
                    "below it (one reading, not tested here: a fixed budget in epochs gives a bigger batch fewer "
                    "optimizer steps)."
                    if LARGE in g["batches"] and best != LARGE
                    else "."
                ),
            ]
        if "gain" in g:
            p = g["paired_gain"]
            out += [
                "",
                f"B = {LARGE} against B = {SMALL}: mean gain {g['gain']:+.2f} points (paired by seed "
                f"{p['mean']:+.2f} [{p['lo']:+.2f}, {p['hi']:+.2f}], 90 % t-interval); every seed of "
                f"{LARGE} above every seed of {SMALL}: {'yes' if g['every_large_above_every_small'] else 'no'}. "
                f"**{g['verdict']}**.",
            ]
        out.append("")
    return "\n".join(out)


def readme_block(doc: dict) -> str:
    """README's "Which loss when" line on the scene testbed: each gate's verdict, from the JSON."""
    parts = []
    for k, g in enumerate(doc["gates"], 1):
        b = {int(x): v for x, v in g["batches"].items()}  # the JSON's keys are strings
        if "gain" in g:
            parts.append(
                f"gate {k} ({g['plan']}) **{g['verdict']}ed**: retrieval mean R@1 {b[SMALL]['mean_R@1']:.1f} at "
                f"B = {SMALL}, {b[LARGE]['mean_R@1']:.1f} at B = {LARGE} ({g['gain']:+.1f} points, paired by seed "
                f"[{g['paired_gain']['lo']:+.1f}, {g['paired_gain']['hi']:+.1f}], 90 % interval; every seed of "
                f"{LARGE} above every seed of {SMALL}: {'yes' if g['every_large_above_every_small'] else 'no'}; the "
                "highest "
                f"mean, {max(v['mean_R@1'] for v in b.values()):.1f}, at B = "
                f"{max(b, key=lambda x: b[x]['mean_R@1'])})"
            )
        else:
            done = ", ".join(
                f"{b[x]['mean_R@1']:.1f} at B = {x} ({len(b[x]['seeds'])} of {len(g['seeds'])} seeds)" for x in b
            )
            parts.append(
                f"gate {k} ({g['plan']}) has no verdict yet, {g['runs_finished']} of {g['runs_planned']} runs "
                f"finished" + (f" (retrieval mean R@1 {done})" if done else "")
            )
    passed = bool(doc["passed"])
    return (
        "- **The batch size on real pixels** (*exploratory, Fashion-MNIST scenes*: photographs in a two-by-two grid, "
        f"validation split, `clip` only; [the gates](benchmarks/results/fscenes_gate.md)): the testbed "
        f"takes a loss comparison only once `clip` gains at least {MIN_GAIN:g} points of retrieval mean R@1 from "
        f"B = {SMALL} to {LARGE}, every seed above. "
        + "; ".join(parts)[0].upper()
        + "; ".join(parts)[1:]
        + ". "
        + (
            "A loss comparison may run there."
            if passed
            else "No loss has been compared there: where the batch matters on real pixels, the data have not yet said "
            "what `decl` does."
        )
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument(
        "--work",
        action="append",
        default=[],
        metavar="PLAN=DIR",
        help="read PLAN's runs from DIR (default: the plan's committed records, benchmarks/studies/<plan>.work)",
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="first copy each --work folder's records into the plan's benchmarks/studies/<plan>.work, "
        "and read them from there",
    )
    p.add_argument("--out", default=str(RESULTS / "fscenes_gate"), help="output path without extension")
    args = p.parse_args(argv)
    works = {}
    for item in args.work:
        plan, _, folder = item.partition("=")
        if not folder:
            p.error(f"--work {item}: give PLAN=DIR")
        works[Path(plan).resolve()] = Path(folder)
    if args.keep:
        for plan, folder in list(works.items()):
            n = keep_records(folder, plan.with_suffix(".work"))
            print(f"kept the records of {n} runs in {plan.with_suffix('.work').relative_to(ROOT)}")
        works = {}
    gates = []
    for plan in sorted(STUDIES.glob("fscenes_gate*.toml"), key=lambda q: (len(q.stem), q.stem)):
        work = works.get(plan.resolve(), plan.with_suffix(".work"))
        if work.is_dir():
            gates.append(read_gate(plan, work))
    if not gates:
        p.error("no gate has records: run one (see the module docstring) or name its folder with --work")
    done = all(g["status"] == "complete" for g in gates)
    doc = {
        "status": "complete" if done else "incomplete (a gate is still running)",
        "command": "python benchmarks/fscenes_gate.py"
        + ("" if args.keep else "".join(f" --work {w}" for w in args.work)),
        "date": utc_date(),
        "machine": machine_info(),
        "commit": code_commit(),
        "split": "validation",
        "rule": {
            "metric": "retrieval/mean_R@1",
            "min_gain_points": MIN_GAIN,
            "from": SMALL,
            "to": LARGE,
            "every_seed_above": True,
        },
        "passed": [g["plan"] for g in gates if g["verdict"] == "pass"],
        "gates": gates,
    }
    out = Path(args.out)
    write_json(out.with_suffix(".json"), doc)
    out.with_suffix(".md").write_text(markdown(doc))
    print(f"wrote {out.with_suffix('.md')} and .json: " + "; ".join(f"{g['plan']} {g['verdict']}" for g in gates))
    return 0


if __name__ == "__main__":
    sys.exit(main())
