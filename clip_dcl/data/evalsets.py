"""Readers for the evaluation data sets: retrieval pairs, ImageFolder trees, ELEVATER index files.

Three layouts are read here, each checked in full (every referenced file or zip member exists,
every label parses) before any image is decoded, so that a bad path fails in seconds with its
name in the message rather than an hour into an embedding loop:

* **Retrieval pairs.** Webdataset ``.tar`` shards in the Conceptual Captions layout that
  img2dataset writes (``{key}.jpg|png|jpeg|webp``, ``{key}.txt``, ``{key}.json``; the json's
  ``"captions"`` list, when present, holds every caption of the image), or a CSV/TSV of image
  path and caption with one row per (image, caption) pair, several rows per image allowed.
* **ImageFolder trees** (``ROOT/<class>/<image>``), read with torchvision's folder scanner.
* **ELEVATER "iris" index files**: ``<image_path> <label ids, comma separated>`` per line (split
  on the last space, as ``IrisManifestAdaptor`` does), where ``image_path`` is relative to the
  data set folder or ``<zipname>@<path inside the zip>``; images are read in place from the zip
  (``zipfile``), never extracted. A few-shot data set is
  ``ROOT/<name>/{labels.txt,train.txt,test.txt}`` (+ zips), a COCO-style
  ``ROOT/<name>/{train.json,test.json}`` (the index format of three ELEVATER sets), or an
  ImageFolder pair ``ROOT/<name>/{train,test}/<class>/<image>``.

open_clip (ImageNet names), torchvision (folder scanning) and webdataset are imported where used.
"""
from __future__ import annotations

import csv
import glob
import io
import json
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from torch.utils.data import Dataset, IterableDataset

from .shards import TailRecorder

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
#: Image keys accepted in a webdataset sample, in the order OpenCLIP's trainer tries them.
WDS_IMAGE_KEYS = ("jpg", "png", "jpeg", "webp")
_SYNSET = re.compile(r"^n\d{8}$")


# ----------------------------------------------------------------------------------------------
# Plain text files
# ----------------------------------------------------------------------------------------------
def read_lines(path: str | os.PathLike, what: str = "file") -> list[str]:
    """Non-empty, stripped lines of a UTF-8 text file; ``ValueError`` naming it if missing or empty."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{what} {str(path)!r} does not exist")
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    lines = [ln for ln in lines if ln]
    if not lines:
        raise ValueError(f"{what} {str(path)!r} is empty")
    return lines


def read_classnames(path: str | os.PathLike) -> list[str]:
    """One class name per line (line i = label i)."""
    return read_lines(path, "class-name file")


def read_templates(path: str | os.PathLike) -> list[str] | dict[str, list[str]]:
    """Prompt templates from a file.

    * text (CLIP_benchmark's ``zeroshot_classification_templates.txt``, our ``templates.txt``):
      one template per line, with ``{c}`` (or ``{}``) where the class name goes; blank lines skipped;
    * ``.json``: a list of such templates, or a CuPL-style object ``{"class name": [prompts]}``.

    Text templates come back with ``{}`` as the placeholder; a template without one raises
    ``ValueError`` naming the file and line.
    """
    path = Path(path)
    if path.suffix.lower() == ".json":
        if not path.is_file():
            raise ValueError(f"template file {str(path)!r} does not exist")
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"template file {str(path)!r} is not valid JSON: {e}") from e
        if isinstance(doc, dict):
            bad = [k for k, v in doc.items() if not isinstance(v, list) or not v
                   or not all(isinstance(p, str) and p.strip() for p in v)]
            if not doc or bad:
                raise ValueError(f"template file {str(path)!r}: per-class prompts must map each class name to a "
                                 f"non-empty list of strings; bad entries: {bad[:5]}")
            return {k: [p.strip() for p in v] for k, v in doc.items()}
        if not isinstance(doc, list) or not all(isinstance(t, str) for t in doc):
            raise ValueError(f"template file {str(path)!r} must hold a list of templates or an object "
                             f"class name -> list of prompts")
        lines = [t.strip() for t in doc if t.strip()]
        if not lines:
            raise ValueError(f"template file {str(path)!r} is empty")
    else:
        lines = read_lines(path, "template file")
    out = []
    for i, line in enumerate(lines, 1):
        t = line.replace("{c}", "{}")
        if "{}" not in t:
            raise ValueError(f"template file {str(path)!r} line {i}: {line!r} has no '{{c}}' placeholder")
        out.append(t)
    return out


# ----------------------------------------------------------------------------------------------
# Image access: plain files and members of uncompressed zips, read in place
# ----------------------------------------------------------------------------------------------
def split_zip_ref(ref: str) -> tuple[str, str] | None:
    """``'train.zip@a/b.png'`` -> ``('train.zip', 'a/b.png')``; ``None`` for a plain path."""
    if "@" not in ref:
        return None
    zip_part, member = ref.split("@", 1)
    if not zip_part.lower().endswith(".zip"):
        return None
    return zip_part, member


class ImageSource:
    """Opens images given as paths relative to ``base_dir`` or as ``zipname@member`` references.

    Zip handles are opened lazily and cached per process (the cache is dropped after a fork, so
    DataLoader workers never share a file offset with their parent).
    """

    def __init__(self, base_dir: str | os.PathLike):
        self.base_dir = Path(base_dir)
        self._zips: dict[str, zipfile.ZipFile] = {}
        self._pid = os.getpid()

    def __getstate__(self):
        return {"base_dir": self.base_dir}

    def __setstate__(self, state):
        self.__init__(state["base_dir"])

    def _zip(self, name: str) -> zipfile.ZipFile:
        if os.getpid() != self._pid:
            self._zips, self._pid = {}, os.getpid()
        zf = self._zips.get(name)
        if zf is None:
            zf = self._zips[name] = zipfile.ZipFile(self.base_dir / name)
        return zf

    def open(self, ref: str):
        """The image as an RGB ``PIL.Image``."""
        from PIL import Image

        parts = split_zip_ref(ref)
        if parts is None:
            with open(self.base_dir / ref, "rb") as f:
                data = f.read()
        else:
            data = self._zip(parts[0]).read(parts[1])
        img = Image.open(io.BytesIO(data))
        return img.convert("RGB")

    def check(self, refs: Sequence[str], what: str) -> None:
        """Raise ``ValueError`` naming the first reference in ``refs`` that cannot be found."""
        members: dict[str, set] = {}
        for ref in refs:
            parts = split_zip_ref(ref)
            if parts is None:
                if not (self.base_dir / ref).is_file():
                    raise ValueError(f"{what}: image {str(self.base_dir / ref)!r} does not exist")
                continue
            zname, member = parts
            if zname not in members:
                zpath = self.base_dir / zname
                if not zpath.is_file():
                    raise ValueError(f"{what}: zip file {str(zpath)!r} does not exist (referenced as {ref!r})")
                try:
                    with zipfile.ZipFile(zpath) as zf:
                        members[zname] = set(zf.namelist())
                except zipfile.BadZipFile as e:
                    raise ValueError(f"{what}: {str(zpath)!r} is not a valid zip file: {e}") from e
            if member not in members[zname]:
                raise ValueError(f"{what}: {member!r} is not in zip file {str(self.base_dir / zname)!r}")


class ImageListDataset(Dataset):
    """``dataset[i] -> (transform(image_i), i)`` over a list of image references.

    With ``markers``, an image that does not decode gives ``(Skip, i)`` (cause "undecodable image",
    ``where`` as its url, the reference as its key) instead of raising.
    """

    def __init__(self, refs: Sequence[str], source: ImageSource, transform: Callable, markers: bool = False,
                 where: str | None = None):
        self.refs = list(refs)
        self.source = source
        self.transform = transform
        self.markers = markers
        self.where = where or str(source.base_dir)

    def __len__(self) -> int:
        return len(self.refs)

    def __getitem__(self, i: int):
        if not self.markers:
            return self.transform(self.source.open(self.refs[i])), i
        try:
            image = self.source.open(self.refs[i])
        except Exception as e:  # noqa: BLE001 - what PIL (or a zip member) raises on a bad file varies
            return Skip(self.where, self.refs[i], "undecodable image", f"{type(e).__name__}: {e}"), i
        return self.transform(image), i


# ----------------------------------------------------------------------------------------------
# Retrieval pairs
# ----------------------------------------------------------------------------------------------
@dataclass
class RetrievalCSV:
    """Images and their captions read from a CSV: ``images[i]`` has ``captions[i]`` (>= 1)."""

    images: list[str]
    captions: list[list[str]]
    source: ImageSource


_CSV_IMAGE_KEYS = ("filepath", "image", "image_path", "img", "path", "file", "filename")
_CSV_CAPTION_KEYS = ("title", "caption", "text", "captions")


def read_retrieval_csv(
    path: str | os.PathLike,
    img_key: str | None = None,
    caption_key: str | None = None,
    sep: str | None = None,
) -> RetrievalCSV:
    """Read a CSV/TSV of (image path, caption) rows, grouping rows of the same image.

    The separator defaults to a tab for ``.tsv`` and to a comma otherwise; column names default to
    the first of ``filepath|image|image_path|img|path|file|filename`` and
    ``title|caption|text|captions`` present in the header (OpenCLIP's trainer calls them
    ``filepath``/``title``). Image paths are relative to the CSV's folder unless absolute. Image
    order is the order of first appearance.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"retrieval CSV {str(path)!r} does not exist")
    if sep is None:
        sep = "\t" if path.suffix.lower() == ".tsv" else ","
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f, delimiter=sep)
        header = reader.fieldnames or []

        def pick(given, candidates, what):
            if given is not None:
                if given not in header:
                    raise ValueError(f"retrieval CSV {str(path)!r} has no column {given!r} (columns: {header})")
                return given
            for c in candidates:
                if c in header:
                    return c
            raise ValueError(
                f"retrieval CSV {str(path)!r}: no {what} column among {header}; name it with one of "
                f"{list(candidates)} or pass it explicitly"
            )

        ik = pick(img_key, _CSV_IMAGE_KEYS, "image")
        ck = pick(caption_key, _CSV_CAPTION_KEYS, "caption")
        index: dict[str, int] = {}
        images: list[str] = []
        captions: list[list[str]] = []
        for lineno, row in enumerate(reader, 2):
            img, cap = row.get(ik), row.get(ck)
            if not img or cap is None or not cap.strip():
                raise ValueError(f"retrieval CSV {str(path)!r} line {lineno}: empty image path or caption")
            if img not in index:
                index[img] = len(images)
                images.append(img)
                captions.append([])
            captions[index[img]].append(cap.strip())
    if not images:
        raise ValueError(f"retrieval CSV {str(path)!r} has no rows")
    source = ImageSource(path.parent)
    source.check(images, f"retrieval CSV {str(path)!r}")
    return RetrievalCSV(images=images, captions=captions, source=source)


def expand_shards(data: str | os.PathLike | Sequence[str]) -> list[str]:
    """Shard paths from a folder (its ``*.tar``, sorted; or, in CLIP_benchmark's layout, the
    ``test`` split's ``0..n-1.tar``), a brace pattern, ``::``-joined patterns, a single ``.tar``
    or a list of those; ``ValueError`` naming a missing shard."""
    if isinstance(data, (list, tuple)):
        out = []
        for d in data:
            out.extend(expand_shards(d))
        return out
    data = str(data)
    if os.path.isdir(data):
        if benchmark_layout_root(data) is not None:
            return read_benchmark_shards(data).shards
        shards = sorted(glob.glob(os.path.join(data, "*.tar")))
        if not shards:
            raise ValueError(f"shard folder {data!r} is in neither layout: no .tar shards (img2dataset's "
                             f"layout) and no test/nshards.txt (CLIP_benchmark's webdataset layout); found "
                             f"{describe_folder(data)}")
        return shards
    import braceexpand

    shards = []
    for part in data.split("::"):
        shards.extend(braceexpand.braceexpand(part))
    for s in shards:
        if not os.path.isfile(s):
            raise ValueError(f"shard {s!r} does not exist")
    return shards


def split_captions(txt: str) -> list[str]:
    """The captions of one ``.txt``: one per line (CLIP_benchmark's retrieval shards put all
    captions of an image in one file, and its reader splits them with ``splitlines``), stripped,
    blank lines skipped. A one-line file is one caption, as img2dataset writes it."""
    return [line.strip() for line in txt.splitlines() if line.strip()]


# ----------------------------------------------------------------------------------------------
# Skipped samples: what the readers leave out, why, and the count of each cause
# ----------------------------------------------------------------------------------------------
#: Why an evaluation sample (or a shard's rest) is left out, in the order the counts are listed.
SKIP_CAUSES = ("no caption", "empty caption", "undecodable caption", "no image", "undecodable image", "no label",
               "undecodable label", "shard ended early")


@dataclass(frozen=True)
class Skip:
    """A sample left out (``key`` None: the rest of a shard), where it was and why."""

    url: str
    key: str | None
    cause: str
    detail: str = ""

    def describe(self) -> str:
        where = f"sample {self.key!r} in {self.url}" if self.key is not None else f"shard {self.url}"
        return f"{where}: {self.cause}" + (f" ({self.detail})" if self.detail else "")


class SampleSkipped(ValueError):
    """``--strict``: a sample the evaluation would otherwise skip; the message names it and the cause."""


class SkipCounter:
    """Counts skips by cause, logging each one with its shard, key and cause; with ``strict``, the
    first one raises :class:`SampleSkipped` instead."""

    def __init__(self, strict: bool = False):
        import collections

        self.strict = strict
        self.counts: collections.Counter = collections.Counter()

    def record(self, skip: Skip) -> None:
        if self.strict:
            raise SampleSkipped(f"{skip.describe()} (--strict: without it, the sample would be skipped and counted)")
        import logging

        self.counts[skip.cause] += 1
        logging.getLogger(__name__).warning("skipping %s", skip.describe())

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict[str, int]:
        """``{cause: count}`` of the causes met (empty when nothing was skipped)."""
        order = list(SKIP_CAUSES) + sorted(c for c in self.counts if c not in SKIP_CAUSES)
        return {c: int(self.counts[c]) for c in order if self.counts[c]}

    def summary(self) -> str:
        return f"{self.total} skipped" + (
            f" ({', '.join(f'{c} {n}' for c, n in self.as_dict().items())})" if self.total else "")


def shard_samples(urls: Sequence[str]):
    """The samples of ``urls`` in order, as webdataset groups them (``{"__key__", "__url__", ext: bytes}``),
    and a :class:`Skip` ("shard ended early") for a shard that cannot be read to its end: a read error,
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
    """The sample's image as an RGB ``PIL.Image``, or a :class:`Skip` (no image, undecodable image)."""
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
    the ``.txt``, one caption a line), or a :class:`Skip`: no caption, an empty one, or one that is
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


def _sample_captions(sample: dict) -> list[str]:
    """:func:`sample_captions`, raising ``ValueError`` naming the sample instead of returning a skip."""
    caps = sample_captions(sample)
    if isinstance(caps, Skip):
        raise ValueError(caps.describe())
    return caps


class ShardSamples(IterableDataset):
    """An ``IterableDataset`` of ``to_item(sample)`` over webdataset shards, shards in order; each
    DataLoader worker reads whole shards (every ``num_workers``-th, as webdataset's ``split_by_worker``).

    ``to_item`` returns the item or a :class:`Skip`. With ``markers`` the skips are yielded too, for
    the caller to count in its own process (:class:`SkipCounter`, also across workers); without, they
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


def _retrieval_item(transform: Callable, sample: dict):
    caps = sample_captions(sample)
    if isinstance(caps, Skip):
        return caps
    img = sample_image(sample)
    if isinstance(img, Skip):
        return img
    return transform(img), caps, sample["__key__"]


def retrieval_wds(shards: Sequence[str], transform: Callable, markers: bool = False, strict: bool = False):
    """Dataset yielding ``(transform(image), captions, key)`` per sample, shards in order.

    A sample without a caption or an image, with an empty caption, a caption that is not UTF-8 (or
    json that does not parse), or an image that does not decode, and the rest of a shard that ends
    early, is a :class:`Skip` (see :class:`ShardSamples` for ``markers`` and ``strict``). Every
    sample carries its own captions, so the interleaving of workers does not matter.
    """
    import functools

    return ShardSamples(shards, functools.partial(_retrieval_item, transform), markers, strict)


# ----------------------------------------------------------------------------------------------
# CLIP_benchmark's webdataset layout
# ----------------------------------------------------------------------------------------------
#: Image keys CLIP_benchmark's webdataset reader accepts, in its order.
BENCHMARK_IMAGE_KEYS = ("webp", "png", "jpg", "jpeg")
BENCHMARK_TYPES = ("classification", "retrieval", "multilabel")


@dataclass
class BenchmarkShards:
    """A data set in CLIP_benchmark's webdataset layout (what ``clip_benchmark_export_wds`` writes)::

        ROOT/dataset_type.txt                       retrieval | multilabel (absent: classification)
        ROOT/classnames.txt                         one class name per line (classification)
        ROOT/zeroshot_classification_templates.txt  one template per line, {c} for the name
        ROOT/<split>/nshards.txt                    the shard count n
        ROOT/<split>/0.tar ... (n-1).tar            samples: image + .txt (captions, one per line),
                                                    .cls (label id) or .npy (multi-hot labels)
    """

    root: Path
    split: str
    shards: list[str]
    dataset_type: str
    classnames: list[str] | None
    templates: list[str] | None


def benchmark_layout_root(path: str | os.PathLike, split: str = "test") -> tuple[Path, str] | None:
    """``(root, split)`` when ``path`` is a CLIP_benchmark data set root (``path/split/nshards.txt``)
    or one of its split folders (``path/nshards.txt``); ``None`` otherwise."""
    path = Path(path)
    if (path / split / "nshards.txt").is_file():
        return path, split
    if (path / "nshards.txt").is_file():
        return path.parent, path.name
    return None


def describe_folder(path: str | os.PathLike, limit: int = 8) -> str:
    """A short listing of a folder's entries for error messages."""
    path = Path(path)
    if not path.exists():
        return "nothing (it does not exist)"
    if not path.is_dir():
        return "a file, not a folder"
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
    if not names:
        return "an empty folder"
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def read_benchmark_shards(path: str | os.PathLike, split: str = "test") -> BenchmarkShards:
    """Read the metadata of a CLIP_benchmark webdataset data set (see :class:`BenchmarkShards`).

    ``path`` is the data set root or its split folder. Every shard ``0..n-1`` must exist;
    ``ValueError`` names what is missing or malformed.
    """
    found = benchmark_layout_root(path, split)
    if found is None:
        raise ValueError(f"{str(path)!r} is not in CLIP_benchmark's webdataset layout (no {split}/nshards.txt); "
                         f"found {describe_folder(path)}")
    root, split = found
    nfile = root / split / "nshards.txt"
    try:
        n = int(nfile.read_text().strip())
    except ValueError:
        raise ValueError(f"{str(nfile)!r} must hold the shard count, got {nfile.read_text().strip()[:40]!r}") from None
    if n < 1:
        raise ValueError(f"{str(nfile)!r} says {n} shards")
    shards = [str(root / split / f"{i}.tar") for i in range(n)]
    missing = [s for s in shards if not os.path.isfile(s)]
    if missing:
        raise ValueError(f"{str(nfile)!r} says {n} shards but {missing[0]!r} does not exist")
    dataset_type = "classification"
    if (root / "dataset_type.txt").is_file():
        dataset_type = (root / "dataset_type.txt").read_text().strip().lower()
        if dataset_type not in BENCHMARK_TYPES:
            raise ValueError(f"{str(root / 'dataset_type.txt')!r} says {dataset_type!r}; expected one of "
                             f"{list(BENCHMARK_TYPES)}")
    classnames = read_classnames(root / "classnames.txt") if (root / "classnames.txt").is_file() else None
    tfile = root / "zeroshot_classification_templates.txt"
    templates = read_templates(tfile) if tfile.is_file() else None
    return BenchmarkShards(root=root, split=split, shards=shards, dataset_type=dataset_type,
                           classnames=classnames, templates=templates)


def _classification_item(transform: Callable, multilabel: bool, sample: dict):
    import numpy as np
    import torch

    url, key = sample.get("__url__"), sample.get("__key__")
    ext = "npy" if multilabel else "cls"
    if ext not in sample:
        return Skip(url, key, "no label", f"no .{ext}")
    try:
        if multilabel:
            label = torch.as_tensor(np.load(io.BytesIO(sample[ext]), allow_pickle=False), dtype=torch.float32)
        else:
            label = int(sample[ext].decode("utf-8").strip())
    except (ValueError, UnicodeDecodeError, OSError, EOFError) as e:
        return Skip(url, key, "undecodable label", f".{ext}: {type(e).__name__}: {e}")
    img = sample_image(sample, BENCHMARK_IMAGE_KEYS)
    if isinstance(img, Skip):
        return img
    return transform(img), label


def classification_wds(shards: Sequence[str], transform: Callable, multilabel: bool = False, markers: bool = False,
                       strict: bool = False):
    """Dataset yielding ``(transform(image), label)`` per sample, shards in order: ``label`` an
    ``int`` from ``.cls``, or with ``multilabel`` a float multi-hot vector from ``.npy``
    (CLIP_benchmark's classification and multilabel shards). A sample without an image or a label,
    or whose image or label does not decode, and the rest of a shard that ends early, is a
    :class:`Skip` (see :class:`ShardSamples` for ``markers`` and ``strict``)."""
    import functools

    return ShardSamples(shards, functools.partial(_classification_item, transform, multilabel), markers, strict)


# ----------------------------------------------------------------------------------------------
# ImageFolder trees (zero-shot, few-shot)
# ----------------------------------------------------------------------------------------------
def scan_image_folder(root: str | os.PathLike, class_to_idx: dict[str, int] | None = None,
                      allow_empty: bool = False) -> tuple[list[str], list[tuple[str, int]]]:
    """(sorted class folders, [(absolute image path, label)]) of ``root/<class>/<image>``.

    Image files are those with an extension in :data:`IMAGE_EXTENSIONS`; a class folder without
    any raises ``ValueError`` unless ``allow_empty``.

    With ``class_to_idx`` given (a test split scanned with the train split's classes), folders
    of unknown classes raise ``ValueError``.
    """
    from torchvision.datasets.folder import find_classes, make_dataset

    root = Path(root).absolute()
    if not root.is_dir():
        raise ValueError(f"image folder {str(root)!r} does not exist")
    try:
        classes, found = find_classes(root)
    except FileNotFoundError as e:
        raise ValueError(f"image folder {str(root)!r}: {e}") from e
    if class_to_idx is None:
        class_to_idx = found
    else:
        unknown = sorted(set(classes) - set(class_to_idx))
        if unknown:
            raise ValueError(f"image folder {str(root)!r} has class folders {unknown} absent from the train split")
        classes = sorted(class_to_idx, key=class_to_idx.get)
    try:
        samples = make_dataset(str(root), class_to_idx, extensions=IMAGE_EXTENSIONS, allow_empty=allow_empty)
    except FileNotFoundError as e:
        raise ValueError(f"image folder {str(root)!r}: {e}") from e
    return classes, samples


def is_imagenet_synsets(folders: Sequence[str]) -> bool:
    """True when every folder name is a WordNet synset id (``n01440764``)."""
    return bool(folders) and all(_SYNSET.match(f) for f in folders)


def imagenet_classnames_for(folders: Sequence[str]) -> list[str]:
    """OpenCLIP's ImageNet class names for the 1000 synset folders, in sorted-synset order.

    The standard ImageNet label order is the sorted list of the 1000 synsets, and
    ``open_clip.IMAGENET_CLASSNAMES`` follows it; with fewer folders the mapping is ambiguous
    (OpenCLIP ships no synset list), so a ``ValueError`` asks for an explicit class-name file.
    """
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES

    if not is_imagenet_synsets(folders):
        raise ValueError("folder names are not ImageNet synset ids (nXXXXXXXX)")
    if len(folders) != len(IMAGENET_CLASSNAMES) or len(set(folders)) != len(folders):
        raise ValueError(
            f"found {len(folders)} synset folders; ImageNet class names need all {len(IMAGENET_CLASSNAMES)} "
            f"(sorted synsets = label order). Give a class-name file for a subset."
        )
    if list(folders) != sorted(folders):
        raise ValueError("synset folders must be given in sorted order")
    return list(IMAGENET_CLASSNAMES)


# ----------------------------------------------------------------------------------------------
# Few-shot data sets (ELEVATER iris index layout, or train/test ImageFolder trees)
# ----------------------------------------------------------------------------------------------
def parse_index_line(line: str, where: str) -> tuple[str, list[int]]:
    """``'<path> <ids>'`` -> ``(path, [ids])``, splitting on the last space (paths may hold spaces)."""
    parts = line.rsplit(" ", 1)
    if len(parts) != 2 or not parts[0].strip():
        raise ValueError(f"{where}: expected '<image_path> <label ids>', got {line!r}")
    path, ids = parts[0].strip(), parts[1].strip()
    try:
        labels = [int(x) for x in ids.split(",") if x != ""]
    except ValueError:
        raise ValueError(f"{where}: label ids {ids!r} are not comma-separated integers") from None
    return path, labels


def read_index_file(path: str | os.PathLike, num_classes: int | None = None) -> list[tuple[str, list[int]]]:
    """Read an iris index file: ``[(image_ref, [label ids])]`` in file order.

    Label ids outside ``[0, num_classes)`` raise ``ValueError`` naming the file and line.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"index file {str(path)!r} does not exist")
    items = []
    for lineno, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        ref, labels = parse_index_line(line, f"index file {str(path)!r} line {lineno}")
        if num_classes is not None:
            bad = [y for y in labels if not 0 <= y < num_classes]
            if bad:
                raise ValueError(f"index file {str(path)!r} line {lineno}: label ids {bad} outside "
                                 f"[0, {num_classes}) (labels.txt has {num_classes} classes)")
        items.append((ref, labels))
    if not items:
        raise ValueError(f"index file {str(path)!r} lists no images")
    return items


@dataclass
class FewShotData:
    """One few-shot data set read from disk, images not yet decoded.

    ``train``/``test`` are ``[(image_ref, [label ids])]`` in the order the few-shot sampler
    shuffles (index-file order; COCO indexes sorted by image id); refs are opened with ``source``.
    """

    name: str
    classnames: list[str]
    train: list[tuple[str, list[int]]]
    test: list[tuple[str, list[int]]]
    source: ImageSource
    layout: str
    templates: list[str] | dict | None = None
    multilabel: bool = False
    folder: str = ""
    classnames_source: str = ""

    @property
    def num_classes(self) -> int:
        return len(self.classnames)


def read_coco_classification(path: str | os.PathLike) -> tuple[list[str], list[tuple[str, list[int]]]]:
    """Read a COCO-style classification index (vision-datasets' COCO format, used by three
    ELEVATER data sets): ``(class names, [(image_ref, [label ids])])``.

    ``images[{id, file_name, zip_file?}]``, ``annotations[{image_id, category_id}]``,
    ``categories[{id, name}]`` with ids from 1; label = position of the category in id order.
    An image stored in a zip is referenced as ``zip_file@file_name``. Images come back **sorted by
    id**, the order vision-datasets gives them (it re-sorts the json's images when it reads them),
    so that a k-shot draw shuffles the same list as the toolkit's.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"index file {str(path)!r} does not exist")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        cats = sorted(doc["categories"], key=lambda c: c["id"])
        cat_index = {c["id"]: i for i, c in enumerate(cats)}
        labels: dict = {img["id"]: [] for img in doc["images"]}
        for ann in doc.get("annotations", []):
            if ann["image_id"] not in labels:
                raise ValueError(f"annotation for unknown image id {ann['image_id']!r}")
            if ann["category_id"] not in cat_index:
                raise ValueError(f"annotation with unknown category id {ann['category_id']!r}")
            labels[ann["image_id"]].append(cat_index[ann["category_id"]])
        items = []
        for img in sorted(doc["images"], key=lambda im: im["id"]):
            ref = f"{img['zip_file']}@{img['file_name']}" if img.get("zip_file") else img["file_name"]
            items.append((ref, sorted(set(labels[img["id"]]))))
    except (KeyError, TypeError, json.JSONDecodeError, ValueError) as e:
        raise ValueError(f"index file {str(path)!r} is not a valid COCO classification file: {e!r}") from e
    if not items:
        raise ValueError(f"index file {str(path)!r} lists no images")
    return [c.get("name", str(c["id"])) for c in cats], items


#: The layouts a few-shot data set folder may have, for error messages.
FEWSHOT_LAYOUTS = (
    "the ELEVATER toolkit's download layout, ROOT/classification/<root_folder>/ with the set's own index "
    "files (e.g. classification/cifar_10_20211007/{train.txt,test.txt,labels.txt,train.zip,val.zip})",
    "one folder a data set, ROOT/<name>/ with train.txt+test.txt+labels.txt (iris index files), "
    "train.json+test.json (COCO) or train/+test/ ImageFolder trees",
)


def fewshot_layout(folder: str | os.PathLike) -> str | None:
    """``'iris'`` for index files, ``'coco'`` for COCO json indexes, ``'imagefolder'`` for
    train/test trees, ``None`` otherwise (the one-folder-a-set layout)."""
    folder = Path(folder)
    if (folder / "train.txt").is_file() and (folder / "test.txt").is_file():
        return "iris"
    if (folder / "train.json").is_file() and (folder / "test.json").is_file():
        return "coco"
    if (folder / "train").is_dir() and (folder / "test").is_dir():
        return "imagefolder"
    return None


def find_toolkit_folder(root: str | os.PathLike, root_folder: str) -> Path | None:
    """The folder of a data set in the ELEVATER toolkit's download layout, or ``None``.

    ``root`` is the toolkit's ``DATASET.ROOT`` (holding ``classification/``) or that
    ``classification/`` folder itself; ``root_folder`` is the set's ``vision_datasets.json`` entry
    (``classification/cifar_10_20211007``). A download of another date (``cifar_10_2022...``) is
    found too; of several, the latest.
    """
    root, rel = Path(root), Path(root_folder)
    for cand in (root / rel, root / rel.name):
        if cand.is_dir():
            return cand
    stem = rel.name.rsplit("_", 1)[0]
    for base in (root / rel.parent, root):
        hits = sorted(p for p in base.glob(f"{glob.escape(stem)}_*")
                      if p.is_dir() and p.name[len(stem) + 1:].isdigit())
        if hits:
            return hits[-1]
    return None


def list_fewshot_datasets(root: str | os.PathLike, toolkit: dict[str, dict] | None = None) -> list[str]:
    """Names of the data sets under ``root`` in either layout (:data:`FEWSHOT_LAYOUTS`), sorted:
    sub-folders holding a set, and the sets of ``toolkit`` (name -> catalogue entry with
    ``root_folder``) whose download folder exists."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"few-shot root {str(root)!r} does not exist")
    found = {name: find_toolkit_folder(root, entry["root_folder"])
             for name, entry in (toolkit or {}).items() if entry.get("root_folder")}
    found = {name: folder.resolve() for name, folder in found.items() if folder is not None}
    # a toolkit folder is listed under its data set's name, not its folder name
    names = {p.name for p in root.iterdir() if p.is_dir() and fewshot_layout(p) is not None
             and p.resolve() not in found.values()}
    return sorted(names | set(found))


def _read_labels(folder: Path, labelmap: str | None, names_given: Sequence[str] | None,
                 fallback: list[str] | None = None) -> tuple[list[str], str]:
    """(class names, their source): given names (checked against the label map when there is
    one), else the label map, else ``fallback`` (COCO categories, folder names)."""
    from_file = None
    if labelmap and (folder / labelmap).is_file():
        from_file = read_classnames(folder / labelmap)
    if names_given is not None:
        names = list(names_given)
        if from_file is not None and len(from_file) != len(names):
            raise ValueError(f"{str(folder / labelmap)!r} names {len(from_file)} classes, but {len(names)} "
                             f"class names were given for it")
        if fallback is not None and len(fallback) != len(names):
            raise ValueError(f"{str(folder)!r} has {len(fallback)} classes, but {len(names)} class names "
                             f"were given for it")
        return names, "given"
    if from_file is not None:
        if fallback is not None and len(fallback) != len(from_file):
            raise ValueError(f"{str(folder / labelmap)!r} names {len(from_file)} classes but the index has "
                             f"{len(fallback)}")
        return from_file, str(folder / labelmap)
    if fallback is not None:
        return fallback, "index"
    raise ValueError(f"no class names for {str(folder)!r}: {labelmap or 'labels.txt'} is missing")


def read_fewshot_dataset(root: str | os.PathLike, name: str, check_files: bool = True,
                         toolkit: dict | None = None, classnames: Sequence[str] | None = None) -> FewShotData:
    """Read the data set ``name`` under ``root`` in either layout (:data:`FEWSHOT_LAYOUTS`); every
    image reference is checked before returning.

    ``toolkit``: the set's catalogue entry (``root_folder``, ``train``, ``test``, ``labelmap``,
    ``format``, from the toolkit's ``vision_datasets.json``); its download folder is read as is,
    with the set's own index-file names. Without it, or when that folder is absent, ``root/name``.

    Class names: ``classnames`` when given (checked against the label map or index), else the
    label map (``labels.txt``; required for iris index files), else the COCO categories or the
    ImageFolder folder names (``_`` read as spaces). Templates: an optional ``templates.txt`` or
    ``templates.json`` in the folder. ``multilabel`` is set when an image carries several labels.
    """
    folder = None
    if toolkit and toolkit.get("root_folder"):
        folder = find_toolkit_folder(root, toolkit["root_folder"])
    if folder is not None:
        layout = toolkit.get("format", "iris")
        train_index, test_index, labelmap = toolkit["train"], toolkit["test"], toolkit.get("labelmap")
        for idx in (train_index, test_index):
            if not (folder / idx).is_file():
                raise ValueError(f"{name}: the toolkit's folder {str(folder)!r} has no index file {idx!r} "
                                 f"(found {describe_folder(folder)})")
    else:
        folder = Path(root) / name
        layout = fewshot_layout(folder)
        if layout is None:
            where = (f"neither {str(Path(root) / toolkit['root_folder'])!r} nor " if toolkit and
                     toolkit.get("root_folder") else "not ")
            raise ValueError(f"few-shot data set {name!r}: {where}{str(folder)!r} holds a data set. Expected "
                             f"{FEWSHOT_LAYOUTS[0]}; or {FEWSHOT_LAYOUTS[1]}. Found in {str(folder)!r}: "
                             f"{describe_folder(folder)}; in {str(root)!r}: {describe_folder(root)}")
        train_index, test_index, labelmap = {"iris": ("train.txt", "test.txt", "labels.txt"),
                                             "coco": ("train.json", "test.json", "labels.txt"),
                                             "imagefolder": ("train", "test", "labels.txt")}[layout]
    templates = None
    for tname in ("templates.txt", "templates.json"):
        if (folder / tname).is_file():
            templates = read_templates(folder / tname)
    source = ImageSource(folder)
    if layout == "iris":
        names, names_source = _read_labels(folder, labelmap, classnames)
        train = read_index_file(folder / train_index, len(names))
        test = read_index_file(folder / test_index, len(names))
    elif layout == "coco":
        cats, train = read_coco_classification(folder / train_index)
        test_cats, test = read_coco_classification(folder / test_index)
        if test_cats != cats:
            raise ValueError(f"{str(folder / test_index)!r} and {str(folder / train_index)!r} list different categories")
        names, names_source = _read_labels(folder, labelmap, classnames, fallback=cats)
    elif layout == "imagefolder":
        folders, train_s = scan_image_folder(folder / "train")
        class_to_idx = {c: i for i, c in enumerate(folders)}
        _, test_s = scan_image_folder(folder / "test", class_to_idx, allow_empty=True)
        if not test_s:
            raise ValueError(f"few-shot data set {str(folder / 'test')!r} holds no images")
        train = [(os.path.relpath(p, folder), [y]) for p, y in train_s]
        test = [(os.path.relpath(p, folder), [y]) for p, y in test_s]
        names, names_source = _read_labels(folder, labelmap, classnames, fallback=[f.replace("_", " ") for f in folders])
    else:
        raise ValueError(f"{name}: unknown index format {layout!r} (expected 'iris' or 'coco')")
    if check_files:
        source.check([r for r, _ in train], f"{name} train split")
        source.check([r for r, _ in test], f"{name} test split")
    multilabel = any(len(y) > 1 for _, y in train + test)
    return FewShotData(name=name, classnames=names, train=train, test=test, source=source, layout=layout,
                       templates=templates, multilabel=multilabel, folder=str(folder), classnames_source=names_source)
