"""Inner products on parameter objects and their sharp maps.

A covector p' ∈ T*_pP is not a point of P; a chosen inner product g_p on T_pP turns it into the
unique vector representing it, (p')♯, with g_p((p')♯, v) = p'(v) for all v. The flat map is
the inverse, v ↦ g_p(v, −). With the Euclidean inner product the choice is invisible
(paper_notes/05-sharp-and-update.md).

Every metric has `sharp(p, p', ctx)`, `flat(p, v, ctx)`, `inner(p, u, v, ctx)` and
`retract(p, v, space)`, the point reached from p along v (p + v here; along the geometry of
the open set for the metrics of `geometry.py`). `ctx` is a
`Context` (model, loss family, batch) for metrics that depend on the data (`GaussNewton`,
`Fisher`, `KFAC`, defined in `natural.py`, which builds on this module); the constant ones
ignore it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp

from categories import Covector, Space, Vector
from categories.errors import CovectorError
from categories.linear import pairing, unwrap

from .losses import LossFamily, loss_family

tree_map = jax.tree_util.tree_map


@dataclass(frozen=True)
class Context:
    """What a data-dependent metric may look at: the model, the loss family and the batch.

    Examples:
        >>> ctx = Context(dense(2, 1), half_squared_error, jnp.ones((4, 2)), jnp.zeros((4, 1)))
        >>> ctx.x.shape, ctx.reduction
        ((4, 2), 'mean')
    """

    model: Any
    loss: LossFamily | Callable | None = None
    x: Any = None
    y: Any = None
    reduction: str = "mean"

    def __post_init__(self):
        # The family as an object, equal by value: `partial(softmax_cross_entropy, classes=3)`
        # becomes `softmax_cross_entropy(classes=3)`; a loss for one target is refused.
        if self.loss is not None:
            object.__setattr__(self, "loss", loss_family(self.loss))


class Metric:
    """An inner product g_p on the tangent spaces of a parameter object (abstract).

    `sharp(p, cov, ctx)` takes a `Covector` (or its raw value, as `optax.chain` passes it)
    and refuses a `Vector` (`CovectorError`).

    Examples:
        >>> class Halved(Metric):
        ...     def sharp(self, p, cov, ctx=None): return Vector(unwrap(cov) / 2, cov.space)
        ...     def flat(self, p, vec, ctx=None): return Covector(unwrap(vec) * 2, vec.space)
        >>> unwrap(Halved().sharp(None, Covector(jnp.array([2.0, 4.0]), R(2)))).tolist()
        [1.0, 2.0]
    """

    def sharp(self, p, cov, ctx: Context | None = None) -> Vector:
        raise NotImplementedError

    def flat(self, p, vec, ctx: Context | None = None) -> Covector:
        raise NotImplementedError

    def inner(self, p, u, v, ctx: Context | None = None):
        """g_p(u, v) = ⟨u♭, v⟩."""
        return pairing(unwrap(self.flat(p, u, ctx)), unwrap(v))

    def retract(self, p, v, space: Space | None = None):
        """The point reached from p along the vector v: p + v (the straight line of R^n).

        Metrics that know their open set (`lenses.geometry`) follow their geometry instead
        and stay inside it; the optimisers move the point only through this map."""
        return translate(p, unwrap(v))

    def __repr__(self):
        return type(self).__name__ + "()"


def covector_value(cov, who: str = "sharp"):
    """The raw value of a covector given to a sharp map: a `Covector`, or (documented, as
    `optax.chain` passes it) its raw value; a `Vector` is refused (`CovectorError`)."""
    if isinstance(cov, Vector):
        raise CovectorError(f"{who} takes a covector, got a Vector: a vector is already a vector "
                            "(the sharp map turns a covector into one; flat goes back)")
    value = unwrap(cov)
    for leaf in jax.tree_util.tree_leaves(value):  # static: dtypes, also under jit
        dtype = getattr(leaf, "dtype", None)
        real = (isinstance(leaf, (int, float)) and not isinstance(leaf, bool)) if dtype is None \
            else bool(jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer))
        if not real:
            raise CovectorError(f"{who} takes a covector of real numbers, got a leaf "
                                f"{type(leaf).__name__}" + (f" of dtype {dtype}" if dtype else ""))
    return value


def _space_of(x, default=None):
    return getattr(x, "space", default)


class Euclidean(Metric):
    """g(u, v) = Σ u_i v_i: sharp and flat are the identity on components.

    Examples:
        >>> unwrap(Euclidean().sharp(None, Covector(jnp.array([1.0, 2.0])))).tolist()
        [1.0, 2.0]
    """

    def sharp(self, p, cov, ctx=None):
        return Vector(covector_value(cov, "Euclidean().sharp"), _space_of(cov))

    def flat(self, p, vec, ctx=None):
        return Covector(unwrap(vec), _space_of(vec))


class Diagonal(Metric):
    """g(u, v) = Σ w_i u_i v_i with positive weights `w` (a pytree shaped like the parameter
    point, or a scalar; None for R^0 slots).

    Examples:
        >>> unwrap(Diagonal(2.0).sharp(None, Covector(jnp.array([1.0, 2.0])))).tolist()
        [0.5, 1.0]
    """

    def __init__(self, weights):
        leaves = jax.tree_util.tree_leaves(weights)
        if any(bool(jnp.any(jnp.asarray(w) <= 0)) for w in leaves if not isinstance(w, jax.core.Tracer)):
            raise ValueError("Diagonal metric weights must be positive")
        self.weights = weights

    def _apply(self, x, op):
        w = self.weights
        if not jax.tree_util.tree_leaves(x):
            return x
        if isinstance(w, (int, float)) or (hasattr(w, "ndim") and w.ndim == 0):
            return tree_map(lambda a: op(a, w), x)
        return tree_map(op, x, w)

    def sharp(self, p, cov, ctx=None):
        return Vector(self._apply(covector_value(cov, "Diagonal.sharp"), lambda a, w: a / w),
                      _space_of(cov))

    def flat(self, p, vec, ctx=None):
        return Covector(self._apply(unwrap(vec), lambda a, w: a * w), _space_of(vec))


class Constant(Metric):
    """g(u, v) = uᵀ G v for a fixed symmetric positive-definite G on the flattened parameter
    object (`space` given) or on one slot (`slot=i` of a product parameter point).
    The sharp map solves G x = p' by Cholesky; G is never inverted.

    Examples:
        >>> G = jnp.array([[2.0, 0.0], [0.0, 4.0]])
        >>> print(np.round(unwrap(Constant(G, R(2)).sharp(None, Covector(jnp.array([2.0, 2.0]), R(2)))), 4))
        [1.  0.5]
    """

    def __init__(self, G, space: Space | None = None, slot: int | None = None):
        G = jnp.asarray(G)
        if G.ndim != 2 or G.shape[0] != G.shape[1]:
            raise ValueError(f"Constant metric needs a square matrix, got shape {G.shape}")
        self.G, self.space, self.slot = G, space, slot
        self.L = jnp.linalg.cholesky(G)
        if not isinstance(self.L, jax.core.Tracer) and bool(jnp.any(jnp.isnan(self.L))):
            raise ValueError("Constant metric needs a positive-definite matrix (Cholesky failed)")
        eig = None if isinstance(self.L, jax.core.Tracer) else jnp.linalg.eigvalsh(G)
        if eig is not None and not bool(eig[0] > G.shape[0] * jnp.finfo(self.L.dtype).eps * eig[-1]):
            raise ValueError("Constant metric needs a positive-definite matrix (G is singular)")

    def _map(self, x, f):
        if self.slot is None:
            return unflatten_like(f(ravel(x)), x)
        parts = list(x)
        parts[self.slot] = unflatten_like(f(ravel(parts[self.slot])), parts[self.slot])
        return tuple(parts)

    def sharp(self, p, cov, ctx=None):
        solve = lambda g: jax.scipy.linalg.cho_solve((self.L, True), g)  # noqa: E731
        return Vector(self._map(covector_value(cov, "Constant.sharp"), solve), _space_of(cov))

    def flat(self, p, vec, ctx=None):
        return Covector(self._map(unwrap(vec), lambda v: self.G @ v), _space_of(vec))


def translate(p, v):
    """p + v, leaf by leaf, in p's dtype (None stays None): optax's `apply_updates`."""
    return tree_map(lambda a, d: jnp.asarray(a + d).astype(jnp.asarray(a).dtype), p, v)


def ravel(x):
    """A pytree's leaves as one flat vector (empty for None)."""
    leaves = jax.tree_util.tree_leaves(x)
    return jnp.concatenate([jnp.ravel(a) for a in leaves]) if leaves else jnp.zeros((0,))


def unflatten_like(flat, like):
    """Reshape a flat vector into the pytree structure of `like`."""
    leaves, treedef = jax.tree_util.tree_flatten(like)
    out, i = [], 0
    for leaf in leaves:
        n = jnp.size(leaf)
        out.append(jnp.reshape(flat[i:i + n], jnp.shape(leaf)))
        i += n
    return jax.tree_util.tree_unflatten(treedef, out)


__all__ = ["Metric", "Context", "Euclidean", "Diagonal", "Constant", "ravel", "unflatten_like",
           "covector_value", "translate"]
