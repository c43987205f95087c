"""The losses against slow float64 re-computations, single process."""

from __future__ import annotations

import math

import loss_reference as ref
import pytest
import torch
import torch.nn.functional as F
from open_clip.loss import ClipLoss

from clip_dcl.losses import LOSSES, DebiasedClipLoss, DeCLLoss, create_loss

SCALES = [1.0, 14.3, 100.0]
#: two float32 computations of one value by different kernels (an AVX-512 sum against an AVX2 one) differ by
#: a few roundings of float32's unit: what "the same value" means between code paths
F32_RTOL = 8 * torch.finfo(torch.float32).eps


def features(n, d=16, seed=0, dtype=torch.float64, align=0.0):
    gen = torch.Generator().manual_seed(seed)
    f = torch.randn(n, d, generator=gen, dtype=dtype)
    g = torch.randn(n, d, generator=gen, dtype=dtype) + align * f  # align > 0: positives dominate
    return F.normalize(f, dim=-1), F.normalize(g, dim=-1)


def leaves(f, g, s):
    return (f.clone().requires_grad_(), g.clone().requires_grad_(), torch.tensor(s, dtype=f.dtype, requires_grad=True))


def grads(loss, tensors):
    return torch.autograd.grad(loss, tensors)


def assert_close_all(a, b, rtol=1e-9, atol=1e-10):
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=rtol, atol=atol)


# --------------------------------------------------------------------------------------------
# registry and argument checks


def test_registry_names_and_factory():
    assert set(LOSSES) >= {"clip", "dcl", "decl"}
    assert isinstance(create_loss("clip"), ClipLoss)
    assert isinstance(create_loss("dcl", tau_plus=0.2), DebiasedClipLoss)
    assert isinstance(create_loss("decl", temperature_mode="learned", rate="batch"), DeCLLoss)
    with pytest.raises(ValueError, match="'nope'"):
        create_loss("nope")


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(name="dcl", tau_plus=1.0), "tau_plus=1.0"),
        (dict(name="dcl", tau_plus=-0.1), "tau_plus=-0.1"),
        (dict(name="dcl", clamp="soft"), "clamp='soft'"),
        (dict(name="decl", rate="momentum"), "rate='momentum'"),
        (dict(name="decl", rate="batch", schedule="cosine"), "schedule='cosine'"),
        (dict(name="decl", rate="index"), "num_samples"),
        (dict(name="decl", rate="index", num_samples=0), "num_samples=0"),
        (dict(name="decl", rate="batch", schedule="constant", lam=1.5), "lam=1.5"),
        (dict(name="decl", rate="batch", schedule="harmonic", lam=0.0), "lam=0.0"),
        (dict(name="decl", rate="batch", gamma=0.0), "gamma=0.0"),
        (dict(name="decl", rate="batch", gamma_schedule="cosine", gamma_decay_steps=5), "rate='batch' has no gamma"),
        (dict(name="decl", rate="queue", gamma_schedule="cosine", gamma_decay_steps=5), "rate='queue' has no gamma"),
        (dict(name="decl", rate="index", num_samples=4, gamma_schedule="cosine"), "gamma_decay_steps=None"),
        (dict(name="decl", rate="index", num_samples=4, gamma_schedule="linear"), "gamma_schedule='linear'"),
        (dict(name="decl", rate="index", num_samples=4, first_visit="zero"), "first_visit='zero'"),
        (dict(name="decl", rate="batch", include_current=True), "include_current=True"),
        (dict(name="decl", rate="queue", queue_size=0), "queue_size=0"),
        (dict(name="decl", rate="batch", accum_freq=0), "accum_freq=0"),
        (dict(name="dcl", rank=2, world_size=2), "rank=2"),
    ],
)
def test_bad_arguments_name_the_value(kwargs, pattern):
    kwargs = dict(kwargs)
    with pytest.raises(ValueError, match=pattern.replace("(", r"\(").replace(")", r"\)")):
        create_loss(kwargs.pop("name"), **kwargs)


def test_index_rate_needs_ids_in_range():
    f, g = features(4, dtype=torch.float32)
    loss = create_loss("decl", temperature_mode="learned", rate="index", num_samples=10)
    with pytest.raises(ValueError, match="sample_ids"):
        loss(f, g, torch.tensor(10.0))
    with pytest.raises(ValueError, match="sample id 10 is outside"):
        loss(f, g, torch.tensor(10.0), sample_ids=torch.tensor([0, 1, 2, 10]))
    with pytest.raises(ValueError, match="5 entries"):
        loss(f, g, torch.tensor(10.0), sample_ids=torch.arange(5))
    assert int(loss.calls) == 0  # a refused call changes no state


# --------------------------------------------------------------------------------------------
# values and gradients against the slow re-computation


@pytest.mark.parametrize("n", [2, 5, 12])
@pytest.mark.parametrize("s", SCALES)
def test_clip_is_openclip_infonce(n, s):
    f, g = features(n, seed=n)
    a = leaves(f, g, s)
    b = leaves(f, g, s)
    out = create_loss("clip")(*a, output_dict=True)
    assert set(out) == {"contrastive_loss"}
    expected = ref.infonce(*b)
    torch.testing.assert_close(out["contrastive_loss"], expected)
    assert_close_all(grads(out["contrastive_loss"], a), grads(expected, b))


@pytest.mark.parametrize("n", [2, 5, 12])
@pytest.mark.parametrize("tau_plus", [0.0, 0.05, 0.3])
@pytest.mark.parametrize("s", SCALES)
@pytest.mark.parametrize("clamp", ["clamp", "biased"])
def test_dcl_matches_reference(n, tau_plus, s, clamp):
    f, g = features(n, seed=n + 7)
    a, b = leaves(f, g, s), leaves(f, g, s)
    loss_fn = create_loss("dcl", tau_plus=tau_plus, clamp=clamp)
    out = loss_fn(*a, output_dict=True)
    assert set(out) == {"dcl_loss"}  # diagnostics are not summed into the loss
    expected, clamp_rate = ref.dcl(*b, tau_plus, clamp)
    torch.testing.assert_close(out["dcl_loss"], expected, rtol=1e-9, atol=1e-10)
    assert_close_all(grads(out["dcl_loss"], a), grads(expected, b), rtol=1e-7, atol=1e-9)
    assert float(loss_fn.metrics["clamp_rate"]) == pytest.approx(clamp_rate)


def test_dcl_clamp_is_exercised_and_modes_differ():
    # Partly aligned pairs with a large tau_plus: the debiased estimate goes negative for some rows.
    f, g = features(8, seed=3, align=0.5)
    for s in (5.0, 10.0):
        a, b = leaves(f, g, s), leaves(f, g, s)
        clamped = create_loss("dcl", tau_plus=0.3, clamp="clamp")
        biased = create_loss("dcl", tau_plus=0.3, clamp="biased")
        v1, v2 = clamped(*a), biased(*b)
        assert 0 < float(clamped.metrics["clamp_rate"]) < 1
        assert float(clamped.metrics["clamp_rate"]) == float(biased.metrics["clamp_rate"])
        assert float((v2 - v1).detach()) > 0.1  # the InfoNCE fallback is larger than the floored estimate
        for loss_fn, v, mode in ((clamped, v1, "clamp"), (biased, v2, "biased")):
            c = leaves(f, g, s)
            expected = ref.dcl(*c, 0.3, mode)[0]
            torch.testing.assert_close(v, expected)
            src = a if mode == "clamp" else b
            assert_close_all(grads(v, src), grads(expected, c), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("s", SCALES)
@pytest.mark.parametrize("kwargs", [{"tau_plus": 0.0}, {}], ids=["tau_plus=0", "the default"])
def test_dcl_tau_zero_is_infonce(s, kwargs):
    # the default is tau_plus 0: dcl is InfoNCE until a prior is given (benchmarks/results/dcl_screen.md)
    f, g = features(9, seed=11)
    a, b = leaves(f, g, s), leaves(f, g, s)
    got = create_loss("dcl", **kwargs)(*a)
    expected = ClipLoss()(*b)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert_close_all(grads(got, a), grads(expected, b), rtol=1e-10, atol=1e-12)


def test_dcl_differs_from_infonce_when_tau_positive():
    f, g = features(9, seed=11)
    assert not torch.isclose(
        create_loss("dcl", tau_plus=0.1)(f, g, torch.tensor(10.0)), ClipLoss()(f, g, torch.tensor(10.0))
    )


@pytest.mark.parametrize("n", [3, 8])
@pytest.mark.parametrize("s", SCALES)
@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0])
def test_decl_batch_rate_matches_reference(n, s, lam):
    f, g = features(n, seed=n + 1)
    a, b = leaves(f, g, s), leaves(f, g, s)
    loss_fn = create_loss(
        "decl",
        estimate="absolute",
        temperature_mode="learned",
        rate="batch",
        schedule="constant",
        lam=lam,
        sample_u=False,
    )
    out = loss_fn(*a, output_dict=True)
    assert set(out) == {"decl_loss"}
    rates = ref.batch_mean_negative_score(*b)
    expected, l1, l2 = ref.decl(*b, rates, torch.ones_like(rates), lam)
    torch.testing.assert_close(out["decl_loss"], expected, rtol=1e-9, atol=1e-9)
    assert_close_all(grads(out["decl_loss"], a), grads(expected, b), rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(loss_fn.metrics["loss1"], l1.detach())
    torch.testing.assert_close(loss_fn.metrics["loss2"], l2.detach())
    assert float(loss_fn.metrics["lambda_t"]) == pytest.approx(lam)


@pytest.mark.parametrize("s", SCALES)
def test_decl_lambda_zero_is_infonce(s):
    f, g = features(7, seed=5)
    a, b = leaves(f, g, s), leaves(f, g, s)
    for rate, kw in [("batch", {}), ("queue", {"queue_size": 8}), ("index", {"num_samples": 7})]:
        a, b = leaves(f, g, s), leaves(f, g, s)
        loss_fn = create_loss("decl", temperature_mode="learned", rate=rate, schedule="constant", lam=0.0, **kw)
        got = loss_fn(*a, sample_ids=torch.arange(7))
        expected = ClipLoss()(*b)
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
        assert_close_all(grads(got, a), grads(expected, b), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "first_visit, include_current, gamma_schedule, drift",
    [
        ("batch", False, "constant", True),
        ("mean", False, "constant", True),
        ("batch", True, "constant", True),
        ("mean", False, "cosine", True),
        ("batch", False, "constant", False),
        ("batch", True, "constant", False),
    ],
)
def test_decl_index_buffer_follows_moving_average_over_steps(first_visit, include_current, gamma_schedule, drift):
    gamma, s, n, decay = 0.3, 20.0, 6, 3
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
        gamma_schedule=gamma_schedule,
        gamma_decay_steps=decay if gamma_schedule == "cosine" else None,
        drift_correction=drift,
    )
    tracker = ref.IndexRates(gamma, first_visit=first_visit, include_current=include_current, drift=drift)
    id_batches = [
        torch.tensor([0, 1, 2, 3, 4, 5]),
        torch.tensor([6, 7, 2, 3, 8, 9]),
        torch.tensor([1, 1, 4, 9, 0, 7]),
        torch.tensor([5, 6, 8, 2, 3, 1]),
    ]
    # revisits, first visits after the first step, and a repeated id inside one batch
    for step, ids in enumerate(id_batches):
        f, g = features(n, seed=100 + step)
        a, b = leaves(f, g, s), leaves(f, g, s)
        got = loss_fn(*a, sample_ids=ids)
        # cosine: gamma_t = gamma + (1 - gamma) (1 + cos(pi min(1, (t - 1) / T))) / 2, t = step + 1
        g_t = (
            gamma
            if gamma_schedule == "constant"
            else gamma + (1 - gamma) * (1 + math.cos(math.pi * min(1.0, step / decay))) / 2
        )
        assert float(loss_fn.metrics["gamma_t"]) == pytest.approx(g_t)
        rates = tracker.visit(ids, ref.batch_mean_negative_score(*b), gamma=g_t)
        expected, _, _ = ref.decl(*b, rates, torch.ones_like(rates), 1.0)
        # the buffer holds float32 log-rates
        torch.testing.assert_close(got, expected.to(got.dtype), rtol=1e-5, atol=1e-5)
        assert_close_all(grads(got, a), grads(expected, b), rtol=1e-4, atol=1e-6)
    for d in range(2):
        for sid in range(10):
            torch.testing.assert_close(float(loss_fn.log_rate[d, sid]), tracker.log_rate(d, sid), rtol=1e-5, atol=1e-5)
    assert int(loss_fn.calls) == 4


def test_decl_index_second_call_reads_the_rate_stored_by_the_first():
    """Same ids, different features: the second call's loss1 uses exactly the log-rate stored after the
    first call, not one that includes the second call's own batch."""
    n, s = 8, 15.0
    ids = torch.tensor([4, 0, 7, 2, 9, 5, 1, 3])
    loss_fn = create_loss(
        "decl",
        estimate="absolute",
        temperature_mode="learned",
        rate="index",
        num_samples=10,
        gamma=0.9,
        schedule="decl",
        sample_u=False,
        include_current=False,
    )
    f1, g1 = features(n, seed=1)
    loss_fn(f1, g1, torch.tensor(s), sample_ids=ids)
    # float32 in the buffer; stored relative to the step's mean estimate, which is the next step's level
    stored = (loss_fn.log_rate[:, ids] + loss_fn.prev_log_rate[:, None]).double()
    # the first visit read the first batch's own estimate, and stored it
    torch.testing.assert_close(stored, ref.batch_mean_negative_score(f1, g1, s).log(), rtol=1e-6, atol=1e-6)
    f2, g2 = features(n, seed=2)
    loss_fn(f2, g2, torch.tensor(s), sample_ids=ids)
    _, loss1, _ = ref.decl(f2, g2, s, stored.exp(), torch.ones(2, n, dtype=torch.float64), 1.0)
    torch.testing.assert_close(loss_fn.metrics["loss1"], loss1, rtol=1e-12, atol=1e-12)
    # ... and not the rate that already holds the second batch (the coupled read order)
    e2 = ref.batch_mean_negative_score(f2, g2, s)
    coupled = 0.1 * stored.exp() + 0.9 * e2
    _, loss1_coupled, _ = ref.decl(f2, g2, s, coupled, torch.ones(2, n, dtype=torch.float64), 1.0)
    assert abs(float(loss1_coupled - loss1)) > 1e-3
    assert float(loss_fn.metrics["first_visit_rate"]) == 0.0
    # only now is the second estimate folded in, with the old rate moved by the drift of the mean
    # estimate between the two steps (m_2 - m_1)
    m1 = ref.batch_mean_negative_score(f1, g1, s).log().mean(dim=1, keepdim=True)
    m2 = e2.log().mean(dim=1, keepdim=True)
    folded = 0.1 * (stored + m2 - m1).exp() + 0.9 * e2
    after = (loss_fn.log_rate[:, ids] + loss_fn.prev_log_rate[:, None]).double()
    torch.testing.assert_close(after, folded.log(), rtol=1e-5, atol=1e-5)


def test_decl_update_then_read_is_the_batch_rate_on_first_visits_and_read_then_update_is_not():
    """The default order (update, then read: include_current=True) gives exactly rate='batch' in a first
    epoch, and so does read-then-update; read-then-update differs as soon as an anchor is seen again."""
    n, s = 6, 12.0
    kw = dict(schedule="decl", sample_u=True, seed=5)
    coupled = create_loss("decl", temperature_mode="learned", rate="index", num_samples=12, **kw)
    assert coupled.include_current
    default = create_loss("decl", temperature_mode="learned", rate="index", num_samples=12, include_current=False, **kw)
    batch = create_loss("decl", temperature_mode="learned", rate="batch", **kw)
    for step, ids in enumerate([torch.arange(6), torch.arange(6, 12), torch.arange(6)]):
        f, g = features(n, seed=40 + step, dtype=torch.float32)
        values = [fn(f, g, torch.tensor(s), sample_ids=ids) for fn in (coupled, default, batch)]
        if step < 2:  # first visits: all three the same rate (other reductions: float32's rounding apart)
            torch.testing.assert_close(values[0], values[2], rtol=F32_RTOL, atol=0.0)
            torch.testing.assert_close(values[1], values[2], rtol=F32_RTOL, atol=0.0)
        else:  # a revisit: the default reads the earlier epoch's rate
            assert abs(float(values[1] - values[2])) > 1e-3


def test_decl_first_visit_mean_reads_the_previous_steps_mean_estimate():
    n, s = 6, 12.0
    loss_fn = create_loss(
        "decl",
        estimate="absolute",
        temperature_mode="learned",
        rate="index",
        num_samples=20,
        first_visit="mean",
        schedule="decl",
        sample_u=False,
        include_current=False,
    )
    f, g = features(n, seed=7)
    loss_fn(f, g, torch.tensor(s), sample_ids=torch.arange(6))
    assert float(loss_fn.metrics["first_visit_rate"]) == 1.0
    expect = ref.batch_mean_negative_score(f, g, s).log().mean(dim=1)
    torch.testing.assert_close(loss_fn.prev_log_rate.double(), expect, rtol=1e-6, atol=1e-6)
    prev = loss_fn.prev_log_rate.double()  # the buffer's float32 value
    f2, g2 = features(n, seed=8)
    loss_fn(f2, g2, torch.tensor(s), sample_ids=torch.arange(6, 12))  # all new anchors
    rates = prev.exp()[:, None].expand(2, n)
    _, loss1, _ = ref.decl(f2, g2, s, rates, torch.ones(2, n, dtype=torch.float64), 1.0)
    torch.testing.assert_close(loss_fn.metrics["loss1"], loss1, rtol=1e-12, atol=1e-12)


def test_cosine_gamma_schedule_goes_from_one_to_gamma():
    loss_fn = create_loss(
        "decl",
        temperature_mode="learned",
        rate="index",
        num_samples=4,
        gamma=0.2,
        gamma_schedule="cosine",
        gamma_decay_steps=10,
    )
    assert loss_fn.gamma_at(1) == 1.0
    assert loss_fn.gamma_at(6) == pytest.approx(0.6)  # half way: (1 + 0.2) / 2
    assert loss_fn.gamma_at(11) == pytest.approx(0.2) and loss_fn.gamma_at(500) == pytest.approx(0.2)
    values = [loss_fn.gamma_at(t) for t in range(1, 13)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_old_checkpoint_without_prev_log_rate_loads():
    """A state of an earlier version (absolute log-rates, no level) is made relative to the mean of its
    visited entries, so the rates read afterwards are the ones it held."""
    loss_fn = create_loss("decl", temperature_mode="learned", rate="index", num_samples=4)
    state = {k: v.clone() for k, v in loss_fn.state_dict().items() if k != "prev_log_rate"}
    state["log_rate"][:, 1] = -2.0
    state["log_rate"][:, 3] = 1.0
    fresh = create_loss("decl", temperature_mode="learned", rate="index", num_samples=4)
    fresh.load_state_dict(state)
    torch.testing.assert_close(fresh.prev_log_rate, torch.tensor([-0.5, -0.5]))
    effective = fresh.log_rate + fresh.prev_log_rate[:, None]
    assert effective[0, 1] == -2.0 and effective[1, 3] == 1.0 and torch.isnan(effective[:, [0, 2]]).all()
    absolute = create_loss("decl", temperature_mode="learned", rate="index", num_samples=4, drift_correction=False)
    absolute.load_state_dict(state)
    assert float(absolute.log_rate[0, 1]) == -2.0


@pytest.mark.parametrize("estimate", ["absolute", "relative"])
@pytest.mark.parametrize("include_current", [False, True])
def test_decl_queue_rate_matches_reference(include_current, estimate):
    """Also the anchor-relative estimate: every score divided by the anchor's positive exp(l_ii)."""
    s, n, q = 12.0, 5, 7
    loss_fn = create_loss(
        "decl",
        temperature_mode="learned",
        rate="queue",
        queue_size=q,
        schedule="decl",
        sample_u=False,
        include_current=include_current,
        estimate=estimate,
    )
    relative = estimate == "relative"
    history_img, history_txt = [], []
    for step in range(3):
        f, g = features(n, seed=200 + step)
        a, b = leaves(f, g, s), leaves(f, g, s)
        got = loss_fn(*a)
        fb, gb, sb = b
        rates = []
        for d, (anchor, cand, hist) in enumerate([(fb, gb, history_txt), (gb, fb, history_img)]):
            queue = torch.cat(hist)[-q:].double() if hist else cand[:0]  # the queue stores float32
            row = []
            for i in range(n):
                own = sb * anchor[i] @ cand[i] if relative else 0.0
                batch = [torch.exp(sb * anchor[i] @ cand[k] - own) for k in range(n) if k != i]
                queued = [torch.exp(sb * anchor[i] @ queue[k] - own) for k in range(queue.shape[0])]
                # earlier steps only; the batch itself at the first step (empty queue) or when coupled
                scores = queued + batch if (include_current or not queued) else queued
                row.append(sum(scores) / len(scores))
            rates.append(torch.stack(row))
        rates = torch.stack(rates).detach()
        expected, _, _ = ref.decl(*b, rates, torch.ones_like(rates), 1.0, relative=relative)
        torch.testing.assert_close(got, expected.to(got.dtype), rtol=1e-5, atol=1e-5)
        assert_close_all(grads(got, a), grads(expected, b), rtol=1e-4, atol=1e-6)
        history_img.append(f.float())
        history_txt.append(g.float())
    assert int(loss_fn.queue_count) == q


def test_decl_sampled_u_is_exponential_per_anchor():
    # With rate="batch" the exponent is 0, so loss1 + mean(l_ii) is the mean of the eps draws.
    n, steps = 64, 60
    loss_fn = create_loss(
        "decl", estimate="absolute", temperature_mode="learned", rate="batch", schedule="decl", sample_u=True, seed=3
    )
    means = []
    for step in range(steps):
        f, g = features(n, seed=step)
        loss_fn(f, g, torch.tensor(10.0))
        pos = (10.0 * (f * g).sum(-1)).mean()
        means.append(float(loss_fn.metrics["loss1"] + pos))
    means = torch.tensor(means)
    # mean of 2n Exp(1) draws per step: mean 1, sd 1/sqrt(2n); the steps' draws are independent.
    assert abs(float(means.mean()) - 1.0) < 4 / math.sqrt(2 * n * steps)
    assert float(means.std()) == pytest.approx(1 / math.sqrt(2 * n), rel=0.35)
    # fixed seed: the same draws again
    again = create_loss(
        "decl", estimate="absolute", temperature_mode="learned", rate="batch", schedule="decl", sample_u=True, seed=3
    )
    f, g = features(n, seed=0)
    again(f, g, torch.tensor(10.0))
    assert float(again.metrics["loss1"] + (10.0 * (f * g).sum(-1)).mean()) == pytest.approx(float(means[0]))


# --------------------------------------------------------------------------------------------
# schedules, optimizer steps and gradient accumulation


def test_schedules_count_optimizer_steps():
    f, g = features(4, dtype=torch.float32)
    expect = {
        "alternate": [1, 0, 1, 0, 1],
        "decl": [1, 1, 1, 1, 1],
        "harmonic": [1, 1, 2 / 3, 0.5, 0.4],  # min(1, 2 / t)
        "constant": [0.25] * 5,
    }
    for schedule, values in expect.items():
        lam = 2.0 if schedule == "harmonic" else 0.25
        loss_fn = create_loss(
            "decl", temperature_mode="learned", rate="batch", schedule=schedule, lam=lam, accum_freq=2
        )
        seen = []
        for _ in range(5):  # two calls per optimizer step
            loss_fn(f, g, torch.tensor(5.0))
            first = float(loss_fn.metrics["lambda_t"])
            loss_fn(f, g, torch.tensor(5.0))
            assert float(loss_fn.metrics["lambda_t"]) == first
            seen.append(first)
        assert seen == pytest.approx(values), schedule
        assert int(loss_fn.calls) == 10 and loss_fn.step == 6


def test_eval_mode_calls_change_no_state():
    f, g = features(4, dtype=torch.float32)
    loss_fn = create_loss("decl", temperature_mode="learned", rate="index", num_samples=4)
    loss_fn.eval()
    loss_fn(f, g, torch.tensor(5.0), sample_ids=torch.arange(4))
    assert int(loss_fn.calls) == 0 and torch.isnan(loss_fn.log_rate).all()


@pytest.mark.parametrize("rate", ["index", "queue", "batch"])
def test_accumulation_matches_one_big_step(rate):
    """OpenCLIP's --accum-freq path: call j sees all micro-batches, only block j with gradient."""
    n, micro, s = 8, 2, 15.0
    kw = {"num_samples": 20} if rate == "index" else {"queue_size": 16} if rate == "queue" else {}
    big = create_loss("decl", temperature_mode="learned", rate=rate, schedule="decl", sample_u=True, seed=1, **kw)
    acc = create_loss(
        "decl", temperature_mode="learned", rate=rate, schedule="decl", sample_u=True, seed=1, accum_freq=micro, **kw
    )
    ids = torch.tensor([3, 9, 1, 14, 7, 0, 12, 5])
    for step in range(3):
        f, g = features(n, seed=300 + step)
        fa, ga, sa = leaves(f, g, s)
        big(fa, ga, sa, sample_ids=ids).backward()
        fb, gb, sb = leaves(f, g, s)
        size = n // micro
        for j in range(micro):
            blocks_f = [f[k * size : (k + 1) * size] for k in range(micro)]
            blocks_g = [g[k * size : (k + 1) * size] for k in range(micro)]
            blocks_f[j] = fb[j * size : (j + 1) * size]
            blocks_g[j] = gb[j * size : (j + 1) * size]
            acc(torch.cat(blocks_f), torch.cat(blocks_g), sb, sample_ids=ids).backward()
        torch.testing.assert_close(fb.grad, fa.grad)
        torch.testing.assert_close(gb.grad, ga.grad)
        # each block's backward also differentiates s through the whole batch: micro x the gradient
        torch.testing.assert_close(sb.grad, micro * sa.grad)
        ids = ids.roll(3)
    for name, buf in big.named_buffers():
        if name != "calls":
            torch.testing.assert_close(dict(acc.named_buffers())[name], buf, equal_nan=True)
    assert big.step == acc.step == 4


# --------------------------------------------------------------------------------------------
# state, precision and memory


@pytest.mark.parametrize("rate", ["index", "queue"])
def test_state_dict_round_trip_continues_exactly(rate):
    kw = {"num_samples": 12} if rate == "index" else {"queue_size": 6}
    a = create_loss("decl", temperature_mode="learned", rate=rate, schedule="alternate", seed=4, **kw)
    for step in range(3):
        f, g = features(6, seed=step, dtype=torch.float32)
        a(f, g, torch.tensor(20.0), sample_ids=torch.arange(step, step + 6))
    state = {k: v.clone() for k, v in a.state_dict().items()}
    b = create_loss("decl", temperature_mode="learned", rate=rate, schedule="alternate", seed=4, **kw)
    b.load_state_dict(state)
    assert b.step == a.step == 4
    for step in range(3, 5):
        f, g = features(6, seed=step, dtype=torch.float32)
        va = a(f, g, torch.tensor(20.0), sample_ids=torch.arange(step, step + 6))
        vb = b(f, g, torch.tensor(20.0), sample_ids=torch.arange(step, step + 6))
        assert torch.equal(va, vb)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(torch.nan_to_num(x), torch.nan_to_num(y)), name


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("clip", {}),
        ("dcl", {"tau_plus": 0.1}),
        ("dcl", {"tau_plus": 0.1, "clamp": "biased"}),
        ("decl", {"rate": "index", "num_samples": 64}),
        ("decl", {"rate": "queue", "queue_size": 64}),
        ("decl", {"rate": "batch", "schedule": "harmonic"}),
    ],
)
@pytest.mark.parametrize("align", [0.0, 4.0])
def test_bf16_autocast_at_max_scale_is_finite(name, kwargs, align):
    logit_scale_param = torch.tensor(math.log(100.0), requires_grad=True)
    f32, g32 = features(32, d=32, seed=9, dtype=torch.float32, align=align)
    f = f32.clone().requires_grad_()
    g = g32.clone().requires_grad_()
    loss_fn = create_loss(name, **kwargs)
    for _ in range(2):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fb, gb = f.to(torch.bfloat16), g.to(torch.bfloat16)
            loss = loss_fn(fb, gb, logit_scale_param.exp(), sample_ids=torch.arange(32))
        loss.backward()
    assert torch.isfinite(loss)
    for t in (f.grad, g.grad, logit_scale_param.grad):
        assert torch.isfinite(t).all()
    for v in loss_fn.metrics.values():
        assert torch.isfinite(torch.as_tensor(v)).all()


def _saved_square_tensors(loss_fn, n):
    f, g = features(n, d=8, dtype=torch.float32)
    f.requires_grad_()
    g.requires_grad_()
    storages = set()

    def pack(t):
        if t.numel() >= n * n:
            storages.add(t.untyped_storage().data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_fn(f, g, torch.tensor(10.0), sample_ids=torch.arange(n))
    return len(storages)


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("dcl", {"tau_plus": 0.1}),
        ("decl", {"rate": "index", "num_samples": 64}),
        ("decl", {"rate": "queue", "queue_size": 16}),
    ],
)
def test_autograd_keeps_one_logits_matrix(name, kwargs):
    """Beyond the logits matrix, the losses keep only O(batch) tensors for backward; tiled, not even that."""
    assert _saved_square_tensors(create_loss(name, tile=0, **kwargs), 64) == 1
    assert _saved_square_tensors(create_loss(name, tile=16, **kwargs), 64) == 0
    assert _saved_square_tensors(create_loss("clip"), 64) >= 2  # the baseline keeps one per direction


# -- no_grad_gather --------------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [None, -2.0])
def test_clip_from_stats_is_openclip_infonce(bias):
    """``create_loss("clip", no_grad_gather=True)`` is our InfoNCE: ClipLoss's value and gradients."""
    gen = torch.Generator().manual_seed(3)
    f = F.normalize(torch.randn(12, 6, generator=gen, dtype=torch.float64), dim=-1).requires_grad_()
    g = F.normalize(torch.randn(12, 6, generator=gen, dtype=torch.float64), dim=-1).requires_grad_()
    s = torch.tensor(7.0, dtype=torch.float64, requires_grad=True)
    b = None if bias is None else torch.tensor(bias, dtype=torch.float64, requires_grad=True)
    ours = create_loss("clip", no_grad_gather=True, local_loss=True)
    assert type(ours).__name__ == "InfoNCEFromStats"
    value = ours(f, g, s, b)
    grads = torch.autograd.grad(value, [f, g, s])
    if b is None:
        want = ClipLoss()(f, g, s)
    else:  # ClipLoss has no bias: the same InfoNCE on biased logits
        logits = s * f @ g.T + b
        labels = torch.arange(12)
        want = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
    torch.testing.assert_close(value, want, rtol=1e-12, atol=1e-12)
    for a, w in zip(grads, torch.autograd.grad(want, [f, g, s])):
        torch.testing.assert_close(a, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["clip", "dcl", "decl"])
def test_no_grad_gather_needs_local_loss_and_excludes_gather_with_grad(name):
    kw = {"rate": "batch"} if name == "decl" else {}
    with pytest.raises(ValueError, match="no_grad_gather=True needs local_loss=True"):
        create_loss(name, no_grad_gather=True, rank=0, world_size=2, **kw)
    with pytest.raises(ValueError, match="no_grad_gather=True replaces gather_with_grad=True"):
        create_loss(name, no_grad_gather=True, local_loss=True, gather_with_grad=True, **kw)


@pytest.mark.parametrize(
    "name, kw",
    [("clip", {}), ("dcl", {"tau_plus": 0.2}), ("decl", {"rate": "index", "num_samples": 12, "sample_u": True})],
)
def test_no_grad_gather_in_one_process_changes_nothing(name, kw):
    f, g = features(12, seed=4)
    ids = torch.arange(12)
    results = []
    for flag in (False, True):
        a = leaves(f, g, 9.0)
        loss = create_loss(name, no_grad_gather=flag, **kw)(*a, sample_ids=ids)
        results.append((loss, grads(loss, a)))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-12, atol=1e-12)
    assert_close_all(results[0][1], results[1][1])


# -- CoCa ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("weights", [(2.0, 1.0), (1.0, 0.5)])
def test_coca_objective_with_infonce_equals_openclip_cocaloss(weights):
    """Our contrastive term (dcl at tau_plus 0 = InfoNCE) plus OpenCLIP's captioning term is CoCaLoss."""
    from open_clip.loss import CoCaLoss

    from clip_dcl.losses.coca import CoCaObjective

    caption_w, contrastive_w = weights
    gen = torch.Generator().manual_seed(5)
    f, g = features(6, seed=5)
    logits = torch.randn(6, 7, 30, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 30, (6, 7), generator=gen)
    labels[:, -2:] = 0  # padding, ignored
    a, b = leaves(f, g, 10.0), leaves(f, g, 10.0)
    la, lb = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    ours = CoCaObjective(create_loss("dcl", tau_plus=0.0), caption_w, contrastive_w)(
        a[0], a[1], la, labels, a[2], output_dict=True
    )
    want = CoCaLoss(caption_loss_weight=caption_w, clip_loss_weight=contrastive_w)(
        b[0], b[1], lb, labels, b[2], output_dict=True
    )
    assert set(ours) == {"dcl_loss", "caption_loss"}
    torch.testing.assert_close(ours["dcl_loss"], want["contrastive_loss"])
    torch.testing.assert_close(ours["caption_loss"], want["caption_loss"])
    total_a, total_b = sum(ours.values()), sum(want.values())
    assert_close_all(grads(total_a, [*a, la]), grads(total_b, [*b, lb]))
