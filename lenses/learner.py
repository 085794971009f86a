"""The training step assembled from model, loss, metric and update; the training loop.

One step is two phases, as the theory requires. First every covector is computed: the batched
forward pass at the optimiser's lookahead point keeps its intermediates, the loss supplies
dL at the output, and the backward pass deposits one covector on each parameter slot (added
over the batch). Only then does anything move: the optimiser sharpens the covectors and
steps. The whole step is one jit-compiled function, built once per `TrainStep`.

The step is pure: a refused step (NaN/inf in a covector or the new point → `NonFiniteError`;
a new point outside the open parameter object → `DomainError`; None for a parameterised slot →
`TypeError`) raises and returns nothing, so the caller's state is exactly what it was.

With `mesh=`, the batch is split over the mesh's devices along axis 0; phase one runs per
device under `shard_map` and the loss and parameter covectors are added across devices
(`psum`); phase two runs on the summed covectors with the parameters replicated.
"""

from __future__ import annotations

import sys
import time
import weakref
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from categories import Covector

from .checks import largest_slope
from .losses import batch_loss, loss_family as as_loss_family
from .metrics import Context
from .optimisers import (Optimiser, check_params, finite_flags, from_optax, raise_non_finite,
                         raise_outside, slot_names)
from .para_lens import batched


class TrainState(NamedTuple):
    """(parameters p, optimiser state s, number of steps taken)."""

    params: Any
    opt_state: Any
    count: Any


class Report(NamedTuple):
    """The loss of the batch at the evaluation point, and max |p'_i| (None: nothing can move)."""

    loss: Any
    largest_slope: Any


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
            loss, cov = loss / n, jax.tree_util.tree_map(lambda a: a / n, cov)
        return loss, cov

    def _step(self, state, X, Y):
        opt, space = self.opt, self.model.param
        p_eval = opt.lookahead(state.opt_state, state.params)
        if self.mesh is None:
            loss, cov = self._covectors(p_eval, X, Y, self.reduction)
        else:
            loss, cov = self._sharded_covectors(p_eval, X, Y)
        # Phase two: nothing has moved until every covector is known.
        ctx = Context(self.model, self.loss_family, X, Y, self.reduction)
        s_new, p_new, inside = opt.propose(state.opt_state, state.params,
                                           Covector(cov, space), ctx, space)
        # One small array of flags, so that the host reads back a single buffer.
        flags = jnp.concatenate([finite_flags(cov, space), finite_flags(p_new, space),
                                 jnp.reshape(inside, (1,))])
        report = Report(loss, largest_slope(cov))
        return TrainState(p_new, s_new, state.count + 1), report, flags

    def _build(self):
        if self.mesh is None:
            return jax.jit(self._step)
        rep = NamedSharding(self.mesh, PartitionSpec())
        batch = NamedSharding(self.mesh, PartitionSpec(self.axis))
        return jax.jit(self._step, in_shardings=(rep, batch, batch), out_shardings=rep)

    # -- public ----------------------------------------------------------------------------
    def init(self, params) -> TrainState:
        """The state (p, s₀, 0) for the initial point p."""
        check_params(self.model.param, params, self.names)
        self.model.param.check(params, "the initial parameters")
        return TrainState(params, self.opt.init(params), jnp.zeros((), jnp.int32))

    def __call__(self, state: TrainState, X, Y):
        if jax.tree_util.tree_structure(state.params) != self._treedef:
            check_params(self.model.param, state.params, self.names)
            raise TypeError(f"the parameters do not have the structure of {self.model.param!r}")
        if self.mesh is not None and np.shape(X)[0] % self.mesh.shape[self.axis]:
            raise ValueError(f"a batch of {np.shape(X)[0]} cannot be split evenly over the "
                             f"{self.mesh.shape[self.axis]} devices of mesh axis {self.axis!r}")
        self.loss_family.check_targets(Y, getattr(self.model, "cod", None))  # shape; values if concrete
        new, report, flags = self._compiled(state, X, Y)
        flags = np.asarray(flags)  # the one synchronisation per step: faults are known now
        if not flags.all():
            k = (len(flags) - 1) // 2
            if not flags[:-1].all():
                raise_non_finite(list(flags[:k]), list(flags[k:-1]), self.names)
            raise_outside(self.model.param, new.params, self.names, self.opt._note())
        return new, report

    def __repr__(self):
        return f"train_step({self.model.name}, {self.opt!r}, reduction={self.reduction!r})"


def train_step(model, loss_family, opt, reduction: str = "mean", mesh=None, axis=None) -> TrainStep:
    """The compiled step (state, X, Y) ↦ (state', report) for `model` under `loss_family`."""
    return TrainStep(model, loss_family, opt, reduction, mesh, axis)


# -- evaluation --------------------------------------------------------------------------------

_predictors: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def predict(model, params, X):
    """The batched forward pass f(X, p) (compiled once per model)."""
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


# -- the training loop -------------------------------------------------------------------------

class _Progress:
    """A one-line `\\r` progress writer on stderr (silent unless enabled)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def show(self, text: str):
        if self.enabled:
            sys.stderr.write("\r" + text.ljust(78))
            sys.stderr.flush()

    def close(self):
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _seed(key):
    """A numpy seed from a JAX key (or an int): shuffling happens on the host."""
    if key is None or isinstance(key, int):
        return key or 0
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    return np.asarray(key).astype(np.uint64).ravel().tolist()


def fit(model, loss_family, opt, params, data, epochs: int = 10, batch_size: int = 32,
        key=None, eval_data=None, progress: bool | None = None, reduction: str = "mean",
        mesh=None):
    """Train for `epochs` passes over shuffled minibatches of `data = (X, Y)`.

    Every batch has exactly `batch_size` examples (one compilation): the remainder of each
    shuffled epoch is dropped; a fresh shuffle each epoch uses every example over time.
    `params` may also be a `TrainState` to continue training. Returns (state, history), the
    history a list of per-epoch dicts: epoch, loss (mean over the epoch's steps), steps_per_s,
    and accuracy on `eval_data` when given. `progress=None` shows a progress line only when
    stderr is a terminal.
    """
    # Batches are cut and shuffled on the host (numpy), then sent to the compiled step.
    X, Y = np.asarray(data[0]), np.asarray(data[1])
    n = int(X.shape[0])
    batch_size = min(int(batch_size), n)
    steps = n // batch_size
    rng = np.random.default_rng(_seed(key))
    step = train_step(model, loss_family, opt, reduction, mesh)
    state = params if isinstance(params, TrainState) else step.init(params)
    show = _Progress(sys.stderr.isatty() if progress is None else bool(progress))
    history = []
    try:
        for epoch in range(1, epochs + 1):
            order = rng.permutation(n)[: steps * batch_size]
            order = order.reshape(steps, batch_size)
            losses, t0, shown = [], time.perf_counter(), 0.0
            for i in range(steps):
                state, report = step(state, X[order[i]], Y[order[i]])
                losses.append(report.loss)
                now = time.perf_counter()
                if show.enabled and now - shown > 0.1:  # at most ten redraws a second
                    shown = now
                    show.show(f"epoch {epoch}/{epochs}  step {i + 1}/{steps}  "
                              f"loss {float(report.loss):.4g}  {(i + 1) / (now - t0):.0f} steps/s")
            record = {"epoch": epoch, "loss": float(np.mean(jax.device_get(losses))),
                      "steps_per_s": steps / max(time.perf_counter() - t0, 1e-9)}
            if eval_data is not None:
                record["accuracy"] = accuracy(model, state.params, *eval_data)
            history.append(record)
            show.show(f"epoch {epoch}/{epochs}  loss {record['loss']:.4g}  "
                      f"{record['steps_per_s']:.0f} steps/s"
                      + (f"  accuracy {record['accuracy']:.3f}" if "accuracy" in record else ""))
    finally:
        show.close()
    return state, history


__all__ = ["TrainState", "Report", "TrainStep", "train_step", "fit", "accuracy", "predict"]
