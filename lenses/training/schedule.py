"""How steps are scheduled, written once: one call, or a chunk of steps in one dispatch.

A *call* dispatches the checked step (`StepCore.call`) and returns at once: JAX's dispatch
is asynchronous, nothing is read back. A *chunk* runs k steps as one `lax.scan` of the plain
step (`dispatch`), and is judged as a whole when it is settled (`settle`, one read back):
if `faults.chunk_sound` says the checked step would have accepted every step, the chunk's
result is the checked step's, bit for bit; otherwise the chunk is run again from the same
state with the checked step, which refuses the faulting step and records it, and the fault
is raised. The user's `TrainStep.run`, `fit` (in memory or from an iterator, with or without
a mesh, in one process or several) all go through these two functions.

The batches of a chunk are either stacked (a leading axis of k steps) or gathered on the
device from data held there, by a (k, batch) array of indices.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from .faults import chunk_sound, fault_error

tree_map = jax.tree_util.tree_map


def _take(data, idx):
    return tree_map(lambda a: jnp.take(a, idx, axis=0), data)


def _chunk_fn(core, checked: bool, gather: bool):
    """(hyper, state, Xs, Ys) or (hyper, state, data, idx) ↦ (state', rows, sound): k steps
    in one `lax.scan`."""
    def chunk(hyper, state, a, b):
        def body(s, batch):
            if checked:
                s, (loss, sl) = core.checked(hyper, s, *batch)
                return s, (core.row(loss, sl, s.fault[0]), None)
            s, (loss, sl), ok = core.plain(hyper, s, *batch)
            return s, (core.row(loss, sl, 0), ok)

        if gather:  # each step's batch taken from the data on the device, by its indices
            end, (rows, oks) = lax.scan(lambda s, i: body(s, _take(a, i)), state, b)
        else:
            end, (rows, oks) = lax.scan(body, state, (a, b))
        if checked:
            return end, rows, end.fault[0] == 0
        slopes = rows[:, 1] if core.moves else None
        return end, rows, chunk_sound(state.fault, slopes, oks, end.params, core.persistent)

    return chunk


def compiled_chunk(core, checked: bool, gather: bool):
    name = f"chunk/{'checked' if checked else 'plain'}/{'gather' if gather else 'stacked'}"
    return core.jit(name, _chunk_fn(core, checked, gather), batch_dims=2)



class Pending(NamedTuple):
    """A chunk dispatched and not yet judged: the state it started from, what it was given
    (to run it again, checked), and its results on the device."""

    start: Any
    args: tuple
    gather: bool
    end: Any
    rows: Any
    sound: Any


def dispatch(core, hyper, state, data, idx=None) -> Pending:
    """Run a chunk of plain steps from `state` (nothing waits): `data` stacked batches
    (X, Y) with a leading axis of steps, or, with `idx`, data on the device and the (k,
    batch) indices of each step's batch."""
    args = tuple(data) if idx is None else (data, idx)
    end, rows, sound = compiled_chunk(core, False, idx is not None)(hyper, state, *args)
    return Pending(state, args, idx is not None, end, rows, sound)


def settle(core, hyper, pending: Pending, describe):
    """(state, rows on the host) of a chunk judged sound, else of the chunk run again with the
    checked step; a fault found there raises (`faults.fault_error`: step, kind, slot, and the
    state before the faulting step), a synchronisation point either way."""
    rows, sound = jax.device_get((pending.rows, pending.sound))
    if sound:
        return pending.end, rows
    end, rows, _ = compiled_chunk(core, True, pending.gather)(hyper, pending.start, *pending.args)
    rows, record = jax.device_get((rows, end.fault))
    if record[0]:
        raise fault_error(end, record, *describe)
    return end, rows


def run(core, hyper, state, data, describe, idx=None):
    """A chunk dispatched and settled: (state, rows)."""
    return settle(core, hyper, dispatch(core, hyper, state, data, idx), describe)


__all__ = ["Pending", "dispatch", "settle", "run", "compiled_chunk"]
