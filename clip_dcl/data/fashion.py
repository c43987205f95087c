"""Fashion-MNIST (or any IDX image/label pair of its layout) in the layout the rest of clip-dcl reads.

``clip-dcl data fashion-mnist OUT [--from DIR]`` reads the four official files (:data:`FILES`; Debian's
``dataset-fashion-mnist`` installs them in :data:`DEBIAN_DIR`) and writes, under ``OUT``::

    summary.json                  config, classes, per-class distinct captions, sizes, relative paths
    train/, val/, test/           caption shards ({key}.png/.txt/.json)
    zeroshot/, zeroshot_test/     ImageFolder trees of the validation and test images
    fewshot/fashion-mnist/ ...    ELEVATER layout (5-shot pools from the validation images), catalog.json
    train.npz                     with --pack: the training pairs decoded once (clip_dcl.data.packed)

Captions put the class name and two to four attributes measured from the pixels, binned at quantiles of the
official training set, in a template: captions of one class differ, and classes share words.
"""

from __future__ import annotations

import dataclasses
import io
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from ..paths import write_json
from .idx import IdxError, read_idx_pair
from .shards import CaptionShardWriter, format_key

#: where ``apt-get install dataset-fashion-mnist`` puts the files
DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"
DEBIAN_PACKAGE = "dataset-fashion-mnist"
#: the official file names (gzipped; the same names without ``.gz`` are read too)
FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}
#: Fashion-MNIST's class names, in label order (its authors' names, lower case)
CLASSNAMES = ("t-shirt/top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle boot")

#: attribute -> words of its bins, low to high (synonyms per bin)
ATTRIBUTE_WORDS = {
    "brightness": (("faint", "dim"), ("grey", "mid-grey"), ("bright", "light")),
    "fill": (("small", "little"), ("medium-sized",), ("large", "big")),
    "aspect": (("tall", "narrow"), ("squarish",), ("wide", "broad")),
    "texture": (("plain", "smooth"), ("patterned", "textured")),
}
#: caption templates: {a} the attribute words, {c} the class name
CAPTION_TEMPLATES = (
    "{a} {c}.",
    "one {a} {c}.",
    "photo of one {a} {c}.",
    "a product photo: {a} {c}.",
    "{a} {c} on a black background.",
    "there is one {a} {c} in the picture.",
    "{c}, {a}.",
    "an image of one {a} {c}.",
)
#: zero-shot prompts, in the captions' own words
ZEROSHOT_TEMPLATES = (
    "{c}.",
    "one {c}.",
    "photo of one {c}.",
    "a product photo: {c}.",
    "{c} on a black background.",
    "there is one {c} in the picture.",
    "an image of one {c}.",
)
#: few-shot prompts (ELEVATER's templates.txt of the task)
FEWSHOT_TEMPLATES = ("photo of one {c}.", "one {c}.", "a product photo: {c}.")
#: a pixel counts as the garment's above this grey level (the background is 0; edges are faint)
_INK = 32
_STREAMS = {"split": 0, "captions-train": 1, "captions-val": 2, "captions-test": 3, "fewshot": 4}


class DataMissing(ValueError):
    """The IDX files are absent or unreadable; the message is one line naming the package and the files."""


@dataclass(frozen=True)
class FashionConfig:
    """Sizes of a Fashion-MNIST layout (``clip-dcl data fashion-mnist --help`` describes each)."""

    seed: int = 0
    image_size: int = 32
    val_samples: int = 5000
    train_samples: int = 0  # 0: every official training image not held out
    test_samples: int = 0  # 0: every official test image
    captions_per_image: int = 5
    val_captions_per_image: int = 1
    shard_size: int = 5000
    fewshot_train_per_class: int = 20
    fewshot_test_per_class: int = 50

    def validate(self, n_train: int, n_test: int, n_classes: int) -> None:
        """Raise ``ValueError`` naming the first bad value (field and its flag) against the files' sizes."""

        def bad(field, why):
            raise ValueError(f"--{field.replace('_', '-')} {getattr(self, field)!r}: {why}")

        if self.seed < 0:
            bad("seed", "must be >= 0")
        if not 8 <= self.image_size <= 512:
            bad("image_size", "must be within [8, 512] pixels")
        if not 1 <= self.val_samples < n_train:
            bad("val_samples", f"must be within [1, {n_train - 1}] (the official training set has {n_train} images)")
        if not 0 <= self.train_samples <= n_train - self.val_samples:
            bad(
                "train_samples",
                f"must be within [0, {n_train - self.val_samples}] (0: all {n_train} training "
                f"images but the {self.val_samples} held out)",
            )
        if not 0 <= self.test_samples <= n_test:
            bad("test_samples", f"must be within [0, {n_test}] (0: all of them)")
        for field in ("captions_per_image", "val_captions_per_image"):
            if not 1 <= getattr(self, field) <= 20:
                bad(field, "must be within [1, 20]")
        if self.shard_size < 1:
            bad("shard_size", "must be >= 1")
        if self.fewshot_train_per_class < 5:
            bad("fewshot_train_per_class", "must be >= 5 (the few-shot protocol samples 5 shots per class)")
        if self.fewshot_test_per_class < 1:
            bad("fewshot_test_per_class", "must be >= 1")
        if self.fewshot_train_per_class * n_classes > self.val_samples:
            bad(
                "fewshot_train_per_class",
                f"needs {self.fewshot_train_per_class * n_classes} held-out images, "
                f"more than --val-samples {self.val_samples}",
            )


def _locate(directory: Path, name: str) -> Path:
    """The file ``name`` in ``directory``, or the same without ``.gz``; the ``.gz`` path when neither exists."""
    plain = directory / name[:-3]
    return plain if not (directory / name).exists() and plain.exists() else directory / name


def missing_line(directory, problem: str) -> str:
    """The one line that says what to install or download."""
    return (
        f"{problem}: Fashion-MNIST's four files {', '.join(FILES.values())} are needed in {directory}; "
        f"install them with `apt-get install {DEBIAN_PACKAGE}` (into {DEBIAN_DIR}), or download the same files "
        f"from Fashion-MNIST's authors and give their folder with --from DIR"
    )


def load_idx_set(directory: str | os.PathLike = DEBIAN_DIR) -> Dict[str, np.ndarray]:
    """``{"train_images", "train_labels", "test_images", "test_labels"}`` from ``directory``; `DataMissing` when a
    file is missing, truncated or not IDX, or the training and test images differ in size."""
    directory = Path(directory)
    paths = {k: _locate(directory, name) for k, name in FILES.items()}
    absent = [p.name for p in paths.values() if not p.is_file()]
    if absent:
        raise DataMissing(missing_line(directory, f"{', '.join(absent)} not found in {directory}"))
    try:
        out = {}
        for split in ("train", "test"):
            out[f"{split}_images"], out[f"{split}_labels"] = read_idx_pair(
                paths[f"{split}_images"], paths[f"{split}_labels"]
            )
    except IdxError as e:
        raise DataMissing(missing_line(directory, str(e))) from None
    train_shape, test_shape = out["train_images"].shape[1:], out["test_images"].shape[1:]
    if train_shape != test_shape:
        raise DataMissing(missing_line(directory, f"training images are {train_shape} but test images {test_shape}"))
    return out


def pixel_attributes(images: np.ndarray) -> Dict[str, np.ndarray]:
    """Per image of the garment's pixels (above ``_INK``): mean grey ``brightness``, ``fill`` of the frame, bounding
    box width / height ``aspect``, ``texture`` (grey std / mean); no such pixel: 0, 0, 1, 0."""
    x = images.astype(np.float32)
    ink = images > _INK
    count = ink.sum(axis=(1, 2))
    safe = np.maximum(count, 1)
    mean = (x * ink).sum(axis=(1, 2)) / safe
    var = ((x - mean[:, None, None]) ** 2 * ink).sum(axis=(1, 2)) / safe
    rows, cols = ink.any(axis=2), ink.any(axis=1)
    height = np.where(count > 0, rows.shape[1] - rows[:, ::-1].argmax(1) - rows.argmax(1), 1)
    width = np.where(count > 0, cols.shape[1] - cols[:, ::-1].argmax(1) - cols.argmax(1), 1)
    return {
        "brightness": mean,
        "fill": count / float(ink.shape[1] * ink.shape[2]),
        "aspect": width / np.maximum(height, 1),
        "texture": np.sqrt(var) / np.maximum(mean, 1.0),
    }


def attribute_cuts(reference: np.ndarray) -> Dict[str, List[float]]:
    """Each attribute's bin edges at quantiles of ``reference`` (the official training set: the same every draw)."""
    values = pixel_attributes(reference)
    return {
        name: [float(q) for q in np.quantile(values[name], np.linspace(0, 1, len(words) + 1)[1:-1])]
        for name, words in ATTRIBUTE_WORDS.items()
    }


def attribute_bins(images: np.ndarray, cuts: Dict[str, List[float]]) -> Dict[str, np.ndarray]:
    """Each image's bin of each attribute (0 = lowest), cut at ``cuts`` (a value on a cut goes to the upper bin)."""
    values = pixel_attributes(images)
    return {name: np.searchsorted(np.asarray(cuts[name]), values[name], side="right") for name in ATTRIBUTE_WORDS}


def make_caption(classname: str, bins: Dict[str, int], rng: np.random.Generator) -> str:
    """The class name in a random template with 2-4 of the image's attribute words, random synonyms, in random order."""
    names = list(ATTRIBUTE_WORDS)
    chosen = rng.permutation(len(names))[: int(rng.integers(2, len(names) + 1))]
    words = []
    for k in chosen:
        options = ATTRIBUTE_WORDS[names[k]][int(bins[names[k]])]
        words.append(options[int(rng.integers(len(options)))])
    template = CAPTION_TEMPLATES[int(rng.integers(len(CAPTION_TEMPLATES)))]
    joined = (", ".join(words[:-1]) + " and " + words[-1]) if template.startswith("{c},") else " ".join(words)
    return template.format(a=joined, c=classname)


def caption_words() -> List[str]:
    """Every word this data set writes, lower case and sorted: the ``clip-dcl-micro-fmnist`` tokenizer's vocabulary."""
    import re

    texts = [*CLASSNAMES, *CAPTION_TEMPLATES, *ZEROSHOT_TEMPLATES, *FEWSHOT_TEMPLATES, "and"]
    texts += [w for bins in ATTRIBUTE_WORDS.values() for words in bins for w in words]
    return sorted({w.lower() for t in texts for w in re.findall(r"[^\W\d_]+", t.replace("{a}", "").replace("{c}", ""))})


def _png(image: np.ndarray, size: int) -> bytes:
    """Lossless RGB PNG of a grey image, centred on a black ``size`` square (resized when larger)."""
    from PIL import Image

    h, w = image.shape
    if h <= size and w <= size:
        canvas = np.zeros((size, size), dtype=np.uint8)
        top, left = (size - h) // 2, (size - w) // 2
        canvas[top : top + h, left : left + w] = image
        img = Image.fromarray(canvas, "L")
    else:
        img = Image.fromarray(image, "L").resize((size, size), Image.BILINEAR)
    buf = io.BytesIO()
    img.convert("RGB").save(buf, format="PNG", compress_level=6)
    return buf.getvalue()


def class_folders(names: Sequence[str]) -> List[str]:
    """Folder names whose sorted order is the label order: ``0_t-shirt-top``, ``9_ankle-boot`` (zero-padded)."""
    width = len(str(len(names) - 1))
    return [
        f"{k:0{width}d}_" + "".join(ch if ch.isalnum() or ch == "-" else "-" for ch in n) for k, n in enumerate(names)
    ]


def write_pairs(directory: Path, samples, count: int, shard_size: int, tag: str, verbose: bool) -> dict:
    """Write ``count`` ``(png, captions, meta)`` samples as caption shards; the split's summary, with the distinct
    captions per class."""
    width = max(9, len(str(count - 1)))
    captions_by_class: Dict[str, set] = {}
    start = time.perf_counter()
    with CaptionShardWriter(directory, shard_size) as writer:
        for i, (png, caps, meta) in enumerate(samples):
            captions_by_class.setdefault((meta["label"], meta["classname"]), set()).update(caps)
            writer.write(format_key(i, width), png, caps[0], meta, ext="png")
            if verbose and (i + 1) % 10000 == 0:
                print(f"[{tag}] {directory.name}: {i + 1}/{count} ({time.perf_counter() - start:.1f} s)", flush=True)
    return {
        **writer.entry(len(caps) if count else 0, width),
        "distinct_captions": {name: len(v) for (_, name), v in sorted(captions_by_class.items())},
    }


def _write_pairs(
    directory: Path, images, labels, cuts, names, cfg: FashionConfig, per_image: int, stream: str, verbose: bool
) -> dict:
    rng = np.random.default_rng([cfg.seed, _STREAMS[stream]])
    bins = attribute_bins(images, cuts)

    def samples():
        for i, (image, label) in enumerate(zip(images, labels)):
            sample_bins = {k: int(v[i]) for k, v in bins.items()}
            caps = [make_caption(names[label], sample_bins, rng) for _ in range(per_image)]
            meta = {
                "label": int(label),
                "classname": names[label],
                "captions": caps,
                "attributes": sample_bins,
                "width": cfg.image_size,
                "height": cfg.image_size,
            }
            yield _png(image, cfg.image_size), caps, meta

    return write_pairs(directory, samples(), len(images), cfg.shard_size, "fashion-mnist", verbose)


def write_tree(
    directory: Path, images, labels, names, size: int, templates: Sequence[str] = ZEROSHOT_TEMPLATES
) -> dict:
    """An ImageFolder tree of ``images`` (one folder a class, :func:`class_folders`), classnames.txt, templates.txt."""
    from .synth.layout import tree_files

    folders = class_folders(names)
    for folder in folders:
        (directory / folder).mkdir(parents=True)
    seen = [0] * len(names)
    for image, label in zip(images, labels):
        (directory / folders[label] / f"{seen[label]:05d}.png").write_bytes(_png(image, size))
        seen[label] += 1
    return tree_files(directory, names, templates, int(len(images)))


def _per_class(labels: np.ndarray, per_class: int, num_classes: int, rng) -> np.ndarray:
    """Indices of the first ``per_class`` images of each class in a seeded order, class-interleaved."""
    order = rng.permutation(len(labels))
    picks = [order[labels[order] == c][:per_class] for c in range(num_classes)]
    short = [c for c, p in enumerate(picks) if len(p) < per_class]
    if short:
        raise ValueError(f"classes {short} have fewer than {per_class} images for the few-shot suite")
    return np.stack(picks, axis=1).reshape(-1)


def write_fewshot(
    directory: Path,
    sets,
    names,
    cfg,
    stream: int = _STREAMS["fewshot"],
    task: str = "fashion-mnist",
    templates: Sequence[str] = FEWSHOT_TEMPLATES,
) -> dict:
    """The ELEVATER-layout task ``task``: train pools of ``sets["val"]``, test images of ``sets["test"]``."""
    from .synth.layout import _write_iris, catalog_entry

    rng = np.random.default_rng([cfg.seed, stream])
    splits = {}
    for split, (images, labels), per_class in (
        ("train", sets["val"], cfg.fewshot_train_per_class),
        ("test", sets["test"], cfg.fewshot_test_per_class),
    ):
        idx = _per_class(labels, per_class, len(names), rng)
        splits[split] = [(f"{n:06d}.png", _png(images[i], cfg.image_size), int(labels[i])) for n, i in enumerate(idx)]
    _write_iris(directory / task, list(names), list(templates), splits)
    catalog = {task: catalog_entry("accuracy", names, splits)}
    write_json(directory / "catalog.json", catalog)
    return {"dir": directory.name, "catalog": f"{directory.name}/catalog.json", "datasets": catalog}


def holdout(seed: int, n_train: int, val_samples: int, train_samples: int = 0):
    """``(val_idx sorted, train_idx)`` of a seeded permutation: ``val_samples`` held out, then ``train_samples``
    (0: all the rest)."""
    order = np.random.default_rng([seed, _STREAMS["split"]]).permutation(n_train)
    rest = order[val_samples:]
    return np.sort(order[:val_samples]), (rest[:train_samples] if train_samples else rest)


def source_record(cfg, names: Sequence[str], source, data: Dict[str, np.ndarray]) -> dict:
    """The settings and source files summary.json records (what --reuse compares)."""
    return {
        "config": dataclasses.asdict(cfg),
        "classnames": list(names),
        "source": {
            "dir": str(Path(source)),
            "train_images": len(data["train_labels"]),
            "test_images": len(data["test_labels"]),
            "image_shape": list(data["train_images"].shape[1:]),
        },
    }


_OUTPUTS = ("summary.json", "train", "val", "test", "zeroshot", "zeroshot_test", "fewshot", "train.npz")


def generate(
    out_dir,
    source: str | os.PathLike = DEBIAN_DIR,
    *,
    classnames: Optional[Sequence[str]] = None,
    overwrite: bool = False,
    reuse: bool = False,
    verbose: bool = True,
    **overrides,
) -> dict:
    """Write the layout of the module docstring under ``out_dir`` from the IDX files in ``source`` (``overrides``:
    `FashionConfig` fields); the summary as ``clip_dcl.data.synth.generate`` returns it. `DataMissing` without the
    files; ``FileExistsError`` for earlier outputs without ``overwrite`` or a reusable summary (``reuse``)."""
    from .synth.attributes import same_class_rate_distinct, tau_plus_from_labels
    from .synth.layout import configured, finish, prepare_out

    cfg = configured(FashionConfig(), overrides, "Fashion-MNIST")
    data = load_idx_set(source)
    names = tuple(classnames) if classnames is not None else CLASSNAMES
    n_classes = int(max(data["train_labels"].max(), data["test_labels"].max())) + 1
    if len(names) != n_classes:
        raise ValueError(f"{len(names)} class names for labels 0..{n_classes - 1} in {source}: give one name a label")
    n_train, n_test = len(data["train_labels"]), len(data["test_labels"])
    cfg.validate(n_train, n_test, n_classes)
    out = Path(out_dir)
    record = source_record(cfg, names, source, data)
    summary = prepare_out(out, record, _OUTPUTS, reuse, overwrite, verbose, "fashion-mnist")
    if summary is not None:
        return summary
    start = time.perf_counter()

    val_idx, train_idx = holdout(cfg.seed, n_train, cfg.val_samples, cfg.train_samples)
    test_n = cfg.test_samples or n_test
    sets = {
        "train": (data["train_images"][train_idx], data["train_labels"][train_idx]),
        "val": (data["train_images"][val_idx], data["train_labels"][val_idx]),
        "test": (data["test_images"][:test_n], data["test_labels"][:test_n]),
    }
    cuts = attribute_cuts(data["train_images"])
    if verbose:
        print(
            f"[fashion-mnist] {n_classes} classes from {source}; draw {cfg.seed}: {len(train_idx)} train, "
            f"{len(val_idx)} validation (held out of the official training set), {test_n} test -> {out}",
            flush=True,
        )
    parts = {}
    for split, per_image in (
        ("train", cfg.captions_per_image),
        ("val", cfg.val_captions_per_image),
        ("test", cfg.val_captions_per_image),
    ):
        parts[split] = _write_pairs(
            out / split, *sets[split], cuts, names, cfg, per_image, f"captions-{split}", verbose
        )
    parts["zeroshot"] = write_tree(out / "zeroshot", *sets["val"], names, cfg.image_size)
    parts["zeroshot_test"] = write_tree(out / "zeroshot_test", *sets["test"], names, cfg.image_size)
    parts["fewshot"] = write_fewshot(out / "fewshot", sets, names, cfg)
    train_labels = sets["train"][1]
    summary = {
        "format": "clip-dcl-idx/1",
        **record,
        "classes": {
            "names": list(names),
            "folders": class_folders(names),
            "train_counts": np.bincount(train_labels, minlength=n_classes).tolist(),
            "distinct_train_captions": parts["train"]["distinct_captions"],
        },
        "attribute_cuts": cuts,
        "attribute_words": {k: [list(b) for b in v] for k, v in ATTRIBUTE_WORDS.items()},
        "tau_plus": tau_plus_from_labels(train_labels, n_classes),
        "same_class_rate_distinct_pairs": same_class_rate_distinct(train_labels),
        **parts,
    }
    line = (
        f"[fashion-mnist] tau_plus = sum_c p_c^2 = {summary['tau_plus']:.4f}; distinct training captions per "
        f"class {min(parts['train']['distinct_captions'].values())}-"
        f"{max(parts['train']['distinct_captions'].values())}; "
    )
    return finish(out, summary, start, verbose, line)
