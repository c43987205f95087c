"""Image-text retrieval: recall@k, mean and median rank, several captions per image, on L2-normalised features
(cosine, as CLIP_benchmark and OpenCLIP's validation) scored in chunks, so 100k x 100k never materialises.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..data.evalsets.files import ImageListDataset
from ..data.evalsets.retrieval import expand_shards, read_retrieval_csv, retrieval_wds
from ..data.evalsets.samples import split_captions
from ..data.skips import Skip, SkipCounter
from .encoding import EvalOptions, encode_batches, encode_images, encode_texts, labelled_batches
from .metrics import against_chance, retrieval_chance, retrieval_metrics
from .registry import EvalTask, TaskResult, register_task
from .report import chance_footnotes, format_table, marked

log = logging.getLogger(__name__)


def is_csv(data) -> bool:
    return isinstance(data, (str, os.PathLike)) and Path(data).suffix.lower() in (".csv", ".tsv")


def _collate(batch):
    """``(images or None, captions, skips)``."""
    good, skips = [], []
    for item in batch:
        if isinstance(item, Skip):
            skips.append(item)
        elif item[0] is None:
            skips.append(Skip("the dataset", item[2] if len(item) > 2 else None, "undecodable image"))
        else:
            good.append(item)
    if not good:
        return None, [], skips
    images, captions = zip(*[item[:2] for item in good])
    return torch.stack(images), list(captions), skips


def _caption_list(caps, where: str) -> list[str]:
    """One image's captions: a string is split into lines (blank ones skipped), a list kept."""
    out = split_captions(caps) if isinstance(caps, str) else [c.strip() for c in caps if c and c.strip()]
    if not out:
        raise ValueError(f"{where}: an image has no caption")
    return out


def _encode_batches(model, batches, options: EvalOptions, what: str, skips: SkipCounter):
    """(image features, captions per image) over batches of (images, captions of each image[, skips])."""
    feats, captions = [], []
    for f, caps in encode_batches(model, batches, options, "retrieval images", skips):
        feats.append(f)
        captions.extend(_caption_list(c, what) for c in caps)
    if not feats:
        raise ValueError(f"no samples in {what}" + (f" ({skips.summary()})" if skips.total else ""))
    return torch.cat(feats), captions


def duplicate_captions_warning(texts: Sequence[str], num_images: int) -> str | None:
    """Warn (and return the line) when there are fewer distinct captions than half the images."""
    distinct = len(set(texts))
    if num_images < 10 or distinct >= num_images / 2:
        return None
    line = (
        f"retrieval: only {distinct} distinct captions among the {len(texts)} captions of {num_images} images: "
        "a caption shared by several images is scored as found only at its own image, so recall stays near "
        "chance whatever the model; give each image a caption of its own"
    )
    log.warning(line)
    return line


def embed_retrieval_data(
    model,
    preprocess: Callable,
    tokenizer: Callable,
    data,
    *,
    options: EvalOptions | None = None,
    csv_img_key: str | None = None,
    csv_caption_key: str | None = None,
    csv_separator: str | None = None,
    skips: SkipCounter | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(image_features (I, D), text_features (T, D), text_to_image (T,))``, L2-normalised, on CPU, of a CSV/TSV,
    shards (folder, pattern or list) or a ``Dataset`` / ``DataLoader`` of (image, captions as a list or lines)."""
    from torch.utils.data import DataLoader, Dataset

    options = EvalOptions.from_kwargs(options, **kwargs)
    skips = SkipCounter(options.strict) if skips is None else skips
    if isinstance(data, (Dataset, DataLoader)):
        batches = labelled_batches(data, options.batch_size, options.workers, collate=_collate)
        image_features, captions = _encode_batches(model, batches, options, "the dataset", skips)
    elif is_csv(data):
        table = read_retrieval_csv(data, csv_img_key, csv_caption_key, csv_separator, skips=skips)
        dataset = ImageListDataset(table.images, table.source, preprocess, markers=True, where=str(data))
        image_features, kept = encode_images(model, dataset, options=options, desc="retrieval images", skips=skips)
        captions = [table.captions[i] for i in kept.tolist()]
    else:
        shards = expand_shards(data)
        loader = DataLoader(
            retrieval_wds(shards, preprocess, markers=True),
            batch_size=options.batch_size,
            num_workers=options.workers,
            collate_fn=_collate,
        )
        image_features, captions = _encode_batches(model, loader, options, f"the shards {list(shards)[:3]}", skips)
    text_to_image = torch.tensor([i for i, caps in enumerate(captions) for _ in caps], dtype=torch.long)
    texts = [c for caps in captions for c in caps]
    duplicate_captions_warning(texts, len(captions))
    text_features = encode_texts(
        model, tokenizer, texts, options=options, batch_size=max(options.batch_size, 256), desc="retrieval captions"
    )
    return image_features, text_features, text_to_image


def evaluate_retrieval(
    model,
    preprocess: Callable,
    tokenizer: Callable,
    data,
    *,
    options: EvalOptions | None = None,
    ks: Sequence[int] = (1, 5, 10),
    chunk_size: int = 1024,
    csv_img_key: str | None = None,
    csv_caption_key: str | None = None,
    csv_separator: str | None = None,
    return_info: bool = False,
    skips: SkipCounter | None = None,
    **kwargs,
):
    """`retrieval_metrics` of ``model`` on ``data`` (as `embed_retrieval_data` reads it), and with ``return_info``
    ``{"num_images", "num_texts", "skipped", "chance"}`` (each R@k against its chance level, `against_chance`)."""
    ks = [int(k) for k in ks]
    if not ks or min(ks) < 1:
        raise ValueError(f"recall@k needs k >= 1, got {ks}")
    options = EvalOptions.from_kwargs(options, **kwargs)
    skips = SkipCounter(options.strict) if skips is None else skips
    img, txt, t2i = embed_retrieval_data(
        model,
        preprocess,
        tokenizer,
        data,
        options=options,
        csv_img_key=csv_img_key,
        csv_caption_key=csv_caption_key,
        csv_separator=csv_separator,
        skips=skips,
    )
    log.info("retrieval: %d images, %d captions; %s", img.shape[0], txt.shape[0], skips.summary())
    # Ranking runs where the model runs: on a GPU the chunked matmuls are the whole cost.
    device = options.device
    metrics = retrieval_metrics(img.to(device), txt.to(device), t2i.to(device), ks=ks, chunk_size=chunk_size)
    if return_info:
        chance = against_chance(metrics, retrieval_chance(t2i, img.shape[0], ks))
        info = {"num_images": int(img.shape[0]), "num_texts": int(txt.shape[0]), "skipped": skips.as_dict()}
        return metrics, {**info, "chance": chance}
    return metrics


# The task: `clip-dcl eval retrieval` and CLIP_benchmark's zeroshot_retrieval
def _add_arguments(p) -> None:
    p.add_argument(
        "--data",
        required=True,
        help="folder of .tar shards, a shard pattern ('val-{000..003}.tar'), or a CSV/TSV of image,caption",
    )
    p.add_argument("--csv-img-key", default=None, help="CSV image-path column (default: filepath/image/...)")
    p.add_argument("--csv-caption-key", default=None, help="CSV caption column (default: title/caption/...)")
    p.add_argument("--csv-separator", default=None, help="CSV separator (default: tab for .tsv, else comma)")
    p.add_argument(
        "--recall-k",
        type=int,
        nargs="+",
        default=[1, 5, 10],
        metavar="K",
        help="the k of recall@k, one or more (default 1 5 10)",
    )
    p.add_argument(
        "--chunk-size",
        type=int,
        default=1024,
        help="query rows scored at once; memory ~ chunk x N x 5 bytes (default 1024)",
    )


def _check(args) -> None:
    """``--recall-k`` and ``--data``, before the model loads."""
    from ..errors import FlagError

    if min(args.recall_k) < 1:
        raise FlagError(f"--recall-k values must be >= 1, got {args.recall_k}")
    try:
        if is_csv(args.data):
            quiet = SkipCounter(strict=getattr(args, "strict", False), log=False)  # said when the evaluation runs
            read_retrieval_csv(args.data, args.csv_img_key, args.csv_caption_key, args.csv_separator, skips=quiet)
        else:
            expand_shards(args.data)
    except (ValueError, OSError) as e:
        raise FlagError(f"--data {args.data}: {e}") from None


def _run(model, preprocess, tokenizer, args, common) -> TaskResult:
    metrics, info = evaluate_retrieval(
        model,
        preprocess,
        tokenizer,
        args.data,
        chunk_size=args.chunk_size,
        csv_img_key=args.csv_img_key,
        csv_caption_key=args.csv_caption_key,
        csv_separator=args.csv_separator,
        ks=args.recall_k,
        return_info=True,
        **common,
    )
    chance = info.pop("chance")
    return TaskResult(
        metrics,
        {"path": str(args.data), **info},
        settings=dict(chunk_size=args.chunk_size, normalize=True, recall_k=args.recall_k),
        chance=chance,
    )


def retrieval_table(metrics: dict[str, float], ks: Sequence[int] = (1, 5, 10), chance: dict | None = None) -> str:
    """Rows image->text and text->image; columns R@k for each k of ``ks``, mean and median rank. With ``chance``
    (`against_chance`): a chance row under each direction, marked cells and a line for each mark used."""
    keys = [f"R@{k}" for k in ks] + ["mean_rank", "median_rank"]
    directions = (("image_to_text", "image -> text"), ("text_to_image", "text -> image"))
    rows = []
    for prefix, label in directions:
        if chance is None:
            rows.append([label] + [metrics[f"{prefix}_{key}"] for key in keys])
            continue
        entries = [chance.get(f"{prefix}_{key}") for key in keys]
        rows.append([label] + [marked(metrics[f"{prefix}_{key}"], e) for key, e in zip(keys, entries)])
        rows.append(["  chance"] + [marked(e["chance"], None) if e else "" for e in entries])
    table = format_table(["direction"] + [key.replace("_", " ") for key in keys], rows)
    return "\n".join([table, *chance_footnotes(chance or {})])


def benchmark_retrieval_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Per k, ``image_retrieval_recall@k`` then ``text_retrieval_recall@k``, CLIP_benchmark's order."""
    ks = [k.split("@", 1)[1] for k in metrics if k.startswith("image_retrieval_recall@")]
    return {f"{d}_retrieval_recall@{k}": metrics[f"{d}_retrieval_recall@{k}"] for k in ks for d in ("image", "text")}


def _benchmark_run(model, preprocess, tokenizer, run, settings):
    # CLIP_benchmark's layout is read at its split folder; a folder of shards (or a CSV) as it is
    data = run.root
    if not data.is_file() and (data / settings.split / "nshards.txt").is_file():
        data = data / settings.split
    return evaluate_retrieval(
        model, preprocess, tokenizer, data, ks=tuple(settings.recall_k), options=settings.options
    ), {}


register_task(
    EvalTask(
        name="retrieval",
        help="image<->text recall@k and ranks on val shards or a CSV",
        description="Image-to-text and text-to-image recall@1/5/10, mean and median rank.",
        add_arguments=_add_arguments,
        check=_check,
        run=_run,
        metrics=(
            "image_to_text_R@{k}",
            "text_to_image_R@{k}",
            "image_to_text_mean_rank",
            "text_to_image_mean_rank",
            "image_to_text_median_rank",
            "text_to_image_median_rank",
            "image_retrieval_recall@{k}",
            "text_retrieval_recall@{k}",
        ),
        table=lambda metrics, args, chance=None: retrieval_table(metrics, args.recall_k, chance),
        benchmark_name="zeroshot_retrieval",
        benchmark_metrics=benchmark_retrieval_metrics,
        benchmark_run=_benchmark_run,
    )
)
