"""Your own image-caption pairs as training and validation shards (``clip-dcl data shards``): a folder of images
with same-stem ``.txt`` captions, or a CSV/TSV of image paths (relative to its folder) and captions, several rows
of one image giving it several captions (the first is its ``.txt``, all are in its json ``captions``); or a folder
of class folders, also written as a zero-shot set (`clip_dcl.data.classes`).
"""

from __future__ import annotations

import csv
import io
import os
import random
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..paths import write_json
from .classes import CAPTION, ZeroshotTree, class_tree
from .evalsets.files import IMAGE_EXTENSIONS
from .shards import folder_pattern, format_key, shard_writer, write_sizes_json
from .skips import row_cause

#: The CSV columns read without flags: an image column and a caption column, the first found of each
#: (OpenCLIP's trainer names them ``filepath`` and ``title``).
CSV_IMAGE_KEYS = ("filepath", "image", "image_path", "img", "path", "file", "filename")
CSV_CAPTION_KEYS = ("title", "caption", "text", "captions")
#: Image files stored as they are, under their webdataset key; others are re-encoded as PNG.
_KEPT = {".jpg": "jpg", ".jpeg": "jpg", ".png": "png", ".webp": "webp"}
FORMAT = "clip-dcl-pairs/1"


class CsvColumnsError(ValueError):
    """A CSV whose separator or columns cannot be found: the message names what it has and the flags to give."""


@dataclass
class CsvColumns:
    """Where a CSV's pairs are: its separator, image column and caption column (``header``: every column)."""

    sep: str
    img_key: str
    caption_key: str
    header: list


def _separator(first_line: str, suffix: str) -> str:
    """A tab when the header line has one (or, for a one-column line, the file is ``.tsv``), else a comma."""
    if "\t" in first_line:
        return "\t"
    if "," in first_line:
        return ","
    return "\t" if suffix == ".tsv" else ","


def csv_columns(
    path,
    img_key: str | None = None,
    caption_key: str | None = None,
    sep: str | None = None,
    flags: tuple = ("--csv-img-key", "--csv-caption-key", "--csv-separator"),
) -> CsvColumns:
    """The separator and the image and caption columns of the CSV/TSV at ``path``: those given, else found from the
    header line; `CsvColumnsError` naming the columns found and the ``flags`` to give when one is missing.
    """
    path = Path(path)
    try:
        with open(path, encoding="utf-8", newline="") as f:
            first = f.readline().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as e:
        raise CsvColumnsError(f"{path}: cannot be read ({e})") from None
    if sep is None:
        sep = _separator(first, path.suffix.lower())
    header = [c.strip() for c in next(csv.reader([first], delimiter=sep))] if first else []
    shown = ", ".join(repr(c) for c in header) if header else "none"
    named = "tab" if sep == "\t" else repr(sep)
    fix = f"give {flags[0]} COLUMN and {flags[1]} COLUMN (and {flags[2]} for a separator other than {named})"

    def pick(given, candidates, what, flag):
        if given is not None:
            if given not in header:
                raise CsvColumnsError(
                    f"{path} has no column {given!r} ({flag}); columns found with separator {named}: {shown}; {fix}"
                )
            return given
        for c in candidates:
            if c in header:
                return c
        raise CsvColumnsError(
            f"{path}: no {what} column ({'/'.join(candidates[:2])}) among the columns found with "
            f"separator {named}: {shown}; {fix}"
        )

    return CsvColumns(
        sep,
        pick(img_key, CSV_IMAGE_KEYS, "image", flags[0]),
        pick(caption_key, CSV_CAPTION_KEYS, "caption", flags[1]),
        header,
    )


def is_caption_folder(folder) -> bool:
    """Whether ``folder`` holds image files with captions beside them (``x.jpg`` + ``x.txt``) and no ``.tar`` shard."""
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    if any(n.endswith(".tar") for n in names):
        return False
    stems = {os.path.splitext(n)[0] for n in names if n.lower().endswith(".txt")}
    return any(os.path.splitext(n)[1].lower() in IMAGE_EXTENSIONS and os.path.splitext(n)[0] in stems for n in names)


def caption_folder_hint(folder) -> str:
    """The one line that tells how to turn a folder of images and captions into shards."""
    return (
        f"{folder} is a folder of images with their captions (.txt), not of shards: write shards from it with "
        f"`clip-dcl data shards {folder} OUT`, then give OUT/train (training) or OUT/val (evaluation)"
    )


@dataclass
class Pair:
    """One image and its captions; ``where`` names it in messages (its path, or the CSV line); ``label``: its class
    folder, in a tree of class folders."""

    image: Path
    captions: list
    where: str
    label: str | None = None


@dataclass
class Listed:
    """The pairs found in a source, and what was left out before reading any image (cause -> examples)."""

    pairs: list
    skipped: dict = field(default_factory=dict)

    def skip(self, cause: str, where: str) -> None:
        self.skipped.setdefault(cause, []).append(where)


def list_folder(folder: Path) -> Listed:
    """Every image under ``folder`` with a ``.txt`` of the same stem beside it (sorted paths)."""
    listed = Listed([])
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    images = {p.with_suffix(""): p for p in files if p.suffix.lower() in IMAGE_EXTENSIONS}
    for path in files:
        suffix = path.suffix.lower()
        if suffix in IMAGE_EXTENSIONS:
            text = path.with_suffix(".txt")
            if not text.is_file():
                listed.skip("no caption", str(path))
                continue
            try:
                caption = " ".join(text.read_text(encoding="utf-8").split())
            except UnicodeDecodeError:
                listed.skip("undecodable caption", str(text))
                continue
            if not caption:
                listed.skip("empty caption", str(text))
                continue
            listed.pairs.append(Pair(path, [caption], str(path)))
        elif suffix == ".txt" and path.with_suffix("") not in images:
            listed.skip("no image", str(path))
    return listed


def list_classes(samples: list, names: dict) -> Listed:
    """A tree of class folders' images (`classes.class_tree`), each captioned with its class name."""
    return Listed([Pair(path, [CAPTION.format(c=names[label])], str(path), label) for path, label in samples])


def held_out(pairs: list, val_fraction: float, seed: int) -> dict:
    """``{"val", "train"}``: ``val_fraction`` of the pairs drawn by ``seed`` (at least one when any is asked for);
    pairs with a class are drawn class by class (one at least of each class of two or more), then shuffled."""
    rng = random.Random(seed)
    if not any(p.label for p in pairs):
        pairs = list(pairs)
        rng.shuffle(pairs)
        n_val = round(len(pairs) * val_fraction) if len(pairs) > 1 else 0
        n_val = max(n_val, 1) if val_fraction > 0 and len(pairs) > 1 else n_val
        return {"val": pairs[:n_val], "train": pairs[n_val:]}
    splits = {"val": [], "train": []}
    for label in sorted({p.label for p in pairs}):
        group = [p for p in pairs if p.label == label]
        rng.shuffle(group)
        n_val = max(1, round(len(group) * val_fraction)) if val_fraction > 0 and len(group) > 1 else 0
        splits["val"] += group[:n_val]
        splits["train"] += group[n_val:]
    for split in splits.values():
        rng.shuffle(split)
    return splits


def list_csv(path: Path, columns: CsvColumns) -> Listed:
    """The CSV's rows as pairs, grouped by image (the order of first appearance)."""
    import pandas as pd

    frame = pd.read_csv(
        path,
        sep=columns.sep,
        usecols=[columns.img_key, columns.caption_key],
        dtype=str,
        keep_default_na=False,
        engine="python" if len(columns.sep) > 1 else "c",
    )
    listed, index = Listed([]), {}
    for line, (image, caption) in enumerate(zip(frame[columns.img_key], frame[columns.caption_key]), 2):
        where = f"{path.name} line {line}"
        caption = " ".join(caption.split())
        file = Path(image) if os.path.isabs(image) else path.parent / image
        cause = row_cause(image, caption, lambda _: file in index or file.is_file())
        if cause is not None:
            listed.skip(cause, f"{where}: {file}" if cause == "image not found" else where)
            continue
        if file not in index:
            index[file] = len(listed.pairs)
            listed.pairs.append(Pair(file, [], where))
        listed.pairs[index[file]].captions.append(caption)
    return listed


def image_entry(path: Path) -> tuple:
    """``(webdataset key, bytes)`` of the image at ``path``, checked to decode; PNG bytes for formats
    other than JPEG, PNG and WebP. Raises what PIL raises on a file that is no image."""
    from PIL import Image

    data = path.read_bytes()
    kept = _KEPT.get(path.suffix.lower())
    with Image.open(io.BytesIO(data)) as image:
        if kept is not None:
            image.verify()
            return kept, data
        out = io.BytesIO()
        image.convert("RGB").save(out, format="PNG")
        return "png", out.getvalue()


def write_pairs(
    source,
    out_dir,
    *,
    val_fraction: float = 0.1,
    shard_size: int = 1000,
    seed: int = 0,
    img_key: str | None = None,
    caption_key: str | None = None,
    sep: str | None = None,
    overwrite: bool = False,
    verbose: bool = True,
) -> dict:
    """Shuffle (``seed``) and write the pairs of ``source`` as shards in ``out_dir/train`` and ``out_dir/val``; the
    summary also written to ``out_dir/summary.json``. Unusable pairs are skipped and counted by cause. A folder of
    class folders also gives ``out_dir/zeroshot``, its held-out images (`classes.ZeroshotTree`).
    """
    source, out = Path(source), Path(out_dir)
    if not 0 <= val_fraction < 1:
        raise ValueError(f"--val-fraction {val_fraction:g}: must be in [0, 1)")
    if shard_size < 1:
        raise ValueError(f"--shard-size {shard_size}: must be >= 1")
    tree = class_tree(source) if source.is_dir() else None
    if tree is not None:
        listed, kind = list_classes(*tree), "classes"
    elif source.is_dir():
        listed, kind = list_folder(source), "folder"
    elif source.is_file():
        flags = ("--img-key", "--caption-key", "--separator")
        listed, kind = list_csv(source, csv_columns(source, img_key, caption_key, sep, flags=flags)), "csv"
    else:
        raise ValueError(
            f"{source} does not exist: give a folder of images with .txt captions, a folder of class folders, or a "
            "CSV/TSV file"
        )
    earlier = [out / name for name in ("train", "val", "zeroshot", "summary.json") if (out / name).exists()]
    if earlier and not overwrite:
        raise ValueError(
            f"{out} already holds {', '.join(p.name for p in earlier)}: give --overwrite to replace "
            "them, or another OUT"
        )
    if not listed.pairs:
        found = "; ".join(f"{c} {len(w)} (e.g. {w[0]})" for c, w in listed.skipped.items()) or "no image file"
        raise ValueError(f"{source}: no image with a caption to write ({found})")
    for path in earlier:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()

    splits = held_out(listed.pairs, val_fraction, seed)
    zeroshot = ZeroshotTree(out / "zeroshot", tree[1]) if tree is not None else None
    skipped = {c: list(w) for c, w in listed.skipped.items()}
    written, start, done, total = {}, time.perf_counter(), 0, len(listed.pairs)
    for name in ("train", "val"):
        sizes: Counter = Counter()
        writer = None
        for pair in splits[name]:
            done += 1
            if verbose and (done % 1000 == 0 or done == total) and total >= 1000:
                print(
                    f"[shards] {done}/{total} pairs ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True
                )
            try:
                ext, data = image_entry(pair.image)
            except Exception as e:  # noqa: BLE001 - what PIL raises on a bad file varies
                skipped.setdefault("undecodable image", []).append(f"{pair.where} ({type(e).__name__})")
                continue
            if writer is None:
                writer = shard_writer(out / name, shard_size)
            key = format_key(sum(sizes.values()))
            writer.write(
                {
                    "__key__": key,
                    ext: data,
                    "txt": pair.captions[0],
                    "json": {
                        "key": key,
                        "caption": pair.captions[0],
                        "captions": pair.captions,
                        "source": str(pair.image),
                    },
                }
            )
            sizes[os.path.basename(writer.fname)] += 1
            if zeroshot is not None and name == "val":
                zeroshot.add(pair.label, key, ext, data)
        if writer is not None:
            writer.close()
            write_sizes_json(out / name, dict(sorted(sizes.items())))
            written[name] = {
                "pairs": sum(sizes.values()),
                "shards": len(sizes),
                "pattern": folder_pattern(out / name),
                "folder": str(out / name),
            }
    if "train" not in written:
        raise ValueError(f"{source}: no training pair left (every image was skipped or held out; lower --val-fraction)")
    if splits["val"] and "val" not in written:  # drawn before they were decoded: none of them decoded
        print(
            f"[shards] no validation split: none of the {len(splits['val'])} pair(s) held out for it decoded (see "
            "the skipped images); evaluate on other held-out pairs, or run again with another --seed",
            file=sys.stderr,
        )
    summary = {
        "format": FORMAT,
        "source": str(source),
        "kind": kind,
        "seed": seed,
        "val_fraction": val_fraction,
        "shard_size": shard_size,
        "splits": written,
        "skipped": {c: {"count": len(w), "examples": w[:5]} for c, w in skipped.items()},
    }
    made = zeroshot.finish() if zeroshot is not None else None
    if made is not None:
        summary["zeroshot"] = made
    write_json(out / "summary.json", summary)
    return summary


def run_name(out_dir, loss: str = "decl", logs="logs") -> str:
    """``DATA-LOSS`` (``my_shards-decl``), with ``-2``, ``-3``, ... when ``logs`` already holds a run of that name."""
    base = f"{Path(out_dir).resolve().name}-{loss}"
    name, n = base, 1
    while (Path(logs) / name).exists():
        n += 1
        name = f"{base}-{n}"
    return name


def next_commands(summary: dict, out_dir, name: Optional[str] = None, epochs: int = 10) -> list:
    """The ``clip-dcl train`` and ``clip-dcl eval retrieval`` (or, for class folders, ``eval zeroshot``) commands for
    what :func:`write_pairs` wrote: a batch and a worker count every data-loader worker can fill from its own shards;
    the run named after the data and the loss (:func:`run_name`)."""
    import shlex

    name = name or run_name(out_dir)

    train = summary["splits"]["train"]
    size, shards = summary["shard_size"], train["shards"]
    sizes = sorted([size] * (shards - 1) + [train["pairs"] - size * (shards - 1)])
    workers = min(2, shards)
    least = sum(sizes[: shards // workers])  # the fewest pairs a worker may be given (whole shards)
    batch = 2
    while batch * 2 <= min(128, least):
        batch *= 2
    steps = max(1, train["pairs"] // batch)
    out = Path(out_dir)
    flags = {
        "--loss": "decl",
        "--model": "clip-dcl-tiny",
        "--train-data": str(out / "train"),
        "--batch-size": str(batch),
        "--epochs": str(epochs),
        "--lr": "1e-3",
        "--warmup": str(min(100, steps * epochs // 10 + 1)),
        "--workers": str(workers),
        "--logs": "logs",
        "--name": name,
    }
    from ..arguments import flag_words

    commands = [shlex.join(["clip-dcl", "train", *flag_words(flags)])]
    checkpoint = f"logs/{name}/checkpoints/epoch_{epochs}.pt"
    if "val" in summary["splits"] and summary.get("kind") != "classes":  # one caption a class: retrieval says nothing
        commands.append(
            shlex.join(["clip-dcl", "eval", "retrieval", "--checkpoint", checkpoint, "--data", str(out / "val")])
        )
    if "zeroshot" in summary:
        commands.append(
            shlex.join(["clip-dcl", "eval", "zeroshot", "--checkpoint", checkpoint, "--data", str(out / "zeroshot")])
        )
    return commands
