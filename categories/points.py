"""Points in words and by type: the static facts the one check (`Space.mismatch`) reads.

A point of a space is a pytree of real arrays (a tuple for a product, None for R^0). What a
trace knows of a value (its shape, its dtype, whether it has values now) is read here, once,
for every check of the library.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .errors import DomainError, KindError


def is_real_dtype(dtype, booleans: bool = False) -> bool:
    """Whether entries of this dtype are real numbers: a float (bfloat16 and the other
    ml_dtypes floats included, which numpy's own `np.issubdtype` does not count as numbers) or
    an integer dtype; with `booleans`, bool too (a target may be 0/1). The one test of real
    dtypes: every check of points, covectors and targets asks it."""
    try:
        dtype = np.dtype(dtype)
        real = bool(jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer))
    except TypeError:
        return False
    return real or (booleans and dtype == np.bool_)


def need_float_dtype(dtype, who: str):
    """dtype, if None (JAX's default float) or a floating dtype, which a coordinate of a
    tangent vector has; else `KindError` naming `who` (`R(2).zeros("x")`, `zeros(jnp.int32)`)."""
    if dtype is None:
        return None
    try:
        floating = bool(jnp.issubdtype(np.dtype(dtype), jnp.floating))
    except TypeError:
        floating = False
    if not floating:
        raise KindError(f"{who} needs a floating dtype (jnp.float32, jnp.float64, "
                        f"jnp.bfloat16, ...) or None, got {dtype!r}")
    return dtype


def real_dtype_mismatch(x) -> str | None:
    """None if the entries of x are real numbers by their type (a float or integer dtype, a
    Python int or float), else what they are instead: a bool, a complex number, another dtype.
    Static (dtypes are known under a trace)."""
    if isinstance(x, (bool, np.bool_)):
        return repr(x)
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return f"the complex number {x!r}" if isinstance(x, complex) else None
    return None if is_real_dtype(dtype) else f"an array of dtype {dtype}"


def check_finite(x, what: str, space) -> None:
    """Refuse (`DomainError`) a concrete floating point holding NaN or infinity."""
    dtype = getattr(x, "dtype", None)
    floating = isinstance(x, float) if dtype is None else bool(jnp.issubdtype(dtype, jnp.floating))
    if floating and is_concrete(x):
        a = np.asarray(x)
        finite = np.isfinite(a)
        if not finite.all():
            i = tuple(int(k) for k in np.argwhere(~finite)[0]) if a.ndim else ()
            raise DomainError(f"{what} is not a point of {space!r}: coordinate {i} is "
                              f"{a[i] if a.ndim else a}, not a real number")


def outside(what: str, space, x, margin) -> str:
    """Why the concrete point x lies outside the open set `space`, whose interior margins at x
    are `margin`: the coordinate furthest outside, by how much, and x itself if it is short."""
    flat = margin.reshape(-1)
    i = int(np.argmin(flat))
    idx = np.unravel_index(i, space.shape) if space.shape else ()
    shown = np.asarray(x)
    value = shown.reshape(-1)[i] if space.shape else shown
    point = f": {np.array2string(shown, precision=6)}" if shown.size <= 12 else ""
    return (f"{what} lies outside {space!r}: coordinate {tuple(int(k) for k in idx)} "
            f"= {float(value)!r} is outside by {0.0 - float(flat[i])!r} "
            f"(point of shape {tuple(space.shape)}{point})")


def is_concrete(x) -> bool:
    """True when every leaf of x has a value now (not a JAX tracer inside jit/vmap/grad)."""
    return not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(x))


def shape_of(x) -> tuple | None:
    """The array shape of x (() for a Python or NumPy scalar), or None if x is not an array."""
    shape = getattr(x, "shape", None)
    if shape is None and isinstance(x, (int, float, complex, np.number, np.bool_)):
        return ()
    return None if shape is None else tuple(shape)


def describe(x) -> str:
    """x in words for an error message: None, a tuple of n, an array of shape s, or its type."""
    if x is None:
        return "None"
    if isinstance(x, tuple):
        return "a tuple of " + str(len(x))
    shape = getattr(x, "shape", None)
    if shape is None:
        return f"{type(x).__name__} {x!r}"
    return f"an array of shape {tuple(shape)}"


__all__ = ["is_real_dtype", "real_dtype_mismatch", "check_finite", "is_concrete", "shape_of", "describe"]
