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

from ..data.skips import row_cause


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
