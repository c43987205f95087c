"""Webdataset samples for the evaluation readers: shards read to their end (a break is a skip, not an exception)."""

from __future__ import annotations

import io
import json
from typing import Callable, Sequence

from torch.utils.data import IterableDataset

from ..shards import TailRecorder
from .skips import Skip, SkipCounter

#: Image keys accepted in a webdataset sample, in the order OpenCLIP's trainer tries them.
WDS_IMAGE_KEYS = ("jpg", "png", "jpeg", "webp")


def split_captions(txt: str) -> list[str]:
    """The captions of one ``.txt``, one per line, blank lines skipped (CLIP_benchmark's layout)."""
    return [line.strip() for line in txt.splitlines() if line.strip()]


def shard_samples(urls: Sequence[str]):
    """The samples of ``urls`` in order, and a `Skip` for a shard that cannot be read to its end (the samples before
    the break are yielded, the one it cut is dropped)."""
    import webdataset as wds
    from webdataset import tariterators

    for url in urls:
        try:
            stream = TailRecorder(open(url, "rb"))
        except OSError as e:
            yield Skip(url, None, "shard ended early", f"cannot open it: {e}")
            continue
        held: dict = {}
        held_key, previous, count, why = None, None, 0, None
        try:
            for f in tariterators.tar_file_iterator(stream, handler=wds.reraise_exception):
                key, ext = tariterators.base_plus_ext(f["fname"])
                if key is None:
                    continue
                if held and key != held_key:
                    count += 1
                    previous = set(held)
                    yield {**held, "__key__": held_key, "__url__": url}
                    held = {}
                held_key = key
                held[ext.lower()] = f["data"]
            while stream.read(1 << 16):  # tarfile stops at the first zero block: read the rest of the marker
                pass
        except Exception as e:  # noqa: BLE001 - whatever tarfile raises, the shard ends here
            why = f"{type(e).__name__}: {str(e).split(' @ ')[0]}"
        finally:
            stream.close()
        if why is None and not stream.complete():
            why = "no end-of-archive marker: truncated"
            if held and set(held) == previous:  # cut at a member boundary after a whole sample
                count += 1
                yield {**held, "__key__": held_key, "__url__": url}
                held = {}
        if why is not None:
            cut = f"; sample {held_key!r} cut short" if held else ""
            yield Skip(url, None, "shard ended early", f"after {count} samples{cut}: {why}")
        elif held:
            yield {**held, "__key__": held_key, "__url__": url}


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
