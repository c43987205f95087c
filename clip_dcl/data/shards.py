"""Image-caption shards in img2dataset's layout (``{key}.jpg/.txt/.json`` per sample, ``sizes.json`` beside them,
read by OpenCLIP's ``get_dataset_size``), written by webdataset's ``ShardWriter`` with fixed tar headers (same
samples, same bytes); added here are key checks, ``sizes.json`` and the brace pattern OpenCLIP expands.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from ..paths import write_json

#: Shard file names: ``00000.tar``, ``00001.tar``, ... (img2dataset's naming).
SHARD_NAME_FORMAT = "{:05d}.tar"
#: The same names as webdataset's ``ShardWriter`` pattern.
_SHARD_PATTERN = "%05d.tar"
#: Width of zero-padded keys (``000000123``), widened automatically for larger splits.
KEY_WIDTH = 9
#: Fixed tar header fields, so that identical samples give identical shard bytes.
TAR_MTIME = 0.0
TAR_OWNER = "clip-dcl"
TAR_MODE = 0o444


def format_key(index: int, width: int = KEY_WIDTH) -> str:
    """Zero-padded decimal key, e.g. ``format_key(123) == "000000123"``."""
    if index < 0:
        raise ValueError(f"key index must be >= 0, got {index}")
    return str(index).zfill(width)


def img2dataset_key(shard_id: int, index_in_shard: int, shard_size: int) -> int:
    """img2dataset's key: ``shard_id * 10**ceil(log10(shard_size)) + index_in_shard``."""
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    if not 0 <= index_in_shard < shard_size:
        raise ValueError(f"index_in_shard={index_in_shard} outside [0, {shard_size})")
    return shard_id * 10 ** math.ceil(math.log10(shard_size)) + index_in_shard


def shard_pattern(directory: str | os.PathLike, num_shards: int) -> str:
    """Brace pattern over ``num_shards`` numbered shards, ``dir/{00000..00007}.tar``; one shard: its plain path."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    return _brace(directory, SHARD_NAME_FORMAT.format(0), SHARD_NAME_FORMAT.format(num_shards - 1))


def _brace(directory: str | os.PathLike, first: str, last: str) -> str:
    if first == last:
        return os.path.join(str(directory), first)
    stem_first, ext = os.path.splitext(first)
    stem_last, _ = os.path.splitext(last)
    return os.path.join(str(directory), f"{{{stem_first}..{stem_last}}}{ext}")


def folder_pattern(folder: str | os.PathLike) -> str:
    """The brace pattern (OpenCLIP's ``--train-data`` expands no glob) of every ``.tar`` in ``folder``: a plain path,
    a range for shards numbered without a gap, else a list; ``ValueError`` when there is none or a name holds ``,{}``.
    """
    folder = str(folder)
    names = sorted(n for n in os.listdir(folder) if n.endswith(".tar") and os.path.isfile(os.path.join(folder, n)))
    example = os.path.join(folder, "{00000..00009}.tar")
    if not names:
        raise ValueError(f"{folder!r} is a folder with no .tar shard in it: give the shards' pattern, e.g. {example!r}")
    if len(names) == 1:
        return os.path.join(folder, names[0])
    stems = [n[: -len(".tar")] for n in names]
    width = len(stems[0])
    if all(s.isdigit() and len(s) == width for s in stems) and [int(s) for s in stems] == list(
        range(int(stems[0]), int(stems[0]) + len(stems))
    ):
        return _brace(folder, names[0], names[-1])
    if any(c in s for s in stems for c in ",{}"):
        raise ValueError(
            f"the shard names in {folder!r} cannot be listed in a brace pattern: give the shards' "
            f"pattern, e.g. {example!r}"
        )
    return os.path.join(folder, "{" + ",".join(stems) + "}.tar")


def write_sizes_json(directory: str | os.PathLike, sizes: dict[str, int]) -> Path:
    """Write ``sizes.json`` (shard basename -> sample count) into ``directory``; return its path."""
    path = Path(directory) / "sizes.json"
    write_json(path, dict(sizes))
    return path


def shard_writer(directory: str | os.PathLike, shard_size: int, *, pattern: str = _SHARD_PATTERN, **kw):
    """webdataset's ``ShardWriter`` writing ``00000.tar``, ... (``pattern``, from shard 0) in ``directory``,
    ``shard_size`` samples each, uncompressed and with fixed tar headers; ``kw`` goes to its ``TarWriter``."""
    import webdataset as wds

    Path(directory).mkdir(parents=True, exist_ok=True)
    return wds.ShardWriter(
        os.path.join(str(directory), pattern),
        maxcount=shard_size,
        maxsize=float("inf"),
        verbose=0,
        user=TAR_OWNER,
        group=TAR_OWNER,
        mode=TAR_MODE,
        mtime=TAR_MTIME,
        compress=False,
        **kw,
    )


class CaptionShardWriter:
    """Writes ``(key, image bytes, caption, meta)`` samples into numbered shards, ``sizes.json`` at `close`.

    Keys are decimal strings, strictly increasing (unique across shards without a set of all keys); the json entry
    is ``{"key": key, "caption": caption, **meta}``, in that order.
    """

    def __init__(self, directory: str | os.PathLike, shard_size: int):
        if shard_size < 1:
            raise ValueError(f"shard_size must be >= 1, got {shard_size}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.shard_size = shard_size
        self.sizes: dict[str, int] = {}
        self._writer = None  # webdataset's ShardWriter opens its first shard at once: made at the first sample
        self._last_key: int | None = None
        self._closed = False

    def __enter__(self) -> "CaptionShardWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    def write(self, key: str, jpg: bytes, caption: str, meta: dict | None = None, *, ext: str = "jpg") -> None:
        """Append one sample; opens the next shard when the current one is full. ``ext`` names the image's
        entry (``jpg``, or ``png`` for lossless images: OpenCLIP's loader and our readers take either)."""
        if self._closed:
            raise ValueError("write() on a closed CaptionShardWriter")
        if ext not in ("jpg", "png"):
            raise ValueError(f"ext={ext!r}: images are stored as 'jpg' or 'png'")
        if not (isinstance(key, str) and key.isdigit()):
            raise ValueError(f"key must be a decimal string such as '000000123', got {key!r}")
        if self._last_key is not None and int(key) <= self._last_key:
            raise ValueError(f"keys must be strictly increasing: {key!r} after {self._last_key}")
        meta = dict(meta or {})
        for field, value in (("key", key), ("caption", caption)):
            if field in meta and meta[field] != value:
                raise ValueError(f"meta[{field!r}]={meta[field]!r} contradicts the {field} argument {value!r}")
            meta.pop(field, None)
        record = {"key": key, "caption": caption, **meta}
        if self._writer is None:
            self._writer = shard_writer(self.directory, self.shard_size, encoder=False)
        self._writer.write(
            {
                "__key__": key,
                ext: bytes(jpg),
                "txt": caption.encode("utf-8"),
                "json": json.dumps(record).encode("utf-8"),
            }
        )
        self.sizes[os.path.basename(self._writer.fname)] = self._writer.count
        self._last_key = int(key)

    def close(self) -> dict[str, int]:
        """Close the open shard, write ``sizes.json``; return shard name -> count. Idempotent."""
        if not self._closed:
            if self._writer is not None:
                self._writer.close()
            if self.sizes:
                write_sizes_json(self.directory, self.sizes)
            self._closed = True
        return dict(self.sizes)

    def entry(self, captions_per_image: int, key_width: int) -> dict:
        """The split's entry in a generated set's summary.json: its folder, shards and dense keys."""
        name = self.directory.name
        return {
            "dir": name,
            "pattern": f"{name}/{Path(self.pattern).name}",
            "num_samples": self.num_samples,
            "num_shards": len(self.sizes),
            "captions_per_image": captions_per_image,
            "key_scheme": "dense",
            "key_width": key_width,
        }

    @property
    def num_samples(self) -> int:
        return sum(self.sizes.values())

    @property
    def shard_paths(self) -> list[Path]:
        return [self.directory / name for name in self.sizes]

    @property
    def pattern(self) -> str:
        """Brace pattern over the written shards (for ``--train-data`` / ``--val-data``)."""
        if not self.sizes:
            raise ValueError("no sample was written, so there is no shard pattern")
        names = list(self.sizes)
        return _brace(self.directory, names[0], names[-1])


class TailRecorder:
    """A read-only stream that keeps the count and the last 1024 bytes of what was read from it: whether a
    tar shard ended with its end-of-archive marker (the training pipeline and the evaluation readers)."""

    def __init__(self, stream):
        self.stream, self.total, self.head, self.tail = stream, 0, b"", b""

    def read(self, *args):
        data = self.stream.read(*args)
        if self.total < 6:
            self.head = (self.head + data)[:6]
        self.total += len(data)
        self.tail = (self.tail + data)[-1024:]
        return data

    def complete(self) -> bool:
        """Whether the archive ended with its end-of-archive marker (unknown, so True, when compressed)."""
        if self.head.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ")):  # gzip, bzip2, xz
            return True
        # tarfile and GNU tar end an archive with two zero blocks, in 512-byte records.
        return self.total % 512 == 0 and self.total >= 1024 and self.tail == bytes(1024)

    def close(self):
        self.stream.close()


def tar_samples(stream, url: str, emit):
    """Read one shard's tar ``stream`` (a :class:`TailRecorder`) sample by sample: the members of a sample are held
    until the next one starts, and ``yield from emit(key, [(ext, name, data), ...])`` passes each whole sample on.
    Returns ``(samples, why, cut)``: why the shard ended early (a read error, or no end-of-archive marker) or None,
    and the key of the sample it cut short (dropped) or None. The one shard reader of training and evaluation."""
    import webdataset as wds
    from webdataset import tariterators

    held, key, previous, count, why = [], None, None, 0, None
    try:
        for f in tariterators.tar_file_iterator(stream, handler=wds.reraise_exception):
            name_key, ext = tariterators.base_plus_ext(f["fname"])
            if name_key is None:
                continue
            if held and name_key != key:
                count += 1
                previous = {e for e, _, _ in held}
                yield from emit(key, held)
                held = []
            key = name_key
            held.append((ext, f["fname"], f["data"]))
        while stream.read(1 << 16):  # tarfile stops at the first zero block: read the rest of the marker
            pass
    except Exception as e:  # noqa: BLE001 - whatever tarfile raises, the shard ends here
        why = f"{type(e).__name__}: {str(e).split(' @ ')[0]}"
    finally:
        stream.close()
    if why is None and not stream.complete():
        why = "no end-of-archive marker: truncated"
        if held and {e for e, _, _ in held} == previous:  # cut at a member boundary after a whole sample
            count += 1
            yield from emit(key, held)
            held = []
    if why is None and held:
        count += 1
        yield from emit(key, held)
        held = []
    return count, why, (key if held else None)
