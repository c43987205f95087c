"""Encoding shared by every evaluator: `EvalOptions`, images and texts through the model at a precision, the
zero-shot classifier. Features come back as finite float32 on the CPU: NaN or inf raise `NonFiniteFeatures`, since
a diverged checkpoint would otherwise score chance or NaN and look like a result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import numbers
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch

#: Precisions an evaluation can run at (OpenCLIP's names).
PRECISIONS = ("fp32", "amp_bf16", "amp_fp16")
_AMP_DTYPES = {"amp_bf16": torch.bfloat16, "amp_fp16": torch.float16}


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    return precision


@dataclass(frozen=True)
class EvalOptions:
    """How an evaluation runs, as opposed to what it measures; ``strict``: a sample that would be left out raises
    `SampleSkipped`."""

    batch_size: int = 64
    device: str | torch.device = "cpu"
    workers: int = 0
    progress: bool = True
    precision: str = "fp32"
    strict: bool = False

    def __post_init__(self):
        def whole(value) -> bool:
            return isinstance(value, numbers.Integral) and not isinstance(value, bool)

        if not whole(self.batch_size) or self.batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {self.batch_size!r}")
        if not whole(self.workers) or self.workers < 0:
            raise ValueError(f"workers must be an integer >= 0, got {self.workers!r}")
        check_precision(self.precision)

    @classmethod
    def from_kwargs(cls, options: "EvalOptions | None" = None, /, **kwargs) -> "EvalOptions":
        """``options`` (default ``EvalOptions()``) with the fields in ``kwargs`` replaced; ``TypeError`` otherwise."""
        if options is None:
            options = cls()
        elif not isinstance(options, cls):
            raise TypeError(f"options must be an EvalOptions or None, got {type(options).__name__} {options!r}")
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = [k for k in kwargs if k not in fields]
        if unknown:
            hints = "".join(
                f" ({k!r}: did you mean {m[0]!r}?)"
                for k in unknown
                for m in [difflib.get_close_matches(k, fields, n=1)]
                if m
            )
            raise TypeError(f"unexpected keyword argument(s) {unknown}{hints}; the evaluation options are {fields}")
        return dataclasses.replace(options, **kwargs) if kwargs else options


def autocast(device: str | torch.device, precision: str):
    """``torch.autocast`` for ``precision`` on ``device``'s type; a no-op context for ``fp32``."""
    check_precision(precision)
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=_AMP_DTYPES[precision])


class NonFiniteFeatures(ValueError):
    """The model's features hold NaN or inf (a checkpoint of a training that diverged): nothing to score."""


def logit_scale_problem(model) -> str | None:
    """What is wrong with the model's ``logit_scale`` (NaN or inf), or None; `finite_features` misses it."""
    scale = getattr(model, "logit_scale", None)
    if not isinstance(scale, torch.Tensor) or bool(torch.isfinite(scale.detach()).all()):
        return None
    value = scale.detach().float().reshape(-1)[0].item()
    return f"the model's logit_scale is {value} (a training that diverged?)"


def check_logit_scale(model, scored_with_it: bool, what: str) -> None:
    """Refuse a model whose ``logit_scale`` is not finite when ``what``'s score depends on it
    (``EvalTask.uses_logit_scale``), else warn."""
    import logging

    problem = logit_scale_problem(model)
    if problem is None:
        return
    if scored_with_it:
        raise NonFiniteFeatures(f"{problem}, and the scores of {what} depend on it: nothing is scored")
    logging.getLogger(__name__).warning(
        f"{what}: {problem}; the scores below do not depend on it (cosine similarities, CLIP's fixed logit scale "
        "100), but the checkpoint's training did not end well"
    )


def finite_features(features: torch.Tensor, model, desc: str) -> torch.Tensor:
    """``features``, or `NonFiniteFeatures` counting the bad rows and naming the model's non-finite weights."""
    finite = torch.isfinite(features)
    if bool(finite.all()):
        return features
    rows = int((~finite.reshape(finite.shape[0], -1).all(1)).sum()) if features.ndim else 1
    total = features.shape[0] if features.ndim else 1
    bad = (
        [name for name, p in model.named_parameters() if not bool(torch.isfinite(p.detach()).all())]
        if hasattr(model, "named_parameters")
        else []
    )
    weights = (
        f", and so do {len(bad)} of its weight tensors ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}; "
        "a training that diverged)"
        if bad
        else ""
    )
    raise NonFiniteFeatures(
        f"the model's features of the {desc} hold NaN or inf ({rows} of {total} rows){weights}: nothing is scored"
    )


def encode_batch(
    model, kind: str, inputs: torch.Tensor, options: "EvalOptions", normalize: bool = True, desc: str | None = None
) -> torch.Tensor:
    """One batch through ``encode_image`` or ``encode_text`` at the options' precision: (B, D) float32 on CPU."""
    encode = {"image": model.encode_image, "text": model.encode_text}[kind]
    with autocast(options.device, options.precision):
        feats = encode(inputs.to(options.device), normalize=normalize)
    return finite_features(feats.float().cpu(), model, desc or f"{kind}s")


def resolve_device(device: str | torch.device | None) -> str:
    """``"auto"`` (or None) -> ``"cuda"`` when a GPU is visible, else ``"cpu"``; other names unchanged."""
    if device is None or str(device) == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(device)


def device_problem(device: str) -> str | None:
    """Why ``device`` cannot be used here, or None."""
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        return str(e)
    if dev.type == "cuda" and not torch.cuda.is_available():
        return "CUDA is not available on this machine"
    return None


def progress_bar(iterable, desc: str, total: int | None, enabled: bool):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, leave=False)


def _collate_indexed(batch):
    """``(images or None, indices, skips)`` of ``(image, index)`` items, some carrying a ``Skip``."""
    from ..data.skips import Skip

    good = [(img, i) for img, i in batch if not isinstance(img, Skip)]
    skips = [img for img, _ in batch if isinstance(img, Skip)]
    if not good:
        return None, torch.zeros(0, dtype=torch.long), skips
    images, idx = zip(*good)
    return torch.stack(images), torch.tensor(idx, dtype=torch.long), skips


@torch.no_grad()
def encode_batches(model, batches, options: EvalOptions, desc: str, skips):
    """``(image features, batch[1])`` of each batch of (images or None, labels or captions[, skips to record])."""
    model.eval()
    for batch in progress_bar(batches, f"encoding {desc}", None, options.progress):
        if not isinstance(batch, (list, tuple)) or len(batch) < 2:
            raise ValueError(
                f"{desc}: the data must yield (images, labels or captions) batches, got {type(batch).__name__}"
            )
        for skip in batch[2] if len(batch) > 2 and isinstance(batch[2], list) else ():
            skips.record(skip)
        if batch[0] is not None:
            yield encode_batch(model, "image", batch[0], options, desc=desc), batch[1]


@torch.no_grad()
def encode_images(
    model,
    dataset,
    *,
    options: EvalOptions | None = None,
    normalize: bool = True,
    desc: str = "images",
    skips=None,
    **kwargs,
):
    """``model.encode_image`` over a dataset of ``(image_tensor, index)``: (N, D) float32 on CPU, in order; with
    ``skips``, `Skip` items are recorded and left out, and the result is ``(features (K, D), kept (K,))``."""
    from torch.utils.data import DataLoader

    options = EvalOptions.from_kwargs(options, **kwargs)
    n = len(dataset)
    marked = skips is not None
    loader = DataLoader(
        dataset,
        batch_size=options.batch_size,
        shuffle=False,
        num_workers=options.workers,
        pin_memory=torch.device(options.device).type == "cuda",
        collate_fn=_collate_indexed if marked else None,
    )
    out = None
    done = torch.zeros(n, dtype=torch.bool)
    model.eval()
    for batch in progress_bar(loader, f"encoding {desc}", len(loader), options.progress):
        images, idx = batch[0], batch[1]
        for skip in batch[2] if marked else ():
            skips.record(skip)
        if images is None:
            continue
        feats = encode_batch(model, "image", images, options, normalize, desc)
        if out is None:
            out = torch.empty(n, feats.shape[1])
        out[idx] = feats
        done[idx] = True
    if out is None:
        raise ValueError(
            f"no {desc} to encode" + (f" ({skips.summary()})" if skips is not None and skips.total else "")
        )
    if skips is None:
        return out
    kept = done.nonzero().flatten()
    return out[kept], kept


@torch.no_grad()
def encode_texts(
    model,
    tokenizer,
    texts: Sequence[str],
    *,
    options: EvalOptions | None = None,
    batch_size: int = 256,
    normalize: bool = True,
    desc: str = "texts",
    **kwargs,
) -> torch.Tensor:
    """``model.encode_text(tokenizer(texts))`` in batches of ``batch_size`` texts; (T, D) float32 on CPU."""
    options = EvalOptions.from_kwargs(options, **kwargs)
    out = []
    steps = range(0, len(texts), batch_size)
    for s in progress_bar(steps, f"encoding {desc}", len(steps), options.progress):
        out.append(encode_batch(model, "text", tokenizer(list(texts[s : s + batch_size])), options, normalize, desc))
    if not out:
        raise ValueError(f"no {desc} to encode")
    return torch.cat(out)


def normalize_templates(templates) -> list | dict:
    """Templates as the classifier builders take them: a list of strings (``{c}`` rewritten to ``{}``) or
    callables, or a CuPL mapping ``class name -> [prompts]`` as a dict; ``ValueError`` naming a bad one."""
    if isinstance(templates, Mapping):
        if not templates:
            raise ValueError("per-class templates must not be empty")
        out = {}
        for name, prompts in templates.items():
            prompts = [prompts] if isinstance(prompts, str) else list(prompts or [])
            if not prompts or not all(isinstance(p, str) and p.strip() for p in prompts):
                raise ValueError(f"per-class templates: class {name!r} has no prompts (got {templates[name]!r})")
            out[name] = prompts
        return out
    if not templates:
        raise ValueError("templates must not be empty")
    out = []
    for t in templates:
        if callable(t):
            out.append(t)
        elif isinstance(t, str):
            from ..data.evalsets.files import template_problem

            problem = template_problem(t)
            if problem:
                raise ValueError(f"template {problem}")
            out.append(t.replace("{c}", "{}"))
        else:
            raise ValueError(f"template {t!r} is neither a string nor a callable")
    if any(callable(t) for t in out):  # OpenCLIP's builder formats all or calls all
        out = [t if callable(t) else t.format for t in out]
    return out


def zeroshot_classifier(
    model, tokenizer, classnames: Sequence[str], templates, *, options: EvalOptions | None = None, **kwargs
) -> torch.Tensor:
    """(D, C) zero-shot weights (float32, CPU) from ``open_clip.build_zero_shot_classifier`` (CuPL prompts one
    class at a time)."""
    from open_clip import build_zero_shot_classifier

    if options is None:
        kwargs.setdefault("progress", False)
    options = EvalOptions.from_kwargs(options, **kwargs)
    device, precision, progress = options.device, options.precision, options.progress
    templates = normalize_templates(templates)
    model.eval()
    with autocast(device, precision):
        if isinstance(templates, dict):
            missing = [c for c in classnames if c not in templates]
            if missing:
                raise ValueError(
                    f"per-class templates have no prompts for classes {missing[:5]}"
                    f"{' ...' if len(missing) > 5 else ''} ({len(missing)} of {len(classnames)})"
                )
            cols = []
            for c in progress_bar(classnames, "encoding class prompts", len(classnames), progress):
                prompts = [(lambda _, p=p: p) for p in templates[c]]
                cols.append(
                    build_zero_shot_classifier(
                        model, tokenizer, [c], prompts, num_classes_per_batch=1, device=device, use_tqdm=False
                    )
                )
            w = torch.cat(cols, dim=1)
        else:
            w = build_zero_shot_classifier(
                model,
                tokenizer,
                list(classnames),
                templates,
                num_classes_per_batch=10,
                device=device,
                use_tqdm=progress,
            )
    return finite_features(w.float().cpu().T, model, "class prompts (the zero-shot classifier)").T


def labelled_batches(data, batch_size: int, workers: int, collate: Callable | None = None):
    """A DataLoader over ``data``, or ``data`` itself when it is one."""
    from torch.utils.data import DataLoader, IterableDataset

    if isinstance(data, DataLoader):
        return data
    kw = {} if isinstance(data, IterableDataset) else {"shuffle": False}
    return DataLoader(data, batch_size=batch_size, num_workers=workers, collate_fn=collate, **kw)
