"""Two (and four) gloo processes on CPU equal one process on the concatenated global batch.

For every loss, with ``gather_with_grad`` on and ``local_loss`` on and off: the loss value and the
DDP-averaged parameter gradients of each step equal those of one process; the loss buffers (DeCL
rates, queues, step counter) are identical on all ranks after every step. OpenCLIP's own
``ClipLoss`` runs through the same harness: the harness is right only if the baseline passes.
DeCL's sharded rate buffer equals the replicated one bit for bit (values, gradients, state), on 2
and 4 ranks, and each rank holds only its share of it.
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


def launch(python, out, world_size, mode="all", timeout=600):
    """torchrun with ``world_size`` ranks, processes of their own; ``python`` (the preloaded one, which the ranks
    start from too) saves torch's import in each."""
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")])
    cmd = [
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(world_size),
        str(HERE / "distributed" / "loss_harness.py"),
        str(out),
        mode,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    saved = sorted(p.name for p in out.glob("rank*.pt"))
    assert proc.returncode == 0, f"saved: {saved}\n" + proc.stdout[-3000:] + proc.stderr[-3000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory, preloaded):
    return launch(preloaded.python, tmp_path_factory.mktemp("gloo"), 2)


@pytest.fixture(scope="module")
def four_rank_results(tmp_path_factory, preloaded):
    return launch(preloaded.python, tmp_path_factory.mktemp("gloo4"), 4, "index")


CASES = [(name, loss, kw, local) for name, loss, kw in harness.CONFIGS for local in (False, True)]


@pytest.mark.parametrize(
    "name, loss_name, kwargs, local_loss", CASES, ids=[f"{c[0]}-{'local' if c[3] else 'global'}" for c in CASES]
)
def test_two_ranks_equal_one_process(rank_results, name, loss_name, kwargs, local_loss):
    single = harness.run(loss_name, kwargs)
    ranks = [r[(name, local_loss)] for r in rank_results]
    for step, ref_step in enumerate(single):
        for rank, recs in enumerate(ranks):
            got = recs[step]
            torch.testing.assert_close(
                got["loss"], ref_step["loss"], rtol=1e-10, atol=1e-12, msg=f"loss, step {step}, rank {rank}"
            )
            for p, (a, b) in enumerate(zip(got["grads"], ref_step["grads"])):
                torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=f"grad {p}, step {step}, rank {rank}")
            for key, buf in ref_step["buffers"].items():
                torch.testing.assert_close(
                    got["buffers"][key],
                    buf,
                    rtol=1e-10,
                    atol=1e-12,
                    equal_nan=True,
                    msg=f"buffer {key}, step {step}, rank {rank}",
                )
        for key, buf in ranks[0][step]["buffers"].items():  # replicas identical bit for bit
            assert torch.equal(torch.nan_to_num(buf), torch.nan_to_num(ranks[1][step]["buffers"][key])), key


def assert_twins_equal(results, sharded, replicated, local_loss):
    world_size = len(results)
    for step in range(harness.STEPS):
        for rank in range(world_size):
            a, b = results[rank][(sharded, local_loss)][step], results[rank][(replicated, local_loss)][step]
            assert torch.equal(a["loss"], b["loss"]), (step, rank)
            assert all(torch.equal(x, y) for x, y in zip(a["grads"], b["grads"])), (step, rank)
            assert a["buffers"].keys() == b["buffers"].keys()
            for key in a["buffers"]:
                assert torch.equal(a["buffers"][key].nan_to_num(-1e9), b["buffers"][key].nan_to_num(-1e9)), key
            assert a["digest"] == b["digest"] == results[0][(sharded, local_loss)][step]["digest"]
            # rank r keeps the ids r, r + W, ...: ceil((N - r) / W) columns, against all N when replicated
            assert a["shard_columns"] == (2, -(-(harness.NUM_SAMPLES - rank) // world_size))
            assert b["shard_columns"] == (2, harness.NUM_SAMPLES)


@pytest.mark.parametrize("local_loss", [False, True], ids=["global", "local"])
@pytest.mark.parametrize("sharded, replicated", harness.TWINS)
def test_sharded_state_equals_replicated_on_two_ranks(rank_results, sharded, replicated, local_loss):
    assert_twins_equal(rank_results, sharded, replicated, local_loss)


@pytest.mark.parametrize("local_loss", [False, True], ids=["global", "local"])
@pytest.mark.parametrize("sharded, replicated", harness.TWINS)
def test_sharded_state_equals_replicated_on_four_ranks(four_rank_results, sharded, replicated, local_loss):
    assert_twins_equal(four_rank_results, sharded, replicated, local_loss)


@pytest.mark.parametrize("name, loss_name, kwargs", harness.INDEX_CONFIGS, ids=[c[0] for c in harness.INDEX_CONFIGS])
def test_four_ranks_equal_one_process(four_rank_results, name, loss_name, kwargs):
    single = harness.run(loss_name, kwargs)
    for local_loss in (False, True):
        for rank, res in enumerate(four_rank_results):
            for step, ref_step in enumerate(single):
                got = res[(name, local_loss)][step]
                torch.testing.assert_close(got["loss"], ref_step["loss"], rtol=1e-10, atol=1e-12)
                for a, b in zip(got["grads"], ref_step["grads"]):
                    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
                for key, buf in ref_step["buffers"].items():
                    torch.testing.assert_close(got["buffers"][key], buf, rtol=1e-10, atol=1e-12, equal_nan=True)


def test_an_id_out_of_range_on_one_rank_stops_every_rank(tmp_path, preloaded):
    results = launch(preloaded.python, tmp_path, 2, "bad_id", timeout=120)  # a hang would time out
    for res in results:
        assert res["error"] and f"sample id {harness.NUM_SAMPLES + 7} is outside" in res["error"]


def test_harness_detects_a_wrong_gradient(rank_results):
    """The comparison is sharp enough to fail: plain all_gather (no gradient) is not the global loss."""
    single = harness.run("openclip", {})
    got = rank_results[0][("openclip_no_gather_grad", False)]
    torch.testing.assert_close(got[0]["loss"], single[0]["loss"])  # same value ...
    assert not all(torch.allclose(a, b) for a, b in zip(got[0]["grads"], single[0]["grads"]))  # ... wrong grads


@pytest.mark.parametrize("name", [c[0] for c in harness.NONFINITE_CONFIGS])
@pytest.mark.parametrize("bad", ["nan", "inf"])
def test_nonfinite_step_rolled_back_leaves_the_state_of_a_run_without_it(tmp_path, preloaded, name, bad):
    """Two gloo ranks, one NaN or inf feature entry in one step: only finite estimates and embeddings
    reach the state (counted), and once the step is rolled back (as for a step the GradScaler
    skipped) the digest is the one before it, and the next clean step's loss and state equal those
    of a run that never saw it."""
    results = _nonfinite_results(preloaded.python, tmp_path)
    for rank, res in enumerate(results):
        got = res[(name, bad)]
        assert got[("with_bad_step", "dropped")] > 0 and got[("with_bad_step", "finite_state")], rank
        assert got[("with_bad_step", "rolled_back")]
        assert got[("with_bad_step", 1, "digest")] == got[("without", 0, "digest")]
        assert got[("with_bad_step", 2, "digest")] == got[("without", 2, "digest")]
        assert torch.isfinite(got[("with_bad_step", 2, "loss")])
        assert torch.equal(got[("with_bad_step", 2, "loss")], got[("without", 2, "loss")])


_NONFINITE = {}


def _nonfinite_results(python, tmp_path):
    if "res" not in _NONFINITE:
        _NONFINITE["res"] = launch(python, tmp_path, 2, "nonfinite")
    return _NONFINITE["res"]
