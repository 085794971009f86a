"""The parts an optimiser is chained from: sharp, a rule, the learning rate.

A part is anything with the two functions of an optax transformation,

    init(params) -> state
    update(updates, state, params=None, **extra) -> (updates', state'),

acting on vectors (pytrees shaped like the parameter point, None at R^0 slots). Every
`optax.GradientTransformation` is therefore a part, and every part below is an
`optax.GradientTransformationExtraArgs` (so it also goes into `optax.chain`). Parts that are
`GradientTransformationExtraArgs` receive the extra keyword argument `ctx` (a `Context`, for
data-dependent metrics); plain `GradientTransformation`s are called without it.

The first part of an optimiser is always `sharp(metric)`: it turns the covector p' into the
vector (p')♯ (a covector is not a vector). The rule parts then act on vectors, and
`scale_by_learning_rate(lr)` multiplies by −lr; the optimiser adds the result to the point.

Where optax's own implementation gives the library's numbers bit for bit it is used
(`scale_by_adagrad` is `optax.scale_by_rss`, `scale_by_learning_rate` is optax's); Adam's bias
correction in optax rounds differently in the last bits, and optax's `trace` keeps its sum
under another name, so `scale_by_adam` and `scale_by_momentum` are written here.
"""

from __future__ import annotations

import functools
import math
import types
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from categories import Covector, Vector
from categories.errors import CovectorError, HyperparameterError, KindError
from categories.linear import unwrap

from ..inner_products.metrics import Euclidean, Metric

tree_map = jax.tree_util.tree_map


# -- states ----------------------------------------------------------------------------------

class EmptyState(NamedTuple):
    """The state of a stateless part or optimiser: S = R^0."""


class MomentumState(NamedTuple):
    """m = Σ_k β^k v_{t−k}: the decayed sum of past vectors (optax's `trace`, under the name m)."""

    m: Any


# The part is optax's scale_by_rss, so its state is optax's: G = G₀ + Σ v² in `sum_of_squares`.
AdagradState = optax.ScaleByRssState


class AdamState(NamedTuple):
    """count t, first moment μ and second moment ν of the vectors."""

    count: Any
    mu: Any
    nu: Any


# -- the part protocol -----------------------------------------------------------------------

class Part(optax.GradientTransformationExtraArgs):
    """A part of an optimiser: the pair (init, update) of an optax transformation, with a name.

    `init(params) -> state`; `update(updates, state, params=None, **extra) -> (updates', state')`.
    Being an `optax.GradientTransformationExtraArgs`, a part also goes into `optax.chain`.

    `hyper` (a dict of numbers, or of pytrees of arrays) and `build` (`build(**hyper)` makes the same part again) make
    a part's hyperparameters values rather than constants: the training step passes them as
    arguments of its compiled function, so that parts equal but for their numbers share one
    compilation (as `optax.inject_hyperparams` does). A part without `build` is compared by
    identity.
    """

    def __new__(cls, init: Callable, update: Callable, name: str = "part", hyper=None,
                build: Callable | None = None):
        self = super().__new__(cls, init, update)
        self.name, self.hyper, self.build = name, dict(hyper or {}), build
        return self

    def key(self):
        """What the compiled step depends on: the builder and the names of the hyperparameters
        (their values are arguments), or the part itself (by identity) if it has no builder."""
        if self.build is None:
            return ("id", _Identity(self))
        return (self.build, tuple(sorted(self.hyper)))

    def rebuilt(self, hyper) -> "Part":
        """The same part with the hyperparameters `hyper` (traced values, inside the step)."""
        return self if self.build is None else self.build(**hyper)

    def __repr__(self):
        return self.name


class _Identity:
    """Hashes and compares by identity, and keeps its object alive while it is a key."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other):
        return isinstance(other, _Identity) and other.obj is self.obj

    def __hash__(self):
        return id(self.obj)


def value_key(x, depth: int = 0, exclude: tuple = ()):
    """A hashable key equal for configurations equal by value: numbers, strings, arrays (their
    dtype, shape and bytes), containers of them, inner products by their type and public
    fields, and functions by what they compute (their code, defaults and closures, keyed the
    same way); anything else by its own equality if it is hashable, else by identity. The
    fields named in `exclude` are left out of an inner product at the top level.

    An optax transformation is a pair of closures over its numbers: two `optax.rmsprop(0.1)`
    share a key, and two `optax.inject_hyperparams(optax.rmsprop)(learning_rate=r)` share one
    whatever r, since r lives in the state, not in `update`'s closure."""
    if x is None or isinstance(x, (bool, int, float, complex, str, bytes)):
        return x
    if isinstance(x, jax.core.Tracer) or depth > 16:  # (depth: a closure that holds itself)
        return ("id", _Identity(x))
    if isinstance(x, (np.ndarray, np.generic, jax.Array)):
        a = np.asarray(x)
        return ("array", a.dtype.str, a.shape, a.tobytes())
    inner = functools.partial(value_key, depth=depth + 1)
    if isinstance(x, (tuple, list)):
        return (type(x).__name__,) + tuple(inner(v) for v in x)
    if isinstance(x, dict):
        return ("dict",) + tuple(sorted((k, inner(v)) for k, v in x.items()))
    if isinstance(x, Metric):  # an inner product: its type and its public configuration
        return (type(x),) + tuple(sorted((k, inner(v)) for k, v in vars(x).items()
                                         if not k.startswith("_") and k not in exclude))
    if isinstance(x, types.FunctionType):
        try:
            cells = tuple(inner(c.cell_contents) for c in x.__closure__ or ())
        except ValueError:  # an empty cell: a function still being defined
            return ("id", _Identity(x))
        return ("fn", x.__code__, inner(x.__defaults__), inner(x.__kwdefaults__), cells)
    if isinstance(x, functools.partial):
        return ("partial", inner(x.func), inner(x.args), inner(x.keywords))
    try:
        hash(x)
        return x
    except TypeError:
        return ("id", _Identity(x))


def is_part(x) -> bool:
    """x has a callable `init` and a callable `update` (every optax transformation has)."""
    return callable(getattr(x, "init", None)) and callable(getattr(x, "update", None))


def _empty(params):
    return EmptyState()


# -- hyperparameters -------------------------------------------------------------------------

def _number(x, name: str, what: str) -> float | None:
    """float(x), or None for a traced value (nothing to check); refuse what is not a number."""
    if isinstance(x, jax.core.Tracer):
        return None
    if isinstance(x, (bool, str, bytes)):
        raise HyperparameterError(f"{name} must be {what}, got {x!r}")
    try:
        return float(x)
    except (TypeError, ValueError):
        raise HyperparameterError(f"{name} must be {what}, got {x!r}") from None


def check_learning_rate(lr, name: str = "lr"):
    """A learning rate is finite and > 0 (a schedule, a callable count ↦ rate, is not checked)."""
    if callable(lr):
        return lr
    x = _number(lr, name, "a finite number > 0 (or a schedule)")
    if x is not None and not (math.isfinite(x) and x > 0):
        raise HyperparameterError(f"the learning rate {name} must be finite and > 0, got {lr!r}")
    return lr


def check_decay(beta, name: str):
    """A decay rate (momentum β, Adam's b1, b2) lies in [0, 1)."""
    x = _number(beta, name, "a number in [0, 1)")
    if x is not None and not 0 <= x < 1:
        raise HyperparameterError(f"{name} must be in [0, 1), got {beta!r}")
    return beta


def check_positive(eps, name: str):
    """A finite number > 0 (eps)."""
    x = _number(eps, name, "a finite number > 0")
    if x is not None and not (math.isfinite(x) and x > 0):
        raise HyperparameterError(f"{name} must be finite and > 0, got {eps!r}")
    return eps


def check_non_negative(a, name: str):
    """A finite number ≥ 0 (Adagrad's initial accumulator value)."""
    x = _number(a, name, "a finite number ≥ 0")
    if x is not None and not (math.isfinite(x) and x >= 0):
        raise HyperparameterError(f"{name} must be finite and ≥ 0, got {a!r}")
    return a


# -- the library's parts ---------------------------------------------------------------------

class Sharp(Part):
    """The sharp map of an inner product: the covector p' ↦ the vector (p')♯ at `params`.

    `update` accepts a `Covector` (as the optimiser passes it, with its space) or a raw pytree
    (as `optax.chain` passes it), and the extra argument `ctx` for data-dependent metrics.
    The optimiser calls it at the point where the covector was taken (its lookahead).
    A metric whose `stateful` is true keeps its memory in this part's state
    (`metric.init_state(params)`, `metric.sharp_state(params, cov, ctx, state)`): K-FAC's
    running factors, decompositions and damping.
    """

    def __new__(cls, metric: Metric | None = None):
        metric = metric if metric is not None else Euclidean()
        if isinstance(metric, type):
            raise KindError(f"metric must be an inner product (an instance), got the class "
                            f"{metric.__name__}: pass {metric.__name__}(...), e.g. metric=Euclidean()")
        if not callable(getattr(metric, "sharp", None)):
            raise KindError(f"sharp needs an inner product (a Metric with .sharp), got {metric!r}")

        # A metric with memory (K-FAC's running factors) keeps it here, in this part's state:
        # `init_state(params)` and `sharp_state(params, cov, ctx, state) -> (vector, state')`.
        stateful = bool(getattr(metric, "stateful", False))

        def update(updates, state, params=None, ctx=None, **extra):
            if isinstance(updates, Vector):
                raise CovectorError("the sharp part takes the covector p', got a Vector: it is "
                                    "already a vector")
            cov = updates if isinstance(updates, Covector) else Covector(updates)
            if stateful:
                vec, state = metric.sharp_state(params, cov, ctx, state)
                return unwrap(vec), state
            return unwrap(metric.sharp(params, cov, ctx)), state

        init = metric.init_state if stateful else _empty  # type: ignore[attr-defined]  # a stateful metric's
        # The metric's own values (a damping, a diagonal's weights) are hyperparameters of
        # this part, passed to the compiled step as arguments like the learning rate.
        values = metric.hyper() if isinstance(metric, Metric) else {}
        build = (lambda **h: Sharp(metric.rebuilt(h))) if values else None
        self = super().__new__(cls, init, update, f"sharp({metric!r})", values, build)
        self.metric = metric
        return self

    def key(self):
        """The metric by value, its hyperparameters (`hyper`) left out: they are arguments."""
        return ("sharp", value_key(self.metric, exclude=tuple(self.hyper)))


def sharp(metric: Metric | None = None) -> Sharp:
    """The first part of every optimiser: p' ↦ (p')♯ for `metric` (Euclidean when None).

    Examples:
        >>> part = sharp(Diagonal(2.0))
        >>> updates, _ = part.update(Covector(jnp.array([1.0, 4.0])), part.init(None))
        >>> unwrap(updates).tolist()
        [0.5, 2.0]
    """
    return Sharp(metric)


def scale_by_momentum(beta: float = 0.9) -> Part:
    """Heavy-ball momentum: m ← v + β m, and m goes on (optax's `trace(β)`, state `MomentumState`).

    Examples:
        >>> part = scale_by_momentum(0.5)
        >>> v = jnp.array([1.0])
        >>> m1, s = part.update(v, part.init(v))
        >>> m2, s = part.update(v, s)
        >>> m1.tolist(), m2.tolist()
        ([1.0], [1.5])
    """
    check_decay(beta, "beta")

    def init(params):
        return MomentumState(tree_map(jnp.zeros_like, params))

    def update(updates, state, params=None, **extra):
        m = tree_map(lambda g, t: g + beta * t, updates, state.m)
        return m, MomentumState(m)

    return Part(init, update, f"scale_by_momentum(beta={beta})", dict(beta=beta),
                scale_by_momentum)


def scale_by_adagrad(initial_accumulator_value: float = 0.1, eps: float = 1e-7) -> Part:
    """Adagrad's rescaling: G ← G + v², v ↦ v / √(G + ε) (0 where G = 0): optax's `scale_by_rss`.

    Examples:
        >>> part = scale_by_adagrad(initial_accumulator_value=0.0)
        >>> v = jnp.array([3.0])
        >>> u, s = part.update(v, part.init(v))
        >>> print(np.round(u, 4))
        [1.]
    """
    check_non_negative(initial_accumulator_value, "initial_accumulator_value")
    check_positive(eps, "eps")
    tx = optax.scale_by_rss(initial_accumulator_value, eps)
    return Part(tx.init, lambda u, s, params=None, **extra: tx.update(u, s, params),
                f"scale_by_adagrad(initial_accumulator_value={initial_accumulator_value}, eps={eps})",
                dict(initial_accumulator_value=initial_accumulator_value, eps=eps),
                scale_by_adagrad)


def scale_by_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> Part:
    """Adam's rescaling: μ ← b1 μ + (1−b1) v, ν ← b2 ν + (1−b2) v², v ↦ μ̂ / (√ν̂ + ε), with
    the bias corrections μ̂ = μ / (1 − b1^t), ν̂ = ν / (1 − b2^t). Within rounding,
    `optax.scale_by_adam(b1, b2, eps)`.

    Examples:
        >>> part = scale_by_adam()
        >>> v = jnp.array([0.5, -2.0])
        >>> u, s = part.update(v, part.init(v))
        >>> print(np.round(u, 4))
        [ 1. -1.]
    """
    check_decay(b1, "b1")
    check_decay(b2, "b2")
    check_positive(eps, "eps")

    def init(params):
        zeros = tree_map(jnp.zeros_like, params)
        return AdamState(jnp.zeros((), jnp.int32), zeros, tree_map(jnp.zeros_like, params))

    def update(updates, state, params=None, **extra):
        count = state.count + 1
        mu = tree_map(lambda g, m: (1 - b1) * g + b1 * m, updates, state.mu)
        nu = tree_map(lambda g, n: (1 - b2) * (g * g) + b2 * n, updates, state.nu)

        def corrected(m, n):
            m_hat = m / (1 - b1 ** count.astype(m.dtype))
            n_hat = n / (1 - b2 ** count.astype(n.dtype))
            return m_hat / (jnp.sqrt(n_hat) + eps)

        return tree_map(corrected, mu, nu), AdamState(count, mu, nu)

    return Part(init, update, f"scale_by_adam(b1={b1}, b2={b2}, eps={eps})",
                dict(b1=b1, b2=b2, eps=eps), scale_by_adam)


def scale_by_learning_rate(lr) -> Part:
    """v ↦ −lr · v: the last part, after which the optimiser adds the vector to the point.

    `lr` is a finite number > 0, or a schedule (a callable count ↦ rate, as in optax; the
    part then keeps the count as its state). optax's own `scale_by_learning_rate`.

    Examples:
        >>> part = scale_by_learning_rate(0.1)
        >>> u, _ = part.update(jnp.array([1.0, 2.0]), part.init(None))
        >>> print(np.round(u, 4))
        [-0.1 -0.2]
    """
    check_learning_rate(lr)
    tx = optax.scale_by_learning_rate(lr)
    fixed = not callable(lr)  # a schedule is a function: compared by identity, not rebuilt
    return Part(tx.init, lambda u, s, params=None, **extra: tx.update(u, s, params),
                f"scale_by_learning_rate({lr!r})", dict(lr=lr) if fixed else None,
                scale_by_learning_rate if fixed else None)


__all__ = ["Part", "is_part", "Sharp", "sharp", "scale_by_momentum", "scale_by_adagrad",
           "scale_by_adam", "scale_by_learning_rate", "EmptyState", "MomentumState",
           "AdagradState", "AdamState"]
