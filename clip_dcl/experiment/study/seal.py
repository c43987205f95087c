"""A study's second stage: a checked plan (:mod:`.plan`) becomes a sealed work folder and the splits its runs read.

The same for ``study run`` and ``study commands``: a changed plan is refused first; each arm's flags go through
the trainer's checks before the data are made (a typo is named in seconds, not after the data); the data are
made or read (:func:`.work.prepare_data`), the arms checked again with them, and the plan sealed
(:func:`seal`). The next stage, :mod:`.lines`, turns the splits into one shell line per run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from ...train.metrics import read_metrics
from ..reporting import code_commit, machine_info, utc_date
from . import work as W
from .lines import check_arms, placeholder_splits
from .plan import Plan
from .work import SEAL, StudyError, read_json, write_json


def seal_study(
    plan: Plan, work: Path, echo: Callable[[str], None] = print, check_files: bool = True
) -> Tuple[Dict[str, object], bool]:
    """Check, make the data and seal ``work`` for ``plan``; return the splits the runs read and whether the
    folder was sealed before. ``check_files=False``: the data files are not looked for in the arms' checks (the
    lines may run on another machine). `StudyError` (one line) on a changed plan, refused flags or data that
    cannot be made or read, with nothing sealed then."""
    sealed_before = check_seal(plan, work) is not None  # a changed plan is refused before any work
    if not (Path(work) / "data.json").is_file():  # the flags first: a typo is named before the data are made
        _check_arms(plan, work, placeholder_splits(plan), sealed_before, check_files=False, data=False)
    splits = W.prepare_data(plan, work, echo)
    _check_arms(plan, work, splits, sealed_before, check_files=check_files)
    seal(plan, work)  # once the data are there: a plan whose data cannot be read is not sealed
    return splits, sealed_before


def _check_arms(plan, work, splits, sealed_before, **how) -> None:
    try:
        check_arms(plan, work, splits, **how)
    except W.StudyError as e:
        raise W.StudyError(
            f"{e}; "
            + (
                "no run was started (the plan is sealed here: a corrected plan is a new study, in a new --work folder)"
                if sealed_before
                else "nothing was sealed or trained: correct the arm's flags in the plan"
            )
        ) from None


def read_seal(work: Path) -> Optional[dict]:
    path = Path(work) / SEAL
    return read_json(path) if path.is_file() else None


def check_seal(plan: Plan, work: Path) -> Optional[dict]:
    """The seal of ``work`` (None when not sealed yet); :class:`StudyError` naming the change when ``plan``
    is not the plan sealed there (comments and layout of the file may change; no key may)."""
    seal = read_seal(work)
    if seal is None:
        return None
    changes = plan_changes(seal["plan"], plan.canonical())
    if changes:
        raise StudyError(
            f"the plan changed since {work} was sealed ({seal['sealed']}, {seal['source']}): "
            + "; ".join(changes)
            + "; a changed plan is a new study: give it a new --work folder"
        )
    return seal


def plan_changes(old: Dict[str, Any], new: Dict[str, Any], where: str = "") -> List[str]:
    """What differs between two `Plan.canonical` plans, one ``key: old -> new`` a change."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in list(old) + [k for k in new if k not in old]:
            sub = f"{where}.{key}" if where else key
            if key not in new:
                out.append(f"{sub} removed (was {old[key]!r})")
            elif key not in old:
                out.append(f"{sub} added ({new[key]!r})")
            else:
                out += plan_changes(old[key], new[key], sub)
        return out
    if (
        isinstance(old, list)
        and isinstance(new, list)
        and len(old) == len(new)
        and any(isinstance(v, (dict, list)) for v in old)
    ):
        return [c for i, (x, y) in enumerate(zip(old, new)) for c in plan_changes(x, y, f"{where}[{i}]")]
    return [] if old == new else [f"{where}: {old!r} -> {new!r}"]


def seal(plan: Plan, work: Path) -> dict:
    """Seal ``work`` with ``plan`` unless it is sealed already (then `check_seal`). Called once the data are
    made and checked, so that a plan whose data cannot be read can be corrected in the same folder."""
    work = Path(work)
    found = check_seal(plan, work)
    if found is not None:
        return found
    work.mkdir(parents=True, exist_ok=True)
    # the plan as given on the command line (no path of this machine), its text and hash beside it
    doc = {
        "plan_sha256": plan.sha256,
        "source": plan.source,
        "sealed": utc_date(),
        "commit": code_commit(),
        "machine": machine_info(),
        "plan": plan.canonical(),
        "plan_text": plan.text,
    }
    (work / "plan.toml").write_text(plan.text)
    write_json(work / SEAL, doc)  # never half a seal
    return doc


def trained_anything(work: Path) -> bool:
    """Whether any run in ``work`` got as far as a training step: a logged step, a checkpoint or scores."""
    for folder in (Path(work) / "runs").glob("*/seed*"):
        if any(folder.glob("scores-*.json")) or any(folder.glob("checkpoints/*.pt")) or read_metrics(folder, "train"):
            return True
    return False


def unseal_untrained(work: Path) -> bool:
    """Remove the seal of ``work`` when no run trained (nothing was learnt from the plan's runs, so it may
    still change); return whether it was removed. The runs' failed attempts stay in ``attempts.jsonl``."""
    path = Path(work) / SEAL
    if not path.is_file() or trained_anything(work):
        return False
    path.unlink()
    (Path(work) / "plan.toml").unlink(missing_ok=True)
    return True
