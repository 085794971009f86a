"""Values: immutable pytrees whose structure is static and whose numbers are leaves.

A subclass of `Value` is a frozen dataclass registered as a pytree: the fields declared with
`static()` are its structure (the pytree's aux data, which `jax.jit` compares by equality and
hashes), every other field a child (a number, an array, or a value in turn). Two values are
equal, and hash alike, when their types, structures and numbers are. Given to a function
compiled by `jax.jit`, a value's numbers are traced and its structure keys the compilation:
values that differ only in their numbers share one compilation, through JAX's own cache.

A subclass's `__init__` checks its arguments (or the dataclass's own is made); flattening and
unflattening, which JAX does with tracers and placeholders as leaves, check nothing and call
no `__init__` (`jax.tree_util`'s rule for custom nodes). A subclass that declares no fields
but sets attributes in its own `__init__` (a plain class, as a user may write a metric) is a
constant: all structure, compared by identity.

Examples:
    >>> from lenses.values import Value, static
    >>> class Scale(Value):
    ...     factor: float
    ...     name: str = static(default="scale")
    >>> jax.tree_util.tree_leaves(Scale(2.0)), Scale(2.0) == Scale(2.0), Scale(2.0) == Scale(3.0)
    ([2.0], True, False)
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import types
import weakref
from typing import ClassVar

import jax
import numpy as np


def static(**kw):
    """A field that is structure (compared and hashed, never traced), not a number."""
    return dataclasses.field(metadata={"static": True}, **kw)


def assign(obj, **fields) -> None:
    """Set the fields of a value (as `obj.name = v` does in its `__init__`)."""
    for name, v in fields.items():
        object.__setattr__(obj, name, v)


def _building(init):
    """`init`, during which the value's attributes may be set (a value is frozen after it)."""
    @functools.wraps(init)
    def build(self, *args, **kwargs):
        depth = self.__dict__.get("_building", 0)  # super().__init__ nests
        self.__dict__["_building"] = depth + 1
        try:
            init(self, *args, **kwargs)
        finally:
            if depth:
                self.__dict__["_building"] = depth
            else:
                del self.__dict__["_building"]
    return build


def _declares_fields(cls) -> bool:
    notes = vars(cls).get("__annotations__", {})
    return any(not str(t).startswith(("ClassVar", "typing.ClassVar")) for t in notes.values())


def _split(cls):
    names = [f.name for f in dataclasses.fields(cls)]
    meta = tuple(n for n, f in zip(names, dataclasses.fields(cls)) if f.metadata.get("static"))
    return tuple(n for n in names if n not in meta), meta


def _flatten_with_keys(x):
    data, meta = type(x).value_fields
    return ([(jax.tree_util.GetAttrKey(n), getattr(x, n)) for n in data],
            tuple(getattr(x, n) for n in meta))


def _getter(names):
    """x ↦ the tuple of x's attributes `names`, read in C (`operator.attrgetter`): a training
    step flattens its optimiser at every call, so this runs in its few microseconds."""
    if not names:
        return lambda x: ()
    get = operator.attrgetter(*names)
    return (lambda x: (get(x),)) if len(names) == 1 else get


def _flattener(data, meta):
    data_of, meta_of = _getter(data), _getter(meta)
    return lambda x: (data_of(x), meta_of(x))


def _unflatten(cls, aux, children):
    obj = cls.__new__(cls)  # no __init__: the leaves may be tracers or JAX's placeholders
    data, meta = cls.value_fields
    assign(obj, **dict(zip(meta, aux)), **dict(zip(data, children)))
    return obj


def _same(a, b) -> bool:
    """Two leaves equal by value (a traced leaf only to itself)."""
    if isinstance(a, jax.core.Tracer) or isinstance(b, jax.core.Tracer):
        return a is b
    x, y = np.asarray(a), np.asarray(b)
    return x.shape == y.shape and bool(np.array_equal(x, y))


def _leaf_hash(a) -> int:
    if isinstance(a, jax.core.Tracer):
        return id(a)
    x = np.asarray(a)
    return hash((x.shape, tuple(x.ravel()[:16].tolist())))  # equal leaves: equal values


class Value:
    """An immutable pytree: `static()` fields its structure, the other fields its numbers."""

    value_fields: ClassVar[tuple] = ((), ())  # (the children's names, the static fields' names)
    hand_written_init: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        inherited = any(dataclasses.is_dataclass(k) and dataclasses.fields(k)
                        for k in cls.__mro__[1:])
        if "__init__" in vars(cls) and not _declares_fields(cls) and not inherited:
            # a class that sets its attributes in its own __init__ (a user's metric written
            # as a plain class) is a constant: structure, by identity, with no numbers
            if "__eq__" not in vars(cls):
                cls.__eq__, cls.__hash__ = object.__eq__, object.__hash__  # type: ignore[assignment]  # by identity
            cls.__setattr__, cls.__delattr__ = object.__setattr__, object.__delattr__  # type: ignore[assignment]  # mutable
            jax.tree_util.register_pytree_node(cls, lambda x: ((), x), lambda aux, _: aux)
            return
        # a hand-written __init__ (which checks the arguments) is kept, also in subclasses
        cls.hand_written_init = "__init__" in vars(cls)
        own_init = any(vars(k).get("hand_written_init") for k in cls.__mro__)
        dataclasses.dataclass(eq=False, repr=False, init=not own_init)(cls)
        if "__init__" in vars(cls):
            cls.__init__ = _building(vars(cls)["__init__"])  # type: ignore[misc]  # wrapped in place
        cls.value_fields = _split(cls)
        jax.tree_util.register_pytree_with_keys(
            cls, _flatten_with_keys, functools.partial(_unflatten, cls), _flattener(*cls.value_fields))

    def __setattr__(self, name, value):
        if not self.__dict__.get("_building"):
            raise dataclasses.FrozenInstanceError(f"cannot assign to {name}: a {type(self).__name__} "
                                                  "is immutable (dataclasses.replace makes another)")
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        raise dataclasses.FrozenInstanceError(f"cannot delete {name}: a {type(self).__name__} is immutable")

    def __eq__(self, other):
        if type(self) is not type(other):
            return NotImplemented
        a, ta = jax.tree_util.tree_flatten(self)
        b, tb = jax.tree_util.tree_flatten(other)
        return ta == tb and all(_same(x, y) for x, y in zip(a, b))

    def __hash__(self):
        leaves, tree = jax.tree_util.tree_flatten(self)
        return hash((tree, tuple(_leaf_hash(a) for a in leaves)))

    def __repr__(self):
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self))
        return f"{type(self).__name__}({shown})"


# -- what a function computes, as a key ----------------------------------------------------------
# Models (`lenses.training.shared`) and foreign optax transformations (`lenses.optimisers.parts`)
# are not values: they are keyed by what they compute (classes, code, closed-over values).

_ATOMS = (type(None), bool, int, str, bytes, type(Ellipsis), np.dtype)
_OURS = ("categories", "lenses")  # packages whose objects are read attribute by attribute


class Identity:
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
        if not isinstance(other, Identity):
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
        return ("function", Identity(obj.__code__), _key(obj.__defaults__, memo),
                _key(obj.__kwdefaults__, memo), cells, names)
    if isinstance(obj, functools.partial):
        return ("partial", _key(obj.func, memo), _key(obj.args, memo), _key(obj.keywords, memo))
    if isinstance(obj, types.ModuleType):
        return ("module", obj.__name__)
    if type(obj).__module__.split(".")[0] in _OURS and hasattr(obj, "__dict__"):
        return (Identity(type(obj)), _key(vars(obj), memo))
    return Identity(obj)


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


__all__ = ["Value", "static", "assign", "Identity", "structure_key"]
