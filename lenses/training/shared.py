"""What compiled code is kept for, and for how long: one record per model *structure*, alive
exactly while some model of that structure is.

A step, a chunk or a prediction compiled for a model depends on what the model computes, not
on which Python object it is: models built alike (`dense(2, 3) >> tanh >> dense(3, 1)` in a
loop over seeds) compute alike, so they share one record (`Shared`) and its compilations. The
record holds its models weakly (`Shared.model` is any one still alive) and each model holds
its record, so dropping the last model of a structure frees the record, its compiled code and
whatever it held (the loss family, the optimiser): nothing here keeps a user's model alive.

Two models have one structure when `structure_key` says so: the key is built from the model's
classes and attributes, its functions' code, defaults, closed-over values and the globals
they name; an object it cannot read (an array, a foreign module) counts by its identity, so
models that differ only in such an object never share.
"""

from __future__ import annotations

import functools
import types
import weakref

import numpy as np

from categories.errors import KindError

_ATOMS = (type(None), bool, int, str, bytes, type(Ellipsis), np.dtype)
_OURS = ("categories", "lenses")  # packages whose objects are read attribute by attribute


class _Id:
    """An object compared by identity, held weakly where it can be (so that a key does not keep
    alive what a dropped model referenced)."""

    __slots__ = ("_id", "_ref", "__weakref__")

    def __init__(self, obj):
        self._id = id(obj)
        try:
            self._ref = weakref.ref(obj)
        except TypeError:  # code objects, builtins: held (they live as long as their module)
            self._ref = lambda obj=obj: obj

    def __hash__(self):
        return self._id

    def __eq__(self, other):
        if not isinstance(other, _Id):
            return NotImplemented
        mine = self._ref()
        return self is other or (mine is not None and mine is other._ref())


def _global_names(code) -> set:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _key(obj, memo: dict):
    if isinstance(obj, _ATOMS):
        return (type(obj), obj)
    if isinstance(obj, (float, complex, np.generic)):
        return (type(obj), repr(obj))  # repr: -0.0 differs from 0.0
    if id(obj) in memo:  # a cycle (a recursive function, a site naming its layer)
        return ("seen", memo[id(obj)])
    memo[id(obj)] = len(memo)
    if isinstance(obj, (tuple, list)):
        return (type(obj), tuple(_key(x, memo) for x in obj))
    if isinstance(obj, dict):
        return (type(obj), tuple((_key(k, memo), _key(v, memo)) for k, v in obj.items()))
    if isinstance(obj, types.FunctionType):
        cells = tuple(_key(c.cell_contents, memo) if _filled(c) else ("empty",)
                      for c in obj.__closure__ or ())
        scope = obj.__globals__
        names = tuple((n, _key(scope[n], memo)) for n in sorted(_global_names(obj.__code__))
                      if n in scope)
        return ("function", _Id(obj.__code__), _key(obj.__defaults__, memo),
                _key(obj.__kwdefaults__, memo), cells, names)
    if isinstance(obj, functools.partial):
        return ("partial", _key(obj.func, memo), _key(obj.args, memo), _key(obj.keywords, memo))
    if isinstance(obj, types.ModuleType):
        return ("module", obj.__name__)
    if type(obj).__module__.split(".")[0] in _OURS and hasattr(obj, "__dict__"):
        return (_Id(type(obj)), _key(vars(obj), memo))
    return _Id(obj)


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def structure_key(model):
    """What compiled code for `model` depends on, as a hashable value: equal keys, equal
    computations."""
    return _key(model, {})


class Shared:
    """The record of one model structure: its live models (held weakly) and what is compiled
    for them (`cores`: the step cores by loss family and optimiser; `predictor`)."""

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
            key, record = _Id(model), None
        if record is None:
            record = _BY_KEY[key] = Shared(key)
        record._models.add(model)
        _OF_MODEL[model] = record
    return record


__all__ = ["Shared", "shared", "structure_key"]
