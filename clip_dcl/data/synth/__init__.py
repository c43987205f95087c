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
n_colours)`` (`class_grid`). When ``C`` factors as ``n_shapes * n_colours`` with
``n_shapes <= 6``, ``n_colours <= 8``, the most even factorisation is used (ties: more colours,
since colour is the quicker attribute to learn); otherwise the smallest most even grid with more
than ``C`` cells is filled row by row and its last cells stay unused. Size, count, position and
background vary within a class. Class frequencies are balanced (``class_imbalance = 0``) or
Zipf-like, ``p_c ∝ (c + 1)^-class_imbalance``, rounded to counts by largest remainders.

**Share of same-class negatives.** For two samples drawn independently from the training split,
``P(same class) = tau_plus = sum_c p_c^2`` with ``p_c = n_c / N`` the empirical class shares
(``1 / C`` when balanced); this is DCL's class prior ``tau_plus``. It is computed from the labels
written (`tau_plus_from_labels`), printed, and stored in ``summary.json``, together with the
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
    val/00000.tar, sizes.json     [1000] validation retrieval pairs, json "captions" [5 per image]
    test/00000.tar, sizes.json    [0: none] test retrieval pairs (--test-samples), like val/
    zeroshot_test/...             with --test-samples: a second zero-shot tree, like zeroshot/
    zeroshot/<NN_colour_shape>/*.jpg   ImageFolder tree over the latent classes [20 per class]
    zeroshot/classnames.txt, templates.txt
    fewshot/catalog.json          {name: {metric, num_classes, multilabel, classes}}
    fewshot/<task>/labels.txt, train.txt, test.txt, train_images.zip, test_images.zip,
                   templates.txt  ELEVATER iris layout; tasks synth-shape, synth-colour,
                                  synth-count, synth-position [20 train, 50 test per class],
                                  digits (scikit-learn's 8x8 digits, upscaled)

Drawing, captions and the few-shot index files are written in this package by hand: no library
draws captioned shapes; the shard tars come from ``webdataset.TarWriter``
(`clip_dcl.data.shards`), the digits from ``sklearn.datasets.load_digits`` and their split
from ``sklearn.model_selection``.

One module a reason to change, every public name importable from here: `.attributes` (the
latent attributes, the class grid and its frequencies), `.render` (the image and its JPEG
bytes), `.captions` (the words), `.layout` (the configuration, the files written and
`generate`).
"""
from __future__ import annotations

from .attributes import (BACKGROUNDS, COLOURS, COUNT_PROBS, COUNTS, MAX_CLASSES, POSITIONS, SCATTERED, SHAPES, SIZES,
                         class_counts, class_folders, class_grid, class_names, grid_shape, same_class_rate_distinct,
                         sample_attributes, tau_plus_from_labels)
from .captions import ZEROSHOT_TEMPLATES, make_caption, make_captions
from .layout import DIGIT_NAMES, SynthConfig, fewshot_tasks, generate, render_sample, split_labels
from .render import draw_image, encode_jpeg

__all__ = [
    "SynthConfig", "generate", "class_grid", "class_names", "class_folders", "class_counts", "grid_shape",
    "tau_plus_from_labels", "same_class_rate_distinct", "split_labels", "sample_attributes", "draw_image",
    "make_caption", "make_captions", "render_sample", "encode_jpeg", "fewshot_tasks", "SHAPES", "COLOURS",
    "SIZES", "COUNTS", "POSITIONS", "BACKGROUNDS", "ZEROSHOT_TEMPLATES", "DIGIT_NAMES", "MAX_CLASSES",
    "SCATTERED", "COUNT_PROBS",
]
