"""Loss families given as functions, and `loss_family`, which normalises what a user passes."""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from categories import Smooth, Space
from categories.errors import ParalensError, KindError

from .family import LossFamily


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

        def read_target(t):
            found.append(self._loss(t).dom)
            return jnp.zeros(())

        try:
            jax.eval_shape(read_target, y)
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


__all__ = ["CallableFamily", "loss_family"]
