"""The training step and the loop it runs in: a call's report and move against a classifier
written by hand, two phases (Nesterov's lookahead), a call, `run` and `fit` giving the same
bits, one compilation for equal optimisers and for sweeps of their numbers, and what a step
refuses.

Oracles: a hand-written MLP with optax's cross-entropy and `jax.grad`, optax's Nesterov and
optax's own loop; the calls of `train_step` written here over the same batches; trace
counters (a function that counts how often it is traced); the compiled program's text.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from categories import Covector, R, Vector, draws
from categories.linear import unwrap
from lenses import (KFAC, Context, Diagonal, GaussNewton, Layer, Metric, TrainState, adam,
                    conv2d, dense, fit, flatten, from_optax, gd, half_squared_error, momentum,
                    nesterov, sigmoid, softmax_cross_entropy, tanh, train_step)

MODEL = dense(3, 5) >> tanh >> dense(5, 2)
P0 = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), MODEL.init(jax.random.PRNGKey(0)))
RNG = np.random.default_rng(0)
X = RNG.standard_normal((24, 3)).astype(np.float32)
Y = RNG.standard_normal((24, 2)).astype(np.float32)


def bits(t):
    return [np.asarray(a).tobytes() for a in jax.tree_util.tree_leaves(t)]


def counting_model():
    traces = []

    def forward(x, Wb):
        traces.append(1)  # runs only while something is traced
        return Wb[0] @ x + Wb[1]

    model = Layer(R(3), R(2), R(2, 3) * R(2), forward, name="counted",
                     init=lambda k: (jax.random.normal(k, (2, 3)), jnp.zeros((2,))))
    return model, traces


def test_a_sweep_of_five_learning_rates_through_fit_compiles_once():
    model, traces = counting_model()
    p = model.init(jax.random.PRNGKey(0))
    fit(model, half_squared_error, adam(1e-3), p, (X, Y), epochs=1, batch_size=4)
    first = len(traces)
    assert first > 0
    finals = []
    for lr in [1e-3, 3e-3, 1e-2, 3e-2, 1e-1]:  # fresh optimisers, equal but for the rate
        state, _ = fit(model, half_squared_error, adam(lr), p, (X, Y), epochs=2, batch_size=4)
        finals.append(bits(state.params))
    assert len(traces) == first  # not one trace more
    assert len({tuple(f) for f in finals}) == 5  # and the rates did differ
    # that each rate's result is its own (not the first rate's constant): test_compile_sharing


def weighted(lam):
    """A diagonal metric whose weights (one per coordinate, shaped like the point) vary with lam."""
    return Diagonal(jax.tree_util.tree_map(
        lambda a: 1.0 + lam * jnp.arange(a.size, dtype=a.dtype).reshape(a.shape), P0))


@pytest.mark.parametrize("metric", [GaussNewton, lambda lam: KFAC(lam, model=MODEL, decay=0.5),
                                    weighted], ids=["GaussNewton", "KFAC", "Diagonal"])
def test_a_sweep_over_the_damping_compiles_once_and_each_damping_is_its_own_step(metric):
    """The damping (a diagonal's weights) is an argument of the compiled step, like the
    learning rate: one trace for the sweep, and each damping's step is p − η (p')♯, ♯ the
    metric made with that damping applied eagerly to jax.grad of the composite's mean loss."""
    def loss(p):
        z = jax.vmap(lambda xi: MODEL.forward(xi, p))(X[:6])
        return jnp.mean(0.5 * jnp.sum((z - Y[:6]) ** 2, axis=-1))

    grad, ctx = jax.grad(loss)(P0), Context(MODEL, half_squared_error, X[:6], Y[:6])
    before, moved = [], []
    for lam in (1e-3, 1e-1, 10.0):
        step = train_step(MODEL, half_squared_error, gd(0.5, metric=metric(lam)))
        before.append(step.traces)  # what its engine traced before its first call
        state, _ = step(step.init(P0), X[:6], Y[:6])
        sharp = unwrap(metric(lam).sharp(P0, Covector(grad, MODEL.param), ctx))
        want = jax.tree_util.tree_map(lambda p, v: p - 0.5 * v, P0, sharp)
        for got, ref in zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(got, ref, rtol=2e-4, atol=1e-6)
        moved.append(bits(state.params))
    # the later dampings' steps found the first one's trace: one engine, one compilation
    assert before[1:] == [{"call": 1}] * 2 and step.traces == {"call": 1}
    assert len({tuple(m) for m in moved}) == 3  # and the dampings did differ
    assert gd(0.5, metric=metric(1e-3)) != gd(0.5, metric=metric(1e-1))  # equal but for λ
    assert gd(0.5, metric=metric(1e-3)) == gd(0.5, metric=metric(1e-3))


def test_equal_optimisers_are_equal_and_share_their_compilation():
    assert adam(1e-3) == adam(1e-3) and hash(adam(1e-3)) == hash(adam(1e-3))
    structure = jax.tree_util.tree_structure  # what a compiled step is keyed by (numbers aside)
    assert adam(1e-3) != adam(2e-3) and structure(adam(1e-3)) == structure(adam(2e-3))
    assert adam(1e-3) != momentum(1e-3) and gd(0.1) != gd(0.1, metric=None, on_domain_error="backtrack")
    a = train_step(MODEL, half_squared_error, adam(1e-3))
    b = train_step(MODEL, half_squared_error, adam(5e-3))
    s = a.init(P0)
    a(s, X[:4], Y[:4])
    # b's engine is a's: it holds a's trace (other kinds, e.g. a chunk's, may have been traced
    # for this model and optimiser structure by tests run before in this process)
    assert b.traces == a.traces and a.traces["call"] == 1
    b(s, X[:4], Y[:4])
    assert a.traces["call"] == 1


def optax_loop(tx, batches):
    """The oracle: optax's own loop on jax.grad of the whole composite's mean loss."""
    def loss(p, x, y):
        z = jax.vmap(lambda xi: MODEL.forward(xi, p))(x)
        return jnp.mean(0.5 * jnp.sum((z - y) ** 2, axis=-1))

    p, s = P0, tx.init(P0)
    for x, y in batches:
        u, s = tx.update(jax.grad(loss)(p, x, y), s, p)
        p = optax.apply_updates(p, u)
    return p


def test_optax_transformations_equal_by_value_share_their_compilation():
    batches = [(X[i:i + 4], Y[i:i + 4]) for i in range(0, 24, 4)]
    Xs, Ys = np.stack([b[0] for b in batches]), np.stack([b[1] for b in batches])
    injected = optax.inject_hyperparams(optax.rmsprop)
    steps, before = {}, {}
    for name, make in [("plain", optax.rmsprop), ("injected", lambda r: injected(learning_rate=r))]:
        for lr in (0.01, 0.03, 0.01):
            step = train_step(MODEL, half_squared_error, from_optax(make(lr)))
            before.setdefault(name, []).append(step.traces)  # its engine's traces so far
            state, _ = step.run(step.init(P0), Xs, Ys)
            want = optax_loop(make(lr), batches)
            for got, ref in zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(want)):
                np.testing.assert_allclose(got, ref, rtol=2e-5, atol=1e-6)
            steps.setdefault(name, []).append(step)
    # the rate is a constant of optax.rmsprop's closure: equal rates share, others do not
    assert before["plain"] == [{}, {}, {"stacked": 1}]
    structure = jax.tree_util.tree_structure
    assert structure(steps["plain"][0].opt) == structure(steps["plain"][2].opt) \
        != structure(steps["plain"][1].opt)
    # inject_hyperparams keeps the rate in the state: the whole sweep is one compilation
    assert before["injected"] == [{}, {"stacked": 1}, {"stacked": 1}]
    assert steps["injected"][0].traces == {"stacked": 1}
    assert from_optax(optax.rmsprop(0.1)) == from_optax(optax.rmsprop(0.1))
    assert from_optax(optax.rmsprop(0.1)) != from_optax(optax.rmsprop(0.2))
    assert from_optax(optax.rmsprop(0.1)) != from_optax(optax.adam(0.1))


def test_a_state_of_another_optimiser_is_refused_naming_both():
    from categories import SpaceMismatch

    state = train_step(MODEL, half_squared_error, momentum(0.1)).init(P0)
    step = train_step(MODEL, half_squared_error, adam(0.1))
    with pytest.raises(SpaceMismatch, match="optimiser state is not one of"):
        step(state, X[:4], Y[:4])
    with pytest.raises(SpaceMismatch, match="optimiser state is not one of"):
        step.run(state, np.stack([X[:4]] * 2), np.stack([Y[:4]] * 2))
    with pytest.raises(SpaceMismatch, match="optimiser state is not one of"):
        fit(MODEL, half_squared_error, adam(0.1), state, (X, Y), epochs=1, batch_size=4)


def _mlp():
    return dense(2, 16) >> tanh >> dense(16, 1), (8, 2)


def _conv():
    return (conv2d(1, 3, 3) >> tanh >> flatten >> dense(3 * 4 * 4, 1)).at(R(1, 6, 6)), (8, 1, 6, 6)


@pytest.mark.parametrize("net", [_mlp, _conv], ids=["mlp", "conv"])
@pytest.mark.parametrize("make", [lambda: adam(0.01), lambda: momentum(0.1, 0.9), lambda: gd(0.1)])
def test_run_and_fit_are_the_calls_bit_for_bit_with_every_rule(make, net):
    """A chunk runs the loop a call runs (for one step), so its arithmetic is the calls': XLA
    compiles the one loop body alike. (A top-level step against a scanned one differed in
    the last bits of Adam's moments once its numbers were arguments; a conv net's step
    compiled on its own differs from the same step in a loop with every rule, in float32
    and float64: so a call is not compiled straight.)"""
    model, shape = net()
    p = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), model.init(jax.random.PRNGKey(0)))
    Xs = RNG.standard_normal((16,) + shape).astype(np.float32)
    Ys = RNG.standard_normal((16, 8, 1)).astype(np.float32)
    step = train_step(model, half_squared_error, make())
    state = step.init(p)
    for x, y in zip(Xs, Ys):
        state, _ = step(state, x, y)
    ran, report = step.run(step.init(p), Xs, Ys)
    assert bits(ran) == bits(state) and int(ran.count) == 16
    fitted, _ = fit(model, half_squared_error, make(), p, (b for b in zip(Xs, Ys)),
                    steps_per_dispatch=5)
    assert bits(fitted) == bits(state)


def test_a_call_reads_its_batch_only_inside_the_loop():
    """A call runs the loop of one step over a stack of one batch, whose index XLA simplifies
    away: without the barrier that ties the batch to the step's index, XLA hoists what
    depends on the batch alone (with cross-entropy: the one-hot scatter of the labels and
    their check) out of the loop into values the loop carries, and the call cost 1.7x the
    same step compiled straight (bench/README.md). Oracle: the compiled program's text; at
    its top level the batch is only reshaped and handed to the loop."""
    model = dense(4, 16) >> tanh >> dense(16, 3)
    step = train_step(model, softmax_cross_entropy(classes=3), gd(0.1))
    state = step.init(model.init(jax.random.PRNGKey(0)))
    X, labels = jnp.ones((8, 4), jnp.float32), jnp.zeros((8,), jnp.int32)
    text = step.lowered(state, X, labels).compile().as_text()
    entry = text[text.index("\nENTRY"):].split("\n}")[0].splitlines()[1:]
    batch = {line.split(" = ")[0].strip() for line in entry  # the inputs and the labels
             if " parameter(" in line and ('op_name="a"' in line or 'op_name="b"' in line)}
    assert len(batch) == 2, entry
    operand = re.compile("[( ](" + "|".join(map(re.escape, batch)) + ")[,)]")
    readers = [line.split(" = ")[1].split("(")[0].split()[-1] for line in entry
               if operand.search(line)]
    assert readers and set(readers) <= {"bitcast"}, readers


# -- a classifier against a hand-written one (optax's cross-entropy, `jax.grad`) -------------------

CE3 = functools.partial(softmax_cross_entropy, classes=3)
CLASSIFIER = dense(4, 6) >> tanh >> dense(6, 3)
C_P0 = CLASSIFIER.init(jax.random.PRNGKey(0))
C_X = np.asarray(draws.normal(jax.random.PRNGKey(1), (10, 4)))
C_Y = np.asarray(jax.random.randint(jax.random.PRNGKey(2), (10,), 0, 3))


@functools.partial(jax.jit, static_argnames="reduction")
def hand_loss(p, C_X=C_X, C_Y=C_Y, reduction="mean"):
    """Cross-entropy of W₂ tanh(W₁x + b₁) + b₂, written with optax and no lenses."""
    (W1, b1), _, (W2, b2) = p
    logits = jnp.tanh(C_X @ W1.T + b1[None, :]) @ W2.T + b2[None, :]
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, C_Y)
    return jnp.mean(losses) if reduction == "mean" else jnp.sum(losses)


hand_value_and_grad = jax.jit(jax.value_and_grad(hand_loss), static_argnames="reduction")


def leaves(t):
    return [np.asarray(a) for a in jax.tree_util.tree_leaves(t)]


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_report_and_step_match_an_independent_computation(reduction):
    lr = 0.1
    step = train_step(CLASSIFIER, CE3, gd(lr), reduction=reduction)
    state = step.init(C_P0)
    new, report = step(state, C_X, C_Y)
    loss, g = hand_value_and_grad(C_P0, reduction=reduction)
    assert float(report.loss) == pytest.approx(float(loss), abs=1e-12)
    slope = max(float(jnp.max(jnp.abs(a))) for a in jax.tree_util.tree_leaves(g))
    assert float(report.largest_slope) == pytest.approx(slope, abs=1e-12)
    expected = jax.tree_util.tree_map(lambda p, gi: p - lr * gi, C_P0, g)
    for a, b in zip(leaves(new.params), leaves(expected)):
        np.testing.assert_allclose(a, b, atol=1e-12)
    assert new.params[1] is None and int(new.count) == 1


def test_nesterov_step_evaluates_at_the_lookahead_point():
    """Phase one at φ = lookahead(s, θ): the losses and points are optax's Nesterov iterates."""
    lr, beta = 0.2, 0.9
    opt = nesterov(lr, beta)
    step = train_step(CLASSIFIER, CE3, opt)
    tx = optax.sgd(lr, momentum=beta, nesterov=True)
    state, p, s = step.init(C_P0), C_P0, tx.init(C_P0)
    for _ in range(5):
        state, report = step(state, C_X, C_Y)
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

    step = train_step(CLASSIFIER, family, adam(0.01))
    state = step.init(C_P0)
    state, _ = step(state, C_X, C_Y)
    after_first = len(traces)
    assert after_first > 0
    for _ in range(4):
        state, _ = step(state, C_X, C_Y)
    assert len(traces) == after_first


def test_an_optax_transformation_is_accepted_as_the_rule():
    a = train_step(CLASSIFIER, CE3, optax.adam(0.05))
    b = train_step(CLASSIFIER, CE3, adam(0.05))
    sa, sb = a.init(C_P0), b.init(C_P0)
    for _ in range(3):
        sa, _ = a(sa, C_X, C_Y)
        sb, _ = b(sb, C_X, C_Y)
    for x, y in zip(leaves(sa.params), leaves(sb.params)):
        np.testing.assert_allclose(x, y, atol=1e-12)


class PerExample(Metric):
    """A data-dependent inner product: n times the Euclidean one, n read from the batch."""

    def sharp(self, p, cov, ctx=None):
        n = ctx.x.shape[0]
        return Vector(jax.tree_util.tree_map(lambda a: a / n, unwrap(cov)))

    def flat(self, p, vec, ctx=None):
        return Covector(jax.tree_util.tree_map(lambda a: a * ctx.x.shape[0], unwrap(vec)))


def test_the_metric_sees_the_batch():
    """gd with the sum loss and the metric n·⟨,⟩ is gd with the mean loss."""
    a = train_step(CLASSIFIER, CE3, gd(0.3, metric=PerExample()), reduction="sum")
    b = train_step(CLASSIFIER, CE3, gd(0.3))
    sa, _ = a(a.init(C_P0), C_X, C_Y)
    sb, _ = b(b.init(C_P0), C_X, C_Y)
    for x, y in zip(leaves(sa.params), leaves(sb.params)):
        np.testing.assert_allclose(x, y, atol=1e-12)
    assert max(np.max(np.abs(x - y)) for x, y in zip(leaves(sa.params), leaves(C_P0))) > 1e-4


def test_train_state_is_a_pytree():
    state = train_step(CLASSIFIER, CE3, adam(0.1)).init(C_P0)
    assert isinstance(state, TrainState)
    n = len(jax.tree_util.tree_leaves(state))
    assert n == 4 + 1 + 4 + 4 + 1  # params, adam count, mu, nu, the ledger (count and fault)
