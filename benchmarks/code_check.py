"""Does the code at an earlier commit train the testbed's runs to the same bits as the code now?

The batch-size testbed (``batch_size.py``) reuses a finished run while the code that shapes it (the
loss, the trainer, the data writer) is unchanged since the run's commit. When that code has moved
(a refactor), this check trains each ``--objectives`` for ``--epochs`` at ``--batch-size`` and
``--seed`` with the tree at each ``--against`` commit and at ``--now`` (default: this tree), each
checked out into a temporary ``git worktree`` and writing its own copy of the testbed's data, and
compares every earlier tree with ``--now``: the data files, the loss optimised at every step and the
validation and test scores, bit for bit. Identical runs mean the cached runs of that commit stand
for runs of the later one (training is deterministic on one CPU).

Each tree trains through its own testbed in a child process (``--child``): ``batch_size.run_one`` in the trees
before the testbed ran on ``clip-dcl study``, a one-seed study of the testbed's recipe after, so the two
versions of the package never share a process. The report, ``results/code_check.{md,json}``, is
read by ``batch_size.py``'s report beside the commits its runs came from.

Run ``.venv/bin/python benchmarks/code_check.py --against c360f58 2545ede`` (a few minutes a tree on 2 cores).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
STEM = "code_check"
DEFAULT_OBJECTIVES = ("decl default", "clip")


def git(*args: str, cwd: Path = ROOT) -> str:
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"git {' '.join(args)} failed: {out.stderr.strip()}")
    return out.stdout.strip()


def data_digest(folder: Path) -> str:
    """SHA-1 over the names and bytes of the data files under ``folder`` (its summary aside: it holds times)."""
    h = hashlib.sha1()
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != "summary.json":
            h.update(str(p.relative_to(folder)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def logged_losses(folder: Path) -> List[str]:
    """The optimised loss of every logged step of the run in ``folder``, to OpenCLIP's five significant digits:
    its terms (``contrastive_loss``, ``decl_loss``, ...), else ``loss``. The terms, because ``decl``'s ``loss``
    became its InfoNCE value while its total kept its term's column. Read from the run's ``metrics.jsonl``; a
    tree older than that file wrote them only into ``out.log``'s training lines, read there."""
    metrics = folder / "metrics.jsonl"
    out = []
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            record = json.loads(line) if line.strip() else {}
            if record.get("kind") == "train":
                terms = [v for k, v in record.items() if k.endswith("_loss")]
                out += [f"{v:#.5g}" for v in terms or [record["loss"]]]
        return out
    for line in (folder / "out.log").read_text().splitlines():
        out += re.findall(r"\b\w+_loss: (\S+) \(", line) or re.findall(r"\bLoss: (\S+) \(", line)
    return out


def child(tree: Path, work: Path, objectives: List[str], batch_size: int, seed: int, epochs: int) -> dict:
    """Train ``objectives`` with the testbed code of ``tree`` (its package and ``benchmarks/`` are this process's
    path: :func:`run_child`); what the parent compares."""
    import batch_size as bs

    from clip_dcl import experiment as ex

    if not hasattr(bs, "run_one"):  # a tree whose testbed runs through clip-dcl study
        return study_child(bs, work, objectives, batch_size, seed, epochs)
    data_folder = bs.data_dir(work, 0) if hasattr(bs, "data_dir") else work / "data"
    data = ex.synth_data(data_folder, quick=False, verbose=False, seed=0, **bs.DATA)
    budget = ex.Budget(
        epochs=epochs,
        lr=1e-3,
        wd=0.1,
        warmup=50,
        model=bs.MODEL,
        log_every_n_steps=50,
        workers=1,
        batch_size=batch_size,
        seed=seed,
    )
    names = bs.objectives()
    runs = {}
    for label in objectives:
        rec = bs.run_one(label, names[label], data, budget, work, 1)
        logs = sorted((work / "runs").glob(f"*/b{batch_size}-seed{seed}/out.log"), key=os.path.getmtime)
        runs[label] = {
            "commit": rec["commit"],
            "flags": rec["flags"],
            "validation": rec["metrics"],
            "test": rec.get("test_metrics"),
            "losses": logged_losses(logs[-1].parent),
        }
    return {"data_digest": data_digest(data_folder), "data": data["config"], "runs": runs}


def study_child(bs, work: Path, objectives: List[str], batch_size: int, seed: int, epochs: int) -> dict:
    """:func:`child` for a tree whose testbed runs are studies: a plan of ``objectives`` at ``batch_size`` with the
    testbed's recipe and ``seed``, run in ``work`` (its data written by the recipe's command into ``work/data``)."""
    from clip_dcl.experiment import study

    names = bs.O.objectives  # the tree's testbed objectives (every study-era batch_size.py imports them as O)

    arms = "".join(
        f'[[arms]]\nname = "{bs.arm_name(label, batch_size)}"\nbatch_size = {batch_size}\n'
        f"flags = {json.dumps(list(names()[label]))}\n\n"
        for label in objectives
    )
    first, second = (bs.arm_name(label, batch_size) for label in (objectives * 2)[:2])
    text = (
        f'recipe = "{bs.RECIPE}"\nseeds = [{seed}]\nmetric = "retrieval/mean_R@1"\nconfidence = 0.9\n'
        f'resolution = 0.01\nthreads = 1\nexploratory = true\n\n[train]\nepochs = {epochs}\ndevice = "cpu"\n\n'
        f'{arms}[[comparisons]]\na = "{first}"\nb = "{second}"\nrule = "beats"\n'
    )
    plan = study.parse_plan(text, "code_check")
    out = study.run_study(plan, work, 1, 1, echo=lambda line: print(line, file=sys.stderr))
    if out["failed"]:
        raise RuntimeError(f"training failed: {out['failed']}")
    runs = {}
    for label in objectives:
        arm = bs.arm_name(label, batch_size)
        runs[label] = {
            "commit": study.work.read_record(work, arm, seed)["commit"],
            "flags": list(names()[label]),
            "validation": study.work.read_scores(work, arm, seed, "validation"),
            "test": study.work.read_scores(work, arm, seed, "test"),
            "losses": logged_losses(study.work.run_dir(work, arm, seed)),
        }
    data = json.loads((study.work.data_dir(work) / "summary.json").read_text())
    return {"data_digest": data_digest(study.work.data_dir(work)), "data": data["config"], "runs": runs}


def run_child(tree: Path, work: Path, args: argparse.Namespace) -> dict:
    # -P: the child's path is the tree's (PYTHONPATH), not this script's folder, so it imports the tree's batch_size
    cmd = [
        sys.executable,
        "-P",
        str(Path(__file__).resolve()),
        "--child",
        str(tree),
        "--work",
        str(work),
        "--objectives",
        *args.objectives,
        "--batch-size",
        str(args.batch_size),
        "--seed",
        str(args.seed),
        "--epochs",
        str(args.epochs),
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree), str(tree / "benchmarks")]),
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    print(f"[code_check] training {', '.join(args.objectives)} with the code of {tree}", flush=True)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"[code_check] the run with {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(old: dict, new: dict) -> dict:
    """Per objective whether the logged losses and the scores of the two trees are the same to the bit."""
    rows = {}
    for label, a in old["runs"].items():
        b = new["runs"][label]
        rows[label] = {
            "commits": [a["commit"], b["commit"]],
            "steps_logged": len(a["losses"]),
            "same_losses": a["losses"] == b["losses"] and bool(a["losses"]),
            "same_validation": a["validation"] == b["validation"],
            "same_test": a["test"] == b["test"],
            "same_flags": a["flags"] == b["flags"],
        }
        rows[label]["identical"] = all(v for k, v in rows[label].items() if k.startswith("same_"))
    same_data = old["data_digest"] == new["data_digest"] and old["data"] == new["data"]
    return {
        "same_data": same_data,
        "objectives": rows,
        "identical": same_data and all(r["identical"] for r in rows.values()),
    }


def write(out: Path, checks: List[dict], args: argparse.Namespace, command: str) -> Path:
    from clip_dcl.experiment.reporting import Report, markdown_table

    report = Report.at(out / args.stem, command)
    rows = [
        (
            label,
            " / ".join(r["commits"]),
            r["steps_logged"],
            "same" if c["same_data"] else "differ",
            *("same" if r[k] else "differs" for k in ("same_flags", "same_losses", "same_validation", "same_test")),
            "**identical**" if r["identical"] else "**differs**",
        )
        for c in checks
        for label, r in c["objectives"].items()
    ]
    md = [
        "# Code check: the testbed's runs at earlier commits and at a later one",
        "",
        *report.about(status="complete"),
        f"- Trees: {', '.join(f'`{c}`' for c in args.against)} against `{args.now or 'this tree'}`, each in a "
        f"temporary worktree (this tree in place); each writes its own copy of the testbed's data "
        f"(`batch_size.py`'s recipe) and trains through its own testbed code.",
        f"- Runs: {', '.join(f'`{o}`' for o in args.objectives)} at B = {args.batch_size}, seed {args.seed}, "
        f"{args.epochs} epoch{'' if args.epochs == 1 else 's'} (the testbed's learning rate, warm-up and model), "
        f"one torch thread.",
        "- Identical runs mean the runs cached at the earlier commit stand for runs of the later one; a run that "
        "differs must be rerun.",
        "",
        markdown_table(
            [
                "objective",
                "commits (earlier / later)",
                "steps logged",
                "data files",
                "flags",
                "loss at every logged step",
                "validation scores",
                "test scores",
                "verdict",
            ],
            rows,
        ),
    ]
    report.write(
        md,
        {
            "status": "complete",
            "against": list(args.against),
            "now": args.now,
            "batch_size": args.batch_size,
            "seed": args.seed,
            "epochs": args.epochs,
            "checks": checks,
        },
    )
    return report.path(".md")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="benchmarks/code_check.py", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    p.add_argument("--against", nargs="+", default=[], help="the earlier commits (any git revisions)")
    p.add_argument("--now", default=None, help="the later commit (default: this tree, as it is)")
    p.add_argument("--objectives", nargs="+", default=list(DEFAULT_OBJECTIVES), help="batch_size.py objectives")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--results", default=str(HERE / "results"))
    p.add_argument("--stem", default=STEM)
    p.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.child:
        print(
            json.dumps(
                child(Path(args.child), Path(args.work), args.objectives, args.batch_size, args.seed, args.epochs)
            )
        )
        return 0
    if not args.against:
        raise SystemExit("--against COMMIT is required")
    if args.epochs < 1 or args.batch_size < 1:
        raise SystemExit(f"--epochs and --batch-size must be >= 1, got {args.epochs} and {args.batch_size}")
    from testbed.objectives import objectives

    unknown = [o for o in args.objectives if o not in objectives()]
    if unknown:
        raise SystemExit(f"unknown objective(s) {unknown}; choose from {list(objectives())}")
    commits = [
        git("rev-parse", "--verify", f"{c}^{{commit}}") for c in [*args.against, *([args.now] if args.now else [])]
    ]
    with tempfile.TemporaryDirectory(prefix="code_check_") as tmp:
        work = Path(args.work) if args.work else Path(tmp)
        trained = {}
        for i, commit in enumerate(commits):
            tree = Path(tmp) / f"tree{i}"
            git("worktree", "add", "--detach", str(tree), commit)
            try:
                trained[commit] = run_child(tree, work / commit[:10], args)
            finally:
                git("worktree", "remove", "--force", str(tree))
        later = trained[commits[-1]] if args.now else run_child(ROOT, work / "now", args)
    checks = [{"against": c, **compare(trained[c], later)} for c in commits[: len(args.against)]]
    from clip_dcl.experiment.reporting import command_line

    path = write(Path(args.results), checks, args, command_line("code_check.py", argv))
    for c in checks:
        print(f"[code_check] {c['against'][:10]}: {'identical' if c['identical'] else 'DIFFERS'}")
    print(f"[code_check] -> {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
