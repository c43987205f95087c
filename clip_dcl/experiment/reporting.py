"""The reporting kit of the benchmarks: a report's files and opening lines, tables, JSON, figures (a `Report`
records the command, the date and the machine beside the measurement)."""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import re
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .. import paths
from .figures import pyplot, save_figure
from .runner import Budget, TrainResult
from .scoring import chance_levels, headline_metrics
from .stats import format_mean_std, mean_std


def cpu_model() -> str:
    """This machine's CPU model (``/proc/cpuinfo``'s, else what ``platform`` knows)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return cpu


def machine_info() -> str:
    """One line naming this machine for results files: CPU model, cores, GPU, OS, Python, torch."""
    import torch

    cpu = cpu_model()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"{cpu}, {os.cpu_count()} CPU cores ({torch.get_num_threads()} torch threads), {gpu}; "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}, torch {torch.__version__}"
    )


def git(*args: str, cwd: os.PathLike, **env: str) -> Optional[str]:
    """The output of ``git args`` in ``cwd`` (``env`` added to the environment); None when it fails."""
    import subprocess

    try:
        out = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30, env={**os.environ, **env}
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def code_commit(where: Optional[os.PathLike] = None) -> str:
    """The commit the code at ``where`` (default: this package's repository) is at, with ``+changes`` when
    tracked files differ from it; ``unknown`` outside a git checkout (an installed wheel)."""
    where = Path(where) if where is not None else Path(__file__).resolve().parents[2]
    head = (git("rev-parse", "--short=10", "HEAD", cwd=where) or "").strip() or "unknown"
    changed = head != "unknown" and (git("status", "--porcelain", "--untracked-files=no", cwd=where) or "").strip()
    return head + ("+changes" if changed else "")


def command_line(script: str, argv: Sequence[str], python: str = ".venv/bin/python") -> str:
    """How a report says it was made: ``python benchmarks/<script> <argv>``, quoted for a shell, its absolute
    paths as :func:`clip_dcl.paths.shown_text` writes them, each absolute argument one of its folders (a path
    under ``--work DIR`` is written from DIR's name)."""
    line = " ".join([python, f"benchmarks/{script}", *map(shlex.quote, argv)])
    return paths.shown_text(line, [a for a in argv if os.path.isabs(a)])


def run_status(scores: Dict[str, list], complete: bool) -> str:
    """``complete``, or which runs a report rewritten while the benchmark still runs holds
    (``scores``: run -> its finished seeds)."""
    if complete:
        return "complete"
    return "PARTIAL: still running; runs so far: " + ", ".join(f"{n} x{len(v)}" for n, v in scores.items())


def about_lines(*, command: str, date: str, machine: Optional[str] = None, status: Optional[str] = None) -> List[str]:
    """The opening items of a benchmark's Markdown report: status (when given), command, date and machine."""
    lines = [f"- Status: {status}"] if status is not None else []
    return lines + [
        f"- Command: `{command}`",
        f"- Date (UTC): {date}",
        f"- Machine: {machine_info() if machine is None else machine}",
    ]


def utc_date(fmt: str = "%Y-%m-%d %H:%M") -> str:
    """Now in UTC, as a report's date line gives it."""
    return time.strftime(fmt, time.gmtime())


def markdown_table(head: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> str:
    """A Markdown table of ``head`` and ``rows``; ``align``: one letter a column, ``l`` (default) or ``r``."""
    rule = "|" + "|".join("---:" if a == "r" else "---" for a in align.ljust(len(head), "l")) + "|"
    lines = ["| " + " | ".join(map(str, head)) + " |", rule]
    return "\n".join(lines + ["| " + " | ".join(map(str, cells)) + " |" for cells in rows])


#: the file name of a Python interpreter (``python``, ``python3``, ``python3.11``)
_PYTHON = re.compile(r"python[\d.]*")


def portable(doc, roots: Sequence[os.PathLike] = ()):
    """``doc`` (JSON's types, paths as :class:`~pathlib.Path` or ``str``) without the paths of the machine that
    made it: an absolute path under one of ``roots`` is written relative to the innermost, an interpreter
    (an absolute path named ``python*``) as ``python``; any other value is kept."""
    bases = []
    for root in roots:
        for form in (Path(root).absolute(), Path(root).resolve()):
            if str(form) not in bases:
                bases.append(str(form))
    bases.sort(key=len, reverse=True)  # the innermost root first: a work folder inside the repository

    def one(value):
        if isinstance(value, dict):
            return {k: one(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [one(v) for v in value]
        if isinstance(value, Path):
            value = str(value)
        if not isinstance(value, str) or not os.path.isabs(value):
            return value
        if _PYTHON.fullmatch(os.path.basename(value)):
            return "python"
        for base in bases:
            if value == base or value.startswith(base.rstrip(os.sep) + os.sep):
                return os.path.relpath(value, base)
        return value

    return one(doc)


def write_json(path: os.PathLike, doc: dict, roots: Sequence[os.PathLike] = ()) -> Path:
    """``doc`` as indented JSON (anything JSON lacks, a date, as its ``str``; paths :func:`portable` with
    ``roots``), folders created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    paths.write_json(path, portable(doc, roots), default=str)
    return path


@dataclass
class Report:
    """One benchmark's results: ``<stem>.md``, ``.json`` and ``.png`` in ``folder``; ``command``, ``date`` and
    ``machine`` open the Markdown and the JSON, whose paths are :func:`portable` (``work`` and ``roots``); the
    command's paths are :func:`clip_dcl.paths.shown_text`'s, ``work`` and ``roots`` its folders."""

    folder: Path
    stem: str
    command: str
    date: str = field(default_factory=utc_date)
    machine: str = field(default_factory=lambda: machine_info())
    work: Optional[os.PathLike] = None
    roots: Tuple[os.PathLike, ...] = ()

    def __post_init__(self):
        self.folder = Path(self.folder)
        self.command = paths.shown_text(self.command, [*([self.work] if self.work else []), *self.roots])

    @classmethod
    def at(cls, path: os.PathLike, command: str, **about) -> "Report":
        """The report whose files are ``path`` plus ``.md``, ``.json``, ``.png``."""
        path = Path(path)
        return cls(path.parent, path.name, command, **about)

    def path(self, suffix: str) -> Path:
        """``folder/<stem><suffix>``."""
        return self.folder / f"{self.stem}{suffix}"

    @property
    def png(self) -> Path:
        return self.path(".png")

    def about(self, status: Optional[str] = None, date: Optional[str] = None) -> List[str]:
        """The report's opening items (:func:`about_lines`); ``date`` may say more than :attr:`date`."""
        return about_lines(
            status=status, command=self.command, date=self.date if date is None else date, machine=self.machine
        )

    def write(self, markdown: Union[str, Sequence[str]], doc: Optional[dict] = None, sep: str = "\n") -> Path:
        """Write the Markdown (a text, or its parts joined by ``sep``, ending in one newline) and, when
        ``doc`` is given, the JSON: ``command``, ``date`` and ``machine``, then ``doc`` (whose keys win)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        text = markdown if isinstance(markdown, str) else sep.join(markdown)
        md = self.path(".md")
        md.write_text(text.rstrip("\n") + "\n")
        if doc is not None:
            write_json(
                self.path(".json"),
                {"command": self.command, "date": self.date, "machine": self.machine, **doc},
                roots=[*([self.work] if self.work else []), *self.roots],
            )
        return md

    def figure(self, fig, title: str = "", **options) -> Path:
        """Save ``fig`` as the report's PNG (:func:`save_figure`)."""
        return save_figure(fig, self.png, title, **options)


def add_report_arguments(parser, stem: str, quick: str) -> None:
    """``--out`` (the report's path without suffix, read by :func:`report_path`) and ``--quick``
    (``quick``: what the smoke run does) of a benchmark that writes ``benchmarks/results/<stem>``."""
    parser.add_argument(
        "--out",
        help=f"the report's path without suffix (default "
        f"benchmarks/results/{stem}; with --quick a new temporary folder)",
    )
    parser.add_argument("--quick", action="store_true", help=f"smoke run: {quick}")


def report_path(given: Optional[os.PathLike], default: os.PathLike, quick: bool) -> Path:
    """Where a report goes, as a path without suffix: ``given``, else for a smoke run a new temporary folder
    (it must not overwrite the committed results), else ``default``."""
    if given:
        return Path(given)
    default = Path(default)
    return Path(tempfile.mkdtemp(prefix=f"{default.name}_")) / default.name if quick else default


def comparison_table(
    scores: Dict[str, List[Dict[str, float]]], rows: Sequence[tuple], chance: Dict[str, float], bold: bool = True
) -> str:
    """Markdown: one row per metric, one column per run (mean ± sample std over seeds, ``scores``: run -> one
    metrics dict per seed), in percent; the best mean of a row in bold, unless ``bold`` is False."""
    names = list(scores)
    header = "| metric (%) | chance | " + " | ".join(names) + " |"
    lines = [header, "|" + "---|" * (len(names) + 2)]
    for key, label in rows:
        values = {n: [s.get(key, float("nan")) for s in scores[n]] for n in names}
        means = {
            n: (sum(v) / len(v) if v and all(math.isfinite(x) for x in v) else float("nan")) for n, v in values.items()
        }
        finite = [m for m in means.values() if math.isfinite(m)]
        best = max(finite) if finite else None
        cells = []
        for n in names:
            cell = format_mean_std(mean_std(values[n]))
            cells.append(f"**{cell}**" if bold and best is not None and means[n] == best and len(names) > 1 else cell)
        level = chance.get(key)
        lines.append(f"| {label} | {'' if level is None else f'{100 * level:.1f}'} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(
    results: Dict[str, List[TrainResult]],
    scores: Dict[str, List[Dict[str, float]]],
    rows: Sequence[tuple],
    chance: Dict[str, float],
    path: os.PathLike,
    title: str = "",
) -> Path:
    """A PNG: training loss and validation R@1 per epoch (left), headline scores per run (right)."""
    import numpy as np

    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8), gridspec_kw={"width_ratios": [1, 1, 2]})
    names = list(results)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, name in enumerate(names):
        colour = colours[i % len(colours)]
        for j, res in enumerate(results[name]):
            label = name if j == 0 else None
            curve = res.curves.get("loss2") or res.curves["loss"]  # loss2: DeCL's InfoNCE in older logs
            infonce_of_decl = "loss2" in res.curves or "decl" in getattr(res.run, "flags", ())  # its Loss is InfoNCE
            label = f"{name} (InfoNCE term)" if j == 0 and infonce_of_decl else label
            axes[0].plot(res.curves["epoch"], curve, color=colour, alpha=0.8, lw=1, label=label)
            if res.val:
                ep = [r.get("epoch", k + 1) for k, r in enumerate(res.val)]
                r1 = [(r.get("image_to_text_R@1", np.nan) + r.get("text_to_image_R@1", np.nan)) / 2 for r in res.val]
                axes[1].plot(ep, [100 * v for v in r1], "o-", color=colour, alpha=0.8, label=label)
    axes[0].set(xlabel="epoch", ylabel="loss (each objective's own)", title="training loss")
    axes[1].set(xlabel="epoch", ylabel="mean R@1 (%)", title="validation retrieval (OpenCLIP, 1 caption)")
    for ax in axes[:2]:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)

    ax = axes[2]
    width = 0.8 / max(1, len(names))
    x = np.arange(len(rows))
    for i, name in enumerate(names):
        means = [100 * np.nanmean([s.get(k, np.nan) for s in scores[name]]) for k, _ in rows]
        errs = [
            100 * (np.nanstd([s.get(k, np.nan) for s in scores[name]], ddof=1) if len(scores[name]) > 1 else 0)
            for k, _ in rows
        ]
        ax.bar(
            x + (i - (len(names) - 1) / 2) * width,
            means,
            width,
            yerr=errs,
            label=name,
            color=colours[i % len(colours)],
            capsize=2,
        )
    ax.scatter(
        x, [100 * chance.get(k, np.nan) for k, _ in rows], marker="_", s=300, color="black", label="chance", zorder=3
    )
    ax.set_xticks(x, [label for _, label in rows], rotation=60, ha="right", fontsize=7)
    ax.set(ylabel="%", title="held-out scores")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path, title)


def write_report(
    out_dir: os.PathLike,
    stem: str,
    *,
    data: dict,
    budget: Budget,
    results: Dict[str, List[TrainResult]],
    scores: Dict[str, List[Dict[str, float]]],
    header: str = "",
    extra: Optional[dict] = None,
    roots: Sequence[os.PathLike] = (),
    smoke_test: Optional[str] = None,
) -> Dict[str, Path]:
    """Write ``<stem>.md`` (table), ``<stem>.json`` (raw numbers, commands; :func:`portable` paths) and
    ``<stem>.png``. ``smoke_test``: the sentence that says the numbers only show the job ran, written above
    the table and into the JSON, with no number in bold."""
    work = Path(data["out_dir"]).parent if data.get("out_dir") else None
    report = Report(
        out_dir, stem, command=" ".join([Path(sys.argv[0]).name] + sys.argv[1:]), work=work, roots=tuple(roots)
    )
    rows = headline_metrics(data)
    chance = chance_levels(data)
    table = comparison_table(scores, rows, chance, bold=smoke_test is None)
    png = plot(results, scores, rows, chance, report.png, title=header.splitlines()[0] if header else "")
    doc = {
        "budget": dataclasses.asdict(budget),
        "data": {k: data[k] for k in ("out_dir", "train_data", "val_data", "tau_plus", "config") if k in data},
        "chance": chance,
        "table": table,
        "runs": {
            name: [
                {
                    "flags": list(r.run.flags),
                    "seed": s.get("seed"),
                    "checkpoint": str(r.checkpoint),
                    "train_seconds": r.seconds,
                    "command": r.command,
                    "curves": r.curves,
                    "val": r.val,
                    "metrics": {k: v for k, v in s.items() if k != "seed"},
                }
                for r, s in zip(results[name], scores[name])
            ]
            for name in results
        },
        **(extra or {}),
        **({"smoke_test": smoke_test} if smoke_test else {}),
    }
    md = report.write(
        [
            *([header, ""] if header else []),
            *report.about(),
            f"- raw numbers, commands and curves: `{stem}.json`",
            "",
            *([f"**{smoke_test}**", ""] if smoke_test else []),
            table,
            "",
            f"![curves and scores]({png.name})",
        ],
        doc,
    )
    return {"markdown": md, "json": report.path(".json"), "png": png, "table": table}
