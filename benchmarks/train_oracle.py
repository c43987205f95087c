"""``python -m clip_dcl.train`` plus the benchmark-only ``--loss unbiased`` oracle.

Usage (every word but ``--oracle-labels`` goes to :func:`clip_dcl.train.main` unchanged)::

    python benchmarks/train_oracle.py -- --train-data 'train/{00000..00003}.tar' --loss unbiased \\
        [--oracle-labels train/] ...OpenCLIP and clip-dcl flags...

Registers :class:`oracle_loss.UnbiasedOracleLoss` as ``unbiased`` with its label table bound
(``UnbiasedOracleLoss.with_labels``), so that the training plugin builds it like any other loss
and records no tensor in the checkpoints. The table is read from the json ``key``/``label`` of
every ``.tar`` shard in ``--oracle-labels DIR`` (default: the folder of the ``--train-data``
shards). Other losses pass straight through.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from oracle_loss import UnbiasedOracleLoss, label_table  # noqa: E402


def shard_folder(train_data: str) -> Path:
    """The one folder holding the shards of an OpenCLIP ``--train-data`` brace pattern."""
    from braceexpand import braceexpand

    shards = [s for part in train_data.split("::") for s in braceexpand(part)]
    folders = {Path(s).parent for s in shards}
    if len(folders) != 1:
        raise ValueError(f"--train-data {train_data!r} spans {len(folders)} folders; pass --oracle-labels DIR")
    return folders.pop()


def main(argv: Optional[List[str]] = None) -> int:
    """Bind the oracle's labels (when ``--loss unbiased``) and run ``clip_dcl.train.main``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    ours = argparse.ArgumentParser(prog="train_oracle.py", add_help=False, allow_abbrev=False)
    ours.add_argument("--oracle-labels", default=None, metavar="DIR",
                      help="folder of the labelled .tar shards (default: the --train-data folder)")
    args, rest = ours.parse_known_args(argv)
    peek = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    peek.add_argument("--loss", default="clip")
    peek.add_argument("--train-data", default=None)
    seen, _ = peek.parse_known_args(rest)

    from clip_dcl.losses import register_loss
    from clip_dcl.train import main as train_main

    if seen.loss == "unbiased":
        folder = args.oracle_labels
        if folder is None:
            if not seen.train_data:
                print("train_oracle.py: error: --loss unbiased needs --train-data or --oracle-labels", file=sys.stderr)
                return 2
            try:
                folder = shard_folder(seen.train_data)
            except ValueError as e:
                print(f"train_oracle.py: error: {e}", file=sys.stderr)
                return 2
        try:
            labels = label_table(folder)
        except (ValueError, KeyError, OSError) as e:
            print(f"train_oracle.py: error: --oracle-labels {folder}: {e}", file=sys.stderr)
            return 2
        if bool((labels < 0).any()):
            # Gaps in the keys are fine as long as no batch holds them; the lookup would give -1.
            print(f"train_oracle.py: {int((labels < 0).sum())} key(s) below the largest have no label", file=sys.stderr)
        with warnings.catch_warnings():  # replacing the unbound oracle with the bound one is the point here
            warnings.simplefilter("ignore")
            register_loss("unbiased")(UnbiasedOracleLoss.with_labels(labels))
    return train_main(rest)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
