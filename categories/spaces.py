"""Objects of the ambient category: open subsets of Euclidean spaces, and their products.

A `Space` is an open subset U ⊆ R^shape. Points are arrays of that shape (a product's points
are tuples of its factors' points; the terminal object R^0 has the single point `None`).
The tangent (and cotangent) space at every point of an open U ⊆ R^n is canonically R^n, so
`space.tangent` is the Euclidean space of the same shape.

Spaces are static structure: frozen, compared and hashed by value, never traced by JAX.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


class DomainError(ValueError):
    """A point lies outside the open set (or has the wrong shape) where it was required."""


def _is_concrete(x) -> bool:
    """True when every leaf of x has a value now (not a JAX tracer inside jit/vmap/grad)."""
    return not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(x))


def _shape_str(shape) -> str:
    if len(shape) == 0:
        return "R"
    if len(shape) == 1:
        return f"R^{shape[0]}"
    return "R^{" + "×".join(str(s) for s in shape) + "}"


def _describe(x) -> str:
    if x is None:
        return "None"
    if isinstance(x, tuple):
        return "a tuple of " + str(len(x))
    shape = getattr(x, "shape", None)
    if shape is None:
        return f"{type(x).__name__} {x!r}"
    return f"an array of shape {tuple(shape)}"


class Space:
    """An open subset of R^shape (abstract base)."""

    shape: tuple = ()

    # -- structure ---------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Dimension of the space (number of real coordinates)."""
        return math.prod(self.shape)

    @property
    def is_terminal(self) -> bool:
        return False

    @property
    def tangent(self) -> "Space":
        """The tangent space at any point: R^shape (canonically also the cotangent space)."""
        return R(*self.shape)

    def __mul__(self, other: "Space") -> "Product":
        if not isinstance(other, Space):
            return NotImplemented
        return Product(self, other)

    # -- points ------------------------------------------------------------------------------
    def zeros(self, dtype=None):
        """The zero of the tangent space (an array of this shape)."""
        return jnp.zeros(self.shape, dtype=dtype)

    def interior_margin(self, x):
        """Per coordinate, how far inside the open set x lies (> 0 inside); traceable."""
        return jnp.full(jnp.shape(x), jnp.inf)

    def indicator(self, x):
        """A traceable boolean: x lies in the open set (shape assumed right)."""
        return jnp.all(self.interior_margin(x) > 0)

    def _check_shape(self, x, what: str) -> None:
        shape = getattr(x, "shape", None)
        if shape is None and isinstance(x, (int, float, np.floating, np.integer)):
            shape = ()
        if shape is None or tuple(shape) != tuple(self.shape):
            raise DomainError(
                f"{what} is not a point of {self!r}: expected an array of shape "
                f"{tuple(self.shape)}, got {_describe(x)}"
            )

    def contains(self, x) -> bool:
        """Is x (a concrete point) in this open set?"""
        try:
            self.check(x)
        except DomainError:
            return False
        return True

    def check(self, x, what: str = "point"):
        """Return x if it is a point of this space, else raise `DomainError` saying why.

        The shape is always checked (it is static); membership of the open set is checked
        only for concrete values, since inside `jit` there are no values to look at.
        """
        self._check_shape(x, what)
        if _is_concrete(x):
            margin = np.asarray(self.interior_margin(x))
            if not np.all(margin > 0):
                flat = margin.reshape(-1)
                i = int(np.argmin(flat))
                idx = np.unravel_index(i, self.shape) if self.shape else ()
                value = np.asarray(x).reshape(-1)[i] if self.shape else np.asarray(x)
                shown = np.asarray(x)
                point = f": {np.array2string(shown, precision=6)}" if shown.size <= 12 else ""
                raise DomainError(
                    f"{what} lies outside {self!r}: coordinate {tuple(int(k) for k in idx)} "
                    f"= {float(value)!r} is outside by {0.0 - float(flat[i])!r} "
                    f"(point of shape {tuple(self.shape)}{point})"
                )
        return x

    def sample_interior(self, key):
        """A point of the open set drawn from a distribution supported well inside it."""
        return jax.random.normal(key, self.shape)


def _tup(a) -> tuple:
    """An array as a nested tuple of floats: hashable, compared by value."""
    return np.asarray(a, dtype=float).tolist() if np.ndim(a) else float(a)


def _freeze(a):
    a = np.asarray(a, dtype=float)
    return tuple(a.reshape(-1).tolist()), tuple(a.shape)


@dataclass(frozen=True, repr=False)
class R(Space):
    """Euclidean space R^shape. `R()` is the real line, `R(0)` the terminal object {None}."""

    shape: tuple

    def __init__(self, *shape: int):
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise ValueError(f"negative dimension in R{shape}")
        if 0 in shape and shape != (0,):
            raise ValueError(f"R{shape} has no points but R(0) is the terminal object: use R(0)")
        object.__setattr__(self, "shape", shape)

    @property
    def is_terminal(self) -> bool:
        return self.shape == (0,)

    @property
    def tangent(self) -> "R":
        return self

    def zeros(self, dtype=None):
        return None if self.is_terminal else jnp.zeros(self.shape, dtype=dtype)

    def indicator(self, x):
        return jnp.asarray(True)

    def check(self, x, what: str = "point"):
        if self.is_terminal:
            if x is not None:
                raise DomainError(
                    f"{what} is not a point of {self!r}: its only point is None, got {_describe(x)}"
                )
            return x
        self._check_shape(x, what)
        return x

    def sample_interior(self, key):
        return None if self.is_terminal else jax.random.normal(key, self.shape)

    def __repr__(self) -> str:
        return "R^0" if self.is_terminal else _shape_str(self.shape)


@dataclass(frozen=True, repr=False)
class OpenBox(Space):
    """The open box ∏ (low_i, high_i) ⊆ R^shape (bounds broadcast to `shape`)."""

    low: Any
    high: Any
    shape: tuple

    def __init__(self, low, high, shape=None):
        low, high = np.asarray(low, float), np.asarray(high, float)
        shape = tuple(np.broadcast_shapes(low.shape, high.shape) if shape is None else shape)
        low, high = np.broadcast_to(low, shape), np.broadcast_to(high, shape)
        if not np.all(low < high):
            raise ValueError(f"OpenBox needs low < high everywhere, got {low} and {high}")
        object.__setattr__(self, "low", _freeze(low))
        object.__setattr__(self, "high", _freeze(high))
        object.__setattr__(self, "shape", shape)

    def _bounds(self):
        lo = np.asarray(self.low[0]).reshape(self.low[1])
        hi = np.asarray(self.high[0]).reshape(self.high[1])
        return lo, hi

    def interior_margin(self, x):
        lo, hi = self._bounds()
        return jnp.minimum(x - lo, hi - x)

    def sample_interior(self, key):
        lo, hi = self._bounds()
        u = jax.random.uniform(key, self.shape, minval=0.05, maxval=0.95)
        return lo + u * (hi - lo)

    def __repr__(self) -> str:
        lo, hi = self._bounds()
        if lo.size and np.all(lo == lo.flat[0]) and np.all(hi == hi.flat[0]):
            lo, hi = lo.flat[0], hi.flat[0]
        return f"OpenBox({_tup(lo)}, {_tup(hi)}) ⊆ {_shape_str(self.shape)}"


@dataclass(frozen=True, repr=False)
class OpenBall(Space):
    """The open ball {x : ‖x − center‖ < radius} ⊆ R^shape."""

    center: Any
    radius: float
    shape: tuple

    def __init__(self, center, radius):
        center = np.asarray(center, float)
        if not radius > 0:
            raise ValueError(f"OpenBall needs a positive radius, got {radius}")
        object.__setattr__(self, "center", _freeze(center))
        object.__setattr__(self, "radius", float(radius))
        object.__setattr__(self, "shape", tuple(center.shape))

    def _center(self):
        return np.asarray(self.center[0]).reshape(self.center[1])

    def interior_margin(self, x):
        # One number says how far inside the ball x is; spread over the coordinates so that
        # the report names the coordinate furthest from the centre.
        d = x - self._center()
        slack = self.radius - jnp.sqrt(jnp.sum(d * d))
        far = jnp.abs(d) >= jnp.max(jnp.abs(d)) if d.size else jnp.ones(d.shape, bool)
        return jnp.where(far, slack, jnp.inf)

    def sample_interior(self, key):
        k1, k2 = jax.random.split(key)
        v = jax.random.normal(k1, self.shape)
        v = v / (jnp.linalg.norm(v) + 1e-12)
        r = self.radius * jax.random.uniform(k2, (), minval=0.0, maxval=0.9)
        return self._center() + r * v

    def __repr__(self) -> str:
        return f"OpenBall({_tup(self._center())}, {self.radius}) ⊆ {_shape_str(self.shape)}"


@dataclass(frozen=True, repr=False)
class Positive(Space):
    """The open positive orthant {x : x_i > 0} ⊆ R^shape."""

    shape: tuple

    def __init__(self, *shape: int):
        object.__setattr__(self, "shape", tuple(int(s) for s in shape))

    def interior_margin(self, x):
        return jnp.asarray(x)

    def sample_interior(self, key):
        return jnp.exp(0.5 * jax.random.normal(key, self.shape))

    def __repr__(self) -> str:
        return f"Positive({_shape_str(self.shape)})"


@dataclass(frozen=True, repr=False)
class Product(Space):
    """The product A_1 × ... × A_n; its points are tuples (a_1, ..., a_n)."""

    factors: tuple

    def __init__(self, *factors: Space):
        for f in factors:
            if not isinstance(f, Space):
                raise TypeError(f"Product of non-spaces: {f!r}")
        object.__setattr__(self, "factors", tuple(factors))

    @property
    def shape(self):  # a product has no single array shape
        return tuple(f.shape for f in self.factors)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.factors)

    @property
    def tangent(self) -> "Product":
        return Product(*(f.tangent for f in self.factors))

    def zeros(self, dtype=None):
        return tuple(f.zeros(dtype) for f in self.factors)

    def indicator(self, x):
        return jnp.all(jnp.stack([jnp.asarray(True)] + [f.indicator(xi) for f, xi in zip(self.factors, x)]))

    def check(self, x, what: str = "point"):
        if not isinstance(x, tuple) or len(x) != len(self.factors):
            raise DomainError(
                f"{what} is not a point of {self!r}: expected a tuple of {len(self.factors)}, "
                f"got {_describe(x)}"
            )
        for i, (f, xi) in enumerate(zip(self.factors, x)):
            f.check(xi, f"{what}[{i}]")
        return x

    def sample_interior(self, key):
        keys = jax.random.split(key, max(len(self.factors), 1))
        return tuple(f.sample_interior(k) for f, k in zip(self.factors, keys))

    def __repr__(self) -> str:
        if not self.factors:
            return "()"
        return " × ".join(f"({f!r})" if isinstance(f, Product) else repr(f) for f in self.factors)


def euclidean(space: Space) -> bool:
    """Is the space a vector space (R^n or a product of them), so that sums of points make sense?"""
    if isinstance(space, Product):
        return all(euclidean(f) for f in space.factors)
    return isinstance(space, R)
