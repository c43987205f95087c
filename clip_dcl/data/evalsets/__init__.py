"""Readers for the evaluation data sets, each layout checked in full before any image is decoded (a bad path fails
in seconds, naming it, not an hour into encoding).
"""

from __future__ import annotations

from ..skips import SKIP_CAUSES, SampleSkipped, Skip, SkipCounter

# ruff: noqa: F401 (the imports below are the package's names)
from .benchmark import (
    BENCHMARK_IMAGE_KEYS,
    BENCHMARK_TYPES,
    BenchmarkShards,
    benchmark_layout_root,
    classification_wds,
    read_benchmark_shards,
)
from .fewshot import (
    FEWSHOT_LAYOUTS,
    FewShotData,
    fewshot_layout,
    find_toolkit_folder,
    list_fewshot_datasets,
    parse_index_line,
    read_coco_classification,
    read_fewshot_dataset,
    read_index_file,
)
from .files import (
    IMAGE_EXTENSIONS,
    ImageListDataset,
    ImageSource,
    describe_folder,
    read_classnames,
    read_lines,
    read_templates,
    split_zip_ref,
)
from .folders import (
    CLASSNAME_FILES,
    folder_classnames,
    imagenet_classnames_for,
    is_imagenet_synsets,
    load_classnames,
    names_folder,
    scan_image_folder,
)
from .retrieval import RetrievalCSV, expand_shards, read_retrieval_csv, retrieval_wds
from .samples import WDS_IMAGE_KEYS, ShardSamples, sample_captions, sample_image, shard_samples, split_captions
