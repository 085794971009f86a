"""Layouts: how each parameter slot's arrays are partitioned over the axes of a device mesh.

A layout is data: a rule per slot, resolved against a model's slots and a mesh into one
`PartitionSpec` per parameter leaf. A slot's rule is a `PartitionSpec` (every leaf of the
slot, trailing dimensions unsplit), a tuple of them (one per leaf, in the order of the
slot's leaves), `"shard"` (the default rule below), `"replicate"`, or a function from a
leaf's shape to a `PartitionSpec`. Slots are named by index, by their name (`"dense(3→8)"`)
or by their kind (`"dense"`, the name before its parenthesis), first match in that order;
the rest take the default.

The default rule is FSDP's: each leaf is split along its largest dimension divisible by the
size of the model axis (the first such, on a tie), and replicated when none is, or when the
mesh has no model axis. A slot whose arrays cannot be split as asked (an axis not of the
mesh, a dimension not divisible by the devices along it, a spec longer than the array) is
refused while the step is set up, with a `LayoutError` naming the slot, the shape and the
axis.

Optimiser state mirrors the parameters: every subtree of the state shaped like the
parameter point (Adam's moments, momentum's sum) takes the parameters' partition, the rest
(counts, scalars, a metric's factors) is replicated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from categories import Product
from categories.errors import KindError, LayoutError

from ..inputs import need_lens
from ..optimisers import slot_names

tree_util = jax.tree_util


def _axis_sizes(axes) -> dict:
    """The mesh's axis sizes as a dict name ↦ size: from a `Mesh`, or a mapping whose sizes
    are integers ≥ 1 (`LayoutError` otherwise; `KindError` for neither)."""
    if isinstance(axes, Mesh):
        return dict(axes.shape)
    if not isinstance(axes, Mapping):
        raise KindError(f"Layout.specs: axes must be a jax.sharding.Mesh or a dict from mesh "
                        f"axis name to its number of devices (e.g. {{'model': 4}}), got "
                        f"{type(axes).__name__} {axes!r}")
    for name, size in axes.items():
        if isinstance(size, (bool, np.bool_)) or not isinstance(size, (int, np.integer)) \
                or size < 1:
            raise LayoutError(f"Layout.specs: mesh axis {name!r} must have an integer number "
                              f"of devices ≥ 1, got {size!r}")
    return {name: int(size) for name, size in axes.items()}


class Layout:
    """A partition of each parameter slot's arrays over named mesh axes: a rule per slot
    (by index, name or kind), the rest by `default`, splitting over the mesh axis `axis`.

    Examples:
        Over a mesh whose model axis has 4 devices, the default rule splits dense(3→8)'s
        weight (8, 3) along its 8 rows and its bias (8,) alike; a slot asked to replicate is
        replicated.

        >>> model = dense(3, 8) >> tanh >> dense(8, 2)
        >>> Layout(slots={2: "replicate"}).specs(model, {"model": 4})
        ((P('model', None), P('model',)), None, (P(), P()))
        >>> Layout(slots={"dense": jax.sharding.PartitionSpec(None, "model")}).specs(model, {"model": 4})
        Traceback (most recent call last):
        ...
        categories.errors.LayoutError: slot 0 (dense(3→8)): a leaf of shape (8, 3) cannot be split along dimension 1 (3) over mesh axis 'model' of 4 devices: ...
    """

    def __init__(self, default="shard", slots=None, axis: str = "model"):
        if not isinstance(axis, str):
            raise KindError(f"Layout: axis must be the name of a mesh axis (a str), got {axis!r}")
        self.default, self.axis = _rule(default, "default"), axis
        slots = {} if slots is None else slots
        if not isinstance(slots, dict):
            raise KindError(f"Layout: slots must be a dict from slot index, name or kind to a "
                            f"rule, got {type(slots).__name__}")
        self.slots = {k: _rule(v, f"slot {k!r}") for k, v in slots.items()}

    def _rule_for(self, i: int, name: str):
        kind = name.split("(")[0]
        for key in (i, name, kind):
            if key in self.slots:
                return self.slots[key]
        return self.default

    def specs(self, model, axes) -> object:
        """The `PartitionSpec` of each leaf of `model`'s parameter point (its pytree), over a
        mesh of these axis sizes (a `Mesh` or a dict name ↦ size, each an integer ≥ 1),
        checked against them."""
        need_lens(model, "Layout.specs")
        sizes = _axis_sizes(axes)
        names, point = slot_names(model), model.param.zeros()
        several = isinstance(model.param, Product) and len(names) > 1
        known = set(range(len(names))) | {n.split(" ", 2)[-1][1:-1] for n in names}
        known |= {k.split("(")[0] for k in known if isinstance(k, str)}
        for key in self.slots:
            if key not in known:
                raise LayoutError(f"Layout: no slot of {model.name} is named {key!r}: its slots "
                                  f"are {names}")
        values = point if several else (point,)
        out = []
        for i, (name, value) in enumerate(zip(names, values)):
            rule = self._rule_for(i, name.split(" ", 2)[-1][1:-1])
            leaves, treedef = tree_util.tree_flatten(value)
            specs = _specs(rule, leaves, self.axis, sizes, name)
            out.append(tree_util.tree_unflatten(treedef, specs))
        return tuple(out) if several else out[0]

    def shardings(self, model, mesh: Mesh):
        """A `NamedSharding` per leaf of `model`'s parameter point on `mesh`."""
        return tree_util.tree_map(lambda s: NamedSharding(mesh, s), self.specs(model, mesh),
                                  is_leaf=lambda s: isinstance(s, PartitionSpec))

    def describe(self) -> dict:
        """The layout as plain data (what a saved file records)."""
        def text(r):
            if callable(r) and not isinstance(r, str):
                return f"function {getattr(r, '__qualname__', repr(r))}"
            return repr(r)
        return {"axis": self.axis, "default": text(self.default),
                "slots": {repr(k): text(v) for k, v in self.slots.items()}}

    def __eq__(self, other):
        return isinstance(other, Layout) and (self.default, self.axis, self.slots) == \
            (other.default, other.axis, other.slots)

    def __hash__(self):
        return hash((self.axis, repr(self.describe())))

    def __repr__(self):
        slots = f", slots={self.slots!r}" if self.slots else ""
        return f"Layout({self.default!r}{slots}, axis={self.axis!r})"


def _rule(r, where: str):
    ok = r in ("shard", "replicate") if isinstance(r, str) else (
        isinstance(r, PartitionSpec) or callable(r) or
        (isinstance(r, tuple) and all(isinstance(s, PartitionSpec) for s in r)))
    if not ok:
        raise KindError(f"Layout: the rule of {where} must be 'shard', 'replicate', a "
                        f"PartitionSpec, a tuple of them (one per leaf) or a function shape ↦ "
                        f"PartitionSpec, got {r!r}")
    return r


def largest_divisible(shape, axis: str, sizes: dict) -> PartitionSpec:
    """FSDP's rule: the leaf split along its largest dimension divisible by the size of the
    mesh axis `axis` (the first, on a tie); replicated if none is or the mesh lacks the axis.

    Examples:
        >>> from lenses.training.layout import largest_divisible
        >>> largest_divisible((8, 3), "model", {"model": 4}), largest_divisible((6,), "model", {"model": 4})
        (P('model', None), P())
    """
    n = sizes.get(axis)
    if not n or n == 1:
        return PartitionSpec()
    fits = [d for d in range(len(shape)) if shape[d] % n == 0 and shape[d] >= n]
    if not fits:
        return PartitionSpec()
    d = max(fits, key=lambda j: (shape[j], -j))
    return PartitionSpec(*[axis if j == d else None for j in range(len(shape))])


def _specs(rule, leaves, axis, sizes, name):
    if isinstance(rule, tuple):
        if len(rule) != len(leaves):
            raise LayoutError(f"{name}: the layout gives {len(rule)} PartitionSpecs for its "
                              f"{len(leaves)} arrays (shapes {[np.shape(a) for a in leaves]})")
        chosen = list(rule)
    elif rule == "shard":
        chosen = [largest_divisible(np.shape(a), axis, sizes) for a in leaves]
    elif rule == "replicate":
        chosen = [PartitionSpec() for _ in leaves]
    elif isinstance(rule, PartitionSpec):
        chosen = [rule for _ in leaves]
    else:
        chosen = [rule(tuple(np.shape(a))) for a in leaves]
        for s in chosen:
            if not isinstance(s, PartitionSpec):
                raise KindError(f"{name}: the layout's function returned {s!r}, not a "
                                "PartitionSpec")
    for a, spec in zip(leaves, chosen):
        _check(np.shape(a), spec, sizes, name)
    return chosen


def _check(shape, spec, sizes, name):
    shape = tuple(shape)
    if len(spec) > len(shape):
        raise LayoutError(f"{name}: a leaf of shape {shape} cannot take {spec}: it names "
                          f"{len(spec)} dimensions, the array has {len(shape)}")
    for d, entry in enumerate(spec):
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        for ax in names:
            if ax not in sizes:
                raise LayoutError(f"{name}: a leaf of shape {shape} cannot be split over mesh "
                                  f"axis {ax!r}: the mesh's axes are {tuple(sizes)}")
        n = math.prod(sizes[ax] for ax in names)
        if names and shape[d] % n:
            raise LayoutError(f"{name}: a leaf of shape {shape} cannot be split along dimension "
                              f"{d} ({shape[d]}) over mesh axis {'×'.join(map(repr, names))} of "
                              f"{n} devices: {shape[d]} is not a multiple of {n}; replicate it "
                              "(PartitionSpec()) or split another dimension")


def mirror(opt_shapes, params_shapes, param_shardings, replicated):
    """The sharding of each leaf of an optimiser state: each subtree shaped like the parameter
    point (the same structure, leaves of the same shapes) takes the parameters' shardings,
    every other leaf `replicated`.

    Examples:
        >>> p = (jnp.zeros((4, 2)), jnp.zeros(4))
        >>> from lenses.training.layout import largest_divisible, mirror
        >>> mirror(adam(0.1).init(p), p, ("W", "b"), "rep")
        (EmptyState(), AdamState(count='rep', mu=('W', 'b'), nu=('W', 'b')), EmptyState())
    """
    treedef = tree_util.tree_structure(params_shapes)
    shapes = [np.shape(a) for a in tree_util.tree_leaves(params_shapes)]
    flat = tree_util.tree_leaves(param_shardings)

    def like(x):
        return (tree_util.tree_structure(x) == treedef and
                [np.shape(a) for a in tree_util.tree_leaves(x)] == shapes)

    def one(x):
        if like(x):
            return tree_util.tree_unflatten(treedef, flat)
        return replicated

    return tree_util.tree_map(one, opt_shapes, is_leaf=like)


def per_device_bytes(tree) -> dict:
    """The bytes each device holds of a pytree of arrays, read from their addressable shards:
    {device id: bytes}.

    Examples:
        >>> sum(per_device_bytes((jnp.zeros(4), jnp.zeros((2, 2)))).values()) == 8 * jnp.zeros(()).dtype.itemsize
        True
    """
    held: dict = {}
    for a in tree_util.tree_leaves(tree):
        for shard in a.addressable_shards:
            held[shard.device.id] = held.get(shard.device.id, 0) + shard.data.nbytes
    return held


__all__ = ["Layout", "largest_divisible", "mirror", "per_device_bytes"]
