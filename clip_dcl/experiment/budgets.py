"""The training budgets that the demo and the benchmarks share.

The quality benchmark repeats the demo's comparison over more seeds, so it must train under the
demo's own budget; both read it from here.
"""
from __future__ import annotations

from .runner import Budget

#: The full demo's budget: chosen so that the three runs and their evaluations take about
#: ten minutes on a 2-core laptop CPU.
DEMO_BUDGET = Budget(epochs=4, batch_size=128, lr=1e-3, warmup=20, seed=0, workers=1)
#: A smoke run's budget (``--quick`` of the demo and the benchmarks): one short epoch.
QUICK_BUDGET = Budget(epochs=1, batch_size=32, lr=2e-3, warmup=2, seed=0, workers=1, log_every_n_steps=2)
#: Latent classes of the demo's synthetic data (``tau_plus = 1 / classes``).
DEMO_CLASSES = 10
