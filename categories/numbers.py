"""Numbers an argument is: an integer (a count, a period, a dimension) or one finite real
number (a rate, a damping, a radius, an eps), checked once for every entry point; and the two
other scalars a constructor takes: a switch (`flag`: True or False, not whatever is truthy)
and a name (`need_name`: a string).

Examples:
    >>> from categories.numbers import integer, real_number
    >>> integer(3, "cg_iters", least=1), real_number(0.5, "beta", least=0, below=1)
    (3, 0.5)
    >>> real_number(0.0, "eps", above=0)
    Traceback (most recent call last):
    ...
    categories.errors.HyperparameterError: eps must be a finite number > 0, got 0.0
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import Literal, overload

import jax
import numpy as np

from .errors import HyperparameterError, KindError


def integer(n, what: str, least: int = 0, most: int | None = None,
            error: type = HyperparameterError) -> int:
    """n as a Python int if it is an integer in [least, most] (numpy's too; a bool, a float,
    a string is not one), else `error` naming `what` and the value."""
    if isinstance(n, (bool, np.bool_)):
        raise error(f"{what} must be an integer ≥ {least}, got {n!r}")
    try:
        k = operator.index(n)
    except TypeError:
        raise error(f"{what} must be an integer ≥ {least}, got {n!r}") from None
    if k < least:
        raise error(f"{what} must be an integer ≥ {least}, got {n!r}")
    if most is not None and k > most:
        raise error(f"{what} must be an integer ≤ {most}, got {n!r}")
    return int(k)


def _range(least, above, below) -> str:
    lower = f" ≥ {least:g}" if least is not None else f" > {above:g}" if above is not None else ""
    if below is None:
        return lower
    opening = f"[{least:g}" if least is not None else f"({above:g}" if above is not None else "(−∞"
    return f" in {opening}, {below:g})"


def real_number(x, what: str, *, least: float | None = None, above: float | None = None,
                below: float | None = None, traced: bool = False, hint: str = "",
                error: type = HyperparameterError):
    """x as a float if it is one finite real number (Python's, numpy's or a 0-d array; a
    bool, a string, a longer array is not one) with least ≤ x, above < x and x < below where
    given, else `error` naming `what`, the range, `hint` and the value.

    With `traced`, a traced value (an optimiser's number built under `jax.jit`) is returned
    as it is: nothing about it is known before it runs."""
    if traced and isinstance(x, jax.core.Tracer):
        return x
    expected = f"{what} must be a finite number{_range(least, above, below)}{hint}, got {x!r}"
    value = x
    if isinstance(x, (np.ndarray, jax.Array)) and x.ndim == 0 \
            and not isinstance(x, jax.core.Tracer):
        value = x.item()  # a 0-d array, as jnp.asarray(0.1) or a sweep's np.float32 gives it
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise error(expected)
    value = float(value)
    if not math.isfinite(value) or (least is not None and value < least) \
            or (above is not None and value <= above) or (below is not None and value >= below):
        raise error(expected)
    return value


def flag(x, who: str, allowed: str = "True or False") -> bool:
    """x if it is True or False (a numpy bool welcome), else `KindError` naming `who`: a
    documented switch is not read by the truthiness of whatever came ("no" is true).

    Examples:
        >>> from categories.numbers import flag
        >>> flag(True, "check")
        True
        >>> flag("no", "Smooth: check")
        Traceback (most recent call last):
        ...
        categories.errors.KindError: Smooth: check must be True or False, got str 'no'
    """
    if not isinstance(x, (bool, np.bool_)):
        raise KindError(f"{who} must be {allowed}, got {type(x).__name__} {x!r}")
    return bool(x)


def optional_flag(x, who: str) -> bool | None:
    """`flag`, or None where None is the switch's default (decided later)."""
    return None if x is None else flag(x, who, "True, False or None")


@overload
def need_name(name, who: str, optional: Literal[False]) -> str: ...


@overload
def need_name(name, who: str, optional: bool = True) -> str | None: ...


def need_name(name, who: str, optional: bool = True) -> str | None:
    """name if it is a string (None too, where `optional`: the default name), else `KindError`
    naming `who`: a name is shown in terms, pictures and every error message.

    Examples:
        >>> from categories.numbers import need_name
        >>> need_name("scale", "Layer"), need_name(None, "Layer")
        ('scale', None)
        >>> need_name(3, "Layer")
        Traceback (most recent call last):
        ...
        categories.errors.KindError: Layer: the name must be a string (e.g. "scale"), got int 3
    """
    if (name is None and optional) or isinstance(name, str):
        return name
    raise KindError(f"{who}: the name must be a string (e.g. \"scale\"), got "
                    f"{type(name).__name__} {name!r:.40}")


#: the float32 steps an open interval must span: a point strictly inside must be
#: representable, with room for what keeps a point inside (a retraction's clamp a few steps
#: inside a bound, a draw at 5% of the width) to land strictly between the bounds, not on one
ROOM = 128
#: how a space narrower than that is refused, after "narrower than ROOM float32"
NARROW = "steps at its bounds: too few numbers lie inside it to hold a point strictly inside"


def too_narrow(lo, hi) -> bool:
    """Whether some interval (lo_i, hi_i) (bounds broadcast together, lo < hi) spans fewer than
    `ROOM` float32 steps at its bounds (the spacing of float32 numbers at the larger |bound|):
    at float32 such an open set has too few points inside for a point to be drawn in it and
    kept in it.

    Examples:
        >>> from categories.numbers import too_narrow
        >>> too_narrow(0.0, 1.0), too_narrow(1.0, 1.0 + 1e-6), too_narrow(0.0, 1e-30)
        (False, True, False)
    """
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        step = np.maximum(np.spacing(np.abs(lo).astype(np.float32)),
                          np.spacing(np.abs(hi).astype(np.float32))).astype(np.float64)
        return bool(np.any(hi - lo < ROOM * step))


__all__ = ["integer", "real_number", "flag", "optional_flag", "need_name", "too_narrow", "ROOM",
           "NARROW"]
