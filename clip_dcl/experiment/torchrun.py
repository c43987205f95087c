"""Benchmarks that measure on several ranks: the script launches itself under ``torchrun`` (`launch`), and each
copy, with ``args.worker`` set, measures inside `process_group` and leaves one JSON record per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, Sequence, Tuple

from ..paths import write_json


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    """The hidden flags :func:`launch` passes: ``--worker`` and ``--worker-out`` (the ranks' records)."""
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)


def launch(script: os.PathLike, nproc: int, argv: Sequence[str], *, threads: int = 1, what: str = "") -> List[dict]:
    """Run ``script --worker ... argv`` on ``nproc`` gloo ranks (one machine, no GPU); each rank's record.
    A failure raises ``RuntimeError`` with the tail of the ranks' stderr, after ``what`` when given."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(nproc),
            str(script),
            "--worker",
            "--worker-out",
            out,
            *argv,
        ]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "CUDA_VISIBLE_DEVICES": ""}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode:
            raise RuntimeError(f"{what}: {proc.stderr[-3000:]}" if what else proc.stderr[-3000:])
        return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(nproc)]


@contextmanager
def process_group() -> Iterator[Tuple[int, int]]:
    """The gloo process group of a worker started by :func:`launch`: yields ``(rank, world_size)``."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        yield dist.get_rank(), dist.get_world_size()
    finally:
        dist.destroy_process_group()


def write_rank_record(args: argparse.Namespace, rank: int, record: dict) -> None:
    """Leave this rank's ``record`` for :func:`launch` (``args``: the worker's parsed flags)."""
    if not args.worker_out:
        raise ValueError("write_rank_record needs --worker-out: run the script through launch()")
    write_json(Path(args.worker_out, f"rank{rank}.json"), record, indent=None)
