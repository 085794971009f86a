"""`fit`, the loop users run: over data in memory or any iterable of batches, many steps per
dispatch, faults without a round-trip, callbacks, checkpoints, accuracy, and what it refuses
at its edge.

Oracles: the per-step loop written here with `train_step` over the batches `epoch_order`
draws (or the iterable gives); an undisturbed run stopped before the faulting step; a
classifier written by hand with optax's cross-entropy; hand counts of steps and labels.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from categories import DomainError, Positive, R, draws
from lenses import (CheckpointMismatch, Checkpoints, FitProgress, HyperparameterError, KindError,
                    Layer, NonFiniteError, ShapeError, accuracy, adam, dense, epoch_order, fit,
                    gd, half_squared_error, momentum, softmax_cross_entropy, tanh, train_step)

MODEL = dense(3, 5) >> tanh >> dense(5, 2)
P0 = MODEL.init(jax.random.PRNGKey(0))
X = np.asarray(draws.normal(jax.random.PRNGKey(1), (44, 3)))
Y = np.asarray(draws.normal(jax.random.PRNGKey(2), (44, 2)))
KEY = jax.random.PRNGKey(5)
BATCH = 4  # 11 steps per epoch


def leaves(t):
    return [np.asarray(a) for a in jax.tree_util.tree_leaves(t)]


def same_bits(a, b):
    return all(x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
               for x, y in zip(leaves(a), leaves(b)))


def per_step(opt, epochs, X=X, Y=Y):
    """The per-step loop over the same shuffled batches: one permutation per epoch."""
    step = train_step(MODEL, half_squared_error, opt)
    state, history = step.init(P0), []
    for epoch in range(1, epochs + 1):
        order = np.asarray(epoch_order(KEY, epoch, len(X), BATCH))
        losses = []
        for idx in order:
            state, report = step(state, X[idx], Y[idx])
            losses.append(float(report.loss))
        history.append(float(np.mean(losses)))
    return state, history


@pytest.mark.parametrize("dispatch", [None, 3, 1])
@pytest.mark.parametrize("on_device", [True, False])
def test_fit_is_the_per_step_loop_over_the_same_batches(dispatch, on_device):
    opt = momentum(0.05, 0.9)
    ref, ref_history = per_step(opt, 3)
    state, history = fit(MODEL, half_squared_error, opt, P0, (X, Y), epochs=3, batch_size=BATCH,
                         key=KEY, steps_per_dispatch=dispatch, on_device=on_device)
    assert int(state.count) == int(ref.count) == 33
    # The scanned step is the same computation as the per-step one. On the CPU, XLA compiles
    # the two to the same arithmetic, bit for bit; another backend may fuse the loop body
    # differently, so there equality is asked to float rounding.
    if jax.default_backend() == "cpu":
        assert same_bits((state.params, state.opt_state), (ref.params, ref.opt_state))
        assert [h["loss"] for h in history] == ref_history
    for a, b in zip(leaves((state.params, state.opt_state)), leaves((ref.params, ref.opt_state))):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose([h["loss"] for h in history], ref_history, rtol=1e-12)
    assert [h["epoch"] for h in history] == [1, 2, 3]


def test_each_epoch_has_its_own_order_drawn_from_one_key():
    orders = [np.asarray(epoch_order(KEY, e, len(X), BATCH)) for e in (1, 2, 3)]
    assert all(sorted(o.ravel().tolist()) == sorted(set(o.ravel().tolist())) for o in orders)
    assert not np.array_equal(orders[0], orders[1]) and not np.array_equal(orders[1], orders[2])
    # the order is a function of (key, epoch): a different key, a different run
    other, _ = fit(MODEL, half_squared_error, gd(0.1), P0, (X, Y), epochs=1, batch_size=BATCH,
                   key=6)
    same, _ = fit(MODEL, half_squared_error, gd(0.1), P0, (X, Y), epochs=1, batch_size=BATCH,
                  key=KEY)
    again, _ = fit(MODEL, half_squared_error, gd(0.1), P0, (X, Y), epochs=1, batch_size=BATCH,
                   key=KEY)
    assert same_bits(same.params, again.params) and not same_bits(same.params, other.params)


def test_a_continued_run_is_the_uninterrupted_run():
    opt = adam(0.02)
    whole, history = fit(MODEL, half_squared_error, opt, P0, (X, Y), epochs=4, batch_size=BATCH,
                         key=KEY)
    half, first = fit(MODEL, half_squared_error, opt, P0, (X, Y), epochs=2, batch_size=BATCH,
                      key=KEY)
    rest, second = fit(MODEL, half_squared_error, opt, half, (X, Y), epochs=2, batch_size=BATCH,
                       key=KEY)
    assert same_bits((rest.params, rest.opt_state), (whole.params, whole.opt_state))
    assert [h["epoch"] for h in first + second] == [1, 2, 3, 4]
    assert [h["loss"] for h in first + second] == [h["loss"] for h in history]
    # and stopped mid-epoch (max_steps), then continued
    part, _ = fit(MODEL, half_squared_error, opt, P0, (X, Y), epochs=4, batch_size=BATCH,
                  key=KEY, max_steps=17)
    assert int(part.count) == 17
    done, _ = fit(MODEL, half_squared_error, opt, part, (X, Y), epochs=3, batch_size=BATCH,
                  key=KEY)
    assert int(done.count) == 44
    assert same_bits((done.params, done.opt_state), (whole.params, whole.opt_state))


def _planted(order_row):
    bad = X.copy()
    bad[order_row[0], 1] = np.nan
    return bad


@pytest.mark.parametrize("dispatch", [None, 4])
def test_a_nan_in_batch_7_stops_fit_naming_step_7_with_the_state_after_step_6(dispatch):
    opt = adam(0.02)
    order = np.asarray(epoch_order(KEY, 1, len(X), BATCH))
    with pytest.raises(NonFiniteError, match=r"step 7: the covector of slot 0 \(dense\(3→5\)\)") as e:
        fit(MODEL, half_squared_error, opt, P0, (_planted(order[6]), Y), epochs=2,
            batch_size=BATCH, key=KEY, steps_per_dispatch=dispatch)
    six, _ = fit(MODEL, half_squared_error, opt, P0, (X, Y), epochs=1, batch_size=BATCH, key=KEY,
                 max_steps=6, steps_per_dispatch=dispatch)
    assert e.value.step == 7 and int(e.value.state.count) == 6
    assert same_bits(e.value.state, six)
    assert len(e.value.history) == 0  # no epoch was completed


def _scale():
    return Layer(R(1), R(1), Positive(1), lambda x, s: s * x, name="scale",
                    init=lambda k: jnp.ones((1,)))


def test_a_step_leaving_the_open_parameter_object_stops_fit_with_the_state_before_it():
    model = dense(1, 1) >> _scale()
    p = ((jnp.ones((1, 1)), jnp.zeros((1,))), jnp.full((1,), 0.02))
    Xs = np.ones((40, 1))
    Ys = np.zeros((40, 1))
    Ys[:, 0] = np.linspace(-1, 1, 40)
    opt = gd(1.5)
    # find the first step that would leave (0, ∞) by running the per-step loop by hand
    step = train_step(model, half_squared_error, opt)
    state, order = step.init(p), np.asarray(epoch_order(KEY, 1, 40, 4))
    bad_step = None
    for i, idx in enumerate(order, 1):
        new, _ = step(state, Xs[idx], Ys[idx])
        if int(new.fault[0]):
            bad_step = i
            break
        state = new
    assert bad_step is not None, "the test needs a step that leaves the parameter object"
    with pytest.raises(DomainError, match=rf"step {bad_step}: .*slot 1 \(scale\).*Positive") as e:
        fit(model, half_squared_error, opt, p, (Xs, Ys), epochs=1, batch_size=4, key=KEY)
    before, _ = fit(model, half_squared_error, opt, p, (Xs, Ys), epochs=1, batch_size=4, key=KEY,
                    max_steps=bad_step - 1)
    assert same_bits(e.value.state, before)


def test_the_compiled_step_reads_nothing_back_and_checks_structure_once():
    step = train_step(dense(3, 4) >> tanh >> dense(4, 2), half_squared_error, gd(0.1))
    state = step.init(step.model.init(jax.random.PRNGKey(0)))
    for _ in range(5):
        state, report = step(state, X[:4], Y[:4])
    assert step.traces == {"call": 1}  # checks run while tracing: once per compiled signature
    assert isinstance(state.count, jax.Array)  # nothing was synchronised to build the result
    with pytest.raises(TypeError, match="TrainState"):
        step(P0, X[:4], Y[:4])
    with pytest.raises(ValueError, match=r"shape \(n, \*\(3,\)\)"):
        step(state, np.ones((4, 3, 1)), Y[:4])


def test_fit_with_eval_data_compiles_once_not_per_epoch():
    traces = []

    def counted(x, Wb):
        traces.append(1)  # runs only while something is being traced
        return Wb[0] @ x + Wb[1]

    model = Layer(R(3), R(2), R(2, 3) * R(2), counted, name="counted",
                     init=lambda k: (jax.random.normal(k, (2, 3)), jnp.zeros((2,))))
    p = model.init(jax.random.PRNGKey(0))
    fit(model, half_squared_error, gd(0.1), p, (X, Y), epochs=1, batch_size=BATCH, key=KEY,
        eval_data=(X, Y))
    first = len(traces)
    fit(model, half_squared_error, gd(0.1), p, (X, Y), epochs=2, batch_size=BATCH, key=KEY,
        eval_data=(X, Y))
    two = len(traces) - first
    fit(model, half_squared_error, gd(0.1), p, (X, Y), epochs=8, batch_size=BATCH, key=KEY,
        eval_data=(X, Y))
    # an equal optimiser reuses the compiled chunk, and predict was compiled by the first
    # run: more epochs of training and evaluation add no trace at all
    assert first > 0 and two == 0 and len(traces) == first


@pytest.mark.parametrize("data", ["in memory", "stream", "checkpointed"])
def test_fit_dispatches_nothing_while_a_chunk_is_in_flight(data, monkeypatch, tmp_path):
    """fit dispatches each chunk before it settles the one before, so that the device has work
    while the host reads back. Any JAX operation the host dispatches meanwhile (indexing the
    state on the device, as `int(state.count)` does) runs after the chunk in flight and makes
    the host wait for it: a step of fit cost 1.2-1.45x a step of a `lax.scan` epoch that way,
    0.85-1.13x without it (bench/README.md). So from its first chunk on, fit only transfers,
    saving checkpoints included."""
    import jax._src.dispatch as dispatch  # where every operation run outside jit passes

    from lenses.training import schedule

    ops, in_flight = [], []
    real_op, real_dispatch = dispatch.xla_primitive_callable, schedule.dispatch

    def op(prim, **params):
        ops.append((prim.name, bool(in_flight)))
        return real_op(prim, **params)

    def dispatched(*args, **kwargs):
        in_flight.append(True)
        return real_dispatch(*args, **kwargs)

    monkeypatch.setattr(dispatch, "xla_primitive_callable", op)
    int(jnp.asarray([3, 4])[1])  # the hook sees an operation outside jit (else it is stale)
    assert ops, "the hook no longer sees JAX's operations outside jit"
    monkeypatch.setattr(schedule, "dispatch", dispatched)
    source = [(X[i:i + BATCH], Y[i:i + BATCH]) for i in range(0, 40, BATCH)] \
        if data == "stream" else (X, Y)
    saving = dict(checkpoints=Checkpoints(str(tmp_path / "run.st"), every=6)) \
        if data == "checkpointed" else {}
    for _ in range(2):  # the first run compiles
        ops.clear()
        in_flight.clear()
        state, history = fit(MODEL, half_squared_error, gd(0.05), P0, source, epochs=3,
                             batch_size=BATCH, key=KEY, steps_per_dispatch=3, progress=False,
                             **saving)
    assert len(history) == 3 and state.steps_taken() == (30 if data == "stream" else 33)
    assert len(in_flight) == (12 if data != "checkpointed" else 16)  # chunks end at saves too
    assert [name for name, after_first_chunk in ops if after_first_chunk] == []


# -- data in memory or any iterable of batches; callbacks; what fit refuses at its edge ----------

P32 = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), P0)
X24 = np.asarray(X[:24], np.float32)
Y24 = np.asarray(Y[:24], np.float32)


def bits(t):
    return [np.asarray(a).tobytes() for a in jax.tree_util.tree_leaves(t)]


def calls(opt, batches):
    """The oracle: one `train_step` call per batch, from P32."""
    step = train_step(MODEL, half_squared_error, opt)
    state, losses = step.init(P32), []
    for x, y in batches:
        state, report = step(state, x, y)
        losses.append(float(report.loss))
    return state, losses


@pytest.mark.parametrize("k", [1, 2, 5])
def test_fit_over_an_iterable_is_the_per_step_loop(k):
    batches = [(X24[i:i + 4], Y24[i:i + 4]) for i in range(0, 24, 4)] + [(X24[:3], Y24[:3])]
    ref, losses = calls(momentum(0.05, 0.9), batches)
    state, history = fit(MODEL, half_squared_error, momentum(0.05, 0.9), P32,
                         (b for b in batches), epochs=3, steps_per_dispatch=k)
    assert int(state.count) == 7 and bits(state) == bits(ref)  # a generator: one pass
    assert history[0]["loss"] == pytest.approx(np.mean(losses), rel=1e-6)
    # a re-iterable (a list) is passed over once per epoch
    state, history = fit(MODEL, half_squared_error, momentum(0.05, 0.9), P32, batches, epochs=2,
                         steps_per_dispatch=k)
    ref2, _ = calls(momentum(0.05, 0.9), batches * 2)
    assert [h["epoch"] for h in history] == [1, 2] and bits(state) == bits(ref2)


def test_callbacks_see_every_chunk_and_can_stop_the_run():
    seen = []

    def stop_at_5(p: FitProgress):
        seen.append((p.epoch, p.step, len(p.losses)))
        return p.step >= 5

    state, history = fit(MODEL, half_squared_error, gd(0.1), P32, (X24, Y24), epochs=4, batch_size=4,
                         key=1, steps_per_dispatch=2, callbacks=[stop_at_5])
    assert int(state.count) == 6 and seen == [(1, 2, 2), (1, 4, 2), (1, 6, 2)]
    order = epoch_order(1, 1, 24, 4)
    ref, _ = calls(gd(0.1), [(X24[i], Y24[i]) for i in order[:6]])
    assert bits(state) == bits(ref) and history[0]["epoch"] == 1


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(batch_size=100), HyperparameterError, "batch_size 100 is larger than the 24"),
    (dict(checkpoints="x.st"), KindError, "checkpoints must be a Checkpoints"),
    (dict(key="abc"), KindError, "key must be"),
    (dict(mesh="batch"), KindError, "mesh must be a jax.sharding.Mesh"),
    (dict(callbacks=[3]), KindError, "callbacks"),
    (dict(batch_size=0), HyperparameterError, "batch_size"),
])
def test_fit_refuses_bad_arguments_before_anything_runs(kwargs, error, match, tmp_path):
    with pytest.raises(error, match=match):
        fit(MODEL, half_squared_error, gd(0.1), P32, (X24, Y24), epochs=1,
            **{"batch_size": 4, **kwargs})


@pytest.mark.parametrize("args, error, match", [
    (dict(path=3.5, every=2), KindError, "a file path"),
    (dict(path="c.st"), HyperparameterError, "neither saves nor resumes"),
    (dict(path="c.st", every=0), HyperparameterError, "every must be an integer ≥ 1"),
    (dict(path="c.st", every=2.5), HyperparameterError, "every must be an integer ≥ 1"),
    (dict(path="c.st", resume="yes"), KindError, "resume must be True or False"),
    (dict(path="c.st", every=2, on_save=3), KindError, "on_save must be a function"),
    (dict(path="c.st", resume=True, on_save=print), HyperparameterError, "on_save is called after"),
])
def test_checkpoints_refuse_what_cannot_save_or_resume(args, error, match):
    with pytest.raises(error, match=match):
        Checkpoints(**args)


def test_resume_needs_data_in_memory(tmp_path):
    path = str(tmp_path / "run.st")
    fit(MODEL, half_squared_error, gd(0.1), P32, (X24, Y24), epochs=1, batch_size=4,
        checkpoints=Checkpoints(path, every=2))
    with pytest.raises(HyperparameterError, match="in memory"):
        fit(MODEL, half_squared_error, gd(0.1), P32, [(X24[:4], Y24[:4])],
            checkpoints=Checkpoints(path, every=2, resume=True))
    with pytest.raises(CheckpointMismatch, match="batches of"):
        fit(MODEL, half_squared_error, gd(0.1), P32, (X24, Y24), epochs=1, batch_size=6,
            checkpoints=Checkpoints(path, resume=True))


def test_an_iterable_of_malformed_batches_is_refused_naming_the_batch():
    with pytest.raises(ShapeError, match="batch 1 of the iterable"):
        fit(MODEL, half_squared_error, gd(0.1), P32, [(X24[:4], Y24[:4]), (X24[:4, :2], Y24[:4])])
    with pytest.raises(ShapeError, match="not a pair"):
        fit(MODEL, half_squared_error, gd(0.1), P32, [X24[:4]])


# -- a classifier against a hand-written one (optax's cross-entropy, `jax.grad`) -------------------

CE3 = functools.partial(softmax_cross_entropy, classes=3)
CLASSIFIER = dense(4, 6) >> tanh >> dense(6, 3)
C_P0 = CLASSIFIER.init(jax.random.PRNGKey(0))
C_X = np.asarray(draws.normal(jax.random.PRNGKey(1), (10, 4)))
C_Y = np.asarray(jax.random.randint(jax.random.PRNGKey(2), (10,), 0, 3))


def test_fit_drops_the_remainder_and_records_history(capsys):
    epochs, batch = 3, 4  # 10 examples: 2 full batches per epoch, 2 examples dropped
    state, history = fit(CLASSIFIER, CE3, adam(0.05), C_P0, (C_X, C_Y), epochs=epochs, batch_size=batch,
                         key=jax.random.PRNGKey(0), eval_data=(C_X, C_Y))
    assert int(state.count) == epochs * (10 // batch)
    assert [h["epoch"] for h in history] == [1, 2, 3]
    assert all(set(h) >= {"loss", "steps_per_s", "accuracy"} for h in history)
    assert history[-1]["accuracy"] == pytest.approx(accuracy(CLASSIFIER, state.params, C_X, C_Y))
    assert capsys.readouterr().err == ""  # not a terminal: no progress line
    # continue from the state, with a progress line forced on
    state2, _ = fit(CLASSIFIER, CE3, adam(0.05), state, (C_X, C_Y), epochs=1, batch_size=batch,
                    progress=True)
    assert int(state2.count) == int(state.count) + 2
    err = capsys.readouterr().err
    assert "\r" in err and "epoch 4/4" in err and "step/s" in err  # the run's fourth epoch


def test_fit_shuffles_reproducibly():
    a, _ = fit(CLASSIFIER, CE3, gd(0.1), C_P0, (C_X, C_Y), epochs=1, batch_size=3, key=7)
    b, _ = fit(CLASSIFIER, CE3, gd(0.1), C_P0, (C_X, C_Y), epochs=1, batch_size=3, key=7)
    c, _ = fit(CLASSIFIER, CE3, gd(0.1), C_P0, (C_X, C_Y), epochs=1, batch_size=3, key=jax.random.PRNGKey(8))
    assert all(np.array_equal(x, y) for x, y in zip(leaves(a.params), leaves(b.params)))
    assert not all(np.array_equal(x, y) for x, y in zip(leaves(a.params), leaves(c.params)))


def test_accuracy_by_hand():
    (W1, b1), _, (W2, b2) = C_P0
    logits = np.tanh(C_X @ np.asarray(W1).T + np.asarray(b1)) @ np.asarray(W2).T + np.asarray(b2)
    expected = np.mean(np.argmax(logits, axis=1) == C_Y)
    assert accuracy(CLASSIFIER, C_P0, C_X, C_Y) == pytest.approx(expected)
    assert accuracy(CLASSIFIER, C_P0, C_X, np.eye(3)[C_Y]) == pytest.approx(expected)  # one-hot labels
