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

import abc
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from categories import Covector, Product, Space, Vector
from categories.errors import CovectorError, KindError, MetricError, SlotError, UnsupportedError
from categories.linear import pairing, unwrap
from categories.points import is_real_dtype

from ..losses import LossFamily, loss_family
from ..values import Value, assign, static

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


class Metric(Value, abc.ABC):
    """An inner product g_p on the tangent spaces of a parameter object (abstract: `sharp`
    and `flat`, the two maps between covectors and vectors, are what a subclass gives).

    `sharp(p, cov, ctx)` takes a `Covector` (or its raw value, as `optax.chain` passes it)
    and refuses a `Vector` (`CovectorError`). A metric is a value (`lenses.values.Value`):
    its numbers (a damping, a diagonal's weights) are the leaves of a pytree, so a compiled
    training step, which takes the optimiser holding it as an argument, traces them, and a
    sweep over them compiles once.

    Examples:
        >>> class Halved(Metric):
        ...     def sharp(self, p, cov, ctx=None): return Vector(unwrap(cov) / 2, cov.space)
        ...     def flat(self, p, vec, ctx=None): return Covector(unwrap(vec) * 2, vec.space)
        >>> unwrap(Halved().sharp(None, Covector(jnp.array([2.0, 4.0]), R(2)))).tolist()
        [1.0, 2.0]
    """

    @property
    def stateful(self) -> bool:
        """Whether the metric keeps a memory in its optimiser's state (`init_state`,
        `sharp_state`); none does but K-FAC with its model."""
        return False

    def check_numbers(self) -> "Metric":
        """The metric itself, if its numbers are in range, else the catalogue's error naming
        the one that is not (`HyperparameterError` for a damping, `MetricError` for a
        diagonal's weights or a matrix): asked by its constructor, and again where an
        optimiser holding it is built, a `train_step` is built or an eager `step` is taken
        (`Part.check_numbers`), since `jax.tree_util.tree_map` makes metrics without asking.
        A traced number passes (nothing is known of it before it runs); a metric without
        numbers has nothing to check."""
        return self

    def check_model(self, model, who: str) -> None:
        """Refuse (an error of the catalogue) to serve the training of `model`; a metric tied
        to a model (K-FAC's `model=`) checks it is that one. Called when a step is built."""

    def init_state(self, p):
        """The memory of a stateful metric before the first step (`stateful`)."""
        raise UnsupportedError(f"{type(self).__name__} keeps no state")

    def sharp_state(self, p, cov, ctx, state):
        """(p')♯ and the state after this step, for a stateful metric (`stateful`)."""
        raise UnsupportedError(f"{type(self).__name__} keeps no state")

    @abc.abstractmethod
    def sharp(self, p, cov, ctx: Context | None = None) -> Vector:
        """(p')♯ at p: the vector of the covector `cov`."""

    @abc.abstractmethod
    def flat(self, p, vec, ctx: Context | None = None) -> Covector:
        """v♭ at p: the covector of the vector `vec`."""

    def inner(self, p, u, v, ctx: Context | None = None):
        """g_p(u, v) = ⟨u♭, v⟩."""
        return pairing(unwrap(self.flat(p, u, ctx)), unwrap(v))

    def retract(self, p, v, space: Space | None = None):
        """The point reached from p along the vector v: p + v (the straight line of R^n).

        Metrics that know their open set (`lenses.inner_products.geometry`) follow their geometry instead
        and stay inside it; the optimisers move the point only through this map."""
        return translate(p, unwrap(v))

    def __repr__(self):
        return type(self).__name__ + "()"


class Borrowed(Metric):
    """An inner product given as an object that is not a `Metric` but has `sharp` (and, if
    it has them, `flat` and `retract`): a constant of the training step, by identity.

    Examples:
        >>> from lenses.inner_products.metrics import Borrowed
        >>> class Halves:
        ...     def sharp(self, p, cov, ctx=None): return Vector(unwrap(cov) / 2)
        >>> unwrap(Borrowed(Halves()).sharp(None, Covector(jnp.array([2.0])))).tolist()
        [1.0]
    """

    given: Any = static()

    def __init__(self, given):
        self.given = given

    def sharp(self, p, cov, ctx=None):
        return self.given.sharp(p, cov, ctx)

    # the optional capabilities of an object that is not a Metric: read where they are used
    def flat(self, p, vec, ctx=None):
        if not callable(getattr(self.given, "flat", None)):
            raise UnsupportedError(f"{self.given!r} has no flat map")
        return self.given.flat(p, vec, ctx)

    def retract(self, p, v, space=None):
        own = getattr(self.given, "retract", None)
        return super().retract(p, v, space) if own is None else own(p, v, space)

    def __repr__(self):
        return repr(self.given)


def covector_value(cov, who: str = "sharp"):
    """The raw value of a covector given to a sharp map: a `Covector`, or (documented, as
    `optax.chain` passes it) its raw value; a `Vector` is refused (`CovectorError`)."""
    if isinstance(cov, Vector):
        raise CovectorError(f"{who} takes a covector, got a Vector: a vector is already a vector "
                            "(the sharp map turns a covector into one; flat goes back)")
    return _real_leaves(unwrap(cov), who, "a covector")


def _real_leaves(value, who: str, kind: str):
    """value, if every leaf holds real numbers (static: dtypes, also under jit), else
    `CovectorError` naming `who`, what it takes, and the leaf."""
    for leaf in jax.tree_util.tree_leaves(value):
        dtype = getattr(leaf, "dtype", None)
        real = (isinstance(leaf, (int, float)) and not isinstance(leaf, bool)) if dtype is None \
            else is_real_dtype(dtype)
        if not real:
            raise CovectorError(f"{who} takes {kind} of real numbers, got a leaf "
                                f"{type(leaf).__name__}" + (f" of dtype {dtype}" if dtype else ""))
    return value


def vector_value(vec, who: str = "flat"):
    """The raw value of a vector given to a flat map: a `Vector`, or its raw value; a
    `Covector` is refused (`CovectorError`): flat turns vectors into covectors."""
    if isinstance(vec, Covector):
        raise CovectorError(f"{who} takes a vector, got a Covector: a covector is already a "
                            "covector (the flat map turns a vector into one; sharp goes back)")
    return _real_leaves(unwrap(vec), who, "a vector")


def _real_weights(leaf, who: str):
    """Refuse (`MetricError`) weights that are not real, finite and positive, or whose sharp
    or flat would overflow: each weight w and 1/w must be normal numbers of the dtype the
    arithmetic uses (`_arithmetic_dtype`), so 1e-45 in float32 (subnormal, 1/w = inf) and
    2^1023 in float64 (w·2 = inf) are refused, not turned into infinities."""
    if isinstance(leaf, jax.core.Tracer):
        return
    a = np.asarray(leaf)
    if a.dtype.kind not in "fiu":
        raise MetricError(f"{who} must be real numbers, got dtype {a.dtype}")
    bad = ~(np.isfinite(a) & (a > 0))
    if bad.any():
        i = tuple(int(k) for k in np.argwhere(bad)[0]) if a.ndim else ()
        raise MetricError(f"{who} must be positive finite numbers, got {a[i] if a.ndim else a} "
                          f"at index {i}")
    dtype = _arithmetic_dtype(leaf)
    tiny = float(np.finfo(dtype).tiny)
    out = ~((a >= tiny) & (a <= 1 / tiny))
    if out.any():
        i = tuple(int(k) for k in np.argwhere(out)[0]) if a.ndim else ()
        raise MetricError(f"{who} must lie in [{tiny:.3g}, {1 / tiny:.3g}] in {dtype} (the dtype "
                          f"the sharp and flat compute in), so that w and 1/w are normal "
                          f"numbers: got {a[i] if a.ndim else a} at index {i}; rescale the "
                          f"weights (or enable float64)")


def _arithmetic_dtype(leaf) -> np.dtype:
    """The float dtype JAX computes with `leaf` in: its own float dtype as JAX holds it
    (float64 becomes float32 unless x64 is enabled), else JAX's default float."""
    kind = np.asarray(leaf).dtype
    if isinstance(leaf, (np.ndarray, np.generic, jax.Array)) and kind.kind == "f":
        return np.dtype(jax.dtypes.canonicalize_dtype(kind))
    return np.dtype(jnp.result_type(float))


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
        return Covector(vector_value(vec, "Euclidean().flat"), _space_of(vec))


class Diagonal(Metric):
    """g(u, v) = Σ w_i u_i v_i, the w_i the positive `weights` (a pytree shaped like the
    parameter point, or a scalar; None for R^0 slots).

    Examples:
        >>> unwrap(Diagonal(2.0).sharp(None, Covector(jnp.array([1.0, 2.0])))).tolist()
        [0.5, 1.0]
    """

    # the weights are leaves: a Diagonal of other weights (another seed's frozen Fisher
    # diagonal, a new scale) reuses the compiled step
    weights: Any

    def __init__(self, weights):
        assign(self, weights=weights)
        self.check_numbers()

    def check_numbers(self):
        for leaf in jax.tree_util.tree_leaves(self.weights):
            _real_weights(leaf, "Diagonal metric weights")
        return self

    def _apply(self, x, op):
        w = self.weights
        if not jax.tree_util.tree_leaves(x):
            return x
        if isinstance(w, (int, float)) or (hasattr(w, "ndim") and w.ndim == 0):
            return tree_map(lambda a: op(a, w), x)
        xs, ws = jax.tree_util.tree_structure(x), jax.tree_util.tree_structure(w)
        shapes = [jnp.shape(a) for a in jax.tree_util.tree_leaves(x)]
        wshapes = [jnp.shape(a) for a in jax.tree_util.tree_leaves(w)]
        if xs != ws or shapes != wshapes:
            raise MetricError(f"Diagonal metric weights must be shaped like the point (or be one "
                              f"number): weights of shapes {wshapes}, a (co)vector of shapes "
                              f"{shapes}")
        return tree_map(op, x, w)

    def sharp(self, p, cov, ctx=None):
        return Vector(self._apply(covector_value(cov, "Diagonal.sharp"), lambda a, w: a / w),
                      _space_of(cov))

    def flat(self, p, vec, ctx=None):
        return Covector(self._apply(vector_value(vec, "Diagonal.flat"), lambda a, w: a * w),
                        _space_of(vec))


class Constant(Metric):
    """g(u, v) = uᵀ G v for a fixed symmetric positive-definite G on the flattened parameter
    object (`space` given) or on one slot (`slot=i` of a product parameter point).
    The sharp map solves G x = p' by Cholesky; G is never inverted.

    Examples:
        >>> G = jnp.array([[2.0, 0.0], [0.0, 4.0]])
        >>> print(np.round(unwrap(Constant(G, R(2)).sharp(None, Covector(jnp.array([2.0, 2.0]), R(2)))), 4))
        [1.  0.5]
    """

    G: Any
    L: Any
    space: Space | None = static()
    slot: int | None = static()

    def __init__(self, G, space: Space | None = None, slot: int | None = None):
        if not isinstance(G, jax.core.Tracer):
            try:
                g = np.asarray(G)
            except (TypeError, ValueError):
                g = np.asarray(None)
            if g.dtype.kind not in "fiu" or g.size == 0:
                raise MetricError(f"Constant metric needs a non-empty square matrix of real "
                                  f"numbers (an array G of shape (n, n), n ≥ 1), got "
                                  f"{type(G).__name__} {G!r:.80}")
        G = jnp.asarray(G)
        if G.ndim != 2 or G.shape[0] != G.shape[1]:
            raise MetricError(f"Constant metric needs a square matrix, got shape {G.shape}")
        _symmetric(G)
        if space is not None and not isinstance(space, Space):
            raise KindError(f"Constant: space must be a Space (e.g. R(3)), got {space!r}")
        if slot is not None:
            slot = _slot(slot, space)
        if space is not None:  # both sizes known now: refused here, not at the first step
            # a slot is one of a Product's factors (`_slot` has checked that it is one)
            on = space if slot is None else space.factors[slot]  # type: ignore[attr-defined]  # see above
            where = f"{space!r}" if slot is None else f"slot {slot} of {space!r} ({on!r})"
            if G.shape[0] != on.size:
                raise MetricError(f"Constant metric on {where}: G is {G.shape[0]}×{G.shape[0]} "
                                  f"but {'the space' if slot is None else 'the slot'} has "
                                  f"{on.size} coordinates: give a {on.size}×{on.size} matrix")
        assign(self, G=G, L=jnp.linalg.cholesky(G), space=space, slot=slot)
        _definite(G, self.L)
        self.__dict__["_checked"] = True  # a mark, not a field of the value

    def check_numbers(self):
        """G symmetric positive definite and L its Cholesky factor (a `tree_map` over the
        metric could scale one and not the other: the sharp map reads L, the flat map G)."""
        G, L = self.G, self.L
        if isinstance(G, jax.core.Tracer) or isinstance(L, jax.core.Tracer) or \
                self.__dict__.get("_checked"):  # built by __init__, or checked: one eigvalsh
            return self
        if np.shape(G) != np.shape(L) or np.ndim(G) != 2:
            raise MetricError(f"Constant metric: G of shape {np.shape(G)} and its Cholesky "
                              f"factor of shape {np.shape(L)} must be one square matrix's")
        _symmetric(G)
        _definite(G, L)
        g, low = np.asarray(G, np.float64), np.asarray(L, np.float64)
        scale = max(float(np.abs(g).max()), 1e-300) * np.finfo(np.asarray(L).dtype).eps * 100
        if not (np.all(np.isfinite(low)) and np.all(np.abs(low @ low.T - g) <= scale * g.shape[0])):
            raise MetricError("Constant metric: L is not the Cholesky factor of G (L Lᵀ ≠ G): "
                              "build a new metric with Constant(G, ...), not by mapping over "
                              "its leaves")
        self.__dict__["_checked"] = True  # a mark, not a field of the value
        return self

    def _map(self, x, f):
        if self.slot is None:
            return unflatten_like(f(self._fits(ravel(x), "the (co)vector")), x)
        if not isinstance(x, tuple) or self.slot >= len(x):
            raise SlotError(f"Constant(slot={self.slot}) needs a point with a slot "
                            f"{self.slot}, got " + (f"a tuple of {len(x)}" if isinstance(x, tuple)
                                                    else "a point of one slot"))
        parts = list(x)
        parts[self.slot] = unflatten_like(
            f(self._fits(ravel(parts[self.slot]), f"slot {self.slot} of the (co)vector")),
            parts[self.slot])
        return tuple(parts)

    def _fits(self, flat, what: str):
        if flat.shape[0] != self.G.shape[0]:
            raise CovectorError(f"Constant metric of a {self.G.shape[0]}×{self.G.shape[0]} "
                                f"matrix: {what} has {flat.shape[0]} coordinates")
        return flat

    def sharp(self, p, cov, ctx=None):
        solve = lambda g: jax.scipy.linalg.cho_solve((self.L, True), g)  # noqa: E731
        return Vector(self._map(covector_value(cov, "Constant.sharp"), solve), _space_of(cov))

    def flat(self, p, vec, ctx=None):
        return Covector(self._map(vector_value(vec, "Constant.flat"), lambda v: self.G @ v),
                        _space_of(vec))


def _symmetric(G) -> None:
    """Refuse (`MetricError`) a concrete matrix that is not finite, real and symmetric."""
    if isinstance(G, jax.core.Tracer):
        return
    g = np.asarray(G)
    if g.dtype.kind not in "fiu" or not np.isfinite(g).all():
        raise MetricError(f"Constant metric needs a matrix of finite real numbers, got "
                          f"dtype {g.dtype}" + ("" if g.dtype.kind not in "fiu" else
                                                " with NaN or infinite entries"))
    asym = np.abs(g - g.T)
    if not np.all(asym <= 1e-10 * max(np.abs(g).max(), 1e-300)):
        i = tuple(int(k) for k in np.unravel_index(np.argmax(asym), g.shape))
        raise MetricError(f"Constant metric needs a symmetric matrix: G{list(i)} = "
                          f"{g[i]} but G{list(i[::-1])} = {g[i[::-1]]}")


def _definite(G, L) -> None:
    """Refuse (`MetricError`) a concrete G that is not positive definite (its Cholesky factor
    L failed, or G is singular at its dtype)."""
    if isinstance(L, jax.core.Tracer):
        return
    if bool(jnp.any(jnp.isnan(L))):
        raise MetricError("Constant metric needs a positive-definite matrix (Cholesky failed)")
    eig = jnp.linalg.eigvalsh(G)
    if not bool(eig[0] > G.shape[0] * jnp.finfo(L.dtype).eps * eig[-1]):
        raise MetricError("Constant metric needs a positive-definite matrix (G is singular or "
                          "indefinite)")


def _slot(slot, space):
    """`slot` as an int if it is a slot of `space` (when given), else `SlotError`."""
    if isinstance(slot, (bool, np.bool_)) or not isinstance(slot, (int, np.integer)) or slot < 0:
        raise SlotError(f"Constant: slot must be a non-negative integer, got {slot!r}")
    n = len(space.factors) if isinstance(space, Product) else None
    if space is not None and (n is None or slot >= n):
        raise SlotError(f"Constant: slot {slot} is not a slot of {space!r}"
                        + (f" (it has slots 0 to {n - 1})" if n else " (it has no slots)"))
    return int(slot)


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


__all__ = ["Metric", "Context", "Euclidean", "Diagonal", "Constant", "Borrowed", "ravel",
           "unflatten_like", "covector_value", "translate"]
