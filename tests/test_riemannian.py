"""riemannian_adam against independent implementations of Bécigneul and Ganea's algorithm.

The oracles: on the Poincaré ball, the paper's RADAM (Algorithm 1, with Adam's bias
corrections) written here in numpy from the textbook formulas (Riemannian gradient ∇f / λ²,
second moment the squared Riemannian norm λ² ‖g‖² of the whole ball, the exponential map
x ⊕ tanh(λ‖v‖/2) v/‖v‖ by Möbius addition, the first moment transported by (λ_x / λ_y), the
isometric transport the module states in place of parallel transport); on Euclidean
coordinates, `optax.adam`; on Positive, Adam in the coordinates s = log p (the log-barrier
metric is Euclidean there, so RADAM is Adam on s and τ = m y/x is parallel transport).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from categories import Covector, OpenBall, Positive, R
from categories.errors import HyperparameterError, KindError
from lenses import (GaussNewton, InteriorMetric, LogBarrier, Poincare, riemannian_adam,
                    scale_by_riemannian_adam)

jax.config.update("jax_enable_x64", True)

DTYPES = [pytest.param(jnp.float64, id="float64"), pytest.param(jnp.float32, id="float32")]
TOL = {jnp.float64: 1e-10, jnp.float32: 2e-5}


def mobius_add(x, y):
    xy, xx, yy = x @ y, x @ x, y @ y
    return ((1 + 2 * xy + yy) * x + (1 - xx) * y) / (1 + 2 * xy + xx * yy)


def np_radam(x, grads, lr, b1=0.9, b2=0.999, eps=1e-8):
    """The paper's RADAM on the unit ball, for the Euclidean gradients grads(x) ↦ ∇f."""
    x = np.asarray(x, float)
    tau, v, path = np.zeros_like(x), 0.0, []
    for t in range(1, 21):
        lam = 2 / (1 - x @ x)
        g = grads(x) / lam ** 2  # the Riemannian gradient
        m = b1 * tau + (1 - b1) * g
        v = b2 * v + (1 - b2) * lam ** 2 * (g @ g)  # one number for the ball
        step = -lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
        n = np.sqrt(step @ step)
        y = mobius_add(x, np.tanh(lam * n / 2) * step / n)  # exp_x(step)
        tau = m * lam / (2 / (1 - y @ y))  # transported: (λ_x / λ_y) m
        x = y
        path.append(x.copy())
    return np.array(path)


def target(a):
    """∇ of f(x) = ‖x − a‖² (Euclidean), a smooth loss with its minimum inside the ball."""
    return lambda x: 2 * (x - a)


@pytest.mark.parametrize("dtype", DTYPES)
def test_on_the_poincare_ball_it_is_the_papers_radam(dtype):
    B = OpenBall([0.0, 0.0, 0.0], 1.0)
    a = np.array([-0.3, 0.5, 0.2])
    opt = riemannian_adam(0.05, metric=Poincare(B))
    x = jnp.asarray([0.6, -0.2, 0.1], dtype)
    s, path = opt.init(x), []
    for _ in range(20):
        s, x = opt.step(s, x, Covector(jnp.asarray(target(a)(np.asarray(x, float)), dtype), B))
        path.append(np.asarray(x, float))
    want = np_radam([0.6, -0.2, 0.1], target(a), 0.05)
    assert np.max(np.abs(np.array(path) - want)) < TOL[dtype]
    assert np.linalg.norm(want[-1] - a) < np.linalg.norm(want[0] - a)  # it descends


@pytest.mark.parametrize("dtype", DTYPES)
def test_on_euclidean_slots_it_is_optax_adam_and_the_ball_slot_is_radam(dtype):
    P = OpenBall([0.0, 0.0], 1.0) * R(3)
    opt = riemannian_adam(0.05, metric=InteriorMetric(P))
    a, c = np.array([0.4, -0.1]), np.array([1.0, -2.0, 0.5])
    x = (jnp.asarray([-0.5, 0.3], dtype), jnp.asarray([0.0, 0.0, 0.0], dtype))
    tx = optax.adam(0.05)
    w, ws = np.zeros(3), tx.init(np.zeros(3))
    s, ball = opt.init(x), []
    for _ in range(20):
        cov = (jnp.asarray(target(a)(np.asarray(x[0], float)), dtype),
               jnp.asarray(target(c)(np.asarray(x[1], float)), dtype))
        s, x = opt.step(s, x, Covector(cov, P))
        u, ws = tx.update(target(c)(w), ws)
        w = optax.apply_updates(w, u)
        ball.append(np.asarray(x[0], float))
        assert np.max(np.abs(np.asarray(x[1], float) - np.asarray(w))) < TOL[dtype]
    assert np.max(np.abs(np.array(ball) - np_radam([-0.5, 0.3], target(a), 0.05))) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_on_positive_it_is_adam_in_log_coordinates(dtype):
    P = Positive(2)
    opt = riemannian_adam(0.1, metric=LogBarrier(P))
    tx = optax.adam(0.1)
    grad = lambda p: np.log(p) - np.array([1.0, -2.0])  # noqa: E731 - ∇_s of ½‖s − k‖², s = log p
    p = jnp.asarray([2.0, 0.5], dtype)
    sl = np.log(np.array([2.0, 0.5]))
    s, ss = opt.init(p), tx.init(sl)
    for _ in range(20):
        pe = np.asarray(p, float)
        # f(p) = ½‖log p − k‖²: ∇_p f = (log p − k) / p, ∇_s f = log p − k with s = log p
        s, p = opt.step(s, p, Covector(jnp.asarray(grad(pe) / pe, dtype), P))
        u, ss = tx.update(grad(np.exp(sl)), ss)
        sl = optax.apply_updates(sl, u)
        assert np.max(np.abs(np.log(np.asarray(p, float)) - sl)) < 10 * TOL[dtype]


def test_it_refuses_what_it_cannot_do():
    with pytest.raises(KindError):
        riemannian_adam(0.1, metric=GaussNewton())  # not diagonal
    with pytest.raises(HyperparameterError):
        riemannian_adam(-0.1)
    with pytest.raises(HyperparameterError):
        riemannian_adam(optax.linear_schedule(0.1, 0.0, 10))
    opt = riemannian_adam(0.1, metric=Poincare())  # no parameter object to read the slots from
    x = jnp.array([0.1, 0.0])
    with pytest.raises(KindError):
        opt.step(opt.init(x), x, Covector(jnp.array([1.0, 0.0]), OpenBall([0.0, 0.0], 1.0)))


def test_rates_share_one_compiled_step():
    B = OpenBall([0.0, 0.0], 1.0)
    structure = jax.tree_util.tree_structure  # what a compiled step is keyed by (numbers aside)
    assert structure(riemannian_adam(0.1, metric=Poincare(B))) == structure(riemannian_adam(0.3, metric=Poincare(B)))
    assert riemannian_adam(0.1, metric=Poincare(B)) != riemannian_adam(0.3, metric=Poincare(B))
    assert structure(scale_by_riemannian_adam(0.1)) != structure(scale_by_riemannian_adam(0.1, metric=Poincare(B)))
