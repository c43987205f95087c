"""Webdataset samples as the evaluation readers take them: the samples of ``.tar`` shards read to
their end (a shard that breaks off is a skip, not an exception), a sample's image and captions,
and the ``IterableDataset`` that turns samples into items for the retrieval and classification
layouts."""
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
    """The captions of one ``.txt``: one per line (CLIP_benchmark's retrieval shards put all
    captions of an image in one file, and its reader splits them with ``splitlines``), stripped,
    blank lines skipped. A one-line file is one caption, as img2dataset writes it."""
    return [line.strip() for line in txt.splitlines() if line.strip()]


def shard_samples(urls: Sequence[str]):
    """The samples of ``urls`` in order, as webdataset groups them (``{"__key__", "__url__", ext: bytes}``),
    and a `Skip` ("shard ended early") for a shard that cannot be read to its end: a read error,
    bytes that are not a tar, or no end-of-archive marker (a tar cut at a member boundary). The
    samples before the break are yielded; one cut by it is dropped (named in the skip's detail)."""
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
    """A webdataset sample's captions (the json ``captions`` list when present and not empty, else
    the ``.txt``, one caption a line), or a `Skip`: no caption, an empty one, or one that is
    not UTF-8 / not valid JSON."""
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
    """An ``IterableDataset`` of ``to_item(sample)`` over webdataset shards, shards in order; each
    DataLoader worker reads whole shards (every ``num_workers``-th, as webdataset's ``split_by_worker``).

    ``to_item`` returns the item or a `Skip`. With ``markers`` the skips are yielded too, for
    the caller to count in its own process (`SkipCounter`, also across workers); without, they
    are logged and left out here (``strict``: raised).
    """

    def __init__(self, shards: Sequence[str], to_item: Callable, markers: bool = False, strict: bool = False):
        self.shards, self.to_item, self.markers, self.strict = list(shards), to_item, markers, strict

    def __iter__(self):
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        urls = self.shards if info is None else self.shards[info.id::info.num_workers]
        counter = None if self.markers else SkipCounter(self.strict)
        for sample in shard_samples(urls):
            item = sample if isinstance(sample, Skip) else self.to_item(sample)
            if isinstance(item, Skip):
                if counter is None:
                    yield item
                else:
                    counter.record(item)
                continue
            yield item
