"""Webdataset samples for the evaluation readers: shards read to their end (a break is a skip, not an exception)."""

from __future__ import annotations

import io
import json
from typing import Callable, Sequence

from torch.utils.data import IterableDataset

from ..shards import TailRecorder, tar_samples
from ..skips import Skip, SkipCounter

#: Image keys accepted in a webdataset sample, in the order OpenCLIP's trainer tries them.
WDS_IMAGE_KEYS = ("jpg", "png", "jpeg", "webp")


def split_captions(txt: str) -> list[str]:
    """The captions of one ``.txt``, one per line, blank lines skipped (CLIP_benchmark's layout)."""
    return [line.strip() for line in txt.splitlines() if line.strip()]


def shard_samples(urls: Sequence[str]):
    """The samples of ``urls`` in order, and a `Skip` for a shard that cannot be read to its end (the samples before
    the break are yielded, the one it cut is dropped): :func:`clip_dcl.data.shards.tar_samples`, training's reader."""
    for url in urls:
        try:
            stream = TailRecorder(open(url, "rb"))
        except OSError as e:
            yield Skip(url, None, "shard ended early", f"cannot open it: {e}")
            continue

        def sample(key, held, url=url):
            return [{**{ext.lower(): data for ext, _, data in held}, "__key__": key, "__url__": url}]

        count, why, cut = yield from tar_samples(stream, url, sample)
        if why is not None:
            cut_short = f"; sample {cut!r} cut short" if cut is not None else ""
            yield Skip(url, None, "shard ended early", f"after {count} samples{cut_short}: {why}")


def sample_image(sample: dict, keys: Sequence[str] = WDS_IMAGE_KEYS):
    """The sample's image as an RGB ``PIL.Image``, or a `Skip` (no image, undecodable image)."""
    from PIL import Image

    url, key = sample.get("__url__"), sample.get("__key__")
    ext = next((k for k in keys if k in sample), None)
    if ext is None:
        return Skip(url, key, "no image", f"none of {'/'.join(keys)}")
    try:
        img = Image.open(io.BytesIO(sample[ext]))
        img.load()
        return img.convert("RGB")
    except Exception as e:  # noqa: BLE001 - what PIL raises on a bad file varies
        return Skip(url, key, "undecodable image", f".{ext}: {type(e).__name__}: {e}")


def sample_captions(sample: dict):
    """A sample's captions (the json ``captions`` list, else the ``.txt`` lines), or a `Skip`."""
    url, key = sample.get("__url__"), sample.get("__key__")
    meta = sample.get("json")
    if meta is not None:
        try:
            doc = json.loads(meta.decode("utf-8") if isinstance(meta, bytes) else meta)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            return Skip(url, key, "undecodable caption", f".json: {type(e).__name__}: {e}")
        caps = doc.get("captions") if isinstance(doc, dict) else None
        if caps:
            if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
                return Skip(url, key, "undecodable caption", "json 'captions' must be a list of strings")
            caps = [c.strip() for c in caps if c.strip()]
            return caps or Skip(url, key, "empty caption", "json 'captions' holds only blank strings")
    txt = sample.get("txt")
    if txt is None:
        return Skip(url, key, "no caption", "neither .txt nor json 'captions'")
    try:
        text = txt.decode("utf-8") if isinstance(txt, bytes) else str(txt)
    except UnicodeDecodeError as e:
        return Skip(url, key, "undecodable caption", f".txt is not UTF-8: {e}")
    return split_captions(text) or Skip(url, key, "empty caption", ".txt holds no caption")


class ShardSamples(IterableDataset):
    """``to_item(sample)`` over shards in order, each worker reading whole shards; with ``markers`` skips are
    yielded for the caller to count, without, logged and left out."""

    def __init__(self, shards: Sequence[str], to_item: Callable, markers: bool = False, strict: bool = False):
        self.shards, self.to_item, self.markers, self.strict = list(shards), to_item, markers, strict

    def __iter__(self):
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        urls = self.shards if info is None else self.shards[info.id :: info.num_workers]
        counter = None if self.markers else SkipCounter(self.strict)
        for sample in shard_samples(urls):
            item = sample if isinstance(sample, Skip) else self.to_item(sample)
            if isinstance(item, Skip) and counter is not None:
                counter.record(item)
            else:
                yield item
