"""Features gathered without autograd (``--no-grad-gather``), on two and four gloo processes on CPU.

Each rank's loss over its own anchors, with the column term that carries the remote anchors'
gradient, equals one process on the concatenated global batch: loss, feature and parameter
gradients and loss state of every step, in float64 and float32, with and without gradient
accumulation. (A module of its own: under ``pytest -n`` one worker runs a module's launches while
the other runs the rest.)
"""

from __future__ import annotations

import pytest
import torch
from test_losses_distributed import harness, launch

pytestmark = pytest.mark.slow


# -- features gathered without autograd (no_grad_gather) -------------------------------------------
@pytest.fixture(scope="module")
def no_grad_results(tmp_path_factory, preloaded):
    return {w: launch(preloaded.python, tmp_path_factory.mktemp(f"nograd{w}"), w, "no_grad") for w in (2, 4)}


#: float32: three SGD steps (lr 0.5) carry each step's rounding into the next one's weights; against float64 the
#: third step's gradients drift by up to ~7e-6 of their largest entry (decl_rgclg, decl_queue), and two float32
#: runs (here the ranks' reduction order and the CPU's kernels against one process's) by up to twice that
F32_TOL = 200 * torch.finfo(torch.float32).eps  # 2.4e-5
TOL = {"torch.float64": dict(rtol=1e-10, atol=1e-10), "torch.float32": dict(rtol=F32_TOL, atol=F32_TOL)}


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("dtype", ["torch.float64", "torch.float32"])
@pytest.mark.parametrize(
    "name, loss_name, kwargs", harness.NO_GRAD_CONFIGS, ids=[c[0] for c in harness.NO_GRAD_CONFIGS]
)
def test_no_grad_gather_equals_one_process(no_grad_results, world_size, dtype, name, loss_name, kwargs):
    """Loss, feature gradients, DDP parameter gradients and loss state of every step, on every rank."""
    single = harness.run(loss_name, kwargs, dtype=getattr(torch, dtype.split(".")[1]))
    b = harness.GLOBAL_BATCH // world_size
    for rank, res in enumerate(no_grad_results[world_size]):
        for step, (got, ref_step) in enumerate(zip(res[(name, dtype)], single)):
            where = f"step {step}, rank {rank}"
            torch.testing.assert_close(got["loss"], ref_step["loss"], **TOL[dtype], msg=f"loss, {where}")
            for a, ref_grad in zip(got["feature_grads"], ref_step["feature_grads"]):
                # each rank's loss is the mean over its own anchors: W times its share of the global mean
                want = world_size * ref_grad[rank * b : (rank + 1) * b]
                # float32 rounds relative to the largest entry (gradients reach ~100 at s = 100)
                tol = dict(TOL[dtype], atol=TOL[dtype]["atol"] * max(1.0, float(want.abs().max())))
                torch.testing.assert_close(a, want, **tol, msg=f"feature grad, {where}")
            for p, (a, ref_grad) in enumerate(zip(got["grads"], ref_step["grads"])):
                # a sum over the global batch, reduced in another order (and by other kernels) than in one process
                tol = dict(TOL[dtype], atol=TOL[dtype]["atol"] * max(1.0, float(ref_grad.abs().max())))
                torch.testing.assert_close(a, ref_grad, **tol, msg=f"grad {p}, {where}")
            for key, buf in ref_step["buffers"].items():
                # a 16-bit buffer rounds float32's last-bit differences to one of its own ulps
                tol = dict(rtol=2**-7, atol=1e-5) if buf.element_size() == 2 else TOL[dtype]
                torch.testing.assert_close(
                    got["buffers"][key], buf, **tol, equal_nan=True, msg=f"buffer {key}, {where}"
                )


@pytest.mark.parametrize("world_size", [2, 4])
def test_without_the_column_term_the_gradient_is_wrong(no_grad_results, world_size):
    """The check can fail: local rows against a plain all_gather miss the remote anchors' columns."""
    single = harness.run("clip", {})
    got = no_grad_results[world_size][0][("clip_plain_local", "torch.float64")][0]
    torch.testing.assert_close(got["loss"], single[0]["loss"], **TOL["torch.float64"])  # same value ...
    assert not torch.allclose(got["grads"][0], single[0]["grads"][0])  # ... not the gradient


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("name, loss_name, kwargs", harness.ACCUM_CONFIGS, ids=[c[0] for c in harness.ACCUM_CONFIGS])
def test_no_grad_gather_with_accumulation_equals_one_process(no_grad_results, world_size, name, loss_name, kwargs):
    single = harness.run(loss_name, kwargs, accum_freq=2)
    for rank, res in enumerate(no_grad_results[world_size]):
        for step, (got, ref_step) in enumerate(zip(res[(name, "accum")], single)):
            torch.testing.assert_close(got["loss"], ref_step["loss"], **TOL["torch.float64"])
            for a, ref_grad in zip(got["grads"], ref_step["grads"]):
                torch.testing.assert_close(a, ref_grad, **TOL["torch.float64"], msg=f"step {step}, rank {rank}")
            for key, buf in ref_step["buffers"].items():
                torch.testing.assert_close(got["buffers"][key], buf, **TOL["torch.float64"], equal_nan=True)


def test_accumulation_reference_is_the_full_batch_gradient():
    """The accumulated single-process reference is the plain full-batch gradient (stateless losses) for the
    encoders; the logit scale gets it once per micro-batch, as in OpenCLIP's loop (each call's forward
    returns the scale anew and every call's loss depends on it through all its logits)."""
    for _, loss_name, kwargs in harness.ACCUM_CONFIGS[:2]:
        plain, accum = harness.run(loss_name, kwargs), harness.run(loss_name, kwargs, accum_freq=2)
        a, b = plain[0], accum[0]  # the first step: the same weights
        for x, y in zip(a["grads"][:2], b["grads"][:2]):
            torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(2 * a["grads"][2], b["grads"][2], rtol=1e-10, atol=1e-12)
