"""DeCL's read order, anchor-relative estimate, gamma schedule, weight bound and temperature modes,
against slow float64 re-computations (tests/loss_reference.py)."""

from __future__ import annotations

import math

import loss_reference as ref
import pytest
import torch
from open_clip.loss import ClipLoss
from test_losses import SCALES, assert_close_all, features, grads, leaves
from test_losses_multi import features as features_m

from clip_dcl.losses import create_loss

# --------------------------------------------------------------------------------------------
# the anchor-relative estimate g_i = mean_k exp(l_ik - l_ii)


@pytest.mark.parametrize("n", [3, 8])
@pytest.mark.parametrize("s", SCALES)
@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0])
def test_decl_relative_batch_rate_matches_reference(n, s, lam):
    f, g = features(n, seed=n + 3)
    a, b = leaves(f, g, s), leaves(f, g, s)
    loss_fn = create_loss(
        "decl", rate="batch", estimate="relative", schedule="constant", lam=lam, temperature_mode="learned"
    )
    got = loss_fn(*a)
    rates = ref.batch_mean_negative_score(*b, relative=True)
    expected, l1, l2 = ref.decl(*b, rates, torch.ones_like(rates), lam, relative=True)
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)
    assert_close_all(grads(got, a), grads(expected, b), rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(loss_fn.metrics["loss1"], l1.detach())
    # with the rate of this very batch, loss1 is 1 for every anchor (its gradient is grad log g_i)
    assert float(l1.detach()) == pytest.approx(1.0)


def test_decl_relative_differs_from_absolute_on_rates_of_another_batch():
    """A stale rate scales the relative anchor's whole step; the absolute form moves pull against push."""
    f, g = features(6, seed=1)
    rates_abs = ref.batch_mean_negative_score(*features(6, seed=2), 10.0)
    l_abs = ref.decl(f, g, 10.0, rates_abs, torch.ones_like(rates_abs), 1.0)[0]
    l_rel = ref.decl(f, g, 10.0, rates_abs, torch.ones_like(rates_abs), 1.0, relative=True)[0]
    assert abs(float(l_abs - l_rel)) > 1e-3


@pytest.mark.parametrize("include_current, drift", [(True, True), (False, True), (True, False)])
def test_decl_relative_index_buffer_follows_moving_average_over_steps(include_current, drift):
    gamma, s, n = 0.3, 20.0, 6
    loss_fn = create_loss(
        "decl",
        rate="index",
        estimate="relative",
        num_samples=10,
        gamma=gamma,
        schedule="decl",
        include_current=include_current,
        drift_correction=drift,
        temperature_mode="learned",
    )
    tracker = ref.IndexRates(gamma, include_current=include_current, drift=drift)
    id_batches = [
        torch.tensor([0, 1, 2, 3, 4, 5]),
        torch.tensor([6, 7, 2, 3, 8, 9]),
        torch.tensor([1, 1, 4, 9, 0, 7]),
        torch.tensor([5, 6, 8, 2, 3, 1]),
    ]
    for step, ids in enumerate(id_batches):
        f, g = features(n, seed=300 + step)
        a, b = leaves(f, g, s), leaves(f, g, s)
        got = loss_fn(*a, sample_ids=ids)
        rates = tracker.visit(ids, ref.batch_mean_negative_score(*b, relative=True))
        expected, _, _ = ref.decl(*b, rates, torch.ones_like(rates), 1.0, relative=True)
        torch.testing.assert_close(got, expected.to(got.dtype), rtol=1e-5, atol=1e-5)
        assert_close_all(grads(got, a), grads(expected, b), rtol=1e-4, atol=1e-6)
    for d in range(2):
        for sid in range(10):
            torch.testing.assert_close(float(loss_fn.log_rate[d, sid]), tracker.log_rate(d, sid), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m", [2, 3])
def test_decl_relative_batch_rate_with_m_captions_matches_reference(m):
    f, g = features_m(4, m, seed=m)
    s = 14.3
    a = (f.clone().requires_grad_(), g.clone().requires_grad_(), torch.tensor(s, dtype=f.dtype, requires_grad=True))
    b = (f.clone().requires_grad_(), g.clone().requires_grad_(), torch.tensor(s, dtype=f.dtype, requires_grad=True))
    loss_fn = create_loss(
        "decl", rate="batch", estimate="relative", schedule="constant", lam=0.4, temperature_mode="learned"
    )
    got = loss_fn(*a)
    rates = ref.row_mean_negative_scores(*b, relative=True)
    expected, _, _ = ref.decl_general(*b, rates, [torch.ones_like(r) for r in rates], 0.4, relative=True)
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)
    assert_close_all(grads(got, a), grads(expected, b), rtol=1e-7, atol=1e-9)


# --------------------------------------------------------------------------------------------
# read order and the weight multiplier


def _stale_steps(loss_fn, steps=4, n=8, s=14.3):
    """Same ids every step, new features each time: every rate read after step 1 is stale."""
    out = []
    for step in range(steps):
        f, g = features(n, seed=500 + step, dtype=torch.float32, align=1.0 + step)
        loss_fn(f, g, torch.tensor(s), sample_ids=torch.arange(n))
        out.append({k: float(v) for k, v in loss_fn.metrics.items()})
    return out


@pytest.mark.parametrize("estimate", ["absolute", "relative"])
def test_decl_include_current_bounds_the_weight_by_one_over_gamma(estimate):
    gamma = 0.5
    kw = dict(rate="index", num_samples=8, gamma=gamma, schedule="decl", estimate=estimate)
    update_then_read = _stale_steps(create_loss("decl", **kw))
    read_then_update = _stale_steps(create_loss("decl", include_current=False, **kw))
    assert all(m["weight_max"] <= 1 / gamma * (1 + 1e-5) for m in update_then_read)
    assert all(m["weight_mean"] <= m["weight_max"] for m in update_then_read)
    # the same stale rates read before the update are not bounded by 1 / gamma
    assert max(m["weight_max"] for m in read_then_update) > 1 / gamma


def test_decl_default_reads_after_the_update_and_the_clamp_bounds_read_then_update():
    assert create_loss("decl", num_samples=4).include_current is True
    assert create_loss("decl", rate="queue").include_current is False
    loss_fn = create_loss(
        "decl", rate="index", num_samples=8, include_current=False, schedule="decl", max_log_ratio=0.5
    )
    metrics = _stale_steps(loss_fn)
    assert max(m["weight_max"] for m in metrics) == pytest.approx(math.exp(0.5))
    assert max(m["clamp_rate"] for m in metrics) > 0.0
    with pytest.raises(ValueError, match="max_log_ratio=0"):
        create_loss("decl", rate="batch", max_log_ratio=0)


# --------------------------------------------------------------------------------------------
# the gamma schedule


def test_decl_cosine_gamma_holds_one_through_the_first_epoch_then_decays():
    loss_fn = create_loss(
        "decl",
        rate="index",
        num_samples=4,
        gamma=0.2,
        gamma_schedule="cosine",
        gamma_decay_steps=10,
        gamma_hold_steps=5,
    )
    assert [loss_fn.gamma_at(t) for t in range(1, 7)] == [1.0] * 6  # steps 1-5 held, step 6 starts the cosine
    assert loss_fn.gamma_at(11) == pytest.approx(0.6)  # half way through the decay
    assert loss_fn.gamma_at(16) == pytest.approx(0.2) and loss_fn.gamma_at(100) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="gamma_hold_steps=-1"):
        create_loss("decl", rate="index", num_samples=4, gamma_hold_steps=-1)


# --------------------------------------------------------------------------------------------
# temperature modes


def _scale_grad(loss_fn, f, g, s, **kw):
    a = leaves(f, g, s)
    value = loss_fn(*a, **kw)
    return value, grads(value, a)


@pytest.mark.parametrize("estimate", ["absolute", "relative"])
@pytest.mark.parametrize("lam", [1.0, 0.3, 0.0])
def test_decl_temperature_infonce_trains_the_scale_with_infonce_alone(estimate, lam):
    f, g = features(7, seed=21, align=1.0)
    s = 14.3
    kw = dict(rate="batch", estimate=estimate, schedule="constant", lam=lam)
    v_learned, g_learned = _scale_grad(create_loss("decl", temperature_mode="learned", **kw), f, g, s)
    v_infonce, g_infonce = _scale_grad(create_loss("decl", temperature_mode="infonce", **kw), f, g, s)
    torch.testing.assert_close(v_infonce, v_learned, rtol=1e-12, atol=1e-12)
    assert_close_all(g_infonce[:2], g_learned[:2], rtol=1e-10, atol=1e-12)  # the features' gradients
    b = leaves(f, g, s)
    infonce_scale = grads(ClipLoss()(*b), b)[2]
    torch.testing.assert_close(g_infonce[2], (1 - lam) * infonce_scale, rtol=1e-9, atol=1e-12)
    if lam == 1.0:  # loss1 alone pushes the scale up (a negative gradient), which this mode removes
        assert float(g_learned[2]) < 0.0 and float(g_infonce[2]) == 0.0


@pytest.mark.parametrize(
    "kw,warns",
    [
        (dict(schedule="decl"), True),
        (dict(schedule="constant", lam=1.0), True),
        (dict(schedule="constant", lam=0.5), False),
        (dict(schedule="alternate"), False),
        (dict(schedule="harmonic", lam=1.0), False),
        (dict(schedule="decl", temperature_mode="fixed", temperature=0.05), False),
        (dict(schedule="decl", temperature_mode="rgclg"), False),
    ],
)
def test_decl_warns_when_no_step_would_train_the_scale_it_leaves_to_infonce(kw, warns, recwarn):
    """With lambda_t = 1 on every step the InfoNCE-trained scale gets a zero gradient for the whole run (pinned
    above at lam = 1): say so when the loss is built, and only then."""
    create_loss("decl", rate="batch", **kw)
    said = [str(w.message) for w in recwarn if "takes no InfoNCE step" in str(w.message)]
    assert len(said) == int(warns)
    if warns:
        assert f"schedule={kw['schedule']!r}" in said[0] and "keeps its initial value" in said[0]
        assert ("lam=1.0" in said[0]) == ("lam" in kw)


def test_decl_temperature_fixed_uses_its_temperature_and_gives_the_scale_a_zero_gradient():
    f, g = features(6, seed=4)
    loss_fn = create_loss(
        "decl",
        estimate="absolute",
        rate="batch",
        schedule="constant",
        lam=0.5,
        temperature_mode="fixed",
        temperature=0.05,
    )
    value, (_, _, scale_grad) = _scale_grad(loss_fn, f, g, 14.3)
    rates = ref.batch_mean_negative_score(f, g, 20.0)
    expected, _, _ = ref.decl(f, g, 20.0, rates, torch.ones_like(rates), 0.5)
    torch.testing.assert_close(value, expected, rtol=1e-9, atol=1e-9)
    assert scale_grad is not None and float(scale_grad) == 0.0  # a zero, not None: DDP expects a gradient


@pytest.mark.parametrize("estimate", ["absolute", "relative"])
@pytest.mark.parametrize("rho", [None, 1.0])
def test_decl_temperature_rgclg_gives_the_scale_fastclip_v3s_gradient(estimate, rho):
    f, g = features(7, seed=9, align=1.5)
    s = 14.3
    kw = dict(rate="batch", estimate=estimate, schedule="constant", lam=0.6)
    v_learned, g_learned = _scale_grad(create_loss("decl", temperature_mode="learned", **kw), f, g, s)
    loss_fn = create_loss("decl", temperature_mode="rgclg", rho=rho, **kw)
    v_rgclg, g_rgclg = _scale_grad(loss_fn, f, g, s)
    torch.testing.assert_close(v_rgclg, v_learned, rtol=1e-12, atol=1e-12)  # the term adds no value
    assert_close_all(g_rgclg[:2], g_learned[:2], rtol=1e-10, atol=1e-12)  # nor any feature gradient
    # batch rate: the rate of g_i is g_i itself at this scale
    log_rates = ref.batch_mean_negative_score(f, g, s, relative=True).log()
    rho_used = rho if rho is not None else math.log(6) - (math.log(1023) - 6.5)
    want = ref.rgclg_scale_gradient(f, g, torch.tensor(s, dtype=torch.float64), log_rates, rho_used)
    torch.testing.assert_close(g_rgclg[2], want, rtol=1e-9, atol=1e-12)


def test_decl_rgclg_scale_settles_where_the_negatives_kl_equals_rho():
    """Gradient descent on the scale alone (features fixed) ends where mean_i KL(p_i || uniform) = rho."""
    f, g = features(16, seed=2, align=2.0)
    rho = 1.2
    loss_fn = create_loss("decl", rate="batch", estimate="relative", schedule="decl", temperature_mode="rgclg", rho=rho)
    log_s = torch.tensor(math.log(5.0), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([log_s], lr=0.05)
    for _ in range(400):
        opt.zero_grad()
        loss_fn(f, g, log_s.exp()).backward()
        opt.step()
    s = float(log_s.exp())
    kls = []
    for a, b in ((f, g), (g, f)):
        c = s * a @ b.T
        for i in range(16):
            neg = torch.cat([c[i, :i], c[i, i + 1 :]])
            p = torch.softmax(neg, 0)
            kls.append(float((p * (p * 15).log()).sum()))
    assert sum(kls) / len(kls) == pytest.approx(rho, abs=0.02)


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(estimate="both"), "estimate='both'"),
        (dict(temperature_mode="free"), "temperature_mode='free'"),
        (dict(temperature_mode="fixed"), "temperature=None"),
        (dict(temperature_mode="fixed", temperature=0.0), "temperature=0.0"),
        (dict(temperature=0.1), "temperature=0.1"),
        (dict(rho=2.0), "rho=2.0"),
        (dict(temperature_mode="rgclg", rho=float("nan")), "rho=nan"),
    ],
)
def test_decl_variant_arguments_are_checked(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        create_loss("decl", rate="batch", **kwargs)


@pytest.mark.parametrize("rate", ["index", "queue"])
def test_decl_relative_state_resumes_bit_exactly(tmp_path, rate):
    """Five steps in one go equal three steps, a save and load into a fresh loss, and two more."""
    kw = dict(rate=rate, estimate="relative", num_samples=12, queue_size=10, sample_u=True, seed=3)
    batches = [
        (features(6, seed=700 + t, dtype=torch.float32), torch.tensor([(2 * t + k) % 12 for k in range(6)]))
        for t in range(5)
    ]

    def run(loss_fn, steps):
        return [float(loss_fn(f, g, torch.tensor(14.3), sample_ids=ids)) for (f, g), ids in steps]

    whole = create_loss("decl", **kw)
    straight = run(whole, batches)
    first = create_loss("decl", **kw)
    resumed = run(first, batches[:3])
    torch.save(first.state_dict(), tmp_path / "state.pt")
    second = create_loss("decl", **kw)
    second.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    resumed += run(second, batches[3:])
    assert resumed == straight
    for name, buf in whole.state_dict().items():
        assert torch.equal(buf.nan_to_num(-7), second.state_dict()[name].nan_to_num(-7)), name


# --------------------------------------------------------------------------------------------
# non-finite steps: only finite estimates and embeddings enter the state; a skipped step is undone


@pytest.mark.parametrize("rate", ["index", "queue"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_features_never_enter_the_state_and_the_next_step_is_finite(rate, bad):
    kw = dict(rate=rate, num_samples=12, queue_size=16)
    loss_fn = create_loss("decl", **kw)
    f, g = features(6, seed=1, dtype=torch.float32)
    loss_fn(f, g, torch.tensor(14.3), sample_ids=torch.arange(6))
    f_bad = f.clone()
    f_bad[2, 0] = bad
    loss_fn(f_bad, g, torch.tensor(14.3), sample_ids=torch.arange(3, 9))
    assert float(loss_fn.metrics["nonfinite_dropped"]) > 0
    for name, buf in loss_fn.state_dict().items():
        if name == "log_rate":
            # ids 0-5 were visited by the clean step and keep finite rates; the new ids 6-8 get image rates
            # (their rows are clean) and a text rate only where the bad image left it finite; NaN = unvisited
            assert bool(torch.isfinite(buf[:, :6]).all()) and bool(torch.isfinite(buf[0, 6:9]).all())
            assert not bool(torch.isinf(buf).any()) and bool(torch.isnan(buf[:, 9:]).all())
        elif buf.is_floating_point():
            assert bool(torch.isfinite(buf).all()), name
    f2, g2 = features(6, seed=2, dtype=torch.float32)
    assert math.isfinite(float(loss_fn(f2, g2, torch.tensor(14.3), sample_ids=torch.arange(6))))
    assert float(loss_fn.metrics["nonfinite_dropped"]) == 0


@pytest.mark.parametrize("rate", ["index", "queue"])
def test_nonfinite_step_rolled_back_equals_a_run_without_it(rate):
    kw = dict(rate=rate, num_samples=12, queue_size=8, sample_u=True, accum_freq=1)
    batches = [
        (features(6, seed=10 + t, dtype=torch.float32), torch.tensor([(3 * t + k) % 12 for k in range(6)]))
        for t in range(3)
    ]
    with_bad, without = create_loss("decl", **kw), create_loss("decl", **kw)
    for t, ((f, g), ids) in enumerate(batches):
        if t == 1:
            f_bad = f.clone()
            f_bad[0, 0] = float("nan")
            with_bad(f_bad, g, torch.tensor(14.3), sample_ids=ids)
            assert with_bad.rollback_step() and not with_bad.rollback_step()
            continue
        a = with_bad(f, g, torch.tensor(14.3), sample_ids=ids)
        b = without(f, g, torch.tensor(14.3), sample_ids=ids)
        assert torch.equal(a, b)
        assert with_bad.state_digest() == without.state_digest()


def test_nonfinite_skipped_amp_step_is_undone_by_the_trainer_hook():
    """The trainer's check between steps: a GradScaler whose scale fell skipped the step just taken."""
    from clip_dcl.train.steps import SkippedSteps

    class Scaler:
        def __init__(self):
            self.scale = 1024.0

        def is_enabled(self):
            return True

        def get_scale(self):
            return self.scale

    scaler, loss_fn = Scaler(), create_loss("decl", rate="index", num_samples=12)
    hook = SkippedSteps(scaler, loss_fn)
    f, g = features(6, seed=3, dtype=torch.float32)
    loss_fn(f, g, torch.tensor(14.3), sample_ids=torch.arange(6))
    hook.check(0, 1)  # the scale held: the step was applied
    before = loss_fn.state_digest()
    loss_fn(*features(6, seed=4, dtype=torch.float32), torch.tensor(14.3), sample_ids=torch.arange(6, 12))
    assert loss_fn.state_digest() != before
    scaler.scale = 512.0  # GradScaler backs off after inf / NaN gradients
    hook.check(0, 2)
    assert loss_fn.state_digest() == before and hook.count == 1 and int(loss_fn.calls) == 1
