"""Round three of malformed inputs on the training side: each ends in a catalogued error
(or, for half precision, in the right numbers); every example here fails on the code before."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from categories import Covector
from categories.errors import (DomainError, HyperparameterError, KindError, LayoutError,
                               SpaceMismatch, UnsupportedError)
from lenses import dense, half_squared_error
from lenses.optimisers import adagrad, adam, chain, gd, scale_by_adam, scale_by_learning_rate, sharp
from lenses.optimisers.parts import Foreign
from lenses.training import TrainState, fit, train_step

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


@pytest.mark.parametrize("count", [-1, 1.5, "a", None, True])
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
