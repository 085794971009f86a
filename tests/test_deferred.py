"""Deferred, verified dispatch of `train_step`: a loop runs as few dispatches of the plain
step as its reads allow, verified afterwards, and gives the bits of the checked step taken
one step at a time; a fault is found, replayed checked, and named as if checked all along.

Oracle: the checked step (`step.step_fn` under `jax.jit`) called once per batch, each state
computed before the next call, written here in the test.
"""

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from categories import ShapeError
from lenses import (NonFiniteError, TargetError, TrainState, adam, dense, gd,
                    half_squared_error, momentum, softmax_cross_entropy, tanh, train_step)

MODEL = dense(3, 5) >> tanh >> dense(5, 2)
P0 = MODEL.init(jax.random.PRNGKey(0))
N = 78  # the first step alone (a new signature), a full queue (64), then 8 scanned, 5 alone
XS = np.asarray(jax.random.normal(jax.random.PRNGKey(1), (N, 4, 3)))
YS = np.asarray(jax.random.normal(jax.random.PRNGKey(2), (N, 4, 2)))
CPU = jax.default_backend() == "cpu"  # where XLA compiles the scanned step to the same bits


def bits(tree):
    return [(np.asarray(a).dtype, np.asarray(a).shape, np.asarray(a).tobytes())
            for a in jax.tree_util.tree_leaves(tree)]


def checked(opt, n, XS=XS, YS=YS, family=half_squared_error, model=MODEL, p0=P0):
    """The oracle: the checked step, one dispatch and one computed state per batch."""
    step = train_step(model, family, opt)
    one = jax.jit(step.step_fn)
    state, losses = step.init(p0), []
    for x, y in zip(XS[:n], YS[:n]):
        state, (loss, _) = one(state, jnp.asarray(x), jnp.asarray(y))
        losses.append(float(loss))
    return state, losses


def scanned(step):
    """The lengths of the plain chunks compiled for `step` (longer than one step)."""
    return sorted(k for k, checked, _ in step._chunks if k > 1 and not checked)


def same(a, b):
    if CPU:
        assert bits(a) == bits(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("make", [lambda: momentum(0.05, 0.9), lambda: adam(0.01)])
def test_a_loop_that_reads_at_the_end_is_the_checked_step_taken_one_at_a_time(make):
    ref, ref_losses = checked(make(), N)
    step = train_step(MODEL, half_squared_error, make())
    state, reports = step.init(P0), []
    for x, y in zip(XS, YS):
        state, report = step(state, jnp.asarray(x), jnp.asarray(y))
        reports.append(report)
    assert state._value is None  # the last steps wait until something asks for them
    assert scanned(step) == [64]  # a full queue ran as one plain chunk
    same(state, ref)
    got = [float(r.loss) for r in reports]
    assert got == ref_losses if CPU else np.allclose(got, ref_losses, rtol=1e-6)
    assert scanned(step) == [8, 64]  # the 13 left: 8 scanned, 5 alone


def test_a_loop_that_reads_every_report_is_the_checked_step_too():
    ref, ref_losses = checked(momentum(0.05, 0.9), 20)
    step = train_step(MODEL, half_squared_error, momentum(0.05, 0.9))
    state, got = step.init(P0), []
    for x, y in zip(XS[:20], YS[:20]):
        state, report = step(state, x, y)
        got.append(float(report.loss))
    same(state, ref)
    assert got == ref_losses if CPU else np.allclose(got, ref_losses, rtol=1e-6)
    assert scanned(step) == []  # one step read at a time: nothing to scan


def test_the_first_call_of_a_signature_is_dispatched_and_errors_surface_at_the_call():
    step = train_step(MODEL, half_squared_error, gd(0.1))
    state = step.init(P0)
    state, _ = step(state, XS[0], YS[0])
    assert state._later.run is not None  # a new signature: dispatched, so its errors raise here
    state, _ = step(state, XS[1], YS[1])
    assert state._later.run is None  # seen before: queued
    with pytest.raises(ShapeError, match=r"shape \(n, \*\(3,\)\)"):
        step(state, XS[2][:, :2], YS[2])
    state, report = step(state, XS[2], YS[2])  # the queue is intact and steps on
    ref, ref_losses = checked(gd(0.1), 3)
    same(state, ref)
    assert float(report.loss) == pytest.approx(ref_losses[-1], rel=1e-6)


@pytest.mark.parametrize("where", [39, 70])  # in the full chunk; among the single steps
def test_a_fault_in_a_deferred_run_is_named_and_the_state_before_it_kept(where):
    bad = XS.copy()
    bad[where, 2, 1] = np.nan
    ref, ref_losses = checked(momentum(0.05, 0.9), where)
    step = train_step(MODEL, half_squared_error, momentum(0.05, 0.9))
    state, reports = step.init(P0), []
    for x, y in zip(bad, YS):
        state, report = step(state, jnp.asarray(x), jnp.asarray(y))
        reports.append(report)
    got = [float(r.loss) for r in reports[:where]]  # the steps before it are as they were
    assert got == ref_losses if CPU else np.allclose(got, ref_losses, rtol=1e-6)
    for r in (reports[where], reports[where + 3], reports[-1]):
        with pytest.raises(NonFiniteError, match=f"step {where + 1}: the covector of slot 0") as e:
            r.check()
        assert e.value.step == where + 1
        same(e.value.state, ref)
    # every later step was a no-op: the state is the one before the fault, the fault recorded
    same((state.params, state.opt_state, state.count), (ref.params, ref.opt_state, ref.count))
    with pytest.raises(NonFiniteError, match=f"step {where + 1}"):
        state.check()


def test_a_refused_target_in_a_deferred_run_is_named():
    model = dense(3, 4) >> tanh >> dense(4, 3)
    p0 = model.init(jax.random.PRNGKey(3))
    labels = np.asarray(jax.random.randint(jax.random.PRNGKey(4), (30, 4), 0, 3), np.int32)
    labels[17, 1] = 3  # out of range for 3 classes, in batch 18
    family = softmax_cross_entropy(classes=3)
    step = train_step(model, family, gd(0.1))
    state, reports = step.init(p0), []
    for x, y in zip(XS[:30], labels):
        state, report = step(state, x, y)
        reports.append(report)
    with pytest.raises(TargetError, match="step 18: the target of example 1") as e:
        reports[25].check()
    ref, _ = checked(gd(0.1), 17, YS=labels, family=family, model=model, p0=p0)
    same(e.value.state, ref)


def test_an_unread_fault_makes_later_deferred_steps_no_ops():
    step = train_step(MODEL, half_squared_error, gd(0.1))
    bad = XS[3].copy()
    bad[0, 0] = np.inf
    state = step.init(P0)
    for x, y in zip(XS[:3], YS[:3]):
        state, _ = step(state, x, y)
    state, _ = step(state, bad, YS[3])
    before = state
    for x, y in zip(XS[4:30], YS[4:30]):  # queued and run plain, from a state with a fault
        state, _ = step(state, x, y)
    same((state.params, state.count), (before.params, before.count))
    with pytest.raises(NonFiniteError, match="step 4"):
        state.check()


def test_a_numpy_batch_refilled_in_place_is_read_as_it_was_at_the_call():
    step = train_step(MODEL, half_squared_error, gd(0.1))
    state, buf_x, buf_y = step.init(P0), np.empty_like(XS[0]), np.empty_like(YS[0])
    for x, y in zip(XS[:20], YS[:20]):
        buf_x[...], buf_y[...] = x, y  # one buffer, refilled for every step
        state, _ = step(state, buf_x, buf_y)
    buf_x[...] = np.nan
    ref, _ = checked(gd(0.1), 20)
    same(state, ref)


def test_intermediate_states_are_computed_when_asked_for_and_can_be_stepped_from():
    step = train_step(MODEL, half_squared_error, gd(0.1))
    states = [step.init(P0)]
    for x, y in zip(XS[:40], YS[:40]):
        states.append(step(states[-1], x, y)[0])
    ref10, _ = checked(gd(0.1), 10)
    branch, _ = step(states[10], XS[50], YS[50])  # from a state in the middle of a queue
    same(states[10], ref10)
    oracle = jax.jit(step.step_fn)(ref10, jnp.asarray(XS[50]), jnp.asarray(YS[50]))[0]
    same(branch, oracle)
    ref40, _ = checked(gd(0.1), 40)
    same(states[40], ref40)
    same(states[25], checked(gd(0.1), 25)[0])  # in the middle of a run already verified


def test_deferred_states_of_two_steps_interleave_in_order():
    fast, slow = (train_step(MODEL, half_squared_error, gd(r)) for r in (0.1, 0.01))
    state = ref = fast.init(P0)
    ones = {fast: jax.jit(fast.step_fn), slow: jax.jit(slow.step_fn)}
    for i in range(30):
        step = fast if i % 3 else slow
        state, _ = step(state, XS[i], YS[i])
        ref = ones[step](ref, jnp.asarray(XS[i]), jnp.asarray(YS[i]))[0]
    same(state, ref)


def test_reports_kept_unread_do_not_keep_the_batches():
    step = train_step(MODEL, half_squared_error, gd(0.1))
    state, reports, batches = step.init(P0), [], []
    for x, y in zip(XS, YS):
        x, y = jnp.asarray(x), jnp.asarray(y)
        batches.append(weakref.ref(x))
        state, report = step(state, x, y)
        reports.append(report)
    del x, y, report
    state.count  # runs and verifies what is queued
    gc.collect()
    assert sum(r() is not None for r in batches) == 0
    assert len({float(r.loss) for r in reports}) > 1  # and the reports still answer


def test_batches_too_large_to_stack_are_dispatched_as_they_are_called():
    step = train_step(MODEL, half_squared_error, gd(0.1))
    step.CHUNK_BYTES = 8 * (XS[0].nbytes + YS[0].nbytes) - 1  # a chunk of 8 would not fit
    states = [step.init(P0)]
    for x, y in zip(XS[:30], YS[:30]):
        states.append(step(states[-1], x, y)[0])
        assert states[-1]._later.run is not None
    assert scanned(step) == []
    # states in between were not kept while unverified: stepping from one, and asking for
    # one, computes it again
    branch, _ = step(states[26], XS[40], YS[40])
    ref26 = checked(gd(0.1), 26)[0]
    same(branch, jax.jit(step.step_fn)(ref26, jnp.asarray(XS[40]), jnp.asarray(YS[40]))[0])
    same(states[30], checked(gd(0.1), 30)[0])
    same(states[27], checked(gd(0.1), 27)[0])


def test_a_state_is_a_pytree_and_unpacks_whether_or_not_it_has_run():
    step = train_step(MODEL, half_squared_error, gd(0.1))
    state = step.init(P0)
    for x, y in zip(XS[:3], YS[:3]):
        state, _ = step(state, x, y)
    pending = state._value is None
    _, _, count, fault = state  # computes it
    assert pending and int(count) == 3 and int(fault[0]) == 0
    again = jax.tree_util.tree_map(lambda a: a, state)
    assert isinstance(again, TrainState) and bits(again) == bits(state)
    # inside a trace the step runs at once, checked, as part of the traced function
    traced = jax.jit(lambda s, x, y: step(s, x, y)[0])(state, XS[3], YS[3])
    direct, report = step(state, XS[3], YS[3])
    report.check()
    same(traced, direct)
    assert "not yet known" in repr(step(direct, XS[4], YS[4])[0])


def test_reading_a_report_runs_the_queue_once_and_computes_no_state_again():
    step = train_step(MODEL, half_squared_error, gd(0.1))
    launched = []
    launch = step._launch
    step._launch = lambda start, nodes, *rest: launched.append(len(nodes)) or launch(
        start, nodes, *rest)
    state, reports = step.init(P0), []
    for x, y in zip(XS[:70], YS[:70]):
        state, report = step(state, x, y)
        reports.append(report)
    assert launched == [1, 64]  # the first call; a full queue, dispatched unverified
    _, ref_losses = checked(gd(0.1), 70)
    assert float(reports[10].loss) == pytest.approx(ref_losses[10], rel=1e-6)
    assert float(reports[67].loss) == pytest.approx(ref_losses[67], rel=1e-6)
    assert launched == [1, 64, 1, 1, 1]  # verified, not run again; the queue up to step 68
    assert [float(r.loss) for r in reports] == pytest.approx(ref_losses, rel=1e-6)
    state.count
    assert sum(launched) == 70  # nothing was run twice


def test_a_refusal_found_while_later_steps_are_in_flight_replays_them_too():
    # Batches dispatched as they are called, at most two runs unverified: the run with the
    # bad target is verified while the next one, computed from the point it should not have
    # reached (finite, so nothing else would notice), is in flight.
    model = dense(3, 4) >> tanh >> dense(4, 3)
    p0 = model.init(jax.random.PRNGKey(3))
    labels = np.asarray(jax.random.randint(jax.random.PRNGKey(4), (30, 4), 0, 3), np.int32)
    labels[5, 2] = 7
    family = softmax_cross_entropy(classes=3)
    step = train_step(model, family, gd(0.1))
    step.CHUNK_BYTES, step.UNVERIFIED_BYTES = 1, 1
    state, reports = step.init(p0), []
    for x, y in zip(XS[:12], labels[:12]):
        state, report = step(state, x, y)
        reports.append(report)
    ref, ref_losses = checked(gd(0.1), 5, YS=labels, family=family, model=model, p0=p0)
    same((state.params, state.count), (ref.params, ref.count))
    assert [float(r.loss) for r in reports[:5]] == pytest.approx(ref_losses, rel=1e-6)
    for r in reports[5:]:
        with pytest.raises(TargetError, match="step 6: the target of example 2"):
            r.check()
