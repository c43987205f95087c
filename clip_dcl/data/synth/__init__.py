"""Synthetic image-caption data with latent classes: clip-dcl's embedded default data.

Every image shows one to three flat shapes drawn with PIL; its caption names them in varied words
("a small red circle in the top left on a grey background"). A class is a (shape, colour) pair:
shape (6 values) and colour (8) make the class grid (`class_grid`); size, count, position and
background are nuisances. Class shares are balanced or Zipf-like, ``p_c ∝ (c + 1)^-class_imbalance``;
DCL's class prior ``tau_plus = sum_c p_c^2`` is computed from the labels and stored in ``summary.json``.

Sample ``i`` of a split draws from ``numpy.random.default_rng([seed, split, i])``, and nothing
written depends on the clock or the output path. Under ``OUT_DIR``::

    summary.json                  config, classes, tau_plus, sizes, relative paths
    train/00000.tar ...           [8 shards x 1500] {key}.jpg/.txt/.json, dense keys 0..N-1
    val/, test/                   retrieval pairs, json "captions" [5 per image]; test with --test-samples
    zeroshot/, zeroshot_test/     ImageFolder trees over the latent classes
    fewshot/                      ELEVATER iris layout: synth-shape, -colour, -count, -position, digits

Submodules: `.attributes`, `.render`, `.captions`, `.layout` (`generate`).
"""

from __future__ import annotations

# ruff: noqa: F401 (the imports below are the package's names)
from .attributes import (
    BACKGROUNDS,
    COLOURS,
    COUNT_PROBS,
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
from .captions import ZEROSHOT_TEMPLATES, make_caption, make_captions
from .layout import DIGIT_NAMES, SynthConfig, fewshot_tasks, generate, render_sample, split_labels
from .render import draw_image, encode_jpeg
