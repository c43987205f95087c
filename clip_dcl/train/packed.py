"""Training on a packed set (:mod:`clip_dcl.data.packed`) held in memory: batches without a decode.

``--train-data PATH.npz`` gives OpenCLIP's loop a :class:`PackedLoader`: each batch is gathered by index and
OpenCLIP's train transform (``RandomResizedCrop``, bicubic as PIL, then ``Normalize``) applied to the whole
batch by batched matrix products; a transform with any other step is refused (it would silently not be
applied). Batches are ``(images, texts, ids)`` with the webdataset pipeline's ids; order and crops are drawn
from ``(--seed, epoch[, rank])``, so a resumed run sees the same batches.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Optional, Tuple

import torch
from open_clip_train import data as oc_data

from .pipeline import TrainingDataError, mix_seed

#: steps of OpenCLIP's train transform that leave a decoded RGB image as it is (or only make it a tensor)
_PASS_THROUGH = {"MaybeConvertMode", "MaybeToTensor", "ToTensor", "_convert_to_rgb"}


class PackedDataError(TrainingDataError):
    """A packed training set or flags that cannot be trained on as asked."""


def transform_spec(preprocess) -> dict:
    """``{"size", "scale", "ratio", "mean", "std"}`` of OpenCLIP's train transform ``preprocess`` (a
    ``Compose``); :class:`PackedDataError` naming the first step that a batched transform would not apply."""
    steps = getattr(preprocess, "transforms", None)
    if steps is None:
        raise PackedDataError(f"packed training data needs OpenCLIP's train transform (a Compose); got {preprocess!r}")
    spec: dict = {}
    for step in steps:
        name = getattr(step, "__name__", type(step).__name__)
        if name == "RandomResizedCrop":
            size = step.size if isinstance(step.size, (tuple, list)) else (step.size, step.size)
            spec.update(size=tuple(int(s) for s in size), scale=tuple(step.scale), ratio=tuple(step.ratio))
        elif name == "Normalize":
            spec.update(mean=tuple(float(m) for m in step.mean), std=tuple(float(s) for s in step.std))
        elif name not in _PASS_THROUGH:
            raise PackedDataError(
                f"packed training data applies OpenCLIP's random crop and normalisation only; the "
                f"train transform also has {name} (from --aug-cfg): train on the shards instead"
            )
    if "size" not in spec or "mean" not in spec:
        raise PackedDataError(
            f"packed training data needs a RandomResizedCrop and a Normalize in the train "
            f"transform; got {[type(s).__name__ for s in steps]}"
        )
    return spec


def crop_boxes(
    n: int,
    height: int,
    width: int,
    scale: Tuple[float, float],
    ratio: Tuple[float, float],
    generator: torch.Generator,
    tries: int = 10,
) -> torch.Tensor:
    """``(n, 4)`` boxes ``(top, left, h, w)`` drawn as torchvision's ``RandomResizedCrop.get_params`` draws one."""
    area = height * width
    target = area * torch.empty(n, tries).uniform_(scale[0], scale[1], generator=generator)
    log_r = torch.empty(n, tries).uniform_(math.log(ratio[0]), math.log(ratio[1]), generator=generator)
    aspect = torch.exp(log_r)
    w = torch.round(torch.sqrt(target * aspect))
    h = torch.round(torch.sqrt(target / aspect))
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = torch.where(fits.any(1), fits.float().argmax(1), torch.full((n,), -1))
    # the fallback: the central crop at the aspect ratio clamped to ``ratio``
    in_ratio = width / height
    if in_ratio < min(ratio):
        fw, fh = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        fh, fw = height, int(round(height * max(ratio)))
    else:
        fw, fh = width, height
    rows = torch.arange(n)
    pick = first.clamp(min=0)
    bw = torch.where(first >= 0, w[rows, pick], torch.full((n,), float(fw)))
    bh = torch.where(first >= 0, h[rows, pick], torch.full((n,), float(fh)))
    u = torch.rand(n, 2, generator=generator)
    # torch.randint(0, H - h + 1) per sample: floor of a uniform over the H - h + 1 offsets
    top = torch.where(first >= 0, torch.floor(u[:, 0] * (height - bh + 1)), torch.tensor((height - fh) // 2).float())
    left = torch.where(first >= 0, torch.floor(u[:, 1] * (width - bw + 1)), torch.tensor((width - fw) // 2).float())
    return torch.stack([top, left, bh, bw], 1)


def _cubic(x: torch.Tensor, a: float = -0.5) -> torch.Tensor:
    """The bicubic convolution kernel with PIL's ``a = -0.5``."""
    x = x.abs()
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return torch.where(x <= 1, near, torch.where(x < 2, far, torch.zeros_like(x)))


def resize_matrices(start: torch.Tensor, length: torch.Tensor, in_size: int, out_size: int) -> torch.Tensor:
    """``(n, out_size, in_size)`` matrices that resample ``[start, start + length)`` of an axis of
    ``in_size`` pixels to ``out_size``, bicubic as PIL resamples (pixel centres at ``i + 0.5``; the kernel
    widened by the scale when shrinking, taps outside the box dropped, weights renormalised)."""
    scale = length / out_size  # (n,)
    widen = scale.clamp(min=1.0)
    centre = start[:, None] + (torch.arange(out_size) + 0.5) * scale[:, None]  # (n, S)
    taps = 2 * int(math.ceil(2 * float(widen.max()))) + 1
    first = torch.floor(centre - 2 * widen[:, None])
    x = first[..., None] + torch.arange(taps)  # (n, S, T) source pixels
    w = _cubic((x + 0.5 - centre[..., None]) / widen[:, None, None])
    # PIL crops first: taps outside the box (not only outside the image) are dropped
    w = w * ((x >= start[:, None, None]) & (x < (start + length)[:, None, None]))
    w = w / w.sum(-1, keepdim=True)
    out = torch.zeros(len(start), out_size, in_size)
    return out.scatter_add_(2, x.clamp(0, in_size - 1).long(), w)


def resized_crops(images: torch.Tensor, boxes: torch.Tensor, size: Tuple[int, int]) -> torch.Tensor:
    """Each image ``(n, C, H, W)`` (float in [0, 1]) cropped to its box ``(top, left, h, w)`` and resized to
    ``size``, bicubic as PIL does it: one resampling matrix per axis and image (PIL's resize is separable)."""
    _, _, height, width = images.shape
    top, left, h, w = boxes.unbind(1)
    rows = resize_matrices(top, h, height, size[0])  # (n, S0, H)
    cols = resize_matrices(left, w, width, size[1])  # (n, S1, W)
    # PIL resamples the width first and stores that pass in 8 bits: clipped and rounded, which at the sharp
    # edges of the synthetic shapes differs from an unrounded pass by up to a tenth of the range
    across = (images @ cols.transpose(1, 2)[:, None]).mul_(255).round_().clamp_(0, 255).div_(255)
    return (rows[:, None] @ across).clamp_(0, 1)  # (n, C, S0, S1)


class PackedLoader:
    """The training batches of a packed set, one epoch an iteration (see the module docstring)."""

    def __init__(
        self,
        images: torch.Tensor,
        tokens: torch.Tensor,
        ids: torch.Tensor,
        batch_size: int,
        *,
        rank: int,
        world_size: int,
        seed: int,
        shared_epoch,
        spec: dict,
    ):
        self.images, self.tokens, self.ids = images, tokens, ids  # (N, 3, H, W) uint8, (N, L), (N,)
        self.batch_size, self.rank, self.world_size, self.seed = batch_size, rank, world_size, seed
        self.shared_epoch, self.spec = shared_epoch, spec
        global_batch = batch_size * world_size
        self.num_batches = len(ids) // global_batch
        self.num_samples = self.num_batches * global_batch
        self.mean = torch.tensor(spec["mean"]).view(1, -1, 1, 1)
        self.std = torch.tensor(spec["std"]).view(1, -1, 1, 1)

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self):
        epoch = self.shared_epoch.get_value()
        order = torch.randperm(len(self.ids), generator=torch.Generator().manual_seed(mix_seed(self.seed, epoch)))
        crops = torch.Generator().manual_seed(mix_seed(self.seed, epoch, self.rank, 1))
        b, global_batch = self.batch_size, self.batch_size * self.world_size
        _, _, height, width = self.images.shape
        for k in range(self.num_batches):
            idx = order[k * global_batch + self.rank * b : k * global_batch + (self.rank + 1) * b]
            boxes = crop_boxes(b, height, width, self.spec["scale"], self.spec["ratio"], crops)
            x = resized_crops(self.images[idx].float().div_(255), boxes, self.spec["size"])
            yield (x - self.mean) / self.std, self.tokens[idx], self.ids[idx]


def check_flags(args) -> None:
    """Refuse the flags a packed training set cannot honour (called before any work)."""
    if int(getattr(args, "captions_per_image", 1) or 1) > 1:
        raise PackedDataError(
            f"--captions-per-image {args.captions_per_image}: a packed training set holds one "
            "caption a sample; train on the shards to draw several"
        )
    if getattr(args, "dataset_resampled", False) or getattr(args, "train_data_upsampling_factors", None):
        raise PackedDataError(
            "--dataset-resampled and --train-data-upsampling-factors draw shards; a packed "
            "training set is read whole every epoch: drop them, or train on the shards"
        )


def get_packed_train_dataset(args, preprocess_img, epoch: int = 0, tokenizer=None) -> "oc_data.DataInfo":
    """OpenCLIP's ``DataInfo`` over the packed set ``args.train_data`` (see the module docstring)."""
    from clip_dcl.data.packed import load_packed

    check_flags(args)
    spec = transform_spec(preprocess_img)
    t0 = time.perf_counter()
    arrays = load_packed(args.train_data)
    images = torch.from_numpy(arrays["images"]).permute(0, 3, 1, 2).contiguous()
    captions = [str(c) for c in arrays["captions"]]
    tokens = torch.cat([tokenizer(captions[i : i + 4096]) for i in range(0, len(captions), 4096)])
    ids = torch.from_numpy(arrays["ids"]).long()
    if args.train_num_samples is not None and int(args.train_num_samples) != len(ids):
        logging.warning(
            f"--train-num-samples {args.train_num_samples}: the packed set {args.train_data} holds "
            f"{len(ids)} samples, and each epoch reads all of them"
        )
    if len(ids) < args.batch_size * args.world_size:
        raise PackedDataError(
            f"the packed set {args.train_data} holds {len(ids)} samples, fewer than one global "
            f"batch ({args.batch_size} x {args.world_size} ranks)"
        )
    shared_epoch = oc_data.SharedEpoch(epoch=epoch)
    loader = PackedLoader(
        images,
        tokens,
        ids,
        args.batch_size,
        rank=args.rank,
        world_size=args.world_size,
        seed=args.seed,
        shared_epoch=shared_epoch,
        spec=spec,
    )
    logging.info(
        f"Packed training set {args.train_data}: {len(ids)} samples of {tuple(images.shape[1:])} in memory, "
        f"captions tokenised in {time.perf_counter() - t0:.1f} s; {loader.num_batches} batches an epoch"
    )
    return oc_data.DataInfo(dataloader=loader, shared_epoch=shared_epoch)


def is_packed(path: Optional[str]) -> bool:
    """Whether ``--train-data`` names a packed set (``.npz``), which ``--dataset-type auto`` routes here."""
    return bool(path) and str(path).endswith(".npz")
