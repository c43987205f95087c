"""A study's work folder: its layout, its data step (the plan's [data] command and ``data.json``) and its runs'
records. The seal is :mod:`.seal`'s, the attempts :mod:`.attempts`'.

Layout under ``WORK``::

    SEAL.json            the plan as sealed by the first `run` or `commands`: its path as given on the
                         command line, its text, hash and parsed form, the commit and the date (a changed
                         plan is refused afterwards)
    plan.toml            the sealed plan's text, as written
    data/                what the plan's [data] command wrote (absent when the plan names its shards)
    data.json            the splits the runs read: shard patterns, sample counts, zero-shot folders
    runs/<arm>/seed<N>/  one run: OpenCLIP's out.log, params.txt and checkpoints/, then the scoring step's
                         run.json (recipe, commit, machine, start, the checkpoint relative to WORK),
                         scores-validation.json, scores-test.json
    logs/<arm>-seed<N>.log   the output of the run's line under `study run`
    attempts.jsonl       one line per attempt `study run` made (start, end, exit code)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, Optional

from ... import paths, process
from ...paths import expand_pattern
from ..reporting import utc_date
from .plan import Plan

SEAL = "SEAL.json"


class StudyError(RuntimeError):
    """A study that cannot go on (a changed plan, data that cannot be made): one line saying why."""


def read_json(path: Path):
    """The JSON in ``path``; :class:`StudyError` naming the file when it is empty or cut (a copy that failed)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise StudyError(
            f"{path} cannot be read ({'empty' if path.is_file() and path.stat().st_size == 0 else e}); copy it "
            "again from where it was made, or remove it to have it made again"
        ) from None


def write_json(path: Path, doc: dict) -> None:
    """``doc`` into ``path`` whole or not at all (a stop mid-write leaves the file as it was)."""
    paths.write_json(path, doc)


def data_dir(work: Path) -> Path:
    return Path(work).resolve() / "data"


def prepare_data(plan: Plan, work: Path, echo: Callable[[str], None] = print) -> Dict[str, object]:
    """The splits the runs read (``work/data.json``; :func:`plan_splits`' keys, paths absolute), made first by
    the plan's [data] command when it has one (once: a later call reuses them)."""
    from ...data.output import mark_of
    from ...data.output import state as output_state

    work = Path(work).resolve()
    path = work / "data.json"
    spec = plan.data
    folder = data_dir(work)
    done = _read_data_json(path, echo) if path.is_file() else None
    if done is not None and done.get("plan_data") == spec:  # made here: read again from this folder, which may move
        return _from_summary(folder) if spec.get("from_summary") else done["splits"]
    if "command" in spec:
        if output_state(folder) == "unfinished" or done is not None:
            # this study's own data folder, which its [data] command left unfinished (a stop in the data step) or
            # made for another [data] of an unsealed plan: made again
            echo(f"[study] data: {folder} is unfinished or of another [data]; making it again")
            shutil.rmtree(folder) if folder.is_dir() else mark_of(folder).unlink(missing_ok=True)
        argv = [w.replace("{DATA}", str(folder)) for w in spec["command"]]
        echo(f"[study] data: clip-dcl {' '.join(argv)}")
        log = work / "logs" / "data.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as out:
            code = process.run_group(
                [sys.executable, "-m", "clip_dcl.cli", *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={
                    **os.environ,
                    "PYTHONPATH": os.pathsep.join([package_root(), *filter(None, [os.environ.get("PYTHONPATH")])]),
                },
            )
        if code != 0:
            tail = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
            raise StudyError(f"the [data] command failed (exit {code}; log {log}): {tail[0]}")
    splits = _from_summary(folder) if spec.get("from_summary") else plan_splits(plan, folder)
    check_splits(splits)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"plan_data": spec, "splits": splits, "made": utc_date()})
    return splits


def _read_data_json(path: Path, echo) -> Optional[dict]:
    """``WORK/data.json``, or None (said) when it cannot be read: the data step then runs again."""
    try:
        doc = json.loads(path.read_text())
        if isinstance(doc, dict) and "plan_data" in doc and "splits" in doc:
            return doc
        problem = "not the record of a data step"
    except (OSError, ValueError) as e:
        problem = f"unreadable ({'empty' if path.stat().st_size == 0 else e})"
    echo(f"[study] data: {path} is {problem}; the data step runs again")
    path.unlink()
    return {}


#: [data] keys that name shards (a pattern or a folder of .tar files), and those that name ImageFolder trees
SHARD_KEYS = ("train", "validation", "test")
TREE_KEYS = ("validation_zeroshot", "test_zeroshot")


def plan_folder(plan: Plan) -> Path:
    """The plan file's folder (the current one for a plan parsed from text): its relative paths' base."""
    return Path(plan.source).resolve().parent if plan.source else Path.cwd()


def plan_splits(plan: Plan, folder: Optional[Path] = None) -> Dict[str, object]:
    """The splits a plan's [data] names (``train``, ``validation``, ``test``, their ``*_samples`` and the
    ``*_zeroshot`` folders; None where absent): ``{DATA}`` replaced by ``folder``, relative paths read from
    :func:`plan_folder`, a folder of shards taken as the pattern of its ``.tar`` files."""
    from clip_dcl.data.shards import folder_pattern

    spec, base = plan.data, plan_folder(plan)
    splits: Dict[str, object] = {}
    for key in (*SHARD_KEYS, *TREE_KEYS):
        value = spec.get(key)
        if isinstance(value, str):
            if folder is not None:
                value = value.replace("{DATA}", str(folder))
            value = os.path.join(base, value)  # an absolute value stays as it is
            if key in SHARD_KEYS and os.path.isdir(value):
                try:
                    value = folder_pattern(value)
                except ValueError as e:
                    raise StudyError(f"[data] {key}: {e}") from None
        splits[key] = value
    for key in SHARD_KEYS:
        splits[f"{key}_samples"] = spec.get(f"{key}_samples")
    return splits


def check_splits(splits: Dict[str, object], source: str = "") -> Dict[str, object]:
    """``splits`` with every shard and zero-shot tree checked to exist and each split's sample count known
    (from ``sizes.json`` where [data] does not give it); :class:`StudyError` naming the first that is not."""
    where = f"{source}: " if source else ""
    for key in SHARD_KEYS:
        shards = expand_pattern(str(splits[key]))
        missing = [s for s in shards if not os.path.isfile(s)]
        if missing:
            more = f" (and {len(missing) - 1} more of {len(shards)})" if len(missing) > 1 else ""
            raise StudyError(
                f"{where}[data] {key}: {missing[0]} does not exist{more} (a relative path is read from "
                "the plan file's folder)"
            )
        if not splits.get(f"{key}_samples"):
            splits[f"{key}_samples"] = shard_samples(str(splits[key]), key)
    for key in TREE_KEYS:
        if splits.get(key) and not os.path.isdir(str(splits[key])):
            raise StudyError(
                f"{where}[data] {key}: {splits[key]} is not a folder (a relative path is read from the "
                "plan file's folder)"
            )
    return splits


def _from_summary(folder: Path) -> Dict[str, object]:
    """The splits of the synthetic layout (``clip-dcl data synth``) from its ``summary.json``."""
    path = folder / "summary.json"
    if not path.is_file():
        raise StudyError(f"the [data] command wrote no {path}: name train, validation and test in [data]")
    s = json.loads(path.read_text())
    if "test" not in s:
        raise StudyError(f"{path}: the data have no test split; add --test-samples N to the [data] command")
    return {
        "train": str(folder / s["train"]["pattern"]),
        "train_samples": s["train"]["num_samples"],
        "validation": str(folder / s["val"]["pattern"]),
        "validation_samples": s["val"]["num_samples"],
        "test": str(folder / s["test"]["pattern"]),
        "test_samples": s["test"]["num_samples"],
        "validation_zeroshot": str(folder / s["zeroshot"]["dir"]),
        "test_zeroshot": str(folder / s["zeroshot_test"]["dir"]),
    }


def shard_samples(pattern: str, split: str) -> int:
    """The samples of the shards ``pattern`` from the ``sizes.json`` beside them (what ``clip-dcl data``
    and img2dataset write); :class:`StudyError` when a shard is not listed."""
    total = 0
    for shard in expand_pattern(pattern):
        sizes = Path(shard).parent / "sizes.json"
        counts = json.loads(sizes.read_text()) if sizes.is_file() else {}
        if Path(shard).name not in counts:
            raise StudyError(f"cannot count the samples of {shard} (no entry in {sizes}): give [data] {split}_samples")
        total += int(counts[Path(shard).name])
    return total


def package_root() -> str:
    """The folder that holds this ``clip_dcl``: first on a child's path, so that the lines run this very code."""
    return str(Path(__file__).resolve().parents[3])


def run_dir(work: Path, arm: str, seed: int) -> Path:
    return Path(work).resolve() / "runs" / arm / f"seed{seed}"


def log_path(work: Path, arm: str, seed: int) -> Path:
    return Path(work).resolve() / "logs" / f"{arm}-seed{seed}.log"


def finished(work: Path, arm: str, seed: int) -> bool:
    """Whether the run has its record and its scores on both splits (read nothing else)."""
    d = run_dir(work, arm, seed)
    return all((d / name).is_file() for name in ("run.json", "scores-validation.json", "scores-test.json"))


def read_record(work: Path, arm: str, seed: int) -> Optional[dict]:
    path = run_dir(work, arm, seed) / "run.json"
    return read_json(path) if path.is_file() else None


def read_scores(work: Path, arm: str, seed: int, split: str) -> Optional[Dict[str, float]]:
    """The run's scores on ``split`` ("validation" or "test"), None when not scored yet."""
    path = run_dir(work, arm, seed) / f"scores-{split}.json"
    return read_json(path) if path.is_file() else None
