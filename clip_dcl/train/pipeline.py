"""The training webdataset pipeline: OpenCLIP's, with sample ids, logged skips and fixed seeds.

:func:`get_wds_train_dataset` stands in for ``open_clip_train.data.get_wds_dataset`` when
``is_train`` is true (validation keeps OpenCLIP's own). It builds the same pipeline from
OpenCLIP's own stages (``ResampledShards2`` / ``SimpleShardList`` + ``detshuffle2``,
``split_by_node``, ``split_by_worker``, ``tarfile_to_samples_nothrow``, the same shuffle buffer
sizes, the same epoch length rounding, the same ``WebLoader``) and differs in four places:

- batches are ``(images, texts, ids)``: ``ids`` is a LongTensor of :func:`clip_dcl.train.ids.sample_id`,
  computed in the same stage that builds the tuple, so it stays aligned with the images and texts
  whatever the number of workers, with ``--dataset-resampled`` and through the shuffle buffer;
- a sample without a caption or without an image is logged (key and shard) before it is dropped
  (OpenCLIP drops it silently); undecodable samples are logged and dropped as in OpenCLIP;
- the sample shuffle buffer and, inside dataloader workers, Python/NumPy/torch RNGs (image
  augmentation) are seeded from ``(--seed, epoch, rank, worker)``, and ``--dataset-resampled``
  draws shards from the same seed; OpenCLIP seeds its sample shuffle from the clock. So a run
  resumed at epoch ``e`` sees the same samples in the same order with the same augmentations as
  an uninterrupted run, which is what lets stateful losses (DeCL's buffers) continue exactly;
- ``--decl-num-samples`` (``args.decl_num_samples``) bounds the hash fallback of the ids;
- with ``--captions-per-image M > 1`` (``args.captions_per_image``) each sample yields M captions
  (:func:`draw_captions`): texts are batched as ``(B * M, context)``, the M captions of each image
  in image order, which is what the model encodes and the loss reads M from; ids stay per image.

The pipeline stages are called from ``open_clip_train.data``; only their assembly is written here.
"""
from __future__ import annotations

import hashlib
import logging
import math
import random

import numpy as np
import torch
import webdataset as wds
from open_clip_train import data as oc_data
from torch.utils.data import get_worker_info
from webdataset.filters import _shuffle

from .ids import sample_id

_IMAGE_EXTS = ("jpg", "png", "jpeg", "webp")  # the order of OpenCLIP's rename


def mix_seed(*parts: int) -> int:
    """A 63-bit seed from several integers (seed, epoch, rank, worker), without collisions by addition."""
    digest = hashlib.sha256(",".join(str(int(p)) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def _worker_position():
    rank, world_size, worker, num_workers = wds.utils.pytorch_worker_info()
    return rank, worker


def has_caption_and_image(sample) -> bool:
    """OpenCLIP's ``filter_no_caption_or_no_image``, plus a warning naming the dropped sample."""
    has_caption = "txt" in sample
    has_image = any(ext in sample for ext in _IMAGE_EXTS)
    if not (has_caption and has_image):
        missing = " and ".join(m for m, ok in (("caption (.txt)", has_caption), ("image", has_image)) if not ok)
        logging.warning(f"Skipping sample {sample.get('__key__')!r} in {sample.get('__url__')}: no {missing}.")
        return False
    return True


class SeededSampleShuffle(wds.PipelineStage):
    """The sample shuffle buffer, seeded from ``(seed, epoch, rank, worker)``.

    Inside a dataloader worker it also seeds ``random``, NumPy and torch at the start of every
    epoch, so that image augmentations are a function of the same tuple (the main process is
    reseeded per epoch by the training loop; see ``clip_dcl.train.patch``).
    """

    def __init__(self, bufsize: int, initial: int, seed: int, epoch: "oc_data.SharedEpoch"):
        self.bufsize = bufsize
        self.initial = initial
        self.seed = seed
        self.epoch = epoch

    def run(self, src):
        rank, worker = _worker_position()
        seed = mix_seed(self.seed, self.epoch.get_value(), rank, worker)
        if get_worker_info() is not None:
            random.seed(seed)
            np.random.seed(seed % 2 ** 32)
            torch.manual_seed(seed)
        return _shuffle(src, self.bufsize, self.initial, random.Random(seed))


def caption_list(sample) -> list:
    """An image's captions: the json ``"captions"`` list when there is one, else the non-empty ``.txt`` lines."""
    meta = sample.get("json")
    if isinstance(meta, dict) and isinstance(meta.get("captions"), list):
        captions = [str(c) for c in meta["captions"] if str(c).strip()]
        if captions:
            return captions
    text = sample.get("txt", "")
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines or [str(text)]


def draw_captions(captions: list, m: int, rng: random.Random) -> list:
    """``m`` of ``captions``: a random draw without repeats when there are at least ``m``; otherwise all
    of them, repeated in order (``[a, b]`` gives ``[a, b, a]`` for ``m = 3``), so an image with fewer
    captions counts some of them twice among its positives."""
    if len(captions) >= m:
        return rng.sample(captions, m)
    return [captions[k % len(captions)] for k in range(m)]


class _DrawCaptions:
    """Map stage replacing ``sample["txt"]`` by a list of M captions, drawn from ``(seed, epoch, sample id)``."""

    def __init__(self, m: int, seed: int, epoch: "oc_data.SharedEpoch"):
        self.m, self.seed, self.epoch = m, seed, epoch

    def __call__(self, sample):
        rng = random.Random(mix_seed(self.seed, self.epoch.get_value(), int(sample["__id__"])))
        sample["txt"] = draw_captions(caption_list(sample), self.m, rng)
        return sample


def _flatten_captions(batch):
    """``(images, texts (B, M, L), ids)`` -> ``(images, texts (B * M, L), ids)``, image order kept."""
    images, texts, ids = batch
    return images, texts.reshape(-1, texts.shape[-1]), ids


class _AttachId:
    """Map stage adding ``sample["__id__"]`` (a picklable callable, for dataloader workers)."""

    def __init__(self, num_samples):
        self.num_samples = num_samples

    def __call__(self, sample):
        sample["__id__"] = torch.tensor(sample_id(sample, self.num_samples), dtype=torch.long)
        return sample


class _ResampleSeed:
    """Deterministic shard-resampling seed per (seed, rank, worker); ResampledShards2 adds the epoch."""

    def __init__(self, seed):
        self.seed = seed

    def __call__(self):
        rank, worker = _worker_position()
        return mix_seed(self.seed, rank, worker)


def get_wds_train_dataset(args, preprocess_img, is_train=True, epoch=0, floor=False, tokenizer=None):
    """``open_clip_train.data.get_wds_dataset`` for training, yielding ``(images, texts, ids)`` batches.

    Same signature and return value (``DataInfo`` whose ``dataloader`` has ``num_batches`` and
    ``num_samples``) as OpenCLIP's; see the module docstring for the differences.
    """
    input_shards = args.train_data
    assert input_shards is not None
    resampled = bool(getattr(args, "dataset_resampled", False))
    num_samples, num_shards = (args.train_num_samples, None)
    if num_samples is None:
        num_samples, num_shards = oc_data.get_dataset_size(input_shards)
        if not num_samples:
            raise RuntimeError(
                "Currently, the number of dataset samples must be specified for the training dataset. "
                "Please specify it via `--train-num-samples` if no dataset length info is present.")
    if args.train_data_upsampling_factors is not None and not resampled:
        raise ValueError("--train-data-upsampling-factors is only supported with --dataset-resampled")
    shared_epoch = oc_data.SharedEpoch(epoch=epoch)

    if resampled:
        pipeline = [oc_data.ResampledShards2(
            input_shards, weights=args.train_data_upsampling_factors, deterministic=True, epoch=shared_epoch,
            worker_seed=_ResampleSeed(args.seed),
        )]
    else:
        pipeline = [
            wds.SimpleShardList(input_shards),
            oc_data.detshuffle2(bufsize=oc_data._SHARD_SHUFFLE_SIZE, initial=oc_data._SHARD_SHUFFLE_INITIAL,
                                seed=args.seed, epoch=shared_epoch),
            wds.split_by_node,
            wds.split_by_worker,
        ]
    m = int(getattr(args, "captions_per_image", 1) or 1)
    stages = [
        oc_data.tarfile_to_samples_nothrow,
        SeededSampleShuffle(oc_data._SAMPLE_SHUFFLE_SIZE, oc_data._SAMPLE_SHUFFLE_INITIAL, args.seed, shared_epoch),
        wds.select(has_caption_and_image),
        wds.decode("pilrgb", handler=oc_data.log_and_continue),
        wds.map(_AttachId(getattr(args, "decl_num_samples", None)), handler=oc_data.log_and_continue),
    ]
    if m > 1:
        stages.append(wds.map(_DrawCaptions(m, args.seed, shared_epoch), handler=oc_data.log_and_continue))
    stages += [
        wds.rename(image=";".join(_IMAGE_EXTS), text="txt"),
        # one caption: (L,) tokens; M captions: (M, L)
        wds.map_dict(image=preprocess_img, text=(lambda text: tokenizer(text)[0]) if m == 1 else tokenizer),
        wds.to_tuple("image", "text", "__id__"),
        wds.batched(args.batch_size, partial=False),
    ]
    if m > 1:
        stages.append(wds.map(_flatten_captions))
    pipeline.extend(stages)
    dataset = wds.DataPipeline(*pipeline)

    if not resampled:
        num_shards = num_shards or len(oc_data.expand_urls(input_shards)[0])
        if num_shards < args.workers * args.world_size:
            raise ValueError(f"{num_shards} training shards for {args.workers} workers x {args.world_size} ranks: "
                             "the number of shards must be >= workers x ranks (or use --dataset-resampled)")
    # As OpenCLIP: every worker yields the same number of full batches, so some samples repeat.
    round_fn = math.floor if floor else math.ceil
    global_batch_size = args.batch_size * args.world_size
    num_batches = round_fn(num_samples / global_batch_size)
    num_workers = max(1, args.workers)
    num_worker_batches = round_fn(num_batches / num_workers)
    num_batches = num_worker_batches * num_workers
    num_samples = num_batches * global_batch_size
    dataset = dataset.with_epoch(num_worker_batches)

    dataloader = wds.WebLoader(
        dataset, batch_size=None, shuffle=False, num_workers=args.workers, persistent_workers=args.workers > 0,
    )
    dataloader.num_batches = num_batches
    dataloader.num_samples = num_samples
    return oc_data.DataInfo(dataloader=dataloader, shared_epoch=shared_epoch)
