"""Where faults are decided: the one verdict on a step, and the error read back.

A step is accepted when its covector is finite, its new point is finite and inside the open
parameter object, and every target is one the loss family accepts; otherwise it is refused,
and the first refusal is recorded in the state's ledger as (kind, step, slot) — `Fault` names the
kinds. `verdict` decides it on the device for one step (the checked step selects the old
state where it says no, in a call and in a chunk alike); `fault_error` turns a record read
back on the host into the catalogued error.
"""

from __future__ import annotations

import enum
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from categories import DomainError, Product
from categories.errors import NonFiniteError, TargetError

from ..optimisers.faults import finite_flags, slot_maxima


class Fault(enum.IntEnum):
    """The kinds of refusal a state records (`TrainState.fault[0]`).

    Examples:
        >>> Fault(4).name, int(Fault.OUTSIDE)
        ('TARGET', 3)
    """

    NONE = 0
    COVECTOR = 1     #: a covector with NaN or infinity
    NEW_POINT = 2    #: a new point with NaN or infinity
    OUTSIDE = 3      #: a new point outside the open parameter object
    TARGET = 4       #: a target the loss family refuses (slot: the example)


def slope(cov, targets_ok):
    """max |p'_i| over the covector (None: nothing can move): finite exactly when the covector
    is, and NaN where a target is refused (families that check targets on the device)."""
    if not jax.tree_util.tree_leaves(cov):
        if targets_ok is None:
            return None
        return jnp.where(jnp.all(targets_ok), 0.0, jnp.nan)
    largest = jnp.max(slot_maxima(cov, None))
    if targets_ok is not None:
        largest = jnp.where(jnp.all(targets_ok), largest, jnp.nan).astype(largest.dtype)
    return largest


def _inside_flags(space, p_new, inside):
    """Per slot, whether the new point lies in its factor of the parameter object (the
    optimiser's own verdict `inside` decides; the slots only say where it failed)."""
    if isinstance(space, Product) and isinstance(p_new, tuple):
        per = jnp.stack([S.indicator(q) for S, q in zip(space.factors, p_new)])
    else:
        per = jnp.reshape(space.indicator(p_new), (1,))
    return jnp.where(inside, jnp.ones_like(per), per)


def verdict(ledger, cov, p_new, inside, targets_ok, space):
    """(accepted, ledger') for one step, on the device, from the state's ledger (count, kind,
    step, slot): accepted when no fault was pending and the covector, the new point, the
    open set and the targets all pass, and then the count advances; else the ledger keeps the
    pending fault, or records this step's first failure (a refused target is named first: it
    is the cause of whatever else failed).

    Every check is read off a scalar per slot (the largest |coordinate| of the covector,
    shared with the slope, and of the new point; the slot's indicator), so a step pays one
    reduction per leaf, and nothing is copied. The flags are laid end to end in the order in
    which faults are named (targets, covector, new point, open set), so that the first
    failure, its kind and its slot are read off one `argmin`: a few operations for XLA to
    compile rather than one per check."""
    count, clean = ledger[0], ledger[1] == 0
    checks = [(Fault.TARGET, jnp.ones((1,), bool) if targets_ok is None else targets_ok),
              (Fault.COVECTOR, finite_flags(cov, space)), (Fault.NEW_POINT, finite_flags(p_new, space)),
              (Fault.OUTSIDE, _inside_flags(space, p_new, inside))]
    flags = jnp.concatenate([jnp.reshape(f, (-1,)) for _, f in checks])
    kinds = np.concatenate([np.full(np.size(f), int(k), np.int32) for k, f in checks])
    slots = np.concatenate([np.arange(np.size(f), dtype=np.int32) for _, f in checks])
    first = jnp.argmin(flags)  # the first failure (index 0, a pass, when there is none)
    good = flags[first]
    ok = clean & good
    record = jnp.stack([count, jnp.asarray(kinds)[first], count + 1, jnp.asarray(slots)[first]])
    passed = ledger + jnp.asarray([1, 0, 0, 0], ledger.dtype) * ok.astype(ledger.dtype)
    return ok, jnp.where(clean & ~good, record, passed)


def fault_error(state, record, names=None, note: str = "", spaces=None):
    """The catalogued error for the fault record (kind, step, slot) of `state`: `.kind` (a
    `Fault`), `.step`, `.slot`, and `.state`, the state before the faulting step (a refused
    step changed nothing but the record, which is cleared)."""
    kind, step, slot = (int(v) for v in np.asarray(record))
    kind = Fault(kind)
    name = names[slot] if names is not None and slot < len(names) else f"slot {slot}"
    error: Any  # one of three errors of the catalogue, given the fault's attributes below
    if kind is Fault.TARGET:
        error = TargetError(f"step {step}: the target of example {slot} of the batch is not one "
                            "the loss family accepts (a class label out of range, a probability "
                            "outside [0, 1], NaN, ...); the step is refused and the parameters are "
                            "left as they were")
    elif kind is Fault.OUTSIDE:
        where = f"{spaces[slot]!r}" if spaces is not None and slot < len(spaces) else "its space"
        error = DomainError(f"step {step}: the update leaves the parameter object: the updated "
                            f"point of {name} is outside {where}; the step is refused and the "
                            f"parameters are left as they were{note}")
    else:
        what = "the covector" if kind is Fault.COVECTOR else "the new point"
        error = NonFiniteError(f"step {step}: {what} of {name} contains NaN or infinity; the "
                               "step is refused and the parameters are left as they were")
    error.kind, error.step, error.slot = kind, step, slot
    error.state = state._replace(ledger=jnp.asarray(state.ledger).at[1:].set(0))
    return error


__all__ = ["Fault", "slope", "verdict", "fault_error"]
