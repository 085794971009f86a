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
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from . import draws
from .errors import DimensionError, DomainError, KindError
from .dimensions import MAX_SIZE, dimensions
from .numbers import NARROW, ROOM, real_number, too_narrow
from .points import (check_finite, describe, is_concrete, need_float_dtype, outside,
                     real_dtype_mismatch, shape_of)


def _shape_str(shape) -> str:
    if len(shape) == 0:
        return "R"
    if len(shape) == 1:
        return f"R^{shape[0]}"
    return "R^{" + "×".join(str(s) for s in shape) + "}"


def _latex_power(base: str, shape) -> str:
    """base^{n×m} as LaTeX: R for shape (), R^{n} for (n,), R^{n \\times m} for (n, m)."""
    if len(shape) == 0:
        return base
    return base + "^{" + r" \times ".join(str(s) for s in shape) + "}"


def _latex_number(x) -> str:
    return f"{x:g}".replace("inf", r"\infty")


class Space:
    """An open subset of R^shape (abstract base).

    Examples:
        >>> A = OpenBox(0.0, 1.0, (2,))
        >>> isinstance(A, Space), A.shape, A.contains(jnp.array([0.5, 0.5])), A.contains(jnp.array([0.5, 1.0]))
        (True, (2,), True, False)
    """

    shape: tuple = ()
    #: points are discrete labels (token ids, PRNG keys): integer points keep their dtype and
    #: have no covector (a class attribute, not a dataclass field)
    discrete: ClassVar[bool] = False

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
        need_space(other, f"the product {self!r} × B")
        return Product(self, other)

    def __rmul__(self, other) -> "Product":  # `3 * R(2)`: the left factor is no space
        need_space(other, f"the product A × {self!r}")
        return Product(other, self)

    # -- notation ----------------------------------------------------------------------------
    def latex(self) -> str:
        """The space in LaTeX mathematical notation (without dollars); a kind of space that
        does not say is written as its name, as text."""
        text = "".join("\\" + c if c in "{}_%&#$" else r"\^{}" if c == "^" else c
                       for c in repr(self))
        return r"\text{" + text + "}"

    def _repr_latex_(self) -> str:  # how a notebook shows a space
        return f"${self.latex()}$"

    # -- points ------------------------------------------------------------------------------
    def zeros(self, dtype=None):
        """The zero of the tangent space (an array of this shape; of a floating `dtype`)."""
        return jnp.zeros(self.shape, dtype=need_float_dtype(dtype, f"the zeros of {self!r}"))

    def interior_margin(self, x):
        """Per coordinate, how far inside the open set x lies (> 0 inside); traceable."""
        return jnp.full(jnp.shape(x), jnp.inf)

    def indicator(self, x):
        """A traceable boolean: x lies in the open set (shape assumed right)."""
        return jnp.all(self.interior_margin(x) > 0)

    # -- the one check: is x (shaped as) a point of this space ------------------------------
    def mismatch(self, x, where: str = "the point", lead: tuple = ()) -> str | None:
        """None if x has the structure, shapes and real entries of a point of this space (with
        the leading axes `lead`, e.g. a batch's), else why not, naming `where` in x it
        differs. Static: what a trace knows (structure, shapes, dtypes), so it holds under `jit`.

        Every check that a value is shaped as a point (composition, a lens's input, parameter
        and covector checks, the optimiser's covector, saved work) asks this one method.

        Examples:
            >>> print((R(3) * R(2)).mismatch((jnp.zeros(3), jnp.zeros(4)), "p"))
            p[1] is not a point of R^2: expected an array of shape (2,), got an array of shape (4,)
        """
        want = tuple(lead) + tuple(self.shape)
        if shape_of(x) != want:
            return self.not_a_point(where, lead, f"expected an array of shape {want}, got "
                                                 f"{describe(x)}")
        other = real_dtype_mismatch(x)
        return self.not_a_point(where, lead, f"expected real numbers, got {other}") if other \
            else None

    def not_a_point(self, where: str, lead: tuple, why: str) -> str:
        """The one wording of a mismatch: `where` is not a point of this space, and why."""
        axes = f" (with leading axes {tuple(lead)})" if lead else ""
        return f"{where} is not a point of {self!r}{axes}: {why}"

    def contains(self, x) -> bool:
        """Is x (a concrete point) in this open set?"""
        try:
            self.check(x)
        except DomainError:
            return False
        return True

    def check(self, x, what: str = "point"):
        """Return x if it is a point of this space, else raise `DomainError` saying why.

        The shape and the element type are always checked (they are static); a point must be
        real (no NaN, no infinity, no complex or non-numeric entries), and membership of the
        open set is checked only for concrete values, since inside `jit` there are no values
        to look at.
        """
        why = self.mismatch(x, what)
        if why:
            raise DomainError(why)
        check_finite(x, what, self)
        if is_concrete(x):
            margin = np.asarray(self.interior_margin(x))
            if not np.all(margin > 0):
                raise DomainError(outside(what, self, x, margin))
        return x

    def sample_interior(self, key):
        """A point of the open set drawn from a distribution supported well inside it."""
        return draws.normal(key, self.shape)


def _real_array(a, what: str) -> np.ndarray:
    """a as a float array, refusing what is not real numbers (strings, complex, objects)."""
    try:
        arr = np.asarray(a)
    except Exception:  # noqa: BLE001 - a ragged list
        raise DomainError(f"{what} must be real numbers, got {a!r}") from None
    if arr.dtype.kind not in "fiu":
        raise DomainError(f"{what} must be real numbers, got {a!r}")
    return arr.astype(float)


def _tup(a) -> tuple | float:
    """An array as a nested tuple of floats (a scalar as a float): hashable, compared by value."""
    return np.asarray(a, dtype=float).tolist() if np.ndim(a) else float(a)


def _freeze(a):
    a = np.asarray(a, dtype=float)
    return tuple(a.reshape(-1).tolist()), tuple(a.shape)


@dataclass(frozen=True, repr=False)
class R(Space):
    """Euclidean space R^shape. `R()` is the real line, `R(0)` the terminal object {None}.

    Examples:
        >>> R(2, 3), R(), R(0)
        (R^{2×3}, R, R^0)
        >>> R(3).contains(jnp.zeros(3)), R(0).contains(None)
        (True, True)
    """

    shape: tuple

    def __init__(self, *shape: int):
        shape = dimensions(shape, f"R{shape!r}")  # non-negative integers (numpy's welcome)
        if math.prod(shape) > MAX_SIZE:
            raise DimensionError(f"R{shape} has {math.prod(shape)} coordinates, more than the "
                                 f"{MAX_SIZE} (2^40) one space may have")
        if 0 in shape and shape != (0,):
            raise DimensionError(f"R{shape} has no points but R(0) is the terminal object: use R(0)")
        object.__setattr__(self, "shape", shape)

    @property
    def is_terminal(self) -> bool:
        return self.shape == (0,)

    @property
    def tangent(self) -> "R":
        return self

    def zeros(self, dtype=None):
        dtype = need_float_dtype(dtype, f"the zeros of {self!r}")
        return None if self.is_terminal else jnp.zeros(self.shape, dtype=dtype)

    def indicator(self, x):
        return jnp.asarray(True)

    def mismatch(self, x, where: str = "the point", lead: tuple = ()) -> str | None:
        if not self.is_terminal:
            return super().mismatch(x, where, lead)
        return None if x is None else self.not_a_point(
            where, (), f"its only point is None, got {describe(x)}")

    def check(self, x, what: str = "point"):
        why = self.mismatch(x, what)
        if why:
            raise DomainError(why)
        if x is not None:
            check_finite(x, what, self)
        return x

    def sample_interior(self, key):
        return None if self.is_terminal else draws.normal(key, self.shape)

    def __repr__(self) -> str:
        return "R^0" if self.is_terminal else _shape_str(self.shape)

    def latex(self) -> str:
        return r"\mathbb{R}^{0}" if self.is_terminal else _latex_power(r"\mathbb{R}", self.shape)


@dataclass(frozen=True, repr=False)
class OpenBox(Space):
    """The open box ∏ (low_i, high_i) ⊆ R^shape (bounds broadcast to `shape`), with finite
    bounds: the unbounded open sets are `Positive` (the half-lines (0, ∞)) and `R`.

    Examples:
        >>> B = OpenBox(-1.0, 1.0, (2,))
        >>> B.contains(jnp.array([0.0, 0.9])), B.contains(jnp.array([0.0, 1.0]))
        (True, False)
    """

    low: Any
    high: Any
    shape: tuple

    def __init__(self, low, high, shape=None):
        low, high = _real_array(low, "OpenBox: low"), _real_array(high, "OpenBox: high")
        if shape is None:
            try:
                shape = np.broadcast_shapes(low.shape, high.shape)
            except ValueError:
                raise DimensionError(f"OpenBox: the bounds of shapes {low.shape} and {high.shape} "
                                     "do not broadcast") from None
        if not isinstance(shape, (tuple, list)):
            raise DimensionError(f"OpenBox: shape must be a tuple of integers, got {shape!r}")
        shape = dimensions(shape, "OpenBox", least=1)
        try:
            low, high = np.broadcast_to(low, shape), np.broadcast_to(high, shape)
        except ValueError:
            raise DimensionError(f"OpenBox: bounds of shapes {low.shape} and {high.shape} do "
                                 f"not broadcast to the shape {shape}") from None
        if not np.all(low < high):  # NaN bounds fail too
            raise DomainError(f"OpenBox needs low < high everywhere, got {low} and {high}")
        if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
            # an infinite bound has no interior point to sample (inf − inf is NaN), so a layer
            # initialised on it would start outside its own parameter space
            raise DomainError(f"OpenBox needs finite bounds, got {low} and {high}: use "
                              "Positive(*shape) for the half-line (0, ∞), R(*shape) for the "
                              "whole line, or finite bounds")
        if too_narrow(low, high):
            raise DomainError(f"OpenBox({_tup(low)}, {_tup(high)}) is narrower than {ROOM} float32 {NARROW}")
        object.__setattr__(self, "low", _freeze(low))
        object.__setattr__(self, "high", _freeze(high))
        object.__setattr__(self, "shape", shape)

    def bounds(self) -> tuple:
        """(low, high) as arrays of the box's shape."""
        lo = np.asarray(self.low[0]).reshape(self.low[1])
        hi = np.asarray(self.high[0]).reshape(self.high[1])
        return lo, hi

    def interior_margin(self, x):
        lo, hi = self.bounds()
        return jnp.minimum(x - lo, hi - x)

    def sample_interior(self, key):
        lo, hi = self.bounds()
        u = jax.random.uniform(key, self.shape, minval=0.05, maxval=0.95)
        return lo + u * (hi - lo)

    def __repr__(self) -> str:
        lo, hi = self.bounds()
        if lo.size and np.all(lo == lo.flat[0]) and np.all(hi == hi.flat[0]):
            lo, hi = lo.flat[0], hi.flat[0]
        return f"OpenBox({_tup(lo)}, {_tup(hi)}) ⊆ {_shape_str(self.shape)}"

    def latex(self) -> str:
        lo, hi = self.bounds()
        if lo.size and np.all(lo == lo.flat[0]) and np.all(hi == hi.flat[0]):  # a cube
            interval = f"({_latex_number(lo.flat[0])}, {_latex_number(hi.flat[0])})"
            return _latex_power(interval, self.shape)
        if lo.ndim == 1 and lo.size <= 4:  # a few intervals: write them out
            return r" \times ".join(f"({_latex_number(a)}, {_latex_number(b)})"
                                     for a, b in zip(lo, hi))
        return r"\prod_i (l_i, h_i) \subseteq " + _latex_power(r"\mathbb{R}", self.shape)


@dataclass(frozen=True, repr=False)
class OpenBall(Space):
    """The open ball {x : ‖x − center‖ < radius} ⊆ R^shape.

    Examples:
        >>> B = OpenBall([0.0, 0.0], 1.0)
        >>> B.contains(jnp.array([0.6, 0.6])), B.contains(jnp.array([0.8, 0.8]))
        (True, False)
    """

    center: Any
    radius: float
    shape: tuple

    def __init__(self, center, radius):
        center = _real_array(center, "OpenBall: center")
        if not np.all(np.isfinite(center)):
            raise DomainError(f"OpenBall needs a finite center, got {center}")
        if 0 in center.shape:
            raise DimensionError(f"OpenBall needs a center with no zero dimension, got shape {center.shape}")
        radius = real_number(radius, "OpenBall: radius", least=2.0 ** -60, error=DomainError,
                             hint=" (a smaller ball has no float32 point to spare)")
        if too_narrow(center - radius, center + radius):
            raise DomainError(f"OpenBall({_tup(center)}, {radius}) is narrower than {ROOM} float32 {NARROW}")
        object.__setattr__(self, "center", _freeze(center))
        object.__setattr__(self, "radius", radius)
        object.__setattr__(self, "shape", tuple(center.shape))

    def center_array(self) -> np.ndarray:
        """The centre as an array of the ball's shape (`center` holds it frozen, hashable)."""
        return np.asarray(self.center[0]).reshape(self.center[1])

    def interior_margin(self, x):
        # One number says how far inside the ball x is; spread over the coordinates so that
        # the report names the coordinate furthest from the centre.
        d = x - self.center_array()
        slack = self.radius - jnp.sqrt(jnp.sum(d * d))
        far = jnp.abs(d) >= jnp.max(jnp.abs(d)) if d.size else jnp.ones(d.shape, bool)
        return jnp.where(far, slack, jnp.inf)

    def sample_interior(self, key):
        k1, k2 = draws.split(key, 2)
        v = draws.normal(k1, self.shape)
        v = v / (jnp.linalg.norm(v) + 1e-12)
        r = self.radius * jax.random.uniform(k2, (), minval=0.0, maxval=0.9)
        return self.center_array() + r * v

    def __repr__(self) -> str:
        return f"OpenBall({_tup(self.center_array())}, {self.radius}) ⊆ {_shape_str(self.shape)}"

    def latex(self) -> str:
        c = self.center_array()
        centre = (_latex_number(float(c.flat[0])) if c.size and np.all(c == c.flat[0]) else "c")
        return (f"B_{{{_latex_number(self.radius)}}}({centre}) \\subseteq "
                + _latex_power(r"\mathbb{R}", self.shape))


@dataclass(frozen=True, repr=False)
class Positive(Space):
    """The open positive orthant {x : x_i > 0} ⊆ R^shape.

    Examples:
        >>> Positive(2).contains(jnp.array([1.0, 2.0])), Positive(2).contains(jnp.array([1.0, 0.0]))
        (True, False)
    """

    shape: tuple

    def __init__(self, *shape: int):
        # positive integers: a zero dimension would leave an orthant with no coordinates
        object.__setattr__(self, "shape", dimensions(shape, f"Positive{shape!r}", least=1))

    def interior_margin(self, x):
        return jnp.asarray(x)

    def sample_interior(self, key):
        return jnp.exp(0.5 * draws.normal(key, self.shape))

    def __repr__(self) -> str:
        return f"Positive({_shape_str(self.shape)})"

    def latex(self) -> str:
        return _latex_power(r"\mathbb{R}_{>0}", self.shape)


@dataclass(frozen=True, repr=False)
class Product(Space):
    """The product A_1 × ... × A_n; its points are tuples (a_1, ..., a_n).

    Examples:
        >>> P = Product(R(2), Positive())
        >>> P == R(2) * Positive(), P.contains((jnp.zeros(2), jnp.asarray(1.0)))
        (True, True)
    """

    factors: tuple

    def __init__(self, *factors: Space):
        for f in factors:
            if not isinstance(f, Space):
                raise KindError(f"Product of non-spaces: {f!r}")
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
        dtype = need_float_dtype(dtype, f"the zeros of {self!r}")
        return tuple(f.zeros(dtype) for f in self.factors)

    def indicator(self, x):
        return jnp.all(jnp.stack([jnp.asarray(True)] + [f.indicator(xi) for f, xi in zip(self.factors, x)]))

    def mismatch(self, x, where: str = "the point", lead: tuple = ()) -> str | None:
        if not isinstance(x, tuple) or len(x) != len(self.factors):
            return self.not_a_point(where, lead, f"expected a tuple of {len(self.factors)}, "
                                                 f"got {describe(x)}")
        return next((why for i, (f, xi) in enumerate(zip(self.factors, x))
                     if (why := f.mismatch(xi, f"{where}[{i}]", lead))), None)

    def check(self, x, what: str = "point"):
        why = self.mismatch(x, what)
        if why:
            raise DomainError(why)
        for i, (f, xi) in enumerate(zip(self.factors, x)):
            f.check(xi, f"{what}[{i}]")
        return x

    def sample_interior(self, key):
        keys = draws.split(key, max(len(self.factors), 1))
        return tuple(f.sample_interior(k) for f, k in zip(self.factors, keys))

    def __repr__(self) -> str:
        if not self.factors:
            return "()"
        return " × ".join(f"({f!r})" if isinstance(f, Product) else repr(f) for f in self.factors)

    def latex(self) -> str:
        if not self.factors:
            return "()"
        return r" \times ".join(f"({f.latex()})" if isinstance(f, Product) else f.latex()
                                 for f in self.factors)


def need_space(A, who: str) -> Space:
    """A if it is a Space (not the class `R` itself, a lens, a shape), else `KindError`."""
    if not isinstance(A, Space):
        what = f"the class {A.__name__}" if isinstance(A, type) else f"{type(A).__name__} {A!r:.60}"
        raise KindError(f"{who} needs a Space (e.g. R(3)), got {what}")
    return A


def euclidean(space: Space) -> bool:
    """Is the space a vector space (R^n or a product of them), so that sums of points make sense?

    Examples:
        >>> euclidean(R(2) * R(3)), euclidean(Positive(2))
        (True, False)
    """
    need_space(space, "euclidean")
    if isinstance(space, Product):
        return all(euclidean(f) for f in space.factors)
    return isinstance(space, R)
