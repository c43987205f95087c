"""The demo's training against the demo's training as it was: one epoch of ``clip`` each, in one run.

* ``before``: ``clip-dcl-tiny`` (64 px, 8 px patches, OpenCLIP's 49,408-token BPE, two text layers) on
  the webdataset shards (one loader worker decoding each image and tokenising each caption every
  epoch), PyTorch's default AdamW;
* ``demo``: :data:`clip_dcl.experiment.budgets.DEMO_BUDGET` as ``clip-dcl demo`` trains it: the demo's
  model (16 px patches, the captions' word vocabulary, one text layer) on the training shards packed
  once into memory, fused AdamW.

Both train the same samples (the demo's data, its batch size, learning rate and seed) through
``python -m clip_dcl.train`` in a child process, one after the other, without validation; the time is
the child's wall clock, start-up included, so it is what a user waits for. The report gives each
one's seconds and the ratio ``demo / before`` measured in this run (lower is faster). Times, not
speed measurements, when other work shares the cores: the load average is recorded.

Usage::

    python benchmarks/demo_speed.py                 # the demo's data; writes benchmarks/results/demo_speed.*
    python benchmarks/demo_speed.py --epochs 2
    python benchmarks/demo_speed.py --quick         # the quick demo's data, a temporary report
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from pathlib import Path

from clip_dcl import experiment as ex
from clip_dcl.experiment.budgets import DEMO_BUDGET, DEMO_CLASSES
from clip_dcl.experiment.reporting import Report, add_report_arguments, command_line, report_path

HERE = Path(__file__).resolve().parent
#: the demo's training before it moved to its own model and the packed set
BEFORE = dataclasses.replace(DEMO_BUDGET, model="clip-dcl-tiny", extra=())
#: the trainer's command before its flags (None: ``python -m clip_dcl.train`` with this interpreter)
ENTRY = None


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--epochs", type=int, default=1, help="epochs each setting trains (default 1)")
    p.add_argument("--work", default=None, help="folder for the data and the runs (default: a new temporary one)")
    add_report_arguments(p, "demo_speed", "the quick demo's small data")
    args = p.parse_args(argv)
    if args.epochs < 1:
        p.error(f"--epochs must be >= 1, got {args.epochs}")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="demo_speed_"))
    out = report_path(args.out, HERE / "results" / "demo_speed", args.quick)
    load_start = os.getloadavg()[0]
    shards = ex.synth_data(work / "data", quick=args.quick, num_classes=DEMO_CLASSES)
    packed = ex.packed_training_set(shards)
    run = ex.Run("clip", ("--loss", "clip"))
    rows = []
    for name, budget, data in (("before", BEFORE, shards), ("demo", DEMO_BUDGET, packed)):
        budget = dataclasses.replace(budget, epochs=args.epochs)
        print(
            f"[demo_speed] {name}: {budget.model}, {args.epochs} epoch(s) of {data['train']['num_samples']} "
            f"samples at batch {budget.batch_size}",
            flush=True,
        )
        res = ex.train(
            dataclasses.replace(run, name=f"clip-{name}"),
            data,
            work / "runs",
            budget,
            device="cpu",
            validate=False,
            echo=lambda line: None,
            entry=ENTRY,
        )
        rows.append(
            {
                "setting": name,
                "model": budget.model,
                "train_data": data.get("dataset_type", "webdataset"),
                "extra": list(budget.extra),
                "seconds": res.seconds,
                "command": res.command,
            }
        )
        print(f"[demo_speed]     {res.seconds:.1f} s", flush=True)
    ratio = rows[1]["seconds"] / rows[0]["seconds"]
    report = Report.at(out, command_line("demo_speed.py", argv), work=work)
    doc = {
        "epochs": args.epochs,
        "samples": shards["train"]["num_samples"],
        "batch_size": DEMO_BUDGET.batch_size,
        "rows": rows,
        "ratio": ratio,
        "load_average": {"start": load_start, "end": os.getloadavg()[0]},
        "quick": args.quick,
    }
    lines = [
        "# The demo's training against the demo's training as it was",
        "",
        *report.about(),
        "",
        f"One run of `clip`, {args.epochs} epoch(s) of {doc['samples']} pairs at batch {doc['batch_size']}, "
        f"each setting in turn on the CPU, start-up included (1-minute load average "
        f"{doc['load_average']['start']:.1f} at the start, {doc['load_average']['end']:.1f} at the end).",
        "",
        "| setting | model | training data | extra flags | seconds |",
        "|---|---|---|---|---:|",
    ]
    for r in rows:
        data_kind = "packed in memory" if r["train_data"] == "auto" else "webdataset shards"
        lines.append(
            f"| {r['setting']} | `{r['model']}` | {data_kind} | {' '.join(r['extra']) or '-'} | {r['seconds']:.1f} |"
        )
    lines += ["", f"Ratio demo / before: **{ratio:.2f}** (measured in this run)."]
    report.write(lines, doc)
    print(f"[demo_speed] demo / before = {ratio:.2f}; wrote {report.path('.md')}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
