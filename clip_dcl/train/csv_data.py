"""Training on a CSV of image paths and captions: OpenCLIP's reader, with our skip rules.

A row whose caption is empty (pandas reads it as NaN, which would train as the text "nan") or whose image file
is missing is left out when the data set is built, and counted in one line per cause with an example; an image
that does not decode is found when a loader worker reads it, said in one line, and the next row that decodes
takes its place in the batch (every rank keeps its batch size).
"""

from __future__ import annotations

import logging
import os

import torch
from open_clip_train import data as oc_data

from ..data.skips import row_cause
from .ids import with_indices


def csv_dataset(args, preprocess_fn, is_train, epoch=0, tokenizer=None):
    """OpenCLIP's CSV dataset, its relative image paths read beside the CSV as evaluation reads them, less the
    rows :func:`leave_out_bad_rows` leaves out."""
    info = oc_data.get_csv_dataset(args, preprocess_fn, is_train, epoch=epoch, tokenizer=tokenizer)
    path = args.train_data if is_train else args.val_data
    images_beside(info.dataloader.dataset, path)
    if leave_out_bad_rows(
        info.dataloader.dataset, path, getattr(args, "strict_data", False)
    ):  # fewer rows: the loader's counts follow
        info.dataloader.num_samples = len(info.dataloader.dataset)
        if not is_train:  # a training set's loader is made again (with_indices)
            info.dataloader.num_batches = len(info.dataloader)
    return info


def csv_train_data(args, preprocess_fn, epoch=0, tokenizer=None):
    """:func:`csv_dataset` for training, each batch with its rows as sample ids (:class:`DecodedRows`)."""
    info = csv_dataset(args, preprocess_fn, True, epoch=epoch, tokenizer=tokenizer)
    sampler = info.sampler
    if isinstance(sampler, torch.utils.data.DistributedSampler):  # sized before rows were left out
        sampler = torch.utils.data.DistributedSampler(info.dataloader.dataset)
    return with_indices(info, lambda rows: DecodedRows(rows, args.train_data, args.strict_data), sampler=sampler)


def images_beside(dataset, csv_path: str) -> None:
    """Point a CSV dataset's relative image paths at the CSV's folder where the image is there (where
    ``clip-dcl eval retrieval`` reads them); a path found only from the working folder (OpenCLIP's reading)
    is kept."""
    folder = os.path.dirname(csv_path)
    dataset.images = [
        p if os.path.isabs(str(p)) or not os.path.isfile(os.path.join(folder, str(p))) else os.path.join(folder, str(p))
        for p in dataset.images
    ]


def leave_out_bad_rows(dataset, csv_path: str, strict: bool = False) -> dict:
    """Drop the rows of OpenCLIP's ``CsvDataset`` that `clip_dcl.data.skips.row_cause` leaves out (no image path,
    an empty caption, an image not found); log one line per cause (count and first example) and return
    ``{cause: count}`` (``strict``: `TrainingDataError` at the first)."""
    from .pipeline import TrainingDataError

    folder = os.path.dirname(csv_path)
    keep, left_out = [], {}
    for row, (image, caption) in enumerate(zip(dataset.images, dataset.captions)):
        path = str(image)
        cause = row_cause(image, caption, os.path.isfile)
        if cause is None:
            keep.append(row)
            continue
        if strict:
            raise TrainingDataError(f"--strict: {csv_path} row {row + 1} ({path}) would be left out: {cause}")
        count, example = left_out.get(cause, (0, None))
        left_out[cause] = (count + 1, example or f"row {row + 1}, {path}")
    for cause, (count, example) in left_out.items():
        logging.warning(f"{csv_path}: {count} row(s) left out: {cause} (first: {example})")
    if left_out:
        dataset.images = [dataset.images[i] for i in keep]
        dataset.captions = [dataset.captions[i] for i in keep]
    if not keep:
        raise TrainingDataError(f"{csv_path}: no row has an image and a caption (folder {folder or '.'})")
    return {cause: count for cause, (count, _) in left_out.items()}


class DecodedRows(torch.utils.data.Dataset):
    """A CSV data set whose items carry their row as the sample id; a row whose image does not decode is said
    once and replaced by the next row that does."""

    def __init__(self, base, csv_path: str, strict: bool = False):
        self.base, self.csv_path, self.strict = base, csv_path, strict

    def __len__(self):
        return len(self.base)

    def __getitem__(self, idx):
        for offset in range(len(self.base)):
            row = (idx + offset) % len(self.base)
            try:
                return (*self.base[row], torch.tensor(row, dtype=torch.long))
            except (OSError, ValueError, SyntaxError) as e:  # PIL's errors for a file that is not a whole image
                if self.strict:
                    from .pipeline import TrainingDataError

                    raise TrainingDataError(
                        f"--strict: {self.csv_path} row {row + 1}: undecodable image {self.base.images[row]}"
                    ) from None
                logging.warning(
                    f"{self.csv_path}: skipping row {row + 1}: undecodable image {self.base.images[row]} "
                    f"({type(e).__name__}: {e}); the next row takes its place"
                )
        from .pipeline import TrainingDataError

        raise TrainingDataError(f"{self.csv_path}: no image of the CSV decodes")
