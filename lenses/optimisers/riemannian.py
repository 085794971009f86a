"""Riemannian Adam (Bécigneul and Ganea, "Riemannian adaptive optimization methods", ICLR 2019).

Adam on a product of manifolds M = M_1 × … × M_n (Algorithm 1 of the paper, RADAM, with
Adam's bias corrections): with g = (p')♯ the Riemannian gradient,

    m_i ← β₁ τ_i + (1 − β₁) g_i,      v_i ← β₂ v_i + (1 − β₂) ‖g_i‖²_{x_i},
    x_i ← R_{x_i}(−η m̂_i / (√v̂_i + ε)),  τ_i ← T_{x_i → x_i new}(m_i),

m̂, v̂ bias-corrected as in Adam. The second moment is one number per factor manifold M_i
(the squared Riemannian norm, not a per-coordinate square); the first moment lives in the
tangent space of the current point, so after each move it is transported to the new one.

The factors, for the library's diagonal inner products: each `OpenBall` slot of a metric that
knows it (`Poincare`, `InteriorMetric`) is one factor (the disc or ball of the paper's
experiments); every other coordinate is a one-dimensional factor of its own, so on Euclidean
slots (and for `Euclidean` or `Diagonal`) this is Adam. R is the metric's `retract` (the
exponential map on the ball and on Positive). The transport is the isometric one along the
diagonal, τ = m · √(w(x) / w(y)) with w the metric's diagonal: on a one-dimensional factor
this is parallel transport exactly; on the ball it is (λ_x / λ_y) m, which is parallel
transport (λ_x / λ_y) gyr[y, −x] m without the gyration, a rotation — an isometric vector
transport, as the paper's section 2 allows in place of parallel transport.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from categories import Vector
from categories.errors import HyperparameterError, KindError

from ..inner_products.geometry import BallGeometry, SlotMetric
from ..inner_products.metrics import Diagonal, Euclidean
from .lens import Optimiser
from .parts import (Part, adam_direction, adam_moments, adam_start, check_adam,
                    check_learning_rate, sharp)
from .precision import like, widen

tree_map = jax.tree_util.tree_map


class RiemannianAdamState(NamedTuple):
    """count t, the first moment τ transported to the current point, the second moment v (one
    number per factor manifold, repeated over its coordinates)."""

    count: Any
    tau: Any
    nu: Any


def _check_metric(metric):
    if metric is None or isinstance(metric, (Euclidean, Diagonal, SlotMetric)):
        return metric
    raise KindError(f"riemannian_adam needs a diagonal inner product (Euclidean, Diagonal, or a "
                    f"geometry metric: LogBarrier, Poincare, BoxBarrier, InteriorMetric), got "
                    f"{metric!r}: its norms and transport are read off the diagonal")


def _space(metric):
    if metric.space is None:
        raise KindError(f"riemannian_adam: give {metric!r} its parameter object "
                        f"({type(metric).__name__}(space)): the part sees raw vectors, and reads "
                        "which slots are balls from the metric's space")
    return metric.space


def squared_norms(metric, p, g):
    """‖g_i‖²_{x_i} for each factor manifold, repeated over its coordinates: λ(x)² ‖g‖² on a
    ball slot, w(x) g² per coordinate elsewhere (g² for the Euclidean inner product)."""
    if metric is None or isinstance(metric, Euclidean):
        return tree_map(lambda a: a * a, g)
    if isinstance(metric, Diagonal):
        return tree_map(lambda a, b: a * b, g, metric.flat(p, Vector(g)).value)

    def leaf(rule, S, x, d):
        if rule is BallGeometry:  # one factor: the Riemannian norm of the whole slot
            lam = rule.conformal(S, x)
            return jnp.full(x.shape, lam * lam * jnp.sum(d * d), x.dtype)
        return rule.weight(S, x) * d * d

    return metric.map_slots(_space(metric), leaf, lambda x, d: tree_map(lambda a: a * a, d), p, g)


def transport(metric, x, y, m):
    """m, a vector at x, carried to y: m · √(w(x) / w(y)) per coordinate (identity where the
    metric is constant)."""
    if not isinstance(metric, SlotMetric):
        return m
    S = _space(metric)
    wx, wy = metric.weights(x, S), metric.weights(y, S)
    return tree_map(lambda a, u, w: a * jnp.sqrt(u / w), m, wx, wy)


class ScaleByRiemannianAdam(Part):
    """The Riemannian Adam rule (the part `scale_by_riemannian_adam` makes): its numbers lr,
    b1, b2, eps are leaves, and so are its metric's."""

    lr: Any
    metric: Any
    b1: Any
    b2: Any
    eps: Any
    shown_as: ClassVar[str] = "scale_by_riemannian_adam"

    def init(self, params):
        return RiemannianAdamState(*adam_start(params))

    def update(self, updates, state, params=None, **extra):
        metric = self.metric
        count = state.count + 1
        g = widen(updates)  # the moments in float32 at least, as Adam's
        m, nu = adam_moments(self.b1, self.b2, g, squared_norms(metric, params, g),
                             state.tau, state.nu)
        u = like(adam_direction(self.b1, self.b2, self.eps, count, m, nu, scale=-self.lr), updates)
        if isinstance(metric, SlotMetric):
            y = metric.retract(params, Vector(u), _space(metric))  # where the optimiser moves
            m = transport(metric, params, y, m)
        return u, RiemannianAdamState(count, m, nu)

    def check_numbers(self):
        if callable(self.lr):
            raise HyperparameterError(f"riemannian_adam takes a number as its learning rate, "
                                      f"not a schedule, got {self.lr!r}")
        check_learning_rate(self.lr)
        check_adam(self.b1, self.b2, self.eps)
        if self.metric is not None:  # a diagonal's weights are this part's leaves too
            self.metric.check_numbers()
        return self


def scale_by_riemannian_adam(lr: float, metric=None, b1: float = 0.9, b2: float = 0.999,
                             eps: float = 1e-8) -> Part:
    """The Riemannian Adam rule on vectors g = (p')♯: v ↦ −η m̂ / (√v̂ + ε), v̂ per factor
    manifold, the first moment transported to the new point R_p(that move).

    The learning rate is part of this part (the new point, where the moment goes, depends on
    it); the part comes after `sharp(metric)` with the same metric.

    Examples:
        >>> part = scale_by_riemannian_adam(0.1)
        >>> g = jnp.array([0.5, -2.0])
        >>> u, s = part.update(g, part.init(g), g)
        >>> print(np.round(u, 4))
        [-0.1  0.1]
    """
    return ScaleByRiemannianAdam(lr, _check_metric(metric), b1, b2, eps).check_numbers()


def riemannian_adam(lr: float, metric=None, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                    *, on_domain_error: str = "raise", max_halvings: int = 30) -> Optimiser:
    """Riemannian Adam (Bécigneul and Ganea, 2019): chain(sharp(metric),
    scale_by_riemannian_adam(lr, metric, b1, b2, eps)); the point moves by metric.retract.

    A geometry metric needs its parameter object (`Poincare(OpenBall(...))`); on Euclidean
    slots, and with metric None, this is Adam.

    Examples:
        >>> B = OpenBall([0.0, 0.0], 1.0)
        >>> opt = riemannian_adam(0.1, metric=Poincare(B))
        >>> x = jnp.array([0.5, 0.0])
        >>> s, x = opt.step(opt.init(x), x, Covector(jnp.array([1.0, 0.0]), B))
        >>> print(np.round(x, 4), bool(jnp.sum(x * x) < 1))
        [0.4616 0.    ] True
    """
    return Optimiser([sharp(metric), scale_by_riemannian_adam(lr, metric, b1, b2, eps)],
                     on_domain_error=on_domain_error, max_halvings=max_halvings,
                     name="riemannian_adam")


__all__ = ["riemannian_adam", "scale_by_riemannian_adam", "ScaleByRiemannianAdam",
           "RiemannianAdamState"]
