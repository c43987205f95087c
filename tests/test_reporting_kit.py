"""The benchmarks' reporting kit (``clip_dcl.experiment.reporting``) and memory readings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clip_dcl.experiment.reporting import Report, command_line, markdown_table, report_path, write_json
from clip_dcl.paths import REPO, shown_path, shown_text


def test_markdown_table_lays_out_header_rule_and_rows():
    table = markdown_table(["run", "n", "score"], [["clip", 3, "1.5"], ["dcl", 10, "2.0"]], align="lrr")
    assert table.splitlines() == ["| run | n | score |", "|---|---:|---:|", "| clip | 3 | 1.5 |", "| dcl | 10 | 2.0 |"]
    # columns past ``align`` are left-aligned; no rows is a header alone
    assert markdown_table(["a", "b"], [], align="r").splitlines() == ["| a | b |", "|---:|---|"]


def test_report_writes_markdown_and_json_with_its_about_items_first(tmp_path):
    report = Report.at(
        tmp_path / "sub" / "bench",
        "python benchmarks/bench.py --quick",
        date="2030-01-02 03:04",
        machine="a test machine",
    )
    assert report.about(status="complete") == [
        "- Status: complete",
        "- Command: `python benchmarks/bench.py --quick`",
        "- Date (UTC): 2030-01-02 03:04",
        "- Machine: a test machine",
    ]
    assert report.about(date="later")[1] == "- Date (UTC): later"
    md = report.write(["# title", "", "body\n\n"], {"rows": [1, 2], "path": tmp_path, "machine": "overridden"})
    assert md == tmp_path / "sub" / "bench.md" and md.read_text() == "# title\n\nbody\n"
    doc = json.loads((tmp_path / "sub" / "bench.json").read_text())
    assert list(doc) == ["command", "date", "machine", "rows", "path"]
    assert doc["machine"] == "overridden" and doc["path"] == str(tmp_path) and doc["date"] == "2030-01-02 03:04"
    assert report.png == tmp_path / "sub" / "bench.png"


def test_a_published_json_names_paths_under_the_work_folder_relative_to_it_and_the_interpreter_python(tmp_path):
    work = tmp_path / "work"
    doc = {
        "command": [sys.executable, "-m", "clip_dcl.train", "--train-data", str(work / "data" / "{0..3}.tar")],
        "checkpoint": work / "runs" / "c.pt",
        "work": str(work),
        "beside": str(tmp_path / "work2" / "x"),
        "rows": [{"interpreter": "/opt/env/bin/python3.11"}],
        "n": 3,
        "text": "a/b",
    }
    got = json.loads(write_json(tmp_path / "r.json", doc, roots=[work]).read_text())
    assert got["command"] == ["python", "-m", "clip_dcl.train", "--train-data", "data/{0..3}.tar"]
    assert (got["checkpoint"], got["work"], got["rows"][0]["interpreter"]) == ("runs/c.pt", ".", "python")
    assert (got["beside"], got["n"], got["text"]) == (str(tmp_path / "work2" / "x"), 3, "a/b")  # not under work
    report = Report.at(tmp_path / "bench", "python benchmarks/bench.py", work=work)
    report.write("# x", {"checkpoint": str(work / "runs" / "c.pt")})
    assert json.loads(report.path(".json").read_text())["checkpoint"] == "runs/c.pt"


def test_a_report_names_no_path_of_the_machine_in_its_command(tmp_path):
    work, out = tmp_path / "sb10", tmp_path / "x" / "r.json"
    argv = ["--work", str(work), "--output", str(out), "--logs", str(work / "runs"), "--only", "decl rate=index"]
    line = command_line("b.py", [*argv, str(REPO / "benchmarks" / "work" / "w")])
    assert line == (
        ".venv/bin/python benchmarks/b.py --work $OUTSIDE/sb10 --output $OUTSIDE/r.json --logs $OUTSIDE/sb10/runs"
        " --only 'decl rate=index' benchmarks/work/w"
    )
    report = Report.at(tmp_path / "bench", f"bench --work {work} --x={work}/a", work=work, machine="m")
    report.write("# x", {})
    assert json.loads(report.path(".json").read_text())["command"] == "bench --work $OUTSIDE/sb10 --x=$OUTSIDE/sb10/a"
    assert report.about()[0] == "- Command: `bench --work $OUTSIDE/sb10 --x=$OUTSIDE/sb10/a`"


def test_a_shown_path_is_relative_inside_the_repository_and_outside_from_the_folder_given():
    assert shown_path(REPO / "benchmarks" / "results") == "benchmarks/results" and shown_path(REPO) == "."
    assert shown_path("/w/a/runs/x.pt", ["/w/a/runs", "/w/a"]) == "$OUTSIDE/a/runs/x.pt"  # the outermost folder
    assert shown_path("/elsewhere/out.md", ["/w/a"]) == "$OUTSIDE/out.md"
    assert (shown_path("runs/x"), shown_path("/")) == ("runs/x", "/")
    text = "found in /w/a/ckpt. see https://x.org/w/a, 3/4 and a / b"
    assert shown_text(text, ["/w/a"]) == "found in $OUTSIDE/a/ckpt. see https://x.org/w/a, 3/4 and a / b"


def test_a_smoke_run_reports_into_a_new_folder_and_a_given_path_wins(tmp_path):
    default = tmp_path / "results" / "bench"
    assert report_path(None, default, quick=False) == default
    quick = report_path(None, default, quick=True)
    assert quick.name == "bench" and quick.parent.is_dir() and tmp_path not in quick.parents
    assert quick != report_path(None, default, quick=True)
    assert report_path(str(tmp_path / "mine"), default, quick=True) == tmp_path / "mine"


# Run in a fresh interpreter, as the benchmarks measure: in a pytest worker that has run other tests
# the allocator may serve 64 MiB from memory it already holds, and the resident size does not move.
_MEMORY_PROBE = """
import json
import numpy as np
from clip_dcl.experiment import memory
before = memory.current_rss_bytes()
block = np.ones(64 * memory.MIB // 8)  # 64 MiB, touched
during = memory.current_rss_bytes()
del block
after = memory.current_rss_bytes()
print(json.dumps({"before": before, "during": during, "after": after, "peak": memory.peak_rss_bytes(),
                  "peak_mib": memory.peak_rss_mib(), "mib": memory.MIB}))
"""


def test_peak_memory_keeps_an_allocation_that_current_memory_gives_back():
    # a fresh interpreter (no torch): a small process whose resident memory the probe can move measurably, started
    # by a process whose resident memory is larger (256 MiB more, touched)
    ballast = np.ones(256 * 2**20 // 8)
    out = subprocess.run(
        [sys.executable, "-c", _MEMORY_PROBE],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    ).stdout
    del ballast
    r = json.loads(out)
    mib = r["mib"]
    assert r["during"] - r["before"] > 48 * mib
    assert r["after"] < r["during"] - 32 * mib  # numpy returns a block this large to the system
    # the kernel's high-water mark may trail the resident size by a few pages
    assert r["peak"] > r["during"] - mib > r["after"]
    # and it is this process's own: not the peak of the (much larger) test process that started it
    assert r["peak"] < r["during"] + 16 * mib
    assert r["peak_mib"] == pytest.approx(r["peak"] / mib)
