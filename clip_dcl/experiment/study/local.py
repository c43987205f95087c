"""``study run``: a study's lines on this machine, N at once, the cores split between them.

Each run is its shell line (:func:`.lines.shell_line`, the same line `study commands` prints), run with
``bash -c`` and its output kept in ``logs/<arm>-seed<N>.log``. A run that has its scores is skipped; a failed
run is reported (its exit code and log), noted in ``attempts.jsonl``, and run again by the next call. With
a sequential plan the runs go look by look, and stop once every comparison has its verdict.
"""
from __future__ import annotations

import concurrent.futures
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence

from ..reporting import utc_date
from . import work as W
from .lines import shell_line
from .plan import Plan
from .report import all_decided, decisions


def default_threads(parallel: int) -> int:
    """Torch threads per run when the plan and the caller leave it open: the cores split between the runs."""
    return max(1, (os.cpu_count() or 1) // parallel)


def run_study(plan: Plan, work: Path, parallel: int = 1, threads: Optional[int] = None,
              echo: Callable[[str], None] = print, seeds: Optional[Sequence[int]] = None) -> dict:
    """Seal ``work``, make the data, then run every unfinished run (of ``seeds`` only, when given: the share
    of a study this machine takes), ``parallel`` at once; return ``{"finished", "failed", "skipped",
    "planned", "stopped_at_look"}`` (runs as ``(arm, seed)``). A run whose scores appear while the study
    runs (copied in from another machine's work folder) is skipped when its turn comes."""
    if parallel < 1:
        raise ValueError(f"parallel={parallel}: must be >= 1")
    work = Path(work).resolve()
    sealed_before = W.check_seal(plan, work) is not None  # a changed plan is refused before any work
    splits = W.prepare_data(plan, work, echo)
    W.seal(plan, work)  # once the data are there: a plan whose data cannot be read is not sealed
    threads = threads or plan.threads or default_threads(parallel)
    runs = [job for job in plan.runs() if seeds is None or job[1] in seeds]
    out = {"finished": [], "failed": [], "skipped": [], "planned": len(runs), "stopped_at_look": None}
    lock = threading.Lock()
    count = [0]

    def one(job):
        arm, seed = job
        if W.finished(work, arm, seed):  # made elsewhere and copied in since the look began
            with lock:
                out["skipped"].append(job)
                count[0] += 1
                echo(f"[study] {count[0]}/{len(runs)} {arm} seed {seed}: finished meanwhile, skipped")
            return
        line = shell_line(plan, work, splits, arm, seed, threads)
        log = W.log_path(work, arm, seed)
        log.parent.mkdir(parents=True, exist_ok=True)
        started, t0 = utc_date("%Y-%m-%d %H:%M:%S"), time.perf_counter()
        with open(log, "a") as f:
            f.write(f"$ {line}\n")
            f.flush()
            code = subprocess.run(["bash", "-c", line], stdout=f, stderr=subprocess.STDOUT).returncode
        seconds = time.perf_counter() - t0
        if code == 0 and not W.finished(work, arm, seed):
            code = -1  # the line ended without the run's scores
        W.note_attempt(work, arm, seed, started, seconds, code)
        with lock:
            count[0] += 1
            where = f"[study] {count[0]}/{len(runs)} {arm} seed {seed}"
            if code == 0:
                out["finished"].append(job)
                val = W.read_scores(work, arm, seed, "validation") or {}
                echo(f"{where}: done in {seconds:.0f} s (validation {plan.metric} "
                     f"{100 * val.get(plan.metric, float('nan')):.2f} points)")
            else:
                out["failed"].append(job)
                echo(f"{where}: FAILED (exit {code}) after {seconds:.0f} s; log {log}; a later `study run` reruns it")

    design = plan.design()
    echo(f"[study] {len(runs)} runs planned ({len(plan.arms)} arms x {len(plan.seeds)} seeds"
         + (", fewer for some arms" if len(plan.runs()) < len(plan.arms) * len(plan.seeds) else "")
         + (f"; here seeds {', '.join(map(str, seeds))} only" if seeds is not None else "") + f"), {parallel} at once, "
         f"{threads} torch thread(s) each -> {work}")
    for k, (n, _) in enumerate(design, start=1):
        seeds = set(plan.seeds[:n])
        todo: List[tuple] = []
        for job in runs:
            if job[1] not in seeds or job in out["skipped"] or job in out["finished"] or job in out["failed"]:
                continue
            if W.finished(work, *job):
                out["skipped"].append(job)
                count[0] += 1
                echo(f"[study] {count[0]}/{len(runs)} {job[0]} seed {job[1]}: finished earlier, skipped")
            else:
                todo.append(job)
        with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
            list(pool.map(one, todo))
        if out["failed"]:
            break
        if len(design) > 1 and k < len(design) and all_decided(decisions(plan, work)):
            out["stopped_at_look"] = k
            echo(f"[study] every comparison has its verdict at look {k} ({n} seeds): the later looks' runs are "
                 "not needed")
            break
    if out["failed"] and not sealed_before and W.unseal_untrained(work):
        echo(f"[study] no run trained: {work} is left unsealed, so the plan may still be corrected")
    done = len(out["finished"]) + len(out["skipped"])
    echo(f"[study] {done} of {len(runs)} runs have their scores" + (f"; {len(out['failed'])} failed: run "
         "`clip-dcl study run` again to rerun them" if out["failed"] else "")
         + f"; the report: clip-dcl study report {plan.source} --work {work}")
    return out
