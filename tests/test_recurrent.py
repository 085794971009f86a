"""Recurrence: `unroll(cell)` against a recurrent network written by hand with `lax.scan`.

Oracles: the Elman and GRU recurrences written here (the GRU in PyTorch's gate equations,
gate by gate), scanned with `lax.scan` and differentiated by `jax.vjp`; for the tying, the
same scan with a separate copy of the parameters at every step (one slot per time step),
whose covectors summed over time must give the tied slot's covector.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

from categories import R
from lenses import (Tied, batched, checkpoint, diagram, expression, gru_cell, positionwise_dense,
                    rnn_cell, unroll, uses)
from lenses.laws import assert_close
from oracles import elman, gru

TOL = dict(atol=1e-9, rtol=1e-9)


def normal(seed, shape):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape))


CELLS = {"rnn": (rnn_cell, elman), "gru": (gru_cell, gru)}


def scanned(step, n_h):
    """The recurrence over a sequence, by hand: h_0 = 0, h_t = step(x_t, h_{t−1}, p)."""
    def run(xs, p):
        def body(h, x):
            h = step(x, h, p)
            return h, h
        return lax.scan(body, jnp.zeros((n_h,), xs.dtype), xs)[1]
    return run


def per_step(step, n_h):
    """The same scan with its own parameters at every time step (stacked, one slot per step)."""
    def run(xs, ps):
        def body(h, xp):
            h = step(xp[0], h, xp[1])
            return h, h
        return lax.scan(body, jnp.zeros((n_h,), xs.dtype), (xs, ps))[1]
    return run


def compiled_vjp(fn):
    """(xs, p, c) ↦ (fn(xs, p), the covectors of c by jax.vjp), compiled whole: one
    compilation per shape, where op by op every operation of the scan would compile."""
    def run(xs, p, c):
        y, pull = jax.vjp(fn, xs, p)
        return y, pull(c)
    return jax.jit(run)


def perturbed(cell, seed):
    p = cell.init(jax.random.PRNGKey(seed))
    return jax.tree_util.tree_map(lambda a: a + 0.3 * normal(seed + 1, a.shape), p)


@pytest.mark.parametrize("kind", sorted(CELLS))  # each cell every run; the draws: shape, seed
@settings(max_examples=2, deadline=None)
@given(shape=st.sampled_from([(1, 2, 3), (5, 3, 4)]), seed=st.integers(0, 2 ** 10))
def test_unrolled_cell_equals_a_hand_written_scan_in_values_and_gradients(kind, shape, seed):
    T, n_in, n_h = shape
    make, step = CELLS[kind]
    cell = make(n_in, n_h)
    lens = unroll(cell).at(R(T, n_in))
    assert lens.cod == R(T, n_h) and lens.param == cell.param
    q = perturbed(cell, seed)
    xs, c = normal(seed + 2, (T, n_in)), normal(seed + 3, (T, n_h))
    y0, (dx0, dq0) = compiled_vjp(scanned(step, n_h))(xs, q, c)
    # the lens compiled whole too (its eager traversal is checked below, at one shape)
    assert_close(jax.jit(lens.forward)(xs, q), y0, what=f"unroll({kind}): values", **TOL)
    dx, dq = jax.jit(lambda xs, q, c: tuple(v.value for v in lens.backward(xs, q, c)))(xs, q, c)
    assert_close(dx, dx0, what=f"unroll({kind}): input covector", **TOL)
    assert_close(dq, dq0, what=f"unroll({kind}): tied parameter covector", **TOL)


def test_the_tied_slot_receives_the_sum_over_time_of_the_untied_slots():
    T, n_in, n_h = 6, 3, 4
    cell = gru_cell(n_in, n_h)
    lens = unroll(cell).at(R(T, n_in))
    q = perturbed(cell, 0)
    xs, c = normal(1, (T, n_in)), normal(2, (T, n_h))
    # untied: the lens under the tie (start ≫ repeat(step, T) ≫ outputs), one slot per step,
    # at the point Δ_T(q)
    untied = lens.lens
    P = lens.r.fn(q)
    d_untied = untied.backward(xs, P, c)[1].value[1][2][0]  # the cell's stacked slot: (T, ...)
    # the oracle: a scan with a separate copy of q at every step
    Qs = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a[None], (T,) + a.shape), q)
    d_steps = compiled_vjp(per_step(gru, n_h))(xs, Qs, c)[1][1]
    assert_close(d_untied, d_steps, what="per-step covectors of the untied repeat", **TOL)
    d_tied = lens.backward(xs, q, c)[1].value
    assert_close(d_tied, jax.tree_util.tree_map(lambda a: jnp.sum(a, axis=0), d_steps),
                 what="tied covector = Σ over time steps", **TOL)
    # every step contributes something (the sum is over T non-zero terms)
    assert all(float(jnp.max(jnp.abs(d_steps[0][t]))) > 1e-8 for t in range(T))


def test_sequences_batched_and_checkpointed_and_the_uses_count_the_steps():
    T, n_in, n_h, B = 4, 2, 3, 5
    cell = rnn_cell(n_in, n_h)
    model = unroll(cell).at(R(T, n_in)) >> positionwise_dense(n_h, 2)
    p = model.init(jax.random.PRNGKey(0))
    X, C = normal(1, (B, T, n_in)), normal(2, (B, T, 2))

    def direct(xs, p):
        q, (V, b) = p
        return scanned(elman, n_h)(xs, q) @ V.T + jnp.broadcast_to(b, (T, 2))

    Y0, pull = jax.vjp(jax.vmap(direct, (0, None)), X, p)
    dX0, dp0 = pull(C)
    for lens in (model, checkpoint(model)):
        Y, (dX, dp) = jax.jit(lambda X, p, C: (batched(lens).forward(X, p),
                                               batched(lens).backward(X, p, C)))(X, p, C)
        assert_close(Y, Y0, what=f"batched {lens.name}", **TOL)
        assert_close(dX.value, dX0, what="batched input covector", **TOL)
        assert_close(dp.value, dp0, what="parameter covectors added over the batch and time", **TOL)
    assert uses(model) == (T, 1)
    assert isinstance(model.parts[0], Tied)


def test_the_unrolled_program_is_one_scan_whatever_the_length():
    cell = rnn_cell(2, 3)
    q = cell.init(jax.random.PRNGKey(0))

    def size(T):
        lens = unroll(cell).at(R(T, 2))
        jaxpr = jax.make_jaxpr(lambda xs, q, c: lens.backward(xs, q, c)[1].value)(
            jnp.ones((T, 2)), q, jnp.ones((T, 3)))
        text = str(jaxpr)
        return text.count("scan["), len(jaxpr.jaxpr.eqns)

    (s4, n4), (s40, n40) = size(4), size(40)
    assert s4 >= 1 and (s4, n4) == (s40, n40)


def test_the_unrolled_lens_is_described_with_its_tie_and_copies():
    lens = unroll(rnn_cell(2, 3)).at(R(4, 2))
    term = expression(lens, types=False)
    assert term.startswith("(h₀ = 0 ≫ repeat(") and term.endswith("≫ outputs)[Δ_4]")
    assert "rnn_cell(2→3)" in term and "(copy ⊗ id)" in term
    text = diagram(lens)
    assert "reparam Δ_4" in text and "repeat ×4" in text
