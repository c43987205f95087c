"""M captions per image (DCL Eq. 6-7), hard negatives (HCL), the block loss (CURL) and tau_plus="auto".

Every loss against the slow float64 re-computations of ``loss_reference`` (values and gradients),
and the reductions that must hold exactly: ``M = 1`` and ``beta = 0`` are today's ``dcl``, ``curl``
with blocks of one is InfoNCE, ``dcl`` with ``tau_plus = 0`` and M positives is ``clip`` with M.
"""

from __future__ import annotations

import math
import warnings

import loss_reference as ref
import pytest
import torch
import torch.nn.functional as F
from loss_reference import features

from clip_dcl.losses import LOSSES, BlockContrastiveLoss, create_loss, register_loss
from clip_dcl.losses.base import ContrastiveLoss
from clip_dcl.losses.gather import anchor_stats

SCALES = [1.0, 14.3, 100.0]


def leaves(f, g, s):
    return (f.clone().requires_grad_(), g.clone().requires_grad_(), torch.tensor(s, dtype=f.dtype, requires_grad=True))


def value_and_grads(fn, f, g, s):
    lf, lg, ls = leaves(f, g, s)
    out = fn(lf, lg, ls)
    value = out[0] if isinstance(out, tuple) else out
    return value.detach(), torch.autograd.grad(value, (lf, lg, ls)), out


def assert_close_all(a, b, rtol=1e-9, atol=1e-10):
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=rtol, atol=atol)


# --------------------------------------------------------------------------------------------
# anchor statistics with M captions


@pytest.mark.parametrize("m", [2, 3])
def test_anchor_stats_with_m_captions_are_the_blocks(m):
    f, g = features(5, m)
    s = torch.tensor(7.0, dtype=torch.float64)
    st = anchor_stats(f, g, s)
    logits = s * f @ g.T  # (5, 5 m)
    for i in range(5):
        own = list(range(i * m, i * m + m))
        torch.testing.assert_close(st.image.pos[i], logits[i, own])
        others = [j for j in range(5 * m) if j not in own]
        torch.testing.assert_close(st.image.lse_neg[i], torch.logsumexp(logits[i, others], 0))
    for c in range(5 * m):
        torch.testing.assert_close(st.text.pos[c], logits[c // m, c])
        torch.testing.assert_close(
            st.text.lse_neg[c], torch.logsumexp(torch.cat([logits[: c // m, c], logits[c // m + 1 :, c]]), 0)
        )
    assert (st.image.num_negatives, st.text.num_negatives, st.captions_per_image) == (4 * m, 4, m)


@pytest.mark.parametrize("rows", [5, 7, 0])
def test_text_rows_must_be_a_multiple_of_the_images(rows):
    f, _ = features(3)
    g = F.normalize(torch.randn(rows, 16, dtype=torch.float64), dim=-1)
    with pytest.raises(ValueError, match=rf"\(3, 16\) and \({rows}, 16\)"):
        create_loss("dcl", tau_plus=0.1)(f, g, torch.tensor(5.0, dtype=torch.float64))


# --------------------------------------------------------------------------------------------
# dcl with M positives and hard negatives


@pytest.mark.parametrize("n, m", [(2, 3), (4, 2), (6, 3), (5, 1)])
@pytest.mark.parametrize("tau_plus", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("s", SCALES)
def test_dcl_general_matches_reference(n, m, tau_plus, beta, s):
    f, g = features(n, m, seed=n + m)
    for clamp in ("clamp", "biased"):
        loss = create_loss("dcl", tau_plus=tau_plus, beta=beta, clamp=clamp)
        got, got_grads, _ = value_and_grads(loss, f, g, s)
        want, want_grads, (_, rate) = value_and_grads(
            lambda a, b, c: ref.dcl_general(a, b, c, tau_plus, clamp, beta), f, g, s
        )
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
        assert_close_all(got_grads, want_grads)
        assert float(loss.metrics["clamp_rate"]) == pytest.approx(rate)


def test_the_hard_negative_clamp_and_the_m_estimate_are_exercised():
    """Some cases above clamp rows and some do not, so both branches are compared with the reference."""
    rates = set()
    for s in SCALES:
        for tau_plus in (0.1, 0.3):
            f, g = features(4, 2, seed=6)
            loss = create_loss("dcl", tau_plus=tau_plus, beta=1.0)
            loss(f, g, torch.tensor(s, dtype=torch.float64))
            rates.add(float(loss.metrics["clamp_rate"]))
    assert min(rates) == 0.0 and max(rates) > 0.0


@pytest.mark.parametrize("tau_plus", [0.0, 0.1, 0.4])
@pytest.mark.parametrize("clamp", ["clamp", "biased"])
@pytest.mark.parametrize("s", SCALES)
def test_beta_zero_and_one_caption_are_todays_dcl_bit_for_bit(tau_plus, clamp, s):
    f, g = features(9, 1, seed=3, dtype=torch.float32)
    base = create_loss("dcl", tau_plus=tau_plus, clamp=clamp)
    plain, plain_grads, _ = value_and_grads(base, f, g, s)
    # today's dcl, written out: Eq. 7 on the (pos, lse_neg) of one positive per anchor
    st = anchor_stats(*leaves(f, g, s))
    assert st.image.pos.dim() == 1
    explicit = create_loss("dcl", tau_plus=tau_plus, clamp=clamp, beta=0.0)
    value, grads_, _ = value_and_grads(explicit, f, g, s)
    assert torch.equal(value, plain)
    assert all(torch.equal(a, b) for a, b in zip(grads_, plain_grads))
    want, _, _ = value_and_grads(
        lambda a, b, c: ref.dcl(a.double(), b.double(), c.double(), tau_plus, clamp)[0], f, g, s
    )
    torch.testing.assert_close(plain.double(), want, rtol=2e-5, atol=2e-5)


def test_small_beta_tends_to_dcl_and_large_beta_differs():
    f, g = features(8, 2, seed=1)
    s = torch.tensor(10.0, dtype=torch.float64)
    plain = create_loss("dcl", tau_plus=0.1)(f, g, s)
    near = create_loss("dcl", tau_plus=0.1, beta=1e-7)(f, g, s)
    far = create_loss("dcl", tau_plus=0.1, beta=2.0)(f, g, s)
    torch.testing.assert_close(near, plain, rtol=1e-6, atol=1e-8)
    assert abs(float(far - plain)) > 1e-3


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("s", SCALES)
def test_dcl_tau_zero_with_m_captions_is_clip_with_m(m, s):
    f, g = features(6, m, seed=2)
    clip_value, clip_grads, _ = value_and_grads(create_loss("clip"), f, g, s)
    dcl_value, dcl_grads, _ = value_and_grads(create_loss("dcl", tau_plus=0.0), f, g, s)
    torch.testing.assert_close(clip_value, dcl_value, rtol=1e-12, atol=1e-12)
    assert_close_all(clip_grads, dcl_grads, rtol=1e-10, atol=1e-12)
    ref_value = ref.dcl_general(f, g, torch.tensor(s, dtype=torch.float64), 0.0)[0]
    torch.testing.assert_close(clip_value, ref_value, rtol=1e-10, atol=1e-12)


def test_more_captions_change_the_dcl_estimate():
    """The positive term is the mean of the M scores: dropping captions 2..M changes the loss."""
    f, g = features(6, 3, seed=4, align=0.5)
    s = torch.tensor(10.0, dtype=torch.float64)
    with_three = create_loss("dcl", tau_plus=0.2)(f, g, s)
    first_only = create_loss("dcl", tau_plus=0.2)(f, g[::3], s)
    assert abs(float(with_three - first_only)) > 1e-3


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(beta=-0.5), "beta=-0.5"),
        (dict(beta=float("inf")), "beta=inf"),
        (dict(tau_plus="sometimes"), "tau_plus='sometimes'"),
        (dict(temperature=0.0), "temperature=0.0"),
        (dict(tau_plus="auto", tau_momentum=0.0), "tau_momentum=0.0"),
        (dict(beta=1.0, no_grad_gather=True, local_loss=True), "beta=1 "),
        (dict(temperature=0.1, no_grad_gather=True, local_loss=True), "temperature=0.1"),
    ],
)
def test_dcl_bad_arguments_name_the_value(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        create_loss("dcl", **kwargs)


def test_no_grad_gather_refuses_m_captions():
    f, g = features(4, 2)
    loss = create_loss("dcl", tau_plus=0.1, no_grad_gather=True, local_loss=True)
    with pytest.raises(ValueError, match="one caption per image; got 8 text rows for 4 images"):
        loss(f, g, torch.tensor(5.0, dtype=torch.float64))


def test_fixed_temperature_replaces_the_learned_scale():
    f, g = features(6, 2, seed=5)
    fixed = create_loss("dcl", tau_plus=0.1, temperature=0.2)
    lf, lg, ls = leaves(f, g, 55.0)
    value = fixed(lf, lg, ls)
    assert torch.autograd.grad(value, ls, allow_unused=True)[0] is None  # the scale gets no gradient
    want = ref.dcl_general(f, g, torch.tensor(5.0, dtype=torch.float64), 0.1)[0]
    torch.testing.assert_close(value.detach(), want, rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------------------------
# curl


@pytest.mark.parametrize("n, m", [(2, 1), (5, 1), (3, 2), (5, 3)])
@pytest.mark.parametrize("link", ["logistic", "hinge"])
@pytest.mark.parametrize("s", SCALES)
def test_curl_matches_reference(n, m, link, s):
    f, g = features(n, m, seed=10 * n + m)
    got, got_grads, _ = value_and_grads(create_loss("curl", link=link), f, g, s)
    want, want_grads, _ = value_and_grads(lambda a, b, c: ref.curl(a, b, c, link), f, g, s)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert_close_all(got_grads, want_grads)


@pytest.mark.parametrize("s", SCALES)
def test_curl_with_blocks_of_one_is_infonce(s):
    f, g = features(7, 1, seed=8)
    a, a_grads, _ = value_and_grads(create_loss("curl"), f, g, s)
    b, b_grads, _ = value_and_grads(create_loss("clip"), f, g, s)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert_close_all(a_grads, b_grads, rtol=1e-10, atol=1e-12)


def test_curl_blocks_differ_from_clip_with_m():
    f, g = features(5, 3, seed=9)
    s = torch.tensor(10.0, dtype=torch.float64)
    assert abs(float(create_loss("curl")(f, g, s) - create_loss("clip")(f, g, s))) > 1e-3


def test_curl_hinge_reports_active_rows_and_refuses_no_grad_gather():
    f, g = features(6, 2, seed=2, align=3.0)
    loss = create_loss("curl", link="hinge")
    loss(f, g, torch.tensor(30.0, dtype=torch.float64))
    assert 0.0 <= float(loss.metrics["active_rate"]) <= 1.0 and float(loss.metrics["block_size"]) == 2.0
    with pytest.raises(ValueError, match="link='softmax'"):
        create_loss("curl", link="softmax")
    with pytest.raises(ValueError, match="no_grad_gather=True is not available for curl"):
        create_loss("curl", no_grad_gather=True, local_loss=True)


# --------------------------------------------------------------------------------------------
# decl with M captions


def rows_of_ids(per_id, m):
    """Per-id rates ``(2, n)`` as each anchor row reads them: the images', and each caption its image's."""
    return [per_id[0], per_id[1].repeat_interleave(m)]


@pytest.mark.parametrize("n, m", [(3, 2), (5, 3), (4, 1)])
@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("s", SCALES)
def test_decl_batch_rate_with_m_captions_matches_reference(n, m, lam, s):
    f, g = features(n, m, seed=20 * n + m)
    loss_fn = create_loss(
        "decl",
        estimate="absolute",
        temperature_mode="learned",
        rate="batch",
        schedule="constant",
        lam=lam,
        sample_u=False,
    )
    got, got_grads, _ = value_and_grads(loss_fn, f, g, s)
    rates = ref.row_mean_negative_scores(f, g, torch.tensor(s, dtype=torch.float64))  # each row's own estimate
    ones = [torch.ones_like(r) for r in rates]
    want, want_grads, (_, l1, l2) = value_and_grads(
        lambda a, b, c: ref.decl_general(a, b, c, rates, ones, lam), f, g, s
    )
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert_close_all(got_grads, want_grads, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(loss_fn.metrics["loss1"], l1.detach(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(loss_fn.metrics["loss2"], l2.detach(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("rate", ["batch", "queue", "index"])
def test_decl_lambda_zero_with_m_captions_is_clip_with_m(m, rate):
    f, g = features(6, m, seed=4)
    kw = {"num_samples": 6} if rate == "index" else {}
    decl = create_loss("decl", temperature_mode="learned", rate=rate, schedule="constant", lam=0.0, **kw)
    a, a_grads, _ = value_and_grads(lambda x, y, z: decl(x, y, z, sample_ids=torch.arange(6)), f, g, 12.0)
    b, b_grads, _ = value_and_grads(create_loss("clip"), f, g, 12.0)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert_close_all(a_grads, b_grads, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("first_visit, include_current", [("batch", False), ("mean", False), ("batch", True)])
def test_decl_index_with_m_captions_keeps_one_rate_per_id_and_direction(first_visit, include_current):
    """Over steps with revisits, first visits and a repeated id: each id's text-direction rate is the
    mean of its M captions' estimates, read by every one of its captions (float64 re-computation)."""
    gamma, s, n, m = 0.3, 15.0, 6, 3
    loss_fn = create_loss(
        "decl",
        estimate="absolute",
        temperature_mode="learned",
        rate="index",
        num_samples=10,
        gamma=gamma,
        schedule="decl",
        sample_u=False,
        first_visit=first_visit,
        include_current=include_current,
    )
    tracker = ref.IndexRates(gamma, first_visit=first_visit, include_current=include_current)
    id_batches = [
        torch.tensor([0, 1, 2, 3, 4, 5]),
        torch.tensor([6, 7, 2, 3, 8, 9]),
        torch.tensor([1, 1, 4, 9, 0, 7]),
        torch.tensor([5, 6, 8, 2, 3, 1]),
    ]
    for step, ids in enumerate(id_batches):
        f, g = features(n, m, seed=300 + step)
        got, got_grads, _ = value_and_grads(lambda x, y, z: loss_fn(x, y, z, sample_ids=ids), f, g, s)
        per_id = tracker.visit(ids, ref.id_mean_negative_scores(f, g, torch.tensor(s, dtype=torch.float64)))
        rates = rows_of_ids(per_id, m)
        ones = [torch.ones_like(r) for r in rates]
        want, want_grads, _ = value_and_grads(lambda a, b, c: ref.decl_general(a, b, c, rates, ones, 1.0), f, g, s)
        # the buffer holds float32 log-rates
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert_close_all(got_grads, want_grads, rtol=1e-4, atol=1e-6)
    for d in range(2):
        for sid in range(10):
            torch.testing.assert_close(float(loss_fn.log_rate[d, sid]), tracker.log_rate(d, sid), rtol=1e-5, atol=1e-5)


def test_decl_index_text_rate_is_the_mean_over_the_captions_not_one_caption():
    f, g = features(5, 3, seed=12)
    s = torch.tensor(9.0, dtype=torch.float64)
    loss_fn = create_loss(
        "decl", estimate="absolute", temperature_mode="learned", rate="index", num_samples=5, drift_correction=False
    )
    loss_fn(f, g, s, sample_ids=torch.arange(5))
    rows = ref.row_mean_negative_scores(f, g, s)[1].reshape(5, 3)
    stored = loss_fn.log_rate[1].double()
    torch.testing.assert_close(stored, rows.mean(dim=1).log(), rtol=1e-6, atol=1e-6)
    assert (stored - rows[:, 0].log()).abs().max() > 1e-3  # the captions' estimates differ: the mean is not one


@pytest.mark.parametrize("include_current", [False, True])
def test_decl_queue_with_m_captions_matches_reference(include_current):
    """Image anchors against the queued captions (one per earlier image: the first of its M), captions
    against the queued images; the batch at the first step."""
    s, n, m, q = 12.0, 4, 3, 6
    loss_fn = create_loss(
        "decl",
        estimate="absolute",
        temperature_mode="learned",
        rate="queue",
        queue_size=q,
        schedule="decl",
        sample_u=False,
        include_current=include_current,
    )
    history_img, history_txt = [], []
    for step in range(3):
        f, g = features(n, m, seed=400 + step)
        got, got_grads, _ = value_and_grads(loss_fn, f, g, s)
        rates = []
        for d, (anchors, cands, hist) in enumerate([(f, g, history_txt), (g, f, history_img)]):
            queue = torch.cat(hist)[-q:].double() if hist else cands[:0]  # the queue stores float32
            row = []
            for i in range(anchors.shape[0]):
                own = range(i * m, i * m + m) if d == 0 else [i // m]
                batch = [torch.exp(s * anchors[i] @ cands[k]) for k in range(cands.shape[0]) if k not in own]
                queued = [torch.exp(s * anchors[i] @ queue[k]) for k in range(queue.shape[0])]
                scores = queued + batch if (include_current or not queued) else queued
                row.append(sum(scores) / len(scores))
            rates.append(torch.stack(row).detach())
        ones = [torch.ones_like(r) for r in rates]
        want, want_grads, _ = value_and_grads(lambda a, b, c: ref.decl_general(a, b, c, rates, ones, 1.0), f, g, s)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert_close_all(got_grads, want_grads, rtol=1e-4, atol=1e-6)
        history_img.append(f.float())
        history_txt.append(g[::m].float())
    assert int(loss_fn.queue_count) == q


def test_decl_draws_one_u_per_anchor_row_with_m_captions():
    """``sample_u``: G image draws, then G M caption draws, from the generator seeded by (seed, step)."""
    n, m, s, seed = 5, 3, 8.0, 7
    f, g = features(n, m, seed=1)
    loss_fn = create_loss(
        "decl", estimate="absolute", temperature_mode="learned", rate="batch", schedule="decl", sample_u=True, seed=seed
    )
    got, got_grads, _ = value_and_grads(loss_fn, f, g, s)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + 1)
    eps = torch.empty(1 + m, n, dtype=torch.float64).exponential_(1.0, generator=gen)
    draws = [eps[0], eps[1:].reshape(-1)]
    assert len(set(draws[1].tolist())) == n * m  # every caption its own draw
    rates = ref.row_mean_negative_scores(f, g, torch.tensor(s, dtype=torch.float64))
    want, want_grads, _ = value_and_grads(lambda a, b, c: ref.decl_general(a, b, c, rates, draws, 1.0), f, g, s)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert_close_all(got_grads, want_grads, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("dcl", {"tau_plus": 0.1, "beta": 1.0}),
        ("dcl", {"tau_plus": 0.2}),
        ("curl", {}),
        ("curl", {"link": "hinge"}),
        ("clip", {}),
        ("decl", {"rate": "batch", "sample_u": True}),
        ("decl", {"rate": "queue"}),
    ],
)
def test_bf16_autocast_with_m_captions_at_max_scale_is_finite(name, kwargs):
    f, g = features(8, 3, dtype=torch.float32, align=4.0)
    f, g = f.bfloat16().requires_grad_(), g.bfloat16().requires_grad_()
    s = torch.tensor(100.0, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = create_loss(name, **kwargs)(f, g, s)
    assert torch.isfinite(value)
    assert all(torch.isfinite(x).all() for x in torch.autograd.grad(value, (f, g, s)))


# --------------------------------------------------------------------------------------------
# the registry


def test_register_loss_warns_when_it_replaces_a_name():
    class Mine(ContrastiveLoss):
        def compute(self, *args):
            raise NotImplementedError

    saved = dict(LOSSES)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            register_loss("mine-test")(Mine)  # a new name: silent
            register_loss("mine-test")(Mine)  # the same class again: silent
        with pytest.warns(UserWarning, match="register_loss\\('curl'\\) replaces .*BlockContrastiveLoss"):
            register_loss("curl")(Mine)
    finally:
        LOSSES.clear()
        LOSSES.update(saved)
    assert LOSSES["curl"] is BlockContrastiveLoss


def test_every_registered_loss_declares_flags_for_its_own_arguments():
    import inspect

    from clip_dcl.losses.base import ContrastiveLoss

    for name, cls in LOSSES.items():
        params = inspect.signature(cls).parameters
        for flag in getattr(cls, "flags", ()):
            if flag.kwarg not in params:  # a value the loss turns into its arguments from the data
                own = getattr(cls, "resolve_data_params", None)
                assert own is not None and own.__func__ is not ContrastiveLoss.resolve_data_params.__func__, (
                    name,
                    flag.flag,
                )
                assert flag.default_text, (name, flag.flag)  # the docs say how the default is resolved
            assert flag.flag.startswith("--") and flag.help


# --------------------------------------------------------------------------------------------
# tau_plus = "auto"


def test_auto_tau_plus_starts_at_infonce_and_logs_the_estimate():
    f, g = features(16, 2, seed=3)
    s = torch.tensor(10.0, dtype=torch.float64)
    auto = create_loss("dcl", tau_plus="auto")
    auto.eval()
    torch.testing.assert_close(auto(f, g, s), create_loss("clip")(f, g, s))  # no estimate yet: tau_plus 0
    assert auto.metrics["tau_plus"] == 0.0 and math.isnan(float(auto.tau_plus_estimate))
    auto.train()
    auto(f, g, s)
    assert "tau_plus_batch" in auto.metrics and not math.isnan(float(auto.tau_plus_estimate))
    state = auto.state_dict()
    assert "tau_plus_estimate" in state
    other = create_loss("dcl", tau_plus="auto")
    other.load_state_dict(state)
    assert float(other.tau_plus_estimate) == float(auto.tau_plus_estimate)


# the estimator itself
def clustered(labels, d=64, cls=1.0, inst=0.7, noise=0.5, seed=0):
    """Image and text embeddings of samples with latent classes ``labels``: class centre + a per-sample
    part shared by the pair + noise, so a pair scores above two samples of one class, which score above
    two of different classes."""
    gen = torch.Generator().manual_seed(seed)
    n, c = len(labels), int(max(labels)) + 1
    centres = torch.randn(c, d, generator=gen, dtype=torch.float64)
    y = torch.as_tensor(labels)
    own = torch.randn(n, d, generator=gen, dtype=torch.float64)
    f = F.normalize(
        cls * centres[y] + inst * own + noise * torch.randn(n, d, generator=gen, dtype=torch.float64), dim=-1
    )
    g = F.normalize(
        cls * centres[y] + inst * own + noise * torch.randn(n, d, generator=gen, dtype=torch.float64), dim=-1
    )
    return f, g


def test_two_gaussian_em_matches_scikit_learn():
    from sklearn.mixture import GaussianMixture

    from clip_dcl.losses.prior import fit_two_gaussians

    gen = torch.Generator().manual_seed(0)
    x = torch.cat(
        [
            torch.randn(3000, generator=gen, dtype=torch.float64) * 0.7 - 1.0,
            torch.randn(1000, generator=gen, dtype=torch.float64) * 0.4 + 1.5,
        ]
    )
    w, mu, var = fit_two_gaussians(x, (-0.5, 1.0), (1.0, 0.5), (0.9, 0.1), iters=1000, tol=1e-12)
    gm = GaussianMixture(
        2,
        weights_init=[0.9, 0.1],
        means_init=[[-0.5], [1.0]],
        precisions_init=[[[1.0]], [[2.0]]],
        tol=1e-12,
        max_iter=1000,
        reg_covar=0.0,
    ).fit(x.numpy()[:, None])
    torch.testing.assert_close(w, torch.as_tensor(gm.weights_), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(mu, torch.as_tensor(gm.means_[:, 0]), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(var, torch.as_tensor(gm.covariances_[:, 0, 0]), rtol=1e-5, atol=1e-6)


#: the documented error of tau_plus="auto" on separated classes (docs/losses.md): 0.02 absolute
AUTO_TAU_ERROR = 0.02


@pytest.mark.parametrize("num_classes", [4, 10, 16])
@pytest.mark.parametrize("m", [1, 3])
def test_auto_tau_plus_recovers_the_synthetic_class_prior(num_classes, m):
    """Labels drawn as the synthetic data draws them (balanced classes); the estimate of one training call
    against the share of same-class negatives in the batch."""
    from clip_dcl.data.synth import split_labels

    labels = split_labels(0, "train", 256, num_classes, 0.0)
    f, g = clustered(labels, seed=num_classes)
    g = g.repeat_interleave(m, 0) if m > 1 else g
    y = torch.as_tensor(labels)
    same = (y[:, None] == y[None, :]).double()
    truth = float((same.sum() - len(labels)) / (len(labels) * (len(labels) - 1)))
    assert abs(truth - 1 / num_classes) < 0.01
    loss = create_loss("dcl", tau_plus="auto", tau_momentum=1.0)
    loss(f, g, torch.tensor(20.0, dtype=torch.float64))
    assert abs(loss.metrics["tau_plus_batch"] - truth) < AUTO_TAU_ERROR, (loss.metrics["tau_plus_batch"], truth)


def test_auto_tau_plus_is_zero_without_class_structure():
    f, g = clustered([0] * 128, cls=0.0, seed=1)  # one class: nothing but pairs and noise
    loss = create_loss("dcl", tau_plus="auto")
    loss(f, g, torch.tensor(20.0, dtype=torch.float64))
    assert loss.metrics["tau_plus_batch"] < 0.01
