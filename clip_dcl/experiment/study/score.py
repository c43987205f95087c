"""``clip-dcl study score RUN_DIR ...``: a run's scores on both splits and its record, into its folder.

The last step of each run's line: scores on the validation and test splits
(`clip_dcl.experiment.scoring.evaluate`) and ``run.json`` (arm, seed, recipe, commit, machine,
training times, checkpoint). It prints no score: the test split is read by the report, once.
"""

from __future__ import annotations

import os
import re
import sys
from datetime import datetime
from pathlib import Path
from typing import Dict, List, Optional

from ..reporting import code_commit, cpu_model, machine_info, utc_date
from ..scoring import with_mean_r1
from .work import write_json


def hardware() -> str:
    """What must be equal for two runs to be paired: the CPU model, the GPU, torch's version."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{cpu_model()} / {gpu} / torch {torch.__version__}"


def training_times(out_log: Path) -> Dict[str, Optional[str]]:
    """The first and last time stamps of OpenCLIP's ``out.log`` and the seconds between."""
    stamps = (
        re.findall(r"^(\d{4}-\d\d-\d\d,\d\d:\d\d:\d\d)", out_log.read_text(errors="replace"), flags=re.M)
        if out_log.is_file()
        else []
    )
    if not stamps:
        return {"started": None, "ended": None, "train_seconds": None}
    fmt = "%Y-%m-%d,%H:%M:%S"
    a, b = datetime.strptime(stamps[0], fmt), datetime.strptime(stamps[-1], fmt)
    return {
        "started": a.strftime("%Y-%m-%d %H:%M:%S"),
        "ended": b.strftime("%Y-%m-%d %H:%M:%S"),
        "train_seconds": (b - a).total_seconds(),
    }


def work_relative(folder, path) -> str:
    """``path`` relative to the study's work folder, so that a published record names no local path."""
    folder = Path(folder).resolve()
    base = folder.parents[2] if folder.parent.parent.name == "runs" else folder
    return os.path.relpath(Path(path).resolve(), base)


def score_run(
    folder,
    checkpoint,
    *,
    validation: str,
    test: str,
    validation_zeroshot: Optional[str] = None,
    test_zeroshot: Optional[str] = None,
    recipe: str = "custom",
    arm: str = "",
    seed: int = 0,
    device: str = "auto",
) -> dict:
    """Score ``checkpoint`` on both splits and write the run's files into ``folder``; return its record."""
    from ..scoring import evaluate

    folder = Path(folder)
    data = {"out_dir": "/", "val_data": validation, "test_data": test}
    if validation_zeroshot:
        data["zeroshot"] = {"dir": str(Path(validation_zeroshot).resolve())}
    if test_zeroshot:
        data["zeroshot_test"] = {"dir": str(Path(test_zeroshot).resolve())}
    scores = {
        split: with_mean_r1(evaluate(checkpoint, data, split=split, fewshot=False, device=device))
        for split in ("validation", "test")
    }
    log = folder / "out.log"
    record = {
        "arm": arm,
        "seed": seed,
        "recipe": recipe,
        "commit": code_commit(),
        "machine": machine_info(),
        "hardware": hardware(),
        **training_times(log),
        "scored": utc_date("%Y-%m-%d %H:%M:%S"),
        "checkpoint": work_relative(folder, checkpoint),
        "resumed": log.is_file() and "=> resuming checkpoint" in log.read_text(errors="replace"),
        "threads": int(os.environ.get("OMP_NUM_THREADS", "0")) or None,
    }
    for split, values in scores.items():  # the record last: a run counts as finished once it exists
        write_json(folder / f"scores-{split}.json", values)
    write_json(folder / "run.json", record)  # whole or not at all: a stop must not leave a run looking finished
    return record


def main(argv: List[str]) -> int:
    """The command; SIGTERM or Ctrl-C while scoring ends it with one line and 75 or 130: a stop, which the study
    notes as one and continues (``run.json`` is written last, whole or not at all)."""
    from ...exitcodes import stop_exit_code
    from ...process import Stopped, said, stop_on_signals

    with stop_on_signals():
        try:
            return _main(argv)
        except (Stopped, KeyboardInterrupt) as e:
            signame = getattr(e, "signame", "SIGINT")
            print(
                f"[study] scoring stopped by {said(signame)}: the run is not recorded as finished; the next "
                "`clip-dcl study run` scores it",
                file=sys.stderr,
            )
            return stop_exit_code(signame)


def _main(argv: List[str]) -> int:
    from ...arguments import FlagParser
    from ..arguments import plain_text

    p = FlagParser(prog="clip-dcl study score", description=plain_text(__doc__.split("\n\n")[0]))
    p.add_argument("folder", metavar="RUN_DIR", help="the run's folder (OpenCLIP's --logs/--name)")
    p.add_argument("--checkpoint", required=True, help="the checkpoint to score")
    p.add_argument("--validation", required=True, help="validation retrieval shards")
    p.add_argument("--test", required=True, help="test retrieval shards")
    p.add_argument("--validation-zeroshot", help="validation zero-shot ImageFolder (optional)")
    p.add_argument("--test-zeroshot", help="test zero-shot ImageFolder (optional)")
    p.add_argument("--recipe", default="custom", help="the recipe's name, recorded")
    p.add_argument("--arm", default="", help="the arm's name, recorded")
    p.add_argument("--seed", type=int, default=0, help="the training seed, recorded")
    p.add_argument("--device", default="auto", help="where to score (auto: the GPU when one is visible)")
    args = p.parse_args(argv)
    if not Path(args.checkpoint).is_file():
        p.error(f"--checkpoint {args.checkpoint}: no such file (did the training finish?)")
    score_run(
        args.folder,
        args.checkpoint,
        validation=args.validation,
        test=args.test,
        validation_zeroshot=args.validation_zeroshot,
        test_zeroshot=args.test_zeroshot,
        recipe=args.recipe,
        arm=args.arm,
        seed=args.seed,
        device=args.device,
    )
    print(f"[study] scored {args.folder}: scores-validation.json, scores-test.json, run.json")
    return 0
