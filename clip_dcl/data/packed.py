"""A training set decoded once: webdataset shards packed into one ``.npz`` that training holds in memory
(``--train-data PATH.npz``, ``clip_dcl.train.packed``). OpenCLIP's loader decodes and tokenises every sample each
epoch, which on the testbed's small model costs more than the step; no library packs decoded shards for it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Dict

import numpy as np

#: the arrays every packed file holds
FIELDS = ("images", "captions", "keys", "ids", "source")


def pack_shards(pattern: str, out, verbose: bool = True) -> Dict[str, object]:
    """Pack the shards of ``pattern`` into ``out`` (``.npz``); ids as the webdataset pipeline gives them (`sample_id`).

    Returns ``{"path", "num_samples", "skipped", "image_shape"}``; ``ValueError``: no sample, mixed shapes, not .npz.
    """
    import webdataset as wds

    from ..paths import expand_pattern
    from .ids import sample_id

    out = Path(out)
    if out.suffix != ".npz":
        raise ValueError(
            f"the packed file must end in .npz (OpenCLIP's --dataset-type auto reads it by its "
            f"extension); got {str(out)!r}"
        )
    urls = expand_pattern(pattern)
    missing = [u for u in urls if "://" not in u and not Path(u).is_file()]
    if missing:
        raise ValueError(f"shard {missing[0]!r} of {pattern!r} does not exist")
    images, captions, keys, ids = [], [], [], []
    skipped = 0
    undecodable = []

    def skip_undecodable(exn) -> bool:  # a broken image or a decompression bomb: skipped and counted
        undecodable.append(exn)
        return True

    dataset = wds.WebDataset(urls, shardshuffle=False).decode("rgb8", handler=skip_undecodable)
    for sample in dataset:
        image = next((sample[k] for k in ("jpg", "png", "jpeg", "webp") if k in sample), None)
        caption = sample.get("txt")
        if image is None or not isinstance(caption, str) or not caption.strip():
            skipped += 1
            logging.warning(
                "packing %s: sample %s has no %s; skipped",
                sample.get("__url__"),
                sample.get("__key__"),
                "image" if image is None else "caption",
            )
            continue
        if images and image.shape != images[0].shape:
            raise ValueError(
                f"sample {sample.get('__key__')!r} of {sample.get('__url__')!r} is {image.shape[1]}x"
                f"{image.shape[0]}, the first one {images[0].shape[1]}x{images[0].shape[0]}: a packed "
                "set holds images of one size"
            )
        images.append(np.ascontiguousarray(image, dtype=np.uint8))
        captions.append(caption)
        keys.append(str(sample["__key__"]))
        ids.append(int(sample_id(sample)))
        if verbose and len(images) % 5000 == 0:
            print(f"[pack] {len(images)} samples", flush=True)
    if undecodable:
        skipped += len(undecodable)
        logging.warning(
            "packing %s: %d sample(s) with an undecodable image skipped (e.g. %s)",
            pattern,
            len(undecodable),
            str(undecodable[0]).splitlines()[0][:300] if str(undecodable[0]) else type(undecodable[0]).__name__,
        )
    if not images:
        raise ValueError(f"no sample with an image and a caption in {pattern!r}")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial.npz")
    np.savez(
        partial,
        images=np.stack(images),
        captions=np.array(captions),
        keys=np.array(keys),
        ids=np.array(ids, dtype=np.int64),
        source=np.array(pattern),
    )
    partial.replace(out)
    if verbose:
        print(f"[pack] {len(images)} samples ({skipped} skipped) -> {out}", flush=True)
    return {"path": str(out), "num_samples": len(images), "skipped": skipped, "image_shape": list(images[0].shape)}


def pack_synth(summary: dict, reuse: bool = True, verbose: bool = True) -> Path:
    """``OUT_DIR/train.npz`` of a generated data set's ``summary``; with ``reuse``, one newer than ``summary.json``
    (written last, after every shard) is kept."""
    out_dir = Path(summary["out_dir"])
    out = out_dir / "train.npz"
    marker = out_dir / "summary.json"
    fresh = out.is_file() and marker.is_file() and out.stat().st_mtime >= marker.stat().st_mtime
    if not (reuse and fresh):
        pack_shards(summary["train_data"], out, verbose=verbose)
    return out


def load_packed(path) -> Dict[str, np.ndarray]:
    """The arrays of a packed file; ``ValueError`` naming the file when it is not one."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError) as e:
        raise ValueError(f"{str(path)!r} is not a readable packed training set ({e})") from None
    absent = [k for k in FIELDS if k not in arrays]
    if absent:
        raise ValueError(
            f"{str(path)!r} lacks the arrays {absent} of a packed training set (write one with `clip-dcl data pack`)"
        )
    n = len(arrays["images"])
    if arrays["images"].dtype != np.uint8 or arrays["images"].ndim != 4 or arrays["images"].shape[-1] != 3:
        raise ValueError(
            f"{str(path)!r}: images must be uint8 (N, H, W, 3); got {arrays['images'].dtype} "
            f"{tuple(arrays['images'].shape)}"
        )
    if not (len(arrays["captions"]) == len(arrays["keys"]) == len(arrays["ids"]) == n):
        raise ValueError(f"{str(path)!r}: images, captions, keys and ids differ in length")
    return arrays


def packed_size(path) -> int:
    """The number of samples of a packed file, read from its header alone."""
    with np.load(Path(path), allow_pickle=False) as f:
        return int(f["ids"].shape[0])
