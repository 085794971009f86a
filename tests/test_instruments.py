"""check_metric and the diagnostics of lenses/instruments.py.

check_metric must pass on every metric the library ships and fail on each broken law; the
diagnostics are compared with dense formulas written here."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from categories import Covector, OpenBall, OpenBox, Positive, Product, R, Vector
from categories.linear import unwrap
from lenses import (KFAC, BoxBarrier, Constant, Context, Diagonal, Euclidean, Fisher, GaussNewton,
                    InteriorMetric, LogBarrier, Metric, Poincare, SlotMetric, check_metric,
                    condition_number, dense, natural_angle,
                    softmax_cross_entropy, tanh)
from lenses.inner_products.metrics import translate

jax.config.update("jax_enable_x64", True)

NET = dense(2, 3) >> tanh >> dense(3, 2)
RNG = np.random.default_rng(0)
X = jnp.asarray(RNG.normal(size=(8, 2)))
CTX = Context(NET, softmax_cross_entropy(classes=2), X, jnp.asarray(RNG.integers(0, 2, 8)))
MIXED = Product(Positive(2), OpenBall(np.zeros(2), 1.0), OpenBox(-1.0, 2.0, (2,)), R(2))
G3 = np.array([[2.0, 0.3, 0.0], [0.3, 1.0, 0.2], [0.0, 0.2, 0.5]])

SHIPPED = {
    "euclidean": (Euclidean(), R(3), None),
    "diagonal": (Diagonal(jnp.asarray([1.0, 2.0, 0.5])), R(3), None),
    "constant": (Constant(G3), R(3), None),
    "log_barrier": (LogBarrier(), Positive(3), None),
    "poincare": (Poincare(), OpenBall(np.array([0.5, 0.0, -0.5]), 2.0), None),
    "box_barrier": (BoxBarrier(), OpenBox(-1.0, 2.0, (3,)), None),
    "interior": (InteriorMetric(), MIXED, None),
    "slot_metric": (SlotMetric(), Product(R(2), R(1)), None),
    "gauss_newton": (GaussNewton(1e-2), None, CTX),
    "fisher": (Fisher(1e-2), None, CTX),
    "kfac": (KFAC(1e-2), None, CTX),
}


@pytest.mark.parametrize("name", SHIPPED)
def test_check_metric_passes_on_every_shipped_metric(name):
    metric, space, ctx = SHIPPED[name]
    check_metric(metric, space, ctx, examples=5 if ctx is None else 2)


# -- broken metrics: each breaks one law ----------------------------------------------------------

class FlatTwice(Metric):
    """flat doubles, sharp is the identity: not inverse."""

    def sharp(self, p, cov, ctx=None):
        return Vector(unwrap(cov), cov.space)

    def flat(self, p, vec, ctx=None):
        return Covector(2.0 * unwrap(vec), vec.space)


M = jnp.asarray([[1.0, 0.5, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])  # not symmetric


class Skew(Metric):
    """flat = M u with M not symmetric, sharp = M⁻¹ c: inverse, but not an inner product."""

    def sharp(self, p, cov, ctx=None):
        return Vector(jnp.linalg.solve(M, unwrap(cov)), cov.space)

    def flat(self, p, vec, ctx=None):
        return Covector(M @ unwrap(vec), vec.space)


class Shifted(Euclidean):
    """R_p(v) = p + v + 0.1: R_p(0) ≠ p."""

    def retract(self, p, v, space=None):
        return translate(p, unwrap(v) + 0.1)


class Straight(LogBarrier):
    """The log-barrier metric with the straight move p + v, which leaves Positive."""

    def retract(self, p, v, space=None):
        return translate(p, unwrap(v))


@pytest.mark.parametrize("metric, space, law", [
    (FlatTwice(), R(3), "flat\\(sharp\\(c\\)\\) = c|sharp\\(flat\\(u\\)\\) = u"),
    (Skew(), R(3), "symmetry"),
    (Shifted(), R(3), "R_p\\(0\\) = p"),
    (Straight(), Positive(3), "inside the space"),
], ids=["not_inverse", "not_symmetric", "retract_moves_zero", "retract_leaves"])
def test_check_metric_fails_on_each_broken_law(metric, space, law):
    with pytest.raises(AssertionError, match=law):
        check_metric(metric, space, examples=10)


def test_check_metric_fails_on_an_indefinite_metric():
    bad = np.diag([1.0, -0.5, 2.0])

    class Indefinite(Constant):
        def __init__(self):
            self.G, self.space, self.slot = jnp.asarray(bad), None, None

        def sharp(self, p, cov, ctx=None):
            return Vector(unwrap(cov) / jnp.diag(self.G), cov.space)

    with pytest.raises(AssertionError, match="positive definite"):
        check_metric(Indefinite(), R(3), examples=10)


# -- diagnostics ----------------------------------------------------------------------------------

def test_natural_angle_and_condition_number_by_hand():
    w = np.array([1.0, 4.0, 0.25])
    c = np.array([1.0, -2.0, 0.5])
    p = jnp.asarray([0.3, 0.2, -1.0])
    nat = c / w
    angle = np.arccos(nat @ c / (np.linalg.norm(nat) * np.linalg.norm(c)))
    assert natural_angle(Diagonal(jnp.asarray(w)), p, Covector(jnp.asarray(c), R(3))) == \
        pytest.approx(angle, rel=1e-12)
    euclid = natural_angle(Euclidean(), p, Covector(jnp.asarray(c), R(3)))
    assert euclid == pytest.approx(0, abs=1e-7)
    assert condition_number(Diagonal(jnp.asarray(w)), p, space=R(3)) == pytest.approx(16.0)
    assert condition_number(Constant(G3), p, space=R(3)) == pytest.approx(np.linalg.cond(G3))
    q = jnp.asarray([0.5, 2.0, 1.0])  # LogBarrier: g = diag(1/q²), κ = (max q / min q)²
    assert condition_number(LogBarrier(), q, space=Positive(3)) == pytest.approx(16.0)
    x = jnp.asarray(np.array([0.4, -0.2, 0.1], np.float32))  # float32: the same, to rounding
    ball = OpenBall(np.zeros(3, np.float32), 1.0)
    assert condition_number(Poincare(), x, space=ball) == pytest.approx(1.0, rel=1e-5)

