"""Refused steps: NaN/inf, leaving the open parameter object, None for a parameterised slot.

Each refused step raises a clear error and leaves the parameters and the optimiser state
bit for bit as they were; backtracking halves the move until the point is back in the set
(checked against a hand calculation).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from categories import Covector, DomainError, Positive, R, draws
from lenses import (NonFiniteError, Layer, adam, dense, gd, half_squared_error, momentum,
                    tanh, train_step)


def scale_layer():
    """x ↦ s·x with a variance-like parameter s ∈ Positive(1)."""
    return Layer(R(1), R(1), Positive(1), lambda x, s: s * x, name="scale",
                    init=lambda k: jnp.ones((1,)))


# ½ mean (s·x)² towards the target 0 with x = 1: the covector on s is s itself.
ONES, ZEROS = np.ones((4, 1)), np.zeros((4, 1))


def snapshot(state):
    return jax.tree_util.tree_structure(state), [
        (np.asarray(a).dtype, np.asarray(a).shape, np.asarray(a).tobytes())
        for a in jax.tree_util.tree_leaves(state)]


def refused(step, state, X, Y, error, match):
    """Run a step that must be refused: the fault is raised at the next synchronisation point
    (reading the report), and both the state it returns and the state the error carries hold
    the parameters and optimiser state bit for bit as before."""
    before = snapshot((state.params, state.opt_state))
    new, report = step(state, X, Y)
    with pytest.raises(error, match=match) as e:
        report.check()
    assert snapshot((new.params, new.opt_state)) == before
    assert snapshot(e.value.state) == snapshot(state)
    assert e.value.step == int(state.count) + 1
    return new, e.value


def warm(step, params, X, Y, n=2):
    """A state with a non-trivial optimiser state (a few good steps taken)."""
    state = step.init(params)
    for _ in range(n):
        state, _ = step(state, X, Y)
    return state


MLP = dense(2, 3) >> tanh >> dense(3, 1)
XM = np.asarray(draws.normal(jax.random.PRNGKey(0), (6, 2)))
YM = np.asarray(draws.normal(jax.random.PRNGKey(1), (6, 1)))


def test_nan_covector_is_refused_and_state_kept():
    step = train_step(MLP, half_squared_error, momentum(0.1))
    state = warm(step, MLP.init(jax.random.PRNGKey(2)), XM, YM)
    before = snapshot(state)
    bad = XM.copy()
    bad[3, 1] = np.nan
    new, error = refused(step, state, bad, YM, NonFiniteError, "step 3: .*covector of slot 0 .*dense")
    assert snapshot(state) == before
    assert isinstance(NonFiniteError("x"), FloatingPointError)
    # later steps are no-ops until the fault is seen; the error's state steps again
    later, report = step(new, XM, YM)
    assert snapshot((later.params, later.opt_state)) == snapshot((state.params, state.opt_state))
    with pytest.raises(NonFiniteError, match="step 3"):
        float(report.loss)
    again, report = step(error.state, XM, YM)
    assert int(again.count) == int(state.count) + 1 and float(report.loss) > 0


def test_infinite_new_point_is_refused_and_state_kept():
    step = train_step(MLP, half_squared_error, gd(1e308))
    state = step.init(MLP.init(jax.random.PRNGKey(2)))
    refused(step, state, XM, 100.0 * YM + 50.0, NonFiniteError, "new point")


@pytest.mark.parametrize("make", [lambda: gd(3.0), lambda: momentum(3.0, 0.5),
                                  lambda: adam(3.0)])
def test_leaving_the_open_parameter_object_is_refused(make):
    model = dense(1, 1) >> scale_layer()
    params = ((jnp.ones((1, 1)), jnp.zeros((1,))), jnp.ones((1,)))
    step = train_step(model, half_squared_error, make())
    state = step.init(params)
    _, error = refused(step, state, ONES, ZEROS, DomainError, r"slot 1 \(scale\).*Positive")
    assert "backtrack" in str(error)


def test_backtracking_halves_the_move_until_it_is_inside():
    lens = scale_layer()
    step = train_step(lens, half_squared_error, gd(3.0, on_domain_error="backtrack"))
    state = step.init(jnp.ones((1,)))
    new, report = step(state, ONES, ZEROS)
    # the full move s − 3·s = −2 leaves (0, ∞); halves: −0.5 (out), then 1 − 0.75 = 0.25 (in)
    assert float(report.largest_slope) == pytest.approx(1.0)
    assert float(new.params[0]) == pytest.approx(0.25, abs=1e-15)
    for _ in range(20):
        new, _ = step(new, ONES, ZEROS)
        assert float(new.params[0]) > 0
    assert float(new.params[0]) < 1e-6  # and it kept going towards 0


def test_backtracking_with_state_keeps_positive_in_a_chain():
    model = dense(1, 1) >> scale_layer()
    params = ((jnp.ones((1, 1)), jnp.ones((1,))), jnp.ones((1,)))
    step = train_step(model, half_squared_error, momentum(2.0, 0.9, on_domain_error="backtrack"))
    state = step.init(params)
    for _ in range(15):
        state, _ = step(state, ONES, ZEROS)
        assert float(state.params[1][0]) > 0


def test_backtracking_is_bounded_then_refuses():
    step = train_step(scale_layer(), half_squared_error,
                      gd(3.0, on_domain_error="backtrack", max_halvings=1))
    state = step.init(jnp.ones((1,)))
    refused(step, state, ONES, ZEROS, DomainError, "1 halvings")


def test_none_for_a_parameterised_slot_is_refused():
    step = train_step(MLP, half_squared_error, adam(0.1))
    state = warm(step, MLP.init(jax.random.PRNGKey(3)), XM, YM)
    before = snapshot(state)
    broken = state._replace(params=(None, None, state.params[2]))
    with pytest.raises(TypeError, match=r"slot 0 \(dense\(2→3\)\).*None"):
        step(broken, XM, YM)
    assert snapshot(state) == before
    with pytest.raises(TypeError, match=r"slot 2 \(dense\(3→1\)\)"):
        step.init((MLP.init(jax.random.PRNGKey(3))[0], None, None))
    with pytest.raises(TypeError, match=r"\[1\].*None"):  # a None inside a slot: the bias
        step.init(((jnp.ones((3, 2)), None), None, MLP.init(jax.random.PRNGKey(3))[2]))


def test_none_is_fine_for_parameterless_slots():
    step = train_step(MLP, half_squared_error, adam(0.1))
    p = MLP.init(jax.random.PRNGKey(3))
    assert p[1] is None
    state, _ = step(step.init(p), XM, YM)
    assert state.params[1] is None


def test_eager_update_refuses_the_same_faults():
    u = gd(3.0)
    cov = Covector(jnp.ones((1,)), Positive(1))
    with pytest.raises(DomainError, match="Positive"):
        u(jnp.ones((1,)), cov)
    back = gd(3.0, on_domain_error="backtrack")
    assert float(back(jnp.ones((1,)), cov)[0]) == pytest.approx(0.25)
    with pytest.raises(NonFiniteError):
        u(jnp.ones((1,)), Covector(jnp.asarray([np.inf]), Positive(1)))
    with pytest.raises(TypeError, match="None"):
        gd(0.1).step(gd(0.1).init(None), None, Covector(None, R(2)))
