"""Two gloo processes on CPU equal one process on the concatenated global batch.

For every loss, with ``gather_with_grad`` on and ``local_loss`` on and off: the loss value and the
DDP-averaged parameter gradients of each step equal those of one process; the loss buffers (DeCL
rates, queues, step counter) are identical on both ranks after every step. OpenCLIP's own
``ClipLoss`` runs through the same harness: the harness is right only if the baseline passes.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "distributed"))
import loss_harness as harness  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("gloo")
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(HERE / "distributed" / "loss_harness.py"), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


CASES = [(name, loss, kw, local) for name, loss, kw in harness.CONFIGS for local in (False, True)]


@pytest.mark.parametrize("name, loss_name, kwargs, local_loss", CASES,
                         ids=[f"{c[0]}-{'local' if c[3] else 'global'}" for c in CASES])
def test_two_ranks_equal_one_process(rank_results, name, loss_name, kwargs, local_loss):
    single = harness.run(loss_name, kwargs)
    ranks = [r[(name, local_loss)] for r in rank_results]
    for step, ref_step in enumerate(single):
        for rank, recs in enumerate(ranks):
            got = recs[step]
            torch.testing.assert_close(got["loss"], ref_step["loss"], rtol=1e-10, atol=1e-12,
                                       msg=f"loss, step {step}, rank {rank}")
            for p, (a, b) in enumerate(zip(got["grads"], ref_step["grads"])):
                torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=f"grad {p}, step {step}, rank {rank}")
            for key, buf in ref_step["buffers"].items():
                torch.testing.assert_close(got["buffers"][key], buf, rtol=1e-10, atol=1e-12, equal_nan=True,
                                           msg=f"buffer {key}, step {step}, rank {rank}")
        for key, buf in ranks[0][step]["buffers"].items():  # replicas identical bit for bit
            assert torch.equal(torch.nan_to_num(buf), torch.nan_to_num(ranks[1][step]["buffers"][key])), key


def test_harness_detects_a_wrong_gradient(rank_results):
    """The comparison is sharp enough to fail: plain all_gather (no gradient) is not the global loss."""
    single = harness.run("openclip", {})
    got = rank_results[0][("openclip_no_gather_grad", False)]
    torch.testing.assert_close(got[0]["loss"], single[0]["loss"])  # same value ...
    assert not all(torch.allclose(a, b) for a, b in zip(got[0]["grads"], single[0]["grads"]))  # ... wrong grads
