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

Calls are deferred and verified afterwards, so that a loop of steps costs what its steps
cost, not what launching them costs. The first call with a new signature is dispatched at
once (what is wrong with it raises at the call); later calls like it are queued, and a queue
runs as `lax.scan` chunks when something reads a state or a report (or when it is long).
Those runs take the plain step, without the fault record, and are verified when a result is
read: the plain and the checked step agree bit for bit on every step the checked one
accepts, and a run the checked step would not have accepted in full is replayed with it from
the state before the run. A loop that reads every report and one that reads at the end give
the same states and reports as the checked step taken one call at a time (on the CPU, bit
for bit; a test checks it).

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


class _Value(NamedTuple):
    """The fields of a computed `TrainState`, as the compiled functions take and give them."""

    params: Any
    opt_state: Any
    count: Any
    fault: Any


class TrainState:
    """(parameters p, optimiser state s, number of steps taken, first fault not yet seen).

    `fault` is (kind, step, slot): kind 0 for none, 1 a covector with NaN or infinity, 2 a new
    point with NaN or infinity, 3 a new point outside the open parameter object, 4 a target
    outside what the loss family accepts (a class label out of range, ...); `step` the number
    (from 1) of the refused step and `slot` the parameter slot (for kind 4: the example).

    A state returned by a training step may not be known yet (its step queued, or dispatched
    and not yet verified: see `TrainStep`); reading a field, flattening the state as a
    pytree, or taking a step with another `TrainStep` makes it known. It unpacks as (params,
    opt_state, count, fault) and supports `_replace`."""

    __slots__ = ("_value", "_later", "_sig")
    FIELDS = _Value._fields

    def __init__(self, params, opt_state, count, fault=NO_FAULT):
        self._value, self._later, self._sig = _Value(params, opt_state, count, fault), None, None

    @classmethod
    def _of(cls, value: _Value, sig=None) -> "TrainState":
        state = cls.__new__(cls)
        state._value, state._later, state._sig = value, None, sig
        return state

    def _get(self) -> _Value:
        """The fields, computing them first if the steps that lead here have not run."""
        if self._value is None:
            later = self._later
            if later.value is None:
                later.step._settle(later)
            self._value, self._later = later.value, None
        return self._value

    params = property(lambda self: self._get().params, doc="the point p of the parameter object")
    opt_state = property(lambda self: self._get().opt_state, doc="the optimiser's state s")
    count = property(lambda self: self._get().count, doc="the number of steps taken")
    fault = property(lambda self: self._get().fault, doc="(kind, step, slot); kind 0: none")

    def __iter__(self):
        return iter(self._get())

    def __len__(self):
        return len(self.FIELDS)

    def __getitem__(self, i):
        return self._get()[i]

    def _replace(self, **fields) -> "TrainState":
        return TrainState(*self._get()._replace(**fields))

    def __repr__(self):
        if self._value is None:
            return "TrainState(<not yet known: read a field to compute it>)"
        fields = ", ".join(f"{k}={v!r}" for k, v in self._value._asdict().items())
        return f"TrainState({fields})"

    def check(self, names=None, note: str = "", spaces=None) -> "TrainState":
        """Raise the recorded fault (a synchronisation point); else return the state."""
        kind, step, slot = (int(v) for v in np.asarray(self.fault))
        if kind:
            raise fault_error(self, kind, step, slot, names, note, spaces)
        return self


jax.tree_util.register_pytree_with_keys(
    TrainState,
    lambda s: (tuple((jax.tree_util.GetAttrKey(k), v) for k, v in zip(s.FIELDS, s._get())), None),
    lambda _, children: TrainState(*children),
    lambda s: (tuple(s._get()), None))


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

    Reading either is a synchronisation point: the step runs if its dispatch was deferred,
    and a fault recorded by this step or an earlier one is raised first."""

    __slots__ = ("__weakref__", "_later", "_loss", "_run", "_slope", "_state", "_step")

    def __init__(self, loss, slope, state, step, later=None):
        self._loss, self._slope, self._state, self._step = loss, slope, state, step
        self._later, self._run = later, None

    def _fill(self, run, j):
        """The step is known, as step j of `run`: let go of the queue."""
        self._run, self._later = (run, j), None

    def check(self) -> "Report":
        if self._later is not None:  # not known yet: run and verify the steps up to this one
            self._step._settle(self._later, state=False)
        if self._run is not None:
            (run, j), self._run = self._run, None
            self._loss, self._slope, refused = run.outputs_at(j)
            # only a refused step keeps a state, to raise its fault from
            self._state = TrainState._of(run.end) if refused else None
        if self._state is not None:
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


class _Later:
    """A step called but not yet known: the state it starts from and its batch; the run it
    was dispatched in (None while queued) and its place there; the report to tell when it is
    known (held weakly); and, once known, the state it reached, if it ended its run."""

    __slots__ = ("X", "Y", "depth", "j", "parent", "report", "run", "shape", "step", "value")

    def __init__(self, step, parent, X, Y, depth, shape):
        self.step, self.parent, self.X, self.Y, self.depth, self.shape = \
            step, parent, X, Y, depth, shape
        self.report = self.run = self.j = self.value = None


class _Run:
    """Steps dispatched together, from the state `start` over the batches of `nodes`: plain
    steps (`checked` False), to be verified, or checked ones, which record what they refuse.
    `prev` and `next` are the unverified runs before and after, `pending` how many runs are
    unverified up to this one. What the steps report comes back as one array, `summary`
    (`_pack`): the losses, the slopes, then the fault kinds (checked) or the verdict on the
    end (`judged`, a plain run).

    Unverified plain runs keep only what verifying them needs: the state before the oldest
    (to replay from) and the states after the newest two (the point to judge, and the one in
    flight); a state in between is computed again if it is asked for."""

    __slots__ = ("checked", "end", "healthy", "host", "judged", "next", "nodes", "pending",
                 "prev", "start", "summary", "verified")

    def __init__(self, start, nodes, end, summary, checked, judged, prev):
        self.start, self.nodes, self.end, self.summary, self.checked, self.judged = \
            start, nodes, end, summary, checked, judged
        self.prev = prev if prev is not None and not prev.verified else None
        self.pending = 1 + (self.prev.pending if self.prev is not None else 0)
        self.verified, self.host, self.next, self.healthy = False, None, None, None
        if self.prev is not None:
            self.prev.next = self
            if not checked:
                self.start = None  # the end of the run before: kept there
                if self.prev.prev is not None:
                    self.prev.prev.end = None

    def got(self, summary: np.ndarray):
        """Keep what was read back: (losses, slopes, kinds), `kinds` None where nothing was
        refused (refusals persist: the last step's kind says), and the verdict on the end."""
        n = len(self.nodes)
        extra = n if self.checked else int(self.judged)
        s = (summary.shape[0] - n - extra) // n  # 0: no slope (no coordinates to move)
        losses, slopes, rest = summary[:n], summary[n:n + n * s] if s else None, summary[n + n * s:]
        kinds = rest if self.checked and rest[-1] else None
        self.healthy = bool(rest[0]) if self.judged else None
        self.host, self.summary = (losses, slopes, kinds), None

    def read(self):
        if self.host is None:
            _read([self], None)
        return self.host

    def outputs_at(self, j):
        losses, slopes, kinds = self.read()
        j = 0 if j is None else j
        return losses[j], (None if slopes is None else slopes[j]), \
            kinds is not None and bool(kinds[j])


class TrainStep:
    """(state, X, Y) ↦ (state', report): one pure, compiled step of learning.

    Calls are deferred and verified afterwards, so that a loop of steps costs what its steps
    cost. The first call with a new signature (the state's structure and shapes, the batch's
    shapes and dtypes) is dispatched at once, so that what is wrong with it raises at the
    call. Later calls like it are queued (or dispatched at once, where a batch is too large
    to stack: `CHUNK_BYTES`); a queue runs when something needs it (a field of a state, a
    report, `check`, a step of another `TrainStep`) or once `DEFER_LIMIT` steps wait, as
    `lax.scan` chunks of a power of two. Runs take the plain step and are verified when a
    result is read (or when `UNVERIFIED_BYTES` of parameters wait): if no fault was pending,
    every slope is finite and the last point is, the checked step would have accepted every
    step, with the same bits; otherwise the runs are replayed from the state before them with
    the checked step, which refuses the faulting step. Either way the states and reports are
    those of the checked step taken one call at a time. Inside a trace, over a mesh, or for a
    batch that is not an array, the checked step is dispatched at once.
    """

    #: a queue this long is run (one dispatch for it all); at most this many runs unverified
    DEFER_LIMIT = 64
    #: runs shorter than this are dispatched a step at a time (no chunk to compile for them)
    SHORTEST_CHUNK = 8
    #: the most bytes of batches one chunk stacks
    CHUNK_BYTES = 4 << 20
    #: the most bytes of parameters that runs waiting to be verified may hold
    UNVERIFIED_BYTES = 64 << 20

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
        self._seen, self._chunks = set(), {}  # signatures found valid; compiled runs
        self._plain_ok, self._kept, self._limits = euclidean(model.param), None, {}

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
        _need_state(state)
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
        new, loss, _ = self._moved(state, X, Y)
        return new, loss

    def _moved(self, state, X, Y):
        """(state', loss, parameter covector): the step, unchecked."""
        loss, cov, ctx = self._phase_one(state, X, Y)
        opt, space, p = self.opt, self.model.param, state.params
        s_new, v = opt.move(state.opt_state, p, Covector(cov, space), ctx, space)
        return TrainState(opt.retract(p, v, space), s_new, state.count + 1, state.fault), loss, cov

    def step_fn(self, state, X, Y):
        """The traceable step, with its fault record (what `train_step` compiles, and what
        `fit` replays on a chunk that was not sound)."""
        loss, cov, ctx = self._phase_one(state, X, Y)
        # Phase two: nothing has moved until every covector is known.
        opt, space, targets_ok = self.opt, self.model.param, self.loss_family.targets_ok(Y)
        p, cov_leaves = state.params, jax.tree_util.tree_leaves(cov)
        clean = state.fault[0] == 0
        slope = _slope(cov, targets_ok)
        slope = jnp.asarray(0.0) if slope is None else slope
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
        return TrainState(params, opt_state, count, fault), (loss, slope if cov_leaves else None)

    def _step_value(self, state, X, Y):
        """`step_fn` on the fields of a state, giving the new fields (the compiled functions
        take and give them as a NamedTuple, which JAX flattens without calling Python)."""
        state = state if isinstance(state, TrainState) else TrainState._of(state)
        new, out = self.step_fn(state, X, Y)
        return new._value, out

    def _build(self):
        if self.mesh is None:
            return jax.jit(self._step_value)
        rep = NamedSharding(self.mesh, PartitionSpec())
        batch = NamedSharding(self.mesh, PartitionSpec(self.axis))
        return jax.jit(self._step_value, in_shardings=(rep, batch, batch), out_shardings=rep)

    # -- deferred dispatch -----------------------------------------------------------------
    def _plain_value(self, state, X, Y):
        """The step without its fault record, with its slope (NaN for a bad target), on the
        fields of a state: (fields', (loss, slope))."""
        new, loss, cov = self._moved(TrainState._of(state), X, Y)
        return new._value, (loss, _slope(cov, self.loss_family.targets_ok(Y)))

    def _signature(self, state, X, Y):
        """What a call's validity depends on (the state's structure and shapes, the batch's
        shapes and dtypes), or None where the call must run now, checked (inside a trace, a
        batch that is not an array, a mesh)."""
        if self.mesh is not None:
            return None
        xs, ys = _array_signature(X), _array_signature(Y)
        if xs is None or ys is None:
            return None
        if state._sig is None:
            leaves, tree = jax.tree_util.tree_flatten(state._get())
            if not all(isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer)
                       for a in leaves):
                return None
            state._sig = (tree, tuple((a.shape, a.dtype) for a in leaves))
        return state._sig, xs, ys

    def _limit(self, node: _Later) -> int:
        """The longest run for batches like this node's (known once per batch shape): a power
        of two up to `DEFER_LIMIT` whose stacked batches fit in `CHUNK_BYTES` (stacking copies
        them), or 0 if that is shorter than `SHORTEST_CHUNK`: a batch that large costs more to
        copy than a dispatch, and its steps are dispatched as they are called."""
        limit = self._limits.get(node.shape)
        if limit is None:
            n = self.CHUNK_BYTES // max(1, node.X.nbytes + node.Y.nbytes)
            n = 1 << (max(1, min(self.DEFER_LIMIT, n)).bit_length() - 1)
            limit = self._limits[node.shape] = n if n >= self.SHORTEST_CHUNK else 0
        return limit

    def _chunk(self, k: int, checked: bool, judged: bool = True):
        """k steps in one dispatch (k > 1: a `lax.scan` over the stacked batches) of the
        checked step or the plain one: (end, summary)."""
        fn = self._chunks.get((k, checked, judged))
        if fn is None:
            def body(value, XY):
                if not checked:
                    return self._plain_value(value, *XY)
                new, (loss, slope) = self.step_fn(TrainState._of(value), *XY)
                return new._value, (loss, slope, new._value.fault[0])

            def chunk(value, Xs, Ys):
                if k == 1:
                    end, outputs = body(value, (Xs[0], Ys[0]))
                else:
                    end, outputs = lax.scan(body, value, (jnp.stack(Xs), jnp.stack(Ys)))
                losses, slopes = outputs[:2]
                if checked:
                    extra = outputs[2]
                elif judged:  # the run's verdict: every slope finite, and the end
                    extra = _healthy(end) if slopes is None else \
                        _healthy(end) & jnp.all(jnp.isfinite(slopes))
                else:
                    extra = None
                return end, _pack(losses, slopes, extra)

            fn = self._chunks[(k, checked, judged)] = jax.jit(chunk)
        return fn

    def _launch(self, start, nodes, prev, checked: bool, judged: bool = True) -> _Run:
        """Dispatch the steps of `nodes` from `start` as one run (nothing waits for it); a
        plain run judges its end (`_healthy`) in the same dispatch if it is a chunk or if
        `judged` (single steps of small batches: a pass over the parameters costs less than
        a dispatch to judge them later)."""
        judged = not checked and (judged or len(nodes) > 1)
        end, summary = self._chunk(len(nodes), checked, judged)(
            start, tuple(n.X for n in nodes), tuple(n.Y for n in nodes))
        run = _Run(start, nodes, end, summary, checked, judged, prev)
        for j, node in enumerate(nodes):
            node.run, node.j = run, j
        return run

    def _dispatch(self, last: _Later) -> None:
        """Dispatch every step up to `last` not yet dispatched (or whose state was not kept),
        from the nearest state known or dispatched: runs of one batch shape, as chunks of a
        power of two where they are long enough, else a step a dispatch. Plain steps where
        the parameter object is a vector space (verified later, `_verify`), checked ones
        where it has an open set to leave."""
        chain, node = [], last
        while True:
            chain.append(node)
            parent = node.parent
            if parent._value is not None:
                start, prev = parent._value, None
                break
            up = parent._later
            if up.run is not None and not up.run.verified:
                if up is up.run.nodes[-1] and up.run.end is not None:
                    start, prev = up.run.end, up.run
                    break
                self._verify(up.run)  # its state was not kept: known first, computed again
            if up.value is not None:
                start, prev = up.value, None
                break
            node = up
        chain.reverse()
        checked, i = not self._plain_ok, 0
        while i < len(chain):
            shape, j = chain[i].shape, i
            while j < len(chain) and chain[j].shape == shape:
                j += 1
            limit = self._limit(chain[i])
            while i < j:  # one shape: chunks of a power of two, then single steps
                k = 1 if limit == 0 or j - i < self.SHORTEST_CHUNK else \
                    1 << (min(j - i, limit).bit_length() - 1)
                run = self._launch(start, chain[i:i + k], prev, checked, limit > 0)
                start, prev, i = run.end, run, i + k
                if run.pending > self._keep(start):
                    self._verify(run.prev)  # bounded memory; the newest run stays in flight
                    run.pending = 1

    def _keep(self, value) -> int:
        """How many runs may wait unverified: each keeps a copy of the parameters."""
        if self._kept is None:
            size = sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize
                       for a in jax.tree_util.tree_leaves(value.params))
            self._kept = max(2, min(self.DEFER_LIMIT, self.UNVERIFIED_BYTES // max(1, size)))
        return self._kept

    def _verify(self, run: _Run) -> None:
        """Make `run` and the unverified runs before it known (a synchronisation). Plain runs
        are sound when the first started with no fault recorded, every slope is finite (it
        is NaN for a non-finite covector or a refused target) and the last point is finite
        (non-finite coordinates persist under p + v, so the last point answers for every
        point before it): then the checked step would have accepted every step, and agrees
        with the plain one bit for bit. Otherwise they are replayed with the checked step
        from the state before the first, which refuses the faulting step and records it."""
        while run.end is None and run.next is not None:
            run = run.next  # verified up to a run whose end is kept
        runs, r = [], run
        while r is not None and not r.verified:
            runs.append(r)
            r = r.prev
        runs.reverse()
        if not runs:
            return
        plain = not runs[0].checked
        health = _health(run.end) if plain and not run.judged else None
        health = _read(runs, health)  # every run's summary and the verdict: one read back
        # a run's own verdict covers its slopes and its end (a point before the last that is
        # not finite leaves the last one not finite too); a run without one is judged here
        if plain and not ((run.healthy if run.judged else bool(health)) and all(
                r.healthy if r.judged else r.host[1] is None or np.all(np.isfinite(r.host[1]))
                for r in runs)):
            # ... and so are the runs dispatched after them, from a point that was wrong
            while run.next is not None:
                run = run.next
                runs.append(run)
            start = runs[0].start
            for r in runs:
                again = self._launch(start, r.nodes, None, True)
                r.end, r.summary, r.checked, r.judged, r.host = \
                    again.end, again.summary, True, False, None
                for node in r.nodes:
                    node.run = r
                start = r.end
            _read(runs, None)
        if run.next is not None:  # the oldest unverified run now: it replays from here
            run.next.start, run.next.prev = run.end, None
        for r in runs:
            r.verified, r.prev, r.next, r.start = True, None, None, None
            end = r.nodes[-1]
            if end.run is r and r.end is not None:  # kept; others are computed again if asked
                end.value, end.parent, end.X, end.Y = r.end, None, None, None
            for node in r.nodes:
                report = node.report() if node.report is not None else None
                if report is not None:
                    report._fill(r, node.j)
                node.report = None
            r.nodes = None  # the reports know their places; the batches may go
            if r.read()[2] is None:
                r.end = None  # nothing refused: no fault to raise from it

    def _settle(self, node: _Later, state: bool = True) -> None:
        """Make the step of `node` known: dispatched and verified, and (`state`) the state it
        reached computed, if its run did not keep it."""
        if node.run is None:
            self._dispatch(node)
        self._verify(node.run)
        if state and node.value is None:  # known, but its state not kept: run up to it again
            self._dispatch(node)
            self._verify(node.run)

    def _queue(self, state, X, Y, shape) -> tuple:
        """The state after this step and its report, the step not yet dispatched."""
        # The batch is read when the step runs: a numpy batch is copied now, so that a buffer
        # the caller refills for the next step cannot change this one (JAX arrays are
        # immutable).
        X, Y = (a.copy() if type(a) is np.ndarray else a for a in (X, Y))
        up = state._later if state._value is None else None
        later = _Later(self, state, X, Y, up.depth + 1 if up is not None and up.run is None else 1,
                       shape)
        new = TrainState.__new__(TrainState)
        new._value, new._later, new._sig = None, later, state._sig
        report = Report(None, None, None, self, later)
        later.report = weakref.ref(report)
        return new, report, later

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
        _need_state(state)
        if state._value is None and state._later.step is not self:
            state._get()  # another step's run: known first, so that a queue is one step's
        sig = self._signature(state, X, Y)
        if sig is None:  # run now, checked
            return self._now(state, X, Y)
        new, report, later = self._queue(state, X, Y, sig[1:])
        if sig not in self._seen:  # a new signature: dispatched now, so what is wrong raises here
            try:
                self._dispatch(later)
            except ParalensError:
                raise
            except Exception as e:  # noqa: BLE001 - what JAX refuses before tracing
                self._diagnose(state, X, Y, e)
                raise
            self._seen.add(sig)
        elif later.depth >= (self._limit(later) or 1):  # a full queue, or nothing to stack
            self._dispatch(later)
        return new, report

    def _now(self, state, X, Y):
        """The checked step dispatched at once (inside a trace, over a mesh, for a batch that
        is not an array)."""
        if self.mesh is not None and np.shape(X)[0] % self.mesh.shape[self.axis]:
            raise ShapeError(f"a batch of {np.shape(X)[0]} cannot be split evenly over the "
                             f"{self.mesh.shape[self.axis]} devices of mesh axis {self.axis!r}")
        try:
            value, (loss, slope) = self._compiled(state._get(), X, Y)
        except ParalensError:
            raise
        except Exception as e:  # noqa: BLE001 - what JAX refuses before tracing (a string batch)
            self._diagnose(state, X, Y, e)
            raise
        new = TrainState._of(value, state._sig)
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


def _slope(cov, targets_ok):
    """max |p'| over the covector (None: no coordinates), reported with each step: finite
    exactly when the covector is, and NaN for a target the family refuses, where it can
    check targets on the device."""
    pieces = [jnp.ravel(jnp.abs(a)) for a in jax.tree_util.tree_leaves(cov)]
    if targets_ok is not None:
        pieces.append(jnp.where(targets_ok, 0.0, jnp.nan).astype(
            pieces[0].dtype if pieces else jnp.result_type(float)))
    return jnp.max(jnp.concatenate(pieces)) if pieces else None


def _read(runs, extra):
    """Read back the summaries of `runs` not read yet, and `extra`, in one synchronisation
    (for many, every copy started before any is waited for; `jax.device_get` would cost
    more than the read itself for a few scalars)."""
    todo = [r for r in runs if r.host is None]
    arrays = [r.summary for r in todo] + ([extra] if isinstance(extra, jax.Array) else [])
    if len(arrays) > 2:
        for a in arrays:
            a.copy_to_host_async()
    for r in todo:
        r.got(np.asarray(r.summary))
    return np.asarray(extra) if isinstance(extra, jax.Array) else extra


def _pack(losses, slopes, extra):
    """One array of what steps report (read back in one transfer): the losses, the slopes
    (if any), then `extra` (fault kinds, or the verdict on the end), in the losses' type."""
    parts = [jnp.ravel(jnp.asarray(a)) for a in (losses, slopes, extra) if a is not None]
    dtype = jnp.result_type(*parts[:2]) if slopes is not None else parts[0].dtype
    return jnp.concatenate([a.astype(dtype) for a in parts])


def _healthy(end: _Value):
    """Whether plain runs ending at `end` started with no fault recorded (the plain step
    carries the record through unchanged) and ended at a finite point."""
    zero = [jnp.sum(a * 0) for a in jax.tree_util.tree_leaves(end.params)]
    return (end.fault[0] == 0) & jnp.isfinite(sum(zero, jnp.zeros(())))


_health = jax.jit(_healthy)


def _need_state(state) -> None:
    if not isinstance(state, TrainState):
        raise KindError(f"a training step takes a TrainState (from step.init(params)), got "
                        f"{type(state).__name__}: pass step.init(params), not the parameters")


def _array_signature(a):
    """(kind, shape, dtype) of a concrete array, else None."""
    if type(a) is np.ndarray:
        return "numpy", a.shape, a.dtype
    if isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer):
        return "jax", a.shape, a.dtype, a.weak_type
    return None


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
