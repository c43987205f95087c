"""Preemption soak: a 2-rank gloo run of ``decl`` interrupted N times, resumed each time, ends where an
uninterrupted run ends.

The run trains ``clip-dcl-tiny`` on the synthetic quick data (``clip-dcl data synth --quick``) on two gloo
ranks started by ``python -m clip_dcl.train.torchrun`` (what ``launch/train_single_node.sh`` runs), with
``--resume latest`` on every launch. Each launch but the last carries one fault, drawn from ``--seed``:

- ``mid-step``: after the backward pass of the launch's k-th step, before the optimizer's update;
- ``save``: once a checkpoint being written (an epoch's, or a step's) has its first 4 KB on disk;
- ``startup``: before the first step, at one of: the rendezvous (before ``init_process_group``), reading
  the resumed checkpoint, building the loss;
- ``after-resume``: right after the launch's first step (the first after its resume);

each sent as SIGTERM or SIGKILL, to one rank or to both (and to their data-loader workers, as a scheduler
signals every process of a job), from another process. After each fault the same command is run again
(the command a stopped run prints: "the same command with --resume latest"); after the last, until it
finishes. The final checkpoint's model, optimizer and DeCL state are then digested (SHA-256 of every tensor's
bytes, in key order; the sharded rates reassembled) and compared with those of an uninterrupted run of
the same command.

A fault *survived* when it fired, the launch it hit ended within ``--launch-timeout`` seconds (no hang),
and the next launch ran again from what the fault left (it reached its own fault's point, or finished); the
digests then say whether the run as a whole came out as if never interrupted.

    .venv/bin/python benchmarks/preempt_soak.py                 # 20 faults -> benchmarks/results/preempt_soak
    .venv/bin/python benchmarks/preempt_soak.py --faults 3 --quick

The script is also the ranks' entry point (``--as-rank``): the fault is handed to it in ``SOAK_FAULT``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional

from launch_kit import children, tiny_cpu_flags

from clip_dcl import process

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
KINDS = ("mid-step", "save", "startup", "after-resume")
SIGNALS = ("SIGTERM", "SIGKILL")
TARGETS = ("one", "all")
STARTUP_POINTS = ("rendezvous", "resume", "loss")
#: Steps of one epoch: --train-num-samples 64 over 2 ranks x --batch-size 8.
STEPS_PER_EPOCH = 4
#: The interpreter that starts each launch's torchrun (and so its ranks).
PYTHON = sys.executable


@dataclass
class Fault:
    kind: str
    signal: str
    target: str  # "one" rank (``rank``) or "all"
    rank: int
    step: int  # mid-step: the launch's step it hits; startup: which point (index into STARTUP_POINTS)


def plan_faults(n: int, seed: int) -> List[Fault]:
    """``n`` faults: the kinds in turn (so that 4 or more faults cover every kind), the rest drawn from ``seed``."""
    rng = random.Random(seed)
    faults = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        step = rng.randrange(len(STARTUP_POINTS)) if kind == "startup" else rng.randint(1, 3)
        sig, target, rank = rng.choice(SIGNALS), rng.choice(TARGETS), rng.randrange(2)
        if kind == "save":
            rank = 0  # the rank that writes the checkpoint
        faults.append(Fault(kind, sig, target, rank, step))
    return faults


def epochs_for(n: int) -> int:
    """Epochs of the run: long enough that ``n`` faults, each within the first epoch of its launch (at most 3
    steps, or the first save), land before the run ends (a SIGTERM keeps its launch's steps; a SIGKILL loses
    those since the last checkpoint): one epoch a fault, and one more."""
    return max(3, n + 1)


# -- the ranks' side ----------------------------------------------------------------------------------------
class _Injector:
    """In a rank: sends the fault's signal, from another process, to its targets, once."""

    def __init__(self, fault: Fault, folder: Path):
        self.fault, self.folder = fault, folder
        self.rank = int(os.environ.get("RANK", "0"))
        self.fired = False
        (folder / f"pid.{self.rank}").write_text(str(os.getpid()))

    def mine(self) -> bool:
        return self.fault.target == "all" or self.fault.rank == self.rank

    def fire(self, where: str) -> None:
        if self.fired or not self.mine():
            return
        self.fired = True
        pids = [os.getpid()]
        if self.fault.target == "all":
            pids = [int(p.read_text()) for p in sorted(self.folder.glob("pid.*"))]
        with open(self.folder / "fired", "a") as f:
            f.write(json.dumps({"rank": self.rank, "where": where, "time": time.time()}) + "\n")
        targets = [c for pid in pids for c in children(pid)] + pids  # the workers first, as a scheduler's
        subprocess.run(
            ["kill", f"-{self.fault.signal[3:]}", *map(str, targets)], check=False, stderr=subprocess.DEVNULL
        )
        if self.fault.signal == "SIGKILL" and os.getpid() in pids:
            time.sleep(30)  # the kill is on its way


class _Tripwire:
    """A file object that fires the injector once its first 4 KB are written."""

    def __init__(self, f, injector: _Injector):
        self.f, self.injector, self.written = f, injector, 0

    def write(self, data):
        n = self.f.write(data)
        self.written += n
        if self.written > 4096:
            self.injector.fire("save")
        return n

    def __getattr__(self, name):
        return getattr(self.f, name)


def _install(fault: Fault, folder: Path) -> None:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    injector = _Injector(fault, folder)
    steps = [0]
    if fault.kind == "mid-step":

        def pre(optimizer, args, kwargs):  # after the backward pass, before the update
            if steps[0] + 1 == fault.step:
                injector.fire(f"mid-step {fault.step}")

        register_optimizer_step_pre_hook(pre)

    def post(optimizer, args, kwargs):
        steps[0] += 1
        if fault.kind == "after-resume" and steps[0] == 1:
            injector.fire("after the first step")

    register_optimizer_step_post_hook(post)
    if fault.kind == "save":
        save = torch.save

        def tripped_save(obj, f, *args, **kwargs):
            if hasattr(f, "write"):
                return save(obj, _Tripwire(f, injector), *args, **kwargs)
            save(obj, f, *args, **kwargs)
            injector.fire("save")

        torch.save = tripped_save
    if fault.kind == "startup":
        point = STARTUP_POINTS[fault.step % len(STARTUP_POINTS)]
        from clip_dcl.train.run import TrainingRun

        if point == "rendezvous":
            import torch.distributed

            init = torch.distributed.init_process_group

            def init_process_group(*args, **kwargs):
                injector.fire("startup: rendezvous")
                return init(*args, **kwargs)

            torch.distributed.init_process_group = init_process_group
        elif point == "resume":
            load = TrainingRun.pt_load

            def pt_load(self, path, map_location="cpu"):
                injector.fire("startup: reading the resumed checkpoint")
                return load(self, path, map_location)

            TrainingRun.pt_load = pt_load
        create = TrainingRun.create_loss  # also the fallback of "resume" on a launch with nothing to resume

        def create_loss(self, args):
            injector.fire("startup: building the loss")
            return create(self, args)

        TrainingRun.create_loss = create_loss


def rank_main(argv: List[str]) -> int:
    spec = os.environ.get("SOAK_FAULT")
    if spec:
        _install(Fault(**json.loads(spec)), Path(os.environ["SOAK_DIR"]))
    from clip_dcl.train import main

    return main(argv, exiting=True)


# -- the soak's side --------------------------------------------------------------------------------------------
def train_flags(data: Path, logs: Path, name: str, epochs: int) -> List[str]:
    return [
        "--model",
        "clip-dcl-tiny",
        "--train-data",
        str(data / "train" / "{00000..00003}.tar"),
        "--dataset-type",
        "webdataset",
        "--dataset-resampled",
        "--train-num-samples",
        "64",
        *tiny_cpu_flags(epochs, warmup=2),
        "--report-to",
        "",
        "--logs",
        str(logs),
        "--name",
        name,
        "--loss",
        "decl",
        "--decl-rate",
        "index",
        "--local-loss",
        "--gather-with-grad",
        "--delete-previous-checkpoint",
        "--dist-timeout",
        "60",
        "--resume",
        "latest",
    ]


def _env(extra: Optional[dict] = None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return env


def launch(flags: List[str], timeout: float, extra_env: Optional[dict] = None) -> dict:
    """One launch of the two ranks; ``{rc, seconds, hung, last_line, stderr}``."""
    cmd = [
        PYTHON,
        "-m",
        "clip_dcl.train.torchrun",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(Path(__file__).resolve()),
        "--as-rank",
        "--",
        *flags,
    ]
    start = time.monotonic()
    proc = process.start_group(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(extra_env), cwd=ROOT
    )
    hung = False
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        hung = True
        _kill_tree(proc.pid)
        _, err = proc.communicate()
    lines = [line for line in err.strip().splitlines() if line.strip()]
    return {
        "rc": proc.returncode,
        "seconds": round(time.monotonic() - start, 1),
        "hung": hung,
        "last_line": lines[-1] if lines else "",
        "stderr": err,
    }


def _kill_tree(pid: int) -> None:
    for child in children(pid):
        _kill_tree(child)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reaped_orphans(folder: Path) -> None:
    """Ranks a SIGKILL to torchrun's children left behind (none expected): killed, so the next launch is alone."""
    for p in folder.glob("pid.*"):
        try:
            pid = int(p.read_text())
            os.kill(pid, 0)
        except (ValueError, ProcessLookupError, PermissionError):
            continue
        _kill_tree(pid)


def digests(checkpoint: Path) -> Dict[str, str]:
    """SHA-256 of the model's, the optimizer's and the loss's tensors in a training checkpoint."""
    import torch

    from clip_dcl.train.saving import read_loss_state

    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=True)

    def digest(tensors) -> str:
        h = hashlib.sha256()
        for key, value in tensors:
            h.update(str(key).encode())
            if torch.is_tensor(value):
                h.update(
                    value.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes()
                    if value.numel()
                    else b""
                )
            else:
                h.update(repr(value).encode())
        return h.hexdigest()

    state = ckpt["state_dict"]
    model = digest((k.removeprefix("module."), state[k]) for k in sorted(state))
    opt = ckpt["optimizer"]["state"]
    optimizer = digest((f"{i}.{k}", opt[i][k]) for i in sorted(opt) for k in sorted(opt[i]))
    loss_state = read_loss_state(checkpoint)
    decl = digest((k, loss_state[k]) for k in sorted(loss_state))
    return {"model": model, "optimizer": optimizer, "decl_state": decl}


def final_checkpoint(logs: Path, name: str, epochs: int) -> Path:
    return logs / name / "checkpoints" / f"epoch_{epochs}.pt"


def soak(n: int, seed: int, work: Path, data: Path, timeout: float, log=print) -> dict:
    epochs = epochs_for(n)
    logs = work / "logs"
    started = time.monotonic()
    log(f"[soak] {n} faults, {epochs} epochs of {STEPS_PER_EPOCH} steps; work folder {work}")
    ref = launch(train_flags(data, logs, "uninterrupted", epochs), timeout)
    log(f"[soak] uninterrupted run: exit {ref['rc']} in {ref['seconds']} s")
    if ref["rc"] != 0:
        raise RuntimeError(f"the uninterrupted run failed (exit {ref['rc']}): {ref['stderr'][-3000:]}")
    flags = train_flags(data, logs, "soak", epochs)
    faults = plan_faults(n, seed)
    records = []
    for i, fault in enumerate(faults):
        folder = work / f"fault_{i:02d}"
        folder.mkdir(parents=True)
        resumable = bool(list((logs / "soak" / "checkpoints").glob("*.pt")))
        out = launch(flags, timeout, {"SOAK_FAULT": json.dumps(asdict(fault)), "SOAK_DIR": str(folder)})
        _reaped_orphans(folder)
        fired = (
            [json.loads(line) for line in (folder / "fired").read_text().splitlines()]
            if (folder / "fired").exists()
            else []
        )
        record = {
            **asdict(fault),
            "fired": bool(fired),
            "where": fired[0]["where"] if fired else None,
            "resumed_from_a_checkpoint": resumable,
            "rc": out["rc"],
            "seconds": out["seconds"],
            "hung": out["hung"],
            "last_line": out["last_line"],
            "printed_the_resume_command": "--resume latest" in out["stderr"],
        }
        records.append(record)
        whom = "all" if fault.target == "all" else f"rank {fault.rank}"
        log(
            f"[soak] fault {i + 1}/{n}: {fault.kind} {fault.signal} to {whom} -> fired {record['where']!r}, exit "
            f"{out['rc']} in {out['seconds']} s"
        )
        if out["rc"] == 0:
            break  # the run finished (the fault fired where nothing was left to lose, or never)
    final_runs = []
    while len(final_runs) < 3 and not final_checkpoint(logs, "soak", epochs).exists():
        out = launch(flags, timeout)
        final_runs.append({"rc": out["rc"], "seconds": out["seconds"], "last_line": out["last_line"]})
        log(f"[soak] resume to the end: exit {out['rc']} in {out['seconds']} s")
    # a fault survived: it fired, its launch ended in time, and the launch after it trained again
    for i, record in enumerate(records):
        nxt = records[i + 1] if i + 1 < len(records) else (final_runs[0] if final_runs else {"rc": 0})
        record["survived"] = bool(
            record["fired"] and not record["hung"] and (record["rc"] == 0 or nxt.get("rc") == 0 or nxt.get("fired"))
        )
    a, b = final_checkpoint(logs, "uninterrupted", epochs), final_checkpoint(logs, "soak", epochs)
    da, db = digests(a), (digests(b) if b.exists() else {})
    return {
        "faults": records,
        "final_runs": final_runs,
        "epochs": epochs,
        "seed": seed,
        "injected": sum(r["fired"] for r in records),
        "survived": sum(r.get("survived", False) for r in records),
        "by_kind": dict(Counter(f"{r['kind']} / {r['signal']} / {r['target']}" for r in records if r["fired"])),
        "kinds": sorted({r["kind"] for r in records if r["fired"]}),
        "digests": {"uninterrupted": da, "soak": db},
        "digests_equal": bool(db) and da == db,
        "wall_seconds": round(time.monotonic() - started, 1),
    }


def markdown(result: dict, report) -> List[str]:
    from clip_dcl.experiment.reporting import markdown_table

    ok = result["digests_equal"] and result["survived"] == result["injected"] == len(result["faults"])
    lines = [
        "# Preemption soak",
        "",
        *report.about("complete" if ok else "FAILED: see the table"),
        "",
        f"A 2-rank gloo `decl` run of {result['epochs']} epochs ({STEPS_PER_EPOCH} steps each) on the synthetic "
        f"quick data, interrupted {len(result['faults'])} times and resumed with `--resume latest` each time.",
        "",
        f"- faults injected: {result['injected']} of {len(result['faults'])}, survived: {result['survived']}",
        f"- kinds: {', '.join(result['kinds'])}",
        f"- digests of the final checkpoint equal to the uninterrupted run's (model, optimizer, DeCL state): "
        f"{'yes' if result['digests_equal'] else 'NO'}",
        f"- wall time: {result['wall_seconds']} s",
        "",
        "## Faults by kind",
        "",
        markdown_table(["kind / signal / target", "count"], sorted(result["by_kind"].items()), "lr"),
        "",
        "## Each fault",
        "",
        markdown_table(
            ["#", "kind", "signal", "target", "fired at", "exit", "s", "survived"],
            [
                (
                    i + 1,
                    r["kind"],
                    r["signal"],
                    "all" if r["target"] == "all" else f"rank {r['rank']}",
                    r["where"] or "-",
                    r["rc"],
                    r["seconds"],
                    "yes" if r.get("survived") else "NO",
                )
                for i, r in enumerate(result["faults"])
            ],
            "rlllllrl",
        ),
        "",
        "## Digests",
        "",
        markdown_table(
            ["part", "uninterrupted", "soak"],
            [
                (k, v[:16], result["digests"]["soak"].get(k, "-")[:16])
                for k, v in result["digests"]["uninterrupted"].items()
            ],
        ),
    ]
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--as-rank"]:
        rest = argv[1:]
        return rank_main(rest[1:] if rest[:1] == ["--"] else rest)
    import tempfile

    from clip_dcl.experiment.reporting import Report, add_report_arguments, command_line, report_path

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--faults", type=int, default=20, help="faults to inject (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="draws the faults (default 0)")
    parser.add_argument(
        "--data", type=Path, default=None, help="the synthetic quick data (default: written into the work folder)"
    )
    parser.add_argument("--work", type=Path, default=None, help="where the runs go (default: a temporary folder)")
    parser.add_argument("--launch-timeout", type=float, default=300, help="seconds a launch may take (default 300)")
    add_report_arguments(parser, "preempt_soak", "writes the report into a temporary folder")
    args = parser.parse_args(argv)
    if args.faults < 1:
        parser.error(f"--faults {args.faults}: give 1 or more")
    work = args.work or Path(tempfile.mkdtemp(prefix="preempt_soak_"))
    data = args.data
    if data is None:
        data = work / "data"
        subprocess.run(
            [sys.executable, "-m", "clip_dcl.cli", "data", "synth", "--quick", str(data)],
            check=True,
            env=_env(),
            stdout=subprocess.DEVNULL,
        )
    result = soak(
        args.faults,
        args.seed,
        work,
        data,
        args.launch_timeout,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    report = Report.at(
        report_path(args.out, HERE / "results" / "preempt_soak", args.quick), command_line("preempt_soak.py", argv)
    )
    md = report.write(markdown(result, report), result)
    print(
        f"[soak] {result['survived']}/{len(result['faults'])} faults survived, digests "
        f"{'equal' if result['digests_equal'] else 'DIFFER'}; wrote {md}",
        file=sys.stderr,
    )
    return 0 if result["digests_equal"] and result["survived"] == len(result["faults"]) else 1


if __name__ == "__main__":
    sys.exit(main())
