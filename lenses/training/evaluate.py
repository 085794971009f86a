"""Evaluation: the batched forward pass and the accuracy of a classifier, off the training path."""

from __future__ import annotations

import jax
import numpy as np

from categories import Product
from categories.errors import ShapeError, TargetError
from categories.points import is_real_dtype

from ..optimisers import check_params, slot_names
from ..batched import batched
from ..inputs import check_batch, need_lens
from .shared import shared

def predict(model, params, X):
    """The batched forward pass f(X, p) (compiled once per model and shapes). X is checked
    against the model's domain (`ShapeError`) and p against its parameter object
    (`DomainError`) before anything is compiled.

    Examples:
        >>> predict(dense(2, 1), (jnp.ones((1, 2)), jnp.zeros(1)), jnp.ones((3, 2))).tolist()
        [[2.0], [2.0], [2.0]]
    """
    need_lens(model, "predict")
    model = model.fixed("predict")
    check_batch(model.dom, X, f"predict({model.name})", concrete_values=True)
    check_params(model.param, params, slot_names(model))
    model.param.check(params, f"the parameters given to predict({model.name})")
    record = shared(model)  # compiled once per structure, freed with its last model
    if record.predictor is None:
        record.predictor = jax.jit(lambda p, X: batched(record.model).forward(X, p))
    return record.predictor(params, X)


def accuracy(model, params, X, Y) -> float:
    """Fraction of examples whose largest output is the label (Y integer labels or one-hot).

    The model must be a classifier with outputs R^k, k ≥ 2; Y either n integer labels in
    [0, k) or an (n, k) array of one-hot (or probability) rows; else `TargetError`.

    Examples:
        >>> p = (jnp.eye(2), jnp.zeros(2))  # the largest input is the class
        >>> accuracy(dense(2, 2), p, np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 2.0]]), [0, 1, 0])
        0.6666666666666666
    """
    need_lens(model, "accuracy")
    model = model.fixed("accuracy")
    labels = check_labels(model, X, Y)
    pred = np.argmax(np.asarray(predict(model, params, X)), axis=-1)
    return float(np.mean(pred == labels))


def check_labels(model, X, Y) -> np.ndarray:
    """The integer labels of Y if Y holds labels (or one-hot rows) for the classifier `model`
    and as many examples as X, else `TargetError` (`ShapeError` for X itself)."""
    n = check_batch(model.dom, X, f"accuracy({model.name})")
    cod = model.cod
    if isinstance(cod, Product) or len(cod.shape) != 1 or cod.shape[0] < 2:
        raise TargetError(f"accuracy needs a classifier with outputs R^k, k ≥ 2 (the largest "
                          f"output is the predicted class), but {model.name} has outputs {cod!r}")
    k = cod.shape[0]
    try:
        Y = np.asarray(Y)
    except Exception:  # noqa: BLE001 - a ragged list
        raise TargetError(f"accuracy({model.name}): targets must be an array, got "
                          f"{type(Y).__name__}") from None
    if Y.ndim == 0 or Y.shape[0] != n:
        raise ShapeError(f"accuracy({model.name}): {n} inputs but targets of shape {Y.shape}")
    if Y.ndim == 1:
        if not (np.issubdtype(Y.dtype, np.integer)):
            raise TargetError(f"accuracy({model.name}): labels must be integers in [0, {k}), "
                              f"got dtype {Y.dtype}")
        bad = (Y < 0) | (Y >= k)
        if bad.any():
            i = int(np.argmax(bad))
            raise TargetError(f"accuracy({model.name}): labels must be integers in [0, {k}), got "
                              f"{Y[i]} (example {i})")
        return Y
    if Y.ndim != 2 or Y.shape[1] != k:
        raise TargetError(f"accuracy({model.name}): one-hot targets need shape ({n}, {k}) for "
                          f"outputs {cod!r}, got shape {Y.shape}")
    if not is_real_dtype(Y.dtype, booleans=True) or not np.all(np.isfinite(Y)):
        raise TargetError(f"accuracy({model.name}): one-hot targets must be finite real numbers")
    return np.argmax(Y, axis=-1)


__all__ = ["predict", "accuracy", "check_labels"]
