"""The training webdataset pipeline: OpenCLIP's, with sample ids, logged skips and fixed seeds.

:func:`get_wds_train_dataset` stands in for ``open_clip_train.data.get_wds_dataset`` when ``is_train``, with
OpenCLIP's own stages, shuffle sizes, epoch rounding and ``WebLoader``, except: batches are ``(images, texts,
ids)``, the ids made in the stage that builds the tuple so they stay aligned through workers and shuffles;
every skip is logged and counted (:class:`DataStats`); the shuffles and the workers' RNGs are seeded from
``(--seed, epoch, rank, worker)`` (OpenCLIP seeds its sample shuffle from the clock), so a run resumed at an
epoch boundary sees the same samples and augmentations; ``--captions-per-image M`` draws M captions an image.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import multiprocessing
import os
import queue
import random
import time
from collections import Counter
from typing import Dict, List, Optional

import numpy as np
import torch
import webdataset as wds
from open_clip_train import data as oc_data
from torch.utils.data import get_worker_info
from webdataset import autodecode
from webdataset.filters import _shuffle
from webdataset.gopen import gopen

from ..data.ids import sample_id
from ..data.shards import TailRecorder, tar_samples
from ..data.skips import SKIP_CAUSES
from ..paths import expand_sources
from .ids import id_layout, source_index
from .signals import worker_ignores_stop_signals

#: Attempts at opening a shard before it is skipped (a network file system may fail transiently).
OPEN_TRIES = 3
#: Seconds before the second attempt; doubled for each further one.
OPEN_RETRY_SECONDS = 0.5
#: Skip causes, in the order of the epoch summary: the names every reader of pairs uses.
CAUSES = SKIP_CAUSES


class TrainingDataError(RuntimeError):
    """The training shards cannot fill an epoch (all unreadable, or too few good samples)."""


_IMAGE_EXTS = ("jpg", "png", "jpeg", "webp")  # the order of OpenCLIP's rename


def mix_seed(*parts: int) -> int:
    """A 63-bit seed from several integers (seed, epoch, rank, worker), without collisions by addition."""
    digest = hashlib.sha256(",".join(str(int(p)) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def _worker_position():
    rank, world_size, worker, num_workers = wds.utils.pytorch_worker_info()
    return rank, worker


def has_caption_and_image(sample, stats: Optional["DataStats"] = None) -> bool:
    """OpenCLIP's ``filter_no_caption_or_no_image``, plus a warning naming the dropped sample; a ``.txt``
    that holds only white space is no caption either (OpenCLIP would train on the empty string)."""
    has_caption = "txt" in sample
    has_image = any(ext in sample for ext in _IMAGE_EXTS)
    if not (has_caption and has_image):
        missing = " and ".join(m for m, ok in (("caption (.txt)", has_caption), ("image", has_image)) if not ok)
        logging.warning(f"Skipping sample {sample.get('__key__')!r} in {sample.get('__url__')}: no {missing}.")
        if stats is not None:
            stats.skipped("no caption" if not has_caption else "no image", sample)
        return False
    text = sample["txt"]
    if not (text.strip() if isinstance(text, (bytes, str)) else text):
        logging.warning(
            f"Skipping sample {sample.get('__key__')!r} in {sample.get('__url__')}: empty caption "
            "(.txt holds no caption)."
        )
        if stats is not None:
            stats.skipped("empty caption", sample)
        return False
    return True


class DataStats:
    """What one dataloader worker read and skipped in the current epoch: each worker's copy sends its counts
    (and, in ``track_epoch``, its ``(id, fingerprint)`` pairs) after every batch; :meth:`collect` merges them."""

    def __init__(self, workers: int, shared_epoch, track_epoch: Optional[int] = None, strict: bool = False):
        self.strict = strict  # --strict: the first skip ends the run, naming the sample
        self.queue = multiprocessing.Queue() if workers > 0 else None
        self.local: List[dict] = []
        self.shared_epoch = shared_epoch
        self.track_epoch = track_epoch
        self.epoch = None
        self._reset()

    def __getstate__(self):
        state = dict(self.__dict__)
        state["local"] = []
        return state

    def _reset(self):
        self.counts: Counter = Counter()
        self.ended_early: Dict[str, str] = {}
        self.unreadable: Dict[str, str] = {}
        self.pairs: List[tuple] = []

    # -- in the worker --------------------------------------------------------------------------
    def begin_pass(self) -> None:
        epoch = self.shared_epoch.get_value()
        if epoch != self.epoch:
            self.epoch = epoch
            self._reset()

    def read(self, n: int = 1) -> None:
        self.counts["read"] += n

    def skipped(self, cause: str, sample: Optional[dict] = None) -> None:
        if self.strict:
            where = f" (sample {sample.get('__key__')!r} in {sample.get('__url__')})" if sample else ""
            raise TrainingDataError(f"--strict: a training sample would be skipped: {cause}{where}")
        self.counts[cause] += 1

    def shard_ended_early(self, url: str, why: str) -> None:
        self.ended_early[url] = why

    def shard_unreadable(self, url: str, why: str) -> None:
        self.unreadable[url] = why

    def tracking(self) -> bool:
        return self.track_epoch is not None and self.epoch == self.track_epoch

    def report(self) -> None:
        rank, world_size, worker, num_workers = wds.utils.pytorch_worker_info()
        item = {
            "worker": (rank, worker),
            "epoch": self.epoch,
            "counts": dict(self.counts),
            "ended_early": dict(self.ended_early),
            "unreadable": dict(self.unreadable),
            "pairs": np.asarray(self.pairs, dtype=np.int64).reshape(-1, 2),
        }
        self.pairs = []
        if self.queue is None:
            self.local.append(item)
        else:
            self.queue.put(item)

    # -- in the main process ------------------------------------------------------------------------
    def _drain(self) -> List[dict]:
        items, self.local = self.local, []
        if self.queue is not None:
            while True:
                try:  # a worker's last report may still be in its queue's feeder thread
                    items.append(self.queue.get(timeout=0.2))
                except queue.Empty:
                    break
        return items

    def collect(self, epoch: int) -> dict:
        """Counts of ``epoch`` summed over the workers, the shards that ended early or could not be
        opened, and the ``(id, fingerprint)`` pairs of the tracked epoch."""
        latest: Dict[tuple, dict] = {}
        pairs = []
        for item in self._drain():
            if item["epoch"] != epoch:
                continue
            latest[item["worker"]] = item
            pairs.append(item["pairs"])
        counts: Counter = Counter()
        ended, unreadable = {}, {}
        for item in latest.values():
            counts.update(item["counts"])
            ended.update(item["ended_early"])
            unreadable.update(item["unreadable"])
        return {
            "counts": counts,
            "ended_early": ended,
            "unreadable": unreadable,
            "pairs": np.concatenate(pairs) if pairs else np.zeros((0, 2), dtype=np.int64),
        }


def summary_line(epoch: int, report: dict) -> str:
    """The epoch's one-line account of the training data (see :class:`DataStats`)."""
    counts = report["counts"]
    skipped = sum(counts[c] for c in CAUSES)
    causes = ", ".join(f"{c} {counts[c]}" for c in CAUSES if counts[c])
    line = f"Training data, epoch {epoch}: {counts['read']} samples read, {skipped} skipped"
    line += f" ({causes})" if causes else ""
    ended, unreadable = report["ended_early"], report["unreadable"]
    line += f"; {len(ended)} shard(s) ended early"
    if ended:
        line += ": " + ", ".join(f"{os.path.basename(u)} ({why})" for u, why in sorted(ended.items()))
    if unreadable:
        line += f"; {len(unreadable)} shard(s) could not be opened: " + ", ".join(
            os.path.basename(u) for u in sorted(unreadable)
        )
    if counts["hashed"]:
        line += f"; {counts['hashed']} sample ids hashed (no numeric key)"
    return line + "."


def id_collisions(pairs: np.ndarray) -> tuple:
    """``(distinct samples, distinct ids)`` among ``(id, fingerprint)`` rows."""
    if not len(pairs):
        return 0, 0
    unique = np.unique(pairs, axis=0)
    return len(np.unique(unique[:, 1])), len(np.unique(unique[:, 0]))


def _open_shards(src, stats: DataStats, num_urls: int):
    """webdataset's ``url_opener`` with retries: a shard that cannot be opened after
    :data:`OPEN_TRIES` attempts is logged, counted and skipped; when every shard of the list
    failed since the last one that opened, :class:`TrainingDataError` ends the epoch."""
    stats.begin_pass()
    failed = set()
    for sample in src:
        url = sample["url"]
        for attempt in range(OPEN_TRIES):
            try:
                stream = gopen(url)
                break
            except Exception as e:  # noqa: BLE001 - any failure to open is the shard's
                error = e
                if attempt + 1 < OPEN_TRIES:
                    time.sleep(OPEN_RETRY_SECONDS * 2**attempt)
        else:
            why = f"{type(error).__name__}: {error}"
            logging.warning(f"Skipping shard {url}: cannot open it after {OPEN_TRIES} tries ({why}).")
            stats.shard_unreadable(url, why)
            failed.add(url)
            if len(failed) >= num_urls:
                raise TrainingDataError(
                    f"none of the {num_urls} training shards can be opened (the last: {url}: {why})"
                )
            continue
        failed.clear()
        yield dict(sample, stream=stream)


def _expand_tars(src, stats: DataStats):
    """Each shard's samples through :func:`clip_dcl.data.shards.tar_samples`, with the shard's account: a sample
    cut by a truncated shard is dropped (and logged as such) rather than passed on without a caption."""
    for source in src:
        url = source["url"]

        def members(key, held, url=url):
            return (dict(fname=name, data=data, __url__=url) for _, name, data in held)

        samples, why, cut = yield from tar_samples(TailRecorder(source["stream"]), url, members)
        if why is not None:
            if cut is not None:
                logging.warning(f"Skipping sample {cut!r} in {url}: shard ended early ({why}).")
                stats.skipped("shard ended early")
            logging.warning(f"Shard {url} ended early after {samples} samples ({why}); the rest of it is lost.")
            stats.shard_ended_early(url, why)


def _group_samples(src, stats: DataStats):
    """OpenCLIP's ``group_by_keys_nothrow``, counting the samples read."""
    for sample in oc_data.group_by_keys_nothrow(src):
        stats.read()
        yield sample


class _Decode:
    """webdataset's ``pilrgb`` decoder; an undecodable sample is logged with its shard and key."""

    def __init__(self, stats: DataStats):
        self.stats = stats
        self.decoder = autodecode.Decoder([autodecode.ImageHandler("pilrgb")])

    def __call__(self, src):
        for sample in src:
            try:
                yield self.decoder(sample)
            except Exception as e:  # noqa: BLE001 - what PIL raises on a bad file varies
                logging.warning(
                    f"Skipping sample {sample.get('__key__')!r} in {sample.get('__url__')}: "
                    f"undecodable image ({type(e).__name__}: {e})."
                )
                self.stats.skipped("undecodable image", sample)


def _every_pass_yields(src, stats: DataStats, batch_size: int):
    """Ends the epoch with :class:`TrainingDataError` when a whole pass over the shards yields no
    batch (``with_epoch`` would otherwise start the pass again for ever); reports the counts."""
    batches = 0
    for batch in src:
        batches += 1
        stats.report()
        yield batch
    if batches == 0:
        stats.report()
        c = stats.counts
        skipped = ", ".join(f"{cause} {c[cause]}" for cause in CAUSES if c[cause]) or "none"
        rank, _, worker, _ = wds.utils.pytorch_worker_info()
        raise TrainingDataError(
            f"a full pass over the training shards (rank {rank}, worker {worker}) yielded no batch of "
            f"{batch_size}: {c['read']} samples read, skipped: {skipped}; "
            f"{len(stats.unreadable)} shard(s) could not be opened, {len(stats.ended_early)} ended "
            "early (see the warnings above); each worker fills whole batches from its own shards: lower "
            "--batch-size or --workers, or check --train-data"
        )


class SeededSampleShuffle(wds.PipelineStage):
    """The sample shuffle buffer, seeded from ``(seed, epoch, rank, worker)``; inside a dataloader worker it
    also seeds ``random``, NumPy and torch every epoch, so that image augmentations follow the same tuple."""

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
            np.random.seed(seed % 2**32)
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
    """Stage adding ``sample["__id__"]``; with ``--decl-rate index`` (``num_samples`` set) it also checks the
    id, places it in its source's range when sources are ``::``-joined, and records ``(id, fingerprint of url
    and key)`` in the tracked epoch."""

    def __init__(self, num_samples, stats: Optional[DataStats] = None, sources=None, block=None):
        self.num_samples, self.stats, self.sources, self.block = num_samples, stats, sources, block

    def __call__(self, src):
        for sample in src:
            if self.num_samples is None:
                sample["__id__"] = torch.tensor(sample_id(sample, None), dtype=torch.long)
                yield sample
                continue
            source = source_index(self.sources, sample.get("__url__")) if self.sources else 0
            block = self.block or self.num_samples
            value, hashed = sample_id(sample, block, with_kind=True)
            # A bad id is logged and passed on: the loss checks the global batch's ids and stops every rank
            # together (raising in one rank's loader would leave the other ranks waiting in a collective).
            if value < 0:
                logging.error(
                    f"sample {sample.get('__key__')!r} in {sample.get('__url__')} has the negative key {value}: "
                    "--decl-rate index needs sample keys >= 0 (the json 'key' of img2dataset shards); fix the "
                    "shards' keys (a larger --decl-num-samples cannot help)"
                )
            elif self.block is not None:
                if value >= block:
                    logging.error(
                        f"sample {sample.get('__key__')!r} in {sample.get('__url__')} has the key {value}, not below "
                        f"the {block} ids of each of the {max(self.sources.values()) + 1} ::-joined sources (source "
                        f"{source} starts at id {source * block}): set --decl-num-samples above the largest key of "
                        "any source"
                    )
                    value = self.num_samples + value  # out of the buffer: the loss stops the run
                else:
                    value += source * block
            if self.stats is not None:
                if hashed:
                    self.stats.skipped("hashed")
                if self.stats.tracking():
                    digest = hashlib.blake2b(
                        f"{sample.get('__url__')}/{sample.get('__key__')}".encode(), digest_size=8
                    ).digest()
                    self.stats.pairs.append((value, int.from_bytes(digest, "big") >> 1))
            sample["__id__"] = torch.tensor(value, dtype=torch.long)
            yield sample


def _resample_seed(seed: int) -> int:
    """Deterministic shard-resampling seed per (seed, rank, worker); ResampledShards2 adds the epoch."""
    rank, worker = _worker_position()
    return mix_seed(seed, rank, worker)


def get_wds_train_dataset(args, preprocess_img, is_train=True, epoch=0, floor=False, tokenizer=None):
    """``open_clip_train.data.get_wds_dataset`` for training (same signature and ``DataInfo``), yielding
    ``(images, texts, ids)`` batches; see the module docstring for the differences."""
    input_shards = args.train_data
    assert input_shards is not None
    all_urls, url_weights = expand_sources(input_shards, args.train_data_upsampling_factors)
    resampled = bool(getattr(args, "dataset_resampled", False))
    num_samples, num_shards = (args.train_num_samples, None)
    if num_samples is None:
        num_samples, num_shards = oc_data.get_dataset_size(all_urls)
        if not num_samples:
            raise RuntimeError(
                "Currently, the number of dataset samples must be specified for the training dataset. "
                "Please specify it via `--train-num-samples` if no dataset length info is present."
            )
    if args.train_data_upsampling_factors is not None and not resampled:
        raise ValueError("--train-data-upsampling-factors is only supported with --dataset-resampled")
    shared_epoch = oc_data.SharedEpoch(epoch=epoch)

    track = getattr(args, "decl_num_samples", None) is not None
    stats = DataStats(
        args.workers, shared_epoch, track_epoch=epoch if track else None, strict=getattr(args, "strict_data", False)
    )
    sources, block = id_layout(input_shards, getattr(args, "decl_id_block", None))
    if resampled:
        pipeline = [
            oc_data.ResampledShards2(
                all_urls,
                weights=url_weights,
                deterministic=True,
                epoch=shared_epoch,
                worker_seed=functools.partial(_resample_seed, args.seed),
            )
        ]
    else:
        pipeline = [
            wds.SimpleShardList(all_urls),
            oc_data.detshuffle2(
                bufsize=oc_data._SHARD_SHUFFLE_SIZE,
                initial=oc_data._SHARD_SHUFFLE_INITIAL,
                seed=args.seed,
                epoch=shared_epoch,
            ),
            wds.split_by_node,
            wds.split_by_worker,
        ]
    m = int(getattr(args, "captions_per_image", 1) or 1)
    stages = [
        # OpenCLIP's tarfile_to_samples_nothrow, with each shard's account
        functools.partial(_open_shards, stats=stats, num_urls=len(all_urls)),
        functools.partial(_expand_tars, stats=stats),
        functools.partial(_group_samples, stats=stats),
        SeededSampleShuffle(oc_data._SAMPLE_SHUFFLE_SIZE, oc_data._SAMPLE_SHUFFLE_INITIAL, args.seed, shared_epoch),
        wds.select(functools.partial(has_caption_and_image, stats=stats)),
        _Decode(stats),
        _AttachId(getattr(args, "decl_num_samples", None), stats, sources if block else None, block),
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
    stages.append(functools.partial(_every_pass_yields, stats=stats, batch_size=args.batch_size))
    pipeline.extend(stages)
    dataset = wds.DataPipeline(*pipeline)

    if not resampled:
        num_shards = num_shards or len(all_urls)
        if num_shards < args.workers * args.world_size:
            raise TrainingDataError(
                f"{num_shards} training shards for {args.workers} workers x {args.world_size} "
                "ranks: the number of shards must be >= workers x ranks (or use "
                "--dataset-resampled)"
            )
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
        dataset,
        batch_size=None,
        shuffle=False,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
        worker_init_fn=worker_ignores_stop_signals,  # the trainer stops on them, after a whole step
    )
    dataloader.num_batches = num_batches
    dataloader.num_samples = num_samples
    dataloader.data_stats = stats
    return oc_data.DataInfo(dataloader=dataloader, shared_epoch=shared_epoch)
