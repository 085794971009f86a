"""Losses: plain smooth maps L : C → R for a fixed target (not lenses: no parameter object).

`dL(loss, c)` is the covector dL_c on C that starts the backward pass. For a batch the score
is the sum of per-example scores (`batch_loss`, with `reduction="mean"` offered explicitly).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from categories import Covector, R, Smooth


def half_squared_error(y) -> Smooth:
    """ŷ ↦ ½‖ŷ − y‖² : R^shape(y) → R."""
    y = jnp.asarray(y)
    return Smooth(R(*y.shape), R(), lambda yhat: 0.5 * jnp.sum((yhat - y) ** 2), "½‖· − y‖²",
                  check=False)


def softmax_cross_entropy(label, classes: int | None = None) -> Smooth:
    """z ↦ −log softmax(z)_label : R^k → R (label an integer class with `classes` = k, or a
    probability vector over k classes, giving −Σ y_i log softmax(z)_i)."""
    label = jnp.asarray(label)
    if label.ndim == 0:
        if classes is None:
            raise TypeError("softmax_cross_entropy(label) with an integer label needs classes=k")
        return Smooth(R(classes), R(), lambda z: -jax.nn.log_softmax(z)[label], "CE", check=False)
    return Smooth(R(*label.shape), R(), lambda z: -jnp.sum(label * jax.nn.log_softmax(z)), "CE",
                  check=False)


def binary_cross_entropy(y) -> Smooth:
    """z ↦ −[y log σ(z) + (1 − y) log(1 − σ(z))] on logits z : R^shape(y) → R."""
    y = jnp.asarray(y)
    return Smooth(R(*y.shape), R(),
                  lambda z: jnp.sum(jax.nn.softplus(z) - y * z), "BCE", check=False)


def dL(loss: Smooth, c) -> Covector:
    """The differential of the loss at c, a covector on C (the start of the backward pass)."""
    return Covector(jax.grad(loss.fn)(c), loss.dom)


def batch_loss(family, targets, reduction: str = "sum", **kw) -> Smooth:
    """The loss of a batch, Σ_i family(y_i)(c_i) (or the mean), as a map on batched outputs."""
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
    targets = jnp.asarray(targets)
    per = jax.vmap(lambda c, y: family(y, **kw).fn(c))
    example = family(targets[0], **kw)
    n = targets.shape[0]
    dom = R(n, *example.dom.shape)

    def fn(C):
        losses = per(C, targets)
        return jnp.sum(losses) if reduction == "sum" else jnp.mean(losses)

    return Smooth(dom, R(), fn, f"{reduction} of {example.name}", check=False)


__all__ = ["half_squared_error", "softmax_cross_entropy", "binary_cross_entropy", "dL", "batch_loss"]
