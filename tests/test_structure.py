"""Copies, sharing and counting: tied weights receive the sum of the covectors of their uses,
copy/add/discard have the backward parts the theory gives them, parameterless chains report
no movement.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from categories import R
from lenses import (add, copy, dense, describe_slope, discard, flatten, identity, largest_slope,
                    relu, residual, sigmoid, softplus, tanh, tie, uses)
from lenses.laws import assert_close

RNG = np.random.default_rng(7)  # test data from numpy: jax.random compiles per new shape


def normal(*shape):
    return jnp.asarray(RNG.standard_normal(shape))


def test_tied_weight_receives_the_sum_against_a_hand_written_tied_network():
    # dense(3→3) ≫ tanh ≫ dense(3→3) ≫ sigmoid ≫ dense(3→2), the two 3→3 layers sharing (W, b)
    chain = dense(3, 3) >> tanh >> dense(3, 3) >> sigmoid >> dense(3, 2)
    tied = tie(chain, [0, 2])
    assert uses(tied) == (2, 0, 0, 1)
    shared = (normal(3, 3), normal(3))
    last = (normal(2, 3), jnp.array([0.1, -0.2]))
    q = (shared, None, None, last)  # Q: the untied slots, the shared one in the first's place
    x, c = jnp.array([0.5, -1.0, 2.0]), jnp.array([1.5, -0.5])

    def by_hand(x, Wb, Vc):  # the tied network written in jnp, W used twice
        (W, b), (V, d) = Wb, Vc
        return V @ jax.nn.sigmoid(W @ jnp.tanh(W @ x + b) + b) + d

    gx, gWb, gVc = jax.grad(lambda x, Wb, Vc: jnp.dot(c, by_hand(x, Wb, Vc)), argnums=(0, 1, 2))(
        x, shared, last)
    assert_close(tied.forward(x, q), by_hand(x, shared, last), what="forward of the tied network")
    dx, dq = tied.backward(x, q, c)
    assert_close(dq.value[0], gWb, what="covector of the shared slot vs jax.grad by hand")
    assert_close(dq.value[3], gVc, what="covector of the last layer")
    assert_close(dx, gx, what="input covector")
    # and it is the SUM of the two uses' covectors in the untied chain at (p, p)
    _, dp = chain.backward(x, (shared, None, shared, None, last), c)
    summed = jax.tree_util.tree_map(lambda u, v: u + v, dp.value[0], dp.value[2])
    assert_close(dq.value[0], summed, what="tied covector vs sum of the untied ones")
    # neither use alone is the gradient (the test would notice a tie that keeps one)
    for one in (dp.value[0], dp.value[2]):
        assert float(jnp.max(jnp.abs(one[0] - gWb[0]))) > 1e-3


def test_the_same_layer_object_twice_gives_two_independent_slots():
    d = dense(2, 2)
    twice = d >> tanh >> d
    assert uses(twice) == (1, 0, 1)
    p0 = (normal(2, 2), normal(2))
    p1 = (p0[0] * 2.0, p0[1] + 1.0)
    x = jnp.array([0.3, -0.4])
    out = twice.forward(x, (p0, None, p1))
    assert_close(out, p1[0] @ jnp.tanh(p0[0] @ x + p0[1]) + p1[1], what="two slots, two points")


def test_uses_counts_slots():
    assert uses(dense(2, 3)) == 1
    assert uses(tanh.at(R(3))) == 0
    assert uses(dense(2, 2) >> relu >> dense(2, 1)) == (1, 0, 1)
    block = residual(dense(2, 2) >> tanh)
    assert uses(block) == (0, ((1, 0), 0), 0)
    three = tie(dense(2, 2) >> tanh >> dense(2, 2) >> softplus >> dense(2, 2), [0, 2, 4])
    assert uses(three) == (3, 0, 0)


def test_three_uses_receive_the_sum_of_three_covectors():
    chain = dense(2, 2) >> tanh >> dense(2, 2) >> tanh >> dense(2, 2)
    tied = tie(chain, [0, 2, 4])
    p = (normal(2, 2), jnp.array([0.1, -0.3]))
    x, c = jnp.array([1.0, -2.0]), jnp.array([0.5, 0.25])
    _, dq = tied.backward(x, (p, None, None), c)
    _, dp = chain.backward(x, (p, None, p, None, p), c)
    total = jax.tree_util.tree_map(lambda a, b, d: a + b + d, dp.value[0], dp.value[2], dp.value[4])
    assert_close(dq.value[0], total, what="three uses: the sum of three covectors")
    # and, independently of the library's backward parts, jax.grad of the network by hand

    def by_hand(Wb):
        W, b = Wb
        return jnp.dot(c, W @ jnp.tanh(W @ jnp.tanh(W @ x + b) + b) + b)

    assert_close(dq.value[0], jax.grad(by_hand)(p), what="three uses vs jax.grad by hand")


def test_copy_add_discard_backward_parts_by_hand():
    A = R(2)
    a = jnp.array([1.0, -1.0])
    da, dp = copy(A).backward(a, None, (jnp.array([1.0, 2.0]), jnp.array([3.0, -5.0])))
    assert_close(da, jnp.array([4.0, -3.0]), what="copy' adds")
    assert dp.value is None
    da, _ = add(A).backward((a, a), None, jnp.array([2.0, 7.0]))
    assert_close(da, (jnp.array([2.0, 7.0]), jnp.array([2.0, 7.0])), what="add' copies")
    da, _ = discard(A).backward(a, None, None)
    assert_close(da, jnp.zeros(2), what="discard' is zero")


def test_residual_backward_is_identity_plus_the_blocks():
    block = dense(2, 2) >> tanh
    res = residual(block)
    p = ((normal(2, 2), normal(2)), None)
    x, c = jnp.array([0.2, -0.9]), jnp.array([1.0, 3.0])
    gx = jax.grad(lambda x: jnp.dot(c, x + jnp.tanh(p[0][0] @ x + p[0][1])))(x)
    da, _ = res.backward(x, (None, (p, None), None), c)
    assert_close(da, gx, what="residual input covector: c' + (block's)")


def test_parameterless_chain_has_none_covectors_and_no_movement():
    chain = tanh.at(R(2, 3)) >> flatten >> relu >> sigmoid >> identity
    assert uses(chain) == (0, 0, 0, 0, 0)
    x = jnp.arange(6.0).reshape(2, 3) / 5 - 0.4
    da, dp = chain.backward(x, (None,) * 5, jnp.ones(6))
    assert dp.value == (None, None, None, None, None)
    assert da.value.shape == (2, 3)
    assert largest_slope(dp) is None
    assert "no movement" in describe_slope(dp)


def test_largest_slope_skips_parameterless_slots():
    chain = tanh.at(R(2)) >> dense(2, 2) >> relu
    x = jnp.array([0.5, -0.5])
    p = (None, (jnp.array([[1.0, -2.0], [0.5, 0.25]]), jnp.array([0.0, 0.1])), None)
    _, dp = chain.backward(x, p, jnp.array([1.0, -3.0]))
    leaves = [jnp.abs(v) for v in jax.tree_util.tree_leaves(dp.value)]
    expected = max(float(jnp.max(v)) for v in leaves)
    assert float(largest_slope(dp)) == pytest.approx(expected)
    assert describe_slope(dp).startswith("largest slope")
    assert "no movement" not in describe_slope(dp)
