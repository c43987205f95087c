"""The evaluation tasks clip-dcl ships; importing this module registers each of them.

Each module below defines its task and registers it (`clip_dcl.eval.registry.register_task`)
at its end. A new task is one new module that does the same, plus one line here; a task defined
outside clip-dcl only needs its module imported before ``clip_dcl.eval.cli.main`` runs.
"""

from __future__ import annotations

# in the order `clip-dcl eval --help` lists them
from . import fewshot, retrieval, zeroshot  # noqa: F401,I001  (each registers its task on import)
from .registry import benchmark_task, get_task, registered_tasks

__all__ = ["get_task", "registered_tasks", "benchmark_task"]
