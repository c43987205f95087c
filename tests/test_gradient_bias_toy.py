"""The pure functions of ``benchmarks/gradient_bias_toy.py`` against independent references."""

import json

import benchmark_script
import numpy as np
import pytest
import torch
from scipy import optimize

toy = benchmark_script.load("gradient_bias_toy")


def _neg_log_f(s, reg):
    """-log F + reg |s|^2 written from the paper's F = e^s1 / (e^s1 + e^s2), nothing shared with the script."""
    f = np.exp(s[0]) / (np.exp(s[0]) + np.exp(s[1]))
    return -np.log(f) + reg * (s[0] ** 2 + s[1] ** 2)


@pytest.mark.parametrize("reg", [0.05, 0.1, 0.5])
def test_exact_optimum_is_the_numerical_minimiser(reg):
    opt = toy.exact_optimum(reg)
    assert np.abs(toy.objective_grad(opt, reg)).max() < 1e-12
    for start in ([0.0, 0.0], [2.0, 1.0], [-1.5, 2.5]):
        res = optimize.minimize(
            _neg_log_f,
            start,
            args=(reg,),
            method="Nelder-Mead",
            options={"xatol": 1e-10, "fatol": 1e-15, "maxiter": 20000},
        )
        np.testing.assert_allclose(res.x, opt, atol=1e-7)
    assert _neg_log_f(opt, reg) == pytest.approx(float(toy.objective(opt, reg)), abs=1e-14)


def test_objective_and_gradient_match_autograd():
    rng = np.random.default_rng(0)
    s = rng.normal(0.0, 2.0, size=(64, 2))
    st = torch.tensor(s, requires_grad=True)
    j = -torch.log_softmax(st, dim=-1)[:, 0] + 0.1 * (st**2).sum(-1)
    j.sum().backward()
    np.testing.assert_allclose(toy.objective(s), j.detach().numpy(), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(toy.objective_grad(s), st.grad.numpy(), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("positivity", toy.POSITIVITY)
def test_stochastic_losses_match_autograd(positivity):
    rng = np.random.default_rng(1)
    n, floor, reg = 4000, 0.05, 0.1
    s = rng.normal(0.0, 1.0, size=(n, 2))
    delta = rng.normal(0.0, 1.5, size=n)  # wide enough that both clamps are on in many rows
    u = rng.exponential(0.5, size=n)
    st, dt, ut = (torch.tensor(x) for x in (s, delta, u))
    st.requires_grad_(True)
    e = st.exp()
    raw = e[:, 0] + e[:, 1] + dt
    c = torch.full_like(raw, floor) if positivity == "denominator" else e[:, 0] + floor
    den = torch.where(raw > c, raw, c)
    reg_t = reg * (st**2).sum(-1)
    sgd = den.log() - st[:, 0] + reg_t
    decl = ut * den - st[:, 0] + reg_t
    (g_sgd,) = torch.autograd.grad(sgd.sum(), st, retain_graph=True)
    (g_decl,) = torch.autograd.grad(decl.sum(), st)

    clamped = toy.noisy_denominator(s, delta, positivity, floor)[2]
    assert 0.05 < clamped.mean() < 0.95  # both branches are exercised
    loss, grad = toy.sgd_loss_and_grad(s, delta, reg, positivity, floor)
    np.testing.assert_allclose(loss, sgd.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grad, g_sgd.numpy(), rtol=1e-12, atol=1e-12)
    loss, grad = toy.decl_loss_and_grad(s, delta, u, reg, positivity, floor)
    np.testing.assert_allclose(loss, decl.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grad, g_decl.numpy(), rtol=1e-12, atol=1e-12)


def test_noise_free_gradient_descent_converges_to_the_optimum():
    steps, runs = 4000, 3  # DeCL's rate lags D by its moving average: slower than plain descent
    zeros, ones = np.zeros((steps, runs)), np.ones((steps, runs))
    s0 = np.array([[0.0, 0.0], [2.0, -2.0], [-1.0, 1.5]])
    opt = toy.exact_optimum()
    for method in ("sgd", "decl_mean"):
        final = toy.run_method(method, zeros, ones, s0, lr=0.2)["traj"][-1]
        np.testing.assert_allclose(final, np.broadcast_to(opt, final.shape), atol=1e-12)
    # eps = 1 makes the sampled u its mean: the two DeCL variants must then coincide step by step.
    rng = np.random.default_rng(2)
    deltas = rng.normal(0.0, 0.3, size=(50, runs))
    a = toy.run_method("decl_sampled", deltas, ones[:50], s0, lr=0.2)["traj"]
    b = toy.run_method("decl_mean", deltas, rng.exponential(size=(50, runs)), s0, lr=0.2)["traj"]
    np.testing.assert_array_equal(a, b)


def test_rate_is_a_moving_average_of_the_noisy_denominators_read_after_update():
    rng = np.random.default_rng(3)
    steps, gamma = 40, 0.2
    deltas = rng.normal(0.0, 0.5, size=(steps, 2))
    eps = rng.exponential(size=(steps, 2))
    s0 = rng.normal(size=(2, 2))
    res = toy.run_method("decl_sampled", deltas, eps, s0, lr=0.1, rate_momentum=gamma)
    traj = res["traj"]
    for k in range(2):  # slow re-computation along the recorded trajectory
        rate = None
        for t in range(steps):
            e = np.exp(traj[t, k])
            den = max(e.sum() + deltas[t, k], 1e-2)
            rate = den if rate is None else (1 - gamma) * rate + gamma * den
            assert res["rate"][t, k] == pytest.approx(rate, rel=1e-13)
            u = eps[t, k] / rate
            step = (
                np.array([u * e[0] - 1.0, u * e[1]]) + 0.2 * traj[t, k]
                if e.sum() + deltas[t, k] > 1e-2
                else np.array([-1.0, 0.0]) + 0.2 * traj[t, k]
            )
            np.testing.assert_allclose(traj[t + 1, k], traj[t, k] - 0.1 * step, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("positivity", toy.POSITIVITY)
@pytest.mark.parametrize("method", ["sgd", "decl_mean"])
def test_expected_update_matches_monte_carlo(method, positivity):
    rng = np.random.default_rng(4)
    s, v, floor = np.array([0.7, -0.9]), 0.3, 0.05
    delta = rng.normal(0.0, np.sqrt(v), size=400_000)
    sb = np.broadcast_to(s, (delta.size, 2))
    expected = toy.expected_update_direction(method, s, v, positivity=positivity, floor=floor)
    if method == "sgd":
        grads = toy.sgd_loss_and_grad(sb, delta, positivity=positivity, floor=floor)[1]
        mc, se = grads.mean(axis=0), grads.std(axis=0) / np.sqrt(delta.size)
    else:  # u at the rate's fixed point 1 / E[D~]: the update is E[grad D~] / E[D~] + the rest
        den, dden, _ = toy.noisy_denominator(sb, delta, positivity, floor)
        m_den, m_grad = den.mean(), dden.mean(axis=0)
        se_den, se_grad = den.std() / np.sqrt(delta.size), dden.std(axis=0) / np.sqrt(delta.size)
        mc = m_grad / m_den - np.array([1.0, 0.0]) + 0.2 * s
        se = np.hypot(se_grad / m_den, m_grad * se_den / m_den**2)  # delta method for the ratio
    assert np.all(np.abs(mc - expected) < 5 * se + 1e-9)


@pytest.mark.parametrize("positivity", toy.POSITIVITY)
@pytest.mark.parametrize("method", ["sgd", "decl_mean"])
def test_expected_update_is_the_gradient_of_the_potential(method, positivity):
    s, h = np.array([0.5, -1.2]), 1e-5
    for v in (0.0, 0.3):
        fd = [
            (
                toy.potential(method, s + h * e, v, positivity=positivity)
                - toy.potential(method, s - h * e, v, positivity=positivity)
            )
            / (2 * h)
            for e in np.eye(2)
        ]
        np.testing.assert_allclose(fd, toy.expected_update_direction(method, s, v, positivity=positivity), atol=1e-7)
    # The grid scan's trapezoid rule agrees with the adaptive quadrature.
    assert toy.potential("sgd", s, 0.3, positivity=positivity, nodes=1201) == pytest.approx(
        toy.potential("sgd", s, 0.3, positivity=positivity), abs=1e-5
    )


def test_predicted_fixed_points():
    opt = toy.exact_optimum()
    for method in ("sgd", "decl_mean"):
        np.testing.assert_allclose(toy.predicted_fixed_point(method, 0.0)["point"], opt, atol=1e-10)
    # DeCL's expected estimate is unbiased when the clamp (almost) never bites.
    np.testing.assert_allclose(toy.predicted_fixed_point("decl_mean", 0.1)["point"], opt, atol=1e-6)
    # SGD's is not: Jensen moves its fixed point off the optimum.
    assert np.linalg.norm(toy.predicted_fixed_point("sgd", 0.1)["point"] - opt) > 0.01


def test_polyak_average_is_the_mean_of_the_second_half():
    traj = np.arange(5.0)[:, None, None] * np.ones((5, 1, 2))  # s_0 .. s_4
    np.testing.assert_array_equal(toy.polyak_average(traj), [[3.5, 3.5]])


def test_bad_input_is_rejected():
    with pytest.raises(SystemExit):
        toy.parse_args(["--variances", "-0.1"])
    with pytest.raises(SystemExit):
        toy.parse_args(["--rate-momentum", "0"])
    with pytest.raises(ValueError, match="adam"):
        toy.run_method("adam", np.zeros((2, 1)), np.ones((2, 1)), np.zeros((1, 2)), lr=0.1)
    with pytest.raises(ValueError, match="clip"):
        toy.noisy_denominator(np.zeros(2), 0.0, positivity="clip")
    with pytest.raises(ValueError, match="reg"):
        toy.exact_optimum(0.0)


def test_main_writes_the_report(tmp_path, capsys):
    assert (
        toy.main(
            [
                "--seeds",
                "2",
                "--steps",
                "20",
                "--variances",
                "0.2",
                "--step-check",
                "0",
                "--floor-check",
                "--out-dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    data = json.loads((tmp_path / "gradient_bias_toy.json").read_text())
    assert len(data["runs"]["denominator"]["0.2"]["sgd"]["dist_final"]) == 2
    report = (tmp_path / "gradient_bias_toy.md").read_text()
    assert "| 0.2 | DeCL, mean u |" in report and "--seeds 2" in report
    assert (tmp_path / "gradient_bias_toy.png").stat().st_size > 0
    assert "| 0.2 | SGD (direct) |" in capsys.readouterr().out
