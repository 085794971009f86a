"""Explicit structure: copying, discarding and adding values, as parameterless lenses.

The cartesian setting copies for free (the diagonal); here each copy is a morphism one can
see. The backward part of a copy adds the two incoming covectors, that of `add` copies its
covector, that of `discard` gives zero: each is derived by JAX from the forward part, and
the tests check that the derived one is exactly this.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from categories import Positive, Product, R, Space
from categories.errors import DomainError

from .inputs import need_space
from .layer import Layer
from .slots import uses


def copy(A: Space) -> Layer:
    """Δ_A : A → A × A, no parameters (R^0); backward: (a'₁, a'₂) ↦ a'₁ + a'₂.

    Examples:
        >>> c = copy(R(2))
        >>> c(jnp.array([1.0, 2.0]), None)[1].tolist()
        [1.0, 2.0]
        >>> [float(v) for v in unwrap(c.backward(jnp.array([1.0, 2.0]), None, (jnp.ones(2), 2 * jnp.ones(2)))[0])]
        [3.0, 3.0]
    """
    need_space(A, "copy")
    return Layer(A, A * A, R(0), lambda a, p: (a, a), name="copy", node="copy")


def discard(A: Space) -> Layer:
    """!_A : A → R^0, no parameters; backward: the zero covector on A.

    Examples:
        >>> d = discard(R(2))
        >>> d(jnp.array([1.0, 2.0]), None), unwrap(d.backward(jnp.array([1.0, 2.0]), None, None)[0]).tolist()
        (None, [0.0, 0.0])
    """
    need_space(A, "discard")
    return Layer(A, R(0), R(0), lambda a, p: None, name="discard", node="discard")


def add(A: Space) -> Layer:
    """+ : A × A → A, no parameters; backward: a' ↦ (a', a').

    Examples:
        >>> s = add(R(2))
        >>> s((jnp.ones(2), jnp.ones(2)), None).tolist()
        [2.0, 2.0]
        >>> [v.tolist() for v in unwrap(s.backward((jnp.ones(2), jnp.ones(2)), None, jnp.array([1.0, 2.0]))[0])]
        [[1.0, 2.0], [1.0, 2.0]]
    """
    need_space(A, "add")
    if not _closed_under_addition(A):
        raise DomainError(f"add({A!r}): the sum of two points of {A!r} need not be a point of it; "
                          "add needs a space closed under addition (R(n), Positive(n), or a "
                          "product of them)")
    return Layer(A * A, A, R(0), lambda aa, p: jax.tree_util.tree_map(jnp.add, aa[0], aa[1]),
                 name="add", node="add")


def _closed_under_addition(A: Space) -> bool:
    """Whether a + b is a point of A for all points a, b: R^n and (0, ∞)^n, leaf by leaf in a
    product (an open box or ball is not: 0.6 + 0.6 leaves (0, 1))."""
    if isinstance(A, Product):
        return all(_closed_under_addition(F) for F in A.factors)
    return type(A) in (R, Positive)


__all__ = ["copy", "discard", "add", "uses"]
