"""Dimensions: the integers a space or a layer size is made of, checked once.

Examples:
    >>> from categories.dimensions import dimension, dimensions
    >>> dimension(3, "n"), dimensions((2, 3), "R(2, 3)")
    (3, (2, 3))
"""

from __future__ import annotations

from .errors import DimensionError
from .numbers import integer


#: the largest dimension of a space or layer size: an array axis beyond it (2^31 − 1, the
#: index range of XLA's 32-bit loops) cannot be allocated anyway, and a larger number is a typo
MAX_DIMENSION = 2**31 - 1
#: the largest number of coordinates of one space (2^40, about 10^12: 8 TiB in float64)
MAX_SIZE = 2**40


def dimension(n, what: str, least: int = 0) -> int:
    """n as a Python int if it is an integer in [`least`, MAX_DIMENSION] (numpy integers
    welcome; bools, floats, strings refused), else `DimensionError` naming `what` and the value."""
    return integer(n, what, least, MAX_DIMENSION, DimensionError)


def dimensions(shape, who: str, least: int = 0) -> tuple:
    """The shape as Python ints, each checked by `dimension` (naming its place in `who`)."""
    return tuple(dimension(s, f"dimension {i} of {who}", least) for i, s in enumerate(shape))


__all__ = ["MAX_DIMENSION", "MAX_SIZE", "dimension", "dimensions"]
