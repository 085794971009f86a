"""The precision of a rule's arithmetic and of its accumulators: float32 at least.

A half-precision point (bfloat16, float16) keeps its dtype, and so does the vector a rule
returns; what a rule computes and accumulates is in the wider of float32 and the point's
dtype. In bfloat16, Adam's b2 = 0.999 rounds to 1 and a sum of squares stops growing (8 bits);
in float16 a square below 6e-8 is 0 and one above 65504 infinite. optax keeps its
accumulators in the parameters' dtype; here they are float32 (`wide_zeros`), and a saved
state of half-precision accumulators is widened when it is loaded (`lenses.training.saved`).
In float32 and float64 nothing is converted.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

tree_map = jax.tree_util.tree_map


def wide(dtype):
    """The dtype a rule's arithmetic and its accumulators use for vectors of `dtype`: the
    wider of float32 and `dtype`."""
    return jnp.promote_types(dtype, jnp.float32)


def wide_zeros(params):
    """Zeros shaped like `params`, in float32 at least: the accumulators of squares (Adam's
    and Riemannian Adam's moments, Adagrad's sum) of half-precision parameters, whose squares
    underflow (float16: below 6e-8) or whose sums stop growing (bfloat16: 8 bits) in half
    precision. optax keeps them in the parameters' dtype."""
    return tree_map(lambda a: jnp.zeros(jnp.shape(a), wide(jnp.result_type(a))), params)


def widen(tree):
    """Each leaf of `tree` in float32 at least (`wide`); float32 and float64 as they are."""
    return tree_map(lambda a: a.astype(wide(a.dtype)), tree)


def like(tree, ref):
    """Each leaf of `tree` cast to the dtype of the leaf of `ref` in its place: a rule's
    vector leaves it in the dtype of the vector it was given."""
    return tree_map(lambda a, r: a.astype(r.dtype), tree, ref)


def widened(fn, dtype, *leaves):
    """fn(*leaves) computed in the wider of float32 and `dtype`, cast to `dtype` at the end.

    A rule's numbers must not round to a half-precision point's dtype: in bfloat16, Adam's
    b2 = 0.999 is 1 (its bias correction 1 − b2^t is 0, and the step does nothing) and
    momentum β = 0.999 would never decay. In float32 and float64 nothing is converted."""
    return fn(*(a.astype(wide(dtype)) for a in leaves)).astype(dtype)


__all__ = ["wide", "wide_zeros", "widen", "like", "widened"]
