"""Four slips of the engine that the suite once missed, each caught by a test that fails
with the slip planted:

1. the slot a non-finite *new point* is attributed to, with several slots and only a later
   one overflowing (oracle: the new point computed by hand from jax.grad of the composite);
2. the optimisation barrier on the step's numbers: a user's `jax.jit(step.step_fn)` (the
   numbers constants) gives the bits of the engine's call (the numbers arguments) for
   Nesterov momentum and for Adam with a diagonal metric;
3. a state holding a fault not yet seen, saved and loaded: the fault is still there and
   raises when seen;
4. softmax cross-entropy at logits beyond exp's range (above ~88 in float32, ~709 in
   float64): finite and equal to a log-sum-exp computed here by numpy.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lenses import (Diagonal, Fault, NonFiniteError, ParalensError, adam, dense, gd, half_squared_error,
                    load, nesterov, save, softmax_cross_entropy, tanh, train_step)
from lenses.losses import batch_loss

tree_map, leaves = jax.tree_util.tree_map, jax.tree_util.tree_leaves


def bits(tree):
    return [(np.asarray(a).dtype.str, np.asarray(a).shape, np.asarray(a).tobytes())
            for a in leaves(tree)]


# == 1. the slot of a non-finite new point =========================================================

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("late", [1, 2])
def test_a_non_finite_new_point_is_attributed_to_the_slot_that_overflows(dtype, late):
    """Three slots, finite covectors; a diagonal metric with tiny (normal) weights on slot
    `late` only makes that slot's sharp, and so its new point, overflow. The slot named is
    the first whose new point p − η g / w (computed here from jax.grad) is not finite."""
    model = dense(2, 2) >> dense(2, 2) >> dense(2, 1)
    p0 = tree_map(lambda a: a.astype(dtype), model.init(jax.random.PRNGKey(0)))
    tiny = {np.float32: 1e-36, np.float64: 1e-306}[dtype]
    w = tuple(tree_map(lambda a: np.full(a.shape, tiny if i == late else 1.0, dtype), slot)
              for i, slot in enumerate(p0))
    lr = dtype(1e6)
    X, Y = np.ones((4, 2), dtype), np.full((4, 1), 3.0, dtype)

    def loss(p):  # the composite, written out
        (W1, b1), (W2, b2), (W3, b3) = p
        z = ((X @ W1.T + b1[None]) @ W2.T + b2[None]) @ W3.T + b3[None]
        return jnp.mean(0.5 * jnp.sum((z - Y) ** 2, axis=1))

    g = jax.grad(loss)(p0)
    assert all(np.all(np.isfinite(np.asarray(a))) for a in leaves(g))
    with np.errstate(over="ignore"):
        new = [[np.asarray(a) - lr * np.asarray(b) / np.asarray(c) for a, b, c in
                zip(leaves(ps), leaves(gs), leaves(ws))] for ps, gs, ws in zip(p0, g, w)]
    overflowing = [i for i, slot in enumerate(new) if not all(np.all(np.isfinite(a)) for a in slot)]
    assert overflowing == [late]  # the oracle: only the late slot overflows
    step = train_step(model, half_squared_error, gd(float(lr), metric=Diagonal(w)))
    state, report = step(step.init(p0), X, Y)
    with pytest.raises(NonFiniteError) as e:
        report.check()
    assert (e.value.kind, e.value.step, e.value.slot) == (Fault.NEW_POINT, 1, overflowing[0])


# == 2. the optimisation barrier on the step's numbers =============================================

MODEL = dense(3, 8) >> tanh >> dense(8, 2)
P0 = tree_map(lambda a: a.astype(np.float32), MODEL.init(jax.random.PRNGKey(1)))
W_DIAG = tree_map(lambda a: (1.0 + 0.37 * np.arange(a.size, dtype=np.float32)).reshape(a.shape), P0)


@pytest.mark.parametrize("make", [lambda: nesterov(0.05, 0.9),
                                  lambda: adam(0.01, metric=Diagonal(W_DIAG))],
                         ids=["nesterov", "adam-diagonal"])
def test_a_jitted_step_fn_gives_the_bits_of_the_engines_calls(make):
    """The numbers are constants in the user's jit and arguments in the engine's call; the
    barrier keeps XLA from folding the constants, so both compute the same arithmetic."""
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((16, 3)).astype(np.float32),
                rng.standard_normal((16, 2)).astype(np.float32)) for _ in range(8)]
    step = train_step(MODEL, half_squared_error, make())
    user = jax.jit(train_step(MODEL, half_squared_error, make()).step_fn)
    a = b = step.init(P0)
    for X, Y in batches:
        a, _ = step(a, X, Y)
        b, _ = user(b, X, Y)
        assert bits(a) == bits(b)


# == 3. a fault not yet seen, saved =================================================================

def test_a_saved_state_keeps_its_unseen_fault_and_raises_it_when_seen(tmp_path):
    model = dense(2, 1)
    opt = adam(0.1)
    step = train_step(model, half_squared_error, opt)
    p0 = (jnp.ones((1, 2)), jnp.zeros(1))
    X, Y = np.ones((4, 2)), np.zeros((4, 1))
    state, _ = step(step.init(p0), X, Y)
    bad = X.copy()
    bad[2, 1] = np.nan
    faulted, _ = step(state, bad, Y)  # refused: the covector is NaN; the fault is not yet seen
    path = save(tmp_path / "run.st", faulted, model, opt)
    back = load(path, model, opt).state
    assert np.asarray(back.fault).tolist() == [int(Fault.COVECTOR), 2, 0]
    assert bits(back.params) == bits(state.params) and int(back.count) == 1
    with pytest.raises(ParalensError, match="step 2") as e:
        back.check()
    assert (e.value.kind, e.value.step, e.value.slot) == (Fault.COVECTOR, 2, 0)
    with pytest.raises(ParalensError, match="step 2"):  # and a later step does not hide it
        step(back, X, Y)[1].check()


# == 4. softmax cross-entropy beyond exp's range ====================================================

@pytest.mark.parametrize("dtype,scale", [(np.float32, 100.0), (np.float64, 1000.0)])
def test_softmax_cross_entropy_at_logits_beyond_exps_range(dtype, scale):
    """z = scale · (1, 0.9, 0.95) and label 1: exp(z) overflows, −log softmax(z)_1 does not.
    Oracle: log Σ exp z − z_1 by numpy's logaddexp, in float64."""
    z = (scale * np.array([[1.0, 0.9, 0.95], [0.2, 1.0, 0.5]])).astype(dtype)
    y = np.array([1, 0], np.int32)
    with np.errstate(over="ignore"):
        assert not np.all(np.isfinite(np.exp(z)))  # beyond exp's range in this dtype
    got = batch_loss(softmax_cross_entropy(classes=3), y, "sum").fn(jnp.asarray(z))
    want = sum(np.logaddexp.reduce(row.astype(np.float64)) - row.astype(np.float64)[t]
               for row, t in zip(z, y))
    assert np.isfinite(got) and got.dtype == dtype
    np.testing.assert_allclose(float(got), want, rtol=1e-6)
    # and its derivative, softmax(z) − onehot(y), by numpy in float64
    d = jax.grad(batch_loss(softmax_cross_entropy(classes=3), y, "sum").fn)(jnp.asarray(z))
    zz = z.astype(np.float64)
    pi = np.exp(zz - np.logaddexp.reduce(zz, axis=1, keepdims=True))
    np.testing.assert_allclose(np.asarray(d), pi - np.eye(3)[y], atol=1e-6)
