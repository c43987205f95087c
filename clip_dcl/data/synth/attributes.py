"""The latent attributes of a synthetic sample and the classes made of them (shape x colour), with ``tau_plus``."""

from __future__ import annotations

import numpy as np

# Attribute vocabularies. Order matters: the first entries are the most distinct ones and are
# the ones a small class grid uses.
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
_QUADRANTS = POSITIONS[:4]


def grid_shape(num_classes: int) -> tuple[int, int]:
    """``(n_shapes, n_colours)`` of the class grid for ``num_classes`` classes, the most even that fits."""
    if not 1 <= num_classes <= MAX_CLASSES:
        raise ValueError(f"num_classes={num_classes} must be within [1, {MAX_CLASSES}]")
    grids = [(s, c) for s in range(1, len(SHAPES) + 1) for c in range(1, len(COLOURS) + 1) if s * c >= num_classes]
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


def sample_attributes(rng: np.random.Generator, shape: str, colour: str, **fixed) -> dict:
    """Draw the nuisance attributes for a class; ``fixed`` pins any of them (``position`` is ``"scattered"`` when
    ``count > 1``)."""
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
    return {
        "shape": shape,
        "colour": colour,
        "size": size,
        "count": count,
        "position": position,
        "background": background,
        "quadrants": quadrants,
    }
