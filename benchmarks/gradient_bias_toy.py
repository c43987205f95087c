"""The gradient-bias toy of the DeCL paper (Sec. 2.1 and Figure 1; Appendix F and Figure 3).

Two "similarity scores" ``exp(s1)`` (the positive) and ``exp(s2)`` (the mass of all negatives)
are trained to maximise ``F = e^{s1} / (e^{s1} + e^{s2})`` under the regulariser
``0.1 (s1^2 + s2^2)``. The paper states the objective as "F, to be maximised, with a regulariser
0.1 (s1^2 + s2^2)" without saying how the two combine; we use the contrastive-loss form of the
paper's Eq. (1), the form that DeCL's Gamma augmentation decomposes::

    J(s) = -log F(s) + reg (s1^2 + s2^2) = log D(s) - s1 + reg |s|^2,   D(s) = e^{s1} + e^{s2}.

``J`` is strictly convex; its minimiser has ``s2 = -s1`` and ``sigmoid(-2 s1) = 2 reg s1``, a 1-D
root solved here to machine precision (:func:`exact_optimum`).

Noise (the paper's): each step sees the denominator as ``D(s) + delta_t``, ``delta_t ~ N(0, v)``
drawn afresh, standing for a minibatch estimate of the negatives' mass. A Gaussian can make it
non-positive, where ``log`` and ``1/D`` are undefined; the paper does not say what it did. Two
handlings, both run (:func:`noisy_denominator`):

* ``denominator`` (headline): ``D~_t = max(D(s) + delta_t, floor)`` with a small ``floor``: the
  paper's noise untouched except in the steps where the estimate would be (nearly) non-positive,
  rare near the optimum, frequent where ``D`` is small next to ``sqrt(v)``.
* ``neg_mass``: the noisy negatives' mass ``e^{s2} + delta_t`` is clamped at ``floor``, as a sum of
  similarity scores is never negative (clip-dcl's debiased loss clamps its estimator the same way).
  When ``sqrt(v)`` is comparable to ``e^{s2}`` this clamp is on often and raises the *mean* of the
  estimate: the noisy mass is then itself biased, for every method.

Where a clamp is on, the clamped value is used and the noise term gets no gradient (the exact
derivative of the clamped expression). Every method sees the same estimates and noise draws.

Methods (same start, step size and number of steps):

* ``sgd`` (the paper's direct optimisation): gradient descent on ``log D~_t(s) - s1 + reg |s|^2``.
  Its expected gradient holds ``E[1 / D~_t]``, not ``1 / D``: biased (Jensen), Sec. 2.1.
* ``decl_sampled`` / ``decl_mean``: DeCL (Algorithm 1, line 8, with ``lambda_t = 1``): gradient
  descent on the decomposable loss ``u_t D~_t(s) - s1 + reg |s|^2``, which is linear in the noisy
  estimate, with ``u_t ~ Gamma(shape 1, rate r_t)`` (``u = eps / r``, ``eps ~ Exp(1)``) or its
  mean ``1 / r_t``. The rate ``r_t`` estimates ``E[D~]`` by a moving average of the noisy
  estimates, updated before it is read: ``r_1 = D~_1``, ``r_t = (1 - gamma) r_{t-1} + gamma D~_t``
  (Sec. 2.2.3, "Simulation", the global-buffer option).

Results: distance of the final iterate and of the Polyak average (mean of the second half of the
iterates) to the noise-free optimum, over seeds; the fixed points the expected updates predict
(:func:`predicted_fixed_point`); a plot of the trajectories. Hand-written (numpy/scipy) because
the problem is two scalars: clip-dcl's ``decl`` loss works on embedding batches, not on this toy.

Run ``python benchmarks/gradient_bias_toy.py`` (``--quick`` for a smoke run, ``--help`` for flags).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy import integrate, optimize, special

from clip_dcl.experiment.figures import pyplot
from clip_dcl.experiment.reporting import Report, command_line, machine_info, markdown_table

REG = 0.1
METHODS = ("sgd", "decl_sampled", "decl_mean")
POSITIVITY = ("denominator", "neg_mass")
LABELS = {"sgd": "SGD (direct)", "decl_sampled": "DeCL, sampled u", "decl_mean": "DeCL, mean u"}
COLORS = {"sgd": "tab:blue", "decl_sampled": "tab:red", "decl_mean": "tab:orange"}
# The point the paper reports for DeCL at convergence (Sec. 2.1, v = 0.1, lr 0.2); checked below.
PAPER_DECL_POINT = (2.97, 0.34)
REPO = Path(__file__).resolve().parents[1]


# -- the noise-free problem -----------------------------------------------------------------


def objective(s: np.ndarray, reg: float = REG) -> np.ndarray:
    """``J(s) = log(e^{s1} + e^{s2}) - s1 + reg (s1^2 + s2^2)`` over the last axis (size 2)."""
    s = np.asarray(s, dtype=np.float64)
    return np.logaddexp(s[..., 0], s[..., 1]) - s[..., 0] + reg * np.sum(s * s, axis=-1)


def objective_grad(s: np.ndarray, reg: float = REG) -> np.ndarray:
    """Gradient of :func:`objective`: ``(p1 - 1, p2) + 2 reg s`` with ``p = softmax(s)``."""
    s = np.asarray(s, dtype=np.float64)
    p = special.softmax(s, axis=-1)
    return p - np.array([1.0, 0.0]) + 2.0 * reg * s


def exact_optimum(reg: float = REG) -> np.ndarray:
    """The unique minimiser of :func:`objective`.

    ``dJ/ds1 + dJ/ds2 = 2 reg (s1 + s2)`` forces ``s2 = -s1 = -a`` and then ``dJ/ds1 = 0`` reads
    ``g(a) = sigmoid(-2a) - 2 reg a = 0``; ``g`` decreases from 1/2 at 0 to below 0 at
    ``1 / (2 reg)``, so Brent's method brackets the root; one Newton step polishes it.
    """
    if not reg > 0:
        raise ValueError(f"reg={reg!r} must be > 0 (without it the optimum is at infinity)")

    def g(a: float) -> float:
        return special.expit(-2.0 * a) - 2.0 * reg * a

    a = optimize.brentq(g, 0.0, 1.0 / (2.0 * reg), xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=200)
    sig = special.expit(-2.0 * a)
    a -= g(a) / (-2.0 * sig * (1.0 - sig) - 2.0 * reg)
    return np.array([a, -a])


# -- the stochastic losses ------------------------------------------------------------------


def noisy_denominator(s: np.ndarray, delta: np.ndarray, positivity: str = "denominator", floor: float = 1e-2):
    """The noisy denominator ``D~ = max(e^{s1} + e^{s2} + delta, c)``, and its gradient in ``s``.

    ``positivity="denominator"``: ``c = floor``, the whole estimate is clamped at a small positive
    value (the paper's noise untouched unless it would make the denominator non-positive);
    ``positivity="neg_mass"``: ``c = e^{s1} + floor``, i.e. the noisy negatives' mass
    ``e^{s2} + delta`` is clamped at ``floor``, as a sum of similarity scores cannot be negative.
    Where clamped, ``D~ = c`` and its gradient is that of ``c`` (the noise term gets none).

    Shapes: ``s (..., 2)``, ``delta (...)`` -> ``D~ (...)``, ``grad (..., 2)``, ``clamped (...)``.
    """
    if positivity not in POSITIVITY:
        raise ValueError(f"positivity={positivity!r} is not one of {POSITIVITY}")
    s = np.asarray(s, dtype=np.float64)
    e = np.exp(s)
    raw = e[..., 0] + e[..., 1] + delta
    if positivity == "denominator":
        c, grad_c = np.full_like(raw, floor), np.zeros_like(e)
    else:
        c, grad_c = e[..., 0] + floor, np.stack([e[..., 0], np.zeros_like(raw)], axis=-1)
    clamped = raw <= c
    den = np.where(clamped, c, raw)
    grad = np.where(clamped[..., None], grad_c, e)
    return den, grad, clamped


def sgd_loss_and_grad(s, delta, reg: float = REG, positivity: str = "denominator", floor: float = 1e-2):
    """The direct (non-decomposable) stochastic loss ``log D~(s) - s1 + reg |s|^2`` and its gradient.

    Shapes: ``s (..., 2)``, ``delta (...)`` -> ``loss (...)``, ``grad (..., 2)``.
    """
    s = np.asarray(s, dtype=np.float64)
    den, dden, _ = noisy_denominator(s, delta, positivity, floor)
    loss = np.log(den) - s[..., 0] + reg * np.sum(s * s, axis=-1)
    return loss, dden / den[..., None] - np.array([1.0, 0.0]) + 2.0 * reg * s


def decl_loss_and_grad(s, delta, u, reg: float = REG, positivity: str = "denominator", floor: float = 1e-2):
    """DeCL's decomposable loss ``u D~(s) - s1 + reg |s|^2`` (Algorithm 1, line 8) and its gradient.

    ``u`` (shape ``(...)``) is the auxiliary variable, held fixed (no gradient). Shapes as
    :func:`sgd_loss_and_grad`.
    """
    s = np.asarray(s, dtype=np.float64)
    u = np.asarray(u, dtype=np.float64)
    den, dden, _ = noisy_denominator(s, delta, positivity, floor)
    loss = u * den - s[..., 0] + reg * np.sum(s * s, axis=-1)
    return loss, u[..., None] * dden - np.array([1.0, 0.0]) + 2.0 * reg * s


# -- optimisation ---------------------------------------------------------------------------


def run_method(
    method: str,
    deltas: np.ndarray,
    eps: np.ndarray,
    s0: np.ndarray,
    lr: float,
    reg: float = REG,
    rate_momentum: float = 0.05,
    positivity: str = "denominator",
    floor: float = 1e-2,
) -> dict:
    """Run one method on a batch of independent runs; returns the trajectories.

    Args:
        method: one of :data:`METHODS`.
        deltas: ``(steps, runs)`` noise added to the denominator at each step.
        eps: ``(steps, runs)`` Exp(1) draws for ``decl_sampled`` (``u = eps / r``); unused otherwise.
        s0: ``(runs, 2)`` starting points.
        lr: step size of plain gradient descent.
        rate_momentum: ``gamma``, the weight of the newest estimate in the rate's moving average.
        positivity, floor: how the noisy denominator is kept positive (:func:`noisy_denominator`).

    Returns:
        ``{"traj": (steps + 1, runs, 2), "clamped": (runs,) number of steps with the clamp on,
        "rate": (steps, runs) the rate used (NaN for sgd)}``.
    """
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not one of {METHODS}")
    deltas, eps = np.asarray(deltas, dtype=np.float64), np.asarray(eps, dtype=np.float64)
    steps, runs = deltas.shape
    if eps.shape != deltas.shape:
        raise ValueError(f"eps has shape {eps.shape}, expected {deltas.shape} like deltas")
    s = np.array(s0, dtype=np.float64)
    if s.shape != (runs, 2):
        raise ValueError(f"s0 has shape {s.shape}, expected {(runs, 2)}")
    traj = np.empty((steps + 1, runs, 2))
    traj[0] = s
    rates = np.full((steps, runs), np.nan)
    clamped = np.zeros(runs, dtype=np.int64)
    rate = None
    for t in range(steps):
        if method == "sgd":
            _, grad = sgd_loss_and_grad(s, deltas[t], reg, positivity, floor)
            clamped += noisy_denominator(s, deltas[t], positivity, floor)[2]
        else:
            den, _, off = noisy_denominator(s, deltas[t], positivity, floor)
            clamped += off
            # Update before read, so the current estimate enters the rate (first visit: r = D~_1).
            rate = den if rate is None else (1.0 - rate_momentum) * rate + rate_momentum * den
            rates[t] = rate
            u = (eps[t] if method == "decl_sampled" else 1.0) / rate
            _, grad = decl_loss_and_grad(s, deltas[t], u, reg, positivity, floor)
        s = s - lr * grad
        traj[t + 1] = s
    return {"traj": traj, "clamped": clamped, "rate": rates}


def polyak_average(traj: np.ndarray) -> np.ndarray:
    """Mean of the iterates of the second half, ``s_{T//2 + 1} .. s_T`` (``traj[0]`` is ``s_0``)."""
    steps = traj.shape[0] - 1
    return traj[steps // 2 + 1 :].mean(axis=0)


# -- what the expected updates converge to ----------------------------------------------------


def expected_update_direction(
    method: str, s: np.ndarray, v: float, reg: float = REG, positivity: str = "denominator", floor: float = 1e-2
) -> np.ndarray:
    """The mean gradient at ``s`` once DeCL's rate has settled, as an integral over ``delta ~ N(0, v)``.

    With ``c`` the clamp level and ``on = {D + delta > c}``:
    ``sgd``: ``E[grad log D~] = grad D E[1/(D + delta); on] + grad c P(off) / c - (1, 0) + 2 reg s``.
    DeCL (either ``u``): ``E[u] = 1 / E[D~]`` (the rate's fixed point, ignoring the moving average's
    own spread), times ``E[grad D~]``: the gradient of ``log E[D~(s)] - s1 + reg |s|^2``. So DeCL is
    unbiased except for what the clamp does to the expected estimate. ``v = 0`` gives the plain
    gradient (:func:`objective_grad` when the clamp is off).
    """
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not one of {METHODS}")
    if positivity not in POSITIVITY:
        raise ValueError(f"positivity={positivity!r} is not one of {POSITIVITY}")
    s = np.asarray(s, dtype=np.float64)
    e = np.exp(s)
    big_d = e.sum()
    c, grad_c = (floor, np.zeros(2)) if positivity == "denominator" else (e[0] + floor, np.array([e[0], 0.0]))
    base = -np.array([1.0, 0.0]) + 2.0 * reg * s
    if v == 0:
        den, dden = (big_d, e) if big_d > c else (c, grad_c)
        return dden / den + base
    sd = np.sqrt(v)
    cut = c - big_d  # the clamp is off for delta > cut
    p_on = special.ndtr(-cut / sd)
    p_off = special.ndtr(cut / sd)

    def on_mean(f) -> float:
        # E[f(delta); delta > cut] over the standard normal z = delta / sd; beyond z = 12 the
        # density (< 1e-31) contributes nothing at double precision.
        lo = cut / sd
        if lo >= 12.0:
            return 0.0
        val, _ = integrate.quad(
            lambda z: f(sd * z) * np.exp(-0.5 * z * z) / np.sqrt(2.0 * np.pi),
            lo,
            12.0,
            points=[0.0] if lo < 0.0 else None,
            epsabs=1e-15,
            epsrel=1e-13,
            limit=500,
        )
        return val

    if method == "sgd":
        return e * on_mean(lambda d: 1.0 / (big_d + d)) + grad_c * p_off / c + base
    mean_den = on_mean(lambda d: big_d + d) + c * p_off
    return (e * p_on + grad_c * p_off) / mean_den + base


def clamp_level(s: np.ndarray, positivity: str, floor: float) -> np.ndarray:
    """``c(s)``, the level :func:`noisy_denominator` clamps ``D + delta`` at; shape ``s.shape[:-1]``."""
    s = np.asarray(s, dtype=np.float64)
    return np.full(s.shape[:-1], floor) if positivity == "denominator" else np.exp(s[..., 0]) + floor


def potential(
    method: str,
    s: np.ndarray,
    v: float,
    reg: float = REG,
    positivity: str = "denominator",
    floor: float = 1e-2,
    nodes: int = 0,
) -> np.ndarray:
    """The function whose gradient is :func:`expected_update_direction`, over ``s (..., 2)``.

    ``sgd``: ``E[log D~(s)] - s1 + reg |s|^2``, the noisy loss in expectation: Jensen makes
    ``E[log D~] < log D``, most where ``D`` is small next to the noise, so it can favour a small
    denominator. DeCL: ``log E[D~(s)] - s1 + reg |s|^2`` with, for ``X ~ N(D, v)``,
    ``E[max(X, c)] = c + (D - c) Phi(k) + sqrt(v) phi(k)``, ``k = (D - c) / sqrt(v)``.

    ``E[log max(X, c)]`` is a 1-D integral: adaptive quadrature per point (``nodes = 0``) or, to
    scan a grid fast, the trapezoid rule on ``nodes`` points of ``z = delta / sqrt(v)`` in [-12, 12].
    """
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not one of {METHODS}")
    s = np.asarray(s, dtype=np.float64)
    big_d = np.exp(s).sum(axis=-1)
    c = clamp_level(s, positivity, floor)
    rest = -s[..., 0] + reg * np.sum(s * s, axis=-1)
    if v == 0:
        return np.log(np.maximum(big_d, c)) + rest
    sd = np.sqrt(v)
    if method != "sgd":
        k = (big_d - c) / sd
        return np.log(c + (big_d - c) * special.ndtr(k) + sd * np.exp(-0.5 * k * k) / np.sqrt(2.0 * np.pi)) + rest
    if nodes:
        z = np.linspace(-12.0, 12.0, nodes)
        vals = np.log(np.maximum(big_d[..., None] + sd * z, c[..., None])) * np.exp(-0.5 * z * z) / np.sqrt(2 * np.pi)
        return integrate.trapezoid(vals, z, axis=-1) + rest
    out = np.empty(big_d.shape)
    for idx in np.ndindex(big_d.shape):
        lo = (c[idx] - big_d[idx]) / sd  # below lo the clamp is on and the log is log(c)
        on, _ = integrate.quad(
            lambda z: np.log(big_d[idx] + sd * z) * np.exp(-0.5 * z * z) / np.sqrt(2.0 * np.pi),
            lo,
            12.0,
            epsabs=1e-15,
            epsrel=1e-13,
            limit=500,
        )
        out[idx] = on + np.log(c[idx]) * special.ndtr(lo)
    return out + rest


def predicted_fixed_point(
    method: str,
    v: float,
    reg: float = REG,
    positivity: str = "denominator",
    floor: float = 1e-2,
    start=(0.0, 0.0),
    box: float = 3.0,
    step: float = 0.1,
) -> dict:
    """Where the expected update, followed from ``start``, comes to rest: a minimiser of :func:`potential`.

    The potential is tabulated on a grid over ``[-box, box]^2`` (spacing ``step``); a walk from the
    grid point nearest ``start`` to its lowest neighbour, until none is lower, picks the basin the
    mean dynamics from ``start`` fall into (the noisy SGD potential need not be convex); Powell's
    hybrid root solve of :func:`expected_update_direction` then polishes that grid point.

    Returns:
        ``{"point": (2,) array, "grid_local_minima": int, "global": bool}``: the number of grid local
        minima, and whether the point reached is the lowest of them.

    Raises:
        RuntimeError: the polish did not bring every expected-gradient component below 1e-10.
    """
    axis = np.arange(-box, box + step / 2, step)
    grid = np.stack(np.meshgrid(axis, axis, indexing="ij"), axis=-1)
    pot = potential(method, grid, v, reg, positivity, floor, nodes=1201)
    n = len(axis)
    padded = np.pad(pot, 1, constant_values=np.inf)
    offsets = [(di, dj) for di in (-1, 0, 1) for dj in (-1, 0, 1) if di or dj]
    neigh = np.stack([padded[1 + di : 1 + di + n, 1 + dj : 1 + dj + n] for di, dj in offsets])
    n_local = int(np.sum(pot <= neigh.min(axis=0)))
    ij = tuple(int(np.clip(np.rint((x + box) / step), 0, n - 1)) for x in start)
    while True:
        k = int(np.argmin(neigh[:, ij[0], ij[1]]))
        if neigh[k, ij[0], ij[1]] >= pot[ij]:
            break
        ij = (ij[0] + offsets[k][0], ij[1] + offsets[k][1])

    def fun(x):
        return expected_update_direction(method, x, v, reg, positivity, floor)

    sol = optimize.root(fun, grid[ij], method="hybr", tol=1e-12)
    # hybr may stop short of its own tolerance when quad's error dominates; judge by the residual.
    if not np.all(np.isfinite(sol.x)) or np.abs(fun(sol.x)).max() > 1e-10:
        raise RuntimeError(f"fixed point of {method} at v={v} ({positivity}) not found: {sol.message}")
    return {"point": sol.x, "grid_local_minima": n_local, "global": bool(pot[ij] <= pot.min())}


# -- the benchmark ----------------------------------------------------------------------------


def benchmark(
    variances,
    seeds: int,
    steps: int,
    lr: float,
    rate_momentum: float,
    init_std: float,
    positivities=POSITIVITY,
    floor: float = 1e-2,
    reg: float = REG,
    log=print,
) -> dict:
    """All methods on all noise levels and positivity handlings; raw per-seed numbers and trajectories.

    Seed ``k`` draws its noise from ``default_rng([k, 0])`` (standard normals, scaled by
    ``sqrt(v)``, so every ``v``, handling and method shares them), its ``eps`` from ``[k, 1]`` and its
    start from ``[k, 2]`` (``N(0, init_std^2)``; exactly ``(0, 0)`` when ``init_std = 0``, Appendix F).
    """
    z = np.stack([np.random.default_rng([k, 0]).standard_normal(steps) for k in range(seeds)], axis=1)
    eps = np.stack([np.random.default_rng([k, 1]).standard_exponential(steps) for k in range(seeds)], axis=1)
    s0 = np.stack([init_std * np.random.default_rng([k, 2]).standard_normal(2) for k in range(seeds)])
    opt = exact_optimum(reg)
    j_opt = float(objective(opt, reg))
    out = {"optimum": opt.tolist(), "optimum_objective": j_opt, "starts": s0.tolist(), "runs": {}}
    trajectories = {}
    for pos in positivities:
        for v in variances:
            for method in METHODS:
                t0 = time.perf_counter()
                res = run_method(method, np.sqrt(v) * z, eps, s0, lr, reg, rate_momentum, pos, floor)
                traj = res["traj"]
                if not np.isfinite(traj).all():
                    raise RuntimeError(f"{method} diverged to non-finite values at v={v:g} ({pos}); lower --lr")
                final, avg = traj[-1], polyak_average(traj)
                # Runs share one start only when init_std = 0; otherwise predict from the mean start.
                pred = predicted_fixed_point(method, v, reg, pos, floor, start=s0.mean(axis=0))
                fixed = pred["point"]
                d_final = np.linalg.norm(final - opt, axis=-1)
                d_avg = np.linalg.norm(avg - opt, axis=-1)
                excess = objective(avg, reg) - j_opt
                rec = {
                    "predicted_fixed_point": fixed.tolist(),
                    "predicted_fixed_point_distance": float(np.linalg.norm(fixed - opt)),
                    "potential_grid_local_minima": pred["grid_local_minima"],
                    "predicted_is_global_minimum": pred["global"],
                    "final": final.tolist(),
                    "polyak": avg.tolist(),
                    "dist_final": d_final.tolist(),
                    "dist_polyak": d_avg.tolist(),
                    "dist_polyak_to_predicted": np.linalg.norm(avg - fixed, axis=-1).tolist(),
                    "excess_objective_polyak": excess.tolist(),
                    "F_polyak": special.expit(avg[:, 0] - avg[:, 1]).tolist(),
                    "clamped_steps": res["clamped"].tolist(),
                    "max_step_norm": np.linalg.norm(np.diff(traj, axis=0), axis=-1).max(axis=0).tolist(),
                    "final_rate": res["rate"][-1].tolist(),
                    "summary": {
                        k: [float(np.mean(x)), float(np.std(x))]
                        for k, x in (
                            ("dist_final", d_final),
                            ("dist_polyak", d_avg),
                            ("excess_objective_polyak", excess),
                            ("clamped_fraction", res["clamped"] / steps),
                        )
                    },
                }
                out["runs"].setdefault(pos, {}).setdefault(f"{v:g}", {})[method] = rec
                trajectories[(pos, v, method)] = traj
                log(
                    f"[{pos}] v={v:g} {method:<13} dist final {d_final.mean():.4f} +- {d_final.std():.4f}, "
                    f"Polyak {d_avg.mean():.4f} +- {d_avg.std():.4f}, predicted "
                    f"{rec['predicted_fixed_point_distance']:.4f} ({time.perf_counter() - t0:.1f}s)"
                )
    return {"results": out, "trajectories": trajectories}


def floor_sensitivity(variances, floors, positivity: str = "denominator", reg: float = REG, start=(0.0, 0.0)) -> dict:
    """Distance of each method's predicted fixed point to the optimum, per clamp level and ``v``.

    The SGD potential holds ``log(floor) P(D + delta < floor)``, which goes to minus infinity as the
    floor goes to 0 wherever the Gaussian reaches zero: there the direct loss is not defined, and what SGD
    converges to is set by how that is patched. DeCL's mean estimate hardly depends on the floor.
    """
    opt = exact_optimum(reg)
    out = {}
    for floor in floors:
        for v in variances:
            for method in ("sgd", "decl_mean"):
                pred = predicted_fixed_point(method, v, reg, positivity, floor, start=start)
                out.setdefault(f"{floor:g}", {}).setdefault(f"{v:g}", {})[method] = {
                    "point": pred["point"].tolist(),
                    "distance": float(np.linalg.norm(pred["point"] - opt)),
                    "grid_local_minima": pred["grid_local_minima"],
                    "global": pred["global"],
                }
    return out


def paper_point_check(reg: float = REG) -> dict:
    """Objective gradients at the paper's reported DeCL solution, under both readings of Appendix F."""
    s = np.array(PAPER_DECL_POINT)
    f = special.expit(s[0] - s[1])
    # "maximise F - reg |s|^2" read literally: the gradient of -F + reg |s|^2.
    linear_grad = np.array([-f * (1 - f), f * (1 - f)]) + 2 * reg * s
    return {
        "point": list(PAPER_DECL_POINT),
        "grad_log_form": objective_grad(s, reg).tolist(),
        "grad_linear_form": linear_grad.tolist(),
    }


# -- reporting --------------------------------------------------------------------------------


def table(runs: dict, variances, steps: int) -> str:
    """Markdown table of the per-(v, method) summaries of one ``runs[v][method]`` block."""

    def cells(v, method):
        r = runs[f"{v:g}"][method]
        sm = r["summary"]
        return [
            f"{v:g}",
            LABELS[method],
            f"{sm['dist_final'][0]:.4f} +- {sm['dist_final'][1]:.4f}",
            f"{sm['dist_polyak'][0]:.4f} +- {sm['dist_polyak'][1]:.4f}",
            f"{r['predicted_fixed_point_distance']:.4f}",
            f"{sm['excess_objective_polyak'][0]:.2e} +- {sm['excess_objective_polyak'][1]:.1e}",
            f"{sum(r['clamped_steps'])} of {steps * len(r['clamped_steps'])}",
        ]

    return markdown_table(
        [
            "v",
            "method",
            "dist. final",
            "dist. Polyak avg",
            "predicted fixed-point dist.",
            "excess J at Polyak avg",
            "clamped steps",
        ],
        (cells(v, method) for v in variances for method in METHODS),
    )


def floor_table(sens: dict, variances) -> str:
    """Markdown table of :func:`floor_sensitivity`."""

    def cells(per_v):
        return [
            " / ".join(
                f"{r['distance']:.4f}" + ("" if r["global"] else "*")
                for r in (per_v[f"{v:g}"]["sgd"], per_v[f"{v:g}"]["decl_mean"])
            )
            for v in variances
        ]

    return markdown_table(
        ["clamp level", *(f"v = {v:g}: SGD / DeCL" for v in variances)],
        ([floor, *cells(per_v)] for floor, per_v in sens.items()),
    )


def verdict(runs: dict, variances) -> list[str]:
    """Plain statements, per noise level, of whether each DeCL variant beats SGD."""
    out = []
    for v in variances:
        r = runs[f"{v:g}"]
        sgd = r["sgd"]["summary"]
        for method in ("decl_sampled", "decl_mean"):
            sm = r[method]["summary"]
            parts = []
            for key, name in (("dist_polyak", "Polyak average"), ("dist_final", "final iterate")):
                better = sm[key][0] < sgd[key][0]
                parts.append(f"{name} {'closer' if better else 'NOT closer'} ({sm[key][0]:.4f} vs {sgd[key][0]:.4f})")
            out.append(f"- v = {v:g}, {LABELS[method]} vs SGD: " + "; ".join(parts) + ".")
    return out


def plot(trajectories: dict, results: dict, positivities, variances, report: Report) -> None:
    """One panel per (handling, v): every run's trajectory per method, the Polyak averages, the optimum."""
    opt = np.array(results["optimum"])
    # Sampled u spreads widest: draw it first so that the other two stay visible on top.
    order = ("decl_sampled", "sgd", "decl_mean")
    alpha = {"decl_sampled": 0.08, "sgd": 0.15, "decl_mean": 0.3}
    fig, axes = pyplot().subplots(
        len(positivities), len(variances), figsize=(5.0 * len(variances), 4.6 * len(positivities)), squeeze=False
    )
    for row, pos in zip(axes, positivities):
        for ax, v in zip(row, variances):
            for method in order:
                traj = trajectories[(pos, v, method)]
                for k in range(traj.shape[1]):
                    ax.plot(traj[:, k, 0], traj[:, k, 1], color=COLORS[method], lw=0.4, alpha=alpha[method])
                ax.plot([], [], color=COLORS[method], label=LABELS[method])
            for method in order:  # on top of every trajectory
                r = results["runs"][pos][f"{v:g}"][method]
                avg = np.array(r["polyak"])
                ax.scatter(avg[:, 0], avg[:, 1], color=COLORS[method], edgecolor="k", lw=0.5, s=22, zorder=4)
                ax.scatter(*r["predicted_fixed_point"], marker="X", color=COLORS[method], edgecolor="k", s=80, zorder=5)
            ax.scatter(*opt, marker="*", s=260, color="gold", edgecolor="k", zorder=3.5, label="noise-free optimum")
            ax.set_title(f"v = {v:g}, clamp: {pos}")
            ax.set_xlabel("s1 (log positive score)")
            ax.set_ylabel("s2 (log negatives' mass)")
            ax.grid(alpha=0.3)
            # A frame around the start, the optimum and the predicted points; rare SGD kicks leave it.
            ax.set_xlim(-1.2, 2.2)
            ax.set_ylim(-2.4, 0.5)
    axes[0][0].legend(loc="upper left", fontsize=7)
    report.figure(
        fig, "Trajectories (lines), Polyak average of each seed (dots), zero of the expected update (X)", dpi=100
    )


def machine() -> str:
    """The machine line of every results file (:func:`clip_dcl.experiment.machine_info`) and the
    numpy that ran the toy."""
    return f"{machine_info()}, numpy {np.__version__}"


def reading(runs: dict, variances, label: str) -> list[str]:
    """Where each DeCL variant's Polyak average beats SGD's, and where it does not."""
    out = []
    for m in ("decl_sampled", "decl_mean"):
        won = [
            v
            for v in variances
            if runs[f"{v:g}"][m]["summary"]["dist_polyak"][0] < runs[f"{v:g}"]["sgd"]["summary"]["dist_polyak"][0]
        ]
        lost = [v for v in variances if v not in won]
        out.append(
            f"- {label}, {LABELS[m]}: Polyak average closer to the optimum than SGD's at v = "
            f"{', '.join(f'{v:g}' for v in won) or 'none'}"
            + (f"; NOT closer at v = {', '.join(f'{v:g}' for v in lost)}." if lost else ".")
        )
    return out


def write_report(report: Report, results: dict, args, check: dict, payload: dict) -> None:
    """``gradient_bias_toy.md`` and ``.json`` (``payload``, the raw numbers)."""
    opt = results["optimum"]
    head = args.positivity[0]
    start = "(0, 0), as in Appendix F" if args.init_std == 0 else f"N(0, {args.init_std:g}^2) per seed"
    lines = [
        "# Gradient-bias toy (DeCL paper, Sec. 2.1 and Appendix F)",
        "",
        *report.about(),
        "- Raw numbers per seed (final points, Polyak averages, distances, clamp counts, final rates, largest "
        "step): `gradient_bias_toy.json`; trajectories: `gradient_bias_toy.png`.",
        "",
        "## Setting",
        "",
        "- Objective (minimised): `J(s) = -log(e^s1 / (e^s1 + e^s2)) + 0.1 (s1^2 + s2^2)`. Appendix F states "
        "`F = e^s1 / (e^s1 + e^s2)`, to be maximised, with a regulariser `0.1 (s1^2 + s2^2)`, without saying how "
        "the two combine; we use the contrastive-loss (log) form of the paper's Eq. (1), the one DeCL's Gamma "
        "augmentation decomposes, so all methods target the same optimum.",
        f"- Noise-free optimum (Brent root of `sigmoid(-2a) = 0.2 a`, then `s = (a, -a)`): "
        f"s = ({opt[0]:.12f}, {opt[1]:.12f}), J = {results['optimum_objective']:.12f}, "
        f"F = {special.expit(opt[0] - opt[1]):.6f}.",
        "- Noise (the paper's): the denominator is seen as `D~ = e^s1 + e^s2 + delta_t`, `delta_t ~ N(0, v)`, "
        "a fresh draw each step, the same draws for every method and handling (per seed). The paper does not say "
        "how it keeps `D~` positive; two handlings:",
        f"  - `denominator`: `D~ = max(e^s1 + e^s2 + delta, {args.floor:g})`; the paper's noise is untouched "
        "except where the estimate would be (nearly) non-positive.",
        f"  - `neg_mass`: the noisy negatives' mass `e^s2 + delta` is clamped at {args.floor:g} (a sum of "
        "similarity scores is never negative), i.e. `D~ = max(e^s1 + e^s2 + delta, e^s1 + floor)`. With "
        "`sqrt(v)` comparable to `e^s2` (0.44 at the optimum) this clamp is on often and raises the mean of "
        "`D~`: the noisy estimate itself is then biased, for every method.",
        "  - Where a clamp is on, the clamped value is used and the noise term gets no gradient. The last "
        "column of the tables counts those steps.",
        f"- All methods: start {start}; plain gradient descent, constant step size {args.lr:g} (the paper's 0.2), "
        f"{args.steps} steps, {args.seeds} seeds; Polyak average over steps {args.steps // 2 + 1}..{args.steps}.",
        "- SGD (the paper's direct optimisation): gradient of `log D~_t(s) - s1 + 0.1 |s|^2`.",
        "- DeCL (Algorithm 1 line 8, `lambda_t = 1`): gradient of `u_t D~_t(s) - s1 + 0.1 |s|^2`, `u_t` fixed, with "
        "`u_t = eps_t / r_t`, `eps_t ~ Exp(1)` (sampled: `u ~ Gamma(1, rate r_t)`) or `u_t = 1 / r_t` (mean); "
        f"rate `r_t = (1 - {args.rate_momentum:g}) r_(t-1) + {args.rate_momentum:g} D~_t`, `r_1 = D~_1` (moving "
        "average of the noisy denominator estimates, updated before it is read).",
        "- Predicted fixed point: where the expected update vanishes (integrals over delta): the minimum of its "
        "potential that a descent from the start reaches on a grid, polished by a root solve. SGD: potential "
        "`E[log D~(s)] - s1 + 0.1 |s|^2`. "
        "DeCL (mean of u, rate at its fixed point `E[D~]`, the moving average's spread ignored): "
        "`log E[D~(s)] - s1 + 0.1 |s|^2`, so DeCL's only bias is what the clamp does to the mean of `D~`. "
        "When the noise is large next to `D~`, SGD's steps are too erratic to settle there within the run.",
        "",
    ]
    for pos in args.positivity:
        runs = results["runs"][pos]
        lines += [
            f"## Results, clamp `{pos}`{' (headline)' if pos == head else ''}",
            "",
            "Euclidean distance in the (s1, s2) plane to the noise-free optimum, mean +- std over seeds; "
            "excess J = J(Polyak avg) - J(optimum).",
            "",
            table(runs, args.variances, args.steps),
            "",
        ]
        lines += verdict(runs, args.variances) + [""]
    step = results.get("step_size_check")
    if step:
        lines += [
            f"## Step-size check, clamp `{head}`",
            "",
            f"The same runs with step size {step['lr']:g} for {step['steps']} steps (every method alike; "
            f"Polyak average over the second half). Sampled u multiplies the gradient by `Exp(1)` noise, "
            "so at a constant step it spreads more than the other two.",
            "",
            table(step["runs"], args.variances, step["steps"]),
            "",
        ]
        lines += verdict(step["runs"], args.variances) + [""]
    sens = results.get("floor_sensitivity")
    if sens:
        lines += [
            f"## Clamp level, clamp `{head}`",
            "",
            "Distance of the predicted fixed point to the optimum for several clamp levels (SGD / DeCL). "
            "SGD's potential holds `log(floor) P(D + delta < floor)`: where the Gaussian reaches zero the "
            "direct loss is undefined, and where SGD goes is decided by how that is patched; DeCL's is not. "
            "`*`: the potential has a lower minimum elsewhere on the grid, which the descent from the start "
            "does not reach.",
            "",
            floor_table(sens, args.variances),
            "",
        ]
    lines += ["## Reading", ""]
    for pos in args.positivity:
        lines += reading(results["runs"][pos], args.variances, f"clamp `{pos}`, step {args.lr:g}")
    if step:
        lines += reading(step["runs"], args.variances, f"clamp `{head}`, step {step['lr']:g}")
    lines += [
        "",
        "## The paper's reported numbers",
        "",
        f"Sec. 2.1 reports DeCL converging to s = {tuple(check['point'])} (v = 0.1, step 0.2). That is not a "
        "stationary point of the stated problem under either reading: the gradient there is "
        f"({check['grad_log_form'][0]:.3f}, {check['grad_log_form'][1]:.3f}) for the log form and "
        f"({check['grad_linear_form'][0]:.3f}, {check['grad_linear_form'][1]:.3f}) for `-F + 0.1 |s|^2`. "
        "With a positive regulariser every stationary point has s2 = -s1, because F depends on s1 - s2 only. The "
        "paper's numbers therefore cannot be reproduced as stated; the runs above are compared with the exact "
        "optimum instead.",
    ]
    report.write(lines, payload)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except the ``None`` of flags whose default depends on ``--quick``."""

    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=_HelpFormatter)
    p.add_argument(
        "--variances",
        type=float,
        nargs="+",
        default=[0.1, 0.3, 0.5],
        help="variances v of the Gaussian noise added to the denominator",
    )
    p.add_argument("--seeds", type=int, default=None, help="independent runs per (method, v) [10; 3 with --quick]")
    p.add_argument("--steps", type=int, default=None, help="gradient steps per run [4000; 400 with --quick]")
    p.add_argument("--lr", type=float, default=0.2, help="step size, the same for every method")
    p.add_argument(
        "--rate-momentum",
        type=float,
        default=0.05,
        help="weight gamma of the newest noisy denominator in DeCL's rate moving average",
    )
    p.add_argument(
        "--init-std", type=float, default=0.0, help="std of the random start (0: start at (0, 0), as in Appendix F)"
    )
    p.add_argument(
        "--positivity",
        nargs="+",
        choices=POSITIVITY,
        default=list(POSITIVITY),
        help="how the noisy denominator is kept positive; the first is the headline",
    )
    p.add_argument(
        "--floor",
        type=float,
        default=1e-2,
        help="clamp level: of the whole noisy denominator (denominator) or of the noisy negatives' mass (neg_mass)",
    )
    p.add_argument(
        "--step-check",
        type=int,
        default=None,
        help="also run the headline clamp with step lr/K for K times the steps (0 or 1: skip) [4; 0 with --quick]",
    )
    p.add_argument(
        "--floor-check",
        type=float,
        nargs="*",
        default=None,
        help="clamp levels at which to recompute the predicted fixed points (none given: skip) "
        "[0.001 0.01 0.1; none with --quick]",
    )
    p.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="where the .md/.json/.png go (default benchmarks/results; a temporary folder with --quick)",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: other defaults, in brackets above")
    args = p.parse_args(argv)
    defaults = {"seeds": (10, 3), "steps": (4000, 400), "step_check": (4, 0), "floor_check": ([1e-3, 1e-2, 1e-1], [])}
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    bad = [f"--variances {v!r} (must be >= 0)" for v in args.variances if not v >= 0]
    if args.seeds < 1:
        bad.append(f"--seeds {args.seeds} (must be >= 1)")
    if args.steps < 2:
        bad.append(f"--steps {args.steps} (must be >= 2)")
    if not args.lr > 0:
        bad.append(f"--lr {args.lr!r} (must be > 0)")
    if not 0 < args.rate_momentum <= 1:
        bad.append(f"--rate-momentum {args.rate_momentum!r} (must be in (0, 1])")
    if not args.init_std >= 0:
        bad.append(f"--init-std {args.init_std!r} (must be >= 0)")
    if not args.floor > 0:
        bad.append(f"--floor {args.floor!r} (must be > 0)")
    if args.step_check < 0:
        bad.append(f"--step-check {args.step_check} (must be >= 0)")
    bad += [f"--floor-check {f!r} (must be > 0)" for f in args.floor_check if not f > 0]
    if bad:
        p.error("bad value: " + "; ".join(bad))
    args.positivity = list(dict.fromkeys(args.positivity))
    if args.out_dir is None:
        args.out_dir = (
            Path(tempfile.mkdtemp(prefix="gradient_bias_toy_")) if args.quick else REPO / "benchmarks" / "results"
        )
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    report = Report(args.out_dir, "gradient_bias_toy", command_line("gradient_bias_toy.py", argv), machine=machine())
    head = args.positivity[0]
    print(
        f"{report.command}\noptimum {exact_optimum().tolist()}; {len(args.positivity)} clamps x {len(args.variances)} "
        f"noise levels x {len(METHODS)} methods x {args.seeds} seeds x {args.steps} steps"
    )
    bench = benchmark(
        args.variances, args.seeds, args.steps, args.lr, args.rate_momentum, args.init_std, args.positivity, args.floor
    )
    results = bench["results"]
    if args.step_check > 1:
        k = args.step_check
        print(f"step-size check: step {args.lr / k:g}, {args.steps * k} steps, clamp {head}")
        small = benchmark(
            args.variances,
            args.seeds,
            args.steps * k,
            args.lr / k,
            args.rate_momentum,
            args.init_std,
            [head],
            args.floor,
        )
        results["step_size_check"] = {
            "lr": args.lr / k,
            "steps": args.steps * k,
            "runs": small["results"]["runs"][head],
        }
    if args.floor_check:
        print(f"predicted fixed points at clamp levels {args.floor_check}")
        results["floor_sensitivity"] = floor_sensitivity(
            args.variances, args.floor_check, head, start=np.mean(results["starts"], axis=0)
        )
    check = paper_point_check()
    config = {k: v for k, v in vars(args).items() if k != "out_dir"}
    write_report(
        report, results, args, check, {"config": {**config, "reg": REG}, "paper_point_check": check, **results}
    )
    plot(bench["trajectories"], results, args.positivity, args.variances, report)
    for pos in args.positivity:
        print(f"\nclamp: {pos}, step {args.lr:g}\n{table(results['runs'][pos], args.variances, args.steps)}\n")
        print("\n".join(verdict(results["runs"][pos], args.variances)))
    if "step_size_check" in results:
        st = results["step_size_check"]
        print(f"\nclamp: {head}, step {st['lr']:g}\n{table(st['runs'], args.variances, st['steps'])}\n")
        print("\n".join(verdict(st["runs"], args.variances)))
    if "floor_sensitivity" in results:
        print(
            f"\npredicted fixed-point distance (SGD / DeCL) by clamp level, clamp {head}\n"
            f"{floor_table(results['floor_sensitivity'], args.variances)}"
        )
    print(f"\nwrote {args.out_dir}/gradient_bias_toy.{{md,json,png}}")
    return 0


# ------------------------------------------------------------------------------------------
# The README's numbers (benchmarks/quotes.py)
# ------------------------------------------------------------------------------------------
def readme_block(doc: dict) -> str:
    """The README's table: distance of the averaged iterate from the optimum, per positivity rule and noise level."""
    opt, seeds = doc["optimum"], doc["config"]["seeds"]
    rules = {"denominator": "the noisy denominator floored", "neg_mass": "the noisy negative mass kept >= 0"}
    lines = [
        f"Exact optimum s = ({opt[0]:.4f}, {opt[1]:.4f}). Distance of the averaged (Polyak) iterate from it, "
        f"mean ± std over {seeds} seeds (lower is better):",
        "",
        "| noise kept valid by | v | SGD | DeCL, mean u | DeCL, sampled u |",
        "|---|---:|---:|---:|---:|",
    ]
    closer = {}
    for rule, label in rules.items():
        for v, r in doc["runs"][rule].items():
            cells = [
                f"{r[m]['summary']['dist_polyak'][0]:.3f} ± {r[m]['summary']['dist_polyak'][1]:.3f}"
                for m in ("sgd", "decl_mean", "decl_sampled")
            ]
            lines.append(f"| {label} | {v} | " + " | ".join(cells) + " |")
            for m in ("decl_mean", "decl_sampled"):
                if r[m]["summary"]["dist_polyak"][0] < r["sgd"]["summary"]["dist_polyak"][0]:
                    closer.setdefault((rule, m), []).append(v)
    lines.append("")
    for rule, label in rules.items():
        parts = [
            f"{LABELS[m]} at " + (f"v = {', '.join(closer[(rule, m)])}" if (rule, m) in closer else "no v")
            for m in ("decl_mean", "decl_sampled")
        ]
        lines.append(f"- With {label}, closer to the optimum than SGD on average: " + "; ".join(parts) + ".")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
