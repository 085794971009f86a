"""Faults of a step: NaN/inf, a point outside the open parameter object, None for a slot.

A step whose covector or new point is not finite raises `NonFiniteError` (a
`FloatingPointError`); a new point outside the open parameter object raises `DomainError`,
or, with `on_domain_error="backtrack"`, the move is halved (inside `jit`, by
`lax.while_loop`) until the point lies in the set, at most `max_halvings` times. Backtracking
shortens only the move: the optimiser's state advances as computed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from categories import DomainError, Space
from categories.errors import KindError, NonFiniteError, SpaceMismatch
from categories.slots import slot_mismatch, slots

tree_map = jax.tree_util.tree_map


# -- faults ----------------------------------------------------------------------------------

def slot_names(model) -> list[str]:
    """Human names of the parameter slots of a model (a `ParaLens`): its components for a
    chain."""
    if len(model.parts) > 1:
        return [f"slot {i} ({part.name})" for i, part in enumerate(model.parts)]
    return [f"slot 0 ({model.name})"]


def check_params(space: Space, p, names=None) -> None:
    """Refuse (`SpaceMismatch`) a parameter point not shaped as a point of `space` (None in a
    parameterised slot, a tuple of another length, a leaf of another shape), naming the slot;
    `space` itself must be a space (`KindError`)."""
    if not isinstance(space, Space):
        raise KindError(f"the parameter object (space=) must be a Space, such as model.param, "
                        f"got {type(space).__name__} {space!r}")
    why = slot_mismatch(space, p, "the point of {}", names)
    if why:
        none = " (a parameterised layer cannot step without its parameters: only parameterless " \
               "R^0 slots take None)" if why.endswith("got None") else ""
        raise SpaceMismatch(why + none)


def check_floating(space: Space | None, p, names=None, what: str = "the initial parameters") -> None:
    """Refuse (`DomainError`) a parameter point with a leaf of integer dtype, naming the slot
    and the dtype: a step moves a point by real amounts, and JAX gives an integer leaf no
    derivative (float0), so it could never move. (Its shape is `check_params`' question.)
    `space` None: the point is one slot (an optimiser's, whose point may be any pytree)."""
    pairs = slots(space, p) if space is not None else [(None, p)]
    names = names if names is not None and len(names) == len(pairs) else [
        f"slot {i}" for i in range(len(pairs))]
    for name, (_, q) in zip(names, pairs):
        for leaf in jax.tree_util.tree_leaves(q):
            dtype = jnp.result_type(leaf)
            if not jnp.issubdtype(dtype, jnp.inexact):
                raise DomainError(
                    f"{what}: {name} holds an array of dtype {dtype}, but a training step moves "
                    "parameters by real amounts and JAX differentiates only floating-point "
                    "values: cast them to floating point, e.g. "
                    "jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), params)")


def slot_maxima(x, space: Space | None):
    """max |x| per slot of `space` (one slot if None): finite exactly when every coordinate
    of the slot is; 0 for a slot without coordinates. One reduction per leaf, nothing copied."""
    values = [x] if space is None else [v for _, v in slots(space, x)]
    out = []
    for v in values:
        leaves = [jnp.max(jnp.abs(a)) for a in jax.tree_util.tree_leaves(v) if jnp.size(a)]
        out.append(jnp.max(jnp.stack(leaves)) if leaves else jnp.zeros(()))
    return jnp.stack(out)


def finite_flags(x, space: Space | None):
    """Per slot, a traceable boolean: every coordinate is finite (read off `slot_maxima`)."""
    return jnp.isfinite(slot_maxima(x, space))


def raise_outside(space: Space, p_new, names=None, note: str = "") -> None:
    """Raise the DomainError that names the slot (and coordinate) of p_new outside `space`."""
    pairs = slots(space, p_new)
    names = names if names is not None and len(names) == len(pairs) else [
        f"slot {i}" for i in range(len(pairs))]
    for name, (s, q) in zip(names, pairs):
        try:
            s.check(q, f"the updated point of {name}")
        except DomainError as e:
            raise DomainError(f"the update leaves the parameter object: {e}{note}") from None
    raise DomainError(f"the update leaves the parameter object {space!r}{note}")


def raise_non_finite(cov_ok, new_ok, names) -> None:
    bad = [("covector", i) for i, ok in enumerate(cov_ok) if not ok] + \
          [("new point", i) for i, ok in enumerate(new_ok) if not ok]
    what, i = bad[0]
    name = names[i] if names is not None and i < len(names) else f"slot {i}"
    raise NonFiniteError(f"the {what} of {name} contains NaN or infinity; the step is refused "
                         "and the parameters are left as they were")


def is_concrete(x) -> bool:
    """Every leaf has a value now (not a tracer inside jit/vmap/grad)."""
    return not any(isinstance(a, jax.core.Tracer) for a in jax.tree_util.tree_leaves(x))


def backtrack(space, p, p_new, inside, max_halvings):
    """Halve the move p'' − p until p + t (p'' − p) lies in `space` (at most max_halvings)."""
    move = tree_map(lambda a, b: b - a, p, p_new)

    def cond(c):
        k, _, ok = c
        return jnp.logical_and(jnp.logical_not(ok), k < max_halvings)

    def body(c):
        k, t, _ = c
        t = t * 0.5
        return k + 1, t, space.indicator(tree_map(lambda a, d: a + t * d, p, move))

    leaves = jax.tree_util.tree_leaves(p)
    dtype = leaves[0].dtype if leaves else jnp.float32
    k, t, ok = lax.while_loop(cond, body, (jnp.asarray(0), jnp.asarray(1.0, dtype), inside))
    # At t = 1 keep p'' itself (bit for bit); otherwise the shortened move.
    p_out = tree_map(lambda a, b, d: jnp.where(k == 0, b, a + t * d), p, p_new, move)
    return p_out, ok


__all__ = ["slot_names", "check_params", "check_floating", "finite_flags", "raise_outside", "raise_non_finite",
           "is_concrete", "backtrack"]
