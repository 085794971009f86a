"""Morphisms of the ambient category: smooth maps between open subsets of Euclidean spaces.

`Smooth(dom, cod, fn)` is a smooth map dom → cod. Composition is `f >> g` (diagrammatic:
f first), defined once here; the cartesian structure is `pair` ⟨f, g⟩, `f * g`, the
projections `fst`/`snd`, the diagonal (copy) and `smooth_discard` to the terminal object R^0.
"""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np

from ._compose import check_composable, check_landed, check_map_parts, need_operand
from .spaces import DomainError, Product, R, Space, euclidean, need_space
from .dimensions import dimension
from .numbers import flag
from .points import is_real_dtype
from .errors import DimensionError, KindError, SpaceMismatch

tree_map = jax.tree_util.tree_map


class Smooth:
    """A smooth map f : dom → cod, with `fn` written for single points (a pytree in, a pytree out).

    Examples:
        >>> f = Smooth(R(2), R(), lambda x: x[0] * x[1], "mul")
        >>> f
        mul : R^2 → R
        >>> float(f(jnp.array([2.0, 3.0])))
        6.0
        >>> g = f >> Smooth(R(), R(), jnp.exp, "exp")
        >>> round(float(g(jnp.array([1.0, 0.5]))), 4)
        1.6487
    """

    #: a left inverse cod → dom, where one is known (a tying map's keeps the tied slots once)
    section: Callable | None = None

    def __init__(self, dom: Space, cod: Space, fn, name: str | None = None, check: bool = True):
        check_map_parts("Smooth", dom, cod, fn, name=name)
        self.dom, self.cod, self.fn = dom, cod, fn
        self.name = name or getattr(fn, "__name__", "f")
        self._check = flag(check, f"Smooth {self.name}: check")

    @property
    def checked(self) -> bool:
        """Does a call check its point against the domain (`check=True`, the default)?"""
        return self._check

    @property
    def one_slot(self) -> bool:
        """Is the domain one parameter slot (rather than a product of slots)? A reparameterisation
        along this map counts the uses of each slot by it."""
        return not isinstance(self.dom, Product)

    def __call__(self, x):
        if not self._check:
            return self.fn(x)
        self.dom.check(x, f"the argument of {self.name}")
        return self._landed(x)

    # -- composition (the one definition of ≫ in this category) -----------------------------
    def __rshift__(self, other: "Smooth") -> "Smooth":
        need_operand(self, ">>", other, Smooth, "a smooth map composes with a smooth map (e.g. "
                     "Smooth(R(), R(), jnp.sin, 'sin'))")
        check_composable(self, other)
        f, g = self.fn, other.fn
        if self._check:  # what f gives g is checked against f's codomain (static: once a trace)
            f = self._landed
        return Smooth(self.dom, other.cod, lambda x: g(f(x)), f"{self.name} ≫ {other.name}",
                      check=self._check)

    def _landed(self, x):
        """fn(x), if it has the structure and shapes of a point of the codomain, else
        `SpaceMismatch` (shapes are static: checked once per trace under jit)."""
        y = self.fn(x)
        check_landed(self, y)
        return y

    def __mul__(self, other: "Smooth") -> "Smooth":
        """f × g : A × C → B × D, (a, c) ↦ (f a, g c); f * c, for a real number c, is c·f."""
        if _factor(other):
            return scale(other, self)
        need_operand(self, "*", other, Smooth, _TIMES)
        f, g = self.fn, other.fn
        return Smooth(self.dom * other.dom, self.cod * other.cod, lambda ac: (f(ac[0]), g(ac[1])),
                      f"({self.name} × {other.name})")

    def __rmul__(self, c):  # reached only when c is not a Smooth map
        if not _factor(c):
            raise KindError(f"cannot form {type(c).__name__} {c!r:.40} * {self.name}: {_TIMES}")
        return scale(c, self)

    def __add__(self, other: "Smooth") -> "Smooth":
        """Pointwise sum f + g : A → B, for a Euclidean codomain B."""
        need_operand(self, "+", other, Smooth, "the pointwise sum adds two smooth maps A → B")
        if self.dom != other.dom or self.cod != other.cod:
            raise SpaceMismatch(
                f"cannot add {self.name} : {self.dom!r} → {self.cod!r} and "
                f"{other.name} : {other.dom!r} → {other.cod!r}: the spaces differ"
            )
        _need_euclidean(self.cod, "+")
        f, g = self.fn, other.fn
        return Smooth(self.dom, self.cod, lambda x: tree_map(lambda a, b: a + b, f(x), g(x)),
                      f"({self.name} + {other.name})")

    def __neg__(self):
        return scale(-1.0, self)

    def __repr__(self) -> str:
        return f"{self.name} : {self.dom!r} → {self.cod!r}"


def _need_euclidean(space: Space, op: str) -> None:
    if not euclidean(space):
        raise SpaceMismatch(f"{op} needs a Euclidean codomain (a vector space), got {space!r}")


#: what `*` takes beside a smooth map
_TIMES = "* takes a smooth map (the product f × g) or a real number (the multiple c·f)"


def _factor(c) -> bool:
    """Is c one real number (Python's, numpy's or a 0-d real array; not a bool), a factor?"""
    return not isinstance(c, (bool, np.bool_)) and (
        isinstance(c, (int, float, np.integer, np.floating))
        or (hasattr(c, "dtype") and np.ndim(c) == 0 and is_real_dtype(c.dtype)))


def scale(c, f: Smooth) -> Smooth:
    """The scalar multiple c·f, for a Euclidean codomain.

    Examples:
        >>> float(scale(3.0, Smooth(R(), R(), lambda x: x + 1, "succ"))(jnp.asarray(1.0)))
        6.0
    """
    need_smooth(f, "scale(c, f)")
    if not _factor(c):
        raise KindError(f"scale(c, f): c must be a real number (the factor), got "
                        f"{type(c).__name__} {c!r}")
    _need_euclidean(f.cod, "scalar multiplication")
    fn = f.fn
    return Smooth(f.dom, f.cod, lambda x: tree_map(lambda a: c * a, fn(x)), f"{c}·{f.name}")


def need_smooth(f, who: str) -> None:
    """Refuse (`KindError`) an argument f of `who` that is not a `Smooth` map."""
    if not isinstance(f, Smooth):
        raise KindError(f"{who} needs a Smooth map f, got {type(f).__name__} {f!r}: make one "
                        "with Smooth(dom, cod, fn)")


def _spaces(who: str, *spaces) -> None:
    """Refuse (`KindError`) an argument of `who` that is not a Space (`need_space`)."""
    for A in spaces:
        need_space(A, who)


def smooth_identity(A: Space) -> Smooth:
    """1_A : A → A.

    Examples:
        >>> smooth_identity(R(2))(jnp.array([1.0, 2.0])).tolist()
        [1.0, 2.0]
    """
    return Smooth(A, A, lambda x: x, "id")


def pair(f: Smooth, g: Smooth) -> Smooth:
    """⟨f, g⟩ : A → B × C, the unique map with ⟨f, g⟩ ≫ fst = f and ⟨f, g⟩ ≫ snd = g.

    Examples:
        >>> f = Smooth(R(), R(), jnp.sin, "sin")
        >>> g = pair(f, smooth_identity(R()))
        >>> g.cod
        R × R
        >>> [round(float(v), 4) for v in g(jnp.asarray(0.5))]
        [0.4794, 0.5]
    """
    for h in (f, g):
        if not isinstance(h, Smooth):
            raise KindError(f"pair needs two Smooth maps, got {type(h).__name__} {h!r}")
    if f.dom != g.dom:
        raise SpaceMismatch(
            f"cannot pair {f.name} : {f.dom!r} → {f.cod!r} with {g.name} : {g.dom!r} → {g.cod!r}: "
            "their domains differ"
        )
    ff, gg = f.fn, g.fn
    return Smooth(f.dom, f.cod * g.cod, lambda x: (ff(x), gg(x)), f"⟨{f.name}, {g.name}⟩")


def _binary(AB: Space, who: str) -> Product:
    if not isinstance(AB, Product) or len(AB.factors) != 2:
        raise SpaceMismatch(f"{who} needs a binary product A × B, got {AB!r}")
    return AB


def _product(who: str, A, B) -> Product:
    """A × B, for two Spaces (`KindError` naming `who` else)."""
    _spaces(who, A, B)
    return Product(A, B)


def fst(A: Space, B: Space | None = None) -> Smooth:
    """π₀ : A × B → A (also `fst(A × B)`).

    Examples:
        >>> float(fst(R(), R(2))((jnp.asarray(1.0), jnp.zeros(2))))
        1.0
    """
    AB = _binary(A, "fst") if B is None else _product("fst", A, B)
    return Smooth(AB, AB.factors[0], lambda ab: ab[0], "π₀")


def snd(A: Space, B: Space | None = None) -> Smooth:
    """π₁ : A × B → B (also `snd(A × B)`).

    Examples:
        >>> snd(R(), R(2))((jnp.asarray(1.0), jnp.zeros(2))).tolist()
        [0.0, 0.0]
    """
    AB = _binary(A, "snd") if B is None else _product("snd", A, B)
    return Smooth(AB, AB.factors[1], lambda ab: ab[1], "π₁")


def projection(P: Product, i: int) -> Smooth:
    """π_i : A_0 × ... × A_{n-1} → A_i.

    Examples:
        >>> float(projection(Product(R(), R(), R()), 2)((1.0, 2.0, 3.0)))
        3.0
    """
    if not isinstance(P, Product):
        raise KindError(f"projection needs a Product of spaces (e.g. R(2) * R(3)), got {P!r}")
    n = len(P.factors)
    i = dimension(i, f"projection: the index of a factor of {P!r}", 0)
    if i >= n:
        raise DimensionError(f"projection: {P!r} has factors 0 to {n - 1}, got index {i}")
    return Smooth(P, P.factors[i], lambda x: x[i], f"π{i}")


def diagonal(A: Space) -> Smooth:
    """Δ_A : A → A × A, the copy that the cartesian structure provides for free.

    Examples:
        >>> diagonal(R()).cod, diagonal(R())(2.0)
        (R × R, (2.0, 2.0))
    """
    _spaces("diagonal", A)
    return Smooth(A, A * A, lambda x: (x, x), "Δ")


def smooth_discard(A: Space) -> Smooth:
    """!_A : A → R^0, the unique map to the terminal object.

    Examples:
        >>> smooth_discard(R(3)).cod, smooth_discard(R(3))(jnp.ones(3))
        (R^0, None)
    """
    return Smooth(A, R(0), lambda x: None, "!")


def swap(A: Space, B: Space) -> Smooth:
    """σ : A × B → B × A.

    Examples:
        >>> swap(R(), R())((1.0, 2.0))
        (2.0, 1.0)
    """
    _spaces("swap", A, B)
    return Smooth(A * B, B * A, lambda ab: (ab[1], ab[0]), "σ")


def constant(A: Space, B: Space, value) -> Smooth:
    """The constant map A → B at a point of B.

    Examples:
        >>> float(constant(R(2), R(), jnp.asarray(7.0))(jnp.zeros(2)))
        7.0
    """
    _spaces("constant", A, B)
    B.check(value, "the value of a constant map")
    return Smooth(A, B, lambda x: value, "const")


__all__ = [
    "Smooth", "smooth_identity", "pair", "fst", "snd", "projection", "diagonal",
    "smooth_discard", "swap", "constant", "scale",
]
