"""One self-contained shell line per run: train through ``python -m clip_dcl.train``, then score both splits.

A line names everything by absolute path and sets its own environment, so that it runs from any folder on
any machine that sees the work folder (a Slurm array task, a GPU box, `study run` here); ``--resume latest``
lets a line run again after an interruption go on from the run's last checkpoint.
"""

from __future__ import annotations

import contextlib
import io
import shlex
import sys
from typing import Dict, List, Optional, Sequence

from ..runner import Budget, Run, flag_words, train_command
from .plan import CONTROL, Plan, registered_recipe
from .work import StudyError, data_dir, package_root, run_dir

#: [train] keys that map onto :class:`Budget` fields
_BUDGET = ("model", "epochs", "batch_size", "lr", "wd", "warmup", "workers", "log_every_n_steps")


def settings(plan: Plan, arm: str) -> Dict[str, object]:
    """The [train] settings of ``arm``: the plan's, then the arm's overrides."""
    return {**plan.train, **dict(plan.arm(arm).overrides)}


def budget(plan: Plan, arm: str, seed: int) -> Budget:
    """The :class:`Budget` of one run (Budget's defaults where the plan is silent)."""
    s = settings(plan, arm)
    return Budget(**{k: s[k] for k in _BUDGET if k in s}, seed=seed, extra=tuple(s.get("flags", ())))


def epochs(plan: Plan, arm: str) -> int:
    """The epochs of ``arm``'s runs (a registered recipe's default is the testbed's 20)."""
    return int(settings(plan, arm).get("epochs", 20 if registered_recipe(plan.recipe) else Budget().epochs))


def train_argv(
    plan: Plan, work, splits: Dict[str, object], arm: str, seed: int, python: Optional[str] = None
) -> List[str]:
    """``python -m clip_dcl.train -- ...`` of one run: the registered recipe's flags, or `train_command`'s from
    the plan's [train] keys; then the arm's flags and ``--resume latest``."""
    s = settings(plan, arm)
    entry = [python or sys.executable, "-m", "clip_dcl.train", "--"]
    folder = run_dir(work, arm, seed)
    recipe = registered_recipe(plan.recipe)
    if recipe is not None:
        from ..recipes import fill

        argv = recipe.train_argv(
            batch_size=int(s.get("batch_size", 32)),
            seed=seed,
            epochs=epochs(plan, arm),
            name=folder.name,
            objective=(*s.get("flags", ()), *plan.arm(arm).flags),
            device=s.get("device", "cpu"),
        )
        return entry + fill(argv, str(data_dir(work)), str(folder.parent)) + ["--resume", "latest"]
    data = {
        "train_data": splits["train"],
        "val_data": splits["validation"],
        "train": {"num_samples": splits["train_samples"]},
        "val": {"num_samples": splits["validation_samples"]},
    }
    device = s.get("device", "auto")
    argv = train_command(
        Run(folder.name, plan.arm(arm).flags),
        data,
        folder.parent,
        budget(plan, arm, seed),
        entry[:-1],
        precision=s.get("precision", "fp32"),
        device=None if device == "auto" else device,
        validate=s.get("validate", True),
    )
    return argv + ["--resume", "latest"]


def score_argv(
    plan: Plan, work, splits: Dict[str, object], arm: str, seed: int, python: Optional[str] = None
) -> List[str]:
    """``clip-dcl study score ...`` of one run: both splits' scores and the run's record into its folder."""
    s = settings(plan, arm)
    folder = run_dir(work, arm, seed)
    options = {
        "--checkpoint": folder / "checkpoints" / f"epoch_{epochs(plan, arm)}.pt",
        "--validation": splits["validation"],
        "--test": splits["test"],
        "--recipe": plan.recipe,
        "--arm": arm,
        "--seed": seed,
        "--validation-zeroshot": splits.get("validation_zeroshot") or None,
        "--test-zeroshot": splits.get("test_zeroshot") or None,
        "--device": s.get("device", "cpu" if registered_recipe(plan.recipe) else "auto"),
    }
    return [python or sys.executable, "-m", "clip_dcl.cli", "study", "score", str(folder), *flag_words(options)]


def shell_line(
    plan: Plan, work, splits: Dict[str, object], arm: str, seed: int, threads: int, python: Optional[str] = None
) -> str:
    """The run's line: ``env THREADS PYTHONPATH python -m clip_dcl.train -- ... && env ... study score ...``."""
    env = ["env", f"OMP_NUM_THREADS={threads}", f"MKL_NUM_THREADS={threads}", f"PYTHONPATH={package_root()}"]
    train = " ".join(map(shlex.quote, env + train_argv(plan, work, splits, arm, seed, python)))
    score = " ".join(map(shlex.quote, env + score_argv(plan, work, splits, arm, seed, python)))
    line = f"{train} && {score}"
    if CONTROL.search(line):  # the plan's values are checked; a path given on the command line is not
        raise StudyError(f"a run's line would hold a control character: {line!r}; use paths without them")
    return line


def run_tag(i: int, n: int) -> str:
    """The comment that ends line ``i`` of ``n`` in `study commands`: launch/study_slurm.sbatch runs a file only
    when every line carries its own number and the file has ``n`` lines (a run split over two lines would not)."""
    return f"# clip-dcl study run {i} of {n}"


def all_lines(
    plan: Plan,
    work,
    splits: Dict[str, object],
    threads: int,
    look: Optional[int] = None,
    only: Optional[Sequence[int]] = None,
) -> List[tuple]:
    """``(arm, seed, line)`` of every run of the plan, of its first ``look`` looks and of ``only``'s seeds when
    given."""
    seeds = plan.seeds if look is None else plan.seeds[: plan.design()[look - 1][0]]
    return [
        (arm, seed, shell_line(plan, work, splits, arm, seed, threads))
        for arm, seed in plan.runs()
        if seed in seeds and (only is None or seed in only)
    ]


def placeholder_splits(plan: Plan) -> Dict[str, object]:
    """Splits standing in for data a [data] command has not made yet (paths under ``WORK/data``, the plan's
    sample counts or 1024), enough to build a training command and check its flags."""
    splits: Dict[str, object] = {}
    for key in ("train", "validation", "test"):
        splits[key] = f"WORK/data/{key}/{{0..1}}.tar"
        splits[f"{key}_samples"] = int(plan.data.get(f"{key}_samples") or 1024)
    return splits


def check_arms(plan: Plan, work, splits: Dict[str, object], check_files: bool = True, data: bool = True) -> None:
    """Each arm's training command (its first seed's) through the trainer's own checks, in this process, so
    that a refused command is named before the seal (``StudyError``), not in each run's log."""
    from clip_dcl.train.flags import FlagError, check_flag_words, parse_train_args

    for arm in plan.arms:
        seeds = plan.arm_seeds(arm.name)
        if not seeds:
            continue
        argv = train_argv(plan, work, splits, arm.name, seeds[0])
        argv = argv[argv.index("--") + 1 :]
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
                if data:
                    parse_train_args(argv, check_files=check_files)
                else:
                    check_flag_words(argv)
        except FlagError as e:
            message = str(e)
        except SystemExit:  # argparse printed why
            lines = [x for x in said.getvalue().splitlines() if x.strip()]
            message = lines[-1].split(": error: ", 1)[-1] if lines else "its flags were refused"
        else:
            continue
        raise StudyError(f"arm {arm.name}: the trainer refuses its command: {message}")
