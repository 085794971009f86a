"""The slots of a parameter point: the factors of a product parameter object, each named.

A parameter point of P_1 × ... × P_n is a tuple with one entry per slot; a check of such a
point names the slot that differs ("the point of slot 2 (dense(3→1))"), which is what a
user can act on. The check itself is `Space.mismatch`, asked slot by slot here.

Examples:
    >>> from categories.slots import slot_mismatch
    >>> P = R(2) * R(3)
    >>> print(slot_mismatch(P, (jnp.zeros(2), jnp.zeros(4)), "the point of {}"))
    the point of slot 1 is not a point of R^3: expected an array of shape (3,), got an array of shape (4,)
"""

from __future__ import annotations

from typing import Sequence

from .errors import DimensionError
from .spaces import Product, R, Space


def slots(space: Space, x) -> list:
    """(slot space, slot value) pairs: the factors of a product parameter object when x is a
    tuple of as many entries, else the whole as one slot."""
    if isinstance(space, Product) and isinstance(x, tuple) and len(x) == len(space.factors):
        return list(zip(space.factors, x))
    return [(space, x)]


def slot_mismatch(space: Space, x, where: str, names: Sequence[str] | None = None) -> str | None:
    """None if x is shaped as a point of `space`, else why not, naming the slot: `where` is a
    format with one `{}` for the slot's name (`names`, one per slot, else "slot i")."""
    pairs = slots(space, x)
    if names is None or len(names) != len(pairs):
        names = [f"slot {i}" for i in range(len(pairs))]
    return next((why for name, (s, q) in zip(names, pairs)
                 if (why := s.mismatch(q, where.format(name)))), None)


def euclidean_space_of(x) -> Space | None:
    """The Euclidean space a plain point x is a point of (R^shape for an array, a product for
    a tuple, R^0 for None), or None when x is not such a pytree (a dict, an empty array)."""
    if x is None:
        return R(0)
    if isinstance(x, tuple):
        factors = [euclidean_space_of(xi) for xi in x]
        known = [f for f in factors if f is not None]
        return Product(*known) if len(known) == len(factors) else None
    shape = getattr(x, "shape", None)
    if shape is None or 0 in tuple(shape):  # an empty array is no point of R^0 (None is)
        return None
    try:
        return R(*shape)
    except DimensionError:
        return None


__all__ = ["slots", "slot_mismatch", "euclidean_space_of"]
