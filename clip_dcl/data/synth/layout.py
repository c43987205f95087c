"""The synthetic data set on disk (``clip-dcl data synth``): configuration, seed streams, writers, `generate`."""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import math
import numbers
import shutil
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...paths import write_json
from ..shards import KEY_WIDTH, CaptionShardWriter, format_key
from .attributes import (
    BACKGROUNDS,
    COLOURS,
    COUNTS,
    MAX_CLASSES,
    POSITIONS,
    SCATTERED,
    SHAPES,
    SIZES,
    class_counts,
    class_folders,
    class_grid,
    class_names,
    grid_shape,
    same_class_rate_distinct,
    sample_attributes,
    tau_plus_from_labels,
)
from .captions import ZEROSHOT_TEMPLATES, make_captions
from .render import draw_image, encode_jpeg

# Seed-stream ids (the second entry of every SeedSequence).
_STREAM = {
    "train": 0,
    "val": 1,
    "zeroshot": 2,
    "labels-train": 3,
    "labels-val": 4,
    "test": 5,
    "labels-test": 6,
    "zeroshot-test": 7,
    "synth-shape": 10,
    "synth-colour": 11,
    "synth-count": 12,
    "synth-position": 13,
}
# Few-shot train and test images of one task come from disjoint index ranges of its stream.
_TEST_OFFSET = 1 << 30


@dataclass(frozen=True)
class SynthConfig:
    """Sizes and knobs of a synthetic data set; see `clip_dcl.data.synth` for their meaning."""

    seed: int = 0
    image_size: int = 64
    num_classes: int = 10
    class_imbalance: float = 0.0
    train_samples: int = 12000
    val_samples: int = 1000
    #: a test split (``test/`` shards and a ``zeroshot_test/`` tree) from seed streams of its own, so
    #: that training and validation images are the same with or without it; 0 writes none
    test_samples: int = 0
    shard_size: int = 1500
    captions_per_image: int = 5
    val_captions_per_image: int = 5
    zeroshot_per_class: int = 20
    fewshot_train_per_class: int = 20
    fewshot_test_per_class: int = 50
    jpeg_quality: int = 90

    @classmethod
    def quick(cls, **overrides) -> "SynthConfig":
        """A tiny set for tests and smoke runs (a second or two to generate)."""
        base = dict(
            train_samples=256,
            val_samples=64,
            shard_size=64,
            zeroshot_per_class=4,
            fewshot_train_per_class=5,
            fewshot_test_per_class=4,
        )
        return cls(**{**base, **overrides})

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad value (field and its flag)."""

        def bad(field, why):
            flag = "--" + field.replace("_", "-")
            raise ValueError(f"{field}={getattr(self, field)!r} ({flag}): {why}")

        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            real = field.type in ("float", float)
            if isinstance(value, bool) or not isinstance(value, numbers.Real if real else numbers.Integral):
                bad(field.name, f"expected {'a number' if real else 'an integer'}")
        if self.seed < 0:
            bad("seed", "must be >= 0")
        if not 32 <= self.image_size <= 1024:
            bad("image_size", "must be within [32, 1024] pixels")
        if not 2 <= self.num_classes <= MAX_CLASSES:
            bad(
                "num_classes",
                f"must be within [2, {MAX_CLASSES}]: the classes are shape x colour "
                f"combinations and there are {len(SHAPES)} shapes x {len(COLOURS)} colours",
            )
        if not (math.isfinite(self.class_imbalance) and self.class_imbalance >= 0):
            bad("class_imbalance", "must be a finite number >= 0 (0 = balanced classes)")
        if self.train_samples < self.num_classes:
            bad("train_samples", f"must be >= num_classes={self.num_classes}")
        if self.val_samples < 1:
            bad("val_samples", "must be >= 1")
        if self.test_samples < 0:
            bad("test_samples", "must be >= 0 (0: no test split)")
        if self.shard_size < 1:
            bad("shard_size", "must be >= 1")
        for field in ("captions_per_image", "val_captions_per_image"):
            if not 1 <= getattr(self, field) <= 20:
                bad(field, "must be within [1, 20]")
        if self.zeroshot_per_class < 1:
            bad("zeroshot_per_class", "must be >= 1")
        if self.fewshot_train_per_class < 5:
            bad("fewshot_train_per_class", "must be >= 5 (the few-shot protocol samples 5 shots per class)")
        if not 1 <= self.fewshot_test_per_class <= 150:
            bad(
                "fewshot_test_per_class",
                "must be within [1, 150] (the digits have >= 174 images per class, and keep >= 24 for training)",
            )
        if not 1 <= self.jpeg_quality <= 95:
            bad("jpeg_quality", "must be within [1, 95]")
        counts = class_counts(self.train_samples, self.num_classes, self.class_imbalance)
        if counts.min() == 0:
            bad(
                "class_imbalance",
                f"leaves class {int(np.argmin(counts))} without a training sample "
                f"at train_samples={self.train_samples}",
            )


def split_labels(seed: int, split: str, num_samples: int, num_classes: int, imbalance: float) -> np.ndarray:
    """The label of every sample of a split: exact class counts, seeded random order."""
    counts = class_counts(num_samples, num_classes, imbalance)
    labels = np.repeat(np.arange(num_classes), counts)
    return np.random.default_rng([seed, _STREAM[f"labels-{split}"]]).permutation(labels)


def render_sample(
    seed: int, stream: str, index: int, shape: str, colour: str, image_size: int, num_captions: int = 0
) -> tuple[object, dict, list[str]]:
    """Image, attributes and captions of sample ``index`` of a seed stream (pure: same in, same out)."""
    rng = np.random.default_rng([seed, _STREAM[stream], index])
    attrs = sample_attributes(rng, shape, colour)
    image = draw_image(attrs, image_size, rng)
    return image, attrs, make_captions(attrs, rng, num_captions)


class _Progress:
    """Log lines at most every ``every`` seconds (plus the last one); silent when not verbose."""

    def __init__(self, verbose: bool, label: str, total: int, every: float = 2.0):
        self.verbose, self.label, self.total, self.every = verbose, label, total, every
        self.start = self.last = time.perf_counter()

    def update(self, done: int) -> None:
        now = time.perf_counter()
        if self.verbose and (done == self.total or now - self.last >= self.every):
            self.last = now
            print(f"[synth] {self.label}: {done}/{self.total} ({now - self.start:.1f} s)", flush=True)


def _public_attrs(attrs: dict) -> dict:
    return {k: attrs[k] for k in ("shape", "colour", "size", "count", "position", "background")}


def _write_shards(
    directory: Path, split: str, labels: np.ndarray, cfg: SynthConfig, num_captions: int, verbose: bool
) -> dict:
    grid = class_grid(cfg.num_classes)
    width = max(KEY_WIDTH, len(str(len(labels) - 1)))
    progress = _Progress(verbose, f"{split} shards", len(labels))
    with CaptionShardWriter(directory, cfg.shard_size) as writer:
        for i, label in enumerate(labels):
            shape, colour = grid[label]
            image, attrs, captions = render_sample(cfg.seed, split, i, shape, colour, cfg.image_size, num_captions)
            meta = {
                "label": int(label),
                "classname": f"{colour} {shape}",
                **_public_attrs(attrs),
                "captions": captions,
                "width": cfg.image_size,
                "height": cfg.image_size,
            }
            writer.write(format_key(i, width), encode_jpeg(image, cfg.jpeg_quality), captions[0], meta)
            progress.update(i + 1)
    return writer.entry(num_captions, width)


def _write_zeroshot(directory: Path, cfg: SynthConfig, verbose: bool, stream: str = "zeroshot") -> dict:
    grid = class_grid(cfg.num_classes)
    folders = class_folders(cfg.num_classes)
    progress = _Progress(verbose, f"{stream} images", cfg.num_classes * cfg.zeroshot_per_class)
    done = 0
    for label, ((shape, colour), folder) in enumerate(zip(grid, folders)):
        (directory / folder).mkdir(parents=True)
        for j in range(cfg.zeroshot_per_class):
            image, _, _ = render_sample(
                cfg.seed, stream, label * cfg.zeroshot_per_class + j, shape, colour, cfg.image_size
            )
            (directory / folder / f"{j:05d}.jpg").write_bytes(encode_jpeg(image, cfg.jpeg_quality))
            done += 1
            progress.update(done)
    return tree_files(directory, class_names(cfg.num_classes), ZEROSHOT_TEMPLATES, done)


def tree_files(directory: Path, names, templates, num_images: int) -> dict:
    """An ImageFolder tree's classnames.txt and templates.txt; its entry in summary.json."""
    (directory / "classnames.txt").write_text("\n".join(names) + "\n")
    (directory / "templates.txt").write_text("\n".join(templates) + "\n")
    return {
        "dir": directory.name,
        "num_classes": len(names),
        "num_images": num_images,
        "classnames": f"{directory.name}/classnames.txt",
        "templates": f"{directory.name}/templates.txt",
    }


def _zip_stored(path: Path, files: list[tuple[str, bytes]]) -> None:
    """An uncompressed zip (ELEVATER reads images out of it) with fixed dates and modes."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, data in files:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.create_system = 3  # as on Unix, whatever the platform
            zf.writestr(info, data)


def _write_iris(
    directory: Path, labels_txt: list[str], templates: list[str], splits: dict[str, list[tuple[str, bytes, int]]]
) -> None:
    """One ELEVATER iris data set: labels.txt, templates.txt, {split}.txt and {split}_images.zip."""
    directory.mkdir(parents=True)
    (directory / "labels.txt").write_text("\n".join(labels_txt) + "\n")
    (directory / "templates.txt").write_text("\n".join(templates) + "\n")
    for split, items in splits.items():
        zip_name = f"{split}_images.zip"
        _zip_stored(directory / zip_name, [(name, data) for name, data, _ in items])
        lines = [f"{zip_name}@{name} {label}" for name, _, label in items]
        (directory / f"{split}.txt").write_text("\n".join(lines) + "\n")


#: Few-shot attribute tasks: attribute -> (vocabulary source, templates).
_FEWSHOT_TEMPLATES = {
    "synth-shape": ("one {c}.", "a picture of one {c}.", "there is one {c}."),
    "synth-colour": ("one {c} shape.", "a picture of something {c}.", "something {c}."),
    "synth-count": ("{c} shapes.", "a picture of {c} shapes.", "there are {c} shapes."),
    "synth-position": ("a shape {c}.", "a picture of a shape {c}.", "there is a shape {c}."),
}
DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_DIGIT_TEMPLATES = ("a picture of the digit {c}.", "the number {c}.", "a handwritten {c}.")


def fewshot_tasks(num_classes: int) -> dict[str, list[str]]:
    """Class names of each synthetic few-shot task; a shape or colour task with under two values is left out."""
    grid = class_grid(num_classes)
    shapes = [s for s in SHAPES if any(s == g[0] for g in grid)]
    colours = [c for c in COLOURS if any(c == g[1] for g in grid)]
    tasks = {
        "synth-shape": shapes,
        "synth-colour": colours,
        "synth-count": ["one", "two", "three"],
        "synth-position": list(POSITIONS),
    }
    return {name: values for name, values in tasks.items() if len(values) >= 2}


def _fewshot_item(
    cfg: SynthConfig, task: str, index: int, value_index: int, values: list[str], shapes: list[str], colours: list[str]
) -> bytes:
    # Everything but the task's attribute is drawn at random from the training vocabulary.
    rng = np.random.default_rng([cfg.seed, _STREAM[task], index])
    shape = values[value_index] if task == "synth-shape" else shapes[rng.integers(len(shapes))]
    colour = values[value_index] if task == "synth-colour" else colours[rng.integers(len(colours))]
    fixed = {}
    if task == "synth-count":
        fixed["count"] = value_index + 1
    elif task == "synth-position":
        fixed.update(count=1, position=values[value_index])
    attrs = sample_attributes(rng, shape, colour, **fixed)
    return encode_jpeg(draw_image(attrs, cfg.image_size, rng), cfg.jpeg_quality)


def _write_fewshot(directory: Path, cfg: SynthConfig, verbose: bool) -> dict:
    grid = class_grid(cfg.num_classes)
    shapes = sorted({g[0] for g in grid}, key=SHAPES.index)
    colours = sorted({g[1] for g in grid}, key=COLOURS.index)
    tasks = fewshot_tasks(cfg.num_classes)
    catalog: dict[str, dict] = {}
    for task, values in tasks.items():
        splits = {}
        for split, per_class, offset in (
            ("train", cfg.fewshot_train_per_class, 0),
            ("test", cfg.fewshot_test_per_class, _TEST_OFFSET),
        ):
            # Class-interleaved order (0, 1, ..., C-1, 0, 1, ...) so that files do not sort by class.
            items = []
            for n in range(per_class * len(values)):
                label = n % len(values)
                data = _fewshot_item(cfg, task, offset + n, label, values, shapes, colours)
                items.append((f"{n:06d}.jpg", data, label))
            splits[split] = items
        _write_iris(directory / task, values, list(_FEWSHOT_TEMPLATES[task]), splits)
        catalog[task] = catalog_entry("accuracy", values, splits)
        if verbose:
            print(
                f"[synth] few-shot {task}: {len(values)} classes, {len(splits['train'])} train, "
                f"{len(splits['test'])} test",
                flush=True,
            )
    catalog["digits"] = _write_digits(directory / "digits", cfg)
    if verbose:
        d = catalog["digits"]
        print(f"[synth] few-shot digits: 10 classes, {d['train']} train, {d['test']} test", flush=True)
    write_json(directory / "catalog.json", catalog)
    return {"dir": directory.name, "catalog": f"{directory.name}/catalog.json", "datasets": catalog}


@functools.lru_cache(maxsize=2)
def _digit_images(image_size: int) -> tuple[tuple[bytes, ...], np.ndarray]:
    """PNG bytes of every scikit-learn digit upscaled to ``image_size`` RGB, and the targets (cached per size)."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.clip(np.rint(digits.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    encoded = []
    for image in images:
        img = Image.fromarray(image, "L").resize((image_size, image_size), Image.BILINEAR)
        buf = io.BytesIO()
        img.convert("RGB").save(buf, format="PNG", compress_level=1)
        encoded.append(buf.getvalue())
    return tuple(encoded), digits.target.astype(int)


def _write_digits(directory: Path, cfg: SynthConfig) -> dict:
    """scikit-learn's 8x8 digits as PNGs: a stratified test split of ``10 * fewshot_test_per_class``."""
    from sklearn.model_selection import train_test_split

    encoded, target = _digit_images(cfg.image_size)
    idx_train, idx_test = train_test_split(
        np.arange(len(target)),
        test_size=10 * cfg.fewshot_test_per_class,
        stratify=target,
        random_state=cfg.seed % (2**32),
    )
    splits = {
        split: [(f"{n:06d}.png", encoded[i], int(target[i])) for n, i in enumerate(sorted(idx))]
        for split, idx in (("train", idx_train), ("test", idx_test))
    }
    _write_iris(directory, list(DIGIT_NAMES), list(_DIGIT_TEMPLATES), splits)
    # The training split is unbalanced (the digit classes are), hence mean per-class accuracy.
    return catalog_entry("mean_per_class", DIGIT_NAMES, splits)


def catalog_entry(metric: str, classes, splits: dict) -> dict:
    """A few-shot task's entry in catalog.json (``splits``: its train and test items)."""
    return {
        "metric": metric,
        "num_classes": len(classes),
        "multilabel": False,
        "classes": list(classes),
        "train": len(splits["train"]),
        "test": len(splits["test"]),
    }


_OUTPUTS = ("summary.json", "train", "val", "zeroshot", "fewshot", "test", "zeroshot_test")


def generate(
    out_dir,
    config: SynthConfig | None = None,
    *,
    quick: bool = False,
    overwrite: bool = False,
    reuse: bool = False,
    verbose: bool = True,
    **overrides,
) -> dict:
    """Write the synthetic data set under ``out_dir``: ``summary.json``'s content plus ``out_dir``, ``train_data``
    / ``val_data`` (brace patterns) and ``seconds``. ``reuse`` returns an existing summary of the same config;
    earlier outputs without ``overwrite`` raise ``FileExistsError``.
    """
    base = config if config is not None else (SynthConfig.quick() if quick else SynthConfig())
    cfg = configured(base, overrides, "synthetic")
    cfg.validate()
    # Plain Python numbers from here on (numpy integers would not serialise to summary.json).
    cfg = SynthConfig(
        **{
            f.name: (float if f.type in ("float", float) else int)(getattr(cfg, f.name))
            for f in dataclasses.fields(cfg)
        }
    )
    out = Path(out_dir)
    summary = prepare_out(out, {"config": dataclasses.asdict(cfg)}, _OUTPUTS, reuse, overwrite, verbose, "synth")
    if summary is not None:
        return summary
    start = time.perf_counter()
    if verbose:
        n_s, n_c = grid_shape(cfg.num_classes)
        print(
            f"[synth] {cfg.num_classes} classes ({n_s} shapes x {n_c} colours grid), seed {cfg.seed}, "
            f"{cfg.image_size}x{cfg.image_size} -> {out}",
            flush=True,
        )
    train_labels = split_labels(cfg.seed, "train", cfg.train_samples, cfg.num_classes, cfg.class_imbalance)
    val_labels = split_labels(cfg.seed, "val", cfg.val_samples, cfg.num_classes, cfg.class_imbalance)
    train = _write_shards(out / "train", "train", train_labels, cfg, cfg.captions_per_image, verbose)
    val = _write_shards(out / "val", "val", val_labels, cfg, cfg.val_captions_per_image, verbose)
    zeroshot = _write_zeroshot(out / "zeroshot", cfg, verbose)
    fewshot = _write_fewshot(out / "fewshot", cfg, verbose)
    test = {}
    if cfg.test_samples:  # after the other parts: each draws from its own seed streams, so nothing above moves
        test_labels = split_labels(cfg.seed, "test", cfg.test_samples, cfg.num_classes, cfg.class_imbalance)
        test = {
            "test": _write_shards(out / "test", "test", test_labels, cfg, cfg.val_captions_per_image, verbose),
            "zeroshot_test": _write_zeroshot(out / "zeroshot_test", cfg, verbose, stream="zeroshot-test"),
        }

    tau_plus = tau_plus_from_labels(train_labels, cfg.num_classes)
    summary = {
        "format": "clip-dcl-synth/1",
        "config": dataclasses.asdict(cfg),
        "classes": {
            "names": class_names(cfg.num_classes),
            "folders": class_folders(cfg.num_classes),
            "shapes": sorted({s for s, _ in class_grid(cfg.num_classes)}, key=SHAPES.index),
            "colours": sorted({c for _, c in class_grid(cfg.num_classes)}, key=COLOURS.index),
            "train_counts": np.bincount(train_labels, minlength=cfg.num_classes).tolist(),
        },
        "tau_plus": tau_plus,
        "same_class_rate_distinct_pairs": same_class_rate_distinct(train_labels),
        "attributes": {
            "shape": list(SHAPES),
            "colour": list(COLOURS),
            "size": list(SIZES),
            "count": list(COUNTS),
            "position": list(POSITIONS) + [SCATTERED],
            "background": list(BACKGROUNDS),
        },
        "train": train,
        "val": val,
        "zeroshot": zeroshot,
        "fewshot": fewshot,
        **test,
    }
    line = (
        f"[synth] tau_plus = sum_c p_c^2 = {tau_plus:.6f} (1/C = {1 / cfg.num_classes:.6f}); "
        f"{train['num_samples']} train / {val['num_samples']} val samples in "
    )
    return finish(out, summary, start, verbose, line)


def configured(base, overrides: dict, what: str):
    """``base`` (a config) with ``overrides``; ``ValueError`` naming any that is not one of its fields."""
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(base)})
    if unknown:
        raise ValueError(f"unknown {what} data option(s) {unknown}")
    return dataclasses.replace(base, **overrides)


def prepare_out(out: Path, record: dict, outputs, reuse: bool, overwrite: bool, verbose: bool, tag: str) -> dict | None:
    """The earlier summary (with paths) when ``reuse`` and it has ``record``'s settings; otherwise ``out`` cleared
    of ``outputs`` (``FileExistsError`` when it holds some and not ``overwrite``) and None."""
    existing = [name for name in outputs if (out / name).exists()]
    if existing and reuse and (out / "summary.json").is_file():
        summary = json.loads((out / "summary.json").read_text())
        if all(summary.get(k) == v for k, v in record.items()):
            if verbose:
                print(f"[{tag}] reusing {out} (same settings)", flush=True)
            return _with_paths(summary, out, seconds=0.0)
    if existing and not overwrite:
        raise FileExistsError(
            f"{str(out)!r} already holds {existing}; pass overwrite=True (--overwrite) to replace them"
        )
    for name in existing:
        path = out / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    out.mkdir(parents=True, exist_ok=True)
    return None


def finish(out: Path, summary: dict, start: float, verbose: bool, line: str) -> dict:
    """Write summary.json and (verbose) ``line`` ended by the seconds since ``start``; the summary with its paths."""
    write_json(out / "summary.json", summary)
    seconds = time.perf_counter() - start
    if verbose:
        print(f"{line}{seconds:.1f} s", flush=True)
    return _with_paths(summary, out, seconds)


def _with_paths(summary: dict, out: Path, seconds: float) -> dict:
    out = out.resolve()
    paths = {"train_data": str(out / summary["train"]["pattern"]), "val_data": str(out / summary["val"]["pattern"])}
    if "test" in summary:
        paths["test_data"] = str(out / summary["test"]["pattern"])
    return {**summary, "out_dir": str(out), **paths, "seconds": seconds}
