"""`lstm_cell` unrolled by `unroll` against an LSTM written here from the standard equations.

Oracles: the LSTM recurrence gate by gate (PyTorch's equations: i, f, g, o from W x + U h + b,
c_t = f ⊙ c_{t−1} + i ⊙ g, h_t = o ⊙ tanh(c_t)), run as a Python loop over time and
differentiated whole by `jax.grad`; for the tying, the same loop with its own copy of the
parameters at every step, whose covectors summed over time must give the tied slot's.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from categories import R
from lenses import lstm_cell, unroll, uses
from lenses.laws import assert_close


def sigmoid(z):
    return 1.0 / (1.0 + jnp.exp(-z))


def lstm_by_hand(xs, params_per_step, n_h):
    """h_1..h_T and c_1..c_T by the standard equations, one parameter triple per step."""
    h, c, hs, cs = jnp.zeros(n_h, xs.dtype), jnp.zeros(n_h, xs.dtype), [], []
    for x, (W, U, b) in zip(xs, params_per_step):
        Wi, Wf, Wg, Wo = jnp.split(W, 4)
        Ui, Uf, Ug, Uo = jnp.split(U, 4)
        bi, bf, bg, bo = jnp.split(b, 4)
        i = sigmoid(Wi @ x + Ui @ h + bi)
        f = sigmoid(Wf @ x + Uf @ h + bf)
        g = jnp.tanh(Wg @ x + Ug @ h + bg)
        o = sigmoid(Wo @ x + Uo @ h + bo)
        c = f * c + i * g
        h = o * jnp.tanh(c)
        hs.append(h)
        cs.append(c)
    return jnp.stack(hs), jnp.stack(cs)


def data(T, n_in, n_h, dtype, seed=0):
    rng = np.random.default_rng(seed)
    q = tuple(jnp.asarray(0.5 * rng.standard_normal(s), dtype)
              for s in ((4 * n_h, n_in), (4 * n_h, n_h), (4 * n_h,)))
    xs = jnp.asarray(rng.standard_normal((T, n_in)), dtype)
    cov = jnp.asarray(rng.standard_normal((T, 2, n_h)), dtype)  # a covector on the outputs
    return q, xs, cov


_COMPILED = {}


def unrolled(T, n_in, n_h):
    """The unrolled LSTM and its compiled (values, input covector, parameter covector), made
    once per shape for the tests of this file (a compilation costs seconds, a call nothing)."""
    if (T, n_in, n_h) not in _COMPILED:
        lens = unroll(lstm_cell(n_in, n_h)).at(R(T, n_in))
        run = jax.jit(lambda xs, q, cov: (lens.forward(xs, q),)
                      + tuple(c.value for c in lens.backward(xs, q, cov)))
        _COMPILED[T, n_in, n_h] = lens, run
    return _COMPILED[T, n_in, n_h]


@pytest.mark.parametrize("dtype, tol", [(jnp.float64, 1e-9), (jnp.float32, 2e-5)])
def test_unrolled_lstm_equals_the_standard_equations_in_values_and_covectors(dtype, tol):
    T, n_in, n_h = 5, 3, 4
    lens, run = unrolled(T, n_in, n_h)
    assert lens.cod == R(T, 2, n_h) and lens.param == lstm_cell(n_in, n_h).param and uses(lens) == T
    q, xs, cov = data(T, n_in, n_h, dtype)

    def score(xs, q):  # the covector's pairing with the outputs: its gradient is the pullback
        hs, cs = lstm_by_hand(xs, [q] * T, n_h)
        return jnp.sum(hs * cov[:, 0]) + jnp.sum(cs * cov[:, 1]), (hs, cs)

    # compiled: one program instead of hundreds of small dispatches
    (dx0, dq0), (hs, cs) = jax.jit(jax.grad(score, argnums=(0, 1), has_aux=True))(xs, q)
    out, dx, dq = run(xs, q, cov)
    assert out.dtype == dtype
    assert_close(out[:, 0], hs, what="h_t", atol=tol, rtol=tol)
    assert_close(out[:, 1], cs, what="c_t", atol=tol, rtol=tol)
    assert_close(dx, dx0, what="input covector", atol=tol, rtol=tol)
    assert_close(dq, dq0, what="tied parameter covector", atol=tol, rtol=tol)


def test_the_tied_slot_of_the_lstm_receives_the_sum_over_time_steps():
    T, n_in, n_h = 5, 3, 4  # the shape of the test above: its compiled lens serves
    lens, run = unrolled(T, n_in, n_h)
    q, xs, cov = data(T, n_in, n_h, jnp.float64, seed=1)

    def score(per_step):  # one parameter triple per time step: untied
        hs, cs = lstm_by_hand(xs, per_step, n_h)
        return jnp.sum(hs * cov[:, 0]) + jnp.sum(cs * cov[:, 1])

    per_step = jax.jit(jax.grad(score))([q] * T)
    assert all(float(jnp.max(jnp.abs(d[0]))) > 1e-6 for d in per_step)  # each step contributes
    summed = tuple(sum(d[k] for d in per_step) for k in range(3))
    tied = run(xs, q, cov)[2]
    assert_close(tied, summed, what="tied = Σ_t untied",
                 atol=1e-9, rtol=1e-9)


def test_the_forget_gate_starts_open_and_bad_sequences_are_refused():
    cell = lstm_cell(2, 3)
    W, U, b = cell.init(jax.random.PRNGKey(0))
    assert W.shape == (12, 2) and U.shape == (12, 3)
    assert np.allclose(b[3:6], 1.0) and np.allclose(b[:3], 0.0) and np.allclose(b[6:], 0.0)
    with pytest.raises(TypeError, match="needs sequences"):
        unroll(cell).at(R(4, 5))
