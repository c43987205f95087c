"""``study run``: a study's lines on this machine, N at once, the cores split between them.

Each run is its shell line (:func:`.lines.shell_line`), run with ``bash -c`` in a process group of its own,
its output in ``logs/<arm>-seed<N>.log``. A run that has its scores is skipped; a failed run is reported,
noted in ``attempts.jsonl`` and run again by the next call. A sequential plan runs look by look.

SIGTERM or Ctrl-C is passed to every run's group; the trainers save at their step, the study waits for
each group (``clip_dcl.process.STOP_GRACE_S`` at most, then kills it), notes every attempt and returns. The next call
continues a stopped run from its checkpoint, or reruns it from the start, its earlier ``out.log`` kept as
``out.attempt<K>.log`` (no log mixes two sessions without saying so).
"""

from __future__ import annotations

import concurrent.futures
import os
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from ... import exitcodes, process
from ...process import Stopped, said
from ..reporting import utc_date
from . import attempts as A
from . import work as W
from .lines import shell_line
from .plan import Plan
from .report import all_decided, decisions
from .seal import seal_study, unseal_untrained

#: The exit codes of a study stopped by a signal, as the trainer's.
STOP_EXIT = {"SIGTERM": exitcodes.PREEMPTED, "SIGINT": exitcodes.INTERRUPTED}


def default_threads(parallel: int) -> int:
    """Torch threads per run when the plan and the caller leave it open: the cores split between the runs."""
    return max(1, (os.cpu_count() or 1) // parallel)


def time_left(seconds: Sequence[float], remaining: int, parallel: int) -> str:
    """``; about 12 min left (...)``: ``remaining`` runs at the mean time of the runs this call has finished
    (``seconds``), ``parallel`` at once; empty before the first has finished and after the last."""
    if not seconds or remaining < 1:
        return ""
    left = -(-remaining // parallel) * sum(seconds) / len(seconds)
    shown = f"{left:.0f} s" if left < 90 else f"{left / 60:.0f} min" if left < 5400 else f"{left / 3600:.1f} h"
    return f"; about {shown} left ({remaining} run(s) to go at the mean of the {len(seconds)} finished here)"


class Runs:
    """The runs this study has started, each the leader of a process group, to which a stop signal is passed."""

    def __init__(self):
        self.live: Dict[tuple, subprocess.Popen] = {}
        self.signalled: set = set()
        self.lock = threading.Lock()  # never taken by the main thread, whose handler takes it
        self.signame: Optional[str] = None
        self.stopped_at: Optional[float] = None
        self.raising = True  # raise Stopped from the handler (only while no run can be running)
        self._signals = process.on_stop_signals(self._on_signal)

    def __enter__(self):
        self._signals.__enter__()
        return self

    def __exit__(self, *exc):
        self._signals.__exit__(*exc)
        return False

    def _on_signal(self, signum, frame):
        if self.signame is None:
            self.signame, self.stopped_at = signal.Signals(signum).name, time.monotonic()
        if self.raising:
            raise Stopped(self.signame)
        with self.lock:
            for job, proc in list(self.live.items()):
                self.signalled.add(job)
                process.signal_group(proc.pid, signum)

    def start(self, job, argv, prepare: Callable[[], None] = lambda: None, **kwargs) -> Optional[subprocess.Popen]:
        """``prepare()``, then start ``argv`` as the leader of a new process group, both before a stop's handler
        passes the stop on (it waits for this lock), so that a started run is always signalled; None, with
        neither done, once the study is stopped."""
        with self.lock:
            if self.signame is not None:
                return None
            prepare()
            proc = process.start_group(argv, **kwargs)
            self.live[job] = proc
            return proc

    def wait(self, job, proc: subprocess.Popen) -> int:
        """The exit code of ``proc``; once the study is stopped, also its group's (`process.reap_group`)."""
        try:
            return process.reap_group(proc, lambda: self.stopped_at)
        finally:
            with self.lock:
                self.live.pop(job, None)


def run_study(
    plan: Plan,
    work: Path,
    parallel: int = 1,
    threads: Optional[int] = None,
    echo: Callable[[str], None] = print,
    seeds: Optional[Sequence[int]] = None,
) -> dict:
    """Check the arms, make the data, seal ``work``, then run every unfinished run, ``parallel`` at once; return
    ``{"finished", "failed", "skipped", "stopped", "planned", "stopped_at_look", "signal"}`` (runs as
    ``(arm, seed)``; ``signal``: the one that stopped the study, else None)."""
    if parallel < 1:
        raise ValueError(f"parallel={parallel}: must be >= 1")
    work = Path(work).resolve()
    command = " ".join(
        ["clip-dcl", "study", "run", *map(shlex.quote, [plan.source, "--work", str(work)])]
        + ([f"--parallel {parallel}"] if parallel > 1 else [])
        + (["--seeds", *map(str, seeds)] if seeds is not None else [])
    )
    out = {key: [] for key in ("finished", "failed", "skipped", "stopped")}
    out.update(planned=0, stopped_at_look=None, signal=None)
    with Runs() as live:
        try:
            splits, sealed_before = seal_study(plan, work, echo)
        except Stopped as e:
            out["signal"] = e.signame
            echo(
                f"[study] stopped by {said(e.signame)} before any run started (while making the data or checking "
                f"the plan); nothing trained; continue with: {command}"
            )
            return out
        live.raising = False
        return _run(plan, work, parallel, threads, echo, seeds, splits, sealed_before, command, out, live)


def _run(plan, work, parallel, threads, echo, seeds, splits, sealed_before, command, out, live: Runs) -> dict:
    threads = threads or plan.threads or default_threads(parallel)
    runs = [job for job in plan.runs() if seeds is None or job[1] in seeds]
    out["planned"] = len(runs)
    lock = threading.Lock()
    count = [0]
    took: List[float] = []  # the times of the runs finished by this call: the time left

    def one(job):
        arm, seed = job
        if live.signame is not None:
            return
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
        ready: dict = {}
        with open(log, "a") as f:

            def prepare():  # under the start's lock: a stop comes before all of it or after the shell started
                ready["resumes"] = A.before_attempt(work, arm, seed, started, echo)
                ready["offset"] = f.tell()
                f.write(f"$ {line}\n")
                f.flush()

            # the trap: bash waits for the trainer to save and exit rather than die of the signal at once
            argv = ["bash", "-c", f"trap : TERM INT; {line}"]
            proc = live.start(job, argv, prepare=prepare, stdout=f, stderr=subprocess.STDOUT)
            if proc is None:  # stopped before: nothing prepared, nothing started, nothing to note
                return
            code = live.wait(job, proc)
        resumes, offset = ready["resumes"], ready["offset"]
        seconds = time.perf_counter() - t0
        if code == 0 and not W.finished(work, arm, seed):
            code = -1  # the line ended without the run's scores
        stopped = live.signame if (code != 0 and job in live.signalled) else None
        more = {"stopped": stopped, "checkpoint": A.latest_checkpoint(work, arm, seed)} if stopped else {}
        A.note_attempt(work, arm, seed, started, seconds, code, **more, **({"continued": resumes} if resumes else {}))
        with lock:
            where = f"[study] {count[0] + 1}/{len(runs)} {arm} seed {seed}"
            if stopped:
                out["stopped"].append(job)
                return
            count[0] += 1
            if code == 0:
                out["finished"].append(job)
                took.append(seconds)
                val = W.read_scores(work, arm, seed, "validation") or {}
                echo(
                    f"{where}: done in {seconds:.0f} s (validation {plan.metric} "
                    f"{100 * val.get(plan.metric, float('nan')):.2f} points)"
                    + time_left(took, len(runs) - count[0], parallel)
                )
            else:
                out["failed"].append(job)
                why = A.error_line(log, offset)
                echo(
                    f"{where}: FAILED (exit {code}) after {seconds:.0f} s"
                    + (f": {why}" if why else "")
                    + f"; log {log}; a later `study run` reruns it"
                )

    design = plan.design()
    echo(
        f"[study] {len(runs)} runs planned ({len(plan.arms)} arms x {len(plan.seeds)} seeds"
        + (", fewer for some arms" if len(plan.runs()) < len(plan.arms) * len(plan.seeds) else "")
        + (f"; here seeds {', '.join(map(str, seeds))} only" if seeds is not None else "")
        + f"), {parallel} at once, "
        f"{threads} torch thread(s) each -> {work}"
    )
    for k, (n, _) in enumerate(design, start=1):
        look_seeds = set(plan.seeds[:n])
        todo: List[tuple] = []
        for job in runs:
            if job[1] not in look_seeds or job in out["skipped"] or job in out["finished"] or job in out["failed"]:
                continue
            if W.finished(work, *job):
                out["skipped"].append(job)
                count[0] += 1
                echo(f"[study] {count[0]}/{len(runs)} {job[0]} seed {job[1]}: finished earlier, skipped")
            else:
                todo.append(job)
        with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
            for future in [pool.submit(one, job) for job in todo]:
                _result(future)
        if out["failed"] or live.signame is not None:
            break
        if len(design) > 1 and k < len(design) and all_decided(decisions(plan, work)):
            out["stopped_at_look"] = k
            echo(
                f"[study] every comparison has its verdict at look {k} ({n} seeds): the later looks' runs are "
                "not needed"
            )
            break
    done = len(out["finished"]) + len(out["skipped"])
    if live.signame is not None:
        out["signal"] = live.signame
        what = "; ".join(A.stopped_text(work, job) for job in out["stopped"]) or "no run was running"
        echo(
            f"[study] stopped by {said(live.signame)}: {what}; {done} of {len(runs)} runs have their scores"
            + (f", {len(out['failed'])} failed" if out["failed"] else "")
            + f"; continue with: {command}"
        )
        return out
    if out["failed"] and not sealed_before and unseal_untrained(work):
        echo(f"[study] no run trained: {work} is left unsealed, so the plan may still be corrected")
    echo(
        f"[study] {done} of {len(runs)} runs have their scores"
        + (f"; {len(out['failed'])} failed: run `clip-dcl study run` again to rerun them" if out["failed"] else "")
        + f"; the report: clip-dcl study report {plan.source} --work {work}"
    )
    return out


def _result(future) -> None:
    """Wait for ``future`` in short steps: a signal's handler runs in this (the main) thread between them."""
    while True:
        try:
            return future.result(timeout=0.5)
        except concurrent.futures.TimeoutError:
            continue
