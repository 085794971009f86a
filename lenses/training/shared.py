"""What compiled code is kept for, and for how long: one record per model *structure*, alive
exactly while some model of that structure is.

A step, a chunk or a prediction compiled for a model depends on what the model computes, not
on which Python object it is: models built alike (`dense(2, 3) >> tanh >> dense(3, 1)` in a
loop over seeds) compute alike, so they share one record (`Shared`) and its compilations. The
record holds its models weakly (`Shared.model` is any one still alive) and each model holds
its record, so dropping the last model of a structure frees the record, its compiled code and
whatever it held (the loss family; JAX's compilations, whose cache keys hold the optimisers'
structures, not the optimisers: only what is structure, such as an optax transformation or a
K-FAC's model, lives as long as the record): nothing else here keeps a user's model alive.

Two models have one structure when `structure_key` says so: the key is built from the model's
classes and attributes, its functions' code, defaults, closed-over values and the globals
they name; an object it cannot read (an array, a foreign module) counts by its identity, so
models that differ only in such an object never share.
"""

from __future__ import annotations

import weakref

from categories.errors import KindError

from ..values import Identity, structure_key


class Shared:
    """The record of one model structure: its live models (held weakly) and what is compiled
    for them (`cores`: the step cores by loss family, reduction and mesh; `predictor`)."""

    def __init__(self, key, model=None):
        self.key, self._models = key, weakref.WeakSet()
        self._strong = model  # a model that cannot be weakly referenced: held, never shared
        self.cores: dict = {}
        self.predictor = None

    @property
    def model(self):
        """A live model of this structure (any one: they compute alike)."""
        if self._strong is not None:
            return self._strong
        for model in self._models:
            return model
        # unreachable through the library: whoever calls a core holds a model of its structure
        raise KindError("a compiled step was called after every model of its structure was "
                        "freed: keep the model (or the TrainStep, which holds it) while stepping")


_BY_KEY: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()
_OF_MODEL: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def shared(model) -> Shared:
    """The record of `model`'s structure, made once per structure and kept while the model is."""
    try:
        record = _OF_MODEL.get(model)
    except TypeError:  # not weakly referable: a record of its own, dropped with its user
        return Shared(None, model)
    if record is None:
        key = structure_key(model)
        try:
            record = _BY_KEY.get(key)
        except TypeError:  # an unhashable value somewhere in the model: a record of its own
            key, record = Identity(model), None
        if record is None:
            record = _BY_KEY[key] = Shared(key)
        record._models.add(model)
        _OF_MODEL[model] = record
    return record


__all__ = ["Shared", "shared"]
