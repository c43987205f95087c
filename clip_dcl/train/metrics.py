"""A run's metrics as data: one JSON line per logged training step and per evaluation, in ``metrics.jsonl``.

:class:`MetricsWriter` takes the place of OpenCLIP's ``tb_writer``, through which its loop writes every scalar;
readers (the runner, the study engine, the benchmarks) use :func:`read_metrics`, never OpenCLIP's log text.
Imports nothing heavy: readers load it without torch.
"""

from __future__ import annotations

import json
import os
import time
from typing import Dict, List, Optional

METRICS_FILE = "metrics.jsonl"
#: OpenCLIP's scalar names that read better under another name in a record
_RENAMED = {"scale": "logit_scale"}


def _number(value):
    """A JSON number for a Python, numpy or torch scalar."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        value = float(value)
    return value


class MetricsWriter:
    """Stands in for OpenCLIP's ``tb_writer``: scalars go on to ``inner`` and into the record of their step,
    which :meth:`flush` appends to ``path`` (None: not written)."""

    def __init__(self, path: Optional[str], inner=None):
        self.path, self.inner = path, inner
        self.values: Dict[str, object] = {}
        self.step: Optional[int] = None

    def add_scalar(self, tag, value, global_step=None, *args, **kwargs):
        if self.inner is not None:
            self.inner.add_scalar(tag, value, global_step, *args, **kwargs)
        self.step = global_step
        name = str(tag).split("/", 1)[-1]
        self.values[_RENAMED.get(name, name)] = _number(value)

    def flush(self, **fields) -> Optional[dict]:
        """Write the scalars gathered since the last flush as one record (``fields`` first); None if none."""
        if not self.values:
            return None
        record = {**fields, **self.values, "time": round(time.time(), 3)}
        self.values = {}
        if self.path is not None:
            try:
                with open(self.path, "a") as f:
                    f.write(json.dumps(record) + "\n")
            except FileNotFoundError:  # the run folder went away under the run
                from .saving import RunFolderGone

                raise RunFolderGone(self.path) from None
        return record

    def __getattr__(self, name):  # anything else a caller asks of the real writer
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)


def metrics_path(args) -> Optional[str]:
    """``--logs/--name/metrics.jsonl`` on the process that writes OpenCLIP's logs (``args.save_logs``)."""
    if not getattr(args, "save_logs", False) or not getattr(args, "name", None):
        return None
    return os.path.join(args.logs, args.name, METRICS_FILE)


def read_metrics(path, kind: Optional[str] = None) -> List[dict]:
    """The records of a ``metrics.jsonl`` (or of the run folder holding one), in order, of ``kind`` if given;
    torn lines skipped, and the records a resumed run repeated replaced (:func:`superseded`)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, METRICS_FILE)
    if not os.path.isfile(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                out.append(record)
    out = superseded(out)
    return [r for r in out if kind is None or r.get("kind") == kind]


def superseded(records: List[dict]) -> List[dict]:
    """``records`` without those a later training record's step repeats: training at or after that step,
    evaluations after it."""
    out: List[dict] = []
    for record in records:
        step = record.get("step")
        if record.get("kind") == "train" and isinstance(step, int):
            out = [
                r
                for r in out
                if not isinstance(r.get("step"), int)
                or r["step"] < step
                or (r["step"] == step and r.get("kind") == "val")
            ]
        out.append(record)
    return out


def read_new_records(path, offset: int = 0):
    """``(records, offset)``: the whole lines of ``path`` after byte ``offset`` (a file being written), and
    the offset after them."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    whole = data[: data.rfind(b"\n") + 1]
    records = []
    for line in whole.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records, offset + len(whole)


def epoch_position(record: dict) -> float:
    """A training record's place in epochs: its epoch plus the share of that epoch done."""
    total = record.get("samples_per_epoch") or 0
    return record["epoch"] + (record["samples"] / total if total else 0.0)
