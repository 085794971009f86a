"""The built-in loss families: squared error, softmax and binary cross-entropy."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from categories import R
from categories.numbers import integer
from categories.points import is_real_dtype
from categories.errors import HyperparameterError, TargetError, TargetTypeError

from .family import LossFamily, shape_text


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


def classes_arg(k, who: str) -> int | None:
    """The number of classes of a cross-entropy family: None (given later), or an integer
    ≥ 2 (`integer`); else `HyperparameterError` naming `who` (over one class the loss is 0
    whatever the output: nothing is learnt)."""
    if k is None:
        return None
    try:
        return integer(k, f"{who}: classes", least=2)
    except HyperparameterError as e:
        one = isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)) and k == 1
        raise HyperparameterError(str(e) + (
            ": over one class the loss is 0 whatever the output, and nothing is learnt; for one "
            "output, a probability, use binary_cross_entropy" if one else "")) from None


def class_labels(y, classes: int):
    """(the labels as indices, whether each is a class): an integer in [0, classes), whatever
    its dtype (a float of integer value is one; 1.5, −1, `classes` and NaN are not). Traceable:
    what a compiled step asks of its targets (`targets_ok`) and what `value` reads."""
    nearest = jnp.round(y)
    inside = (nearest == y) & (y >= 0) & (y < classes)
    return jnp.clip(nearest, 0, classes - 1).astype(jnp.int32), inside


def _need_real(fam, Y, what="targets"):
    if not is_real_dtype(Y.dtype, booleans=True):
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
    F = diag π − π πᵀ, π = softmax z. At least 2 classes (over one, the loss is 0 whatever
    z is: for one output, a probability, `BinaryCrossEntropy`).

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
        object.__setattr__(self, "classes", classes_arg(self.classes, self.name))

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
        if shape[-1] < 2:  # one class: softmax is 1, the loss 0 whatever the output
            raise TargetError(f"{self!r}: a probability-vector target needs at least 2 entries "
                              f"on its last axis, got shape {shape_text(shape)}: over one class "
                              "nothing is learnt; for one output, a probability, use "
                              "binary_cross_entropy")
        if self.classes is not None and shape[-1] != self.classes:
            raise TargetError(f"{self!r}: a probability-vector target needs {self.classes} "
                             f"entries on its last axis, got shape {shape_text(shape)}")
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


__all__ = ["classes_arg", "class_labels",
           "HalfSquaredError", "SoftmaxCrossEntropy", "BinaryCrossEntropy", "half_squared_error",
           "softmax_cross_entropy", "binary_cross_entropy"]
