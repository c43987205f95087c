"""The evaluation tasks clip-dcl ships; importing this module registers each of them (a new task: one module
that calls `register_task`, plus one line here)."""

from __future__ import annotations

# in the order `clip-dcl eval --help` lists them
from . import fewshot, retrieval, zeroshot  # noqa: F401,I001  (each registers its task on import)
from .registry import benchmark_task, get_task, registered_tasks

__all__ = ["get_task", "registered_tasks", "benchmark_task"]
