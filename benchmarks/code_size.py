"""The package's size in lines, as ``ruff format`` writes it: each subpackage, and the trainer by concern.

Each line is counted as one of four kinds: a docstring's (the string that opens a module, class or function),
a comment (its first non-blank character is ``#``), blank, or code (the rest). Beside today's tree the report
counts ``clip_dcl/train`` before and after the commit that made the training loop our own (:data:`LOOP_COMMIT`,
which replaced patching OpenCLIP's ``main`` by calling its parts): the files it removed, added and changed,
so that what owning the loop removed is read from the code, not estimated.

    .venv/bin/python benchmarks/code_size.py    # writes benchmarks/results/code_size.{md,json}
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from clip_dcl.experiment.reporting import Report, code_commit, command_line, git, markdown_table

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("code", "docstring", "comment", "blank")
#: The commit whose change made the trainer a loop of its own over OpenCLIP's parts.
LOOP_COMMIT = "49d402a"
#: The trainer's files by what they do (a file of clip_dcl/train not listed is counted under "other").
CONCERNS = {
    "the run's set-up and the epoch loop": ("__init__", "__main__", "session", "loop", "steps", "metrics"),
    "resume, checkpoints, run folder, divergence": (
        "run", "saving", "loss_state", "resume_checks", "divergence", "runfolder",
    ),
    "flags, checked before any work": ("flags", "flag_checks", "loss_flags", "precision", "facts"),
    "data readers with sample ids": ("pipeline", "packed", "csv_data", "ids"),
    "signals, exit codes, the torchrun launcher": ("signals", "exits", "torchrun"),
    "what we rely on of OpenCLIP": ("compat",),
}  # fmt: skip


def line_kinds(source: str) -> Dict[str, int]:
    """How many lines of ``source`` are code, docstring, comment and blank (and ``total``)."""
    lines = source.splitlines()
    kind = ["code"] * len(lines)
    for i, line in enumerate(lines):
        if not line.strip():
            kind[i] = "blank"
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and lines[tok.start[0] - 1].strip().startswith("#"):
            kind[tok.start[0] - 1] = "comment"
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                for i in range(first.lineno - 1, first.end_lineno):
                    kind[i] = "docstring"
    counts = {k: kind.count(k) for k in KINDS}
    counts["total"] = len(lines)
    return counts


def _git(*args: str) -> str:
    out = git(*args, cwd=ROOT)
    if out is None:
        raise SystemExit(f"git {' '.join(args)} failed in {ROOT}: a clone with its history is needed")
    return out


def sources(folder: str, rev: Optional[str] = None) -> Dict[str, str]:
    """The ``.py`` files under ``folder`` (relative to the repository): the working tree's, or at ``rev``."""
    if rev is None:
        return {str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / folder).rglob("*.py"))}
    names = _git("ls-tree", "-r", "--name-only", rev, folder).split()
    return {n: _git("show", f"{rev}:{n}") for n in names if n.endswith(".py")}


def add(counts: Sequence[Dict[str, int]]) -> Dict[str, int]:
    return {k: sum(c[k] for c in counts) for k in (*KINDS, "total")}


def concern_of(path: str) -> str:
    stem = Path(path).stem
    return next((name for name, stems in CONCERNS.items() if stem in stems), "other")


def measure(rev: Optional[str] = None) -> dict:
    """Lines by kind: every file of ``clip_dcl/``, each subpackage, the trainer's concerns (at ``rev``)."""
    files = {path: line_kinds(text) for path, text in sources("clip_dcl", rev).items()}
    parts: Dict[str, List[dict]] = {}
    for path, counts in files.items():
        rel = Path(path).relative_to("clip_dcl")
        parts.setdefault(rel.parts[0] if len(rel.parts) > 1 else "top-level modules", []).append(counts)
    train = {p: c for p, c in files.items() if p.startswith("clip_dcl/train/")}
    concerns = {name: add([c for p, c in train.items() if concern_of(p) == name]) for name in [*CONCERNS, "other"]}
    return {
        "package": add(list(files.values())),
        "subpackages": {name: add(c) for name, c in sorted(parts.items())},
        "train_concerns": {k: v for k, v in concerns.items() if v["total"]},
        "files": files,
    }


def loop_change(commit: str = LOOP_COMMIT) -> dict:
    """``clip_dcl/train`` before and after ``commit``: its total lines, and per file the lines removed or added."""
    before = {p: line_kinds(t)["total"] for p, t in sources("clip_dcl/train", f"{commit}^").items()}
    after = {p: line_kinds(t)["total"] for p, t in sources("clip_dcl/train", commit).items()}
    files = {p: [before.get(p, 0), after.get(p, 0)] for p in sorted({*before, *after})}
    return {
        "commit": commit,
        "subject": _git("log", "-1", "--format=%s", commit).strip(),
        "before": sum(before.values()),
        "after": sum(after.values()),
        "files": {p: v for p, v in files.items() if v[0] != v[1]},
    }


def _row(name: str, c: Dict[str, int]) -> list:
    return [name, f"{c['total']:,}", *(f"{c[k]:,}" for k in KINDS)]


def markdown(doc: dict, report: Report) -> List[str]:
    now, loop = doc["now"], doc["loop_change"]
    head = ["", "lines", *KINDS]
    sub = [_row(f"`clip_dcl/{n}/`" if "modules" not in n else n, c) for n, c in now["subpackages"].items()]
    concerns = [_row(n, c) for n, c in now["train_concerns"].items()]
    changed = [[f"`{Path(p).name}`", f"{b:,}", f"{a:,}", f"{a - b:+,}"] for p, (b, a) in loop["files"].items()]
    return [
        "# The package's size in lines",
        "",
        *report.about(status="complete"),
        f"- Code: {doc['commit']} (lines as `ruff format` writes them; kinds: a docstring's, a comment, blank, "
        "the rest code)",
        "",
        markdown_table(head, [*sub, _row("**all of `clip_dcl/`**", now["package"])], "lrrrrr"),
        "",
        "## The trainer (`clip_dcl/train`) by concern",
        "",
        markdown_table(head, [*concerns, _row("**all**", now["subpackages"]["train"])], "lrrrrr"),
        "",
        f"## What owning the loop changed ({loop['commit']})",
        "",
        f"`{loop['commit']}` ({loop['subject']}) took `clip_dcl/train` from {loop['before']:,} to "
        f"{loop['after']:,} lines ({loop['after'] - loop['before']:+,}): the files it removed or changed, "
        "before and after:",
        "",
        markdown_table(["file", "before", "after", "change"], changed, "lrrr"),
    ]


def trainer_block(doc: dict) -> str:
    """The size of the trainer and the package, for docs/development.md."""
    now, loop = doc["now"], doc["loop_change"]
    train, package = now["subpackages"]["train"], now["package"]
    removed = sum(b - a for b, a in loop["files"].values() if a < b)
    added = sum(a - b for b, a in loop["files"].values() if a > b)
    largest = max(now["train_concerns"].items(), key=lambda item: item[1]["total"])
    return (
        f"At {doc['commit']} `clip_dcl/train` is {train['total']:,} lines ({train['code']:,} of code, "
        f"{train['docstring']:,} of docstrings, {train['comment']:,} of comments, {train['blank']:,} blank) and "
        f"`clip_dcl/` {package['total']:,} ({package['code']:,} of code). Owning the loop ({loop['commit']}) took "
        f"the trainer from {loop['before']:,} to {loop['after']:,} lines: the files it removed or shortened lost "
        f"{removed:,} (the patches of OpenCLIP's `main`, the guards of its bytecode, the side channels), those it "
        f"added or lengthened gained {added:,} (the loop, the set-up in the order of OpenCLIP's `main`, the checks "
        f"of what we rely on). The largest concern is "
        f"{largest[0]} ({largest[1]['total']:,} lines). "
        f"([results](../benchmarks/results/code_size.md), {doc['date'][:10]})"
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/code_size"), help="report path, no suffix")
    args = parser.parse_args(argv)
    report = Report.at(args.out, command_line("code_size.py", list(argv or [])), roots=[ROOT])
    doc = {"status": "complete", "commit": code_commit(ROOT), "now": measure(), "loop_change": loop_change()}
    doc["date"] = report.date
    md = report.write(markdown(doc, report), doc)
    print(trainer_block(doc))
    print(f"wrote {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
