"""What one step computes, written once: covectors, sharp, move, and the verdict on them.

One step is two phases, as the theory requires. Phase one computes every covector: the
batched forward pass at the optimiser's lookahead point keeps its intermediates, the loss
supplies dL at the output, and the backward pass deposits one covector on each parameter
slot (added over the batch; with a mesh, added across devices too). Phase two sharpens the
covectors and moves the point; nothing has moved before every covector is known.

`StepCore` holds the step over one model structure, loss family, reduction and mesh: the
*checked* step (`checked`), which asks `faults.verdict` and keeps the old state, bit for bit,
where the verdict is no, recording the fault (later steps are then no-ops until the fault is
seen); and the one loop every step runs in (`steps`): a call is that loop of one step, a
chunk of many, so that a chunk gives the bits of as many calls. The optimiser is an argument
of the compiled functions, an immutable pytree (`lenses.values.Value`) whose leaves are its
numbers (learning rate, momentum, damping, ...): `jax.jit` traces the numbers and keys its
compilations by the optimiser's structure, so optimisers equal but for their numbers share
one compilation, through JAX's own cache. A core is shared by all models that compute alike
(`core_for`) and lives while such a model does (`shared`). The structure of the state and the
batch is checked while a step is traced, that is once per compiled signature.
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
from .state import TrainState, check_ledger

tree_map = jax.tree_util.tree_map


class StepCore:
    """The traceable step (opt, state, X, Y) ↦ (state', (loss, slope)) for a model `model`:
    A → B with parameter object P, a loss family on B, a reduction over the batch, and a mesh
    or None; the optimiser `opt` is an argument (an immutable pytree: its numbers traced).
    With a layout, the core is one optimiser structure's (`template`, whose state it lays out)."""

    def __init__(self, record, family, reduction, mesh, axis, layout=None, template=None):
        # the record of the model's structure, not the model: a core (and its compilations)
        # must not keep a user's model alive (`shared`)
        self._record, self.family = record, family
        model = record.model
        self.reduction, self.mesh, self.axis = reduction, mesh, axis
        # with a layout: a NamedSharding per leaf of the state, which jit keeps (GSPMD)
        self.layout, self.state_shardings = layout, None
        if layout is not None:
            self.state_shardings = state_shardings(model, template, layout, mesh)
        self._treedef = jax.tree_util.tree_structure(model.param.zeros())
        self.moves = bool(jax.tree_util.tree_leaves(model.param.zeros()))
        # how many times each compiled function was traced, by (kind, optimiser structure)
        self.traces: dict = {}
        self._compiled = {}

    def traces_of(self, opt) -> dict:
        """How many times each compiled function was traced for `opt`'s structure."""
        tree = jax.tree_util.tree_structure(opt)
        return {kind: n for (kind, t), n in self.traces.items() if t == tree}

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

    def validate(self, opt, state, X, Y):
        """What is checked once per compiled signature, while the step is traced."""
        if jax.tree_util.tree_structure(state.params) != self._treedef:
            check_params(self.model.param, state.params, slot_names(self.model))
            raise SpaceMismatch(f"the parameters do not have the structure of {self.model.param!r}")
        check_ledger(state.ledger)
        opt.check_state(state.opt_state, state.params)
        n = check_batch(self.model.dom, X, f"the batch for {self.model.name}")
        Y = self.family.check_targets(Y, self.model.cod)  # shapes here; values: `targets_ok`
        if np.shape(Y)[0] != n:
            raise ShapeError(f"the batch for {self.model.name} has {n} inputs but "
                             f"{np.shape(Y)[0]} targets")

    def _propose(self, opt, state, X, Y):
        """Both phases, unchecked: (s', p'', inside, covector, loss, slope, targets_ok)."""
        self.validate(opt, state, X, Y)
        # The optimiser's numbers reach the arithmetic as opaque values, whether they came as
        # arguments (a call, a chunk) or as constants (`step_fn` under a user's jit): XLA folds
        # neither, so both compile to the same arithmetic.
        opt, space = jax.lax.optimization_barrier(opt), self.model.param
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
    def checked(self, opt, state, X, Y):
        """The step with its fault record: a refused step keeps parameters and optimiser
        state bit for bit and records (kind, step, slot); later steps are no-ops until the
        fault is seen. (state', (loss, slope))."""
        s_new, p_new, inside, cov, loss, sl, targets_ok = self._propose(opt, state, X, Y)
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

    def steps(self, opt, state, a, b, k, gather: bool):
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
            s, (loss, sl) = self.checked(opt, s, *batch(i))
            return s, self.row(loss, sl, s.fault[0])

        def write(rows, r, i):
            return lax.dynamic_update_index_in_dim(rows, r, i, 0, allow_negative_indices=False)

        length = jax.tree_util.tree_leaves(b)[0].shape[0]
        row = jax.eval_shape(one, 0, state)[1]
        rows = jnp.zeros((length,) + row.shape, row.dtype)
        return lax.fori_loop(0, k, lambda i, c: (lambda s, r: (s, write(c[1], r, i)))(
            *one(i, c[0])), (state, rows))

    def compiled(self, kind: str):
        """The compiled loop: "call" (opt, state, X, Y) ↦ (state', row) (k = 1), "stacked"
        (opt, state, Xs, Ys, k) and "gather" (opt, state, (X, Y), idx, k) ↦ (state', rows);
        made once per core; `jax.jit` compiles it once per signature (the optimiser's
        structure, not its numbers, among it), its traces counted."""
        if kind not in self._compiled:
            def fn(opt, state, a, b, k=None):
                at = (kind, jax.tree_util.tree_structure(opt))
                self.traces[at] = self.traces.get(at, 0) + 1
                if kind == "call":
                    a, b = tree_map(lambda v: v[None], (a, b))  # a stack of one batch
                    # k = 1 behind a barrier: XLA cannot read it, so it cannot unroll the
                    # loop, and a call costs no buffer for k
                    k = lax.optimization_barrier(jnp.asarray(1, jnp.int32))
                    state, rows = self.steps(opt, state, a, b, k, False)
                    return state, rows[0]
                return self.steps(opt, state, a, b, k, kind == "gather")

            fn.__name__ = f"paralens_step_{kind}"  # the name JAX's compile logs and events give
            self._compiled[kind] = jax.jit(fn) if self.mesh is None else self._sharded(fn, kind)
        return self._compiled[kind]

    def _sharded(self, fn, kind):
        """`fn` compiled over the mesh: the batch split over the data axis (replicated if there
        is none), the state replicated, or, with a layout, laid out by it in and out, and the
        data a "gather" chunk reads on the device replicated; GSPMD inserts the collectives."""
        rep = NamedSharding(self.mesh, PartitionSpec())
        axes = (self.axis,) if kind == "call" else (None, self.axis)
        batch = rep if self.axis is None else NamedSharding(self.mesh, PartitionSpec(*axes))
        state = rep
        if self.layout is not None:
            state = self.state_shardings
            if kind == "gather":
                batch = rep
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
    compute alike and equal loss families share it, whatever the optimiser (an argument of
    its compiled functions); with a layout, one per optimiser structure (the state's layout
    follows it). It lives while such a model does."""
    record = shared(model)
    template = None
    key: tuple = (family, reduction, mesh, axis)
    if layout is not None:  # a copy of the optimiser: the user's own is not kept alive
        template = jax.tree_util.tree_map(lambda a: a, opt)
        key += (layout, jax.tree_util.tree_structure(opt))
    try:
        core = record.cores.get(key)
    except TypeError:  # something unhashable in the configuration
        return StepCore(record, family, reduction, mesh, axis, layout, template)
    if core is None:
        core = record.cores[key] = StepCore(record, family, reduction, mesh, axis, layout, template)
    return core


def arguments(opt):
    """The optimiser as the compiled step takes it: each scalar number a weakly typed array
    (as a Python float is traced: it takes the parameters' dtype), arrays as they are."""
    def leaf(v):
        return jnp.asarray(float(v) if isinstance(v, (int, float)) or np.ndim(v) == 0 else v)
    return jax.tree_util.tree_map(leaf, opt)


def slot_spaces(model) -> list:
    """The parameter object of each slot `slot_names` names: the factors of a chain's product,
    else the whole parameter object."""
    P = model.param
    return list(P.factors) if isinstance(P, Product) and len(slot_names(model)) > 1 else [P]


__all__ = ["StepCore", "core_for", "arguments"]
