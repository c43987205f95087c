"""Synthetic image-caption data with latent classes: clip-dcl's embedded default data.

One to three flat shapes an image, captioned in varied words ("a small red circle in the top left on a grey
background"); a class is a (shape, colour) pair (`class_grid`), with shares ``p_c ∝ (c + 1)^-class_imbalance``.
Sample ``i`` of a split draws from ``default_rng([seed, split, i])``: nothing depends on the clock or path.
Under ``OUT_DIR``::

    summary.json                  config, classes, tau_plus, sizes, relative paths
    train/00000.tar ...           [8 shards x 1500] {key}.jpg/.txt/.json, dense keys 0..N-1
    val/, test/                   retrieval pairs, json "captions" [5 per image]; test with --test-samples
    zeroshot/, zeroshot_test/     ImageFolder trees over the latent classes
    fewshot/                      ELEVATER iris layout: synth-shape, -colour, -count, -position, digits

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
