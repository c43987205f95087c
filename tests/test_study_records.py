"""The study records committed beside their plans (benchmarks/studies/*.work) name no path of the machine the study
ran on: the seal, each run's record, the attempts, the sealed plan, the data's summary and the folder's README
speak of the repository's paths only; nor does any committed result (benchmarks/results, and the records' OpenCLIP
params.txt and gzipped out.log): docs/development.md, "Paths in results"."""

import gzip
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ("SEAL.json", "run.json", "attempts.jsonl", "plan.toml", "summary.json", "README.md")
#: an absolute path under a machine's working folders (a path inside the repository, benchmarks/work/..., is not)
ABSOLUTE = re.compile(r"(?<![\w.~-])/(?:work|tmp|root|home|scratch|Users)/")
#: the same, macOS's /private/ and a Windows drive's folder added
MACHINE_PATH = re.compile(ABSOLUTE.pattern + r"|(?<![\w.~-])/private/|(?<=[A-Za-z])(?<![\w.][A-Za-z]):\\[\w.$-]")
#: what every match of MACHINE_PATH holds, found fast (no look-behind first): the lines worth the full pattern
CANDIDATE = re.compile(r"/(?:work|tmp|root|home|scratch|Users|private)/|:\\")


def result_files():
    """Every file under benchmarks/results and benchmarks/studies but the plans (inputs, not results)."""
    studies = ROOT / "benchmarks" / "studies"
    for folder in (ROOT / "benchmarks" / "results", studies):
        for path in sorted(folder.rglob("*")):
            if path.is_file() and not (path.parent == studies and path.suffix == ".toml"):
                yield path


def result_text(path):
    """The file's text (a .gz one decompressed), or None for a binary file (a figure)."""
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    if b"\0" in data:
        return None
    return data.decode("utf-8", errors="replace")


def machine_paths(paths, root=ROOT):
    """``file:line: text`` of each line of ``paths`` (under ``root``) that names an absolute path of a machine."""
    found = []
    for path in paths:
        text = result_text(path) or ""
        if not CANDIDATE.search(text):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if CANDIDATE.search(line) and MACHINE_PATH.search(line):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()[:160]}")
    return found


def test_the_committed_study_records_name_no_absolute_path():
    folders = sorted((ROOT / "benchmarks" / "studies").glob("*.work"))
    assert len(folders) >= 7
    found = {}
    for folder in folders:
        for path in folder.rglob("*"):
            if path.name in RECORDS and path.is_file():
                hits = ABSOLUTE.findall(path.read_text())
                if hits:
                    found[str(path.relative_to(ROOT))] = len(hits)
    assert not found, f"records naming an absolute path of a machine: {found}"


def test_the_pattern_tells_a_machine_path_from_the_repositorys():
    assert ABSOLUTE.search('"source": "/work/study/benchmarks/studies/x.toml"')
    assert ABSOLUTE.search("--work /tmp/example")
    assert not ABSOLUTE.search("--work benchmarks/work/fscenes_gate --parallel 2")
    assert not ABSOLUTE.search('"checkpoint": "runs/clip-b32/seed100/checkpoints/epoch_10.pt"')


def test_no_committed_result_names_an_absolute_path_of_a_machine():
    files = list(result_files())
    assert sum(p.suffix == ".gz" for p in files) >= 250 and sum(p.name == "params.txt" for p in files) >= 250
    found = machine_paths(files)
    assert not found, f"{len(found)} lines name an absolute path of a machine:\n" + "\n".join(found[:40])


def test_the_scan_reads_gzipped_logs_and_names_the_file_and_line(tmp_path):
    log, params, figure = tmp_path / "out.log.gz", tmp_path / "params.txt", tmp_path / "f.png"
    log.write_bytes(gzip.compress(b"ok\nNo checkpoint found in /tmp/confirm/runs/a/seed1/checkpoints.\n"))
    params.write_text("logs: benchmarks/work/x/runs\nval_data: $OUTSIDE/confirm/data/val.tar\nout: C:\\runs\\a\n")
    figure.write_bytes(b"\x89PNG\0/tmp/x")
    found = machine_paths([log, params, figure], tmp_path)
    assert [f.split(": ")[0] for f in found] == ["out.log.gz:2", "params.txt:3"]
    assert MACHINE_PATH.search("--work /private/var/folders/x") and not MACHINE_PATH.search("https://a.b/tmp/x")
