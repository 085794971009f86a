"""Checks of what a lens is given, made before anything is traced: inputs, batches, covectors.

Public entry points (a lens's `forward`, `vjp` and `backward`, `batched`, `predict`,
training) check what they are given here and raise an error of the catalogue
(`categories.errors`) naming what was expected and what came; the shapes of a point are
asked of its space (`Space.mismatch`, the one check). Inside a compiled step nothing is
checked again.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from categories import Product, Smooth, Space, Vector, check_composable
from categories.spaces import need_space
from categories.numbers import flag, need_name, optional_flag
from categories.errors import CovectorError, DomainError, KindError, ShapeError, SpaceMismatch
from categories.linear import unwrap
from categories.points import describe, real_dtype_mismatch

from .composable import Composable

tree_map = jax.tree_util.tree_map


def as_real(space: Space, a):
    """a with its integer leaves as floats (the default float type) where they are points of
    R^n, whose covectors must be real too (JAX would give integers a `float0` one); leaves on
    a discrete space (`discrete`: token ids, PRNG keys) keep their integer dtype, since
    rounding them changes the point (a key in float32 is another key), and their covector is
    JAX's float0 zero."""
    if isinstance(space, Product):
        if not isinstance(a, tuple):
            return a
        return tuple(as_real(f, x) for f, x in zip(space.factors, a))
    if space.discrete or a is None:
        return a
    return tree_map(lambda v: jnp.asarray(v, jnp.result_type(float))
                    if jnp.issubdtype(jnp.result_type(v), jnp.integer) else v, a)


def need_lens(x, who: str) -> None:
    """Refuse (`KindError`) what is neither a lens nor a family of lenses."""
    if not isinstance(x, Composable):
        raise KindError(f"{who} needs a lens (e.g. dense(2, 3)) or a family of lenses "
                        f"(e.g. tanh), got {type(x).__name__} {x!r}")


def need_fixed(x, who: str):
    """The lens x, where a lens with fixed spaces belongs: `KindError` naming `who` for what is
    not a lens, and for a family (saying how to fix it with `.at`)."""
    need_lens(x, who)
    return x.fixed(who)


def need_chain(parts, who: str) -> tuple:
    """parts as a tuple of lenses that compose in sequence, where a chain's parts belong:
    `KindError` naming `who` for None, a string, a dict, an empty list, or a list holding what
    is not a lens with fixed spaces (naming its index); `SpaceMismatch` naming both sides where
    one part's codomain is not the next one's domain."""
    if not isinstance(parts, (list, tuple)) or not parts:
        raise KindError(f"{who} needs a non-empty list of lenses (e.g. [dense(2, 3), "
                        f"dense(3, 1)]), got {type(parts).__name__} {parts!r:.60}")
    fixed = tuple(need_fixed(x, f"{who} (part {i})") for i, x in enumerate(parts))
    for f, g in zip(fixed, fixed[1:]):
        check_composable(f, g)
    return fixed


def need_callable(fn, who: str, optional: bool = False) -> None:
    """Refuse (`KindError`, naming `who`) what is not a function; None too, unless `optional`
    (where None means a default: a derived backward part, the space's own init)."""
    if optional and fn is None:
        return
    if not callable(fn):
        raise KindError(f"{who} must be a function, got {type(fn).__name__} {fn!r:.40}")


def need_reparam(r, init, name: str, P: Space | None) -> None:
    """Refuse (`KindError`) a reparameterisation of the lens `name` (parameters P) along what
    is not a smooth map, or with an init that is not a function; `SpaceMismatch` along a map
    r : Q → P' whose codomain is not P (P None: a family's, known member by member)."""
    if not isinstance(r, Smooth):
        raise KindError(f"{name}.reparam needs a smooth map r : Q → {'P' if P is None else repr(P)} "
                        f"(a Smooth), got {type(r).__name__} {r!r:.40}")
    need_callable(init, f"the init of {name}.reparam", optional=True)
    if P is not None and r.cod != P:
        raise SpaceMismatch(f"cannot reparameterise {name} (parameters {P!r}) along "
                            f"{r.name} : {r.dom!r} → {r.cod!r}")


def check_init(p, param: Space, name: str):
    """p, the point the init of the lens `name` gave, if it is a point of its parameter object
    `param`: `SpaceMismatch` for another structure or shape, `DomainError` for NaN, infinity
    or (where the values are concrete) a point outside the open set."""
    why = param.mismatch(p, "its value")
    if why:
        raise SpaceMismatch(f"the init of {name} does not give a point of its parameter "
                            f"object {param!r}: {why}")
    return param.check(p, f"the point the init of {name} gives")


def check_cotangent(space: Space, c, what: str, lead: tuple = ()) -> None:
    """Refuse (`CovectorError`) a Vector, or a value whose leaves are not shaped like a
    cotangent vector on `space` (with the leading axes `lead`, e.g. a batch): a covector is
    a `Covector` or, where documented, its raw value. Static: shapes and dtypes only."""
    if isinstance(c, Vector):
        raise CovectorError(f"{what} is a Vector, but a covector belongs here: a vector is not "
                            "a covector (the flat map of an inner product turns one into the other)")
    why = space.tangent.mismatch(unwrap(c), "its value", tuple(lead))
    if why:
        raise CovectorError(f"{what} is not a covector on {space!r}: {why}")


def check_finite_covector(c, what: str) -> None:
    """Refuse (`CovectorError`) a concrete covector holding NaN or infinity (under a trace
    there are no values: a training step records a non-finite covector as a fault)."""
    for i, leaf in enumerate(jax.tree_util.tree_leaves(c)):
        if isinstance(leaf, jax.core.Tracer) or not jnp.issubdtype(jnp.result_type(leaf),
                                                                     jnp.inexact):
            continue
        a = np.asarray(leaf)
        if not np.isfinite(a).all():
            j = tuple(int(k) for k in np.argwhere(~np.isfinite(a))[0])
            raise CovectorError(f"{what} holds {a[j]} at index {j} (leaf {i}), not a real number")


def _check_batch_values(S: Space, x, who: str, where: str) -> None:
    """Refuse a concrete batch holding NaN or infinity (`ShapeError`) or a row outside the open
    subset S (`DomainError` naming the row), as `S.check` asks of one example."""
    if jnp.issubdtype(x.dtype, jnp.floating):
        finite = np.isfinite(np.asarray(x))
        if not finite.all():
            i = tuple(int(k) for k in np.argwhere(~finite)[0])
            raise ShapeError(f"{who}: the batch{where} holds {np.asarray(x)[i]} at index {i}, "
                             "not a real number")
    if type(S).interior_margin is not Space.interior_margin:  # an open subset: tokens, a box
        inside = np.asarray(jax.vmap(S.interior_margin)(jnp.asarray(x))) > 0
        if not inside.all():
            i = tuple(int(k) for k in np.argwhere(~inside)[0])
            raise DomainError(f"{who}: example {i[0]} of the batch{where} is not a point of "
                              f"{S!r}: coordinate {i[1:]} is {np.asarray(x)[i]}")
    if S.discrete:  # one row says what every row's dtype is (raw keys must be uint32)
        S.check(x[0], f"{who}: example 0 of the batch{where}")


def check_batch(dom: Space, X, who: str, concrete_values: bool = False) -> int:
    """The number of examples n ≥ 1 if X is a batch of points of `dom` (shape (n, *dom.shape),
    real numbers; a tuple of such batches, of one n, for a product domain), else `ShapeError`
    naming `who`, the shape expected and the shape given. With `concrete_values`, NaN and
    infinity are refused too (host data only; a training step records them as a fault)."""
    found = []

    def walk(S, x, where):
        if isinstance(S, Product):
            if not isinstance(x, tuple) or len(x) != len(S.factors):
                raise ShapeError(f"{who}: the batch{where} for the domain {S!r} must be a tuple "
                                 f"of {len(S.factors)} batches, got {describe(x)}")
            for i, (F, y) in enumerate(zip(S.factors, x)):
                walk(F, y, f"{where}[{i}]")
            return
        if S.is_terminal:
            if x is not None:
                raise ShapeError(f"{who}: the batch{where} for R^0 must be None, got {describe(x)}")
            return
        shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
        want = f"(n, *{tuple(S.shape)})"
        if shape is None or dtype is None:
            raise ShapeError(f"{who}: the batch{where} must be an array of shape {want} "
                             f"for the domain {S!r}, got {describe(x)}")
        shape = tuple(shape)
        if real_dtype_mismatch(x):  # the one test of real entries (`Space.mismatch` asks it too)
            typed = jnp.issubdtype(dtype, jax.dtypes.prng_key)  # typed keys: their data is
            raise ShapeError(f"{who}: the batch{where} must hold real numbers, got dtype {dtype}"
                             + (": pass jax.random.key_data(keys)" if typed else ""))
        if len(shape) != 1 + len(S.shape) or shape[1:] != tuple(S.shape):
            raise ShapeError(f"{who}: the batch{where} must have shape {want} for the domain "
                             f"{S!r} (one row per example), got shape {shape}")
        if shape[0] < 1:
            raise ShapeError(f"{who}: the batch{where} is empty (shape {shape}); a batch needs "
                             "at least one example")
        found.append((where, shape[0]))
        if concrete_values and not isinstance(x, jax.core.Tracer):
            _check_batch_values(S, x, who, where)

    walk(dom, X, "")
    sizes = {n for _, n in found}
    if len(sizes) > 1:
        raise ShapeError(f"{who}: the batches of the factors of {dom!r} have different numbers "
                         f"of examples: " + ", ".join(f"X{w}: {n}" for w, n in found))
    return found[0][1] if found else 0


__all__ = ["as_real", "need_lens", "need_fixed", "need_chain", "need_callable", "need_reparam", "need_space", "flag", "optional_flag", "need_name", "check_init", "check_cotangent", "check_finite_covector", "check_batch"]
