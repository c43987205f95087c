"""A study's attempts: every start of a run's line that `study run` made, noted in ``WORK/attempts.jsonl`` with
how it ended (its exit code, the stop that ended it, the checkpoint it left, the one it continued from).

The stage after the lines (:mod:`.lines`) and the runner that starts them (:mod:`.local`), before the scores
(:mod:`.score`) and the report (:mod:`.report`), which reads the attempts to list the runs that failed, were
stopped or continued.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List, Optional

from ...process import said
from . import work as W


def note_attempt(work: Path, arm: str, seed: int, started: str, seconds: float, code: int, **more) -> None:
    """Append one attempt of ``study run`` to ``attempts.jsonl``: its start, length, exit code (negative: the
    signal it died of) and ``more`` (``stopped``, ``checkpoint`` it left, ``continued`` from)."""
    path = Path(work) / "attempts.jsonl"
    with open(path, "a") as f:
        f.write(
            json.dumps(
                {"arm": arm, "seed": seed, "started": started, "seconds": round(seconds, 1), "exit": code, **more}
            )
            + "\n"
        )
        f.flush()
        os.fsync(f.fileno())


def attempts(work: Path) -> List[dict]:
    """The attempts noted in ``work``, in order (a line cut by a full disk or a kill is left out)."""
    path = Path(work) / "attempts.jsonl"
    found = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


def latest_checkpoint(work: Path, arm: str, seed: int) -> Optional[str]:
    """The newest checkpoint of the run (its name under ``checkpoints/``), the one ``--resume latest``
    continues from; None when the run saved none."""
    files = sorted((W.run_dir(work, arm, seed) / "checkpoints").glob("*.pt"), key=lambda p: p.stat().st_mtime)
    return files[-1].name if files else None


def error_line(log: Path, offset: int = 0) -> Optional[str]:
    """The line of ``log`` (from byte ``offset``) that says why it failed: the last that names an error, else
    the last line; None for an empty log."""
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    lines = [x.strip() for x in text.splitlines() if x.strip() and not x.startswith("$ ")]
    named = [x for x in lines if "error" in x.lower() or "refus" in x.lower()]
    line = (named or lines or [None])[-1]
    return line if line is None or len(line) <= 400 else line[:400] + " ..."


def stopped_text(work: Path, job) -> str:
    """How a stopped run ended, from its last attempt: ``decl seed 1 (exit 75; saved epoch_0_step_3.pt)``."""
    arm, seed = job
    last = [a for a in attempts(work) if (a["arm"], a["seed"]) == (arm, seed)][-1:]
    if not last:
        return f"{arm} seed {seed}"
    a = last[0]
    ended = f"killed by signal {-a['exit']}" if a["exit"] < 0 else f"exit {a['exit']}"
    kept = f"its checkpoint {a['checkpoint']} kept" if a.get("checkpoint") else "no checkpoint yet"
    return f"{arm} seed {seed} ({ended}; {kept})"


def before_attempt(work: Path, arm: str, seed: int, started: str, echo) -> Optional[str]:
    """Ready the run's folder when an earlier attempt left its ``out.log``, and say what the new one does:
    continue from the checkpoint (marked in ``out.log``; its name returned), or start afresh (the earlier log
    kept as ``out.attempt<K>.log``; None)."""
    folder = W.run_dir(work, arm, seed)
    log = folder / "out.log"
    if not log.is_file():
        return None
    earlier = [a for a in attempts(work) if (a["arm"], a["seed"]) == (arm, seed)]
    last = earlier[-1] if earlier else None
    how = (
        ""
        if last is None
        else f" (its last attempt, {last['started']}, "
        + (f"was stopped by {said(last['stopped'])}" if last.get("stopped") else f"ended with exit {last['exit']}")
        + ")"
    )
    checkpoint = latest_checkpoint(work, arm, seed)
    if checkpoint is not None:
        with open(log, "a") as f:
            f.write(
                f"==== clip-dcl study run {started}: a new attempt continues this run from "
                f"checkpoints/{checkpoint}{how} ====\n"
            )
        echo(f"[study] {arm} seed {seed}: continues from its checkpoint {checkpoint}{how}")
        return checkpoint
    k = 1
    while (folder / f"out.attempt{k}.log").exists():
        k += 1
    log.rename(folder / f"out.attempt{k}.log")
    echo(
        f"[study] {arm} seed {seed}: reruns from the start: no checkpoint was saved{how}; the earlier log is kept "
        f"as out.attempt{k}.log"
    )
    return None
