"""Round three of malformed inputs on the training side: each ends in a catalogued error
(or, for half precision, in the right numbers); every example here fails on the code before."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from categories import Covector, R
from categories.errors import (DomainError, HyperparameterError, KindError, LayoutError,
                               MetricError, ShapeError, SpaceMismatch, TargetError,
                               TargetTypeError, UnsupportedError)
from lenses import SequenceCrossEntropy, dense, half_squared_error, positionwise_dense
from lenses.inner_products.kfac import KFAC
from lenses.inner_products.metrics import Constant, Diagonal
from lenses.inner_products.natural import Fisher, GaussNewton
from lenses.optimisers import adagrad, adam, chain, gd, scale_by_adam, scale_by_learning_rate, sharp
from lenses.optimisers.parts import Foreign
from lenses.optimisers.riemannian import riemannian_adam
from lenses.training import Checkpoints, TrainState, fit, save, train_step
from lenses.training.faults import Fault
from lenses.training.state import Report

P = (jnp.zeros((1, 2)), jnp.ones(1))
X, Y = np.ones((8, 2)), np.zeros((8, 1))


def test_adam_first_step_in_float16_moves_by_the_learning_rate():
    # Adam's first step is lr · g / |g| (up to eps) whatever g: g² = 1e-8 underflows in float16
    p = jnp.zeros(2, jnp.float16)
    opt = adam(0.1)
    s, q = opt.step(opt.init(p), p, Covector(jnp.full(2, 1e-4, jnp.float16)))
    assert q.dtype == jnp.float16
    np.testing.assert_allclose(np.asarray(q, np.float64), -0.1, rtol=1e-2)


def test_adagrad_in_float16_keeps_its_sum_of_squares():
    g, eps, lr = 1e-4, 1e-7, 0.1
    p = jnp.zeros(1, jnp.float16)
    opt = adagrad(lr, initial_accumulator_value=0.0, eps=eps)
    s, q = opt.step(opt.init(p), p, Covector(jnp.full(1, g, jnp.float16)))
    np.testing.assert_allclose(np.asarray(q, np.float64), -lr * g / np.sqrt(g * g + eps), rtol=1e-2)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_accumulators_are_float32(dtype):
    p = jnp.zeros(3, dtype)
    for opt in (adam(0.1), adagrad(0.1)):
        floats = [a.dtype for a in jax.tree_util.tree_leaves(opt.init(p)) if a.dtype != jnp.int32]
        assert floats and all(d == jnp.float32 for d in floats)


def test_tree_mapped_numbers_are_checked_at_an_eager_step_and_at_train_step():
    bad = jax.tree_util.tree_map(lambda x: -x, adam(0.1))
    with pytest.raises(HyperparameterError, match="b1"):
        bad.step(bad.init(jnp.zeros(2)), jnp.zeros(2), Covector(jnp.ones(2)))
    with pytest.raises(HyperparameterError):
        train_step(dense(2, 1), half_squared_error, jax.tree_util.tree_map(lambda x: x * np.nan, adam(0.1)))


def test_a_replaced_part_is_checked_when_chained():
    with pytest.raises(HyperparameterError, match="b1"):
        chain(sharp(), dataclasses.replace(scale_by_adam(), b1=1.5), scale_by_learning_rate(0.1))


@pytest.mark.parametrize("schedule", [lambda c: -0.1, lambda c: jnp.nan, lambda c: "a",
                                      lambda c, d: 0.1])
def test_a_schedule_is_asked_its_rate_at_count_zero(schedule):
    with pytest.raises(HyperparameterError, match="schedule"):
        adam(schedule)


def test_foreign_none_and_extra_argument_transforms():
    with pytest.raises(KindError):
        Foreign(None)
    with pytest.raises(KindError):
        chain(sharp(), None)
    tx = optax.chain(optax.sgd(0.1), optax.contrib.reduce_on_plateau())
    with pytest.raises(UnsupportedError, match="value"):
        train_step(dense(2, 1), half_squared_error, chain(sharp(), tx))


def test_max_halvings_takes_a_numpy_integer():
    assert adam(0.1, max_halvings=np.int64(3)).max_halvings == 3


def test_kfac_flags_are_flags():
    from lenses.inner_products.kfac import KFAC
    with pytest.raises(KindError, match="rescale"):
        KFAC(rescale="no")


def test_integer_points_are_refused():
    with pytest.raises(DomainError):
        adam(0.1).init(jnp.zeros(2, jnp.int32))
    opt = adam(0.1)
    with pytest.raises(DomainError):
        opt.step(opt.init(jnp.zeros(2)), jnp.zeros(2, jnp.int32), Covector(jnp.ones(2, jnp.int32)))


@pytest.mark.parametrize("count", [-1, 1.5, "a", None, True, 2 ** 31])
def test_train_state_counts_are_integers(count):
    with pytest.raises(KindError):
        TrainState.of(jnp.zeros(2), (), count=count)


def test_a_bad_ledger_and_a_misshapen_state_leaf_are_refused():
    step = train_step(dense(2, 1), half_squared_error, adam(0.1))
    s0 = step.init(P)
    with pytest.raises(KindError, match="ledger"):
        step(TrainState(s0.params, s0.opt_state, jnp.zeros(3, jnp.int32)), X, Y)
    with pytest.raises(KindError, match="ledger"):
        step(TrainState(s0.params, s0.opt_state, jnp.zeros(4)), X, Y)
    wrong = (s0.opt_state[0], s0.opt_state[1]._replace(mu=(jnp.zeros((3, 2)), jnp.ones(1))),
             s0.opt_state[2])
    with pytest.raises(SpaceMismatch, match=r"\.mu\[0\]"):
        step(TrainState(s0.params, wrong, s0.ledger), X, Y)
    with pytest.raises(SpaceMismatch, match=r"\.mu\[0\]"):
        fit(dense(2, 1), half_squared_error, adam(0.1), TrainState.of(P, wrong), (X, Y), epochs=1,
            batch_size=4)


def test_axis_without_a_mesh_and_callbacks_none():
    with pytest.raises(LayoutError):
        train_step(dense(2, 1), half_squared_error, gd(0.1), axis="data")
    state, history = fit(dense(2, 1), half_squared_error, gd(0.1), P, (X, Y), epochs=1,
                         batch_size=4, callbacks=None)
    assert int(state.count) == 2 and len(history) == 1


@pytest.mark.parametrize("key", [3, np.int64(3), jnp.ones(2), jnp.arange(2), np.zeros(0, np.uint32)])
def test_save_refuses_a_key_it_could_not_give_back_as_one(tmp_path, key):
    # a seed saved as a "raw key" was refused only when fit resumed from the file
    state = train_step(dense(2, 1), half_squared_error, gd(0.1)).init(P)
    with pytest.raises(KindError, match="save: key must be a JAX random key"):
        save(str(tmp_path / "s.safetensors"), state, dense(2, 1), key=key)
    save(str(tmp_path / "k.safetensors"), state, dense(2, 1), key=jax.random.PRNGKey(3))


@pytest.mark.parametrize("n", ["a", 2.0, None, -1, True])
def test_check_split_takes_a_number_of_examples_with_or_without_a_mesh(n):
    with pytest.raises(KindError, match="check_split: n"):
        train_step(dense(2, 1), half_squared_error, gd(0.1)).check_split(n)


def test_a_list_of_two_plain_lists_is_read_as_two_batches_and_the_refusal_says_so():
    X2, Y2 = [[1.0, 2.0], [3.0, 4.0]], [[1.0], [2.0]]
    with pytest.raises(ShapeError, match=r"data is a list of two.*pass a tuple \(X, Y\) of arrays"):
        fit(dense(2, 1), half_squared_error, gd(0.1), P, [X2, Y2], epochs=1, batch_size=2)
    # the tuple of arrays trains; a stream of two good batches given as a list is no mistake
    state, _ = fit(dense(2, 1), half_squared_error, gd(0.1), P, (np.array(X2), np.array(Y2)),
                   epochs=1, batch_size=2)
    assert int(state.count) == 1
    batches = [(np.array(X2), np.array(Y2))] * 2
    state, _ = fit(dense(2, 1), half_squared_error, gd(0.1), P, batches, epochs=1, batch_size=2)
    assert int(state.count) == 2


def test_old_half_precision_states_widen_on_load(tmp_path, monkeypatch):
    from lenses.optimisers import Optimiser
    from lenses.training import load, save
    model, opt = dense(2, 1), adam(0.1)
    params = tuple(a.astype(jnp.bfloat16) for a in P)
    state = TrainState.of(params, jax.tree_util.tree_map(
        lambda a: a.astype(jnp.bfloat16) if a.dtype == jnp.float32 else a, opt.init(params)))
    # what a file of an earlier version holds: its accumulators in the parameters' dtype
    monkeypatch.setattr(Optimiser, "_check_leaves", lambda *a: None, raising=False)
    monkeypatch.setattr(Optimiser, "check_state", lambda *a, **k: None)
    path = save(str(tmp_path / "old.st"), state, model, opt)
    monkeypatch.undo()
    loaded = load(path, model, opt).state
    mu = loaded.opt_state[1].mu
    assert all(a.dtype == jnp.float32 for a in mu)


# -- round three, part two: mesh axes, fit's axis, sequence labels, metrics' numbers, edges -------

MESH = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("batch",))


def test_an_axis_the_mesh_lacks_is_a_layout_error_naming_the_mesh_axes():
    for build in (lambda **kw: train_step(dense(2, 1), half_squared_error, gd(0.1), **kw),
                  lambda **kw: fit(dense(2, 1), half_squared_error, gd(0.1), P, (X, Y),
                                   epochs=1, batch_size=4, **kw)):
        with pytest.raises(LayoutError, match=r"'data' is not an axis of the mesh, whose axes "
                                              r"are \('batch',\)"):
            build(mesh=MESH, axis="data")
    with pytest.raises(KindError, match="axis must be the name of a mesh axis"):
        train_step(dense(2, 1), half_squared_error, gd(0.1), mesh=MESH, axis=0)


def test_fit_splits_each_batch_over_the_axis_it_is_given():
    # every example alike (x = (1, 1), target 0): each step of gd(0.1) takes the residual r
    # to 0.7 r, so the epochs' mean losses ½ r² are (0.5 + 0.245)/2 and (0.12005 + 0.0588245)/2
    state, history = fit(dense(2, 1), half_squared_error, gd(0.1), P, (X, Y), epochs=2,
                         batch_size=4, mesh=MESH, axis="batch")
    assert int(state.count) == 4
    np.testing.assert_allclose([h["loss"] for h in history], [0.3725, 0.0894372], rtol=1e-5)


def _sequence_step():
    K = 3
    model = positionwise_dense(2, K).at(R(1, 2))  # sequences of one position
    params = (jnp.asarray([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]]), jnp.asarray([0.0, 0.5, -0.5]))
    return train_step(model, SequenceCrossEntropy(classes=K), gd(0.1)), params


@pytest.mark.parametrize("label", [1.5, -0.5, 2.25])
def test_a_compiled_sequence_step_refuses_a_label_that_is_no_class(label):
    step, params = _sequence_step()
    state = step.init(params)
    X2 = np.asarray([[[2.0, 0.0]], [[0.0, 3.0]]])
    moved, _ = step(state, X2, np.asarray([[0.0], [2.0]]))  # floats of integer value: classes
    assert int(np.asarray(moved.fault)[0]) == Fault.NONE and moved.steps_taken() == 1
    refused, _ = step(state, X2, np.asarray([[0.0], [label]]))
    assert [int(v) for v in np.asarray(refused.fault)] == [Fault.TARGET, 1, 1]
    assert refused.steps_taken() == 0
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(refused.params),
                                                     jax.tree_util.tree_leaves(params)))
    with pytest.raises(TargetError):
        SequenceCrossEntropy(classes=3).check_targets(np.asarray([[0.0], [label]]))


def test_the_sequence_loss_of_a_label_that_is_no_class_is_nan_never_another_class():
    z = np.asarray([[0.5, -1.0, 2.0], [1.0, 0.0, -1.0]])
    logp = z - np.log(np.sum(np.exp(z), axis=1, keepdims=True))  # numpy's log-softmax
    family = SequenceCrossEntropy(classes=3)
    got = float(family.value(jnp.asarray(z), jnp.asarray([2.0, 0.0])))
    assert got == pytest.approx(-(logp[0, 2] + logp[1, 0]) / 2, rel=1e-6)
    for bad in ([2.0, -1.0], [1.5, 0.0], [3.0, 0.0]):  # -1 would wrap to the last class
        assert np.isnan(float(family.value(jnp.asarray(z), jnp.asarray(bad))))
    with pytest.raises(TargetTypeError, match="dtype bool"):  # True is no class
        family.check_targets(np.zeros((2, 1), bool))


@pytest.mark.parametrize("classes", [1, 0, -1, 2.5, "3", True, int])
def test_sequence_cross_entropy_takes_an_integer_number_of_classes(classes):
    with pytest.raises(HyperparameterError, match="classes must be an integer ≥ 2"):
        SequenceCrossEntropy(classes=classes)


def _negative(x):
    return -x


def _zero(x):
    return 0 * x


@pytest.mark.parametrize("metric, f, error, name", [
    (Diagonal(2.0), _zero, MetricError, "weights"),
    (Diagonal((jnp.ones((1, 2)), jnp.ones(1))), _negative, MetricError, "weights"),
    (GaussNewton(0.1), _negative, HyperparameterError, "damping"),
    (Fisher(0.1), lambda x: x * np.nan, HyperparameterError, "damping"),
    (KFAC(0.1, decay=0.5, model=dense(2, 1)), _negative, HyperparameterError, "damping"),
    (KFAC(0.1, adapt_damping=True, model=dense(2, 1)), _zero, HyperparameterError, "omega"),
    (Constant(jnp.eye(3), R(3)), lambda x: 2 * x, MetricError, "Cholesky factor"),  # L Lᵀ = 4G
], ids=["diagonal-zero", "diagonal-negative", "gauss-newton", "fisher-nan", "kfac",
        "kfac-omega", "constant"])
def test_a_metric_made_by_tree_map_is_checked_where_the_optimiser_is(metric, f, error, name):
    with pytest.raises(error, match=name):
        gd(0.1, metric=jax.tree_util.tree_map(f, metric))
    # a schedule is structure: the optimiser's only numbers are its metric's
    bad = jax.tree_util.tree_map(f, gd(lambda count: 0.1, metric=metric))
    with pytest.raises(error, match=name):
        train_step(dense(2, 1), half_squared_error, bad)


def test_a_diagonal_of_riemannian_adam_and_an_eager_step_are_checked_and_traced_numbers_pass():
    zero = jax.tree_util.tree_map(lambda x: 0 * x, Diagonal(2.0))
    with pytest.raises(MetricError, match="weights"):
        riemannian_adam(0.1, metric=zero)
    p = jnp.ones(2)
    bad = jax.tree_util.tree_map(_zero, adam(lambda count: 0.1, b1=0.0, metric=Diagonal(2.0)))
    with pytest.raises(MetricError, match="weights"):
        bad.step(bad.init(p), p, Covector(jnp.ones(2), R(2)))

    def moved(metric):  # the metric's weights traced: nothing is known of them, they pass
        o = gd(0.1, metric=metric)
        return o.step(o.init(p), p, Covector(jnp.ones(2), R(2)))[1]
    np.testing.assert_allclose(jax.jit(moved)(Diagonal(2.0)), 1 - 0.1 / 2.0, rtol=1e-6)


def test_a_callback_answers_true_false_or_none_and_is_no_class():
    def run(callbacks):
        return fit(dense(2, 1), half_squared_error, gd(0.1), P, (X, Y), epochs=3, batch_size=4,
                   steps_per_dispatch=2, callbacks=callbacks)

    with pytest.raises(KindError, match="not a class"):
        run([int])
    for answer in ({"stop": False}, 1, np.zeros(2)):  # truthy or ambiguous: no answer
        with pytest.raises(KindError, match="returned") as caught:
            run([lambda progress, a=answer: a])
        assert caught.value.state.steps_taken() == 2 and caught.value.history == [
            pytest.approx({"epoch": 1, "loss": 0.3725, "steps_per_s": caught.value.history[0][
                "steps_per_s"]})]
    # a 0-d bool array (as a comparison of the state's count gives) is an answer
    state, _ = run([lambda progress: progress.state.count >= 4])
    assert state.steps_taken() == 4


def test_a_checkpoint_path_is_a_non_empty_str():
    for path in ("", b"run.st"):
        with pytest.raises(KindError, match="file path"):
            Checkpoints(path, every=1)


def test_a_count_past_the_int32_ledger_is_refused():
    for kw in ({"count": 2 ** 31}, {"fault": (1, 2 ** 40, 0)}):
        with pytest.raises(KindError, match="≤ 2147483647"):
            TrainState.of(P, (), **kw)


def test_the_doors_of_a_step_refuse_what_is_not_a_state():
    step = train_step(dense(2, 1), half_squared_error, gd(0.1))
    for door in (step.lowered, step.step_fn):
        with pytest.raises(KindError, match="TrainState"):
            door(None, X, Y)
    with pytest.raises(KindError, match="Report"):
        Report(None, None, True).loss
