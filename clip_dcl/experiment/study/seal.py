"""A study's second stage: a checked plan (:mod:`.plan`) becomes a sealed work folder and the splits its runs read.

The same for ``study run`` and ``study commands``: a changed plan is refused first; each arm's flags go through
the trainer's checks before the data are made (a typo is named in seconds, not after the data); the data are
made or read (:func:`.work.prepare_data`), the arms checked again with them, and the plan sealed
(:func:`.work.seal`). The next stage, :mod:`.lines`, turns the splits into one shell line per run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Tuple

from . import work as W
from .lines import check_arms, placeholder_splits
from .plan import Plan


def seal_study(
    plan: Plan, work: Path, echo: Callable[[str], None] = print, check_files: bool = True
) -> Tuple[Dict[str, object], bool]:
    """Check, make the data and seal ``work`` for ``plan``; return the splits the runs read and whether the
    folder was sealed before. ``check_files=False``: the data files are not looked for in the arms' checks (the
    lines may run on another machine). `StudyError` (one line) on a changed plan, refused flags or data that
    cannot be made or read, with nothing sealed then."""
    sealed_before = W.check_seal(plan, work) is not None  # a changed plan is refused before any work
    if not (Path(work) / "data.json").is_file():  # the flags first: a typo is named before the data are made
        _check_arms(plan, work, placeholder_splits(plan), sealed_before, check_files=False, data=False)
    splits = W.prepare_data(plan, work, echo)
    _check_arms(plan, work, splits, sealed_before, check_files=check_files)
    W.seal(plan, work)  # once the data are there: a plan whose data cannot be read is not sealed
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
