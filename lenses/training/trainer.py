"""`train_step`: the user's handle on the engine — one checked step per call, or many steps
in one dispatch when asked for (`TrainStep.run`, which is `dispatch` then `settle`, the two
doors `fit` schedules its chunks through).

Each call does what it says when it is made: `step(state, X, Y)` dispatches the checked
step now (JAX's dispatch is asynchronous: nothing is read back) and returns the new state
and a report. A refused step (NaN or infinity in a covector or the new point, a point
leaving an open parameter object, a target out of range) keeps the parameters and the
optimiser state as they were, records the fault in the state, and makes later steps no-ops
until the fault is seen: reading a report, `state.check()` or `step.check(state)`, or the end
of `step.run`, which raises naming the step, the kind and the slot, with `.state`, the state
before the faulting step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from categories.errors import (HyperparameterError, KindError, LayoutError, ParalensError,
                               ShapeError, UnsupportedError)
from categories.numbers import integer

from ..losses import loss_family as as_loss_family
from ..inner_products.metrics import Metric
from ..optimisers import Optimiser, check_floating, check_params, from_optax, slot_names
from ..optimisers.parts import Foreign
from ..inputs import need_lens
from . import schedule
from .state import Report, TrainState, check_ledger
from .step import arguments, core_for, slot_spaces


def _held(opt, cls) -> list:
    """The objects of class `cls` the optimiser holds (its parts, their inner products)."""
    return [x for x in jax.tree_util.tree_leaves(opt, is_leaf=lambda x: isinstance(x, cls))
            if isinstance(x, cls)]


class TrainStep:
    """(state, X, Y) ↦ (state', report): one checked step of learning for a model A → B with
    parameter object P, a loss family on B and an optimiser, compiled once per signature
    (and shared by every `TrainStep` over an equal loss family and an optimiser equal but for
    its numbers: a sweep of learning rates or dampings compiles once).

    Examples:
        Residual r = w·x + b with x = (1, 1) and target 0: each step of gd(0.1) takes r to
        0.7 r, so the losses ½ r² are 0.5, 0.245, 0.12005.

        >>> step = train_step(dense(2, 1), half_squared_error, gd(0.1))
        >>> state = step.init((jnp.zeros((1, 2)), jnp.ones(1)))
        >>> state, report = step.run(state, jnp.ones((3, 4, 2)), jnp.zeros((3, 4, 1)))
        >>> int(state.count), report.loss.round(5).tolist()
        (3, [0.5, 0.245, 0.12005])
    """

    def __init__(self, model, loss_family, opt, reduction: str = "mean", mesh=None,
                 axis: str | None = None, layout=None):
        if reduction not in ("sum", "mean"):
            raise HyperparameterError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
        need_lens(model, "train_step")
        if isinstance(opt, optax.GradientTransformation):
            opt = from_optax(opt)
        if not isinstance(opt, Optimiser):
            raise KindError(f"train_step needs an Optimiser or an optax transformation, got {opt!r}")
        if isinstance(loss_family, Optimiser):  # callable (gd; the others to refuse a call)
            raise KindError(f"train_step needs a loss family, got the optimiser {loss_family!r}: "
                            "train_step(model, loss_family, opt) takes it before the optimiser")
        if mesh is not None and not isinstance(mesh, jax.sharding.Mesh):
            raise KindError(f"mesh must be a jax.sharding.Mesh, got {mesh!r}")
        opt.check_numbers()  # an optimiser made by tree_map or dataclasses.replace, unchecked
        fixed = model.fixed("train_step")
        for metric in _held(opt, Metric):  # a metric tied to a model (K-FAC's) is tied to this one
            metric.check_model(fixed, "train_step")
        for part in _held(opt, Foreign):  # an optax transformation, on these parameters' shapes
            part.check_on(jax.eval_shape(fixed.param.zeros), "train_step")
        self.model, self.loss_family, self.opt = fixed, as_loss_family(loss_family), opt
        self.reduction, self.mesh = reduction, mesh
        self.layout = layout
        self.axis = _data_axis(mesh, layout, axis)
        self.names = slot_names(fixed)
        self.spaces = slot_spaces(fixed)
        self._core = core_for(fixed, self.loss_family, opt, reduction, mesh, self.axis, layout)
        self._hyper = arguments(opt)  # the compiled step's first argument: its numbers traced
        if mesh is not None:
            self._hyper = jax.device_put(self._hyper, NamedSharding(mesh, PartitionSpec()))
        self._call = self._core.compiled("call")
        self._describe = (self.names, opt.outside_note(), self.spaces)

    def init(self, params) -> TrainState:
        """The state (p, s₀, 0, no fault) for the initial point p."""
        check_params(self.model.param, params, self.names)
        self.model.param.check(params, "the initial parameters")
        check_floating(self.model.param, params, self.names)
        return self.place(TrainState.of(params, self.opt.init(params)))

    def place(self, state: TrainState) -> TrainState:
        """The state where this step keeps it: laid out over the mesh by the layout (the
        optimiser state mirroring the parameters), replicated over a mesh without one, else
        as it is. Parameters of an integer dtype, which no step can move, are refused
        (`DomainError`, naming the slot)."""
        _need_state(state)
        check_floating(self.model.param, state.params, self.names, "the state's parameters")
        check_ledger(state.ledger)
        self.opt.check_state(state.opt_state, state.params, "the state's optimiser state")
        if self._core.state_shardings is not None:
            return jax.device_put(state, self._core.state_shardings)
        if self.mesh is not None:  # replicated over the mesh, across processes too
            return jax.device_put(state, NamedSharding(self.mesh, PartitionSpec()))
        return state

    def global_batch(self, local, stacked: bool = False):
        """The batch split over the mesh from this process's own rows of it
        (`jax.make_array_from_process_local_data`: each process feeds its shard); with
        `stacked`, a stack of batches (a leading axis of steps, split along the next). A step
        without a mesh has nothing to split over (`UnsupportedError`).

        Examples:
            >>> train_step(dense(2, 1), half_squared_error, gd(0.1)).global_batch(np.ones((4, 2)))
            Traceback (most recent call last):
                ...
            categories.errors.UnsupportedError: global_batch splits a batch over the step's mesh...
        """
        if self.mesh is None:
            raise UnsupportedError(f"global_batch splits a batch over the step's mesh, but "
                                   f"{self!r} has none: pass the batch to the step as it is, "
                                   "or build the step with train_step(..., mesh=Mesh(...))")
        spec = PartitionSpec() if self.axis is None else \
            PartitionSpec(None, self.axis) if stacked else PartitionSpec(self.axis)
        sharding = NamedSharding(self.mesh, spec)
        return jax.tree_util.tree_map(
            lambda a: jax.make_array_from_process_local_data(sharding, np.asarray(a)), local)

    def __call__(self, state: TrainState, X, Y):
        """Dispatch the checked step now: (state', report). Nothing is read back."""
        _need_state(state)
        if self.mesh is not None:
            self.check_split(_rows(X))
        X, Y = _own(X), _own(Y)
        try:
            new, row = self._call(self._hyper, state, X, Y)
        except ParalensError:
            raise
        except Exception as e:  # noqa: BLE001 - what JAX refuses before tracing (a string batch)
            self._diagnose(state, X, Y, e)
            raise
        return new, Report(row, new, self._core.moves, self._describe)

    def run(self, state: TrainState, Xs, Ys):
        """Many steps in one dispatch: `Xs`, `Ys` stack k batches (a leading axis of steps).
        Runs them as one loop of the checked step (the loop a call runs for one step), and
        reads back once, at its end: a refused step makes the later ones no-ops, and the fault
        is raised (step, kind, slot, `.state`, the state before it). Returns (state', report)
        with the reports of the k steps as arrays; state and reports are those of k calls,
        bit for bit."""
        _need_state(state)
        k = _stack_length(Xs, "Xs")
        if _stack_length(Ys, "Ys") != k:
            raise ShapeError(f"run needs as many stacked targets as batches: {k} batches of "
                             f"inputs, {_stack_length(Ys, 'Ys')} of targets")
        if self.mesh is not None:
            self.check_split(_rows(jax.tree_util.tree_map(lambda a: a[0], Xs)))
        Xs, Ys = _own(Xs), _own(Ys)
        try:
            new, rows = self.settle(self.dispatch(state, (Xs, Ys)))
        except ParalensError:
            raise
        except Exception as e:  # noqa: BLE001 - what JAX refuses before tracing
            X0, Y0 = jax.tree_util.tree_map(lambda a: a[0], (Xs, Ys))  # the first step's batch
            self._diagnose(state, X0, Y0, e)
            raise
        return new, Report(rows, new, self._core.moves, self._describe)

    def dispatch(self, state: TrainState, data, idx=None) -> schedule.Pending:
        """A chunk of checked steps from `state`, dispatched (nothing waits, nothing is
        checked here: the caller has checked the batches): `data` stacked batches (Xs, Ys)
        with a leading axis of steps, or, with `idx`, data on the device and the (k, batch)
        indices of each step's batch. Settle it with `settle`.

        Examples:
            >>> step = train_step(dense(2, 1), half_squared_error, gd(0.1))
            >>> state = step.init((jnp.zeros((1, 2)), jnp.ones(1)))
            >>> pending = step.dispatch(state, (jnp.ones((3, 4, 2)), jnp.zeros((3, 4, 1))))
            >>> state, rows = step.settle(pending)
            >>> int(state.count), rows[:, 0].round(5).tolist()
            (3, [0.5, 0.245, 0.12005])
        """
        _need_state(state)
        if idx is None and not (isinstance(data, (tuple, list)) and len(data) == 2):
            raise KindError(f"dispatch takes data = (Xs, Ys), stacked batches of inputs and "
                            f"targets (or data on the device with idx), got "
                            f"{type(data).__name__}")
        return schedule.dispatch(self._core, self._hyper, state, data, idx)

    def settle(self, pending: schedule.Pending):
        """(state, rows on the host) of a dispatched chunk, a row (loss, slope, fault kind) per
        step: one read back; a fault recorded in the chunk raises, naming the step, the kind
        and the slot, with `.state`, the state before it.

        Examples:
            >>> step = train_step(dense(2, 1), half_squared_error, gd(0.1))
            >>> state = step.init((jnp.zeros((1, 2)), jnp.ones(1)))
            >>> Xs = jnp.ones((2, 4, 2)).at[1, 0, 0].set(jnp.nan)  # step 2 meets a NaN
            >>> try:
            ...     step.settle(step.dispatch(state, (Xs, jnp.zeros((2, 4, 1)))))
            ... except NonFiniteError as e:
            ...     int(e.state.count)
            1
        """
        if not isinstance(pending, schedule.Pending):
            raise KindError(f"settle takes what dispatch returned (a Pending chunk), got "
                            f"{type(pending).__name__}")
        return schedule.settle(pending, self._describe)

    def step_fn(self, state, X, Y):
        """The traceable checked step with this optimiser's numbers: (state', (loss, slope))
        (slope None where nothing can move). What a call compiles; scan it, vmap it."""
        _need_state(state)
        return self._core.checked(self._hyper, state, X, Y)

    def check(self, state: TrainState) -> TrainState:
        """Raise the fault `state` records, naming the step and the slot (a synchronisation
        point); else return the state."""
        _need_state(state)
        return state.check(*self._describe)

    def lowered(self, state: TrainState, X, Y):
        """What a call of this step runs, lowered for these arguments (`jax.stages.Lowered`),
        to inspect: `.compile().as_text()` is the compiled program, `.cost_analysis()` its
        cost."""
        _need_state(state)
        return self._call.lower(self._hyper, state, X, Y)

    @property
    def traces(self) -> dict:
        """How many times each compiled function of this step's engine was traced."""
        return self._core.traces_of(self._hyper)

    def check_split(self, n: int) -> None:
        """Refuse (`ShapeError`) a batch of n examples that the devices of the mesh's data
        axis cannot share evenly; a step without a mesh, or laid out without a data axis,
        takes any batch whole.

        Examples:
            >>> train_step(dense(2, 1), half_squared_error, gd(0.1)).check_split(5)
        """
        n = integer(n, "check_split: n, a batch's number of examples", error=KindError)
        if self.mesh is None or self.axis is None:  # a layout over a mesh without a data axis: the batch is whole
            return
        devices = self.mesh.shape[self.axis]
        if n % devices:
            raise ShapeError(f"a batch of {n} cannot be split evenly over the {devices} devices "
                             f"of mesh axis {self.axis!r}")

    def _diagnose(self, state, X, Y, error):
        """After the compiled call failed with an error of JAX's: the catalogued error that
        names the cause, if the host-side checks find one (else the caller re-raises JAX's)."""
        try:
            self._core.validate(self._hyper, state, X, Y)
        except ParalensError as mine:
            raise mine from error

    def __repr__(self):
        return f"train_step({self.model.name}, {self.opt!r}, reduction={self.reduction!r})"


def _need_state(state) -> None:
    if not isinstance(state, TrainState):
        raise KindError(f"a training step takes a TrainState (from step.init(params)), got "
                        f"{type(state).__name__}: pass step.init(params), not the parameters")


_DEVICE_ARRAY = type(jnp.zeros(()))  # JAX's array class (an exact type test is the fast one)


def _own(batch):
    """A numpy batch copied, whatever its ndarray subclass (an `np.memmap` a data loader hands
    out, a user's subclass): on the CPU, JAX may read a numpy argument's memory in place while
    the step runs, after the call has returned, and a buffer the caller refills for the next
    step would then change this one. The step reads the batch as it was at the call. (The copy
    costs about 2 µs for a 32×4 batch; `np.array` makes a plain ndarray of any subclass.)"""
    kind = type(batch)
    if kind is _DEVICE_ARRAY:  # the common cases, without walking a tree of one leaf
        return batch
    if kind is np.ndarray:
        return batch.copy()
    return jax.tree_util.tree_map(lambda a: np.array(a) if isinstance(a, np.ndarray) else a,
                                  batch)


def _rows(batch) -> int:
    """The number of examples of a batch (its first leaf's leading axis; 0 if none)."""
    leaves = jax.tree_util.tree_leaves(batch)
    return int(np.shape(leaves[0])[0]) if leaves and np.ndim(leaves[0]) else 0


def _stack_length(stack, name: str) -> int:
    """k, the leading axis of a stack of k batches."""
    leaves = jax.tree_util.tree_leaves(stack)
    if not leaves or np.ndim(leaves[0]) == 0:
        raise ShapeError(f"run needs {name} stacked with a leading axis of steps, got "
                         f"{type(stack).__name__}")
    k = int(np.shape(leaves[0])[0])
    if k < 1:
        raise ShapeError(f"run needs at least one stacked batch in {name}, got 0")
    return k


def train_step(model, loss_family, opt, reduction: str = "mean", mesh=None, axis=None,
               layout=None) -> TrainStep:
    """The checked step (state, X, Y) ↦ (state', report) for `model` under `loss_family`.

    With `mesh` alone, the batch is split over the mesh axis `axis` (default: the first) and
    every device holds the whole state. With `layout` (a `Layout`) too, the parameters and the
    optimiser state live partitioned over the mesh by the layout for the whole run, and the
    batch is split over `axis` (default: the mesh's axis "data", if it has one; else whole).

    Examples:
        >>> step = train_step(dense(2, 1), half_squared_error, gd(0.1))
        >>> state = step.init((jnp.zeros((1, 2)), jnp.ones(1)))
        >>> state, report = step(state, jnp.ones((4, 2)), jnp.zeros((4, 1)))
        >>> int(state.count), float(report.loss), float(report.largest_slope)
        (1, 0.5, 1.0)
    """
    return TrainStep(model, loss_family, opt, reduction, mesh, axis, layout)


def _data_axis(mesh, layout, axis):
    """The mesh axis the batch is split over: `axis` if given; else, with a layout, the mesh's
    axis "data" if it has one (none: the batch is whole); with a mesh alone, its first axis;
    without a mesh, none."""
    from .layout import Layout

    if layout is not None:
        if mesh is None:
            raise KindError("layout= partitions the state over a mesh: pass mesh=Mesh(devices, "
                            "('data', 'model')) too")
        if not isinstance(layout, Layout):
            raise KindError(f"layout must be a Layout, got {layout!r}")
    if axis is not None and not isinstance(axis, str):
        raise KindError(f"axis must be the name of a mesh axis (a str), got "
                        f"{type(axis).__name__} {axis!r}")
    if axis is not None and mesh is None:
        raise LayoutError(f"axis={axis!r} splits each batch over a mesh axis, but no mesh was "
                          "given: pass mesh=Mesh(devices, (axis,)) too, or drop axis")
    if axis is not None and axis not in mesh.axis_names:
        raise LayoutError(f"axis={axis!r} is not an axis of the mesh, whose axes are "
                          f"{tuple(mesh.axis_names)}: pass one of them, or a mesh with an axis "
                          f"{axis!r}")
    if axis is not None or mesh is None:
        return axis
    if layout is not None:
        return "data" if "data" in mesh.axis_names else None
    return mesh.axis_names[0]


__all__ = ["TrainStep", "train_step"]
