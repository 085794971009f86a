"""Saved work: a training state written to a portable file that runs no code when read.

`save(path, state, model, opt, key)` writes the parameters, the optimiser state, the step
count, the fault record and the RNG key, together with the model's lens expression and its
parameter object slot by slot, to one **safetensors** file: a JSON header and raw
little-endian array bytes, read without unpickling anything (safetensors was made to replace
pickle for exactly this), of any dtype JAX trains in: safetensors names bfloat16 and the
float8 formats, which its numpy reader does not know, so `load` reads them itself. The
header's metadata carries a SHA-256 checksum of the metadata and of every array's name,
dtype, shape and bytes. The file is written atomically: to a
temporary file in the same directory, flushed and fsync'ed, then renamed over `path` (and
the directory fsync'ed), so a reader sees the old file or the new one, never half of one.

`load(path, model, opt)` checks the file before returning anything: it refuses a file that
is truncated, damaged (checksum) or not a paralens file (`CheckpointError`), and one saved
for another model or optimiser (`CheckpointMismatch`, naming the first slot that differs,
expected against saved). The optimiser state is a pytree (NamedTuples, tuples, optax
states): `load` rebuilds its structure from `opt.init(params)` for the optimiser given and
fills its leaves, checking that paths, shapes and dtypes agree.

A state laid out over a mesh (`Layout`) is saved leaf by leaf, each leaf assembled on the
host from its devices' shards, so no device holds more than it holds in training (a leaf
spread over several processes is gathered whole, one leaf at a time, on each of their
devices: `process_allgather`); the file records the layout's rule. `load(..., mesh=,
layout=)` puts the state laid out on any mesh, of any shape (or on one device, without a
mesh), and refuses a file saved under another layout, naming both.

`fit(..., checkpoints=Checkpoints(path, every=N, resume=True))` uses these files to continue
a run exactly (`lenses.training.fit`): the file also holds the run's progress (its history, the losses
of the epoch in progress, its planned end), under the metadata's "fit" entry.
"""

from __future__ import annotations

import json
import os
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from categories.errors import (CheckpointError, CheckpointMismatch, KindError, ParalensError,
                               SpaceMismatch)

from .files import atomic_write, decode, digest, holdable
from .state import TrainState
from .step import slot_spaces
from ..optimisers import Optimiser, check_params, from_optax, gd, slot_names
from ..optimisers.precision import wide
from ..inputs import need_lens

FORMAT = "paralens-state"
VERSION = 1
_META, _SUM = "paralens", "paralens.sha256"


class Saved(NamedTuple):
    """What `load` returns: the `TrainState`, the RNG key saved with it (None if none was),
    and `info`, the file's description (model expression, parameter object, optimiser, and,
    for a checkpoint written by `fit`, the run's progress under "fit").

    Examples:
        >>> Saved._fields
        ('state', 'key', 'info')
    """

    state: TrainState
    key: Any
    info: dict


# -- helpers -------------------------------------------------------------------------------------

def _paths(tree) -> list:
    """(path string, leaf) for every leaf of the pytree, in flattening order."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [(jax.tree_util.keystr(path), leaf) for path, leaf in flat]


def _slot_of(path: str, names: list) -> str:
    """The slot name a params path starts in ("[2][0]" ↦ names[2])."""
    if len(names) > 1 and path.startswith("["):
        i = int(path[1:path.index("]")])
        return names[i] if i < len(names) else f"slot {i}"
    return names[0]


def _fixed(model):
    need_lens(model, "save/load")
    return model.fixed("save/load")


def _as_optimiser(opt, entry: str):
    if opt is None or isinstance(opt, Optimiser):
        return opt
    if isinstance(opt, optax.GradientTransformation):
        return from_optax(opt)
    raise KindError(f"{entry} needs the optimiser the state was trained with (an Optimiser or an "
                    f"optax transformation), got {type(opt).__name__} {opt!r}")


def need_path(path, who: str) -> None:
    """Refuse (`KindError`, naming `who`) what is not a file path: a non-empty str or an
    `os.PathLike` naming one (not bytes)."""
    if not isinstance(path, (str, os.PathLike)) or not isinstance(os.fspath(path), str) or \
            not os.fspath(path):
        raise KindError(f"{who} needs a file path (a non-empty str or os.PathLike), got "
                        f"{type(path).__name__} {path!r}")


def _is_typed_key(key) -> bool:
    return jnp.issubdtype(getattr(key, "dtype", np.float32), jax.dtypes.prng_key)


def _is_raw_key(key) -> bool:
    """key is raw key data: uint32 words along a last axis, as jax.random.PRNGKey gives (a
    seed such as 3 is not a key: `load` could not give it back as one)."""
    try:
        a = np.asarray(key)
    except (TypeError, ValueError):  # a ragged list, say
        return False
    return a.dtype == np.uint32 and a.ndim >= 1 and a.shape[-1] > 0


# -- save ----------------------------------------------------------------------------------------

def save(path, state: TrainState, model, opt=None, key=None, *, fit: dict | None = None,
         extra_arrays: dict | None = None, layout=None) -> str:
    """Write `state` (parameters, optimiser state, step count, fault record) and `key` to the
    safetensors file `path`, atomically, with the model's expression and parameter object
    and a checksum; return the path. `opt` (optional) is recorded by name; `fit` and
    `extra_arrays` are what `fit` records of a run's progress. Every dtype JAX trains in
    (bfloat16, float8) is read back bit for bit. Refused before anything is written (an
    existing file stays as it was): a point outside the parameter object (`DomainError`),
    which `load` would refuse; an optimiser state not of `opt` (`SpaceMismatch`; without
    `opt`, not stateless: `KindError`), which the file would mislabel; a `key` that is not
    a JAX random key (a seed such as 3 is not one), `extra_arrays` not a dict of arrays, a
    `fit` JSON cannot write (`KindError`). `layout`: the `Layout` the state is laid out by,
    recorded (a state split over a mesh is written from its shards, `_host`).

    Examples:
        >>> import os, tempfile
        >>> model = dense(2, 1)
        >>> step = train_step(model, half_squared_error, gd(0.1))
        >>> state = step.init((jnp.zeros((1, 2)), jnp.ones(1)))
        >>> path = save(os.path.join(tempfile.mkdtemp(), "run.st"), state, model, gd(0.1))
        >>> load(path, model, gd(0.1)).state.params[1].tolist()
        [1.0]
    """
    model, names = _check_save(path, state, model, opt, key, fit, extra_arrays)
    from safetensors.numpy import save as st_save

    tensors, params, opt_state = {}, _paths(state.params), _paths(state.opt_state)
    for prefix, leaves in (("params", params), ("opt_state", opt_state)):
        for p, leaf in leaves:
            tensors[f"{prefix}{p}"] = holdable(f"the entry {prefix}{p}", _host(leaf))
    # the ledger read back whole, then its fields on the host: indexing it on the device would
    # queue an operation behind whatever is in flight (in fit, the next chunk) and wait for it
    host = state._replace(ledger=np.asarray(state.ledger))
    tensors["count"], tensors["fault"] = np.asarray(host.count), np.asarray(host.fault)
    typed = key is not None and _is_typed_key(key)
    if key is not None:
        tensors["key"] = np.asarray(jax.random.key_data(key) if typed else key)
    for name, a in (extra_arrays or {}).items():
        tensors[f"extra.{name}"] = holdable(f"extra_arrays[{name!r}]", a)
    meta = {
        "format": FORMAT, "version": VERSION,
        "model": model.term(), "param_space": repr(model.param),
        "slots": [[n, repr(s)] for n, s in zip(names, slot_spaces(model))],
        "params": [p for p, _ in params], "opt_state": [p for p, _ in opt_state],
        "opt_state_tree": str(jax.tree_util.tree_structure(state.opt_state)),
        "optimiser": repr(opt) if opt is not None else None,
        "key": None if key is None else ("typed:" + str(jax.random.key_impl(key)) if typed
                                         else "raw"),
        "extra": sorted(extra_arrays or {}),
        "fit": fit,
    }
    if layout is not None:  # recorded only when there is one: files without it stay as they were
        meta["layout"] = _layout_of(layout).describe()
    meta_json = json.dumps(meta, sort_keys=True)
    data = st_save(tensors, metadata={_META: meta_json, _SUM: digest(meta_json, tensors)})
    try:
        atomic_write(os.fspath(path), data)
    except OSError as e:
        raise CheckpointError(f"cannot write the file {os.fspath(path)!r}: {e}") from None
    return os.fspath(path)


def _host(leaf) -> np.ndarray:
    """The leaf on the host, assembled there from its devices' shards: no device holds more of
    it than its own shard. A leaf spread over several processes is gathered whole on their
    devices (`process_allgather`), one leaf at a time."""
    if not isinstance(leaf, jax.Array) or leaf.is_fully_replicated:
        return np.asarray(leaf)
    if not leaf.is_fully_addressable:
        from jax.experimental.multihost_utils import process_allgather

        return np.asarray(process_allgather(leaf, tiled=True))
    out = np.empty(leaf.shape, leaf.dtype)
    for shard in leaf.addressable_shards:
        out[shard.index] = np.asarray(shard.data)
    return out


def _layout_of(layout):
    from .layout import Layout

    if not isinstance(layout, Layout):
        raise KindError(f"layout must be a Layout, got {type(layout).__name__} {layout!r}")
    return layout


def _check_save(path, state, model, opt, key, fit, extra_arrays):
    """(the fixed model, its slot names) if `state` can be saved for it at `path`, with `opt`
    and the optional arguments."""
    need_path(path, "save")
    if not isinstance(state, TrainState):
        raise KindError(f"save needs a TrainState (from step.init(params) or fit), got "
                        f"{type(state).__name__}: wrap parameters with step.init(params)")
    model = _fixed(model)
    names = slot_names(model)
    check_params(model.param, state.params, names)
    why = model.param.mismatch(state.params, "the parameters")
    if why:
        raise SpaceMismatch(f"save: the state is not one of {model.name} (parameter object "
                            f"{model.param!r}): {why}")
    model.param.check(state.params, "the parameters to save")
    _check_optimiser(opt, state)
    _check_extras(key, fit, extra_arrays)
    return model, names


def _check_optimiser(opt, state) -> None:
    """Refuse a state that is not one of `opt` (the optimiser the file will name, which
    `load` rebuilds the state from), or, without `opt`, one that is not stateless."""
    opt = _as_optimiser(opt, "save")
    if opt is not None:
        opt.check_state(state.opt_state, state.params, "save: the optimiser state")
        return
    try:
        gd(1.0).check_state(state.opt_state, state.params)  # what `load` without opt expects
    except SpaceMismatch:
        raise KindError("save: the state holds the state of an optimiser with a state: pass "
                        "that optimiser, save(path, state, model, opt), so that load can "
                        "rebuild it") from None


def _check_extras(key, fit, extra_arrays) -> None:
    """Refuse (`KindError`, naming the argument) what a saved file cannot hold: a key that is
    not a JAX random key, extra arrays that are not a dict of arrays by name, a `fit` record
    that JSON cannot write."""
    if key is not None and not _is_typed_key(key) and not _is_raw_key(key):
        raise KindError(f"save: key must be a JAX random key (jax.random.key(seed) or "
                        f"jax.random.PRNGKey(seed)) or None, got {type(key).__name__} {key!r}")
    if extra_arrays is not None:
        if not isinstance(extra_arrays, dict):
            raise KindError(f"save: extra_arrays must be a dict of arrays by name, got "
                            f"{type(extra_arrays).__name__}: pass {{'name': array}}")
        for name, a in extra_arrays.items():
            if not isinstance(name, str):
                raise KindError(f"save: the names of extra_arrays must be strings, got {name!r}")
            holdable(f"extra_arrays[{name!r}]", a)
    if fit is not None:
        try:
            why = "" if isinstance(fit, dict) and json.dumps(fit) else f"a {type(fit).__name__}"
        except (TypeError, ValueError) as e:
            why = str(e)
        if why:
            raise KindError(f"save: fit must be a dict that JSON can write (numbers, strings, "
                            f"lists, dicts: what fit records of a run's progress), got "
                            f"{fit!r} ({why})")


def _check_slots(path, meta, model) -> list:
    """The model's slot names, if the file's slots are the model's, else `CheckpointMismatch`
    naming the first that differs."""
    names, spaces = slot_names(model), slot_spaces(model)
    saved_slots = meta.get("slots") or []
    for i, (name, space) in enumerate(zip(names, spaces)):
        if i >= len(saved_slots) or saved_slots[i][1] != repr(space):
            got = repr(saved_slots[i][1]) if i < len(saved_slots) else "no such slot"
            raise CheckpointMismatch(f"{os.fspath(path)!r} was saved for {meta.get('model')!r}, "
                                     f"not {model.term()!r}: {name} has parameter object "
                                     f"{space!r}, the file's slot {i} is {got}")
    if len(saved_slots) != len(names):
        raise CheckpointMismatch(f"{os.fspath(path)!r} was saved for {meta.get('model')!r} with "
                                 f"{len(saved_slots)} slots, not {model.term()!r} with {len(names)}")
    return names


# -- load ----------------------------------------------------------------------------------------

def _read(path) -> tuple[dict, dict]:
    """(metadata, tensors) of an intact paralens file, else `CheckpointError`."""
    need_path(path, "load")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CheckpointError(f"cannot read the saved file {os.fspath(path)!r}: {e}") from None
    try:
        tensors = decode(data)
        header_len = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + header_len])
        metadata = header.get("__metadata__") or {}
    except CheckpointError as e:
        raise CheckpointError(f"{os.fspath(path)!r} is not a paralens file: {e}") from None
    except Exception as e:  # noqa: BLE001 - safetensors' own errors (truncation, bad header)
        raise CheckpointError(f"{os.fspath(path)!r} is not a readable safetensors file "
                              f"(truncated or damaged): {e}") from None
    meta_json, saved_sum = metadata.get(_META), metadata.get(_SUM)
    if meta_json is None or saved_sum is None:
        raise CheckpointError(f"{os.fspath(path)!r} is a safetensors file but not one paralens "
                              "saved (no paralens metadata)")
    if digest(meta_json, tensors) != saved_sum:
        raise CheckpointError(f"{os.fspath(path)!r} is damaged: the checksum of its arrays and "
                              "metadata does not match the one saved with them")
    try:
        meta = json.loads(meta_json)
    except ValueError:  # pragma: no cover - the checksum covers the metadata
        raise CheckpointError(f"{os.fspath(path)!r} has unreadable metadata") from None
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise CheckpointError(f"{os.fspath(path)!r} is format {meta.get('format')!r} version "
                              f"{meta.get('version')!r}, not {FORMAT!r} version {VERSION}")
    return meta, tensors


def _widens(saved, expected) -> bool:
    """A saved half-precision accumulator where the optimiser now keeps float32
    (`lenses.optimisers.precision`): files saved before it held them in the parameters' dtype."""
    return saved in (jnp.bfloat16, jnp.float16) and expected == wide(saved)


def _as_saved(a, leaf):
    """The saved optimiser state's array as the template's leaf holds it: a half-precision
    accumulator widened (exactly: every half-precision number is a float32 one)."""
    a = jnp.asarray(a)
    dtype = jnp.result_type(leaf)
    return a.astype(dtype) if _widens(a.dtype, dtype) else a


def _fill(template, prefix: str, saved_paths: list, tensors: dict, where: str, path,
          slot_name) -> Any:
    """The template pytree with its leaves replaced by the saved arrays, after checking that
    the saved leaves are exactly the template's (paths, shapes, dtypes)."""
    want = _paths(template)
    for i, (p, leaf) in enumerate(want):
        if i >= len(saved_paths) or saved_paths[i] != p:
            got = saved_paths[i] if i < len(saved_paths) else "nothing"
            raise CheckpointMismatch(f"{os.fspath(path)!r} was saved for another {where}: at "
                                     f"{slot_name(p)} the expected entry {prefix}{p} is "
                                     f"{prefix}{got} in the file")
        a = tensors[f"{prefix}{p}"]
        shape, dtype = tuple(np.shape(leaf)), np.dtype(jnp.result_type(leaf))
        if tuple(a.shape) != shape:
            raise CheckpointMismatch(f"{os.fspath(path)!r} was saved for another {where}: "
                                     f"{slot_name(p)} ({prefix}{p}) has shape {shape}, the "
                                     f"file holds {tuple(a.shape)}")
        if prefix == "opt_state" and a.dtype != dtype and not _widens(a.dtype, dtype):
            raise CheckpointMismatch(f"{os.fspath(path)!r} was saved for another {where}: "
                                     f"{prefix}{p} has dtype {dtype}, the file holds {a.dtype}")
    if len(saved_paths) != len(want):
        raise CheckpointMismatch(f"{os.fspath(path)!r} was saved for another {where}: it holds "
                                 f"{len(saved_paths)} {prefix} arrays, {len(want)} expected")
    leaves = [_as_saved(tensors[f"{prefix}{p}"], leaf) if prefix == "opt_state"
              else jnp.asarray(tensors[f"{prefix}{p}"]) for p, leaf in want]
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template), leaves)


def load(path, model, opt=None, mesh=None, layout=None) -> Saved:
    """The state saved in `path` for `model` (and the optimiser `opt`, which rebuilds the
    optimiser state's structure; None only for a stateless optimiser such as `gd`), as a `Saved`; with
    `mesh`, put on it, laid out by `layout` if given (any mesh, whatever the one it was saved
    from), else replicated.

    Refuses, before returning anything: an unreadable, truncated or damaged file
    (`CheckpointError`), a file saved for another model or optimiser (`CheckpointMismatch`,
    naming the first slot that differs, or under another layout than `layout`), a saved
    point outside the parameter object.

    Examples:
        >>> import os, tempfile
        >>> model = dense(2, 1)
        >>> state = train_step(model, half_squared_error, adam(0.1)).init(
        ...     (jnp.zeros((1, 2)), jnp.ones(1)))
        >>> path = save(os.path.join(tempfile.mkdtemp(), "run.st"), state, model, adam(0.1),
        ...             jax.random.PRNGKey(3))
        >>> saved = load(path, model, adam(0.1))
        >>> int(saved.state.count), saved.key.tolist(), saved.info["param_space"]
        (0, [0, 3], 'R^{1×2} × R^1')
    """
    model = _fixed(model)
    opt = _as_optimiser(opt, "load")
    _check_target(mesh, layout)
    meta, tensors = _read(path)
    names = _check_slots(path, meta, model)
    _check_layout(path, meta, layout)
    params = _fill(model.param.zeros(), "params", meta["params"], tensors, "model", path,
                   lambda p: _slot_of(p, names))
    try:
        model.param.check(params, f"the saved parameters in {os.fspath(path)!r}")
    except ParalensError as e:
        raise CheckpointError(str(e)) from None
    if opt is None:
        if meta["opt_state"]:
            raise CheckpointMismatch(f"{os.fspath(path)!r} holds the state of the optimiser "
                                     f"{meta.get('optimiser')}: pass that optimiser to load")
        opt_template = gd(1.0).init(params)  # the state of a stateless optimiser, as gd's
    else:
        opt_template = opt.init(params)
    if str(jax.tree_util.tree_structure(opt_template)) != meta["opt_state_tree"]:
        raise CheckpointMismatch(f"{os.fspath(path)!r} holds the state of the optimiser "
                                 f"{meta.get('optimiser')}, whose structure "
                                 f"{meta['opt_state_tree']} is not that of {opt!r}: "
                                 f"{jax.tree_util.tree_structure(opt_template)}")
    opt_state = _fill(opt_template, "opt_state", meta["opt_state"], tensors, "optimiser", path,
                      lambda p: f"the optimiser state entry {p}")
    count, fault = tensors.get("count"), tensors.get("fault")
    if count is None or fault is None or count.shape != () or fault.shape != (3,):
        raise CheckpointError(f"{os.fspath(path)!r} lacks a step count or fault record")
    try:
        state = TrainState.of(params, opt_state, int(count), tuple(int(v) for v in fault))
    except KindError as e:  # a fault record of no known kind: the file is not one we wrote
        raise CheckpointError(f"{os.fspath(path)!r}: {e}") from None
    info = dict(meta)
    info["extra"] = {name: tensors[f"extra.{name}"] for name in meta.get("extra", [])}
    return Saved(_place(state, model, opt, mesh, layout), _key(path, meta, tensors), info)


def _key(path, meta, tensors):
    """The RNG key saved in the file (None if none was)."""
    if meta["key"] is None:
        return None
    raw = tensors.get("key")
    if raw is None:
        raise CheckpointError(f"{os.fspath(path)!r} lacks its RNG key")
    return (jax.random.wrap_key_data(raw, impl=meta["key"][len("typed:"):])
            if meta["key"].startswith("typed:") else jnp.asarray(raw))


def _check_target(mesh, layout) -> None:
    """`load`'s mesh and layout, if they are ones (a layout only with a mesh)."""
    if layout is not None:
        _layout_of(layout)
        if mesh is None:
            raise KindError("load(layout=) lays the state out over a mesh: pass mesh= too")
    if mesh is not None and not isinstance(mesh, jax.sharding.Mesh):
        raise KindError(f"mesh must be a jax.sharding.Mesh, got {mesh!r}")


def _check_layout(path, meta, layout) -> None:
    """Refuse a file saved under another layout than `layout` (a file saved without one
    loads under any)."""
    saved = meta.get("layout")
    if layout is not None and saved is not None and saved != layout.describe():
        raise CheckpointMismatch(f"{os.fspath(path)!r} was saved under the layout {saved}, "
                                 f"not {layout.describe()}: load it with that layout (or "
                                 "without one, then lay it out anew)")


def _place(state, model, opt, mesh, layout):
    """The state on `mesh`: laid out by `layout` (the optimiser state mirroring the
    parameters), else replicated; as it is without a mesh."""
    from jax.sharding import NamedSharding, PartitionSpec

    from .step import state_shardings

    if mesh is None:
        return state
    if layout is None:
        return jax.device_put(state, NamedSharding(mesh, PartitionSpec()))
    template = opt if opt is not None else _Stateless()
    return jax.device_put(state, state_shardings(model, template, layout, mesh))


class _Stateless:
    """The optimiser template of a stateless optimiser (what `load` is given as None)."""

    @staticmethod
    def init(params):
        return gd(1.0).init(params)  # sharp's and the rate's empty states


__all__ = ["save", "load", "Saved"]
