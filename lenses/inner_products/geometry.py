"""Inner products that know their open set, and the moves that keep a point inside it.

A parameter object P is an open subset of R^n. The plain move p + v leaves P for a long
enough v whatever the inner product, so a metric alone cannot keep the point inside; the
*update* must follow the geometry. Each metric here therefore has, besides `sharp`, `flat`
and `inner`, a `retract(p, v, space)`: the point reached from p along v (the exponential
map of the metric, or a retraction R_p with R_p(0) = p and dR_p(0) = id), which lies in P for
every v. The optimisers step by `metric.retract(p, step)` (lenses/optimisers/lens.py), so
`gd(lr, metric=LogBarrier())` is the multiplicative update p · exp(−η p p') on `Positive`.

Per slot. A model's point is a tuple of slots, mostly Euclidean. These metrics act on the
slots whose space is of their kind and are Euclidean on every other slot (R^n, R^0, and
spaces they do not know). The space is read from the covector's or vector's `.space`
(`train_step` passes `Covector(p', model.param)`; `propose` passes the parameter object to
`retract`); where a raw pytree arrives (inside `optax.chain`), give it as `space=`.

- `LogBarrier`: on `Positive`, the Hessian of the log barrier −Σ log p_i, g_p = diag(1/p²);
  it is the Euclidean metric in the coordinates log p, whose geodesics p · exp(t v / p) are
  the exponential map.
- `Poincare`: on `OpenBall(c, r)`, the hyperbolic metric g_x = λ(x)² I, λ(x) = 2r / (r² −
  ‖x − c‖²); the exponential map by Möbius addition.
- `BoxBarrier`: on `OpenBox(a, b)`, the Hessian of the log barrier −Σ [log(x−a) + log(b−x)],
  g_x = diag(1/(x−a)² + 1/(b−x)²); the move is the retraction through the logit coordinates
  s = log((x−a)/(b−x)): R_x(v) = a + (b−a) σ(s + s'(x) v), first-order exact, not a geodesic.
- `InteriorMetric`: all three at once, each slot by its own space.

In exact arithmetic each move lies strictly inside its set. In floating point a long enough
move reaches the last representable points (tanh and σ round to 1, exp under- and
overflows): the ball's and the box's moves clamp a few units in the last place inside the
wall, the positive one to exp(± log(max)/4) (≈ 1e±77 in float64, 1e±9.6 in float32, where
p², 1/p² and the optimisers' sums of them stay finite), so that the result is always a finite
point that the space's own `indicator` accepts (the optimiser still checks it).

The other slots are Euclidean; a data-dependent metric (Gauss–Newton, KFAC) is not combined
with these per slot.
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from categories import Covector, OpenBall, OpenBox, Positive, Product, Space, Vector
from categories.linear import unwrap
from categories.points import is_concrete

from ..values import assign, static
from .metrics import Metric, translate, vector_value
from categories.errors import DomainError, KindError

__all__ = ["SlotMetric", "LogBarrier", "Poincare", "BoxBarrier", "InteriorMetric",
           "PositiveGeometry", "BallGeometry", "BoxGeometry"]


def _eps(x):
    return jnp.finfo(jnp.asarray(x).dtype).eps


# -- the three geometries, on one slot -------------------------------------------------------

class PositiveGeometry:
    """g_p = diag(1/p²) on Positive: the Hessian of −Σ log p_i."""

    @staticmethod
    def weight(S, x):
        return (1.0 / x) ** 2

    @staticmethod
    def inverse(S, x):
        return x * x

    @staticmethod
    def retract(S, x, v):
        # exp_p(v) = p · exp(v / p), computed as exp(log p + v/p) and clamped to
        # exp(± log(max) / 4) (≈ 1e±77 in float64): there p², 1/p² and the optimisers' sums of
        # them stay finite.
        bound = np.log(jnp.finfo(x.dtype).max) / 4.0
        s = jnp.clip(jnp.log(x) + v / x, -bound, bound)
        return jnp.where(v == 0, x, jnp.exp(s))  # a zero move leaves p_i bit for bit


class BallGeometry:
    """g_x = λ(x)² I on OpenBall(c, r), λ(x) = 2r / (r² − ‖x − c‖²): the Poincaré metric."""

    @staticmethod
    def _cr(S, x):
        return jnp.asarray(S.center_array(), x.dtype), jnp.asarray(S.radius, x.dtype)

    @classmethod
    def conformal(cls, S, x):
        c, r = cls._cr(S, x)
        d = x - c
        return 2.0 * r / (r * r - jnp.sum(d * d))

    @classmethod
    def weight(cls, S, x):
        lam = cls.conformal(S, x)
        return jnp.full(x.shape, lam * lam, x.dtype)

    @classmethod
    def inverse(cls, S, x):
        lam = cls.conformal(S, x)
        return jnp.full(x.shape, (1.0 / lam) ** 2, x.dtype)

    @classmethod
    def retract(cls, S, x, v):
        c, r = cls._cr(S, x)
        y, w = (x - c) / r, v / r  # the unit ball, where λ_y = 2 / (1 − ‖y‖²)
        yy = jnp.sum(y * y)
        ny = jnp.sqrt(yy)
        gap_y = (1.0 - ny) * (1.0 + ny)
        lam = 2.0 / gap_y
        n = jnp.sqrt(jnp.sum(w * w))
        safe = jnp.where(n > 0, n, 1.0)
        # exp_y(w) = y ⊕ z, z = tanh(t) u, u = w/‖w‖, t = λ_y ‖w‖ / 2 (Möbius addition ⊕):
        #   y ⊕ z = (‖y+z‖² y + (1−‖y‖²)(y+z)) / (‖y+z‖² + (1−‖y‖²)(1−‖z‖²)),
        # the textbook (1 + 2⟨y,z⟩ + ‖z‖²) y + (1 − ‖y‖²) z over 1 + 2⟨y,z⟩ + ‖y‖²‖z‖² written
        # with sums of non-negative terms: near the wall, once tanh rounds to 1, the textbook
        # form cancels to nothing (a point 21 units short, or 0/0). The gaps to the wall are
        # computed from their own formulas, never as 1 − (a rounded number near 1):
        # 1 − ‖z‖² = sech²(t) from exp(−2t), 1 − ‖z‖ = sech²(t)/(1 + tanh t), and
        # y + z = (‖y‖ − ‖z‖) u_y + ‖z‖ (u_y + u), ‖y‖ − ‖z‖ as a difference of gaps.
        t = lam * n / 2.0
        nz = jnp.tanh(t)
        q = jnp.exp(-2.0 * t)
        gap_z = 4.0 * q / ((1.0 + q) * (1.0 + q))  # 1 − ‖z‖² = sech²(t)
        u = w / safe
        uy = y / jnp.where(ny > 0, ny, 1.0)
        y_plus_z = jnp.where(ny > 0, ((gap_z / (1.0 + nz)) - (1.0 - ny)) * uy + nz * (uy + u),
                             nz * u)
        ss = jnp.sum(y_plus_z * y_plus_z)
        den = ss + gap_y * gap_z
        e = (ss * y + gap_y * y_plus_z) / jnp.where(den > 0, den, 1.0)
        # Clamp to a margin that survives the rounding of c + r e (an error ~ eps ‖c‖).
        big = jnp.max(jnp.abs(c)) if c.size else jnp.asarray(0.0, x.dtype)
        rmax = 1.0 - 8.0 * _eps(x) * (1.0 + np.sqrt(max(x.size, 1)) * big / r)
        ne = jnp.sqrt(jnp.sum(e * e))
        e = jnp.where(ne > rmax, e * (rmax / jnp.where(ne > 0, ne, 1.0)), e)
        return jnp.where(jnp.all(v == 0), x, c + r * e)  # a zero move leaves x bit for bit


class BoxGeometry:
    """g_x = diag(1/(x−a)² + 1/(b−x)²) on OpenBox(a, b): the Hessian of its log barrier."""

    @staticmethod
    def _ab(S, x):
        lo, hi = S.bounds()
        return jnp.asarray(lo, x.dtype), jnp.asarray(hi, x.dtype)

    @classmethod
    def weight(cls, S, x):
        a, b = cls._ab(S, x)
        return 1.0 / ((x - a) ** 2) + 1.0 / ((b - x) ** 2)

    @classmethod
    def inverse(cls, S, x):
        a, b = cls._ab(S, x)
        l, r = x - a, b - x
        return (l * r) ** 2 / (l * l + r * r)  # 1 / weight, without 1/gap² overflowing

    @classmethod
    def retract(cls, S, x, v):
        # R_x(v) = φ⁻¹(φ(x) + φ'(x) v) with φ(x) = log((x−a)/(b−x)), φ'(x) = (b−a)/((x−a)(b−x)):
        # R_x(0) = x and dR_x(0) = 1, and φ⁻¹ maps all of R into (a, b).
        a, b = cls._ab(S, x)
        w = b - a
        s = jnp.log(x - a) - jnp.log(b - x) + w / ((x - a) * (b - x)) * v
        # Distances to the two walls, each from its own side (no cancellation near a wall),
        # kept above a margin that survives the rounding of a + gap.
        delta = 8.0 * _eps(x) * (1.0 + jnp.maximum(jnp.abs(a), jnp.abs(b)) / w)
        left = jnp.maximum(w * jax.nn.sigmoid(s), delta * w)
        right = jnp.maximum(w * jax.nn.sigmoid(-s), delta * w)
        moved = jnp.where(s < 0, a + left, b - right)
        return jnp.where(v == 0, x, moved)  # a zero move leaves x_i bit for bit


# -- the per-slot metric ---------------------------------------------------------------------

def _contains_kind(space, kinds) -> bool:
    if isinstance(space, Product):
        return any(_contains_kind(f, kinds) for f in space.factors)
    return isinstance(space, kinds)


class SlotMetric(Metric):
    """g_p = ⊕_slots g_slot: each slot's own geometry where its space is of a kind in `rules`,
    the Euclidean inner product elsewhere (base of the metrics of this module).

    `space`: the parameter object, used when the (co)vector carries none.

    Examples:
        >>> isinstance(InteriorMetric(), SlotMetric), isinstance(LogBarrier(), SlotMetric)
        (True, True)
    """

    rules: ClassVar[dict] = {}
    space: Space | None = static()

    def __init__(self, space: Space | None = None):
        if space is not None and not isinstance(space, Space):
            raise KindError(f"{type(self).__name__}: space must be a Space (the parameter "
                            f"object, e.g. Positive(3)), got {space!r}")
        assign(self, space=space)

    def map_slots(self, S, leaf, euclid, *ts):
        """`leaf(rule, S, *slot values)` on each slot whose space has a rule, `euclid(*values)`
        on every other slot (the point's tuple zipped with the product's factors)."""
        if isinstance(S, Product):
            x = ts[0]
            if isinstance(x, tuple) and len(x) == len(S.factors):
                return tuple(self.map_slots(f, leaf, euclid, *(t[i] for t in ts))
                             for i, f in enumerate(S.factors))
            if _contains_kind(S, tuple(self.rules)):
                raise DomainError(f"{self!r}: the point should be a tuple of {len(S.factors)} "
                                f"for {S!r}")
            return euclid(*ts)
        rule = next((r for k, r in self.rules.items() if isinstance(S, k)), None)
        if rule is None or ts[0] is None:
            return euclid(*ts)
        for t in ts:  # the point and the (co)vector: arrays of the slot's shape
            # None has no shape (JAX deprecates asking), so it is named, not measured
            shape = None if t is None else tuple(jnp.shape(t))
            if shape != tuple(S.shape):
                got = "None" if shape is None else f"shape {shape}"
                raise DomainError(f"{self!r}: a point or (co)vector of {S!r} has shape "
                                  f"{tuple(S.shape)}, got {got}")
        if is_concrete(ts[0]):  # a concrete point must lie in the slot's open set (under a
            S.check(ts[0], f"the point given to {self!r}")  # trace there is nothing to look at)
        return leaf(rule, S, *ts)

    def _space(self, *objs):
        for o in objs:
            s = getattr(o, "space", None)
            if s is not None:
                return s
        if self.space is not None:
            return self.space
        raise KindError(f"{self!r} reads each slot's space from the covector's `.space` (as "
                        "train_step passes it) or from space=: neither was given")

    def weights(self, p, space: Space | None = None):
        """The diagonal of g_p, shaped like p (1 on Euclidean slots, None at R^0)."""
        S = space if space is not None else self._space()
        return self.map_slots(S, lambda rule, s, x: rule.weight(s, x),
                         lambda x: jax.tree_util.tree_map(jnp.ones_like, x), p)

    def sharp(self, p, cov, ctx=None):
        S = self._space(cov)
        out = self.map_slots(S, lambda rule, s, x, c: c * rule.inverse(s, x), lambda x, c: c,
                        p, unwrap(cov))
        return Vector(out, getattr(cov, "space", None))

    def flat(self, p, vec, ctx=None):
        S = self._space(vec)
        out = self.map_slots(S, lambda rule, s, x, v: v * rule.weight(s, x), lambda x, v: v,
                        p, vector_value(vec, f"{self!r}.flat"))
        return Covector(out, getattr(vec, "space", None))

    def retract(self, p, v, space: Space | None = None):
        """The point reached from p along v: each slot's exponential map or retraction (p + v on
        Euclidean slots); inside the slot's open set for every v."""
        S = space if space is not None else self._space(v)
        if not isinstance(S, Space):
            raise KindError(f"{self!r}.retract: space must be a Space, got {S!r}")
        if is_concrete(p):
            S.check(p, f"the point given to {self!r}.retract")  # a move starts inside
        v = vector_value(v, f"{self!r}.retract")  # a move along a vector, not a covector
        moved = self.map_slots(S, lambda rule, s, x, d: rule.retract(s, x, d),
                          lambda x, d: translate(x, d), p, v)
        # In p's dtype, as the Euclidean move keeps it.
        return jax.tree_util.tree_map(lambda a, b: jnp.asarray(b).astype(jnp.asarray(a).dtype),
                                      p, moved)

    def __repr__(self):
        return f"{type(self).__name__}()"


class LogBarrier(SlotMetric):
    """g_p(u, v) = Σ u_i v_i / p_i² on Positive slots (the Hessian of the log barrier),
    Euclidean elsewhere; exp_p(v) = p · exp(v / p).

    Examples:
        >>> p = jnp.array([1.0, 2.0])
        >>> v = LogBarrier(Positive(2)).sharp(p, Covector(jnp.array([1.0, 1.0]), Positive(2)))
        >>> unwrap(v).tolist()
        [1.0, 4.0]
    """

    rules = {Positive: PositiveGeometry}


class Poincare(SlotMetric):
    """g_x(u, v) = λ(x)² ⟨u, v⟩, λ(x) = 2r/(r² − ‖x − c‖²), on OpenBall(c, r) slots (the
    hyperbolic metric), Euclidean elsewhere; the exponential map by Möbius addition.

    Examples:
        >>> x = jnp.array([0.5, 0.0])
        >>> v = Poincare(OpenBall([0.0, 0.0], 1.0)).sharp(x, Covector(jnp.array([1.0, 0.0]), OpenBall([0.0, 0.0], 1.0)))
        >>> print(np.round(unwrap(v), 4))
        [0.1406 0.    ]
    """

    rules = {OpenBall: BallGeometry}


class BoxBarrier(SlotMetric):
    """g_x(u, v) = Σ u_i v_i (1/(x_i−a_i)² + 1/(b_i−x_i)²) on OpenBox(a, b) slots (the Hessian
    of the log barrier), Euclidean elsewhere; the retraction through logit coordinates.

    Examples:
        >>> B = OpenBox(0.0, 1.0, (1,))
        >>> v = BoxBarrier(B).sharp(jnp.array([0.5]), Covector(jnp.array([8.0]), B))
        >>> print(np.round(unwrap(v), 4))
        [1.]
    """

    rules = {OpenBox: BoxGeometry}


class InteriorMetric(SlotMetric):
    """Each slot's own geometry: `LogBarrier` on Positive, `Poincare` on OpenBall,
    `BoxBarrier` on OpenBox, Euclidean elsewhere.

    Examples:
        >>> P = Positive(1) * R(1)
        >>> v = InteriorMetric(P).sharp((jnp.array([2.0]), jnp.array([2.0])), Covector((jnp.array([1.0]), jnp.array([1.0])), P))
        >>> [a.tolist() for a in unwrap(v)]
        [[4.0], [1.0]]
    """

    rules = {Positive: PositiveGeometry, OpenBall: BallGeometry, OpenBox: BoxGeometry}
