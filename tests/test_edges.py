"""Edges: the wrong results once found (the Poincaré move near the wall, a
loss family wrapping a built-in one) and every edge (constructors, losses, pullbacks,
metrics, optimisers, checkpoint policies, smooth maps), each a catalogued error naming the
argument or an accepted input with its result checked against an oracle written here."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from categories import Covector, OpenBall, Positive, R, Smooth, Vector
from lenses import (CovectorError, DimensionError, DomainError, HyperparameterError,
                    KindError, LogBarrier, LossFamily, MetricError, Poincare,
                    SlotError, SpaceMismatch, adam, batched, checkpoint, dense, dL, dropout,
                    embedding, from_optax, half_squared_error, layer_norm,
                    multi_head_attention, rnn_cell, softmax_cross_entropy, train_step)
from lenses.losses import batch_loss
from lenses.inner_products.metrics import Constant, Diagonal, Euclidean

EPS = np.finfo(np.float64).eps


# -- the Poincaré move near the wall -------------------------------------------------------

def _artanh_of_gap(gap):
    """artanh(1 − gap) in float64 from the gap itself (no rounding of 1 − gap)."""
    return 0.5 * (np.log1p(-gap / 2) + np.log(2.0) - np.log(gap))


RETRACT = jax.jit(lambda x, v, S: Poincare().retract(x, v, S), static_argnums=2)


@pytest.mark.parametrize("gap", [1e-4, 1e-8, 1e-9, 1e-10, 1e-12])
def test_poincare_move_near_the_wall_is_the_closed_form_geodesic(gap):
    # On the line through the centre the ball is (−1, 1) with the metric 2/(1 − y²), whose
    # geodesic coordinate is 2 artanh(y): exp_y(w) = tanh(artanh(y) + w / (1 − y²)), here
    # in closed form from the exact gap (y = 1 − gap is stored; 1 − y is then exact).
    S = OpenBall([0.0], 1.0)
    y = 1.0 - gap
    g = 1.0 - y
    s0 = _artanh_of_gap(g)
    rmax = 1 - 8 * EPS
    for s1 in np.linspace(-15.0, 15.0, 13):
        w = (s1 - s0) * g * (2 - g)
        got = float(RETRACT(jnp.array([y]), jnp.array([w]), S)[0])
        want = np.tanh(s1)
        assert abs(got) < 1, (s1, got)
        if abs(want) < rmax:
            # compared in the geodesic coordinate: an absolute error of a few eps / gap
            tol = 1e-9 + 50 * EPS / (1 - abs(want))
            assert abs(np.arctanh(got) - s1) < tol, (gap, s1, got, want)
        else:  # beyond the last representable points: at the clamp, on the right side
            assert np.sign(got) == np.sign(want) and abs(got) >= rmax * (1 - 4 * EPS)


def test_poincare_move_from_the_wall_inwards_goes_the_whole_way():
    S = OpenBall([0.0], 1.0)
    # the cases: 21 units instead of ≥ 55, and NaN
    for gap in (1e-8, 1e-9):
        got = float(Poincare().retract(jnp.array([1 - gap]), jnp.array([-1e-6]), S)[0])
        assert np.isfinite(got) and -1 < got < -(1 - 16 * EPS)  # across, to the other wall
    # in general directions: the hyperbolic distance covered is λ‖v‖ (long double oracle)
    rng = np.random.default_rng(3)
    S3 = OpenBall([0.0, 0.0, 0.0], 1.0)
    for gap in (1e-6, 1e-8, 1e-10):
        for _ in range(4):
            u = rng.normal(size=3)
            x = (1 - gap) * u / np.linalg.norm(u)
            lam = 2 / ((1 - np.linalg.norm(x)) * (1 + np.linalg.norm(x)))
            v = -x / np.linalg.norm(x) + 0.5 * rng.normal(size=3)  # mostly inwards
            v *= rng.uniform(2, 12) / (lam * np.linalg.norm(v))  # g-length 2 to 12
            y = np.asarray(RETRACT(jnp.asarray(x), jnp.asarray(v), S3))
            assert np.all(np.isfinite(y)) and np.linalg.norm(y) < 1
            xl, yl = x.astype(np.longdouble), y.astype(np.longdouble)
            gx = (1 - np.sqrt(np.sum(xl * xl))) * (1 + np.sqrt(np.sum(xl * xl)))
            gy = (1 - np.sqrt(np.sum(yl * yl))) * (1 + np.sqrt(np.sum(yl * yl)))
            dist = np.arccosh(1 + 2 * np.sum((xl - yl) ** 2) / (gx * gy))
            # the rounding of x and of y to float64 moves them by ~eps, i.e. by ~eps / gap in
            # hyperbolic units: that much is the representation's, not the move's
            tol = 1e-9 + 20 * EPS * (1 / float(gx) + 1 / float(gy))
            assert abs(float(dist) - lam * np.linalg.norm(v)) < tol, (gap, dist, tol)


def test_adam_at_the_wall_of_the_poincare_ball_takes_its_step():
    S = OpenBall([0.0, 0.0], 1.0)
    opt = adam(1.0, metric=Poincare())
    p = jnp.array([1 - 1e-10, 0.0])
    for c, side in ((1e6, -1), (-1e6, 1)):
        new = np.asarray(opt.step(opt.init(p), p, Covector(jnp.array([c, 0.0]), S))[1])
        assert np.all(np.isfinite(new)) and S.contains(new)
        assert np.sign(new[0] - p[0]) == side or new[0] == p[0] == 1 - 1e-10


# -- a loss family that wraps a built-in one -------------------------------------------------

def half_ce(y):
    return 0.5 * softmax_cross_entropy(y)


def test_a_function_scaling_a_builtin_family_is_a_loss_family():
    Y = np.eye(3)[[0, 1, 2, 1]]
    C = np.random.default_rng(0).normal(size=(4, 3))
    want = 0.5 * np.mean(-np.sum(Y * (C - np.log(np.sum(np.exp(C), axis=1, keepdims=True))), 1))
    np.testing.assert_allclose(batch_loss(half_ce, Y, "mean").fn(C), want, rtol=1e-12)
    # what train_step asks of the family before it compiles: accepted
    assert train_step(dense(3, 3), half_ce, optax.sgd(0.1)).loss_family.check_targets(
        Y, R(3)) is not None


# -- losses and dL check what they are given -----------------------------------------------------

def test_a_loss_and_dL_check_the_output_they_are_given():
    L = half_squared_error(jnp.ones(3))
    with pytest.raises(DomainError, match=r"R\^3.*shape \(3,\).*shape \(1,\)"):
        L(jnp.ones(1))
    with pytest.raises(DomainError, match="dL"):
        dL(L, jnp.ones(2))
    with pytest.raises(KindError, match="dL needs a loss"):
        dL(lambda c: c, jnp.ones(2))
    np.testing.assert_allclose(dL(L, jnp.array([2.0, 1.0, 0.0])).value, [1.0, 0.0, -1.0])


def test_a_loss_family_whose_value_is_a_vector_is_refused():
    class Squares(LossFamily):
        def value(self, c, y):
            return (c - y) ** 2

    with pytest.raises(KindError, match=r"Squares.*value\(c, y\).*shape \(3,\).*the value a scalar"):
        batch_loss(Squares(), np.ones((2, 3)))


def test_a_smooth_map_that_lands_outside_its_codomain_is_refused():
    with pytest.raises(SpaceMismatch, match=r"R\^2 → R\^3 does not land.*\(3,\).*\(2,\)"):
        Smooth(R(2), R(3), lambda x: x, name="f")(jnp.ones(2))
    np.testing.assert_allclose(Smooth(R(2), R(3), lambda x: jnp.append(x, 1.0))(jnp.ones(2)),
                               [1.0, 1.0, 1.0])


# -- pullbacks check their covectors ------------------------------------------------------------

def test_pullbacks_refuse_non_finite_covectors_and_covectors_on_another_space():
    m = dense(2, 3)
    p = m.init(jax.random.PRNGKey(0))
    _, pull = m.vjp(jnp.ones(2), p)
    for bad in (jnp.array([1.0, np.nan, 0.0]), jnp.array([np.inf, 0.0, 0.0])):
        with pytest.raises(CovectorError, match=r"dense\(2→3\).*index"):
            pull(bad)
    with pytest.raises(CovectorError, match=r"not a covector on R\^3"):
        pull(Covector(jnp.ones((3, 1)), R(3, 1)))  # a covector on another space
    with pytest.raises(CovectorError, match=r"Covector on R\^\{3×1\}.*shape \(3, 1\)"):
        Covector(jnp.ones(3), R(3, 1))  # checked when built
    _, pull_b = batched(m).vjp(jnp.ones((2, 2)), p)
    with pytest.raises(CovectorError):
        pull_b(jnp.full((2, 3), np.nan))
    # labelled with the codomain, or with the batch's R^{n×3}: accepted, same covector
    W = np.asarray(p[0])
    for c in (Covector(jnp.ones((2, 3)), R(2, 3)), jnp.ones((2, 3))):
        np.testing.assert_allclose(pull_b(c)[0].value, np.ones((2, 3)) @ W)


# -- inner products ----------------------------------------------------------------------------

@pytest.mark.parametrize("make, match", [
    (lambda: Constant(np.array([[2.0, 1.0], [0.0, 2.0]])), r"symmetric.*G\[0, 1\] = 1.0"),
    (lambda: Constant(np.array([[1.0, np.nan], [np.nan, 1.0]])), "finite real"),
    (lambda: Diagonal(jnp.array([1.0, np.nan])), r"positive finite.*nan at index \(1,\)"),
    (lambda: Diagonal(jnp.array([1.0, np.inf])), r"positive finite.*inf"),
    (lambda: Diagonal(jnp.array([1.0, 1j])), "real numbers, got dtype complex"),
    (lambda: Diagonal(jnp.array([1.0, -1.0])), r"-1.0 at index \(1,\)"),
])
def test_metrics_that_are_not_inner_products_are_refused(make, match):
    with pytest.raises(MetricError, match=match):
        make()


def test_flat_refuses_a_covector_and_constant_refuses_a_slot_out_of_range():
    for metric in (Euclidean(), Diagonal(2.0), Constant(np.eye(2)), LogBarrier(Positive(2))):
        with pytest.raises(CovectorError, match="flat takes a vector, got a Covector"):
            metric.flat(jnp.ones(2), Covector(jnp.ones(2), R(2)))
    np.testing.assert_allclose(Diagonal(2.0).flat(jnp.ones(2), Vector(jnp.ones(2))).value, [2, 2])
    with pytest.raises(SlotError, match=r"slot 5 is not a slot of R\^2 × R\^2"):
        Constant(np.eye(2), space=R(2) * R(2), slot=5)
    with pytest.raises(SlotError, match=r"slot 5"):  # no space given: found at the point
        Constant(np.eye(2), slot=5).sharp((jnp.ones(2),), Covector((jnp.ones(2),)))
    G = np.array([[2.0, 0.5], [0.5, 1.0]])
    v = Constant(G, slot=1).sharp((jnp.ones(3), jnp.ones(2)), Covector((jnp.ones(3), jnp.ones(2))))
    np.testing.assert_allclose(v.value[1], np.linalg.solve(G, np.ones(2)), rtol=1e-12)
    np.testing.assert_allclose(v.value[0], np.ones(3))


def test_geometry_metrics_check_their_space_and_points():
    ball = OpenBall([0.0, 0.0], 1.0)
    with pytest.raises(KindError, match="space must be a Space"):
        Poincare(space=3)
    with pytest.raises(DomainError, match=r"expected an array of shape \(2,\), got .* \(3,\)"):
        Poincare().retract(jnp.full(3, 0.1), jnp.ones(3), ball)
    with pytest.raises(DomainError, match="lies outside OpenBall"):
        Poincare().retract(jnp.array([1.0, 0.0]), jnp.ones(2), ball)
    with pytest.raises(DomainError, match="nan"):
        Poincare().retract(jnp.array([np.nan, 0.0]), jnp.ones(2), ball)
    with pytest.raises(DomainError, match=r"lies outside Positive"):
        LogBarrier().retract(jnp.array([0.0, 1.0]), jnp.ones(2), Positive(2))
    with pytest.raises(CovectorError, match=r"shape \(2,\), got an array of shape \(3,\)"):
        Poincare(ball).sharp(jnp.full(2, 0.1), Covector(jnp.ones(3), ball))  # checked when built
    # accepted: the multiplicative move p · exp(v / p) of the log barrier
    np.testing.assert_allclose(LogBarrier().retract(jnp.array([2.0, 1.0]), jnp.array([2.0, -1.0]),
                                                    Positive(2)), [2 * np.e, np.exp(-1.0)])


# -- optimisers and recompute -----------------------------------------------------------------

def test_from_optax_refuses_ascent_and_momentum_above_one():
    with pytest.raises(HyperparameterError, match="climbs the slope.*negative learning rate"):
        from_optax(optax.sgd(-0.1))
    with pytest.raises(HyperparameterError, match="momentum above 1"):
        from_optax(optax.sgd(0.1, momentum=2.0))
    # a warm-up schedule with momentum is a descent method: accepted, optax's own step
    tx = optax.sgd(optax.linear_schedule(1e-3, 1e-1, 5), momentum=0.9)
    opt = from_optax(tx)
    p, g = jnp.array([1.0, -2.0]), jnp.array([0.5, 0.25])
    s, st = opt.init(p), tx.init(p)
    for _ in range(3):
        s, p_new = opt.step(s, p, Covector(g, R(2)))
        u, st = tx.update(g, st, p)
        np.testing.assert_allclose(p_new, p + u, rtol=1e-12)
        p = p_new


def test_checkpoint_refuses_a_policy_that_is_not_one():
    with pytest.raises(KindError, match=r"checkpoint: policy.*got 'x'"):
        checkpoint(dense(2, 2), policy="x")


# -- constructors -----------------------------------------------------------------------------

@pytest.mark.parametrize("make, error, match", [
    (lambda: multi_head_attention(6, 0), DimensionError, "multi_head_attention: heads"),
    (lambda: multi_head_attention(6, 4), DimensionError, "4 heads do not divide the width 6"),
    (lambda: layer_norm(-1), DimensionError, "layer_norm: d must be an integer ≥ 1, got -1"),
    (lambda: layer_norm(3, eps=-1.0), HyperparameterError, "layer_norm: eps .* got -1.0"),
    (lambda: embedding(-1, 3), DimensionError, "embedding: vocab must be an integer ≥ 1"),
    (lambda: dropout("0.5"), HyperparameterError, "dropout needs a rate.*'0.5'"),
    (lambda: rnn_cell(0, 3), DimensionError, "rnn_cell: n_in must be an integer ≥ 1, got 0"),
    (lambda: R(10**30), DimensionError, r"≤ 2147483647"),
    (lambda: R(2**30, 2**30), DimensionError, "coordinates, more than"),
    (lambda: dense(10**20, 3), DimensionError, r"dense: n_in must be an integer ≤"),
])
def test_constructors_refuse_sizes_and_hyperparameters_out_of_range(make, error, match):
    with pytest.raises(error, match=match):
        make()
