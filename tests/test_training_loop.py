"""The loop users run: `fit` over data in memory or any iterable of batches, with
callbacks; one compilation for a sweep of learning rates; what `fit` refuses at its edge.

Oracles: the per-step loop of `train_step` calls written here over the same batches; trace
counters (a function that counts how often it is traced).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from categories import Covector, R
from categories.linear import unwrap
from lenses import (KFAC, CheckpointMismatch, Context, Diagonal, FitProgress, GaussNewton,
                    HyperparameterError, KindError, ParaLens, ShapeError, adam, conv2d, dense,
                    epoch_order, fit, flatten, from_optax, gd, half_squared_error, momentum,
                    softmax_cross_entropy, tanh, train_step)

MODEL = dense(3, 5) >> tanh >> dense(5, 2)
P0 = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), MODEL.init(jax.random.PRNGKey(0)))
RNG = np.random.default_rng(0)
X = RNG.standard_normal((24, 3)).astype(np.float32)
Y = RNG.standard_normal((24, 2)).astype(np.float32)


def bits(t):
    return [np.asarray(a).tobytes() for a in jax.tree_util.tree_leaves(t)]


def per_step(opt, batches):
    step = train_step(MODEL, half_squared_error, opt)
    state, losses = step.init(P0), []
    for x, y in batches:
        state, report = step(state, x, y)
        losses.append(float(report.loss))
    return state, losses


@pytest.mark.parametrize("k", [1, 2, 5])
def test_fit_over_an_iterable_is_the_per_step_loop(k):
    batches = [(X[i:i + 4], Y[i:i + 4]) for i in range(0, 24, 4)] + [(X[:3], Y[:3])]
    ref, losses = per_step(momentum(0.05, 0.9), batches)
    state, history = fit(MODEL, half_squared_error, momentum(0.05, 0.9), P0,
                         (b for b in batches), epochs=3, steps_per_dispatch=k)
    assert int(state.count) == 7 and bits(state) == bits(ref)  # a generator: one pass
    assert history[0]["loss"] == pytest.approx(np.mean(losses), rel=1e-6)
    # a re-iterable (a list) is passed over once per epoch
    state, history = fit(MODEL, half_squared_error, momentum(0.05, 0.9), P0, batches, epochs=2,
                         steps_per_dispatch=k)
    ref2, _ = per_step(momentum(0.05, 0.9), batches * 2)
    assert [h["epoch"] for h in history] == [1, 2] and bits(state) == bits(ref2)


def test_callbacks_see_every_chunk_and_can_stop_the_run():
    seen = []

    def stop_at_5(p: FitProgress):
        seen.append((p.epoch, p.step, len(p.losses)))
        return p.step >= 5

    state, history = fit(MODEL, half_squared_error, gd(0.1), P0, (X, Y), epochs=4, batch_size=4,
                         key=1, steps_per_dispatch=2, callbacks=[stop_at_5])
    assert int(state.count) == 6 and seen == [(1, 2, 2), (1, 4, 2), (1, 6, 2)]
    order = epoch_order(1, 1, 24, 4)
    ref, _ = per_step(gd(0.1), [(X[i], Y[i]) for i in order[:6]])
    assert bits(state) == bits(ref) and history[0]["epoch"] == 1


def counting_model():
    traces = []

    def forward(x, Wb):
        traces.append(1)  # runs only while something is traced
        return Wb[0] @ x + Wb[1]

    model = ParaLens(R(3), R(2), R(2, 3) * R(2), forward, name="counted",
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
    # the rate is an argument, not a constant: a fresh step at another rate agrees with the
    # per-step loop at that rate
    step = train_step(model, half_squared_error, gd(0.3))
    assert step.traces.get("call", 0) <= 1


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
    cores, moved = set(), []
    for lam in (1e-3, 1e-1, 10.0):
        step = train_step(MODEL, half_squared_error, gd(0.5, metric=metric(lam)))
        state, _ = step(step.init(P0), X[:6], Y[:6])
        cores.add(id(step._core))
        sharp = unwrap(metric(lam).sharp(P0, Covector(grad, MODEL.param), ctx))
        want = jax.tree_util.tree_map(lambda p, v: p - 0.5 * v, P0, sharp)
        for got, ref in zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(got, ref, rtol=2e-4, atol=1e-6)
        moved.append(bits(state.params))
    assert len(cores) == 1 and step.traces == {"call": 1}
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
    assert a._core is b._core
    s = a.init(P0)
    a(s, X[:4], Y[:4])
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
    steps = {}
    for name, make in [("plain", optax.rmsprop), ("injected", lambda r: injected(learning_rate=r))]:
        for lr in (0.01, 0.03, 0.01):
            step = train_step(MODEL, half_squared_error, from_optax(make(lr)))
            state, _ = step.run(step.init(P0), Xs, Ys)
            want = optax_loop(make(lr), batches)
            for got, ref in zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(want)):
                np.testing.assert_allclose(got, ref, rtol=2e-5, atol=1e-6)
            steps.setdefault(name, []).append(step)
    plain, inj = steps["plain"], steps["injected"]
    # the rate is a constant of optax.rmsprop's closure: equal rates share, others do not
    assert plain[0].traces == plain[1].traces == {"stacked": 1}  # (traced: 0.01 once, 0.03 once)
    structure = jax.tree_util.tree_structure
    assert structure(plain[0].opt) == structure(plain[2].opt) != structure(plain[1].opt)
    # inject_hyperparams keeps the rate in the state: the whole sweep is one compilation
    assert inj[0]._core is inj[1]._core is inj[2]._core and inj[0].traces == {"stacked": 1}
    assert from_optax(optax.rmsprop(0.1)) == from_optax(optax.rmsprop(0.1))
    assert from_optax(optax.rmsprop(0.1)) != from_optax(optax.rmsprop(0.2))
    assert from_optax(optax.rmsprop(0.1)) != from_optax(optax.adam(0.1))


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(batch_size=100), HyperparameterError, "batch_size 100 is larger than the 24"),
    (dict(checkpoint_path="x.st"), HyperparameterError, "checkpoint_every"),
    (dict(key="abc"), KindError, "key must be"),
    (dict(resume_from=3.5), KindError, "resume_from must be a file path"),
    (dict(checkpoint_every=2, checkpoint_path="c.st", on_checkpoint=3), KindError, "on_checkpoint"),
    (dict(mesh="batch"), KindError, "mesh must be a jax.sharding.Mesh"),
    (dict(callbacks=[3]), KindError, "callbacks"),
    (dict(batch_size=0), HyperparameterError, "batch_size"),
])
def test_fit_refuses_bad_arguments_before_anything_runs(kwargs, error, match, tmp_path):
    with pytest.raises(error, match=match):
        fit(MODEL, half_squared_error, gd(0.1), P0, (X, Y), epochs=1,
            **{"batch_size": 4, **kwargs})


def test_resume_needs_data_in_memory(tmp_path):
    path = str(tmp_path / "run.st")
    fit(MODEL, half_squared_error, gd(0.1), P0, (X, Y), epochs=1, batch_size=4,
        checkpoint_every=2, checkpoint_path=path)
    with pytest.raises(HyperparameterError, match="in memory"):
        fit(MODEL, half_squared_error, gd(0.1), P0, [(X[:4], Y[:4])], resume_from=path,
            checkpoint_every=2, checkpoint_path=path)
    with pytest.raises(CheckpointMismatch, match="batches of"):
        fit(MODEL, half_squared_error, gd(0.1), P0, (X, Y), epochs=1, batch_size=6,
            resume_from=path)


def test_an_iterable_of_malformed_batches_is_refused_naming_the_batch():
    with pytest.raises(ShapeError, match="batch 1 of the iterable"):
        fit(MODEL, half_squared_error, gd(0.1), P0, [(X[:4], Y[:4]), (X[:4, :2], Y[:4])])
    with pytest.raises(ShapeError, match="not a pair"):
        fit(MODEL, half_squared_error, gd(0.1), P0, [X[:4]])


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
    text = step._core.compiled("call").lower(step._hyper, state, X, labels).compile().as_text()
    entry = text[text.index("\nENTRY"):].split("\n}")[0].splitlines()[1:]
    batch = {line.split(" = ")[0].strip() for line in entry  # the inputs and the labels
             if " parameter(" in line and ('op_name="a"' in line or 'op_name="b"' in line)}
    assert len(batch) == 2, entry
    operand = re.compile("[( ](" + "|".join(map(re.escape, batch)) + ")[,)]")
    readers = [line.split(" = ")[1].split("(")[0].split()[-1] for line in entry
               if operand.search(line)]
    assert readers and set(readers) <= {"bitcast"}, readers
