"""``dcl`` with ``same_class="top"``: the same-class mass of each anchor's ``tau_plus N`` highest-scoring negatives.

Against the slow float64 re-computation ``loss_reference.dcl_top`` (an explicit sort of every row),
values and gradients (features and logit scale), with integer and fractional ``k``, ``M = 1`` and
``M > 1``, hard-negative weights and both clamp modes; ``tau_plus = 0`` is InfoNCE; the estimate is
continuous in ``tau_plus``; float32 keeps the mass left when the top few negatives hold nearly all of
it; ``tau_plus="auto"``; the refusals; and two gloo ranks against one process.
"""

from __future__ import annotations

import math

import loss_reference as ref
import pytest
import torch
import torch.nn.functional as F
from loss_reference import features

from clip_dcl.losses import create_loss

SCALES = [1.0, 14.3, 100.0]


def value_and_grads(fn, f, g, s):
    lf, lg = f.clone().requires_grad_(), g.clone().requires_grad_()
    ls = torch.tensor(s, dtype=f.dtype, requires_grad=True)
    out = fn(lf, lg, ls)
    value = out[0] if isinstance(out, tuple) else out
    return value.detach(), torch.autograd.grad(value, (lf, lg, ls)), out


def assert_close_all(a, b, rtol=1e-9, atol=1e-10):
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=rtol, atol=atol)


def top(**kwargs):
    return create_loss("dcl", same_class="top", **kwargs)


# --------------------------------------------------------------------------------------------
# against the reference

# (n, m, tau_plus): N = (n - 1) m image negatives and n - 1 caption negatives; the comments give k = tau_plus N
CASES = [
    (5, 1, 0.25),  # k = 1, 1 (integer)
    (5, 1, 0.3),  # k = 1.2, 1.2
    (5, 1, 0.55),  # k = 2.2, 2.2
    (2, 1, 0.5),  # N = 1: k = 0.5, the single negative half set aside
    (4, 2, 0.25),  # k = 1.5 (images), 0.75 (captions)
    (4, 2, 0.5),  # k = 3, 1.5
    (3, 3, 0.5),  # k = 3, 1
    (6, 3, 0.1),  # k = 1.5, 0.5
]


@pytest.mark.parametrize("n, m, tau_plus", CASES)
@pytest.mark.parametrize("beta", [0.0, 0.5])
@pytest.mark.parametrize("s", SCALES)
def test_top_matches_the_sorted_reference(n, m, tau_plus, beta, s):
    f, g = features(n, m, seed=10 * n + m)
    for clamp in ("clamp", "biased"):
        loss = top(tau_plus=tau_plus, beta=beta, clamp=clamp)
        got, got_grads, _ = value_and_grads(loss, f, g, s)
        want, want_grads, (_, rate) = value_and_grads(
            lambda a, b, c: ref.dcl_top(a, b, c, tau_plus, clamp, beta), f, g, s
        )
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
        assert_close_all(got_grads, want_grads)
        assert float(loss.metrics["clamp_rate"]) == pytest.approx(rate)


def test_the_cases_cover_integer_and_fractional_k_in_both_directions():
    ks = {(n - 1) * m * t for n, m, t in CASES} | {(n - 1) * t for n, m, t in CASES}
    assert any(k == int(k) and k >= 1 for k in ks) and any(k != int(k) and k > 1 for k in ks)
    assert any(0 < k < 1 for k in ks)


def test_top_differs_from_the_papers_estimate_and_from_infonce():
    f, g = features(8, 2, seed=3, align=1.0)
    s = torch.tensor(20.0, dtype=torch.float64)
    values = [create_loss("dcl", tau_plus=0.2, same_class=c)(f, g, s) for c in ("positive", "top")]
    values.append(create_loss("clip")(f, g, s))
    assert min(abs(float(a - b)) for a, b in ((values[0], values[1]), (values[1], values[2]))) > 1e-3


# --------------------------------------------------------------------------------------------
# tau_plus = 0 and continuity


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("s", SCALES)
def test_tau_zero_is_infonce(m, s):
    f, g = features(6, m, seed=2)
    clip_value, clip_grads, _ = value_and_grads(create_loss("clip"), f, g, s)
    value, grads, _ = value_and_grads(top(tau_plus=0.0), f, g, s)
    torch.testing.assert_close(value, clip_value, rtol=1e-12, atol=1e-12)
    assert_close_all(grads, clip_grads, rtol=1e-10, atol=1e-12)
    want = ref.dcl_top(f, g, torch.tensor(s, dtype=torch.float64), 0.0)[0]
    torch.testing.assert_close(value, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("m", [1, 2])
def test_the_estimate_is_continuous_in_tau_plus(m):
    """Towards 0 it tends to InfoNCE through the top machinery; across each integer k it does not jump."""
    n, s = 6, torch.tensor(12.0, dtype=torch.float64)
    f, g = features(n, m, seed=5, align=0.5)
    tiny = top(tau_plus=1e-9)(f, g, s)
    torch.testing.assert_close(tiny, create_loss("clip")(f, g, s), rtol=1e-7, atol=1e-8)
    big_n = (n - 1) * m
    for k in range(1, big_n):
        below, above = top(tau_plus=k / big_n - 1e-9)(f, g, s), top(tau_plus=k / big_n + 1e-9)(f, g, s)
        assert abs(float(above - below)) < 1e-6, k
    # and it moves: removing more of the top changes the loss
    assert abs(float(top(tau_plus=1 / big_n)(f, g, s) - top(tau_plus=2 / big_n)(f, g, s))) > 1e-4


# --------------------------------------------------------------------------------------------
# the floor, and float32


def paired(n, d=32, pos_cos=0.8, neg_cos=0.2, seed=0, dtype=torch.float64):
    """Unit features whose pairs have cosine ``pos_cos`` and whose other pairs about ``neg_cos``."""
    gen = torch.Generator().manual_seed(seed)
    shared = F.normalize(torch.randn(d, generator=gen, dtype=dtype), dim=0)
    own = F.normalize(torch.randn(n, d, generator=gen, dtype=dtype), dim=-1)
    share = neg_cos / pos_cos  # cos(f_i, f_j) about this, so cos(f_i, g_j) about neg_cos
    f = F.normalize(math.sqrt(share) * shared + math.sqrt(1 - share) * own, dim=-1)
    noise = F.normalize(torch.randn(n, d, generator=gen, dtype=dtype), dim=-1)
    noise = F.normalize(noise - (noise * f).sum(-1, keepdim=True) * f, dim=-1)  # orthogonal to f
    # cos(f, g) = pos_cos exactly; the others meet through the shared direction
    g = pos_cos * f + math.sqrt(1 - pos_cos**2) * noise
    return f, g


@pytest.mark.parametrize("tau_plus", [0.021, 0.05])
def test_paired_captions_floor_the_papers_estimate_and_not_top(tau_plus):
    """The issue's case: the positive scores far above every negative, so N tau_plus pbar_i overshoots."""
    f, g = paired(64)
    s = torch.tensor(30.0, dtype=torch.float64)
    positive = create_loss("dcl", tau_plus=tau_plus)
    positive(f, g, s)
    ours = top(tau_plus=tau_plus)
    ours(f, g, s)
    assert float(positive.metrics["clamp_rate"]) > 0.9
    assert float(ours.metrics["clamp_rate"]) == 0.0


@pytest.mark.parametrize("tau_plus", [0.3, 0.6, 0.9])
def test_the_floor_does_not_bite_off_the_minimum_score(tau_plus):
    """The negatives left after the top k score above exp(-s) unless they are all opposite the anchor,
    so on random and on aligned features no row is floored, even at s = 100 and a large tau_plus."""
    for seed in range(4):
        for align in (0.0, 2.0):
            f, g = features(12, 2, seed=seed, dtype=torch.float32, align=align)
            loss = top(tau_plus=tau_plus)
            loss(f, g, torch.tensor(100.0))
            assert float(loss.metrics["clamp_rate"]) == 0.0, (seed, align)


def test_at_the_minimum_score_the_estimate_is_the_floor():
    """Image 0's negatives: g1 (cosine 0) and g2 (cosine -1, the minimum score exp(-s)). With k = 1, g1 is
    set aside and the estimate is N exp(-s) = 2 exp(-s), the floor; with k < 1 part of g1 stays."""
    from clip_dcl.losses.dcl import debiased_log_negatives
    from clip_dcl.losses.gather import anchor_stats

    f = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]], dtype=torch.float64)
    g = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
    s = torch.tensor(5.0, dtype=torch.float64)
    for tau_plus, want in ((0.5, math.log(2) - 5.0), (0.25, math.log((0.5 * 1.0 + math.exp(-5.0)) / 0.75))):
        st = anchor_stats(f, g, s, top_share=tau_plus)
        log_ng, _ = debiased_log_negatives(st.image, 2, tau_plus, s, same_class="top")
        assert float(log_ng[0]) == pytest.approx(want, abs=1e-12)


def test_float32_keeps_a_tail_that_the_top_nearly_swamps():
    """Rows whose highest negative holds nearly all the mass at s = 100: ``neg - top`` would cancel in
    float32; the sum over the negatives left does not."""
    gen = torch.Generator().manual_seed(7)
    f = F.normalize(torch.randn(8, 16, generator=gen, dtype=torch.float64), dim=-1)
    g = F.normalize(f + 0.05 * torch.randn(8, 16, generator=gen, dtype=torch.float64), dim=-1)
    g = torch.cat([g[:1], F.normalize(f[:1] + 0.06 * torch.randn(1, 16, generator=gen, dtype=torch.float64)), g[2:]])
    s = 100.0
    logits = s * f @ g.T
    logits.fill_diagonal_(float("-inf"))
    top1, second = logits[0].topk(2).values
    assert float(top1 - second) > 20  # exp(-20) ~ 2e-9: below float32's resolution of the row's mass
    want, want_grads, _ = value_and_grads(lambda a, b, c: ref.dcl_top(a, b, c, 1 / 7), f, g, s)
    got, got_grads, _ = value_and_grads(top(tau_plus=1 / 7), f.float(), g.float(), s)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a.double(), b, rtol=1e-3, atol=1e-3 * max(1.0, float(b.abs().max())))


@pytest.mark.parametrize("kwargs", [{"tau_plus": 0.1}, {"tau_plus": 0.3, "beta": 1.0, "clamp": "biased"}])
@pytest.mark.parametrize("m", [1, 3])
def test_bf16_autocast_at_max_scale_is_finite(kwargs, m):
    f, g = features(16, m, dtype=torch.float32, align=4.0)
    f, g = f.bfloat16().requires_grad_(), g.bfloat16().requires_grad_()
    s = torch.tensor(100.0, requires_grad=True)
    loss = top(**kwargs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = loss(f, g, s)
    assert torch.isfinite(value)
    assert all(torch.isfinite(x).all() for x in torch.autograd.grad(value, (f, g, s)))


# --------------------------------------------------------------------------------------------
# tau_plus auto, arguments, flag


def test_auto_uses_the_estimate_of_the_call_as_a_fixed_prior_would():
    f, g = features(32, 2, seed=8, align=0.5)
    s = torch.tensor(15.0, dtype=torch.float64)
    auto = top(tau_plus="auto", tau_momentum=1.0)
    papers = create_loss("dcl", tau_plus="auto", tau_momentum=1.0)
    got, got_grads, _ = value_and_grads(auto, f, g, 15.0)
    papers(f, g, s)
    tau = float(auto.tau_plus_estimate)  # the value used (the metric is a float32 copy of it)
    assert 0.0 < tau == float(papers.tau_plus_estimate)  # the same estimator on the same batch
    assert float(auto.metrics["tau_plus"]) == pytest.approx(tau)
    want, want_grads, _ = value_and_grads(top(tau_plus=tau), f, g, 15.0)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert_close_all(got_grads, want_grads)
    auto.eval()
    fresh = top(tau_plus="auto")
    fresh.eval()  # no estimate yet: tau_plus 0, InfoNCE
    torch.testing.assert_close(fresh(f, g, s), create_loss("clip")(f, g, s))


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(same_class="negatives"), "same_class='negatives'"),
        (dict(same_class="top", no_grad_gather=True, local_loss=True), "same_class='top'"),
    ],
)
def test_bad_arguments_name_the_value(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        create_loss("dcl", **kwargs)


def test_the_flag_reaches_the_loss():
    from clip_dcl.losses import DebiasedClipLoss

    flag = {f.flag: f for f in DebiasedClipLoss.flags}["--dcl-same-class"]
    assert flag.kwarg == "same_class" and flag.choices == ("positive", "top") and "ours" in flag.help
    assert create_loss("dcl").same_class == "positive"  # the paper's, by default
    assert "same_class='top'" in repr(top(tau_plus=0.1))


# --------------------------------------------------------------------------------------------
# two gloo ranks


@pytest.mark.slow
def test_two_ranks_equal_one_process(tmp_path, preloaded):
    """``gather_with_grad`` with ``local_loss`` off and on: loss and DDP-averaged gradients of each step, and
    the auto prior's buffer, as one process on the concatenated batch (the harness's check of every loss)."""
    from test_losses_distributed import harness, launch

    results = launch(preloaded.python, tmp_path, 2, "same_class")
    for name, loss_name, kwargs in harness.SAME_CLASS_CONFIGS:
        single = harness.run(loss_name, kwargs)
        for local_loss in (False, True):
            for rank, res in enumerate(results):
                for step, (got, want) in enumerate(zip(res[(name, local_loss)], single)):
                    where = f"{name}, local_loss={local_loss}, step {step}, rank {rank}"
                    torch.testing.assert_close(got["loss"], want["loss"], rtol=1e-10, atol=1e-12, msg=where)
                    for a, b in zip(got["grads"], want["grads"]):
                        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=where)
                    for key, buf in want["buffers"].items():
                        torch.testing.assert_close(
                            got["buffers"][key], buf, rtol=1e-10, atol=1e-12, equal_nan=True, msg=where
                        )


def test_the_command_line_takes_the_flag_and_refuses_it_with_no_grad_gather(capsys, tmp_path):
    from clip_dcl.train import main
    from clip_dcl.train.flags import parse_train_args

    base = ["--dataset-type", "synthetic", "--train-num-samples", "8", "--device", "cpu", "--loss", "dcl"]
    cfg = parse_train_args(base + ["--dcl-same-class", "top", "--tau-plus", "0.02"])
    assert cfg.loss_args["same_class"] == "top" and cfg.loss_args["tau_plus"] == 0.02
    assert parse_train_args(base).loss_args["same_class"] == "positive"
    logs = tmp_path / "logs"
    rc = main(base + ["--logs", str(logs), "--dcl-same-class", "top", "--no-grad-gather", "--local-loss"])
    assert rc == 2 and "--dcl-same-class" in capsys.readouterr().err and not logs.exists()
