"""What one step computes, written once: covectors, sharp, move, and the verdict on them.

One step is two phases, as the theory requires. Phase one computes every covector: the
batched forward pass at the optimiser's lookahead point keeps its intermediates, the loss
supplies dL at the output, and the backward pass deposits one covector on each parameter
slot (added over the batch; with a mesh, added across devices too). Phase two sharpens the
covectors and moves the point; nothing has moved before every covector is known.

`StepCore` holds the step over one model, loss family, optimiser structure, reduction and
mesh: the *checked* step (`checked`), which asks `faults.verdict` and keeps the old state,
bit for bit, where the verdict is no, recording the fault (later steps are then no-ops until
the fault is seen); and the one loop every step runs in (`steps`): a call is that loop of
one step, a chunk of many, so that a chunk gives the bits of as many calls. The optimiser's
numbers (learning rate, momentum, ...) are arguments (`Optimiser.hyperparams`), so a core,
and every compilation it holds, is shared by all optimisers equal but for their numbers and
by all models that compute alike (`core_for`); it lives while such a model does (`shared`). The structure of the state and the batch is checked while a step is traced,
that is once per compiled signature.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from categories import Covector, Product
from categories.errors import ShapeError, SpaceMismatch

from ..losses import batch_loss
from ..inner_products.metrics import Context
from ..optimisers import check_params, slot_names
from ..batched import batched
from ..inputs import check_batch
from .faults import slope, verdict
from .shared import shared
from .state import TrainState

tree_map = jax.tree_util.tree_map


class StepCore:
    """The traceable step (state, X, Y) ↦ (state', (loss, slope)) for a model `model`: A → B
    with parameter object P, a loss family on B, an optimiser structure `template` (its
    numbers come as the argument `hyper`), a reduction over the batch, and a mesh or None."""

    def __init__(self, record, family, template, reduction, mesh, axis, layout=None):
        # the record of the model's structure, not the model: a core (and its compilations)
        # must not keep a user's model alive (`shared`)
        self._record, self.family, self.template = record, family, template
        model = record.model
        self.reduction, self.mesh, self.axis = reduction, mesh, axis
        # with a layout: a NamedSharding per leaf of the state, which jit keeps (GSPMD)
        self.layout, self.state_shardings = layout, None
        if layout is not None:
            self.state_shardings = state_shardings(model, template, layout, mesh)
        self._treedef = jax.tree_util.tree_structure(model.param.zeros())
        self.moves = bool(jax.tree_util.tree_leaves(model.param.zeros()))
        self.traces = {}  # how many times each compiled function was traced (for tests)
        self._compiled = {}

    @property
    def model(self):
        """A live model of the structure this core computes for (any one: they compute alike)."""
        return self._record.model

    # -- phase one ---------------------------------------------------------------------------
    def _covectors(self, p_eval, X, Y, reduction):
        out, pull = batched(self.model).vjp(X, p_eval)
        L = batch_loss(self.family, Y, reduction)
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

    def validate(self, state, X, Y):
        """What is checked once per compiled signature, while the step is traced."""
        if jax.tree_util.tree_structure(state.params) != self._treedef:
            check_params(self.model.param, state.params, slot_names(self.model))
            raise SpaceMismatch(f"the parameters do not have the structure of {self.model.param!r}")
        expected = jax.tree_util.tree_structure(
            jax.eval_shape(self.template.init, state.params))
        if jax.tree_util.tree_structure(state.opt_state) != expected:
            raise SpaceMismatch(f"the optimiser state is not one of {self.template!r} (a state "
                                f"of another optimiser?): expected the structure {expected}, "
                                f"got {jax.tree_util.tree_structure(state.opt_state)}")
        n = check_batch(self.model.dom, X, f"the batch for {self.model.name}")
        Y = self.family.check_targets(Y, self.model.cod)  # shapes here; values: `targets_ok`
        if np.shape(Y)[0] != n:
            raise ShapeError(f"the batch for {self.model.name} has {n} inputs but "
                             f"{np.shape(Y)[0]} targets")

    def _propose(self, hyper, state, X, Y):
        """Both phases, unchecked: (s', p'', inside, covector, loss, slope, targets_ok)."""
        self.validate(state, X, Y)
        # The numbers reach the arithmetic as opaque values, whether they came as arguments
        # (a call, a chunk) or as constants (`step_fn` under a user's jit): XLA folds neither,
        # so both compile to the same arithmetic.
        hyper = jax.lax.optimization_barrier(hyper)
        opt, space = self.template.with_hyperparams(hyper), self.model.param
        p_eval = opt.lookahead(state.opt_state, state.params, space)
        if self.mesh is None or self.layout is not None:  # a layout: GSPMD adds the covectors
            loss, cov = self._covectors(p_eval, X, Y, self.reduction)
            if self.state_shardings is not None:  # each covector split as its slot's point
                cov = jax.lax.with_sharding_constraint(cov, self.state_shardings.params)
        else:
            loss, cov = self._sharded_covectors(p_eval, X, Y)
        ctx = Context(self.model, self.family, X, Y, self.reduction)
        # Phase two: nothing has moved until every covector is known.
        s_new, p_new, inside = opt.propose(state.opt_state, state.params, Covector(cov, space),
                                           ctx, space)
        targets_ok = self.family.targets_ok(Y)
        return s_new, p_new, inside, cov, loss, slope(cov, targets_ok), targets_ok

    # -- the step -----------------------------------------------------------------------------
    def checked(self, hyper, state, X, Y):
        """The step with its fault record: a refused step keeps parameters and optimiser
        state bit for bit and records (kind, step, slot); later steps are no-ops until the
        fault is seen. (state', (loss, slope))."""
        s_new, p_new, inside, cov, loss, sl, targets_ok = self._propose(hyper, state, X, Y)
        ok, ledger = verdict(state.ledger, cov, p_new, inside, targets_ok, self.model.param)
        params, opt_state = tree_map(lambda new, old: jnp.where(ok, new, old),
                                     (p_new, s_new), (state.params, state.opt_state))
        new = TrainState(params, opt_state, ledger)
        if self.state_shardings is not None:  # the state stays laid out through every step
            new = jax.lax.with_sharding_constraint(new, self.state_shardings)
        return new, (loss, sl)

    # -- the one loop every step runs in -------------------------------------------------------
    def row(self, loss, sl, kind):
        """What a step reports, packed as one array (read back in one transfer)."""
        parts = [loss, jnp.zeros_like(loss) if sl is None else sl]
        dtype = jnp.result_type(*parts)
        return jnp.stack([a.astype(dtype) for a in parts] + [jnp.asarray(kind).astype(dtype)])

    def steps(self, hyper, state, a, b, k, gather: bool):
        """The first k of a stack of batches, each the checked step, in one loop whose trip
        count k is a runtime value: (state', rows), a row (loss, slope, fault kind) per step.
        The batches are stacked (a = Xs, b = Ys), or gathered from data on the device (a =
        (X, Y), b the indices of each step's batch).

        A call is this loop with k = 1, a chunk with k > 1: XLA compiles the one body alike
        in both (it cannot unroll a loop of unknown length), so a chunk gives the bits of as
        many calls; a step at top level and the same step in a loop may be contracted into
        fused multiply-adds differently once the optimiser's numbers are runtime values."""
        # i runs over 0 … k − 1: no index is negative, so none is wrapped (an operation less
        # per read and per write, in every step)
        def at(v, i):
            return lax.dynamic_index_in_dim(v, i, keepdims=False, allow_negative_indices=False)

        def batch(i):
            if gather:
                xy = _take(a, at(b, i))
            else:
                xy = tree_map(lambda v: at(v, i), (a, b))
            # Tied to i, so that XLA cannot hoist out of the loop what depends on the batch
            # alone: in a call (a stack of one, whose index it simplifies away) it would, and
            # the hoisted values, carried through the loop, made a cross-entropy call of a
            # 4-16-3 network 1.7x slower (bench/README.md); a chunk runs the same body.
            return lax.optimization_barrier((i, xy))[1]

        def one(i, s):
            s, (loss, sl) = self.checked(hyper, s, *batch(i))
            return s, self.row(loss, sl, s.fault[0])

        def write(rows, r, i):
            return lax.dynamic_update_index_in_dim(rows, r, i, 0, allow_negative_indices=False)

        length = jax.tree_util.tree_leaves(b)[0].shape[0]
        row = jax.eval_shape(one, 0, state)[1]
        rows = jnp.zeros((length,) + row.shape, row.dtype)
        return lax.fori_loop(0, k, lambda i, c: (lambda s, r: (s, write(c[1], r, i)))(
            *one(i, c[0])), (state, rows))

    def compiled(self, kind: str):
        """The compiled loop: "call" (hyper, state, X, Y) ↦ (state', row) (k = 1), "stacked"
        (hyper, state, Xs, Ys, k) and "gather" (hyper, state, (X, Y), idx, k) ↦ (state', rows);
        once per core (and per signature), its traces counted."""
        if kind not in self._compiled:
            def fn(hyper, state, a, b, k=None):
                self.traces[kind] = self.traces.get(kind, 0) + 1
                if kind == "call":
                    a, b = tree_map(lambda v: v[None], (a, b))  # a stack of one batch
                    # k = 1 behind a barrier: XLA cannot read it, so it cannot unroll the
                    # loop, and a call costs no buffer for k
                    k = lax.optimization_barrier(jnp.asarray(1, jnp.int32))
                    state, rows = self.steps(hyper, state, a, b, k, False)
                    return state, rows[0]
                return self.steps(hyper, state, a, b, k, kind == "gather")

            if self.mesh is None:
                self._compiled[kind] = jax.jit(fn)
            elif self.layout is not None:
                self._compiled[kind] = self._laid_out(fn, kind)
            else:
                rep = NamedSharding(self.mesh, PartitionSpec())
                axes = (self.axis,) if kind == "call" else (None, self.axis)
                batch = NamedSharding(self.mesh, PartitionSpec(*axes))
                shardings = (rep, rep, batch, batch) + ((rep,) if kind != "call" else ())
                self._compiled[kind] = jax.jit(fn, in_shardings=shardings, out_shardings=rep)
        return self._compiled[kind]

    def _laid_out(self, fn, kind):
        """`fn` compiled with the state laid out by the layout (in and out) and the batch split
        over the data axis (replicated if there is none): GSPMD inserts the collectives."""
        rep = NamedSharding(self.mesh, PartitionSpec())
        axes = (self.axis,) if kind == "call" else (None, self.axis)
        batch = rep if self.axis is None else NamedSharding(self.mesh, PartitionSpec(*axes))
        if kind == "gather":  # data gathered on the device: the data and indices replicated
            batch = rep
        state = self.state_shardings
        shardings = (rep, state, batch, batch) + ((rep,) if kind != "call" else ())
        return jax.jit(fn, in_shardings=shardings, out_shardings=(state, rep))


def state_shardings(model, template, layout, mesh) -> TrainState:
    """The sharding of each leaf of a training state: the parameters' by the layout, the
    optimiser state's mirrored from them (`layout.mirror`), the ledger replicated."""
    from .layout import mirror

    point = model.param.zeros()
    params = layout.shardings(model, mesh)
    rep = NamedSharding(mesh, PartitionSpec())
    opt = mirror(jax.eval_shape(template.init, point), point, params, rep)
    return TrainState(params, opt, rep)


def _take(data, idx):
    return tree_map(lambda v: jnp.take(v, idx, axis=0), data)


def core_for(model, family, opt, reduction, mesh, axis, layout=None) -> StepCore:
    """The core for these arguments, made once per model structure (`shared`): models that
    compute alike, equal loss families and optimisers equal but for their numbers
    (`Optimiser.key`) share it, and so share its compilations; it lives while such a model does."""
    record = shared(model)
    key = (family, opt.key(), reduction, mesh, axis) + ((layout,) if layout is not None else ())
    try:
        core = record.cores.get(key)
    except TypeError:  # something unhashable in the configuration
        return StepCore(record, family, opt, reduction, mesh, axis, layout)
    if core is None:  # a copy of the optimiser: the user's own is not kept alive by the core
        template = opt.with_hyperparams(opt.hyperparams())
        core = record.cores[key] = StepCore(record, family, template, reduction, mesh, axis, layout)
    return core


def slot_spaces(model) -> list:
    """The parameter object of each slot `slot_names` names: the factors of a chain's product,
    else the whole parameter object."""
    P = model.param
    return list(P.factors) if isinstance(P, Product) and len(slot_names(model)) > 1 else [P]


__all__ = ["StepCore", "core_for"]
