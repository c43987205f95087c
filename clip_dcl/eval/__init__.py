"""Evaluations: retrieval, zero-shot classification, ELEVATER few-shot linear probe.

Each returns a flat ``dict[str, float]``::

    from clip_dcl.eval import evaluate_retrieval, evaluate_zeroshot, evaluate_fewshot

    metrics = evaluate_retrieval(model, preprocess, tokenizer, "data/val/")
    metrics = evaluate_fewshot(model, preprocess, tokenizer, "elevater/", shots=5, seeds=(0, 1, 2))
    opts = EvalOptions(device="cuda", precision="amp_bf16", batch_size=256)
    metrics = evaluate_zeroshot(model, preprocess, tokenizer, "imagenet/val", options=opts)

Tasks register in `clip_dcl.eval.registry` (docs/extending-eval.md). Submodules are imported on
first use, so ``import clip_dcl.eval`` stays cheap.
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
