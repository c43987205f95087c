"""Writing a data set in CLIP_benchmark's webdataset layout (``clip-dcl data benchmark``)."""

from __future__ import annotations

import os
from pathlib import Path

from ..skips import Skip
from .benchmark import BENCHMARK_IMAGE_KEYS, BenchmarkShards, read_benchmark_shards
from .files import read_templates


def write_benchmark_shards(
    source: str | os.PathLike,
    out_dir: str | os.PathLike,
    kind: str = "auto",
    split: str = "test",
    shard_size: int = 1000,
    classnames: str | os.PathLike | None = None,
    templates: str | os.PathLike | None = None,
) -> BenchmarkShards:
    """Write image-caption shards (a ``retrieval`` set) or an ImageFolder tree (classification) in CLIP_benchmark's
    webdataset layout under ``out_dir``, image bytes unchanged (the written set scores as the source)."""
    from ..shards import shard_writer
    from .folders import folder_classnames, scan_image_folder
    from .retrieval import expand_shards
    from .samples import sample_captions, shard_samples

    if kind not in ("auto", "retrieval", "classification"):
        raise ValueError(f"kind must be auto, retrieval or classification, got {kind!r}")
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    src = Path(source)
    if kind == "auto":
        kind = "classification" if src.is_dir() and not any(src.glob("*.tar")) else "retrieval"
    out = Path(out_dir)
    if kind == "classification":  # the class names are checked against the folders before anything is written
        folders, samples = scan_image_folder(src)
        names, _ = folder_classnames(src, folders, classnames)
    if (out / split).exists() and any((out / split).iterdir()):
        raise ValueError(f"{str(out / split)!r} exists and is not empty")
    (out / split).mkdir(parents=True, exist_ok=True)

    def items():
        if kind == "retrieval":
            for sample in shard_samples(expand_shards(source)):
                if isinstance(sample, Skip):
                    raise ValueError(sample.describe())
                caps = sample_captions(sample)
                if isinstance(caps, Skip):
                    raise ValueError(caps.describe())
                ext = next((k for k in BENCHMARK_IMAGE_KEYS if k in sample), None)
                if ext is None:
                    raise ValueError(
                        Skip(
                            sample.get("__url__"),
                            sample.get("__key__"),
                            "no image",
                            f"none of .{', .'.join(BENCHMARK_IMAGE_KEYS)}",
                        ).describe()
                    )
                yield {ext: sample[ext], "txt": "\n".join(caps)}
        else:
            for path, label in samples:
                yield {Path(path).suffix.lower().lstrip(".") or "jpg": Path(path).read_bytes(), "cls": str(label)}

    if kind == "classification":
        (out / "classnames.txt").write_text("\n".join(names) + "\n")
        tfile = Path(templates) if templates is not None else src / "templates.txt"
        if tfile.is_file():
            found = read_templates(tfile)
            if isinstance(found, dict):
                raise ValueError(
                    f"templates {str(tfile)!r} are per class (CuPL); CLIP_benchmark's layout holds one template a line"
                )
            # CLIP_benchmark fills a template with str.format(c=name): {} is written as {c}
            lines = [t.replace("{}", "{c}") for t in found]
            (out / "zeroshot_classification_templates.txt").write_text("\n".join(lines) + "\n")
    else:
        (out / "dataset_type.txt").write_text("retrieval\n")
    writer = None  # made at the first sample, as it opens its first shard at once
    for count, item in enumerate(items()):
        if writer is None:  # CLIP_benchmark's names: 0.tar, 1.tar, ...
            writer = shard_writer(out / split, shard_size, pattern="%d.tar")
        writer.write({"__key__": f"s{count:09d}", **item})
    if writer is None:
        raise ValueError(f"{str(source)!r} holds no samples")
    nshards = writer.shard  # the shards it opened (close() deletes the count)
    writer.close()
    (out / split / "nshards.txt").write_text(f"{nshards}\n")
    return read_benchmark_shards(out, split)
