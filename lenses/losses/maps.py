"""The maps a loss family gives: the covector dL that starts the backward pass, and the loss
of a batch."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from categories import Covector, R, Smooth
from categories.errors import HyperparameterError, KindError, ShapeError

from .family import LossFamily, shape_text
from .given import loss_family


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
    out = fam.declared_space(jax.ShapeDtypeStruct(targets.shape[1:], targets.dtype))
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
                             f"{shape_text(targets.shape[1:])} needs outputs of shape "
                             f"{shape_text(dom.shape)}, got {shape_text(jnp.shape(C))}")
        losses = per(C, targets)
        return jnp.sum(losses) if reduction == "sum" else jnp.mean(losses)

    return Smooth(dom, R(), fn, f"{reduction} of {fam.short_name()}", check=False)


__all__ = ["dL", "batch_loss"]
