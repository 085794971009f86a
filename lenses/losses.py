"""Losses: plain smooth maps L_y : C → R for a fixed target y (not lenses: no parameter object),
and loss families y ↦ L_y.

`dL(loss, c)` is the covector dL_c on C that starts the backward pass. For a batch the score
is the sum of per-example scores (`batch_loss`, with `reduction="mean"` offered explicitly).

A `LossFamily` is an object: it knows its per-example value `value(c, y)`, the outputs its
targets belong to (`output_space`) and which targets it accepts (`check_targets`), and,
where it is the negative log-likelihood of a predictive distribution p(y | z), that
distribution's Fisher information in the output (`output_fisher(z, v) = F(z) v`). Calling a
family at a target gives the plain map, `half_squared_error(y) : R^shape(y) → R`; calling it
with configuration only gives the configured family, `softmax_cross_entropy(classes=3)`.
Families are compared and hashed by value (type and configuration), so equal families share
compiled functions. `loss_family(x)` normalises what a user may pass where a family belongs
(a family, a `functools.partial` of one, or a plain callable y ↦ Smooth).
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from categories import Covector, R, Smooth, Space
from categories.errors import (HyperparameterError, ParalensError, KindError, ShapeError, TargetError,
                               TargetTypeError, UnsupportedError)

_MISSING = object()
# family ↦ {(target shape, dtype) ↦ output space}: held weakly, so a user's family is freed
_SPACES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _concrete(x) -> bool:
    return not any(isinstance(a, jax.core.Tracer) for a in jax.tree_util.tree_leaves(x))


def _as_array(Y, fam):
    """Y as an array (numpy for host data, kept as is for JAX arrays and tracers)."""
    if isinstance(Y, (jax.Array, np.ndarray)) or isinstance(Y, jax.core.Tracer):
        return Y
    try:
        return np.asarray(Y)
    except Exception as e:  # noqa: BLE001 — a ragged list, an object
        raise TargetTypeError(f"{fam!r}: targets must be an array, got {type(Y).__name__}") from e


def _shape_str(shape) -> str:
    return str(tuple(int(s) for s in shape))


class LossFamily:
    """y ↦ L_y : C → R, a family of smooth losses indexed by the target (abstract).

    Subclasses implement `value(c, y)`, the loss of one output c for one target y (a scalar,
    written with jax.numpy so that it can be differentiated). They may override:

    - `output_space(y)`: the space C of outputs a target y (only its shape and dtype are
      read) belongs to; by default R^shape(y).
    - `check_values(Y, batched)`: raise `ValueError` (the library's own: `TargetError`) for targets outside the family's domain
      (concrete values only); by default every value is accepted.
    - `output_fisher(z, v)`: F(z) v, the Fisher information in the output of the predictive
      distribution p(y | z) whose negative log-likelihood the loss is. Needed by `Fisher` and
      by `KFAC` (curvature="fisher"); `GaussNewton` needs only `value`.
    - `sample(key, z)`: a target drawn from p(y | z), for `KFAC(curvature="sampled")`.
    - `configure(**config)`: the family with other configuration (default: `dataclasses.replace`
      for a dataclass family; a family without configuration refuses any).

    Equality and hashing are by value: the type and the configuration (the dataclass fields,
    or the instance attributes of a plain subclass). Give a family hashable configuration so
    that equal families share compiled functions; with unhashable configuration a family is
    only equal to itself.

    Examples:
        >>> class AbsoluteError(LossFamily):
        ...     def value(self, c, y): return jnp.sum(jnp.abs(c - y))
        >>> float(AbsoluteError()(jnp.zeros(2))(jnp.array([1.0, -2.0])))
        3.0
    """

    name: str | None = None
    symbol: str | None = None  # the name of the loss for one target, e.g. "½‖· − y‖²"
    predictive: str | None = None  # a description of p(y | z), where the loss has one

    # -- what subclasses give ---------------------------------------------------------------
    def value(self, c, y):
        """L_y(c), a scalar, for one output c and one target y."""
        raise UnsupportedError(f"{type(self).__name__} must implement value(c, y)")

    def output_space(self, y) -> Space:
        """The space of outputs that a target y belongs to (only y's shape and dtype are read)."""
        return R(*tuple(y.shape))

    def check_values(self, Y, batched: bool = True) -> None:
        """Raise `ValueError` if a concrete target lies outside the family's domain."""

    def targets_ok(self, Y):
        """Per example of the batch Y, whether its target lies in the family's domain: the
        traceable form of `check_values`, which a compiled training step records as a fault
        instead of reading its targets back to the host; None when there is nothing a
        covector would not show (a NaN target gives a NaN covector, refused as such)."""
        return None

    def output_fisher(self, z, v):
        """F(z) v, the output-space Fisher information of the predictive distribution."""
        raise UnsupportedError(f"{self!r} knows no output-space Fisher information")

    @property
    def has_output_fisher(self) -> bool:
        """Whether this family supplies `output_fisher` (so that `Fisher` can use it)."""
        return type(self).output_fisher is not LossFamily.output_fisher

    def sample(self, key, z):
        """A target ŷ ~ p(· | z) drawn from the predictive distribution with the JAX key `key`
        (for the sampled Fisher of `KFAC(curvature="sampled")`); ŷ need only be a target
        `value(z, ŷ)` accepts."""
        raise UnsupportedError(f"{self!r} has no predictive distribution to sample targets from: "
                               "give the family a `sample(key, z)` method")

    @property
    def has_sampler(self) -> bool:
        """Whether this family supplies `sample` (so that `KFAC` can draw labels)."""
        return type(self).sample is not LossFamily.sample

    def configure(self, **config) -> "LossFamily":
        """This family with the configuration `config` changed."""
        if not config:
            return self
        if dataclasses.is_dataclass(self):
            names = {f.name for f in dataclasses.fields(self)}
            unknown = sorted(set(config) - names)
            if unknown:
                raise KindError(f"{self!r} has no configuration {', '.join(unknown)} "
                                f"(it has {', '.join(sorted(names)) or 'none'})")
            return dataclasses.replace(self, **config)
        raise KindError(f"{self!r} takes no configuration, got {', '.join(sorted(config))}")

    # -- derived ---------------------------------------------------------------------------
    def __call__(self, y=_MISSING, **config):
        """`family(y)`: the loss L_y : C → R for the target y (a `Smooth`); `family(**config)`:
        the configured family; `family(y, **config)`: the configured family's loss at y."""
        fam = self.configure(**config)
        if y is _MISSING:
            return fam
        return fam.at(y)

    def at(self, y) -> Smooth:
        """The loss L_y : C → R for one target y."""
        y = self.check_targets(y, batched=False)
        y = jnp.asarray(y)
        value = self.value
        return Smooth(self._declared_space(y), R(), lambda c: value(c, y),
                      self.symbol or self._short())  # checks the output it is given

    def check_targets(self, Y, output_space: Space | None = None, batched: bool = True):
        """Y, if it is a batch of targets (or, `batched=False`, one target) of this family
        whose outputs lie in `output_space` (when given); else a `ValueError` or `TypeError`
        naming the family, what it expected and what it was given. Shapes are checked always,
        values (labels in range, probabilities in [0, 1], ...) only for concrete Y."""
        Y = _as_array(Y, self)
        try:
            numeric = bool(jnp.issubdtype(Y.dtype, jnp.number) or Y.dtype == np.bool_)
        except TypeError:
            numeric = False
        if not numeric or jnp.issubdtype(Y.dtype, jnp.complexfloating):
            raise TargetTypeError(f"{self!r}: targets must be real numbers, got dtype {Y.dtype}")
        shape = tuple(np.shape(Y))
        if batched and not shape:
            raise TargetError(f"{self!r}: a batch of targets needs a leading batch axis, "
                             "got a scalar")
        example_shape = shape[1:] if batched else shape
        expected = self._output_space_of(example_shape, Y.dtype)
        if output_space is not None and tuple(expected.shape) != tuple(output_space.shape):
            raise TargetError(
                f"{self!r}: targets of shape {_shape_str(example_shape)} (per example) belong to "
                f"outputs in {expected!r}, but the model's outputs lie in {output_space!r}")
        if _concrete(Y):
            self.check_values(np.asarray(Y), batched)
        return Y

    def _output_space_of(self, shape, dtype) -> Space:
        """`output_space` for a target of this shape and dtype, checked to be a `Space` and
        remembered (checking targets runs once per training step)."""
        key = (shape, np.dtype(dtype))
        try:
            known = _SPACES.setdefault(self, {})
        except TypeError:  # unhashable or not weakly referable: asked each time
            known = {}
        if key not in known:
            known[key] = self._declared_space(jax.ShapeDtypeStruct(shape, dtype))
        return known[key]

    def _declared_space(self, y) -> Space:
        """`output_space(y)` if it is a `Space`, else `KindError` naming the family."""
        space = self.output_space(y)
        if not isinstance(space, Space):
            raise KindError(f"the loss family {self!r} declares the outputs of a target of shape "
                            f"{tuple(y.shape)} to lie in {space!r}, which is not a Space: its "
                            f"output_space(y) must return a Space, e.g. R(*y.shape)")
        # the declaration agrees with the value: L_y is defined on it and real-valued (shapes
        # only, traced once per target shape and dtype)
        try:
            out = jax.eval_shape(self.value, jax.ShapeDtypeStruct(space.shape,
                                                                  jnp.result_type(float)), y)
            why = None if getattr(out, "shape", None) == () else f"a value of shape {out.shape}"
        except ParalensError:
            raise
        except Exception as e:  # noqa: BLE001 - the user's value function, re-raised as ours
            why = f"{type(e).__name__}: {e}"
        if why:
            raise KindError(f"the loss family {self!r} declares outputs in {space!r} for a "
                            f"target of shape {tuple(y.shape)}, but its value(c, y) at such an "
                            f"output gives {why}: output_space(y) must be the space of the "
                            f"outputs value(c, y) takes, and the value a scalar")
        return space

    # -- value semantics -------------------------------------------------------------------
    def _config(self) -> dict:
        if dataclasses.is_dataclass(self):
            return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        try:
            return dict(vars(self))
        except TypeError:
            return {}

    def _key(self):
        cached = self.__dict__.get("_value_key")
        if cached is not None:
            return cached
        items = tuple(sorted(self._config().items()))
        try:
            hash(items)
        except TypeError:
            return (type(self), id(self))
        key = (type(self), items)
        params = getattr(self, "__dataclass_params__", None)
        if params is not None and params.frozen:  # immutable: the key can be kept
            self.__dict__["_value_key"] = key
        return key

    def __eq__(self, other):
        if not isinstance(other, LossFamily):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def _short(self) -> str:
        return self.name or type(self).__name__

    def __repr__(self):
        fields = dataclasses.fields(self) if dataclasses.is_dataclass(self) else ()
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in fields
                 if getattr(self, f.name) != f.default]
        return f"{self._short()}({', '.join(shown)})" if shown else self._short()


# -- the built-in families --------------------------------------------------------------------

def _per_example(ok):
    """All of each example's entries (axis 0 is the batch)."""
    return jnp.all(jnp.reshape(ok, (jnp.shape(ok)[0], -1)), axis=1)


def _need_unit(fam, Y, what: str):
    """Refuse (`TargetError`) real targets outside [0, 1], naming the first and its index."""
    _need_real(fam, Y)
    bad = ~((Y >= 0) & (Y <= 1))
    if np.any(bad):
        i = np.argwhere(bad)[0]
        raise TargetError(f"{fam!r}: {what}, got {Y[tuple(i)]} at index "
                          f"{tuple(int(j) for j in i)}")


def _need_finite(fam, Y):
    if not np.all(np.isfinite(Y)):
        bad = np.argwhere(~np.isfinite(Y))[0]
        raise TargetError(f"{fam!r}: targets must be finite, got {Y[tuple(bad)]} at index "
                         f"{tuple(int(i) for i in bad)}")


def _need_real(fam, Y, what="targets"):
    if not (np.issubdtype(Y.dtype, np.number) or Y.dtype == np.bool_):
        raise TargetTypeError(f"{fam!r}: {what} must be real numbers, got dtype {Y.dtype}")


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class HalfSquaredError(LossFamily):
    """L_y(ŷ) = ½‖ŷ − y‖²: the negative log-likelihood (up to a constant) of y ~ N(ŷ, I),
    whose output Fisher is F = I. Targets: real arrays shaped like the output.

    Examples:
        >>> float(HalfSquaredError()(jnp.array([1.0, 0.0]))(jnp.array([3.0, 2.0])))
        4.0
    """

    name = "half_squared_error"
    symbol = "½‖· − y‖²"
    predictive = "Normal(z, I)"

    def value(self, c, y):
        return 0.5 * jnp.sum((c - y) ** 2)

    def check_values(self, Y, batched=True):
        _need_real(self, Y)
        _need_finite(self, Y)

    def output_fisher(self, z, v):
        return v

    def sample(self, key, z):
        return z + jax.random.normal(key, jnp.shape(z), jnp.result_type(z))


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class SoftmaxCrossEntropy(LossFamily):
    """L_y(z) = −log softmax(z)_y for an integer class label y ∈ {0, …, k−1} (with `classes`
    = k), or −Σ_i y_i log softmax(z)_i for a probability vector y over the last axis: the
    negative log-likelihood of y ~ Categorical(softmax z), whose output Fisher is
    F = diag π − π πᵀ, π = softmax z.

    Examples:
        >>> L = SoftmaxCrossEntropy(classes=2)(jnp.asarray(0))
        >>> round(float(L(jnp.array([0.0, 0.0]))), 4)
        0.6931
    """

    classes: int | None = None
    name = "softmax_cross_entropy"
    symbol = "CE"
    predictive = "Categorical(softmax z)"

    def __post_init__(self):
        k = self.classes
        if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer))
                              or k < 1):
            raise HyperparameterError(f"softmax_cross_entropy: classes must be a positive integer, got {k!r}")
        if k is not None:
            object.__setattr__(self, "classes", int(k))

    def value(self, c, y):
        logp = jax.nn.log_softmax(c, axis=-1)
        if jnp.ndim(y) == 0:  # a class label
            # A label outside 0 … k−1 gives NaN, value and covector, where JAX's indexing would
            # clamp it to a class: unseen by `targets_ok` (a user's family wrapping this one),
            # the step is then refused for its NaN covector. ×1 leaves valid labels' bits.
            k = c.shape[-1]
            inside = (y >= 0) & (y < k)
            return -logp[jnp.clip(y, 0, k - 1)] * jnp.where(inside, 1.0, jnp.nan).astype(logp.dtype)
        return -jnp.sum(y * logp)

    def output_space(self, y):
        shape, dtype = tuple(y.shape), y.dtype
        if not shape:
            if not (np.issubdtype(dtype, np.integer)):
                raise TargetTypeError(f"{self!r}: a scalar target is a class label and must be an "
                                f"integer, got dtype {np.dtype(dtype)}; pass integer labels or "
                                "probability vectors")
            if self.classes is None:
                raise TargetTypeError("softmax_cross_entropy with integer labels needs the number of "
                                "classes: use softmax_cross_entropy(classes=k) (or "
                                "softmax_cross_entropy(label, classes=k) for one loss)")
            return R(self.classes)
        if self.classes is not None and shape[-1] != self.classes:
            raise TargetError(f"{self!r}: a probability-vector target needs {self.classes} "
                             f"entries on its last axis, got shape {_shape_str(shape)}")
        return R(*shape)

    def check_values(self, Y, batched=True):
        labels = Y.ndim == (1 if batched else 0)
        if labels:
            k = self.classes
            if Y.size == 0 or (Y.min() >= 0 and Y.max() < k):
                return
            bad = (Y < 0) | (Y >= k)
            if np.any(bad):
                i = np.argwhere(bad)[0]
                raise TargetError(f"{self!r}: class labels must be integers in [0, {k}), got "
                                 f"{Y[tuple(i)]}" + (f" (example {int(i[0])})" if batched else ""))
            return
        _need_unit(self, Y, "probability-vector targets need entries in [0, 1]")
        eps = np.finfo(Y.dtype).eps if np.issubdtype(Y.dtype, np.floating) else 0.0
        tol = max(1e-5, 100 * eps * Y.shape[-1])
        sums = np.sum(Y, axis=-1, dtype=np.float64)
        off = np.abs(sums - 1.0) > tol
        if np.any(off):
            i = np.argwhere(off)[0]
            where = f" at index {tuple(int(j) for j in i)}" if len(i) else ""
            raise TargetError(f"{self!r}: probability-vector targets must sum to 1 over the last "
                             f"axis, got {float(sums[tuple(i)])}{where}; for integer class "
                             "labels use softmax_cross_entropy(classes=k)")

    def targets_ok(self, Y):
        if jnp.ndim(Y) == 1:  # class labels
            return (Y >= 0) & (Y < self.classes)
        tol = max(1e-5, 100 * float(jnp.finfo(jnp.result_type(float)).eps) * Y.shape[-1])
        inside = _per_example((Y >= 0) & (Y <= 1))
        return inside & _per_example(jnp.abs(jnp.sum(Y, axis=-1) - 1.0) <= tol)

    def output_fisher(self, z, v):
        pi = jax.nn.softmax(z, axis=-1)
        return pi * v - pi * jnp.sum(pi * v, axis=-1, keepdims=True)

    def sample(self, key, z):
        # A one-hot probability vector (a target in either form would do): value(z, ŷ) reads it.
        k = jax.random.categorical(key, z, axis=-1)
        return jax.nn.one_hot(k, jnp.shape(z)[-1], dtype=jnp.result_type(z))


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class BinaryCrossEntropy(LossFamily):
    """L_y(z) = −Σ_i [y_i log σ(z_i) + (1 − y_i) log(1 − σ(z_i))] on logits z, for targets
    y ∈ [0, 1] shaped like the output: the negative log-likelihood of independent
    y_i ~ Bernoulli(σ z_i), whose output Fisher is F = diag σ(1 − σ).

    Examples:
        >>> L = BinaryCrossEntropy()(jnp.array([1.0]))
        >>> round(float(L(jnp.array([0.0]))), 4)
        0.6931
    """

    name = "binary_cross_entropy"
    symbol = "BCE"
    predictive = "Bernoulli(σ z)"

    def value(self, c, y):
        return jnp.sum(jax.nn.softplus(c) - y * c)

    def check_values(self, Y, batched=True):
        _need_unit(self, Y, "targets must lie in [0, 1]")

    def targets_ok(self, Y):
        return _per_example((Y >= 0) & (Y <= 1))

    def output_fisher(self, z, v):
        q = jax.nn.sigmoid(z)
        return q * (1.0 - q) * v

    def sample(self, key, z):
        return jax.random.bernoulli(key, jax.nn.sigmoid(z)).astype(jnp.result_type(z))


half_squared_error = HalfSquaredError()
"""The family y ↦ (ŷ ↦ ½‖ŷ − y‖²) (see `HalfSquaredError`)."""
softmax_cross_entropy = SoftmaxCrossEntropy()
"""The family y ↦ (z ↦ −log softmax(z)_y), for class labels or probability vectors (see
`SoftmaxCrossEntropy`; `softmax_cross_entropy(classes=k)` fixes the number of classes)."""
binary_cross_entropy = BinaryCrossEntropy()
"""The family y ↦ (z ↦ −Σ_i [y_i log σ(z_i) + (1 − y_i) log(1 − σ(z_i))]) on logits (see
`BinaryCrossEntropy`)."""


# -- families given as functions -----------------------------------------------------------------

def _fn_key(fn):
    """A value key for a function: partials by (function, arguments), others by identity."""
    if isinstance(fn, functools.partial):
        key = ("partial", _fn_key(fn.func), fn.args, tuple(sorted(fn.keywords.items())))
        try:
            hash(key)
            return key
        except TypeError:
            return ("id", id(fn))
    return ("fn", fn)


class CallableFamily(LossFamily):
    """A loss family given as a plain function y ↦ L_y (a `Smooth` C → R). It has a value
    (so `GaussNewton` works with it) but no known predictive distribution (so `Fisher`
    refuses it: write a `LossFamily` with `output_fisher`, or pass `output_fisher=`).

    Examples:
        >>> fam = CallableFamily(lambda y: Smooth(R(2), R(), lambda c: jnp.sum(jnp.abs(c - y)), "l1"))
        >>> float(fam(jnp.zeros(2))(jnp.array([1.0, -2.0])))
        3.0
    """

    def __init__(self, fn: Callable):
        self.fn = fn
        self.name = getattr(fn, "__name__", None) or repr(fn)
        self._spaces: dict = {}  # (target shape, dtype) ↦ output space, so fn runs once per shape

    def _loss(self, y):
        L = self.fn(y)
        if not isinstance(L, Smooth):
            raise KindError(f"the loss family {self.name} must map a target to a loss "
                            f"(a Smooth C → R), got {type(L).__name__}")
        return L

    def value(self, c, y):
        return self._loss(y).fn(c)

    def output_space(self, y):
        key = (tuple(y.shape), np.dtype(y.dtype))
        if key not in self._spaces:
            self._spaces[key] = self._probe(jax.ShapeDtypeStruct(*key))
        return self._spaces[key]

    def _probe(self, y) -> Space:
        """The domain of the loss at an abstract target of y's shape and dtype: traced, so
        that no made-up target value (zeros are no probability vector) is shown to a family
        that checks values; a function that reads its target's value is shown zeros."""
        found = []

        def run(t):
            found.append(self._loss(t).dom)
            return jnp.zeros(())

        try:
            jax.eval_shape(run, y)
        except jax.errors.ConcretizationTypeError:
            return self._loss(jnp.zeros(y.shape, y.dtype)).dom
        return found[0]

    def at(self, y):
        return self._loss(y)

    def check_values(self, Y, batched: bool = True) -> None:
        """The function's own refusals of concrete targets: it is shown the whole batch
        once (a family wrapping a built-in one checks its values elementwise); where that
        is refused, each example's target alone, and the first refusal is raised, naming
        the example (a batch it refuses only as a batch is accepted)."""
        if not batched:
            self._loss(jnp.asarray(Y))
            return
        try:
            self._loss(jnp.asarray(Y))
            return
        except ParalensError:
            pass
        for i, y in enumerate(Y):
            try:
                self._loss(jnp.asarray(y))
            except ParalensError as e:  # the same refusal, naming the example
                e.args = (f"{self!r}, example {i} of the batch: {e}",) + e.args[1:]
                raise

    def _key(self):
        return (CallableFamily, _fn_key(self.fn))

    def __repr__(self):
        return f"loss_family({self.name})"


def loss_family(family: Any) -> LossFamily:
    """The `LossFamily` that `family` denotes: a family itself; a `functools.partial` of one
    with configuration only (`partial(softmax_cross_entropy, classes=3)` is the family
    `softmax_cross_entropy(classes=3)`, equal to every other); a plain callable y ↦ Smooth,
    wrapped. A loss for one target (a `Smooth`) is refused: pass the family.

    Examples:
        >>> from functools import partial
        >>> loss_family(partial(softmax_cross_entropy, classes=3)) == softmax_cross_entropy(classes=3)
        True
        >>> loss_family(half_squared_error) is half_squared_error
        True
    """
    if isinstance(family, LossFamily):
        return family
    if isinstance(family, Smooth):
        raise KindError(f"a loss family is needed, got the loss {family!r} for one target: "
                        "pass the family, e.g. half_squared_error, not half_squared_error(y)")
    if isinstance(family, type) and issubclass(family, LossFamily):
        raise KindError(f"a loss family is needed, got the class {family.__name__}: pass an "
                        f"instance, e.g. {family.__name__}()")
    if isinstance(family, functools.partial) and not family.args:
        base = loss_family(family.func)
        if not isinstance(base, CallableFamily):
            return base.configure(**family.keywords)
    if callable(family) and not isinstance(family, type):
        return CallableFamily(family)
    raise KindError(f"a loss family is needed (e.g. half_squared_error, "
                    f"softmax_cross_entropy(classes=k), or a LossFamily), got {family!r}")


def _what_value(v) -> str:
    shape = getattr(v, "shape", None)
    return f"shape {tuple(shape)}" if shape is not None else type(v).__name__


# -- the covector and the batch -------------------------------------------------------------------

def dL(loss: Smooth, c) -> Covector:
    """The differential of the loss at c, a covector on C (the start of the backward pass).

    Examples:
        >>> loss = half_squared_error(jnp.array([1.0, 0.0]))
        >>> unwrap(dL(loss, jnp.array([3.0, 2.0]))).tolist()
        [2.0, 2.0]
    """
    if isinstance(loss, LossFamily):
        raise KindError(f"dL needs the loss for one target, got the family {loss!r}: "
                        "pass family(y)")
    if not isinstance(loss, Smooth) or loss.cod != R():
        raise KindError(f"dL needs a loss C → R (e.g. half_squared_error(y)), got {loss!r}")
    loss.dom.check(c, f"the output given to dL of {loss.name}")
    if not jnp.issubdtype(jnp.result_type(c), jnp.inexact):
        # an integer-valued output is a point of C like any other: differentiated in floats
        c = jnp.asarray(c, jnp.result_type(float))
    return Covector(jax.grad(loss.fn)(c), loss.dom)


def batch_loss(family, targets, reduction: str = "sum", **kw) -> Smooth:
    """The loss of a batch, Σ_i L_{y_i}(c_i) (or the mean), as a map on batched outputs.
    The targets are checked against the family (shape always, values when concrete), and
    the batched outputs against the targets' output space.

    Examples:
        >>> L = batch_loss(half_squared_error, jnp.zeros((2, 1)))
        >>> float(L(jnp.array([[1.0], [2.0]])))
        2.5
        >>> float(batch_loss(half_squared_error, jnp.zeros((2, 1)), reduction="mean")(jnp.array([[1.0], [2.0]])))
        1.25
    """
    if reduction not in ("sum", "mean"):
        raise HyperparameterError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
    fam = loss_family(family).configure(**kw) if kw else loss_family(family)
    targets = fam.check_targets(targets)
    targets = jnp.asarray(targets)
    n = targets.shape[0]
    out = fam._declared_space(jax.ShapeDtypeStruct(targets.shape[1:], targets.dtype))
    dom = R(n, *out.shape)
    per = jax.vmap(fam.value)
    value = jax.eval_shape(fam.value, jax.ShapeDtypeStruct(out.shape, jnp.result_type(float)),
                           jax.ShapeDtypeStruct(targets.shape[1:], targets.dtype))
    if getattr(value, "shape", None) != ():
        raise KindError(f"{fam!r}: value(c, y) must be a number (the loss of one output), got "
                        f"{_what_value(value)}; a vector of losses is not averaged silently")

    def fn(C):
        if tuple(jnp.shape(C)) != dom.shape:
            raise ShapeError(f"{fam!r}: a batch of {n} targets of shape "
                             f"{_shape_str(targets.shape[1:])} needs outputs of shape "
                             f"{_shape_str(dom.shape)}, got {_shape_str(jnp.shape(C))}")
        losses = per(C, targets)
        return jnp.sum(losses) if reduction == "sum" else jnp.mean(losses)

    return Smooth(dom, R(), fn, f"{reduction} of {fam._short()}", check=False)


__all__ = ["LossFamily", "HalfSquaredError", "SoftmaxCrossEntropy", "BinaryCrossEntropy",
           "CallableFamily", "loss_family", "half_squared_error", "softmax_cross_entropy",
           "binary_cross_entropy", "dL", "batch_loss"]
