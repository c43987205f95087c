"""Tiled statistics on two and four gloo processes on CPU equal one process's whole logit matrix.

Every clip-dcl configuration of the distributed harness, with tiles of 5 columns (several per matrix
of the global batch of 16, the last one partial), with ``gather_with_grad`` and ``local_loss`` on and
off, with the features gathered without autograd (``no_grad_gather``) and with gradient accumulation
(``accum_freq=2``): the loss value, the DDP-averaged parameter gradients and the loss state of every
step equal those of one process on the concatenated batch computing the whole matrix (``tile=0``).
"""

from __future__ import annotations

import pytest
import torch
from test_losses_distributed import harness, launch

pytestmark = pytest.mark.slow

TOL = dict(rtol=1e-10, atol=1e-12)


@pytest.fixture(scope="module")
def tiled_results(tmp_path_factory, preloaded):
    return {
        2: launch(preloaded.python, tmp_path_factory.mktemp("tiled2"), 2, "tiled"),
        4: launch(preloaded.python, tmp_path_factory.mktemp("tiled4"), 4, "tiled4"),
    }


def assert_equal_to_whole(results, key, single, what):
    for rank, res in enumerate(results):
        for step, (got, ref) in enumerate(zip(res[key], single)):
            where = f"{what}, step {step}, rank {rank}"
            torch.testing.assert_close(got["loss"], ref["loss"], **TOL, msg=f"loss, {where}")
            for p, (a, b) in enumerate(zip(got["grads"], ref["grads"])):
                tol = dict(rtol=1e-9, atol=1e-11 * max(1.0, float(b.abs().max())))
                torch.testing.assert_close(a, b, **tol, msg=f"grad {p}, {where}")
            for name, buf in ref["buffers"].items():
                torch.testing.assert_close(got["buffers"][name], buf, **TOL, equal_nan=True, msg=f"{name}, {where}")


CASES = [(w, c, local) for w in (2, 4) for c in harness.TILED_CONFIGS for local in (False, True)]
CASES = [case for case in CASES if case[0] == 2 or case[1][0] in harness.TILED_FOUR_RANKS]


@pytest.mark.parametrize(
    "world_size, config, local_loss",
    CASES,
    ids=[f"{w}ranks-{c[0]}-{'local' if local else 'global'}" for w, c, local in CASES],
)
def test_tiled_ranks_equal_one_process_whole_matrix(tiled_results, world_size, config, local_loss):
    name, loss_name, kwargs = config
    single = harness.run(loss_name, harness.tiled(kwargs, 0))
    assert_equal_to_whole(tiled_results[world_size], (name, local_loss), single, name)


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("config", harness.TILED_NO_GRAD, ids=[c[0] for c in harness.TILED_NO_GRAD])
def test_tiled_no_grad_gather_equals_one_process_whole_matrix(tiled_results, world_size, config):
    name, loss_name, kwargs = config
    single = harness.run(loss_name, harness.tiled(kwargs, 0))
    assert_equal_to_whole(tiled_results[world_size], (name, "no_grad"), single, name)


@pytest.mark.parametrize("config", harness.ACCUM_CONFIGS, ids=[c[0] for c in harness.ACCUM_CONFIGS])
def test_tiled_accumulation_equals_one_process_whole_matrix(tiled_results, config):
    name, loss_name, kwargs = config
    single = harness.run(loss_name, harness.tiled(kwargs, 0), accum_freq=2)
    assert_equal_to_whole(tiled_results[2], (name, "accum"), single, name)
