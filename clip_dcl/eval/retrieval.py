"""Image-text retrieval: recall@k, mean and median rank, several captions per image.

Data: webdataset validation shards in the Conceptual Captions layout (the json's ``captions``
list is used when present, else the ``.txt``), or a CSV/TSV of image path and caption with
several rows per image allowed (:mod:`clip_dcl.data.evalsets`). Images and captions are encoded
with L2 normalisation (cosine similarity, as CLIP_benchmark and OpenCLIP's validation), then
scored by :func:`clip_dcl.eval.metrics.retrieval_metrics` in chunks, so that 100k x 100k never
materialises (see its docstring for the memory bound).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..data.evalsets import ImageListDataset, expand_shards, read_retrieval_csv, retrieval_wds
from .metrics import retrieval_metrics
from .zeroshot import progress_bar, encode_images, encode_texts

log = logging.getLogger(__name__)


def is_csv(data) -> bool:
    return isinstance(data, (str, os.PathLike)) and Path(data).suffix.lower() in (".csv", ".tsv")


def _collate(batch):
    """Stack a batch; samples whose image did not decode (``None``, see ``retrieval_wds``) are left
    out and their keys returned apart."""
    good = [b for b in batch if b[0] is not None]
    skipped = [key for image, _, key in batch if image is None]
    if not good:
        return None, [], [], skipped
    images, captions, keys = zip(*good)
    return torch.stack(images), list(captions), list(keys), skipped


@torch.no_grad()
def _encode_shards(model, shards: Sequence[str], preprocess, batch_size, device, workers, progress):
    from torch.utils.data import DataLoader

    loader = DataLoader(retrieval_wds(shards, preprocess), batch_size=batch_size, num_workers=workers,
                        collate_fn=_collate)
    feats, captions, skipped = [], [], []
    model.eval()
    for images, caps, _, bad in progress_bar(loader, "encoding retrieval images", None, progress):
        skipped.extend(bad)
        if images is None:
            continue
        feats.append(model.encode_image(images.to(device), normalize=True).float().cpu())
        captions.extend(caps)
    if skipped:
        log.warning("retrieval: skipped %d sample(s) whose image does not decode (keys %s)", len(skipped),
                    ", ".join(map(str, skipped[:10])) + (", ..." if len(skipped) > 10 else ""))
    if not feats:
        raise ValueError(f"no samples in the shards {list(shards)[:3]}...")
    return torch.cat(feats), captions


def embed_retrieval_data(
    model,
    preprocess: Callable,
    tokenizer: Callable,
    data,
    batch_size: int = 64,
    device: str | torch.device = "cpu",
    workers: int = 0,
    progress: bool = True,
    csv_img_key: str | None = None,
    csv_caption_key: str | None = None,
    csv_separator: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(image_features (I, D), text_features (T, D), text_to_image (T,))``, L2-normalised, on CPU.

    ``data`` is a CSV/TSV path, a folder of ``.tar`` shards, a shard pattern
    (``val-{000000..000003}.tar``, ``::``-joined patterns) or a list of shard paths.
    """
    if is_csv(data):
        table = read_retrieval_csv(data, csv_img_key, csv_caption_key, csv_separator)
        dataset = ImageListDataset(table.images, table.source, preprocess)
        image_features = encode_images(model, dataset, batch_size, device, workers, progress=progress,
                                       desc="retrieval images")
        captions = table.captions
    else:
        shards = expand_shards(data)
        image_features, captions = _encode_shards(model, shards, preprocess, batch_size, device, workers, progress)
    text_to_image = torch.tensor([i for i, caps in enumerate(captions) for _ in caps], dtype=torch.long)
    texts = [c for caps in captions for c in caps]
    text_features = encode_texts(model, tokenizer, texts, batch_size=max(batch_size, 256), device=device,
                                 progress=progress, desc="retrieval captions")
    return image_features, text_features, text_to_image


def evaluate_retrieval(
    model,
    preprocess: Callable,
    tokenizer: Callable,
    data,
    batch_size: int = 64,
    device: str | torch.device = "cpu",
    workers: int = 0,
    ks: Sequence[int] = (1, 5, 10),
    chunk_size: int = 1024,
    progress: bool = True,
    csv_img_key: str | None = None,
    csv_caption_key: str | None = None,
    csv_separator: str | None = None,
    return_info: bool = False,
):
    """Retrieval metrics of ``model`` on ``data`` (see :func:`embed_retrieval_data` for the forms).

    Returns the flat dict of :func:`clip_dcl.eval.metrics.retrieval_metrics`
    (``image_to_text_R@k``, ``text_to_image_R@k``, ``*_mean_rank``, ``*_median_rank``,
    ``text_retrieval_recall@k``, ``image_retrieval_recall@k``), and with ``return_info`` also
    ``{"num_images", "num_texts"}``.
    """
    img, txt, t2i = embed_retrieval_data(model, preprocess, tokenizer, data, batch_size, device, workers,
                                         progress, csv_img_key, csv_caption_key, csv_separator)
    log.info("retrieval: %d images, %d captions", img.shape[0], txt.shape[0])
    # Ranking runs where the model runs: on a GPU the chunked matmuls are the whole cost.
    metrics = retrieval_metrics(img.to(device), txt.to(device), t2i.to(device), ks=ks, chunk_size=chunk_size)
    if return_info:
        return metrics, {"num_images": int(img.shape[0]), "num_texts": int(txt.shape[0])}
    return metrics
