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

from .builtin import (BinaryCrossEntropy, HalfSquaredError, SoftmaxCrossEntropy,
                      binary_cross_entropy, half_squared_error, softmax_cross_entropy)
from .family import LossFamily
from .given import CallableFamily, loss_family
from .maps import batch_loss, dL

__all__ = ["LossFamily", "HalfSquaredError", "SoftmaxCrossEntropy", "BinaryCrossEntropy",
           "CallableFamily", "loss_family", "half_squared_error", "softmax_cross_entropy",
           "binary_cross_entropy", "dL", "batch_loss"]
