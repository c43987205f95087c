"""Every command and code block of README.md and docs/*.md that can run on a CPU runs, at small size.

The ``bash`` and ``python`` fenced blocks of each page run in the page's order (data, then training,
evaluation, export, loading), the pages in :data:`PAGES` order (the README's quickstart makes the
data, the run and the export that the other pages use), all in one scratch folder; bash blocks
through ``bash -euo pipefail``, python blocks through ``python -c``, with ``clip-dcl`` and ``python``
on the PATH meaning this checkout: each a process of its own, started from conftest's ``preloaded``
python (torch and OpenCLIP already imported, this checkout imported afresh). Before running, every block gets the small
sizes of
:data:`SUBSTITUTIONS`, and the files of :data:`PREPARED` are written.

A block that cannot run here (GPUs, several nodes, Slurm, downloads, installs) has the marker
``<!-- docs-test: skip (why) -->`` on the line before it; those are counted, not run. A bash block
of commands the docs say are refused has ``<!-- docs-test: refused -->``: each of its commands (a
line, with the lines it continues with a backslash) runs on its own and must exit with code 2, saying why on stderr
without a traceback. A ``text`` block (output, a layout, a synopsis with placeholders) is neither.
The structure checks run in the quick suite; running the blocks is marked slow.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import pytest
from preloaded import Preloaded

ROOT = Path(__file__).resolve().parents[1]
#: The pages, in the order they run: later pages read what earlier ones made.
PAGES = [
    "README.md",
    "docs/training.md",
    "docs/evaluation.md",
    "docs/losses.md",
    "docs/results.md",
    "docs/development.md",
]
PAGES += sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md") if str(p.relative_to(ROOT)) not in PAGES)

#: (the documented text, what the test runs instead, why): applied to every block, in this order.
SUBSTITUTIONS = [
    (
        "clip-dcl data synth data",
        "clip-dcl data synth data --quick --train-samples 64 --val-samples 32 --quiet",
        "64 training pairs in one shard, a 32-image retrieval split, the tiny zero-shot and few-shot sets",
    ),
    ("{00000..00007}.tar", "{00000..00000}.tar", "the one shard of those 64 pairs"),
    ("--batch-size 128", "--batch-size 16", "four steps an epoch"),
    ("--epochs 4", "--epochs 1", "one epoch"),
    ("epoch_4.pt", "epoch_1.pt", "the checkpoint of that one epoch"),
    ("--warmup 100", "--warmup 1", "a warm-up shorter than the run"),
    ("--workers 2", "--workers 1", "one loader process on a 2-core machine"),
    ("clip-dcl eval fewshot", "clip-dcl eval fewshot --grid reduced", "the few-shot probe's small sweep"),
]
#: Files a page reads that no block makes, written by the test: path -> what is there.
PREPARED = {
    "my_images/": "8 images of 64x64 pixels, each with its caption in a .txt of the same name",
    "diverged.pt": "a checkpoint of clip-dcl-tiny whose weights are NaN, as a diverged training leaves them",
    "pickled.pt": "a checkpoint of clip-dcl-tiny that also holds an argparse.Namespace (full unpickling only)",
    "truncated.pt": "the first half of pickled.pt's bytes, as an interrupted save leaves a file",
}

SKIP = re.compile(r"^<!-- docs-test: skip \((?P<why>[^)]+)\) -->$")
REFUSED = "<!-- docs-test: refused -->"
#: The exit code of every refusal (a bad flag, or data the command cannot use), in every ``clip-dcl`` command.
REFUSED_EXIT = 2
MARKER = re.compile(r"<!-- docs-test:")
RUNNERS = {"bash": "bash", "python": "python"}
NOT_RUN = {"text", "toml"}
TIMEOUT = 600


@dataclass
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    skip: Optional[str]  # the marker's reason, or None when the block runs
    refused: bool = False  # each command of the block must be refused (exit code 2)

    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def commands(self) -> List[str]:
        """The block's commands: its lines (one ending in a backslash joined to the next), less comments and blanks."""
        out, held = [], ""
        for line in self.code.split("\n"):
            held += line.rstrip()[:-1] + " " if line.rstrip().endswith("\\") else line
            if not line.rstrip().endswith("\\"):
                if held.strip() and not held.strip().startswith("#"):
                    out.append(held.strip())
                held = ""
        return out


def blocks(page: str) -> List[Block]:
    """The fenced blocks of ``page``, with the skip marker of the line before each (blank lines between
    allowed). ValueError for an unclosed fence or a marker that is malformed or precedes no block."""
    lines = (ROOT / page).read_text().split("\n")
    out, i, pending = [], 0, None
    while i < len(lines):
        line = lines[i].strip()
        if MARKER.search(line):
            m = SKIP.match(line)
            if not m and line != REFUSED:
                raise ValueError(
                    f"{page}:{i + 1}: a docs-test marker must read `<!-- docs-test: skip (why) -->` or "
                    f"`{REFUSED}`, got {line!r}"
                )
            pending = (i + 1, m.group("why") if m else REFUSED)
        elif line.startswith("```"):
            lang, start = line[3:].strip(), i
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                i += 1
            if i == len(lines):
                raise ValueError(f"{page}:{start + 1}: a fence that is never closed")
            refused = bool(pending) and pending[1] == REFUSED
            if refused and lang != "bash":
                raise ValueError(f"{page}:{start + 1}: {REFUSED} marks a bash block, not {lang or 'no language'}")
            out.append(
                Block(
                    page,
                    start + 1,
                    lang,
                    "\n".join(lines[start + 1 : i]),
                    None if refused else pending and pending[1],
                    refused,
                )
            )
            pending = None
        elif line and pending:
            raise ValueError(f"{page}:{pending[0]}: a docs-test marker followed by text, not by a code block")
        i += 1
    if pending:
        raise ValueError(f"{page}:{pending[0]}: a docs-test marker at the end of the page, with no block after it")
    return out


def substituted(code: str) -> str:
    for documented, small, _ in SUBSTITUTIONS:
        code = code.replace(documented, small)
    return code


def runnable(block: Block) -> bool:
    return block.skip is None and block.lang in RUNNERS


# ------------------------------------------------------------------------------------------
# The structure of the pages (quick)
# ------------------------------------------------------------------------------------------
def test_every_block_is_run_marked_or_text_and_the_skipped_ones_are_counted():
    every = [b for page in PAGES for b in blocks(page)]
    unknown = [
        f"{b.where()} ({b.lang or 'no language'})" for b in every if b.lang not in RUNNERS and b.lang not in NOT_RUN
    ]
    assert not unknown, f"give each fence a language ({', '.join([*RUNNERS, *NOT_RUN])}): {unknown}"
    skipped = [b for b in every if b.skip]
    assert all(b.lang in RUNNERS for b in skipped), "a skip marker on a block that would not run anyway"
    outside_code = [re.sub(r"^```.*?^```$", "", (ROOT / page).read_text(), flags=re.S | re.M) for page in PAGES]
    markers = sum(1 for text in outside_code for line in text.split("\n") if SKIP.match(line.strip()))
    assert len(skipped) == markers  # each marker is on one block
    refusing = [b for b in every if b.refused]
    assert len(refusing) == sum(1 for text in outside_code for line in text.split("\n") if line.strip() == REFUSED)
    assert all(b.commands() for b in refusing), "a refused block without a command"
    runs = [b for b in every if runnable(b)]
    readme = [b for b in runs if b.page == "README.md"]
    assert len(readme) >= 6, "the README's quickstart: data, shards from one's images, train, eval, export, load"
    print(
        f"{len(runs)} blocks run ({len(refusing)} of refused commands), {len(skipped)} skipped: "
        + "; ".join(f"{b.where()} ({b.skip})" for b in skipped)
    )


def test_every_substitution_changes_some_block():
    code = "\n".join(b.code for page in PAGES for b in blocks(page) if runnable(b))
    unused = [documented for documented, _, _ in SUBSTITUTIONS if documented not in code]
    assert not unused, f"substitutions that match no documented command any more: {unused}"


def test_the_readmes_load_snippet_scores_with_the_models_own_scale():
    """A model's learned scale (about 14 for clip-dcl-tiny) and a hard-coded 100 give other probabilities."""
    (snippet,) = [b.code for b in blocks("README.md") if b.lang == "python" and "load_checkpoint(" in b.code]
    assert "model.logit_scale.exp() * image_features @ text_features.T" in snippet and "100 *" not in snippet


def test_the_parser_reads_markers_and_refuses_a_stray_one(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "a.md").write_text(
        "x\n<!-- docs-test: skip (needs GPUs) -->\n\n```bash\nnvidia-smi\n```\n```python\nprint(1)\n```\n"
    )
    got = blocks("a.md")
    assert [(b.line, b.lang, b.code, b.skip) for b in got] == [
        (4, "bash", "nvidia-smi", "needs GPUs"),
        (7, "python", "print(1)", None),
    ]
    (tmp_path / "c.md").write_text(
        "<!-- docs-test: refused -->\n```bash\n# why\nclip-dcl a \\\n    --b  # c\n\nclip-dcl d\n```\n"
    )
    (refused,) = blocks("c.md")
    assert refused.refused and refused.skip is None and runnable(refused)
    assert refused.commands() == ["clip-dcl a      --b  # c", "clip-dcl d"]
    for bad in (
        "<!-- docs-test: skip -->\n```bash\nx\n```\n",
        "<!-- docs-test: refused -->\n```python\nx\n```\n",
        "<!-- docs-test: skip (why) -->\nprose\n```bash\nx\n```\n",
        "```bash\nnever closed\n",
        "<!-- docs-test: skip (why) -->\n",
    ):
        (tmp_path / "b.md").write_text(bad)
        with pytest.raises(ValueError):
            blocks("b.md")


# ------------------------------------------------------------------------------------------
# Running them (slow)
# ------------------------------------------------------------------------------------------
def prepare(work: Path, python: Preloaded) -> Dict[str, str]:
    """The scratch folder's PREPARED files; the environment the blocks run in, where ``python`` and ``clip-dcl``
    are ``python``'s shims (a process per command, without paying torch's import each time)."""
    from PIL import Image

    images = work / "my_images"
    images.mkdir()
    for i, (colour, shape) in enumerate([(c, s) for c in ("red", "blue", "green", "yellow") for s in ("a", "b")]):
        Image.new("RGB", (64, 64), colour).save(images / f"{i:03d}.jpg")
        (images / f"{i:03d}.txt").write_text(f"a {colour} picture, version {shape}\n")
    import argparse

    import open_clip
    import torch

    from clip_dcl.models import register_builtin_configs

    register_builtin_configs()
    weights = open_clip.create_model("clip-dcl-tiny").state_dict()
    torch.save(
        {
            "state_dict": {
                k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in weights.items()
            },
            "clip_dcl": {"model": "clip-dcl-tiny"},
        },
        work / "diverged.pt",
    )
    torch.save(
        {
            "state_dict": weights,
            "clip_dcl": {"model": "clip-dcl-tiny"},
            "args": argparse.Namespace(model="clip-dcl-tiny"),
        },
        work / "pickled.pt",
    )
    whole = (work / "pickled.pt").read_bytes()
    (work / "truncated.pt").write_bytes(whole[: len(whole) // 2])
    return python.env(
        {
            **os.environ,
            "CUDA_VISIBLE_DEVICES": "",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        }
    )


def refused(command: str, work: Path, env: Dict[str, str]) -> subprocess.CompletedProcess:
    """One command of a refused block. A plain ``clip-dcl ...`` line runs in this process (``clip_dcl.cli.main``
    in ``work``, its output captured; a refusal comes before any work, so the interpreter's start-up would be
    most of its time); any other line through bash."""
    argv = shlex.split(substituted(command), comments=True)
    if argv[:1] != ["clip-dcl"] or any(c in command for c in "$|;&<>`"):
        return subprocess.run(
            ["bash", "-uo", "pipefail", "-c", substituted(command)],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
    from clip_dcl.cli import main

    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    try:
        os.chdir(work)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv[1:])
            except SystemExit as e:  # argparse's refusals
                code = e.code if isinstance(e.code, int) else 1
            except Exception:  # noqa: BLE001  (a refusal never raises: the traceback is the failure)
                err.write(traceback.format_exc())
                code = 1
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def run_block(block: Block, work: Path, env: Dict[str, str], python: str) -> subprocess.CompletedProcess:
    """The block run as a script; a refused block's commands one by one: a failure (exit code 1) for the
    first that is not refused as documented (exit code 2, a reason on stderr, no traceback), else 0."""
    if block.refused:
        reasons = []
        for command in block.commands():
            res = refused(command, work, env)
            if res.returncode != REFUSED_EXIT or not res.stderr.strip() or "Traceback" in res.stderr:
                return subprocess.CompletedProcess(
                    res.args,
                    1,
                    res.stdout,
                    f"not refused as documented (exit code {res.returncode}, expected "
                    f"{REFUSED_EXIT} and a reason): {command}\n{res.stderr}",
                )
            reasons.append(res.stderr)
        return subprocess.CompletedProcess(block.commands(), 0, "", "".join(reasons))
    code = substituted(block.code)
    argv = ["bash", "-euo", "pipefail", "-c", code] if block.lang == "bash" else [python, "-c", code]
    return subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def run_page(tmp_path_factory, preloaded):
    """``run_page(page)``: run the runnable blocks of every page up to ``page`` (once each, in
    :data:`PAGES` order, in one scratch folder); the failures of ``page`` (block, output), or of the
    page it depends on."""
    done: Dict[str, List[str]] = {}
    work = tmp_path_factory.mktemp("docs")
    env = prepare(work, preloaded)
    return lambda page: run_pages(page, work, env, preloaded.python, done)


def run_pages(page: str, work: Path, env: Dict[str, str], python: str, done: Dict[str, List[str]]) -> List[str]:
    for earlier in PAGES[: PAGES.index(page) + 1]:
        if earlier in done:
            continue
        failures = done[earlier] = []
        for block in filter(runnable, blocks(earlier)):
            res = run_block(block, work, env, python)
            if res.returncode != 0:
                failures.append(
                    f"{block.where()} exited {res.returncode}:\n{substituted(block.code)}\n"
                    f"--- stdout\n{res.stdout[-2000:]}\n--- stderr\n{res.stderr[-4000:]}"
                )
                break  # the page's later blocks read what this one should have made
    upstream = [f"(an earlier page failed) {f}" for p in PAGES[: PAGES.index(page)] for f in done[p]]
    return done[page] + upstream


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_the_pages_commands_run(run_page, page):
    failures = run_page(page)
    assert not failures, "\n\n".join(failures)
