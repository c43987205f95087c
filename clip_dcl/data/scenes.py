"""Scenes of Fashion-MNIST photographs (``clip-dcl data fashion-scenes``): ``clip_dcl.data.fashion``'s layout, each
image a ``grid`` x ``grid`` canvas holding 2-4 captioned items ("a faint coat on the top left and a small wide
sneaker at the bottom right."). Two scenes match only when the same kinds of item sit in the same cells: thousands
of latent classes, negatives from easy to hard (ten classes give mostly easy ones).

Validation scenes use only the ``holdout`` training images, training scenes the others, test scenes the official
test images; validation and test captions are distinct within their split (one right answer per query). The
zero-shot and few-shot class is the item on the top left.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np

from . import fashion
from .fashion import ATTRIBUTE_WORDS, CLASSNAMES, DEBIAN_DIR
from .synth.captions import with_article

#: cell names of each grid, row by row
POSITIONS = {
    2: ("top left", "top right", "bottom left", "bottom right"),
    3: (
        "top left",
        "top centre",
        "top right",
        "centre left",
        "centre",
        "centre right",
        "bottom left",
        "bottom centre",
        "bottom right",
    ),
}
#: how an item is put in its cell
PREPOSITIONS = ("on the", "at the")
#: caption templates: {s} the items named, joined with commas and "and"
SCENE_TEMPLATES = ("{s}.", "a picture of {s}.", "a scene with {s}.", "{s}, on a black background.")
#: zero-shot prompts: the class of the item on the top left
ZEROSHOT_TEMPLATES = ("{c} on the top left.", "{c} at the top left.", "a scene with {c} on the top left.")
FEWSHOT_TEMPLATES = ("{c} on the top left.", "a picture of {c} on the top left.")
_STREAMS = {"scenes-train": 11, "scenes-val": 12, "scenes-test": 13, "fewshot": 14}
_TRIES = 1000


@dataclass(frozen=True)
class ScenesConfig:
    """Sizes of a scene layout (``clip-dcl data fashion-scenes --help`` describes each)."""

    seed: int = 0
    image_size: int = 32
    grid: int = 2
    min_items: int = 2
    max_items: int = 4
    min_attributes: int = 1
    max_attributes: int = 2
    holdout: int = 5000
    train_samples: int = 20000
    val_samples: int = 2000
    test_samples: int = 2000
    captions_per_image: int = 5
    val_captions_per_image: int = 1
    shard_size: int = 5000
    fewshot_train_per_class: int = 20
    fewshot_test_per_class: int = 50

    def validate(self, n_train: int, n_classes: int) -> None:
        """Raise ``ValueError`` naming the first bad value (its flag)."""

        def bad(field, why):
            raise ValueError(f"--{field.replace('_', '-')} {getattr(self, field)!r}: {why}")

        if self.seed < 0:
            bad("seed", "must be >= 0")
        if self.grid not in POSITIONS:
            bad("grid", f"must be one of {sorted(POSITIONS)}")
        if not 4 * self.grid <= self.image_size <= 512:
            bad("image_size", f"must be within [{4 * self.grid}, 512] pixels (cells of at least 4 pixels)")
        if not 1 <= self.min_items <= self.max_items:
            bad("min_items", f"must be within [1, --max-items {self.max_items}]")
        if self.max_items > self.grid**2:
            bad("max_items", f"must be at most {self.grid**2} (the cells of a {self.grid} x {self.grid} grid)")
        if not 0 <= self.min_attributes <= self.max_attributes:
            bad("min_attributes", f"must be within [0, --max-attributes {self.max_attributes}]")
        if self.max_attributes > len(ATTRIBUTE_WORDS):
            bad("max_attributes", f"must be at most {len(ATTRIBUTE_WORDS)} (the attributes measured)")
        if not self.max_items <= self.holdout < n_train:
            bad(
                "holdout", f"must be within [{self.max_items}, {n_train - 1}] (the official training set has {n_train})"
            )
        for field in ("train_samples", "val_samples", "test_samples", "shard_size"):
            if getattr(self, field) < 1:
                bad(field, "must be >= 1")
        for field in ("captions_per_image", "val_captions_per_image"):
            if not 1 <= getattr(self, field) <= 20:
                bad(field, "must be within [1, 20]")
        if self.fewshot_train_per_class < 5:
            bad("fewshot_train_per_class", "must be >= 5 (the few-shot protocol samples 5 shots per class)")
        if self.fewshot_test_per_class < 1:
            bad("fewshot_test_per_class", "must be >= 1")
        for field, split in (("fewshot_train_per_class", "val_samples"), ("fewshot_test_per_class", "test_samples")):
            if getattr(self, field) * n_classes > getattr(self, split):
                bad(
                    field,
                    f"needs {getattr(self, field) * n_classes} scenes, more than --{split.replace('_', '-')} "
                    f"{getattr(self, split)}",
                )


def draw_scene(rng: np.random.Generator, pool_size: int, cfg: ScenesConfig) -> List[Tuple[int, int]]:
    """``[(cell, item), ...]`` in cell order: cell 0 and random others, each a distinct item below ``pool_size``."""
    n = int(rng.integers(cfg.min_items, cfg.max_items + 1))
    cells = [0, *(1 + rng.permutation(cfg.grid**2 - 1)[: n - 1])]
    items = rng.choice(pool_size, size=n, replace=False)
    return sorted((int(c), int(i)) for c, i in zip(cells, items))


def item_phrase(
    classname: str, bins: Dict[str, int], position: str, cfg: ScenesConfig, rng: np.random.Generator
) -> str:
    """ "a small wide sneaker on the bottom right": the class with some of its attribute words, and its cell."""
    names = list(ATTRIBUTE_WORDS)
    k = int(rng.integers(cfg.min_attributes, cfg.max_attributes + 1))
    words = []
    for j in rng.permutation(len(names))[:k]:
        options = ATTRIBUTE_WORDS[names[j]][int(bins[names[j]])]
        words.append(options[int(rng.integers(len(options)))])
    return (
        f"{with_article(' '.join([*words, classname]))} {PREPOSITIONS[int(rng.integers(len(PREPOSITIONS)))]} {position}"
    )


def scene_caption(items: Sequence[Tuple[str, Dict[str, int], str]], cfg: ScenesConfig, rng: np.random.Generator) -> str:
    """One caption: every item (``(classname, bins, position)``) in a random order, in a random template."""
    phrases = [item_phrase(*items[k], cfg, rng) for k in rng.permutation(len(items))]
    joined = phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]
    return SCENE_TEMPLATES[int(rng.integers(len(SCENE_TEMPLATES)))].format(s=joined)


def scene_words() -> List[str]:
    """Every word the scenes write, lower case and sorted: the ``clip-dcl-micro-fscenes`` tokenizer's vocabulary."""
    texts = [*CLASSNAMES, *SCENE_TEMPLATES, *ZEROSHOT_TEMPLATES, *FEWSHOT_TEMPLATES, *PREPOSITIONS, "a", "an", "and"]
    texts += [p for cells in POSITIONS.values() for p in cells]
    texts += [w for bins in ATTRIBUTE_WORDS.values() for words in bins for w in words]
    return sorted({w.lower() for t in texts for w in re.findall(r"[^\W\d_]+", t.replace("{s}", "").replace("{c}", ""))})


def shrink(images: np.ndarray, size: int) -> np.ndarray:
    """Grey images resized to ``size`` x ``size`` (PIL's bilinear filter, which averages when shrinking)."""
    from PIL import Image

    if images.shape[1:] == (size, size):
        return images
    return np.stack([np.asarray(Image.fromarray(im, "L").resize((size, size), Image.BILINEAR)) for im in images])


def canvas(cells: np.ndarray, scene: Sequence[Tuple[int, int]], cfg: ScenesConfig) -> np.ndarray:
    """The scene's grey image: each item's shrunk photograph (``cells[item]``) in its cell, on black."""
    out = np.zeros((cfg.image_size, cfg.image_size), dtype=np.uint8)
    side = cells.shape[1]
    for cell, item in scene:
        r, c = divmod(cell, cfg.grid)
        out[r * side : (r + 1) * side, c * side : (c + 1) * side] = cells[item]
    return out


def _compose(images, labels, cuts, cfg: ScenesConfig, count: int, per_image: int, stream: str, distinct: bool):
    """``count`` scenes of one split: their canvases, top-left labels, scene-class ids, captions and metadata."""
    rng = np.random.default_rng([cfg.seed, _STREAMS[stream]])
    bins = fashion.attribute_bins(images, cuts)
    cells = shrink(images, cfg.image_size // cfg.grid)
    positions = POSITIONS[cfg.grid]
    seen: set = set()
    out = {
        "canvas": np.zeros((count, cfg.image_size, cfg.image_size), np.uint8),
        "label": np.zeros(count, np.int64),
        "scene_class": [],
        "captions": [],
        "meta": [],
    }
    for n in range(count):
        for _ in range(_TRIES):
            scene = draw_scene(rng, len(images), cfg)
            items = [(CLASSNAMES[labels[i]], {k: int(v[i]) for k, v in bins.items()}, positions[c]) for c, i in scene]
            caps = [scene_caption(items, cfg, rng) for _ in range(per_image)]
            if not distinct or not seen & set(caps):
                break
        else:
            raise ValueError(
                f"could not draw {count} scenes with distinct captions in {stream}: lower the samples "
                "or raise --max-items / --max-attributes"
            )
        seen.update(caps)
        out["canvas"][n] = canvas(cells, scene, cfg)
        out["label"][n] = labels[scene[0][1]]
        out["scene_class"].append(tuple((c, int(labels[i])) for c, i in scene))
        out["captions"].append(caps)
        out["meta"].append(
            {
                "label": int(labels[scene[0][1]]),
                "classname": CLASSNAMES[labels[scene[0][1]]],
                "captions": caps,
                "width": cfg.image_size,
                "height": cfg.image_size,
                "items": [
                    {"position": p, "label": int(labels[i]), "classname": name, "attributes": b}
                    for (name, b, p), (_, i) in zip(items, scene)
                ],
            }
        )
    return out


_OUTPUTS = ("summary.json", "train", "val", "test", "zeroshot", "zeroshot_test", "fewshot", "train.npz")


def generate(
    out_dir,
    source: str | os.PathLike = DEBIAN_DIR,
    *,
    overwrite: bool = False,
    reuse: bool = False,
    verbose: bool = True,
    **overrides,
) -> dict:
    """Write the scenes under ``out_dir`` from the IDX files in ``source`` (``overrides``: `ScenesConfig` fields);
    the summary, raising as ``fashion.generate`` does."""
    from .synth.attributes import same_class_rate_distinct, tau_plus_from_labels
    from .synth.layout import configured, finish, prepare_out

    cfg = configured(ScenesConfig(), overrides, "fashion-scenes")
    data = fashion.load_idx_set(source)
    n_classes = int(max(data["train_labels"].max(), data["test_labels"].max())) + 1
    if n_classes != len(CLASSNAMES):
        raise ValueError(
            f"labels 0..{n_classes - 1} in {source}: the scenes name Fashion-MNIST's {len(CLASSNAMES)} classes"
        )
    n_train, n_test = len(data["train_labels"]), len(data["test_labels"])
    cfg.validate(n_train, n_classes)
    out = Path(out_dir)
    record = fashion.source_record(cfg, CLASSNAMES, source, data)
    summary = prepare_out(out, record, _OUTPUTS, reuse, overwrite, verbose, "fashion-scenes")
    if summary is not None:
        return summary
    start = time.perf_counter()
    val_idx, train_idx = fashion.holdout(cfg.seed, n_train, cfg.holdout)
    pools = {
        "train": (data["train_images"][train_idx], data["train_labels"][train_idx]),
        "val": (data["train_images"][val_idx], data["train_labels"][val_idx]),
        "test": (data["test_images"], data["test_labels"]),
    }
    cuts = fashion.attribute_cuts(data["train_images"])
    if verbose:
        print(
            f"[fashion-scenes] draw {cfg.seed}: {cfg.train_samples} training scenes of {len(train_idx)} images, "
            f"{cfg.val_samples} validation scenes of {len(val_idx)} held-out images, {cfg.test_samples} test scenes "
            f"of the {n_test} official test images; {cfg.min_items}-{cfg.max_items} items on a {cfg.grid} x "
            f"{cfg.grid} grid at {cfg.image_size} px -> {out}",
            flush=True,
        )
    scenes, parts = {}, {}
    for split, count, per_image in (
        ("train", cfg.train_samples, cfg.captions_per_image),
        ("val", cfg.val_samples, cfg.val_captions_per_image),
        ("test", cfg.test_samples, cfg.val_captions_per_image),
    ):
        s = scenes[split] = _compose(*pools[split], cuts, cfg, count, per_image, f"scenes-{split}", split != "train")
        samples = (
            (fashion._png(c, cfg.image_size), caps, meta)
            for c, caps, meta in zip(s["canvas"], s["captions"], s["meta"])
        )
        parts[split] = fashion.write_pairs(out / split, samples, count, cfg.shard_size, "fashion-scenes", verbose)
    folders = {"val": "zeroshot", "test": "zeroshot_test"}
    sets = {k: (scenes[k]["canvas"], scenes[k]["label"]) for k in folders}
    for split, folder in folders.items():
        parts[folder] = fashion.write_tree(out / folder, *sets[split], CLASSNAMES, cfg.image_size, ZEROSHOT_TEMPLATES)
    parts["fewshot"] = fashion.write_fewshot(
        out / "fewshot",
        sets,
        CLASSNAMES,
        cfg,
        stream=_STREAMS["fewshot"],
        task="fashion-scenes",
        templates=FEWSHOT_TEMPLATES,
    )
    kinds = {k: i for i, k in enumerate(sorted(set(scenes["train"]["scene_class"])))}
    scene_ids = np.array([kinds[k] for k in scenes["train"]["scene_class"]])
    summary = {
        "format": "clip-dcl-idx-scenes/1",
        **record,
        "classes": {
            "names": list(CLASSNAMES),
            "folders": fashion.class_folders(CLASSNAMES),
            "zeroshot": "the class of the item on the top left",
            "train_counts": np.bincount(scenes["train"]["label"], minlength=n_classes).tolist(),
            "distinct_train_captions": parts["train"]["distinct_captions"],
        },
        "positions": list(POSITIONS[cfg.grid]),
        "attribute_cuts": cuts,
        "attribute_words": {k: [list(b) for b in v] for k, v in ATTRIBUTE_WORDS.items()},
        # scene classes: the same kinds of item in the same cells (attributes aside)
        "scene_classes": len(kinds),
        "tau_plus": tau_plus_from_labels(scene_ids, len(kinds)),
        "same_class_rate_distinct_pairs": same_class_rate_distinct(scene_ids),
        **parts,
    }
    line = (
        f"[fashion-scenes] {len(kinds)} scene classes (kinds of item per cell) among the training scenes, "
        f"tau_plus = {summary['tau_plus']:.5f}; "
    )
    return finish(out, summary, start, verbose, line)
