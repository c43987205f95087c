"""Start-up stress: N launches of two gloo ranks through the launcher, each with one fault at a random moment of
its first seconds; every launch must end soon after its fault, with no traceback, no abort, and its cause named.

Each launch runs ``python -m clip_dcl.train.torchrun --standalone --nproc_per_node 2 -m clip_dcl.train -- ...``
(what ``launch/train_single_node.sh`` runs): ``clip-dcl-tiny`` on OpenCLIP's synthetic data, one data-loader
worker per rank, one epoch of a few steps. Its fault is drawn from ``--seed`` (the kinds in a shuffled turn, so
that every five launches hold each kind once), at a moment drawn from the first ``--window`` seconds of the
process it goes to (the launcher's, from its start; a rank's, from that rank's start, which comes seconds after
the launcher's on a busy machine: a moment counted from the launcher would find most ranks not started yet):

- ``launcher-SIGTERM``: SIGTERM to the launcher (a scheduler's, or ``kill``): exit 75, its line names SIGTERM;
- ``group-SIGINT``: SIGINT to the launcher's process group (Ctrl-C at a terminal): exit 130, its line names Ctrl-C;
- ``rank-SIGTERM``: SIGTERM to one rank: exit 75, the ranks stopped on a signal (no rank blamed but that one);
- ``rank-SIGKILL``: SIGKILL to one rank: exit 1, the last line names that rank and SIGKILL;
- ``none``: no fault: exit 0 and the epoch's checkpoint written.

A fault to the launcher waits for its first line to run (it catches SIGTERM): before that the interpreter is
starting (tens of milliseconds
on an idle machine, more on a busy one), no code of ours can run, and a SIGTERM meets the system's default
(the launcher dies of it with no line) and a Ctrl-C Python's own (a traceback from its ``site`` import). Each
record keeps when its fault was sent (``fired``, from the launcher's start) beside its drawn moment (``at``).
A launch must end, the
launcher and every process it started (ranks, data-loader workers), within ``--bound`` seconds of its fault
(``none``: within ``--launch-timeout``), else it is *hung* (and killed). It is *aborted* when a process died of
SIGABRT or printed ``terminate called``; it has a *traceback* when its output holds one; its blame is *wrong*
when the exit code or the last line is not the fault's (above). A fault that comes after the run finished
its training (its checkpoint is older than the fault, or a rank took the signal after its last step, with no
step boundary left to stop at) may leave exit 0. A launch with none of these problems is *clean*.

    .venv/bin/python benchmarks/startup_stress.py                    # 100 launches -> benchmarks/results/startup_stress
    .venv/bin/python benchmarks/startup_stress.py --launches 10 --out /tmp/stress
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from launch_kit import children, tiny_cpu_flags

from clip_dcl import process
from clip_dcl.experiment.reporting import code_commit, command_line, machine_info
from clip_dcl.paths import shown_text, write_json

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
KINDS = ("launcher-SIGTERM", "group-SIGINT", "rank-SIGTERM", "rank-SIGKILL", "none")
#: How long a launch is watched after its bound, to tell a slow end from a hang (torchrun's SIGKILL comes at 30 s).
GRACE_AFTER_BOUND_S = 40.0


@dataclass
class Fault:
    kind: str
    rank: int  # the rank of a rank-* fault
    at: float  # seconds after its target started: the launcher, or the rank


def plan_faults(n: int, seed: int, window: float, kinds=KINDS) -> List[Fault]:
    """``n`` faults drawn from ``seed``: the ``kinds`` in a shuffled turn, a random rank and moment in ``window``."""
    rng = random.Random(seed)
    faults: List[Fault] = []
    turn: List[str] = []
    for _ in range(n):
        if not turn:
            turn = list(kinds)
            rng.shuffle(turn)
        kind = turn.pop()
        faults.append(Fault(kind, rng.randrange(2), round(rng.uniform(0.0, window), 2)))
    return faults


@dataclass
class Launch:
    index: int
    kind: str
    rank: int
    at: float  # the drawn moment
    fired: Optional[float] = None  # seconds after the launcher's start the signal went (None: not sent)
    rank_started: Optional[float] = None  # seconds after the launcher's start the fault's rank started
    ended_after_fault: Optional[float] = None  # seconds from the fault to the last process's end
    duration: float = 0.0  # seconds from start to the last process's end
    rc: Optional[int] = None
    last_line: str = ""
    hung: bool = False
    aborted: bool = False
    traceback: bool = False
    wrong_blame: bool = False
    why: str = ""  # what was wrong, in words
    trained: bool = False  # the epoch's checkpoint was written
    problems: List[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.problems


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (``SigCgt`` of ``/proc/PID/status``)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(mask >> (int(sig) - 1) & 1)


def _rank_of(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        return int(env[b"RANK"]) if b"TORCHELASTIC_RUN_ID" in env else None
    except (OSError, KeyError, ValueError):
        return None


def train_flags(logs: Path, samples: int) -> List[str]:
    return [
        "--model",
        "clip-dcl-tiny",
        "--dataset-type",
        "synthetic",
        "--train-num-samples",
        str(samples),
        *tiny_cpu_flags(1, warmup=1),
        "--log-every-n-steps",
        "1",
        "--report-to",
        "",
        "--loss",
        "dcl",
        "--logs",
        str(logs),
        "--name",
        "run",
    ]


def expected(fault: Fault) -> str:
    """What the fault's launch must end with, in words."""
    return {
        "launcher-SIGTERM": "exit 75, a line naming SIGTERM",
        "group-SIGINT": "exit 130, a line naming Ctrl-C",
        "rank-SIGTERM": f"exit 75, the ranks stopped on a signal (rank {fault.rank}'s)",
        "rank-SIGKILL": f"exit 1, a line naming rank {fault.rank} killed by SIGKILL",
        "none": "exit 0, the epoch trained",
    }[fault.kind]


def judge_blame(kind: str, rank: int, rc: Optional[int], last: str, finished_before: bool) -> Optional[str]:
    """Why the exit code or last line is not the fault's (None: it is). ``finished_before``: the run had written
    its epoch's checkpoint before the fault came (exit 0 is then right too)."""
    if finished_before and rc == 0:
        return None
    if kind == "none":
        return None if rc == 0 else f"exit {rc} with no fault"
    if kind == "launcher-SIGTERM":
        ok = rc == 75 and "SIGTERM" in last and ("launcher stopped" in last or "torchrun stopped" in last)
    elif kind == "group-SIGINT":
        ok = rc == 130 and "Ctrl-C" in last and ("launcher stopped" in last or "torchrun stopped" in last)
    elif kind == "rank-SIGTERM":
        named = re.search(r"\brank (\d+)\b", last)
        ok = (
            rc == 75
            and "stopped on a signal" in last
            and "error" not in last
            and (named is None or int(named.group(1)) == rank)
        )
    else:  # rank-SIGKILL
        ok = rc == 1 and f"rank {rank} " in last and "SIGKILL" in last
    return None if ok else f"exit {rc}, last line {last!r}"


def run_launch(index: int, fault: Fault, work: Path, args) -> Launch:
    """One launch with ``fault``; the record of how it ended."""
    folder = work / f"launch{index:03d}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    cmd = [
        sys.executable,
        "-m",
        "clip_dcl.train.torchrun",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc_per_node",
        "2",
        "-m",
        "clip_dcl.train",
        "--",
        *train_flags(folder / "logs", args.samples),
    ]
    rec = Launch(index, fault.kind, fault.rank, fault.at)
    with open(folder / "stdout.txt", "w") as out, open(folder / "stderr.txt", "w") as err:
        start = time.monotonic()
        # SIGINT at its default in the launcher, as at a terminal (a benchmark started in the background
        # inherits it ignored, and Python then installs no Ctrl-C handler)
        proc = process.start_group(cmd, default_sigint=True, stdout=out, stderr=err, env=env, cwd=folder)
    seen: Dict[int, Optional[int]] = {}  # every process of the launch: pid -> rank (None: a worker)
    born: Dict[int, float] = {}  # the launcher's children: when each was first seen
    fired_at: Optional[float] = None
    fired_wall = 0.0
    deadline = start + args.launch_timeout

    def watch():
        for child in children(proc.pid):
            born.setdefault(child, time.monotonic())
            if seen.get(child) is None:  # a rank: known once it runs its own program (its environment has RANK)
                seen[child] = _rank_of(child)
        for pid, rank in list(seen.items()):
            if rank is not None:
                for worker in children(pid):
                    seen.setdefault(worker, None)

    def fire() -> bool:
        if fault.kind in ("launcher-SIGTERM", "group-SIGINT") and not _catches(proc.pid, signal.SIGTERM):
            return False  # the interpreter's own start: no line of the launcher has run yet (see the docstring)
        if fault.kind == "launcher-SIGTERM":
            os.kill(proc.pid, signal.SIGTERM)
            return True
        if fault.kind == "group-SIGINT":
            process.signal_group(proc.pid, signal.SIGINT)
            return True
        target = [pid for pid, rank in seen.items() if rank == fault.rank and _alive(pid)]
        if not target:
            return False
        rec.rank_started = round(born[target[0]] - start, 2)
        if time.monotonic() - born[target[0]] < fault.at:
            return False
        os.kill(target[0], signal.SIGTERM if fault.kind == "rank-SIGTERM" else signal.SIGKILL)
        return True

    while True:
        watch()
        now = time.monotonic()
        due = now - start >= fault.at or fault.kind.startswith("rank")  # a rank's: from its own start (fire())
        if fired_at is None and fault.kind != "none" and due and proc.poll() is None:
            try:
                if fire():
                    fired_at, fired_wall = time.monotonic(), time.time()
            except ProcessLookupError:
                pass
        launcher_done = proc.poll() is not None
        if launcher_done and not any(_alive(p) for p in seen):
            break
        limit = fired_at + args.bound + GRACE_AFTER_BOUND_S if fired_at is not None else deadline
        if time.monotonic() > limit:
            rec.hung = True
            break
        time.sleep(0.02)
    end = time.monotonic()
    for pid in [proc.pid, *seen]:  # a hung launch: everything it started
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()
    rec.duration = round(end - start, 2)
    rec.rc = proc.returncode
    if fired_at is not None:
        rec.fired = round(fired_at - start, 2)
        rec.ended_after_fault = round(end - fired_at, 2)
        if rec.ended_after_fault > args.bound:
            rec.hung = True
    elif fault.kind != "none":
        rec.why = "not sent: the launch had ended before its moment"
    text = (folder / "stdout.txt").read_text(errors="replace") + (folder / "stderr.txt").read_text(errors="replace")
    lines = [line for line in (folder / "stderr.txt").read_text(errors="replace").splitlines() if line.strip()]
    rec.last_line = shown_text(lines[-1], [work]) if lines else ""  # no path of this machine in the result
    rec.aborted = "terminate called" in text or "SIGABRT" in text or rec.rc in (-6, 134)
    rec.traceback = "Traceback (most recent call last)" in text
    ckpt = folder / "logs" / "run" / "checkpoints" / "epoch_1.pt"
    rec.trained = ckpt.exists()
    # the fault came once the run had trained its epoch: its checkpoint was written before, or a rank took the
    # signal after its last step (no step boundary is left to stop at: it saves the epoch and ends, exit 0)
    finished_before = (
        rec.trained
        and fired_at is not None
        and (ckpt.stat().st_mtime < fired_wall or "Received SIGTERM: finishing the current step" in text)
    )
    kind = fault.kind if fired_at is not None else "none"
    if rec.hung:
        rec.problems.append("hung")
    else:
        blame = judge_blame(kind, fault.rank, rec.rc, rec.last_line, finished_before)
        if kind == "none" and rec.rc == 0 and not rec.trained:
            blame = "exit 0 but no checkpoint of the epoch"
        if blame:
            rec.wrong_blame = True
            rec.why = blame
            rec.problems.append("wrong blame")
    if rec.aborted:
        rec.problems.append("aborted")
    if rec.traceback:
        rec.problems.append("traceback")
    if rec.clean and not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    return rec


def summarize(launches: List[Launch], args) -> dict:
    fired = [r.ended_after_fault for r in launches if r.ended_after_fault is not None]
    return {
        "launches": len(launches),
        "seed": args.seed,
        "window_s": args.window,
        "bound_s": args.bound,
        "faults": dict(Counter(r.kind for r in launches)),
        "not_sent": sum(1 for r in launches if r.kind != "none" and r.fired is None),
        # faults to the launcher whose moment came while its interpreter was starting: sent once its first line ran
        # a fault sent after the run had trained its epoch (a rank's moment came late): exit 0 is then its end
        "after_training": sum(1 for r in launches if r.kind != "none" and r.fired is not None and r.rc == 0),
        "launcher_faults_held": sum(
            1
            for r in launches
            if r.kind in ("launcher-SIGTERM", "group-SIGINT") and r.fired is not None and r.fired - r.at > 0.05
        ),
        "rank_started_s": sorted(r.rank_started for r in launches if r.rank_started is not None),
        "clean": sum(1 for r in launches if r.clean),
        "hung": sum(1 for r in launches if r.hung),
        "aborted": sum(1 for r in launches if r.aborted),
        "tracebacks": sum(1 for r in launches if r.traceback),
        "wrong_blame": sum(1 for r in launches if r.wrong_blame),
        "slowest_exit_s": max(fired) if fired else None,
        "median_exit_s": sorted(fired)[len(fired) // 2] if fired else None,
        "runs": [{**asdict(r), "clean": r.clean} for r in launches],
    }


def write_report(result: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out.with_suffix(".json"), result)
    bad = [r for r in result["runs"] if not r["clean"]]
    status = "clean" if not bad else f"{len(bad)} launch(es) with a problem"
    faults = ", ".join(f"{k} {result['faults'].get(k, 0)}" for k in KINDS)
    lines = [
        "# Start-up stress",
        "",
        f"- Command: `{result.get('command', '-')}`",
        f"- Date (UTC): {result.get('date', '-')}",
        f"- Machine: {result.get('machine', '-')}; load: {result.get('load', '-')}",
        f"- Code: {result.get('commit', '-')}",
        "",
        f"`benchmarks/startup_stress.py --launches {result['launches']} --seed {result['seed']}`: launches of two "
        "gloo ranks through `python -m clip_dcl.train.torchrun`, each with one fault at a random moment of the "
        f"first {result['window_s']:g} s of the process it is sent to (see the script's docstring). Status: {status}.",
        "",
        "| launches | faults by kind | clean | hung | aborted | tracebacks | wrong blame | slowest exit |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
        f"| {result['launches']} | {faults} | {result['clean']} | {result['hung']} | {result['aborted']} | "
        f"{result['tracebacks']} | {result['wrong_blame']} | "
        + (f"{result['slowest_exit_s']:.1f} s |" if result["slowest_exit_s"] is not None else "- |"),
        "",
        f"A launch must end within {result['bound_s']:g} s of its fault (slowest exit: from the fault to the end "
        f"of the last process of the launch; median {result['median_exit_s'] or 0:.1f} s). "
        f"{result['not_sent']} fault(s) were not sent (the launch had ended before their moment); "
        f"{result['after_training']} came after the run had trained its epoch (exit 0), and "
        f"{result['launcher_faults_held']} to the launcher waited for its first line to run. A rank's fault "
        "came at its moment after that rank started, which was "
        + (
            f"{result['rank_started_s'][0]:.1f}-{result['rank_started_s'][-1]:.1f} s after the launcher's start."
            if result["rank_started_s"]
            else "never."
        ),
        "",
        "| fault | moment (after its target started) | sent (after the launcher started) | rank | exit | ended after "
        "the fault | last line |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for kind in KINDS:  # one example of each kind, then every launch with a problem
        example = next((r for r in result["runs"] if r["kind"] == kind and r["clean"]), None)
        rows = ([example] if example else []) + [r for r in bad if r["kind"] == kind]
        for r in rows:
            sent = f"{r['fired']:.1f} s" if r["fired"] is not None else "-"
            after = f"{r['ended_after_fault']:.1f} s" if r["ended_after_fault"] is not None else "-"
            rank = str(r["rank"]) if kind.startswith("rank") else "-"
            mark = "" if r["clean"] else f" **{', '.join(r['problems'])}**"
            moment = f"{r['at']:.1f} s" if kind != "none" else "-"
            lines.append(
                f"| {kind}{mark} | {moment} | {sent} | {rank} | {r['rc']} | {after} | "
                f"`{r['last_line'][:160].replace('|', '/')}` |"
            )
    lines.append("")
    out.with_suffix(".md").write_text("\n".join(lines))


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launches", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--window", type=float, default=10.0, help="faults come within this many seconds of the start")
    parser.add_argument(
        "--bound", type=float, default=10.0, help="a launch must end within this many seconds of its fault"
    )
    parser.add_argument("--launch-timeout", type=float, default=600.0, help="seconds a launch with no fault may take")
    parser.add_argument("--samples", type=int, default=32, help="--train-num-samples (8 per step and rank)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="the fault kinds to draw from (comma-separated)")
    parser.add_argument("--work", type=Path, default=None, help="launch folders (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the folders of clean launches too")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "startup_stress")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if args.launches < 1 or unknown or not kinds:
        parser.error(
            f"--launches {args.launches}: give 1 or more"
            if args.launches < 1
            else f"--kinds: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(KINDS)}"
        )
    made = {
        "command": command_line("startup_stress.py", sys.argv[1:] if argv is None else argv, python="python"),
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": machine_info(),
        "commit": code_commit(),
        "load": f"1-minute load average {os.getloadavg()[0]:.1f} at the start",
    }
    faults = plan_faults(args.launches, args.seed, args.window, kinds)
    work = args.work or Path(tempfile.mkdtemp(prefix="startup_stress_"))
    launches = []
    for i, fault in enumerate(faults):
        rec = run_launch(i, fault, work, args)
        launches.append(rec)
        state = "clean" if rec.clean else ", ".join(rec.problems) + f" ({rec.why})"
        after = f"{rec.ended_after_fault:.1f} s after it" if rec.ended_after_fault is not None else "-"
        print(
            f"[{i + 1}/{len(faults)}] {fault.kind} (rank {fault.rank}) at {rec.fired or fault.at:.1f} s: exit "
            f"{rec.rc}, {after}; {state}",
            flush=True,
        )
        write_report(
            {**summarize(launches, args), **made}, args.out
        )  # as it goes: a long run can be read while it runs
    result = {**summarize(launches, args), **made}
    write_report(result, args.out)
    if args.work is None and result["clean"] == result["launches"]:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"{result['launches']} launches: {result['clean']} clean, {result['hung']} hung, {result['aborted']} "
        f"aborted, {result['tracebacks']} with a traceback, {result['wrong_blame']} wrong blame; slowest exit "
        f"{result['slowest_exit_s']} s -> {args.out.with_suffix('.md')}"
    )
    return 0 if result["clean"] == result["launches"] else 1


if __name__ == "__main__":
    sys.exit(main())
