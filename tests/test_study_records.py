"""The study records committed beside their plans (benchmarks/studies/*.work) name no path of the machine the study
ran on: the seal, each run's record, the attempts, the sealed plan, the data's summary and the folder's README
speak of the repository's paths only (OpenCLIP's own params.txt and logs are kept as it wrote them)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ("SEAL.json", "run.json", "attempts.jsonl", "plan.toml", "summary.json", "README.md")
#: an absolute path under a machine's working folders (a path inside the repository, benchmarks/work/..., is not)
ABSOLUTE = re.compile(r"(?<![\w.~-])/(?:work|tmp|root|home|scratch|Users)/")


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
