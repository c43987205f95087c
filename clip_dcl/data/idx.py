"""Reading IDX files (MNIST, Fashion-MNIST): header ``0 0 <type> <ndim>``, ``ndim`` big-endian uint32 sizes, values.

Not torchvision's ``read_sn3_pascalvincent_tensor``: it opens a path only (no gzip, no bytes) and checks with bare
``assert``s, so every check and message below would stay around it.
"""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np

#: IDX type byte -> NumPy dtype (big-endian where it matters)
_TYPES = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


class IdxError(ValueError):
    """A file that is not a whole IDX file; the message names the file and what is wrong."""


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """The array in the IDX file ``path`` (gzipped or not); `IdxError` naming the file when it is missing, not IDX,
    or shorter or longer than its header says (a truncated download is never read as fewer images)."""
    path = Path(path)
    if not path.is_file():
        raise IdxError(f"{path}: no such file")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, gzip.BadGzipFile) as e:
            raise IdxError(f"{path}: the gzip stream is cut short or damaged ({e})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _TYPES:
        raise IdxError(f"{path}: not an IDX file (its first bytes are {raw[:4].hex() or 'absent'})")
    dtype, ndim = _TYPES[raw[2]], raw[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header:
        raise IdxError(f"{path}: the IDX header is cut short ({len(raw)} bytes)")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
        raise IdxError(
            f"{path}: the header gives shape {tuple(shape)} ({expected} bytes) but the file holds "
            f"{len(raw)} bytes: truncated or not this file"
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def read_idx_pair(images: str | os.PathLike, labels: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """``(images (N, rows, cols) uint8, labels (N,) int64)``; `IdxError` when a file is bad or the shapes disagree."""
    x, y = read_idx(images), read_idx(labels)
    if x.ndim != 3 or x.dtype != np.uint8:
        raise IdxError(f"{images}: expected unsigned-byte images (N, rows, cols); got {x.dtype} {x.shape}")
    if y.ndim != 1:
        raise IdxError(f"{labels}: expected one label per image (N,); got shape {y.shape}")
    if len(x) != len(y):
        raise IdxError(f"{images} holds {len(x)} images but {labels} {len(y)} labels")
    return x, y.astype(np.int64)


def write_idx(path: str | os.PathLike, array: np.ndarray, compress: bool | None = None) -> Path:
    """Write ``array`` (unsigned bytes) as an IDX file, gzipped when ``compress`` (default: the name ends in
    ``.gz``); for tests and for making a small set of one's own."""
    path = Path(path)
    array = np.ascontiguousarray(array, dtype=np.uint8)
    body = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()
    if compress if compress is not None else path.suffix == ".gz":
        body = gzip.compress(body, mtime=0)
    path.write_bytes(body)
    return path
