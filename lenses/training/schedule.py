"""How steps are scheduled, written once: one call, or a chunk of steps in one dispatch.

Every step runs in the one loop of `StepCore.steps`, the checked step its body. A *call*
(`TrainStep.__call__`) dispatches that loop for one step and returns at once: JAX's dispatch
is asynchronous, nothing is read back. A *chunk* dispatches it for k steps (`dispatch`) and
is settled by one read back (`settle`): the rows of its steps, whose last fault kind says
whether its end state holds a fault (whose record is then read too). A step the verdict
refuses leaves the state as it was and makes the chunk's later steps no-ops, so a chunk that
meets a fault ends at the state before it, which the raised error carries. `TrainStep.run`
and every chunk of `fit` (in memory or from an iterator, with or without a mesh, in one
process or several) go through these two functions, by the step's doors `TrainStep.dispatch`
and `TrainStep.settle`.

The batches of a chunk are either stacked (a leading axis of k steps) or gathered on the
device from data held there, by a (k, batch) array of indices.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np

from .faults import fault_error


class Pending(NamedTuple):
    """A chunk dispatched and not yet settled: its end state and rows, on the device."""

    end: Any
    rows: Any


def dispatch(core, hyper, state, data, idx=None) -> Pending:
    """Run a chunk of checked steps from `state` (nothing waits): `data` stacked batches
    (Xs, Ys) with a leading axis of steps, or, with `idx`, data on the device and the (k,
    batch) indices of each step's batch."""
    args = tuple(data) if idx is None else (data, idx)
    k = jax.tree_util.tree_leaves(args[1])[0].shape[0]
    end, rows = core.compiled("stacked" if idx is None else "gather")(
        hyper, state, *args, np.asarray(k, np.int32))
    return Pending(end, rows)


def settle(pending: Pending, describe):
    """(state, rows on the host) of a chunk, a synchronisation point; a fault recorded in its
    end state raises (`faults.fault_error`: step, kind, slot, and the state before it).

    One transfer when the chunk is sound: a fault stays recorded until it is seen, so the
    fault kind in the last row says whether the end state holds one, and only then is its
    record (step and slot) read back."""
    rows = np.asarray(pending.rows)
    if rows[-1, 2] != 0:
        raise fault_error(pending.end, np.asarray(pending.end.fault), *describe)
    return pending.end, rows


__all__ = ["Pending", "dispatch", "settle"]
