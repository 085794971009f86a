"""The training step assembled from model, loss, metric and update.

One step is two phases, as the theory requires. First every covector is computed: the batched
forward pass at the optimiser's lookahead point keeps its intermediates, the loss supplies
dL at the output, and the backward pass deposits one covector on each parameter slot (added
over the batch). Only then does anything move: the optimiser sharpens the covectors and
steps. The whole step is one jit-compiled function, built once per `TrainStep`.

Faults surface without a round-trip per step. A step whose covector or new point is not
finite, or whose new point leaves the open parameter object, is refused *on the device*: the
compiled step keeps the old parameters and optimiser state (bit for bit), records the first
fault in the state (`TrainState.fault`: its kind, the step's number, the slot), and every
later step is a no-op until the fault is seen. It is seen, and raised (`NonFiniteError` or
`DomainError`, naming the step and the slot, carrying `.state`, the state as it was before
the faulting step), at the next synchronisation point: reading the report of a step
(`report.loss`, `report.largest_slope`, `report.check()`), `step.check(state)` or
`state.check()`, or the end of a chunk of `fit`. Nothing waits for the host in between.

The parameters' structure and the batch are checked against the model's spaces while the
step is traced, that is once per compiled signature, not once per call.

With `mesh=`, the batch is split over the mesh's devices along axis 0; phase one runs per
device under `shard_map` and the loss and parameter covectors are added across devices
(`psum`); phase two runs on the summed covectors with the parameters replicated.
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from categories import Covector, DomainError, Product

from .checks import largest_slope
from .losses import batch_loss, loss_family as as_loss_family
from .metrics import Context
from .optimisers import NonFiniteError, Optimiser, check_params, finite_flags, from_optax, slot_names
from .para_lens import batched

tree_map = jax.tree_util.tree_map

#: fault kinds recorded in `TrainState.fault[0]` (0: none)
FAULTS = {1: "the covector", 2: "the new point", 3: "the new point", 4: "the target"}
NO_FAULT = np.zeros((3,), np.int32)


class TrainState(NamedTuple):
    """(parameters p, optimiser state s, number of steps taken, first fault not yet seen).

    `fault` is (kind, step, slot): kind 0 for none, 1 a covector with NaN or infinity, 2 a new
    point with NaN or infinity, 3 a new point outside the open parameter object, 4 a target
    outside what the loss family accepts (a class label out of range, ...); `step` the number
    (from 1) of the refused step and `slot` the parameter slot (for kind 4: the example)."""

    params: Any
    opt_state: Any
    count: Any
    fault: Any = NO_FAULT

    def check(self, names=None, note: str = "", spaces=None) -> "TrainState":
        """Raise the recorded fault (a synchronisation point); else return the state."""
        kind, step, slot = (int(v) for v in np.asarray(self.fault))
        if kind:
            raise fault_error(self, kind, step, slot, names, note, spaces)
        return self


def fault_error(state: TrainState, kind: int, step: int, slot: int, names=None, note: str = "",
                spaces=None):
    """The error for a recorded fault, with `.state` (the state before the faulting step, the
    fault cleared) and `.step` (the refused step's number)."""
    name = names[slot] if names is not None and slot < len(names) else f"slot {slot}"
    if kind == 4:
        error = ValueError(f"step {step}: the target of example {slot} of the batch is not one "
                           "the loss family accepts (a class label out of range, a probability "
                           "outside [0, 1], NaN, ...); the step is refused and the parameters are "
                           "left as they were")
    elif kind == 3:
        where = f"{spaces[slot]!r}" if spaces is not None and slot < len(spaces) else "its space"
        error = DomainError(f"step {step}: the update leaves the parameter object: the updated "
                            f"point of {name} is outside {where}; the step is refused and the "
                            f"parameters are left as they were{note}")
    else:
        error = NonFiniteError(f"step {step}: {FAULTS[kind]} of {name} contains NaN or infinity; "
                               "the step is refused and the parameters are left as they were")
    error.state, error.step, error.slot = state._replace(fault=NO_FAULT), step, slot
    return error


class Report:
    """The loss of the batch at the evaluation point and max |p'_i| (None: nothing can move).

    Reading either is a synchronisation point: a fault recorded by this step or an earlier
    one is raised first."""

    __slots__ = ("_loss", "_slope", "_state", "_step")

    def __init__(self, loss, slope, state, step):
        self._loss, self._slope, self._state, self._step = loss, slope, state, step

    def check(self) -> "Report":
        self._step.check(self._state)
        return self

    @property
    def loss(self):
        return self.check()._loss

    @property
    def largest_slope(self):
        return self.check()._slope

    def __repr__(self):
        return f"Report(loss={self.loss}, largest_slope={self.largest_slope})"


class TrainStep:
    """(state, X, Y) ↦ (state', report): one pure, compiled step of learning."""

    def __init__(self, model, loss_family, opt, reduction: str = "mean", mesh=None,
                 axis: str | None = None):
        if reduction not in ("sum", "mean"):
            raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
        if isinstance(opt, optax.GradientTransformation):
            opt = from_optax(opt)
        if not isinstance(opt, Optimiser):
            raise TypeError(f"train_step needs an Optimiser or an optax transformation, got {opt!r}")
        model = model.fixed("train_step") if hasattr(model, "fixed") else model
        self.model, self.loss_family, self.opt = model, as_loss_family(loss_family), opt
        self.reduction, self.mesh = reduction, mesh
        self.axis = axis if axis is not None else (mesh.axis_names[0] if mesh is not None else None)
        self.names = slot_names(model)
        P = model.param
        self.spaces = list(P.factors) if isinstance(P, Product) and len(self.names) > 1 else [P]
        self._treedef = jax.tree_util.tree_structure(model.param.zeros())
        self._compiled = self._build()

    # -- the two phases --------------------------------------------------------------------
    def _covectors(self, p_eval, X, Y, reduction):
        """Phase one: (batch loss, parameter covector value) at p_eval."""
        out, pull = batched(self.model).vjp(X, p_eval)
        L = batch_loss(self.loss_family, Y, reduction)
        loss, c = jax.value_and_grad(L.fn)(out)
        _, p_cov = pull(c)
        return loss, p_cov.value

    def _sharded_covectors(self, p_eval, X, Y):
        n, axis = X.shape[0], self.axis
        P, rep = PartitionSpec(axis), PartitionSpec()

        def local(p, x, y):
            loss, cov = self._covectors(p, x, y, "sum")
            return jax.lax.psum((loss, cov), axis)  # covectors landing on one slot are added

        # check_vma=False: the covector of the replicated p is then this device's own (autodiff
        # does not sum it already), so the one explicit psum above is the sum over devices.
        loss, cov = jax.shard_map(local, mesh=self.mesh, in_specs=(rep, P, P),
                                  out_specs=rep, check_vma=False)(p_eval, X, Y)
        if self.reduction == "mean":
            loss, cov = loss / n, tree_map(lambda a: a / n, cov)
        return loss, cov

    def _validate(self, state, X, Y):
        """What is checked once per compiled signature, while the step is traced."""
        if not isinstance(state, TrainState):
            raise TypeError(f"a training step takes a TrainState (from step.init(params)), got "
                            f"{type(state).__name__}: pass step.init(params), not the parameters")
        if jax.tree_util.tree_structure(state.params) != self._treedef:
            check_params(self.model.param, state.params, self.names)
            raise TypeError(f"the parameters do not have the structure of {self.model.param!r}")
        self.loss_family.check_targets(Y, self.model.cod)  # shapes here; values by `targets_ok`
        dom = self.model.dom
        want = [S.shape for S in (dom.factors if isinstance(dom, Product) else (dom,))]
        got = [tuple(x.shape) for x in (X if isinstance(dom, Product) else (X,))]
        if len(got) != len(want) or any(g[1:] != w or not g[0] for g, w in zip(got, want)):
            raise ValueError(f"the batch for {self.model.name} must have shape (n, *{want[0]}) "
                             f"with n ≥ 1 (the domain {dom!r}), got {got if len(got) > 1 else got[0]}")

    def step_fn(self, state, X, Y):
        """The traceable step (what is compiled, and what `fit` scans)."""
        self._validate(state, X, Y)
        targets_ok = self.loss_family.targets_ok(Y)
        opt, space = self.opt, self.model.param
        p_eval = opt.lookahead(state.opt_state, state.params, space)
        if self.mesh is None:
            loss, cov = self._covectors(p_eval, X, Y, self.reduction)
        else:
            loss, cov = self._sharded_covectors(p_eval, X, Y)
        # Phase two: nothing has moved until every covector is known.
        ctx = Context(self.model, self.loss_family, X, Y, self.reduction)
        s_new, p_new, inside = opt.propose(state.opt_state, state.params,
                                           Covector(cov, space), ctx, space)
        cov_ok, new_ok = finite_flags(cov, space), finite_flags(p_new, space)
        in_ok = _inside_flags(space, p_new, inside)
        kinds = jnp.stack([jnp.all(cov_ok), jnp.all(new_ok), jnp.all(in_ok), jnp.all(targets_ok)])
        kinds = kinds.at[:3].set(kinds[:3] | ~kinds[3])  # a bad target is the fault to name
        kind = jnp.where(jnp.all(kinds), 0, 1 + jnp.argmin(kinds)).astype(jnp.int32)
        slot = jnp.stack([jnp.argmin(cov_ok), jnp.argmin(new_ok), jnp.argmin(in_ok),
                          jnp.argmin(targets_ok)])[
            jnp.maximum(kind - 1, 0)].astype(jnp.int32)
        clean = state.fault[0] == 0
        ok = jnp.logical_and(clean, kind == 0)
        # The old state or the new, selected on the device: a refused step changes nothing.
        params, opt_state = tree_map(lambda new, old: jnp.where(ok, new, old),
                                     (p_new, s_new), (state.params, state.opt_state))
        fault = jnp.where(jnp.logical_and(clean, kind != 0),
                          jnp.stack([kind, (state.count + 1).astype(jnp.int32), slot]),
                          jnp.asarray(state.fault, jnp.int32))
        count = state.count + ok.astype(state.count.dtype)
        return TrainState(params, opt_state, count, fault), (loss, largest_slope(cov))

    def _build(self):
        if self.mesh is None:
            return jax.jit(self.step_fn)
        rep = NamedSharding(self.mesh, PartitionSpec())
        batch = NamedSharding(self.mesh, PartitionSpec(self.axis))
        return jax.jit(self.step_fn, in_shardings=(rep, batch, batch), out_shardings=rep)

    # -- public ----------------------------------------------------------------------------
    def init(self, params) -> TrainState:
        """The state (p, s₀, 0, no fault) for the initial point p."""
        check_params(self.model.param, params, self.names)
        self.model.param.check(params, "the initial parameters")
        return TrainState(params, self.opt.init(params), jnp.zeros((), jnp.int32),
                          jnp.zeros((3,), jnp.int32))

    def __call__(self, state: TrainState, X, Y):
        if self.mesh is not None and np.shape(X)[0] % self.mesh.shape[self.axis]:
            raise ValueError(f"a batch of {np.shape(X)[0]} cannot be split evenly over the "
                             f"{self.mesh.shape[self.axis]} devices of mesh axis {self.axis!r}")
        new, (loss, slope) = self._compiled(state, X, Y)
        return new, Report(loss, slope, new, self)

    def check(self, state: TrainState) -> TrainState:
        """Raise the fault `state` records, naming the step and the slot (a synchronisation
        point); else return the state."""
        return state.check(self.names, self.opt._note(), self.spaces)

    def __repr__(self):
        return f"train_step({self.model.name}, {self.opt!r}, reduction={self.reduction!r})"


def _inside_flags(space, p_new, inside):
    """Per slot, whether the new point lies in its factor of the parameter object (the
    optimiser's own verdict `inside` decides; the slots only say where it failed)."""
    if isinstance(space, Product) and isinstance(p_new, tuple):
        per = jnp.stack([S.indicator(q) for S, q in zip(space.factors, p_new)])
    else:
        per = jnp.reshape(space.indicator(p_new), (1,))
    return jnp.where(inside, jnp.ones_like(per), per)


def train_step(model, loss_family, opt, reduction: str = "mean", mesh=None, axis=None) -> TrainStep:
    """The compiled step (state, X, Y) ↦ (state', report) for `model` under `loss_family`."""
    return TrainStep(model, loss_family, opt, reduction, mesh, axis)


# -- evaluation --------------------------------------------------------------------------------

_predictors: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def predict(model, params, X):
    """The batched forward pass f(X, p) (compiled once per model and shapes)."""
    model = model.fixed("predict")
    fn = _predictors.get(model)
    if fn is None:
        fn = _predictors[model] = jax.jit(lambda p, X: batched(model).forward(X, p))
    return fn(params, X)


def accuracy(model, params, X, Y) -> float:
    """Fraction of examples whose largest output is the label (Y integer labels or one-hot)."""
    pred = np.argmax(np.asarray(predict(model, params, X)), axis=-1)
    Y = np.asarray(Y)
    labels = np.argmax(Y, axis=-1) if Y.ndim > 1 else Y
    return float(np.mean(pred == labels))


__all__ = ["TrainState", "Report", "TrainStep", "train_step", "accuracy", "predict", "fault_error"]
