"""What OpenCLIP's training flags tell about the training data, for the losses that size themselves from it
(`DataFacts`; sizes read once, when a loss asks).
"""

from __future__ import annotations

import functools
from typing import Tuple

from clip_dcl.losses.base import DataFacts, DataSizeUnknown

from .ids import num_sources

#: where each kind of training data takes its sample ids from (see DataFacts.sample_ids)
_SAMPLE_IDS = {"webdataset": "keys", "csv": "rows", "synthetic": "indices", "packed": "keys"}


def train_data_kind(oc_args) -> str:
    """``--dataset-type`` with ``auto`` resolved as OpenCLIP's ``get_dataset_fn`` does (``"other"``: no reader)."""
    if oc_args.dataset_type != "auto":
        return oc_args.dataset_type
    kinds = {"tar": "webdataset", "csv": "csv", "tsv": "csv", "npz": "packed"}  # npz: clip_dcl.train.packed
    return kinds.get(oc_args.train_data.split(".")[-1], "other")


def data_facts(oc_args) -> DataFacts:
    """The facts of ``oc_args``'s training data known before it is loaded (``steps_per_epoch`` None)."""
    synthetic = oc_args.dataset_type == "synthetic"
    training = bool(oc_args.train_data) or synthetic
    kind = "synthetic" if synthetic else (train_data_kind(oc_args) if oc_args.train_data else None)
    return DataFacts(
        epochs=oc_args.epochs,
        training=training,
        sample_ids=_SAMPLE_IDS.get(kind),
        description=f"--dataset-type {oc_args.dataset_type!r} with --train-data {oc_args.train_data!r}",
        num_sources=num_sources(oc_args.train_data) if oc_args.train_data and not synthetic else 1,
        sizes=functools.lru_cache(maxsize=None)(functools.partial(_sizes, oc_args, kind)),
    )


def _sizes(oc_args, kind) -> Tuple[int, Tuple[int, ...]]:
    """``(total, per-source sizes)`` of the training data (see `DataFacts.sizes`)."""
    if kind == "synthetic":
        if not oc_args.train_num_samples:
            raise DataSizeUnknown(
                "--dataset-type synthetic makes --train-num-samples samples (their indices are "
                "the sample ids) and --train-num-samples is not set",
                "set --train-num-samples",
            )
        total = int(oc_args.train_num_samples)
    elif kind == "packed":
        from clip_dcl.data.packed import packed_size

        try:
            total = packed_size(oc_args.train_data)
        except (OSError, ValueError, KeyError) as e:
            raise DataSizeUnknown(
                f"the packed training set {oc_args.train_data!r} cannot be read ({e})",
                "write it again with `clip-dcl data pack`",
            ) from None
    elif kind == "csv":  # OpenCLIP's CsvDataset's size: its rows (one column read)
        import pandas as pd

        column = oc_args.csv_caption_key
        try:
            total = len(pd.read_csv(oc_args.train_data, sep=oc_args.csv_separator, usecols=[column]))
        except (OSError, ValueError) as e:
            raise DataSizeUnknown(
                f"--train-data {oc_args.train_data!r}: the CSV's column {column!r} cannot be read ({e})", "fix it"
            ) from None
    if kind in ("synthetic", "packed", "csv"):
        return total, (total,)
    if kind != "webdataset":
        raise DataSizeUnknown(
            f"--dataset-type {oc_args.dataset_type!r} with --train-data {oc_args.train_data!r} "
            "has no size that clip-dcl can read"
        )
    from open_clip_train.data import get_dataset_size

    try:
        total, _ = get_dataset_size(oc_args.train_data)
    except KeyError as e:
        raise DataSizeUnknown(f"sizes.json next to the training shards has no entry for shard {e}", "fix it") from None
    except (OSError, ValueError) as e:
        raise DataSizeUnknown(f"the training shards' sizes.json cannot be read ({e})", "fix it") from None
    if not total:
        raise DataSizeUnknown(f"there is no sizes.json (or __len__) next to the shards of {oc_args.train_data!r}")
    if num_sources(oc_args.train_data) < 2:
        return int(total), (int(total),)
    per_source = []
    for source in oc_args.train_data.split("::"):
        try:
            per_source.append(get_dataset_size(source)[0] or 0)
        except (KeyError, OSError, ValueError):
            per_source.append(0)
    return int(total), tuple(per_source)
