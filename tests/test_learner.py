"""The training step and the loop: report, two phases, compile-once, fit, accuracy.

Oracles: a hand-written MLP with optax's cross-entropy and `jax.grad`, optax's Nesterov,
hand counts of steps and labels.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from categories import R, Vector, draws
from categories.linear import unwrap
from lenses import (Metric, TrainState, accuracy, adam, dense, fit, gd,
                    half_squared_error, nesterov, sigmoid, softmax_cross_entropy, tanh,
                    train_step)

CE3 = functools.partial(softmax_cross_entropy, classes=3)
MODEL = dense(4, 6) >> tanh >> dense(6, 3)
P0 = MODEL.init(jax.random.PRNGKey(0))
X = np.asarray(draws.normal(jax.random.PRNGKey(1), (10, 4)))
Y = np.asarray(jax.random.randint(jax.random.PRNGKey(2), (10,), 0, 3))


@functools.partial(jax.jit, static_argnames="reduction")
def hand_loss(p, X=X, Y=Y, reduction="mean"):
    """Cross-entropy of W₂ tanh(W₁x + b₁) + b₂, written with optax and no lenses."""
    (W1, b1), _, (W2, b2) = p
    logits = jnp.tanh(X @ W1.T + b1[None, :]) @ W2.T + b2[None, :]
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, Y)
    return jnp.mean(losses) if reduction == "mean" else jnp.sum(losses)


hand_value_and_grad = jax.jit(jax.value_and_grad(hand_loss), static_argnames="reduction")


def leaves(t):
    return [np.asarray(a) for a in jax.tree_util.tree_leaves(t)]


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_report_and_step_match_an_independent_computation(reduction):
    lr = 0.1
    step = train_step(MODEL, CE3, gd(lr), reduction=reduction)
    state = step.init(P0)
    new, report = step(state, X, Y)
    loss, g = hand_value_and_grad(P0, reduction=reduction)
    assert float(report.loss) == pytest.approx(float(loss), abs=1e-12)
    slope = max(float(jnp.max(jnp.abs(a))) for a in jax.tree_util.tree_leaves(g))
    assert float(report.largest_slope) == pytest.approx(slope, abs=1e-12)
    expected = jax.tree_util.tree_map(lambda p, gi: p - lr * gi, P0, g)
    for a, b in zip(leaves(new.params), leaves(expected)):
        np.testing.assert_allclose(a, b, atol=1e-12)
    assert new.params[1] is None and int(new.count) == 1


def test_nesterov_step_evaluates_at_the_lookahead_point():
    """Phase one at φ = lookahead(s, θ): the losses and points are optax's Nesterov iterates."""
    lr, beta = 0.2, 0.9
    opt = nesterov(lr, beta)
    step = train_step(MODEL, CE3, opt)
    tx = optax.sgd(lr, momentum=beta, nesterov=True)
    state, p, s = step.init(P0), P0, tx.init(P0)
    for _ in range(5):
        state, report = step(state, X, Y)
        loss, g = hand_value_and_grad(p)
        assert float(report.loss) == pytest.approx(float(loss), abs=1e-10)
        u, s = tx.update(g, s, p)
        p = optax.apply_updates(p, u)
        phi = opt.lookahead(state.opt_state, state.params)
        for a, b in zip(leaves(phi), leaves(p)):
            np.testing.assert_allclose(a, b, atol=1e-10)
    # θ itself is not optax's point: the lookahead is a genuine forward part
    assert max(np.max(np.abs(a - b)) for a, b in zip(leaves(state.params), leaves(p))) > 1e-3


def test_parameterless_network_reports_no_movement():
    model = tanh.at(R(3)) >> sigmoid
    step = train_step(model, half_squared_error, adam(0.1))
    state = step.init((None, None))
    new, report = step(state, np.ones((4, 3)), np.zeros((4, 3)))
    assert report.largest_slope is None
    assert new.params == (None, None)
    expected = 0.5 * 3 * (1 / (1 + np.exp(-np.tanh(1.0)))) ** 2  # mean of equal examples
    assert float(report.loss) == pytest.approx(expected, rel=1e-12)


def test_the_step_is_compiled_once():
    traces = []

    def family(y):
        traces.append(1)  # the loss family is only called while the step is being traced
        return CE3(y)

    step = train_step(MODEL, family, adam(0.01))
    state = step.init(P0)
    state, _ = step(state, X, Y)
    after_first = len(traces)
    assert after_first > 0
    for _ in range(4):
        state, _ = step(state, X, Y)
    assert len(traces) == after_first


def test_an_optax_transformation_is_accepted_as_the_rule():
    a = train_step(MODEL, CE3, optax.adam(0.05))
    b = train_step(MODEL, CE3, adam(0.05))
    sa, sb = a.init(P0), b.init(P0)
    for _ in range(3):
        sa, _ = a(sa, X, Y)
        sb, _ = b(sb, X, Y)
    for x, y in zip(leaves(sa.params), leaves(sb.params)):
        np.testing.assert_allclose(x, y, atol=1e-12)


class PerExample(Metric):
    """A data-dependent inner product: n times the Euclidean one, n read from the batch."""

    def sharp(self, p, cov, ctx=None):
        n = ctx.x.shape[0]
        return Vector(jax.tree_util.tree_map(lambda a: a / n, unwrap(cov)))


def test_the_metric_sees_the_batch():
    """gd with the sum loss and the metric n·⟨,⟩ is gd with the mean loss."""
    a = train_step(MODEL, CE3, gd(0.3, metric=PerExample()), reduction="sum")
    b = train_step(MODEL, CE3, gd(0.3))
    sa, _ = a(a.init(P0), X, Y)
    sb, _ = b(b.init(P0), X, Y)
    for x, y in zip(leaves(sa.params), leaves(sb.params)):
        np.testing.assert_allclose(x, y, atol=1e-12)
    assert max(np.max(np.abs(x - y)) for x, y in zip(leaves(sa.params), leaves(P0))) > 1e-4


def test_fit_drops_the_remainder_and_records_history(capsys):
    epochs, batch = 3, 4  # 10 examples: 2 full batches per epoch, 2 examples dropped
    state, history = fit(MODEL, CE3, adam(0.05), P0, (X, Y), epochs=epochs, batch_size=batch,
                         key=jax.random.PRNGKey(0), eval_data=(X, Y))
    assert int(state.count) == epochs * (10 // batch)
    assert [h["epoch"] for h in history] == [1, 2, 3]
    assert all(set(h) >= {"loss", "steps_per_s", "accuracy"} for h in history)
    assert history[-1]["accuracy"] == pytest.approx(accuracy(MODEL, state.params, X, Y))
    assert capsys.readouterr().err == ""  # not a terminal: no progress line
    # continue from the state, with a progress line forced on
    state2, _ = fit(MODEL, CE3, adam(0.05), state, (X, Y), epochs=1, batch_size=batch,
                    progress=True)
    assert int(state2.count) == int(state.count) + 2
    err = capsys.readouterr().err
    assert "\r" in err and "epoch 4/4" in err and "step/s" in err  # the run's fourth epoch


def test_fit_shuffles_reproducibly():
    a, _ = fit(MODEL, CE3, gd(0.1), P0, (X, Y), epochs=1, batch_size=3, key=7)
    b, _ = fit(MODEL, CE3, gd(0.1), P0, (X, Y), epochs=1, batch_size=3, key=7)
    c, _ = fit(MODEL, CE3, gd(0.1), P0, (X, Y), epochs=1, batch_size=3, key=jax.random.PRNGKey(8))
    assert all(np.array_equal(x, y) for x, y in zip(leaves(a.params), leaves(b.params)))
    assert not all(np.array_equal(x, y) for x, y in zip(leaves(a.params), leaves(c.params)))


def test_accuracy_by_hand():
    (W1, b1), _, (W2, b2) = P0
    logits = np.tanh(X @ np.asarray(W1).T + np.asarray(b1)) @ np.asarray(W2).T + np.asarray(b2)
    expected = np.mean(np.argmax(logits, axis=1) == Y)
    assert accuracy(MODEL, P0, X, Y) == pytest.approx(expected)
    assert accuracy(MODEL, P0, X, np.eye(3)[Y]) == pytest.approx(expected)  # one-hot labels


def test_train_state_is_a_pytree():
    state = train_step(MODEL, CE3, adam(0.1)).init(P0)
    assert isinstance(state, TrainState)
    n = len(jax.tree_util.tree_leaves(state))
    assert n == 4 + 1 + 4 + 4 + 1  # params, adam count, mu, nu, the ledger (count and fault)
