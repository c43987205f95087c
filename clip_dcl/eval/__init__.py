"""Evaluations: retrieval, zero-shot classification, ELEVATER few-shot linear probe.

Python API (each returns a flat ``dict[str, float]``)::

    from clip_dcl.eval import evaluate_retrieval, evaluate_zeroshot, evaluate_fewshot

    metrics = evaluate_retrieval(model, preprocess, tokenizer, "data/val/")
    metrics = evaluate_zeroshot(model, preprocess, tokenizer, "imagenet/val")
    metrics = evaluate_fewshot(model, preprocess, tokenizer, "elevater/", shots=5, seeds=(0, 1, 2))

``data``/``root`` may also be a ``torch.utils.data.Dataset`` or ``DataLoader`` (retrieval and
zero-shot). How an evaluation runs (batch size, device, workers, progress, precision ``fp32``,
``amp_bf16`` or ``amp_fp16``, strict) is one `EvalOptions` passed as ``options=``, shared by
every function; the same names as keywords override it::

    opts = EvalOptions(device="cuda", precision="amp_bf16", batch_size=256)
    metrics = evaluate_zeroshot(model, preprocess, tokenizer, "imagenet/val", options=opts)
 ``run_fewshot`` returns the few-shot report with per-seed records;
``run_benchmark`` runs a CLIP_benchmark ``eval`` grid (`clip_dcl.eval.benchmark`).

Each task is registered in `clip_dcl.eval.registry` by the module that defines it (its
options, metrics, table and CLIP_benchmark name); `clip_dcl.eval.tasks` imports the built-in
ones, and the command line, the report and ``eval benchmark`` read the registry
(docs/extending-eval.md adds a task).

The metric math lives in `clip_dcl.eval.metrics` (tensors in, numbers out); encoding, the
zero-shot classifier and precision in `clip_dcl.eval.encoding`; the few-shot protocol in
`clip_dcl.eval.kshot` (draws) and `clip_dcl.eval.probe` (head and sweep). Submodules are
imported on first use, so ``import clip_dcl.eval`` stays cheap.
"""
from __future__ import annotations

import importlib

__all__ = ["evaluate_retrieval", "evaluate_zeroshot", "evaluate_fewshot", "run_fewshot", "retrieval_metrics",
           "run_benchmark", "EvalOptions"]

_EXPORTS = {
    "evaluate_retrieval": "retrieval",
    "evaluate_zeroshot": "zeroshot",
    "evaluate_fewshot": "fewshot",
    "run_fewshot": "fewshot",
    "retrieval_metrics": "metrics",
    "run_benchmark": "benchmark",
    "EvalOptions": "encoding",
}


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'clip_dcl.eval' has no attribute {name!r}")
