"""The training state and the report of a step: plain values.

`TrainState` is an immutable NamedTuple of arrays, a pytree like any other: flattening it,
pickling it, copying it, passing it to `jax.jit` or across threads has no side effect, and
nothing about it is computed later. A `Report` holds what a step computed for the user to
read (its loss and largest slope, packed in one small array so that reading it is one
transfer) and the state the step reached, whose fault record it raises when read.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from categories.errors import KindError
from categories.numbers import integer

from .faults import Fault, fault_error


class TrainState(NamedTuple):
    """(parameters p, optimiser state s, ledger): the ledger is one int32 array (count, kind,
    step, slot): the number of steps taken and the first fault not yet seen.

    The fault (`fault`, the ledger's last three entries) is (kind, step, slot), kind a `Fault`
    (0: none), `step` the number (from 1) of the refused step and `slot` the parameter slot
    (for a refused target: the example). The count and the fault share one array because a
    compiled call pays for every buffer it takes and returns (about a microsecond each on the
    CPU): kept apart, with the loop's trip count passed as a third, they made a call of a
    4-16-3 network 8–16% slower (bench/README.md).

    Reading `params` checks nothing: after a refused step the parameters are those before it,
    frozen, and a loop that reads only `state.params` never learns why. Read them as
    `state.check().params` (raises the fault, if any), read a report, or train with `fit`,
    which raises a fault at the end of the chunk it happened in.

    Examples:
        >>> state = TrainState.of(jnp.zeros(2), (), count=3)
        >>> int(state.count), state.fault.tolist(), state.check() is state
        (3, [0, 0, 0], True)
        >>> TrainState.of(jnp.zeros(2), (), count=3, fault=(1, 4, 0)).check()
        Traceback (most recent call last):
        ...
        categories.errors.NonFiniteError: step 4: the covector of slot 0 contains NaN or infinity; ...
    """

    params: Any
    opt_state: Any
    ledger: Any

    @classmethod
    def of(cls, params, opt_state, count=0, fault=(0, 0, 0)) -> "TrainState":
        """The state with this count and fault record (kind, step, slot), kind a `Fault`."""
        kinds = [int(k) for k in Fault]
        most = int(np.iinfo(np.int32).max)  # the ledger is int32
        count = integer(count, "TrainState.of: count (the number of steps taken)", most=most,
                        error=KindError)
        record = [integer(v, "TrainState.of: each entry of fault", most=most, error=KindError)
                  for v in (fault if np.shape(fault) == (3,) else [])]
        if len(record) != 3 or record[0] not in kinds:
            raise KindError(f"fault must be a record (kind, step, slot) with kind one of "
                            f"{kinds} (the values of Fault), got {fault!r}")
        return cls(params, opt_state, jnp.asarray([count, *record], jnp.int32))

    @property
    def count(self):
        """The number of steps taken (a scalar array)."""
        return self.ledger[0]

    def steps_taken(self) -> int:
        """The number of steps taken, read back to the host as an int: one transfer of the
        ledger, which waits for the computation that wrote it and for nothing dispatched after
        it (`int(state.count)` first dispatches an indexing computation, which runs after
        everything already in flight: in `fit`, after the next chunk).

        Examples:
            >>> TrainState.of(jnp.zeros(2), (), count=3).steps_taken()
            3
        """
        return int(np.asarray(self.ledger)[0])

    @property
    def fault(self):
        """The first fault not yet seen: (kind, step, slot), kind 0 if none."""
        return self.ledger[1:]

    def check(self, names=None, note: str = "", spaces=None) -> "TrainState":
        """Raise the recorded fault (a synchronisation point); else return the state."""
        record = np.asarray(self.ledger)[1:]
        if record[0]:
            raise fault_error(self, record, names, note, spaces)
        return self

    def _repr_html_(self) -> str:
        count, kind, step, _ = (int(v) for v in np.asarray(self.ledger))
        kind = Fault(kind)
        leaves = [np.asarray(a) for a in jax.tree_util.tree_leaves(self.params)]
        size = sum(a.size for a in leaves)
        fault = "none" if kind is Fault.NONE else f"{kind.name.lower()} at step {step}"
        return (f"<b>TrainState</b>: {count} steps, {size} parameters in "
                f"{len(leaves)} arrays, fault: {fault}")


def check_ledger(ledger) -> None:
    """Refuse (`KindError`) a ledger that is not one int32 array of shape (4,) (count, kind,
    step, slot), as `TrainState.of` makes it. Static: read off its shape and dtype."""
    shape, dtype = np.shape(ledger), jnp.result_type(ledger) if hasattr(ledger, "dtype") else None
    if shape != (4,) or dtype != jnp.int32:
        raise KindError(f"a TrainState's ledger is an int32 array of shape (4,) (count, fault "
                        f"kind, step, slot; TrainState.of(params, opt_state, count) makes it), "
                        f"got {type(ledger).__name__} of shape {shape} and dtype {dtype}")


class Report:
    """What one step (or a chunk of steps) reports: the loss of the batch at the evaluation
    point and max |p'_i| (None: nothing can move), arrays over the steps of a chunk.

    Reading either is a synchronisation point: a fault recorded in the state the step reached
    (by this step or an earlier one) is raised first, naming the step and the slot.

    Examples:
        >>> step = train_step(dense(2, 1), half_squared_error, gd(0.1))
        >>> state = step.init((jnp.zeros((1, 2)), jnp.ones(1)))
        >>> state, report = step(state, jnp.ones((4, 2)), jnp.full((4, 1), jnp.nan))
        >>> report.loss
        Traceback (most recent call last):
        ...
        categories.errors.NonFiniteError: step 1: the covector of slot 0 (dense(2→1)) contains NaN or infinity; ...
    """

    __slots__ = ("_summary", "_host", "_state", "_moves", "_describe")

    def __init__(self, summary, state: TrainState, moves: bool, describe=(None, "", None)):
        self._summary, self._state = summary, state
        self._host: np.ndarray | None = None
        self._moves, self._describe = moves, describe

    def check(self) -> "Report":
        """Raise the fault the step's state records; else return the report."""
        if self._host is None:
            host = np.asarray(self._summary)  # loss, slope, fault kind: one transfer
            if host.ndim not in (1, 2) or host.shape[-1] != 3 or \
                    not isinstance(self._state, TrainState):
                raise KindError(f"a Report reads a step's rows (loss, slope, fault kind) and the "
                                f"TrainState it reached, as a step makes it, got a summary of "
                                f"shape {host.shape} and a {type(self._state).__name__}")
            # a fault stays recorded until seen, so the last step's kind tells (and one scalar
            # comparison costs far less than a numpy reduction, read at every step)
            if (host[-1, 2] if host.ndim == 2 else host[2]) != 0:
                self._state.check(*self._describe)
            self._host = host
        return self

    @property
    def loss(self):
        return self.check()._host[..., 0]

    @property
    def largest_slope(self):
        return self.check()._host[..., 1] if self._moves else None

    def __getstate__(self):
        return {k: getattr(self, k) for k in self.__slots__}

    def __setstate__(self, fields):
        for k, v in fields.items():
            setattr(self, k, v)

    def __repr__(self):
        return f"Report(loss={self.loss}, largest_slope={self.largest_slope})"

    def _repr_html_(self) -> str:
        return f"<b>Report</b>: loss {np.round(self.loss, 6)}, largest slope " \
               f"{None if self.largest_slope is None else np.round(self.largest_slope, 6)}"


__all__ = ["TrainState", "Report", "check_ledger"]
