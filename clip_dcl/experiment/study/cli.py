"""``clip-dcl study check|commands|run|report|score``: thin wrappers over the study's functions.

* ``check PLAN``: validate the plan (each arm's training command through the trainer's own flag checks, as
  ``commands`` and ``run`` also do, with the data, before they seal); print its runs and, from a paired spread
  (``paired_sd`` or an earlier study's ``STUDY.json`` named by ``spread_from``), the seeds each comparison
  needs for the plan's power at its confidence, one look. Exit 1 when a comparison has fewer seeds than it
  needs, 0 otherwise.
* ``commands PLAN --work DIR``: make the data first (a [data] command runs here, and says so before it starts)
  and check them, seal the plan in DIR, print one shell line per run on stdout
  (``> lines.sh``; a Slurm array runs line ``$SLURM_ARRAY_TASK_ID`` with ``sed -n``).
* ``run PLAN --work DIR --parallel N``: the same lines on this machine, N at once; finished runs skipped.
  SIGTERM or Ctrl-C stops every run (each saves at its step), notes them and exits 75 or 130; the next
  ``run`` continues them (:mod:`.local`).
  ``--seeds`` (both): this machine's share of a study split across machines by whole seeds; copy each
  machine's ``runs/<arm>/seed<N>/`` folders into one work folder for the report, which pairs runs of one
  machine only.
* ``report PLAN --work DIR``: write ``STUDY.md/.json/.png`` (verdicts only once every run of a look has its
  scores) and print the status and one line per comparison.
* ``score RUN_DIR ...``: a run's last step, which scores both splits into its folder (:mod:`.score`).

A plan changed after DIR was sealed is refused by ``commands``, ``run`` and ``report`` with one line naming
the change. Exit 2 on a bad plan or a refused call.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import List, Optional

from ... import exitcodes
from ...arguments import FlagParser
from ...paths import DISK_FULL, NOT_WRITABLE
from ...process import Stopped, said, stop_on_signals
from ..arguments import plain_text
from .plan import Plan, PlanError, load_plan
from .power import planned_power, spread_of  # noqa: F401 (spread_of: imported from here too)
from .work import StudyError


def check(plan: Plan, echo=print) -> int:
    """``study check``: what the plan runs, that its data can be read (``StudyError`` otherwise; data that a
    [data] command makes are checked when made), and whether its seeds suffice for its power."""
    from .lines import check_arms, placeholder_splits
    from .work import check_splits, plan_splits

    splits = None if "command" in plan.data else check_splits(plan_splits(plan), plan.source)
    # not this machine's files (the work folder is not known here); without data, the flags only
    if splits is None:
        check_arms(plan, Path("WORK"), placeholder_splits(plan), check_files=False, data=False)
    else:
        check_arms(plan, Path("WORK"), splits, check_files=False)
    echo(f"{plan.source}: valid; recipe {plan.recipe}; metric {plan.metric}; design: {plan.design_text()}")
    if splits is None:
        echo("  data: made by its [data] command at the first `commands` or `run` (checked then)")
    else:
        echo(
            "  data: "
            + "; ".join(
                f"{key} {splits[key]} ({splits[key + '_samples']} samples)" for key in ("train", "validation", "test")
            )
            + "".join(f"; {key} {splits[key]}" for key in ("validation_zeroshot", "test_zeroshot") if splits[key])
        )
    for arm in plan.arms:
        extra = "".join(f" {k}={v}" for k, v in arm.overrides)
        echo(f"  arm {arm.name}: {' '.join(arm.flags) or '(no flags)'}{extra}")
    echo(
        "  each arm's training command passes the trainer's checks"
        + (" of its flags (the rest once the data are made)" if splits is None else "")
    )
    runs = plan.runs()
    uneven = len(runs) < len(plan.arms) * len(plan.seeds)
    if uneven:
        echo(
            "  seeds per arm (the first ones its comparisons read): "
            + ", ".join(f"{a.name} {len(plan.arm_seeds(a.name))}" for a in plan.arms)
        )
    echo(
        f"runs: {len(runs)} ({len(plan.arms)} arms x {len(plan.seeds)} seeds {list(plan.seeds)}"
        + (", fewer for some arms" if uneven else "")
        + "): "
        + ", ".join(f"{a}/s{s}" for a, s in runs)
    )
    short = 0
    for c in plan.comparisons:
        p = planned_power(plan, c)
        if "unchecked" in p:
            echo(f"  {c.label}: seeds not checked: {p['unchecked']}")
            continue
        short += p["short"]
        echo(
            f"  {c.label}: paired sd {100 * p['sd']:.2f} points ({p['where']}), true difference assumed "
            f"{100 * p['expected']:+.2f} points"
            + (f", margin {100 * c.margin:.2f} points" if c.margin else "")
            + f": needs {p['need'] if p['need'] else 'more than 1000'} seeds for power {plan.power:g} at "
            f"{100 * plan.confidence:.0f} % (one look); its {p['n']} give power {p['power']:.2f}"
            + (" -- TOO FEW SEEDS" if p["short"] else "")
        )
    if short:
        echo(f"too few seeds: {short} comparison(s) below power {plan.power:g}")
    return 1 if short else 0


def build_parser() -> argparse.ArgumentParser:
    doc = plain_text(__doc__)
    p = FlagParser(
        prog="clip-dcl study",
        description=doc.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(doc.split("\n\n")[1:]),
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    c = sub.add_parser("check", help="validate a plan; its runs and the seeds it needs")
    c.add_argument("plan", metavar="PLAN")
    for name, text in (
        ("commands", "make the data, seal the plan, print one shell line per run"),
        ("run", "run the plan's runs on this machine"),
        ("report", "write STUDY.md/.json/.png from the finished runs"),
    ):
        s = sub.add_parser(name, help=text)
        s.add_argument("plan", metavar="PLAN")
        s.add_argument("--work", required=True, help="the study's folder (sealed by the first commands or run)")
        if name in ("commands", "run"):
            s.add_argument(
                "--threads",
                type=int,
                help="torch threads per run (default: the plan's threads, else "
                + ("1" if name == "commands" else "the cores split between the parallel runs")
                + ")",
            )
            s.add_argument(
                "--seeds",
                nargs="+",
                metavar="SEED",
                help="only these of the plan's seeds (ranges A-B too): this machine's share of a study "
                "split across machines by whole seeds, so that each seed's pairs are made on one "
                "machine (the report pairs runs of one machine only, unless the plan's pair_across "
                "names machines)",
            )
        if name == "commands":
            s.add_argument("--look", type=int, help="sequential plans: only the runs of looks 1..LOOK")
            s.add_argument("--python", help="the Python that runs the lines (default: this one)")
        if name == "run":
            s.add_argument("--parallel", type=int, default=1, help="runs at once (default 1)")
        if name == "report":
            s.add_argument("--out", help="folder of STUDY.md/.json/.png (default: --work)")
            s.add_argument(
                "--name",
                default="STUDY",
                help="the report files' name: NAME.md, NAME.json, NAME.png "
                "(default STUDY), e.g. to publish it beside other reports",
            )
    sub.add_parser("score", add_help=False, help="a run's last step: score both splits into its folder")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["score"]:
        from .score import main as score_main

        return score_main(argv[1:])
    args = build_parser().parse_args(argv)
    for name in ("threads", "parallel", "look"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            print(f"clip-dcl study: --{name} {value}: must be >= 1", file=sys.stderr)
            return 2
    try:
        plan = load_plan(args.plan)
        if args.command == "check":
            return check(plan)
        if args.command in ("commands", "run"):
            from ...paths import folder_problem

            problem = folder_problem(args.work)
            if problem:
                raise StudyError(f"--work {args.work}: {problem}; give a --work folder you can write in")
        if args.command == "commands":
            with stop_on_signals():  # a SIGTERM while the data are made is passed on to their writer
                return _commands(plan, args)
        if args.command == "run":
            from .local import STOP_EXIT, run_study

            seeds = plan.pick_seeds(args.seeds) if args.seeds else None
            out = run_study(plan, Path(args.work), args.parallel, args.threads, seeds=seeds)
            if out["signal"]:
                return STOP_EXIT.get(out["signal"], 1)
            return 1 if out["failed"] else 0
        return _report(plan, args)
    except (PlanError, StudyError) as e:
        print(f"clip-dcl study: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk or a folder that turned read-only meanwhile
        if e.errno not in DISK_FULL + NOT_WRITABLE:
            raise
        print(
            f"clip-dcl study {args.command}: cannot write {e.filename or args.work!r} ({e.strerror}); free space or "
            "give a --work folder you can write in, then run it again",
            file=sys.stderr,
        )
        return exitcodes.FAILED
    except (KeyboardInterrupt, Stopped) as e:
        signame = getattr(e, "signame", "SIGINT")
        print(f"clip-dcl study {args.command}: stopped by {said(signame)}", file=sys.stderr)
        return exitcodes.stop_exit_code(signame)


def _commands(plan: Plan, args) -> int:
    from .lines import all_lines, run_tag
    from .seal import check_seal, seal_study

    if args.look is not None and args.look > len(plan.design()):
        raise PlanError(f"--look {args.look}: the plan has {len(plan.design())} look(s)")
    only = plan.pick_seeds(args.seeds) if args.seeds else None
    work = Path(args.work).resolve()
    check_seal(plan, work)
    if "command" in plan.data and not (work / "data.json").is_file():
        print(
            f"[study] commands: first makes the data: the plan's [data] command writes {work / 'data'} (minutes, on "
            "this machine), then the plan is sealed and the lines are printed",
            file=sys.stderr,
            flush=True,
        )
    # the data files are not looked for in the arms' checks: the lines may run on another machine
    splits, _ = seal_study(plan, work, lambda s: print(s, file=sys.stderr), check_files=False)
    threads = args.threads or plan.threads or 1
    lines = all_lines(plan, work, splits, threads, args.look, only)
    for i, (_, _, line) in enumerate(lines, 1):
        if args.python:
            line = line.replace(shlex.quote(sys.executable), shlex.quote(args.python))
        print(f"{line} {run_tag(i, len(lines))}")
    return 0


def _report(plan: Plan, args) -> int:
    from .report import _points as points
    from .report import planned_text, verdict_line, write_report

    command = " ".join(["clip-dcl", "study", "report", *map(shlex.quote, [args.plan, "--work", args.work])])
    if not args.name or "/" in args.name or args.name.startswith("."):
        print(f"clip-dcl study report: --name must be a plain file name stem, got {args.name!r}", file=sys.stderr)
        return 2
    got = write_report(plan, Path(args.work), Path(args.out) if args.out else None, command=command, name=args.name)
    doc = got["doc"]
    print(doc["status"])
    for c in doc["comparisons"]:
        print(f"  {verdict_line(c, doc)}" if c["final"] is not None else f"  {c['label']}: no verdict yet")
        if (c.get("planned") or {}).get("short"):
            print(f"    planned: {planned_text(c)}")
    if not any(c["looks"] for c in doc["comparisons"]):
        for v in doc["validation"]:
            mean = "-" if not v["n"] else f"{points(v['mean'])} points"
            print(f"  validation split (for choices, no verdict): {v['label']}: {mean} over {v['n']} seed(s)")
    print(f"wrote {got['markdown']}, {got['json'].name}, {got['png'].name}")
    return 0
