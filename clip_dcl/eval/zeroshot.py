"""Zero-shot classification on an ImageFolder tree (ImageNet by default), and the shared encoders.

Protocol (OpenCLIP's ``open_clip_train/zero_shot.py``, CLIP_benchmark's
``zeroshot_classification``): each class's text embedding is the re-normalised mean of its
L2-normalised template embeddings (``open_clip.build_zero_shot_classifier``); an image is scored
by ``logits = 100 * normalize(f(x)) @ W`` and we report ``top1``, ``top5`` (NaN with fewer than
5 classes) and ``mean_per_class_recall`` (balanced accuracy).

Class names: an explicit list or file, else ``ROOT/classnames.txt``, else, when every folder is
an ImageNet synset (``n01440764``...), OpenCLIP's ``IMAGENET_CLASSNAMES`` in sorted-synset order.
Templates: an explicit list or file, else ``ROOT/templates.txt``, else OpenCLIP's
``OPENAI_IMAGENET_TEMPLATES`` (80 generic photo prompts).

:func:`encode_images` and :func:`zeroshot_classifier` are also what the few-shot probe uses
(frozen features; text-initialised head).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..data.evalsets import (
    ImageListDataset,
    ImageSource,
    imagenet_classnames_for,
    is_imagenet_synsets,
    normalize_templates,
    read_classnames,
    read_templates,
    scan_image_folder,
)
from .metrics import classification_metrics

log = logging.getLogger(__name__)


def progress_bar(iterable, desc: str, total: int | None, enabled: bool):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, leave=False)


@torch.no_grad()
def encode_images(
    model,
    dataset,
    batch_size: int = 64,
    device: str | torch.device = "cpu",
    workers: int = 0,
    normalize: bool = True,
    progress: bool = True,
    desc: str = "images",
) -> torch.Tensor:
    """``model.encode_image`` over a map-style dataset of ``(image_tensor, index)``; (N, D) float32 on CPU.

    Rows come back in dataset order whatever the worker interleaving (each item carries its index).
    """
    from torch.utils.data import DataLoader

    n = len(dataset)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=workers,
                        pin_memory=torch.device(device).type == "cuda")
    out = None
    model.eval()
    for images, idx in progress_bar(loader, f"encoding {desc}", len(loader), progress):
        feats = model.encode_image(images.to(device), normalize=normalize).float().cpu()
        if out is None:
            out = torch.empty(n, feats.shape[1])
        out[idx] = feats
    if out is None:
        raise ValueError(f"no {desc} to encode")
    return out


@torch.no_grad()
def encode_texts(model, tokenizer, texts: Sequence[str], batch_size: int = 256,
                 device: str | torch.device = "cpu", normalize: bool = True, progress: bool = True,
                 desc: str = "texts") -> torch.Tensor:
    """``model.encode_text(tokenizer(texts))`` in batches; (T, D) float32 on CPU."""
    out = []
    steps = range(0, len(texts), batch_size)
    for s in progress_bar(steps, f"encoding {desc}", len(steps), progress):
        tokens = tokenizer(list(texts[s:s + batch_size])).to(device)
        out.append(model.encode_text(tokens, normalize=normalize).float().cpu())
    if not out:
        raise ValueError(f"no {desc} to encode")
    return torch.cat(out)


def zeroshot_classifier(model, tokenizer, classnames: Sequence[str], templates: Sequence,
                        device: str | torch.device = "cpu", progress: bool = False) -> torch.Tensor:
    """(D, C) zero-shot weights from ``open_clip.build_zero_shot_classifier`` (float32, CPU).

    Column c is the re-normalised mean of the normalised embeddings of every template filled
    with class name c.
    """
    from open_clip import build_zero_shot_classifier

    model.eval()
    w = build_zero_shot_classifier(model, tokenizer, list(classnames), normalize_templates(templates),
                                   num_classes_per_batch=10, device=device, use_tqdm=progress)
    return w.float().cpu()


def resolve_classnames(root: str | os.PathLike, folders: Sequence[str],
                       classnames: Sequence[str] | str | os.PathLike | None = None) -> tuple[list[str], str]:
    """(class names in label order, where they came from) for the class folders of ``root``."""
    if classnames is not None:
        if isinstance(classnames, (str, os.PathLike)):
            names, source = read_classnames(classnames), str(classnames)
        else:
            names, source = list(classnames), "argument"
    elif (Path(root) / "classnames.txt").is_file():
        names, source = read_classnames(Path(root) / "classnames.txt"), str(Path(root) / "classnames.txt")
    elif is_imagenet_synsets(folders):
        names, source = imagenet_classnames_for(folders), "open_clip IMAGENET_CLASSNAMES"
    else:
        raise ValueError(f"no class names for {str(root)!r}: write classnames.txt (one name per line, in sorted "
                         f"folder order) or pass classnames")
    if len(names) != len(folders):
        raise ValueError(f"class names from {source} count {len(names)}, but {str(root)!r} has {len(folders)} class folders")
    return names, source


def resolve_templates(root: str | os.PathLike, templates: Sequence | str | os.PathLike | None = None) -> tuple[list, str]:
    """(templates, where they came from); see the module docstring for the order tried."""
    if templates is not None:
        if isinstance(templates, (str, os.PathLike)):
            return read_templates(templates), str(templates)
        return normalize_templates(templates), "argument"
    if (Path(root) / "templates.txt").is_file():
        return read_templates(Path(root) / "templates.txt"), str(Path(root) / "templates.txt")
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES

    return list(OPENAI_IMAGENET_TEMPLATES), "open_clip OPENAI_IMAGENET_TEMPLATES"


def zeroshot_metrics(image_features: torch.Tensor, classifier: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Metrics of ``logits = 100 * normalize(image_features) @ classifier`` (classifier (D, C))."""
    feats = torch.nn.functional.normalize(image_features.float(), dim=-1)
    logits = 100.0 * feats @ classifier.float()
    return classification_metrics(logits, labels)


def evaluate_zeroshot(
    model,
    preprocess: Callable,
    tokenizer: Callable,
    root: str | os.PathLike,
    classnames: Sequence[str] | str | os.PathLike | None = None,
    templates: Sequence | str | os.PathLike | None = None,
    batch_size: int = 64,
    device: str | torch.device = "cpu",
    workers: int = 0,
    progress: bool = True,
    return_info: bool = False,
):
    """Zero-shot top-1 / top-5 / mean per-class recall on the ImageFolder tree ``root``.

    Args:
        model: an OpenCLIP model (``encode_image``/``encode_text``), already on ``device``.
        preprocess: the model's eval transform (PIL image -> tensor).
        tokenizer: the model's tokenizer (list of str -> token tensor).
        root: ``root/<class folder>/<images>``; folders sorted give the label order.
        classnames: names, or a file of names; see the module docstring for the defaults.
        templates: prompt strings with ``{c}``, callables, or a file; defaults as above.
        return_info: also return ``{"num_images", "num_classes", "classnames_source", "templates_source"}``.

    Returns:
        ``{"top1", "top5", "mean_per_class_recall"}`` (fractions), and the info dict if asked.
    """
    folders, samples = scan_image_folder(root)
    names, names_source = resolve_classnames(root, folders, classnames)
    tmpls, tmpl_source = resolve_templates(root, templates)
    log.info("zero-shot: %d images, %d classes (names: %s), %d templates (%s)",
             len(samples), len(names), names_source, len(tmpls), tmpl_source)
    dataset = ImageListDataset([p for p, _ in samples], ImageSource("/"), preprocess)
    labels = torch.tensor([y for _, y in samples])
    classifier = zeroshot_classifier(model, tokenizer, names, tmpls, device=device, progress=progress)
    feats = encode_images(model, dataset, batch_size=batch_size, device=device, workers=workers,
                          progress=progress, desc="zero-shot images")
    metrics = zeroshot_metrics(feats, classifier, labels)
    if return_info:
        info = {"num_images": len(samples), "num_classes": len(names), "classnames_source": names_source,
                "templates_source": tmpl_source, "num_templates": len(tmpls)}
        return metrics, info
    return metrics
