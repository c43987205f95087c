"""The benchmark-only ``unbiased`` oracle loss, and ``python -m clip_dcl.train`` with it registered.

**The loss.** The oracle of the DCL paper's Figure 2 (Chuang et al. 2020): InfoNCE whose negatives
exclude the anchor's latent class. With the true labels known, the sampling bias is removed
exactly by dropping same-class negatives::

    loss_i = -l_ii + log( exp(l_ii) + sum_{j : y_j != y_i} exp(l_ij) )

for image and text anchors, averaged. Labels come from a table indexed by the sample ids the
training plugin carries (the synthetic shards store the latent class in each sample's json). Not
part of the package: real data have no labels, which is the point of ``dcl``. Importing this
module registers the loss as ``unbiased`` in ``clip_dcl.losses.LOSSES``.

**The entry point.** Usage (every word but ``--oracle-labels`` goes to :func:`clip_dcl.train.main`
unchanged)::

    python benchmarks/train_oracle.py -- --train-data 'train/{00000..00003}.tar' --loss unbiased \\
        [--oracle-labels train/] ...OpenCLIP and clip-dcl flags...

Registers :class:`UnbiasedOracleLoss` as ``unbiased`` with its label table bound
(``UnbiasedOracleLoss.with_labels``), so that the training plugin builds it like any other loss
and records no tensor in the checkpoints. The table is read from the json ``key``/``label`` of
every ``.tar`` shard in ``--oracle-labels DIR`` (default: the folder of the ``--train-data``
shards). Other losses pass straight through.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import warnings
from pathlib import Path
from typing import List, Optional

import torch
from open_clip.loss import gather_features

from clip_dcl.losses import register_loss
from clip_dcl.losses.base import ContrastiveLoss
from clip_dcl.losses.gather import all_gather_cat, compute_dtype


def label_table(shard_dir) -> torch.Tensor:
    """``labels[key]`` for every sample of the ``.tar`` shards in ``shard_dir`` (json ``key``/``label``)."""
    pairs = []
    for shard in sorted(Path(shard_dir).glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar:
                if member.name.endswith(".json"):
                    meta = json.load(tar.extractfile(member))
                    pairs.append((int(meta["key"]), int(meta["label"])))
    if not pairs:
        raise ValueError(f"no labelled samples found in {shard_dir}")
    table = torch.full((max(k for k, _ in pairs) + 1,), -1, dtype=torch.long)
    for key, label in pairs:
        table[key] = label
    return table


@register_loss("unbiased")
class UnbiasedOracleLoss(ContrastiveLoss):
    """InfoNCE without same-class negatives (needs ``labels`` and ``sample_ids``)."""

    summary = "benchmark-only oracle: InfoNCE without the anchor's latent class among the negatives"

    requires_sample_ids = True
    output_key = "unbiased_loss"

    def __init__(self, labels: torch.Tensor, **dist_kwargs):
        super().__init__(**dist_kwargs)
        self.register_buffer("labels", torch.as_tensor(labels, dtype=torch.long), persistent=False)
        self.num_samples = int(self.labels.numel())

    def compute(self, image_features, text_features, logit_scale, logit_bias, sample_ids):
        if sample_ids is None:
            raise ValueError("the unbiased oracle needs sample_ids= to look up labels")
        if text_features.shape[0] != image_features.shape[0]:
            raise ValueError(
                f"the unbiased oracle takes one caption per image; got {text_features.shape[0]} text rows "
                f"for {image_features.shape[0]} images"
            )
        ids = sample_ids.to(self.labels.device)
        all_ids = all_gather_cat(ids, self.world_size)
        if self.world_size > 1:
            all_img, all_txt = gather_features(
                image_features, text_features, self.local_loss, self.gather_with_grad, self.rank, self.world_size
            )
        else:
            all_img, all_txt = image_features, text_features
        dtype = compute_dtype(image_features)
        local = self.local_loss and self.world_size > 1
        with torch.autocast(image_features.device.type, enabled=False):
            s = logit_scale.to(dtype)
            anchors = (
                [(image_features, all_txt), (text_features, all_img)]
                if local
                else [(all_img, all_txt), (all_txt, all_img)]
            )
            row_ids = ids if local else all_ids
            offset = self.rank * ids.numel() if local else 0
            col_labels = self.labels[all_ids].to(image_features.device)
            row_labels = self.labels[row_ids].to(image_features.device)
            same = row_labels[:, None] == col_labels[None, :]
            cols = torch.arange(row_ids.numel(), device=same.device) + offset
            same[torch.arange(row_ids.numel(), device=same.device), cols] = False  # keep the positive
            total = 0.0
            for a, c in anchors:
                logits = (s * a.to(dtype)) @ c.to(dtype).T
                pos = logits[torch.arange(row_ids.numel()), cols]
                total = total + (torch.logsumexp(logits.masked_fill(same, float("-inf")), 1) - pos).mean()
        dropped = same.float().sum(1).mean() / max(1, same.shape[1] - 1)
        return total / 2, {"same_class_share": dropped}

    @classmethod
    def with_labels(cls, labels: torch.Tensor) -> type:
        """A subclass whose constructor takes only the distributed arguments, ``labels`` bound.

        The training plugin builds a loss from its flags plus OpenCLIP's distributed arguments and
        records the signature's other arguments in each checkpoint's ``loss_args``: with the label
        table bound here there are none, so no tensor ends up in the checkpoint metadata.
        """
        table = torch.as_tensor(labels, dtype=torch.long)

        class BoundUnbiasedOracleLoss(cls):
            def __init__(self, **dist_kwargs):
                super().__init__(table, **dist_kwargs)

        BoundUnbiasedOracleLoss.__name__ = BoundUnbiasedOracleLoss.__qualname__ = cls.__name__
        return BoundUnbiasedOracleLoss


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
    ours.add_argument(
        "--oracle-labels",
        default=None,
        metavar="DIR",
        help="folder of the labelled .tar shards (default: the --train-data folder)",
    )
    args, rest = ours.parse_known_args(argv)
    peek = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    peek.add_argument("--loss", default="clip")
    peek.add_argument("--train-data", default=None)
    seen, _ = peek.parse_known_args(rest)

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
