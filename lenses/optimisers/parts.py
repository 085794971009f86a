"""The parts an optimiser is chained from: sharp, a rule, the learning rate.

A part is a value (`lenses.values.Value`: an immutable pytree whose numbers are leaves) with
the two methods of an optax transformation,

    init(params) -> state
    update(updates, state, params=None, **extra) -> (updates', state'),

acting on vectors (pytrees shaped like the parameter point, None at R^0 slots). Its numbers
(a learning rate, a momentum, Adam's b1, b2, eps, its inner product's damping) are fields,
read by `update` from the part itself: given to a compiled function, they are traced, and
parts that differ only in their numbers share its compilation. Every part is also an
`optax.GradientTransformationExtraArgs`, so it goes into `optax.chain`, which passes it the
extra keyword argument `ctx` (a `Context`, for data-dependent metrics).

The first part of an optimiser is always `sharp(metric)`: it turns the covector p' into the
vector (p')♯ (a covector is not a vector). The rule parts then act on vectors, and
`scale_by_learning_rate(lr)` multiplies by −lr; the optimiser adds the result to the point.
An optax transformation (a pair of closures over its numbers) becomes the part `Foreign`.

Where optax's own implementation gives the library's numbers bit for bit it is used
(`scale_by_adagrad` is `optax.scale_by_rss`, `scale_by_learning_rate` is optax's); Adam's bias
correction in optax rounds differently in the last bits, and optax's `trace` keeps its sum
under another name, so `scale_by_adam` and `scale_by_momentum` are written here.
"""

from __future__ import annotations

import re
from typing import Any, Callable, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import optax

from categories import Covector, Vector
from categories.errors import CovectorError, HyperparameterError, KindError, UnsupportedError
from categories.linear import unwrap
from categories.numbers import real_number

from ..inner_products.metrics import Borrowed, Euclidean, Metric
from ..values import Identity, Value, assign, static, structure_key
from .precision import like, wide_zeros, widen, widened

tree_map = jax.tree_util.tree_map


# -- states ----------------------------------------------------------------------------------

class EmptyState(NamedTuple):
    """The state of a stateless part: S = R^0."""


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

class Part(Value, optax.GradientTransformationExtraArgs):
    """A part of an optimiser: an immutable pytree with `init(params) -> state` and
    `update(updates, state, params=None, **extra) -> (updates', state')`.

    Its numbers are its fields (leaves); `static()` fields are its structure. Being an
    `optax.GradientTransformationExtraArgs` as well, a part goes into `optax.chain`.

    Examples:
        >>> from lenses.optimisers import EmptyState, Part
        >>> class Halve(Part):
        ...     def init(self, params): return EmptyState()
        ...     def update(self, updates, state, params=None, **extra):
        ...         return jax.tree_util.tree_map(lambda u: u / 2, updates), state
        >>> part = Halve()
        >>> u, _ = part.update(jnp.array([2.0]), part.init(None))
        >>> u.tolist(), part == Halve()
        ([1.0], True)
    """

    shown_as: ClassVar[str] = ""  # the name of the function that builds it, for its repr

    def __new__(cls, *args, **kwargs):
        # the NamedTuple's two entries are not used: `init` and `update` are methods, and
        # optax reads a transformation's pair by iterating it (`__iter__`)
        return tuple.__new__(cls, (None, None))

    def __iter__(self):
        return iter((self.init, self.update))

    def init(self, params):
        """The part's initial state for the point `params`."""
        raise UnsupportedError(f"{type(self).__name__} must implement init (a part has init and update)")

    def update(self, updates, state, params=None, **extra):
        """(the vector out, the new state) for the vector `updates`."""
        raise UnsupportedError(f"{type(self).__name__} must implement update (a part has init and update)")

    def check_numbers(self) -> "Part":
        """The part itself, if its numbers are in range (`HyperparameterError` naming the one
        that is not): asked where a part is built, and again where an optimiser is built or
        stepped eagerly, since `dataclasses.replace` and `jax.tree_util.tree_map` make parts
        without asking. A traced number passes (nothing is known of it before it runs)."""
        return self

    def __repr__(self):
        if not self.shown_as:
            return Value.__repr__(self)
        return f"{self.shown_as}({', '.join(f'{k}={getattr(self, k)!r}' for k in self.value_fields[0])})"


class _ByCode:
    """An optax transformation compared by what its `update` computes (`structure_key`: its
    code and the values it closes over) and by the code of its `init`: two `optax.rmsprop(0.1)`
    are equal, and two `optax.inject_hyperparams(optax.rmsprop)(learning_rate=r)` are equal
    whatever r, which lives in the state, not in `update`'s closure."""

    __slots__ = ("tx", "key")

    def __init__(self, tx):
        init = getattr(tx.init, "__code__", None)
        self.tx = tx
        self.key = (structure_key(tx.update), init if init is not None else Identity(tx.init))

    def __eq__(self, other):
        return isinstance(other, _ByCode) and other.key == self.key

    def __hash__(self):
        return hash(self.key)


class Foreign(Part):
    """An optax transformation as a part. Its numbers live in its closures, not in fields, so
    the whole transformation is structure (a narrow key, `_ByCode`): equal transformations
    share a compilation, and one of other numbers compiles anew.

    Examples:
        >>> import optax
        >>> from lenses.optimisers import Foreign
        >>> part = Foreign(optax.sgd(0.5))
        >>> u, _ = part.update(jnp.array([2.0]), part.init(jnp.zeros(1)))
        >>> u.tolist(), part == Foreign(optax.sgd(0.5)), part == Foreign(optax.sgd(0.1))
        ([-1.0], True, False)
    """

    transformation: Any = static()

    def __init__(self, tx):
        if isinstance(tx, Part) or not is_part(tx):
            raise KindError(f"Foreign wraps an optax transformation (callable init and update), "
                            f"got {tx!r}" + (": a part goes into chain as it is"
                                             if isinstance(tx, Part) else ""))
        assign(self, transformation=_ByCode(tx))

    @property
    def tx(self):
        """The optax transformation."""
        return self.transformation.tx

    def init(self, params):
        return self.tx.init(params)

    def update(self, updates, state, params=None, **extra):
        try:
            if isinstance(self.tx, optax.GradientTransformationExtraArgs):
                return self.tx.update(updates, state, params, **extra)
            return self.tx.update(updates, state, params)
        except TypeError as e:  # where it is traced: nothing is added to a compiled step
            refuse_extra_args(e, "the optax transformation")
            raise

    def check_on(self, params, who: str) -> None:
        """Refuse (`HyperparameterError`) a transformation whose init or update fails on the
        parameters `params` and a covector of them, as the step will call it (the data's
        `ctx` aside). Traced for shapes only (`jax.eval_shape`): nothing is computed or compiled."""
        def once(p):
            return self.update(tree_map(jnp.zeros_like, p), self.tx.init(p), p, ctx=None)
        try:
            jax.eval_shape(once, params)
        except UnsupportedError:
            raise
        except Exception as e:  # noqa: BLE001 - whatever optax raises, named below
            why = f"{type(e).__name__}: {str(e).rstrip('.')}"
            raise HyperparameterError(
                f"{who}: the optax transformation fails on a covector of the parameters: {why}. "
                "Check its hyperparameters (a learning rate is a number or a schedule)") from e

    def __repr__(self):
        return repr(self.tx)


def refuse_extra_args(error: TypeError, who: str) -> None:
    """Refuse (`UnsupportedError`) a transformation whose update failed for want of keyword
    arguments the optimiser does not pass (`value=`, `grad=`, `value_fn=`: optax's
    `reduce_on_plateau`, `lbfgs`, line searches); any other error is left to the caller."""
    missing = re.search(r"missing \d+ required keyword-only arguments?: (.*)", str(error))
    if missing:
        raise UnsupportedError(
            f"{who} needs the extra argument(s) {missing.group(1)} in its update, which "
            "paralens does not pass (a step gives a transformation its updates, state, params "
            "and ctx only): transformations that read the loss's value or search along a line "
            "(optax.contrib.reduce_on_plateau, optax.lbfgs, ...) are not supported") from error


def is_part(x) -> bool:
    """x has a callable `init` and a callable `update` (every optax transformation has)."""
    return callable(getattr(x, "init", None)) and callable(getattr(x, "update", None))


def as_part(x) -> Part:
    """x itself if it is a `Part`, an optax transformation as a `Foreign` part."""
    return x if isinstance(x, Part) else Foreign(x)


# -- hyperparameters -------------------------------------------------------------------------

def check_learning_rate(lr, name: str = "lr"):
    """A learning rate is finite and > 0; a schedule (a callable count ↦ rate) is asked its
    rate at count 0, which must be finite and ≥ 0 (a warm-up starts at 0)."""
    if not callable(lr):
        real_number(lr, f"the learning rate {name}", above=0, traced=True, hint=" (or a schedule)")
        return lr
    try:
        first = lr(jnp.zeros((), jnp.int32))  # the count optax's scale_by_schedule passes
    except Exception as e:  # noqa: BLE001 - whatever the user's function raises, named here
        raise HyperparameterError(f"the learning rate schedule {name} fails at count 0: "
                                  f"{type(e).__name__}: {e} (a schedule maps the step count, "
                                  "an int32 array, to the rate)") from e
    real_number(first, f"the learning rate schedule {name} at count 0", least=0, traced=True)
    return lr


# -- the library's parts ---------------------------------------------------------------------

class Sharp(Part):
    """The sharp map of an inner product: the covector p' ↦ the vector (p')♯ at `params`.

    `update` accepts a `Covector` (as the optimiser passes it, with its space) or a raw pytree
    (as `optax.chain` passes it), and the extra argument `ctx` for data-dependent metrics.
    The optimiser calls it at the point where the covector was taken (its lookahead).
    A metric whose `stateful` is true keeps its memory in this part's state
    (`metric.init_state(params)`, `metric.sharp_state(params, cov, ctx, state)`): K-FAC's
    running factors, decompositions and damping. The metric's numbers (a damping, a
    diagonal's weights) are leaves of this part.
    """

    metric: Metric

    def __init__(self, metric: Metric | None = None):
        metric = metric if metric is not None else Euclidean()
        if isinstance(metric, type):
            raise KindError(f"metric must be an inner product (an instance), got the class "
                            f"{metric.__name__}: pass {metric.__name__}(...), e.g. metric=Euclidean()")
        if not isinstance(metric, Metric):
            if not callable(getattr(metric, "sharp", None)):
                raise KindError(f"sharp needs an inner product (a Metric with .sharp), got {metric!r}")
            metric = Borrowed(metric)  # an object with a sharp map: a constant of the step
        self.metric = metric

    def init(self, params):
        return self.metric.init_state(params) if self.metric.stateful else EmptyState()

    def update(self, updates, state, params=None, ctx=None, **extra):
        if isinstance(updates, Vector):
            raise CovectorError("the sharp part takes the covector p', got a Vector: it is "
                                "already a vector")
        cov = updates if isinstance(updates, Covector) else Covector(updates)
        if self.metric.stateful:
            vec, state = self.metric.sharp_state(params, cov, ctx, state)
            return unwrap(vec), state
        return unwrap(self.metric.sharp(params, cov, ctx)), state

    def check_numbers(self):
        self.metric.check_numbers()  # a metric's numbers are this part's leaves
        return self

    def __repr__(self):
        return f"sharp({self.metric!r})"


def sharp(metric: Metric | None = None) -> Sharp:
    """The first part of every optimiser: p' ↦ (p')♯ for `metric` (Euclidean when None).

    Examples:
        >>> part = sharp(Diagonal(2.0))
        >>> updates, _ = part.update(Covector(jnp.array([1.0, 4.0])), part.init(None))
        >>> unwrap(updates).tolist()
        [0.5, 2.0]
    """
    return Sharp(metric)


class ScaleByMomentum(Part):
    """m ← v + β m, and m goes on (the part `scale_by_momentum` makes)."""

    beta: Any
    shown_as: ClassVar[str] = "scale_by_momentum"

    def init(self, params):
        return MomentumState(tree_map(jnp.zeros_like, params))

    def update(self, updates, state, params=None, **extra):
        beta = self.beta
        m = tree_map(lambda g, t: widened(lambda g, t: g + beta * t, t.dtype, g, t),
                     updates, state.m)
        return m, MomentumState(m)

    def check_numbers(self):
        real_number(self.beta, "beta", least=0, below=1, traced=True)
        return self


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
    return ScaleByMomentum(beta).check_numbers()


class ScaleByAdagrad(Part):
    """G ← G + v², v ↦ v / √(G + ε) (the part `scale_by_adagrad` makes: optax's `scale_by_rss`)."""

    initial_accumulator_value: Any
    eps: Any
    shown_as: ClassVar[str] = "scale_by_adagrad"

    def _optax(self):
        return optax.scale_by_rss(self.initial_accumulator_value, self.eps)

    def init(self, params):  # G in float32 at least (`wide_zeros`), G₀ as optax's
        return AdagradState(tree_map(lambda z: z + self.initial_accumulator_value,
                                     wide_zeros(params)))

    def update(self, updates, state, params=None, **extra):
        out, state = self._optax().update(widen(updates), state, params)
        return like(out, updates), state

    def check_numbers(self):
        real_number(self.initial_accumulator_value, "initial_accumulator_value", least=0,
                    traced=True)
        real_number(self.eps, "eps", above=0, traced=True)
        return self


def scale_by_adagrad(initial_accumulator_value: float = 0.1, eps: float = 1e-7) -> Part:
    """Adagrad's rescaling: G ← G + v², v ↦ v / √(G + ε) (0 where G = 0): optax's `scale_by_rss`.

    Examples:
        >>> part = scale_by_adagrad(initial_accumulator_value=0.0)
        >>> v = jnp.array([3.0])
        >>> u, s = part.update(v, part.init(v))
        >>> print(np.round(u, 4))
        [1.]
    """
    return ScaleByAdagrad(initial_accumulator_value, eps).check_numbers()


class ScaleByAdam(Part):
    """Adam's rescaling with bias corrections (the part `scale_by_adam` makes)."""

    b1: Any
    b2: Any
    eps: Any
    shown_as: ClassVar[str] = "scale_by_adam"

    def init(self, params):
        return AdamState(*adam_start(params))

    def update(self, updates, state, params=None, **extra):
        count = state.count + 1
        g = widen(updates)  # squared in float32 at least: in float16 a square below 6e-8 is 0
        mu, nu = adam_moments(self.b1, self.b2, g, tree_map(lambda a: a * a, g), state.mu, state.nu)
        direction = adam_direction(self.b1, self.b2, self.eps, count, mu, nu)
        return like(direction, updates), AdamState(count, mu, nu)

    def check_numbers(self):
        check_adam(self.b1, self.b2, self.eps)
        return self


def check_adam(b1, b2, eps) -> None:
    """Adam's numbers (Riemannian Adam's too): b1, b2 in [0, 1), eps > 0."""
    real_number(b1, "b1", least=0, below=1, traced=True)
    real_number(b2, "b2", least=0, below=1, traced=True)
    real_number(eps, "eps", above=0, traced=True)


def adam_start(params):
    """Adam's state before its first step: the count 0 and both moments zero, in float32 at
    least (`wide_zeros`)."""
    return jnp.zeros((), jnp.int32), wide_zeros(params), wide_zeros(params)


def adam_moments(b1, b2, g, squares, mu, nu):
    """Adam's moments, written once: μ ← b1 μ + (1−b1) g, ν ← b2 ν + (1−b2) q, where q is the
    squared size of g (g² per coordinate; a Riemannian norm, `riemannian_adam`)."""
    return (tree_map(lambda a, m: widened(lambda a, m: (1 - b1) * a + b1 * m, m.dtype, a, m),
                     g, mu),
            tree_map(lambda q, n: widened(lambda q, n: (1 - b2) * q + b2 * n, n.dtype, q, n),
                     squares, nu))


def adam_direction(b1, b2, eps, count, mu, nu, scale=1.0):
    """scale · μ̂ / (√ν̂ + ε) with the bias corrections μ̂ = μ / (1 − b1^t), ν̂ = ν / (1 − b2^t)
    at step t = `count` (scale 1: Adam's rescaled vector; −lr: Riemannian Adam's move),
    computed in float32 at least (`widened`)."""
    def one(m, n):
        m_hat = m / (1 - b1 ** count.astype(m.dtype))
        n_hat = n / (1 - b2 ** count.astype(n.dtype))
        return scale * m_hat / (jnp.sqrt(n_hat) + eps)

    return tree_map(lambda m, n: widened(one, m.dtype, m, n), mu, nu)


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
    return ScaleByAdam(b1, b2, eps).check_numbers()


class ScaleByLearningRate(Part):
    """v ↦ −lr · v (the part `scale_by_learning_rate` makes): `lr` a number (a leaf), or
    `schedule` a callable count ↦ rate (structure, by identity; the state keeps the count)."""

    lr: Any
    schedule: Callable | None = static(default=None)

    def _optax(self):
        return optax.scale_by_learning_rate(self.schedule if self.schedule is not None else self.lr)

    def init(self, params):
        return self._optax().init(params)

    def update(self, updates, state, params=None, **extra):
        return self._optax().update(updates, state, params)

    def check_numbers(self):
        check_learning_rate(self.schedule if self.schedule is not None else self.lr)
        return self

    def __repr__(self):
        return f"scale_by_learning_rate({self.schedule if self.schedule is not None else self.lr!r})"


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
    return (ScaleByLearningRate(None, lr) if callable(lr) else ScaleByLearningRate(lr)).check_numbers()


__all__ = ["Part", "Foreign", "is_part", "as_part", "Sharp", "sharp", "scale_by_momentum",
           "scale_by_adagrad", "scale_by_adam", "scale_by_learning_rate", "ScaleByMomentum",
           "ScaleByAdagrad", "ScaleByAdam", "ScaleByLearningRate", "EmptyState",
           "MomentumState", "AdagradState", "AdamState"]
