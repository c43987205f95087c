"""The training budgets that the demo and the benchmarks share (the quality benchmark repeats the demo's
comparison over more seeds, under the demo's own budget)."""

from __future__ import annotations

from .runner import Budget

#: The demo's model: ``clip-dcl-tiny``'s towers with 16 px patches, the synthetic captions' 745-word vocabulary
#: and one text layer (``clip_dcl/model_configs/words``), trained on the packed training set with fused AdamW:
#: faster than ``clip-dcl-tiny`` on the shards by the ratio ``benchmarks/demo_speed.py`` measures.
DEMO_MODEL = "clip-dcl-tiny-words"
#: The full demo's budget: chosen so that the three runs and their evaluations, with the set-up of a
#: fresh clone, take under ten minutes on 2 idle cores of a laptop CPU.
DEMO_BUDGET = Budget(
    epochs=4, batch_size=128, lr=1e-3, warmup=20, seed=0, workers=1, model=DEMO_MODEL, extra=("--adamw-impl", "fused")
)
#: A smoke run's budget (``--quick`` of the demo and the benchmarks): one short epoch.
QUICK_BUDGET = Budget(epochs=1, batch_size=32, lr=2e-3, warmup=2, seed=0, workers=1, log_every_n_steps=2)
#: Latent classes of the demo's synthetic data (``tau_plus = 1 / classes``).
DEMO_CLASSES = 10
