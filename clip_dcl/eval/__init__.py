"""Evaluations: retrieval, zero-shot classification, ELEVATER few-shot linear probe. The ``evaluate_*`` functions
take ``(model, preprocess, tokenizer, data)`` and return a flat ``dict[str, float]``; submodules load on first use.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "evaluate_retrieval": "retrieval",
    "evaluate_zeroshot": "zeroshot",
    "evaluate_fewshot": "fewshot",
    "run_fewshot": "fewshot",
    "retrieval_metrics": "metrics",
    "run_benchmark": "benchmark",
    "EvalOptions": "encoding",
}
__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'clip_dcl.eval' has no attribute {name!r}")
