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
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from categories import Covector, DomainError, Product
from categories.spaces import euclidean
from categories.errors import (HyperparameterError, KindError, ParalensError, ShapeError,
                               SpaceMismatch, TargetError)

from .losses import batch_loss, loss_family as as_loss_family
from .metrics import Context
from .optimisers import NonFiniteError, Optimiser, check_params, finite_flags, from_optax, slot_names
from .para_lens import batched, check_batch, need_lens

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
        error = TargetError(f"step {step}: the target of example {slot} of the batch is not one "
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
            raise HyperparameterError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
        need_lens(model, "train_step")
        if isinstance(opt, optax.GradientTransformation):
            opt = from_optax(opt)
        if not isinstance(opt, Optimiser):
            raise KindError(f"train_step needs an Optimiser or an optax transformation, got {opt!r}")
        model = model.fixed("train_step")
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
            raise KindError(f"a training step takes a TrainState (from step.init(params)), got "
                            f"{type(state).__name__}: pass step.init(params), not the parameters")
        if jax.tree_util.tree_structure(state.params) != self._treedef:
            check_params(self.model.param, state.params, self.names)
            raise SpaceMismatch(f"the parameters do not have the structure of {self.model.param!r}")
        n = check_batch(self.model.dom, X, f"the batch for {self.model.name}")
        Y = self.loss_family.check_targets(Y, self.model.cod)  # shapes here; values: `targets_ok`
        if np.shape(Y)[0] != n:
            raise ShapeError(f"the batch for {self.model.name} has {n} inputs but "
                             f"{np.shape(Y)[0]} targets")

    def _phase_one(self, state, X, Y):
        """(batch loss, parameter covector, context) at the lookahead point; nothing moves."""
        self._validate(state, X, Y)
        p_eval = self.opt.lookahead(state.opt_state, state.params, self.model.param)
        if self.mesh is None:
            loss, cov = self._covectors(p_eval, X, Y, self.reduction)
        else:
            loss, cov = self._sharded_covectors(p_eval, X, Y)
        return loss, cov, Context(self.model, self.loss_family, X, Y, self.reduction)

    def fast_fn(self, state, X, Y):
        """The traceable step without its fault record: (state', loss). `fit` scans it and
        checks the chunk as a whole (`lenses.fitting`); it agrees bit for bit with `step_fn`
        on every step that `step_fn` accepts."""
        loss, cov, ctx = self._phase_one(state, X, Y)
        opt, space, p = self.opt, self.model.param, state.params
        s_new, v = opt.move(state.opt_state, p, Covector(cov, space), ctx, space)
        return TrainState(opt.retract(p, v, space), s_new, state.count + 1, state.fault), loss

    def step_fn(self, state, X, Y):
        """The traceable step, with its fault record (what `train_step` compiles, and what
        `fit` replays on a chunk that was not sound)."""
        loss, cov, ctx = self._phase_one(state, X, Y)
        # Phase two: nothing has moved until every covector is known.
        opt, space, targets_ok = self.opt, self.model.param, self.loss_family.targets_ok(Y)
        p, cov_leaves = state.params, jax.tree_util.tree_leaves(cov)
        clean = state.fault[0] == 0
        # The slope max |p'| is reported, and is finite exactly when the covector is; a bad
        # target joins it as a NaN where the family can check targets on the device.
        pieces = [jnp.ravel(jnp.abs(a)) for a in cov_leaves]
        if targets_ok is not None:
            pieces.append(jnp.where(targets_ok, 0.0, jnp.nan).astype(
                pieces[0].dtype if pieces else jnp.result_type(float)))
        slope = jnp.max(jnp.concatenate(pieces)) if pieces else jnp.asarray(0.0)
        if euclidean(space):
            # No open set to leave: the move v decides. p + v is finite when p and v are and
            # |p|, |v| ≤ max/2, so the fast path reduces over p and v and never waits for the
            # new point, which is computed once, in the update that keeps or drops it; only
            # past that bound (or on a fault) is the new point itself looked at.
            s_new, v = opt.move(state.opt_state, p, Covector(cov, space), ctx, space)
            leaves = jax.tree_util.tree_leaves((p, v))
            size = jnp.max(jnp.concatenate([jnp.ravel(jnp.abs(a)) for a in leaves])) \
                if leaves else jnp.asarray(0.0)
            big = jnp.finfo(size.dtype).max / 2
            fast = jnp.isfinite(slope) & (size <= big)
            new_point = lambda: opt.retract(p, v, space)  # noqa: E731  (p + v here)
            inside = jnp.asarray(True)
        else:  # an open set: the optimiser's own verdict, after backtracking if asked for
            s_new, p_new, inside = opt.propose(state.opt_state, p, Covector(cov, space), ctx, space)
            new_leaves = jax.tree_util.tree_leaves(p_new)
            health = jnp.max(jnp.concatenate([jnp.ravel(a) * 0 for a in new_leaves])) \
                if new_leaves else jnp.asarray(0.0)
            fast = jnp.isfinite(slope) & jnp.isfinite(health) & inside
            new_point = lambda: p_new  # noqa: E731

        def diagnose(_):  # the rare branch: the new point itself, and which fault, which slot
            p_new = new_point()
            cov_ok, new_ok = finite_flags(cov, space), finite_flags(p_new, space)
            in_ok = _inside_flags(space, p_new, inside)
            t_ok = jnp.ones((1,), bool) if targets_ok is None else targets_ok
            kinds = jnp.stack([jnp.all(cov_ok), jnp.all(new_ok), jnp.all(in_ok), jnp.all(t_ok)])
            kinds = kinds.at[:3].set(kinds[:3] | ~kinds[3])  # a bad target is the fault to name
            good = jnp.logical_and(clean, jnp.all(kinds))
            kind = (1 + jnp.argmin(kinds)).astype(jnp.int32)
            slot = jnp.stack([jnp.argmin(cov_ok), jnp.argmin(new_ok), jnp.argmin(in_ok),
                              jnp.argmin(t_ok)])[kind - 1].astype(jnp.int32)
            record = jnp.stack([kind, (state.count + 1).astype(jnp.int32), slot])
            fault = jnp.where(clean & ~good, record, jnp.asarray(state.fault, jnp.int32))
            return good, fault

        ok, fault = lax.cond(jnp.logical_and(clean, fast),
                             lambda _: (jnp.asarray(True), jnp.asarray(state.fault, jnp.int32)),
                             diagnose, None)
        # The old state or the new, selected on the device: a refused step changes nothing.
        params, opt_state = tree_map(lambda new, old: jnp.where(ok, new, old),
                                     (new_point(), s_new), (p, state.opt_state))
        count = state.count + ok.astype(state.count.dtype)
        slope = slope if cov_leaves else None
        return TrainState(params, opt_state, count, fault), (loss, slope)

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
        state = TrainState(params, self.opt.init(params), jnp.zeros((), jnp.int32),
                           jnp.zeros((3,), jnp.int32))
        if self.mesh is not None:  # replicated over the mesh, across processes too
            state = jax.device_put(state, NamedSharding(self.mesh, PartitionSpec()))
        return state

    def global_batch(self, local):
        """The batch split over the mesh from this process's own rows of it
        (`jax.make_array_from_process_local_data`: each process feeds its shard)."""
        sharding = NamedSharding(self.mesh, PartitionSpec(self.axis))
        return tree_map(lambda a: jax.make_array_from_process_local_data(sharding, np.asarray(a)),
                        local)

    def __call__(self, state: TrainState, X, Y):
        if self.mesh is not None and np.shape(X)[0] % self.mesh.shape[self.axis]:
            raise ShapeError(f"a batch of {np.shape(X)[0]} cannot be split evenly over the "
                             f"{self.mesh.shape[self.axis]} devices of mesh axis {self.axis!r}")
        try:
            new, (loss, slope) = self._compiled(state, X, Y)
        except ParalensError:
            raise
        except Exception as e:  # noqa: BLE001 - what JAX refuses before tracing (a string batch)
            self._diagnose(state, X, Y, e)
            raise
        return new, Report(loss, slope, new, self)

    def _diagnose(self, state, X, Y, error):
        """After the compiled call failed with an error of JAX's: the catalogued error that
        names the cause, if the host-side checks find one (else the caller re-raises JAX's).
        Off the hot path: it runs only after a failure."""
        try:
            self._validate(state, X, Y)
        except ParalensError as mine:
            raise mine from error

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
    """The batched forward pass f(X, p) (compiled once per model and shapes). X is checked
    against the model's domain (`ShapeError`) and p against its parameter object
    (`DomainError`) before anything is compiled."""
    need_lens(model, "predict")
    model = model.fixed("predict")
    check_batch(model.dom, X, f"predict({model.name})", concrete_values=True)
    check_params(model.param, params, slot_names(model))
    model.param.check(params, f"the parameters given to predict({model.name})")
    fn = _predictors.get(model)
    if fn is None:
        fn = _predictors[model] = jax.jit(lambda p, X: batched(model).forward(X, p))
    return fn(params, X)


def accuracy(model, params, X, Y) -> float:
    """Fraction of examples whose largest output is the label (Y integer labels or one-hot).

    The model must be a classifier with outputs R^k, k ≥ 2; Y either n integer labels in
    [0, k) or an (n, k) array of one-hot (or probability) rows; else `TargetError`."""
    need_lens(model, "accuracy")
    model = model.fixed("accuracy")
    labels = check_labels(model, X, Y)
    pred = np.argmax(np.asarray(predict(model, params, X)), axis=-1)
    return float(np.mean(pred == labels))


def check_labels(model, X, Y) -> np.ndarray:
    """The integer labels of Y if Y holds labels (or one-hot rows) for the classifier `model`
    and as many examples as X, else `TargetError` (`ShapeError` for X itself)."""
    n = check_batch(model.dom, X, f"accuracy({model.name})")
    cod = model.cod
    if isinstance(cod, Product) or len(cod.shape) != 1 or cod.shape[0] < 2:
        raise TargetError(f"accuracy needs a classifier with outputs R^k, k ≥ 2 (the largest "
                          f"output is the predicted class), but {model.name} has outputs {cod!r}")
    k = cod.shape[0]
    try:
        Y = np.asarray(Y)
    except Exception:  # noqa: BLE001 - a ragged list
        raise TargetError(f"accuracy({model.name}): targets must be an array, got "
                          f"{type(Y).__name__}") from None
    if Y.ndim == 0 or Y.shape[0] != n:
        raise ShapeError(f"accuracy({model.name}): {n} inputs but targets of shape {Y.shape}")
    if Y.ndim == 1:
        if not (np.issubdtype(Y.dtype, np.integer)):
            raise TargetError(f"accuracy({model.name}): labels must be integers in [0, {k}), "
                              f"got dtype {Y.dtype}")
        bad = (Y < 0) | (Y >= k)
        if bad.any():
            i = int(np.argmax(bad))
            raise TargetError(f"accuracy({model.name}): labels must be integers in [0, {k}), got "
                              f"{Y[i]} (example {i})")
        return Y
    if Y.ndim != 2 or Y.shape[1] != k:
        raise TargetError(f"accuracy({model.name}): one-hot targets need shape ({n}, {k}) for "
                          f"outputs {cod!r}, got shape {Y.shape}")
    if not (np.issubdtype(Y.dtype, np.number) or Y.dtype == np.bool_) or \
            np.issubdtype(Y.dtype, np.complexfloating) or not np.all(np.isfinite(Y)):
        raise TargetError(f"accuracy({model.name}): one-hot targets must be finite real numbers")
    return np.argmax(Y, axis=-1)


__all__ = ["TrainState", "Report", "TrainStep", "train_step", "accuracy", "predict", "fault_error",
           "check_labels"]
