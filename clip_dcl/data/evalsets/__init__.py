"""Readers for the evaluation data sets: retrieval pairs, ImageFolder trees, ELEVATER index files.

Three layouts are read here, each checked in full (every referenced file or zip member exists,
every label parses) before any image is decoded, so that a bad path fails in seconds with its
name in the message rather than an hour into an embedding loop:

* **Retrieval pairs.** Webdataset ``.tar`` shards in the Conceptual Captions layout that
  img2dataset writes (``{key}.jpg|png|jpeg|webp``, ``{key}.txt``, ``{key}.json``; the json's
  ``"captions"`` list, when present, holds every caption of the image), or a CSV/TSV of image
  path and caption with one row per (image, caption) pair, several rows per image allowed.
* **ImageFolder trees** (``ROOT/<class>/<image>``), read with torchvision's folder scanner.
* **ELEVATER "iris" index files**: ``<image_path> <label ids, comma separated>`` per line (split
  on the last space, as ``IrisManifestAdaptor`` does), where ``image_path`` is relative to the
  data set folder or ``<zipname>@<path inside the zip>``; images are read in place from the zip
  (``zipfile``), never extracted. A few-shot data set is
  ``ROOT/<name>/{labels.txt,train.txt,test.txt}`` (+ zips), a COCO-style
  ``ROOT/<name>/{train.json,test.json}`` (the index format of three ELEVATER sets), or an
  ImageFolder pair ``ROOT/<name>/{train,test}/<class>/<image>``.

One module a reason to change, every public name importable from here:

* `.retrieval`: retrieval pairs (CSV/TSV, shard folders and patterns);
* `.benchmark`: CLIP_benchmark's webdataset layout (retrieval, classification, multi-label);
* `.folders`: ImageFolder trees and ImageNet's synset folders;
* `.fewshot`: few-shot data sets (ELEVATER's download, iris and COCO indices, ImageFolder pairs);
* shared by them: `.files` (text files, images in files or zips), `.samples` (webdataset
  samples, shards read to their end) and `.skips` (what is left out, why, how many).

open_clip (ImageNet names), torchvision (folder scanning) and webdataset are imported where used.
"""
from __future__ import annotations

from .benchmark import (BENCHMARK_IMAGE_KEYS, BENCHMARK_TYPES, BenchmarkShards, benchmark_layout_root,
                        classification_wds, read_benchmark_shards)
from .fewshot import (FEWSHOT_LAYOUTS, FewShotData, fewshot_layout, find_toolkit_folder, list_fewshot_datasets,
                      parse_index_line, read_coco_classification, read_fewshot_dataset, read_index_file)
from .files import (IMAGE_EXTENSIONS, ImageListDataset, ImageSource, describe_folder, read_classnames, read_lines,
                    read_templates, split_zip_ref)
from .folders import (CLASSNAME_FILES, folder_classnames, imagenet_classnames_for, is_imagenet_synsets,
                      load_classnames, names_folder, scan_image_folder)
from .retrieval import RetrievalCSV, expand_shards, read_retrieval_csv, retrieval_wds
from .samples import WDS_IMAGE_KEYS, ShardSamples, sample_captions, sample_image, shard_samples, split_captions
from .skips import SKIP_CAUSES, SampleSkipped, Skip, SkipCounter

__all__ = [
    # files and images
    "IMAGE_EXTENSIONS", "read_lines", "read_classnames", "read_templates", "split_zip_ref", "ImageSource",
    "ImageListDataset", "describe_folder",
    # skipped samples
    "SKIP_CAUSES", "Skip", "SampleSkipped", "SkipCounter",
    # webdataset samples
    "WDS_IMAGE_KEYS", "shard_samples", "sample_image", "sample_captions", "split_captions", "ShardSamples",
    # retrieval pairs
    "RetrievalCSV", "read_retrieval_csv", "expand_shards", "retrieval_wds",
    # CLIP_benchmark's layout
    "BENCHMARK_IMAGE_KEYS", "BENCHMARK_TYPES", "BenchmarkShards", "benchmark_layout_root", "read_benchmark_shards",
    "classification_wds",
    # ImageFolder trees
    "scan_image_folder", "is_imagenet_synsets", "imagenet_classnames_for", "CLASSNAME_FILES", "folder_classnames",
    "load_classnames", "names_folder",
    # few-shot data sets
    "parse_index_line", "read_index_file", "FewShotData", "read_coco_classification", "FEWSHOT_LAYOUTS",
    "fewshot_layout", "find_toolkit_folder", "list_fewshot_datasets", "read_fewshot_dataset",
]
