"""Synthetic image-caption data with latent classes: clip-dcl's embedded default data.

Every image shows one to three flat shapes drawn with PIL; its caption names them in varied
words ("a small red circle in the top left on a grey background", "there are two big violet
stars against a black backdrop", ...). Each sample has these latent attributes:

=============  =========================================================  ==================
attribute      values                                                     role
=============  =========================================================  ==================
shape          circle, square, triangle, star, cross, diamond             class (subset)
colour         red, blue, green, yellow, purple, orange, pink, cyan       class (subset)
size           small, large                                               nuisance
count          1, 2, 3                                                    nuisance
position       top left, top right, bottom left, bottom right, center     nuisance (count 1)
               ("scattered" when count > 1: one shape per quadrant)
background     grey, white, black                                         nuisance
=============  =========================================================  ==================

**Latent classes.** ``num_classes = C`` picks the first ``n_shapes`` shapes and the first
``n_colours`` colours above; class ``k`` is the pair ``(shape k // n_colours, colour k %
n_colours)`` (:func:`class_grid`). When ``C`` factors as ``n_shapes * n_colours`` with
``n_shapes <= 6``, ``n_colours <= 8``, the most even factorisation is used (ties: more colours,
since colour is the quicker attribute to learn); otherwise the smallest most even grid with more
than ``C`` cells is filled row by row and its last cells stay unused. Size, count, position and
background vary within a class. Class frequencies are balanced (``class_imbalance = 0``) or
Zipf-like, ``p_c ∝ (c + 1)^-class_imbalance``, rounded to counts by largest remainders.

**Share of same-class negatives.** For two samples drawn independently from the training split,
``P(same class) = tau_plus = sum_c p_c^2`` with ``p_c = n_c / N`` the empirical class shares
(``1 / C`` when balanced); this is DCL's class prior ``tau_plus``. It is computed from the labels
written (:func:`tau_plus_from_labels`), printed, and stored in ``summary.json``, together with the
rate over pairs of *distinct* samples, ``sum_c n_c (n_c - 1) / (N (N - 1))``, which is what a
batch without repeats sees.

**Determinism.** Sample ``i`` of a split draws from ``numpy.random.default_rng([seed, split,
i])``, so it does not depend on how many samples come before it or on the process that draws it;
JPEGs are written with a fixed quality and chroma sampling, tars with fixed header fields, zips
with a fixed date; nothing written depends on the clock or on the output path.

Layout written under ``OUT_DIR`` (defaults in brackets)::

    summary.json                  config, classes, tau_plus, sizes, relative paths
    train/00000.tar ...           [8 shards x 1500] {key}.jpg/.txt/.json, dense keys 0..N-1
    train/sizes.json
    val/00000.tar, sizes.json     [1000] held-out retrieval pairs, json "captions" [5 per image]
    zeroshot/<NN_colour_shape>/*.jpg   ImageFolder tree over the latent classes [20 per class]
    zeroshot/classnames.txt, templates.txt
    fewshot/catalog.json          {name: {metric, num_classes, multilabel, classes}}
    fewshot/<task>/labels.txt, train.txt, test.txt, train_images.zip, test_images.zip,
                   templates.txt  ELEVATER iris layout; tasks synth-shape, synth-colour,
                                  synth-count, synth-position [20 train, 50 test per class],
                                  digits (scikit-learn's 8x8 digits, upscaled)

Drawing, captions and the few-shot index files are written here by hand: no library draws
captioned shapes; the shard tars come from ``webdataset.TarWriter`` (:mod:`.shards`), the digits
from ``sklearn.datasets.load_digits`` and their split from ``sklearn.model_selection``.
"""
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

from .shards import KEY_WIDTH, CaptionShardWriter, format_key

# ------------------------------------------------------------------------------------------
# Attribute vocabularies. Order matters: the first entries are the most distinct ones and are
# the ones a small class grid uses.
# ------------------------------------------------------------------------------------------
SHAPES = ("circle", "square", "triangle", "star", "cross", "diamond")
COLOURS = ("red", "blue", "green", "yellow", "purple", "orange", "pink", "cyan")
SIZES = ("small", "large")
COUNTS = (1, 2, 3)
POSITIONS = ("top left", "top right", "bottom left", "bottom right", "center")
SCATTERED = "scattered"
BACKGROUNDS = ("grey", "white", "black")
MAX_CLASSES = len(SHAPES) * len(COLOURS)

#: Probability of each count (single objects are the most common, so that position is seen).
COUNT_PROBS = (0.5, 0.25, 0.25)

_RGB = {
    "red": (215, 35, 35), "blue": (35, 75, 225), "green": (35, 165, 55), "yellow": (240, 215, 30),
    "purple": (135, 50, 185), "orange": (245, 135, 25), "pink": (245, 120, 185), "cyan": (30, 200, 215),
}
_BACKGROUND_LEVEL = {"grey": 128, "white": 236, "black": 22}
#: Half-extent of a shape as a fraction of the image side.
_RADIUS = {"small": 0.12, "large": 0.2}
#: Centres (x, y) as fractions of the image side.
_CENTRES = {"top left": (0.25, 0.25), "top right": (0.75, 0.25), "bottom left": (0.25, 0.75),
            "bottom right": (0.75, 0.75), "center": (0.5, 0.5)}
_QUADRANTS = POSITIONS[:4]

# Caption vocabulary: synonyms per attribute value (singular, plural for nouns).
_SHAPE_NOUNS = {
    "circle": (("circle", "circles"), ("disc", "discs")),
    "square": (("square", "squares"),),
    "triangle": (("triangle", "triangles"),),
    "star": (("star", "stars"),),
    "cross": (("cross", "crosses"), ("plus sign", "plus signs")),
    "diamond": (("diamond", "diamonds"), ("rhombus", "rhombi")),
}
_COLOUR_WORDS = {c: (c,) for c in COLOURS} | {"purple": ("purple", "violet"), "cyan": ("cyan", "turquoise")}
_SIZE_WORDS = {"small": ("small", "little", "tiny"), "large": ("large", "big")}
_COUNT_WORDS = {2: ("two", "a pair of"), 3: ("three",)}
_POSITION_PHRASES = {
    "top left": ("in the top left", "in the upper left corner", "at the top left"),
    "top right": ("in the top right", "in the upper right corner", "at the top right"),
    "bottom left": ("in the bottom left", "in the lower left corner", "at the bottom left"),
    "bottom right": ("in the bottom right", "in the lower right corner", "at the bottom right"),
    "center": ("in the center", "in the middle", "at the centre"),
    SCATTERED: ("scattered around", "spread across the picture"),
}
_BACKGROUND_WORDS = {"grey": ("grey", "gray"), "white": ("white",), "black": ("black", "dark")}
_PREFIXES = ("", "", "", "a picture of ", "an image of ", "a drawing of ")
#: Probability that a caption names the size / the position / the background.
_P_SIZE, _P_POSITION, _P_BACKGROUND = 0.8, 0.8, 0.75

#: Zero-shot prompts, in the captions' own words (no article before {c}: "an orange ...").
ZEROSHOT_TEMPLATES = (
    "{c}.", "one {c}.", "a picture of one {c}.", "an image of one {c}.", "there is one {c}.",
    "one small {c}.", "one big {c}.",
)

# Seed-stream ids (the second entry of every SeedSequence).
_STREAM = {"train": 0, "val": 1, "zeroshot": 2, "labels-train": 3, "labels-val": 4,
           "synth-shape": 10, "synth-colour": 11, "synth-count": 12, "synth-position": 13}
# Few-shot train and test images of one task come from disjoint index ranges of its stream.
_TEST_OFFSET = 1 << 30


# ------------------------------------------------------------------------------------------
# Configuration
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SynthConfig:
    """Sizes and knobs of a synthetic data set; see the module docstring for their meaning."""

    seed: int = 0
    image_size: int = 64
    num_classes: int = 10
    class_imbalance: float = 0.0
    train_samples: int = 12000
    val_samples: int = 1000
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
        base = dict(train_samples=256, val_samples=64, shard_size=64, zeroshot_per_class=4,
                    fewshot_train_per_class=5, fewshot_test_per_class=4)
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
            bad("num_classes", f"must be within [2, {MAX_CLASSES}]: the classes are shape x colour "
                               f"combinations and there are {len(SHAPES)} shapes x {len(COLOURS)} colours")
        if not (math.isfinite(self.class_imbalance) and self.class_imbalance >= 0):
            bad("class_imbalance", "must be a finite number >= 0 (0 = balanced classes)")
        if self.train_samples < self.num_classes:
            bad("train_samples", f"must be >= num_classes={self.num_classes}")
        if self.val_samples < 1:
            bad("val_samples", "must be >= 1")
        if self.shard_size < 1:
            bad("shard_size", "must be >= 1")
        if not 1 <= self.captions_per_image <= 20:
            bad("captions_per_image", "must be within [1, 20]")
        if not 1 <= self.val_captions_per_image <= 20:
            bad("val_captions_per_image", "must be within [1, 20]")
        if self.zeroshot_per_class < 1:
            bad("zeroshot_per_class", "must be >= 1")
        if self.fewshot_train_per_class < 5:
            bad("fewshot_train_per_class", "must be >= 5 (the few-shot protocol samples 5 shots per class)")
        if not 1 <= self.fewshot_test_per_class <= 150:
            bad("fewshot_test_per_class", "must be within [1, 150] (the digits have >= 174 images per class, "
                                          "and keep >= 24 for training)")
        if not 1 <= self.jpeg_quality <= 95:
            bad("jpeg_quality", "must be within [1, 95]")
        counts = class_counts(self.train_samples, self.num_classes, self.class_imbalance)
        if counts.min() == 0:
            bad("class_imbalance", f"leaves class {int(np.argmin(counts))} without a training sample "
                                   f"at train_samples={self.train_samples}")


# ------------------------------------------------------------------------------------------
# Classes and their frequencies (pure functions)
# ------------------------------------------------------------------------------------------
def grid_shape(num_classes: int) -> tuple[int, int]:
    """``(n_shapes, n_colours)`` of the class grid for ``num_classes`` classes (module docstring)."""
    if not 1 <= num_classes <= MAX_CLASSES:
        raise ValueError(f"num_classes={num_classes} must be within [1, {MAX_CLASSES}]")
    grids = [(s, c) for s in range(1, len(SHAPES) + 1) for c in range(1, len(COLOURS) + 1)
             if s * c >= num_classes]
    # Fewest unused cells, then most even, then more colours than shapes.
    return min(grids, key=lambda g: (g[0] * g[1] - num_classes, abs(g[0] - g[1]), g[0]))


def class_grid(num_classes: int) -> list[tuple[str, str]]:
    """The latent classes as ``(shape, colour)`` pairs; class ``k`` is entry ``k``."""
    n_shapes, n_colours = grid_shape(num_classes)
    return [(SHAPES[k // n_colours], COLOURS[k % n_colours]) for k in range(num_classes)]


def class_names(num_classes: int) -> list[str]:
    """Human class names, e.g. ``"red circle"``, in label order."""
    return [f"{colour} {shape}" for shape, colour in class_grid(num_classes)]


def class_folders(num_classes: int) -> list[str]:
    """ImageFolder folder names whose sorted order is the label order, e.g. ``"03_yellow_circle"``."""
    width = len(str(num_classes - 1))
    return [f"{k:0{width}d}_{colour}_{shape}" for k, (shape, colour) in enumerate(class_grid(num_classes))]


def class_counts(num_samples: int, num_classes: int, imbalance: float = 0.0) -> np.ndarray:
    """Samples per class: ``p_c ∝ (c + 1)^-imbalance`` rounded by largest remainders (sums to N)."""
    weights = np.arange(1, num_classes + 1, dtype=np.float64) ** -float(imbalance)
    exact = num_samples * weights / weights.sum()
    counts = np.floor(exact).astype(np.int64)
    remainder = num_samples - int(counts.sum())
    # Stable sort: ties go to the lower class index, so the result is deterministic.
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[:remainder]] += 1
    return counts


def tau_plus_from_labels(labels, num_classes: int | None = None) -> float:
    """``tau_plus = sum_c p_c^2``, the probability that two independent draws share a class."""
    labels = np.asarray(labels)
    if labels.size == 0:
        raise ValueError("tau_plus needs at least one label")
    p = np.bincount(labels, minlength=num_classes or 0) / labels.size
    return float(np.sum(p * p))


def same_class_rate_distinct(labels) -> float:
    """``sum_c n_c (n_c - 1) / (N (N - 1))``: same-class rate over pairs of distinct samples."""
    labels = np.asarray(labels)
    if labels.size < 2:
        raise ValueError("the distinct-pair rate needs at least two labels")
    n = np.bincount(labels).astype(np.float64)
    return float(np.sum(n * (n - 1)) / (labels.size * (labels.size - 1)))


def split_labels(seed: int, split: str, num_samples: int, num_classes: int, imbalance: float) -> np.ndarray:
    """The label of every sample of a split: exact class counts, seeded random order."""
    counts = class_counts(num_samples, num_classes, imbalance)
    labels = np.repeat(np.arange(num_classes), counts)
    return np.random.default_rng([seed, _STREAM[f"labels-{split}"]]).permutation(labels)


# ------------------------------------------------------------------------------------------
# One sample: attributes, image, captions
# ------------------------------------------------------------------------------------------
def sample_attributes(rng: np.random.Generator, shape: str, colour: str, **fixed) -> dict:
    """Draw the nuisance attributes (size, count, position, background) for a given class.

    ``fixed`` pins any of them (``count=1`` for a position task, ...). ``position`` is
    ``"scattered"`` whenever ``count > 1``; ``quadrants`` lists where the shapes go.
    """
    unknown = sorted(set(fixed) - {"size", "count", "position", "background"})
    if unknown:
        raise ValueError(f"unknown attribute(s) {unknown}; size, count, position, background can be fixed")
    size = fixed.get("size") or SIZES[rng.integers(len(SIZES))]
    count = fixed.get("count") or int(COUNTS[rng.choice(len(COUNTS), p=COUNT_PROBS)])
    if count == 1:
        position = fixed.get("position") or POSITIONS[rng.integers(len(POSITIONS))]
        quadrants = [position]
    else:
        if fixed.get("position") not in (None, SCATTERED):
            raise ValueError(f"position={fixed['position']!r} needs count=1, got count={count}")
        position = SCATTERED
        quadrants = [_QUADRANTS[q] for q in sorted(rng.choice(4, size=count, replace=False))]
    background = fixed.get("background") or BACKGROUNDS[rng.integers(len(BACKGROUNDS))]
    return {"shape": shape, "colour": colour, "size": size, "count": count, "position": position,
            "background": background, "quadrants": quadrants}


def _outline(shape: str, cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]]:
    """Polygon vertices of a shape centred at (cx, cy) with half-extent r, turned by ``angle``."""
    if shape == "square":
        pts = [(1.1 * math.cos(a), 1.1 * math.sin(a)) for a in np.radians([45, 135, 225, 315])]
    elif shape == "diamond":  # a rhombus, narrower than tall, so that it never looks like a square
        pts = [(0.72 * math.cos(a), 1.12 * math.sin(a)) for a in np.radians([0, 90, 180, 270])]
    elif shape == "triangle":
        pts = [(1.15 * math.cos(a), 1.15 * math.sin(a) + 0.15) for a in np.radians([-90, 30, 150])]
    elif shape == "star":
        pts = [((1.15 if k % 2 == 0 else 0.5) * math.cos(a), (1.15 if k % 2 == 0 else 0.5) * math.sin(a))
               for k, a in enumerate(np.radians(np.arange(10) * 36.0 - 90.0))]
    elif shape == "cross":
        w = 0.36
        pts = [(-w, -1), (w, -1), (w, -w), (1, -w), (1, w), (w, w), (w, 1), (-w, 1), (-w, w), (-1, w),
               (-1, -w), (-w, -w)]
    else:
        raise ValueError(f"unknown shape {shape!r}")
    c, s = math.cos(angle), math.sin(angle)
    return [(cx + r * (x * c - y * s), cy + r * (x * s + y * c)) for x, y in pts]


def draw_image(attrs: dict, image_size: int, rng: np.random.Generator):
    """Render the attributes as an RGB ``PIL.Image`` of side ``image_size``.

    Drawn at ``ss`` times the size and reduced by box averaging (anti-aliased edges); object
    colour, background level, placement, rotation (up to 10 degrees) and pixel noise are
    jittered from ``rng``.
    """
    from PIL import Image, ImageDraw

    ss = max(1, math.ceil(256 / image_size))
    side = image_size * ss
    level = int(np.clip(_BACKGROUND_LEVEL[attrs["background"]] + rng.integers(-10, 11), 0, 255))
    img = Image.new("RGB", (side, side), (level, level, level))
    draw = ImageDraw.Draw(img)
    rgb = tuple(int(v) for v in np.clip(np.array(_RGB[attrs["colour"]]) + rng.integers(-14, 15, 3), 0, 255))
    r = _RADIUS[attrs["size"]] * side
    # The shape stays inside its quadrant (or the central square of the same size).
    slack = max(0.0, 0.25 * side - 1.15 * r - 0.02 * side)
    for where in attrs["quadrants"]:
        fx, fy = _CENTRES[where]
        cx = fx * side + rng.uniform(-slack, slack)
        cy = fy * side + rng.uniform(-slack, slack)
        if attrs["shape"] == "circle":
            draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=rgb)
        else:
            draw.polygon(_outline(attrs["shape"], cx, cy, r, math.radians(rng.uniform(-10, 10))), fill=rgb)
    if ss > 1:
        img = img.reduce(ss)
    pixels = np.asarray(img, dtype=np.int16) + np.rint(rng.normal(0.0, 3.0, (image_size, image_size, 3))).astype(np.int16)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")


def encode_jpeg(image, quality: int) -> bytes:
    """JPEG bytes at a fixed quality, 4:4:4 chroma (colour edges stay sharp at 64 px), no metadata."""
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=quality, subsampling=0, optimize=False)
    return buf.getvalue()


def _pick(rng: np.random.Generator, options):
    return options[rng.integers(len(options))]


def _with_article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def make_caption(attrs: dict, rng: np.random.Generator) -> str:
    """One caption of the attributes in varied words.

    Shape, colour and count are always named; size, position and background each with a
    fixed probability. Five sentence patterns, synonyms per value, optional lead-ins.
    """
    count = attrs["count"]
    singular, plural = _pick(rng, _SHAPE_NOUNS[attrs["shape"]])
    words = [_pick(rng, _COLOUR_WORDS[attrs["colour"]]), singular if count == 1 else plural]
    if rng.random() < _P_SIZE:
        words.insert(0, _pick(rng, _SIZE_WORDS[attrs["size"]]))
    core = " ".join(words)
    if count == 1:
        obj = "one " + core if rng.random() < 0.3 else _with_article(core)
    else:
        obj = _pick(rng, _COUNT_WORDS[count]) + " " + core
    pos = _pick(rng, _POSITION_PHRASES[attrs["position"]]) if rng.random() < _P_POSITION else ""
    bg = _pick(rng, _BACKGROUND_WORDS[attrs["background"]]) if rng.random() < _P_BACKGROUND else ""
    pattern = int(rng.integers(5))
    if pattern == 1 and not bg:
        pattern = 0
    if pattern == 3 and not pos:
        pattern = 2
    sp_pos = " " + pos if pos else ""
    if pattern == 0:
        bg_on = f" on {_with_article(bg)} background" if bg else ""
        text = f"{_pick(rng, _PREFIXES)}{obj}{sp_pos}{bg_on}"
    elif pattern == 1:
        text = f"{_with_article(bg)} background with {obj}{sp_pos}"
    elif pattern == 2:
        bg_on = f" on {_with_article(bg)} background" if bg else ""
        verb = "is" if count == 1 or obj.startswith("a pair") else "are"
        text = f"there {verb} {obj}{sp_pos}{bg_on}"
    elif pattern == 3:
        bg_on = f" on {_with_article(bg)} background" if bg else ""
        text = f"{pos}, {obj}{bg_on}"
    else:
        bg_against = f" against {_with_article(bg)} {_pick(rng, ('backdrop', 'background'))}" if bg else ""
        text = f"{_pick(rng, _PREFIXES)}{obj}{bg_against}{sp_pos}"
    return text


def make_captions(attrs: dict, rng: np.random.Generator, k: int) -> list[str]:
    """``k`` captions of one image, distinct where the vocabulary allows (a few redraws)."""
    captions: list[str] = []
    for _ in range(k):
        text = make_caption(attrs, rng)
        for _retry in range(8):
            if text not in captions:
                break
            text = make_caption(attrs, rng)
        captions.append(text)
    return captions


def render_sample(seed: int, stream: str | int, index: int, shape: str, colour: str, image_size: int,
                  num_captions: int = 0, **fixed) -> tuple[object, dict, list[str]]:
    """Image, attributes and captions of sample ``index`` of a seed stream (pure: same in, same out)."""
    stream_id = _STREAM[stream] if isinstance(stream, str) else int(stream)
    rng = np.random.default_rng([seed, stream_id, index])
    attrs = sample_attributes(rng, shape, colour, **fixed)
    image = draw_image(attrs, image_size, rng)
    captions = make_captions(attrs, rng, num_captions) if num_captions else []
    return image, attrs, captions


# ------------------------------------------------------------------------------------------
# Writers for each part of the layout
# ------------------------------------------------------------------------------------------
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


def _write_shards(directory: Path, split: str, labels: np.ndarray, cfg: SynthConfig, num_captions: int,
                  verbose: bool) -> dict:
    grid = class_grid(cfg.num_classes)
    width = max(KEY_WIDTH, len(str(len(labels) - 1)))
    progress = _Progress(verbose, f"{split} shards", len(labels))
    with CaptionShardWriter(directory, cfg.shard_size) as writer:
        for i, label in enumerate(labels):
            shape, colour = grid[label]
            image, attrs, captions = render_sample(cfg.seed, split, i, shape, colour, cfg.image_size, num_captions)
            meta = {"label": int(label), "classname": f"{colour} {shape}", **_public_attrs(attrs),
                    "captions": captions, "width": cfg.image_size, "height": cfg.image_size}
            writer.write(format_key(i, width), encode_jpeg(image, cfg.jpeg_quality), captions[0], meta)
            progress.update(i + 1)
    return {"dir": directory.name, "pattern": f"{directory.name}/{Path(writer.pattern).name}",
            "num_samples": writer.num_samples, "num_shards": len(writer.sizes),
            "captions_per_image": num_captions, "key_scheme": "dense", "key_width": width}


def _write_zeroshot(directory: Path, cfg: SynthConfig, verbose: bool) -> dict:
    grid = class_grid(cfg.num_classes)
    folders = class_folders(cfg.num_classes)
    progress = _Progress(verbose, "zero-shot images", cfg.num_classes * cfg.zeroshot_per_class)
    done = 0
    for label, ((shape, colour), folder) in enumerate(zip(grid, folders)):
        (directory / folder).mkdir(parents=True)
        for j in range(cfg.zeroshot_per_class):
            image, _, _ = render_sample(cfg.seed, "zeroshot", label * cfg.zeroshot_per_class + j, shape, colour,
                                        cfg.image_size)
            (directory / folder / f"{j:05d}.jpg").write_bytes(encode_jpeg(image, cfg.jpeg_quality))
            done += 1
            progress.update(done)
    (directory / "classnames.txt").write_text("\n".join(class_names(cfg.num_classes)) + "\n")
    (directory / "templates.txt").write_text("\n".join(ZEROSHOT_TEMPLATES) + "\n")
    return {"dir": directory.name, "num_classes": cfg.num_classes, "num_images": done,
            "classnames": f"{directory.name}/classnames.txt", "templates": f"{directory.name}/templates.txt"}


def _zip_stored(path: Path, files: list[tuple[str, bytes]]) -> None:
    """An uncompressed zip (ELEVATER reads images out of it) with fixed dates and modes."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, data in files:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.create_system = 3  # as on Unix, whatever the platform
            zf.writestr(info, data)


def _write_iris(directory: Path, labels_txt: list[str], templates: list[str],
                splits: dict[str, list[tuple[str, bytes, int]]]) -> None:
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
    """Class names of each synthetic few-shot task over the attributes the classes use.

    Shape and colour tasks cover the shapes and colours present in the class grid (a task
    with fewer than two values is left out); count and position cover all their values.
    """
    grid = class_grid(num_classes)
    shapes = [s for s in SHAPES if any(s == g[0] for g in grid)]
    colours = [c for c in COLOURS if any(c == g[1] for g in grid)]
    tasks = {"synth-shape": shapes, "synth-colour": colours,
             "synth-count": ["one", "two", "three"], "synth-position": list(POSITIONS)}
    return {name: values for name, values in tasks.items() if len(values) >= 2}


def _fewshot_item(cfg: SynthConfig, task: str, index: int, value_index: int, values: list[str],
                  shapes: list[str], colours: list[str]) -> bytes:
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
        for split, per_class, offset in (("train", cfg.fewshot_train_per_class, 0),
                                         ("test", cfg.fewshot_test_per_class, _TEST_OFFSET)):
            # Class-interleaved order (0, 1, ..., C-1, 0, 1, ...) so that files do not sort by class.
            items = []
            for n in range(per_class * len(values)):
                label = n % len(values)
                data = _fewshot_item(cfg, task, offset + n, label, values, shapes, colours)
                items.append((f"{n:06d}.jpg", data, label))
            splits[split] = items
        _write_iris(directory / task, values, list(_FEWSHOT_TEMPLATES[task]), splits)
        catalog[task] = {"metric": "accuracy", "num_classes": len(values), "multilabel": False,
                         "classes": values, "train": len(splits["train"]), "test": len(splits["test"])}
        if verbose:
            print(f"[synth] few-shot {task}: {len(values)} classes, {len(splits['train'])} train, "
                  f"{len(splits['test'])} test", flush=True)
    catalog["digits"] = _write_digits(directory / "digits", cfg)
    if verbose:
        d = catalog["digits"]
        print(f"[synth] few-shot digits: 10 classes, {d['train']} train, {d['test']} test", flush=True)
    (directory / "catalog.json").write_text(json.dumps(catalog, indent=1) + "\n")
    return {"dir": directory.name, "catalog": f"{directory.name}/catalog.json", "datasets": catalog}


@functools.lru_cache(maxsize=2)
def _digit_images(image_size: int) -> tuple[tuple[bytes, ...], np.ndarray]:
    """PNG bytes of every scikit-learn digit upscaled to ``image_size`` RGB, and the targets.

    Cached: they depend on the size only, and encoding 1797 PNGs is most of a small set's time.
    """
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
    """scikit-learn's 8x8 digits, upscaled to ``image_size`` RGB PNGs.

    A stratified test split of ``10 * fewshot_test_per_class`` images (about that many per class),
    the rest, unbalanced as the digit classes are, for training.
    """
    from sklearn.model_selection import train_test_split

    encoded, target = _digit_images(cfg.image_size)
    idx_train, idx_test = train_test_split(np.arange(len(target)), test_size=10 * cfg.fewshot_test_per_class,
                                           stratify=target, random_state=cfg.seed % (2**32))
    splits = {split: [(f"{n:06d}.png", encoded[i], int(target[i])) for n, i in enumerate(sorted(idx))]
              for split, idx in (("train", idx_train), ("test", idx_test))}
    _write_iris(directory, list(DIGIT_NAMES), list(_DIGIT_TEMPLATES), splits)
    # The training split is unbalanced (the digit classes are), hence mean per-class accuracy.
    return {"metric": "mean_per_class", "num_classes": 10, "multilabel": False, "classes": list(DIGIT_NAMES),
            "train": len(splits["train"]), "test": len(splits["test"])}


# ------------------------------------------------------------------------------------------
# Entry point
# ------------------------------------------------------------------------------------------
_OUTPUTS = ("summary.json", "train", "val", "zeroshot", "fewshot")


def generate(out_dir, config: SynthConfig | None = None, *, quick: bool = False, overwrite: bool = False,
             reuse: bool = False, verbose: bool = True, **overrides) -> dict:
    """Write the whole synthetic data set under ``out_dir``; return its summary.

    Args:
        out_dir: output folder (created).
        config: a :class:`SynthConfig`; default ``SynthConfig()`` (``SynthConfig.quick()`` with
            ``quick=True``). ``overrides`` replace single fields, e.g. ``num_classes=5``.
        overwrite: remove earlier outputs (only the names this function writes) first.
        reuse: when ``out_dir/summary.json`` exists with the same config, return it untouched.
        verbose: print progress lines.

    Returns:
        The content of ``summary.json`` (paths relative to ``out_dir``) plus ``out_dir``,
        ``train_data`` / ``val_data`` (absolute brace patterns for OpenCLIP) and ``seconds``.

    Raises:
        ValueError: a bad config value (named), or an unknown override.
        FileExistsError: earlier outputs in ``out_dir`` and neither ``overwrite`` nor a reusable summary.
    """
    base = config if config is not None else (SynthConfig.quick() if quick else SynthConfig())
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(SynthConfig)})
    if unknown:
        raise ValueError(f"unknown synthetic data option(s) {unknown}")
    cfg = dataclasses.replace(base, **overrides)
    cfg.validate()
    # Plain Python numbers from here on (numpy integers would not serialise to summary.json).
    cfg = SynthConfig(**{f.name: (float if f.type in ("float", float) else int)(getattr(cfg, f.name))
                         for f in dataclasses.fields(cfg)})
    out = Path(out_dir)
    existing = [name for name in _OUTPUTS if (out / name).exists()]
    if existing and reuse and (out / "summary.json").exists():
        summary = json.loads((out / "summary.json").read_text())
        if summary.get("config") == dataclasses.asdict(cfg):
            if verbose:
                print(f"[synth] reusing {out} (same config)", flush=True)
            return _with_paths(summary, out, seconds=0.0)
    if existing and not overwrite:
        raise FileExistsError(f"{str(out)!r} already holds {existing}; pass overwrite=True (--overwrite) "
                              f"to replace them")
    for name in existing:
        path = out / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    out.mkdir(parents=True, exist_ok=True)

    start = time.perf_counter()
    if verbose:
        n_s, n_c = grid_shape(cfg.num_classes)
        print(f"[synth] {cfg.num_classes} classes ({n_s} shapes x {n_c} colours grid), seed {cfg.seed}, "
              f"{cfg.image_size}x{cfg.image_size} -> {out}", flush=True)
    train_labels = split_labels(cfg.seed, "train", cfg.train_samples, cfg.num_classes, cfg.class_imbalance)
    val_labels = split_labels(cfg.seed, "val", cfg.val_samples, cfg.num_classes, cfg.class_imbalance)
    train = _write_shards(out / "train", "train", train_labels, cfg, cfg.captions_per_image, verbose)
    val = _write_shards(out / "val", "val", val_labels, cfg, cfg.val_captions_per_image, verbose)
    zeroshot = _write_zeroshot(out / "zeroshot", cfg, verbose)
    fewshot = _write_fewshot(out / "fewshot", cfg, verbose)

    tau_plus = tau_plus_from_labels(train_labels, cfg.num_classes)
    summary = {
        "format": "clip-dcl-synth/1",
        "config": dataclasses.asdict(cfg),
        "classes": {"names": class_names(cfg.num_classes), "folders": class_folders(cfg.num_classes),
                    "shapes": sorted({s for s, _ in class_grid(cfg.num_classes)}, key=SHAPES.index),
                    "colours": sorted({c for _, c in class_grid(cfg.num_classes)}, key=COLOURS.index),
                    "train_counts": np.bincount(train_labels, minlength=cfg.num_classes).tolist()},
        "tau_plus": tau_plus,
        "same_class_rate_distinct_pairs": same_class_rate_distinct(train_labels),
        "attributes": {"shape": list(SHAPES), "colour": list(COLOURS), "size": list(SIZES),
                       "count": list(COUNTS), "position": list(POSITIONS) + [SCATTERED],
                       "background": list(BACKGROUNDS)},
        "train": train,
        "val": val,
        "zeroshot": zeroshot,
        "fewshot": fewshot,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    seconds = time.perf_counter() - start
    if verbose:
        print(f"[synth] tau_plus = sum_c p_c^2 = {tau_plus:.6f} (1/C = {1 / cfg.num_classes:.6f}); "
              f"{train['num_samples']} train / {val['num_samples']} val samples in {seconds:.1f} s", flush=True)
    return _with_paths(summary, out, seconds)


def _with_paths(summary: dict, out: Path, seconds: float) -> dict:
    out = out.resolve()
    return {**summary, "out_dir": str(out), "train_data": str(out / summary["train"]["pattern"]),
            "val_data": str(out / summary["val"]["pattern"]), "seconds": seconds}


__all__ = [
    "SynthConfig", "generate", "class_grid", "class_names", "class_folders", "class_counts", "grid_shape",
    "tau_plus_from_labels", "same_class_rate_distinct", "split_labels", "sample_attributes", "draw_image",
    "make_caption", "make_captions", "render_sample", "encode_jpeg", "fewshot_tasks", "SHAPES", "COLOURS",
    "SIZES", "COUNTS", "POSITIONS", "BACKGROUNDS", "ZEROSHOT_TEMPLATES", "DIGIT_NAMES", "MAX_CLASSES",
]
