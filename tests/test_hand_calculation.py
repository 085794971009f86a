"""One backward pass through a 2-2-1 network, done on paper.

Network: dense(2→2) ≫ relu ≫ dense(2→1), loss L(ŷ) = ½(ŷ − y)². Column convention: dense
computes W x + b with W of shape (n_out, n_in). All numbers are dyadic rationals, so floating
point reproduces the paper calculation exactly and the test compares with no tolerance.

Parameters:   W1 = [[1, 2], [-3, 1]],  b1 = [0, 0.5],  W2 = [[0.5, -1]],  b2 = [1]

Example 1: x = [1, 2], y = 1
  forward   s  = W1 x + b1 = [1·1 + 2·2 + 0, −3·1 + 1·2 + 0.5]       = [5, −0.5]
            h  = relu(s)                                              = [5, 0]
            ŷ  = W2 h + b2 = 0.5·5 + (−1)·0 + 1                        = [3.5]
            L  = ½ (3.5 − 1)² = ½ · 6.25                               = 3.125
  backward  dL/dŷ = ŷ − y                                             = [2.5]
            dW2 = (dL/dŷ) hᵀ = 2.5 · [5, 0]                            = [[12.5, 0]]
            db2 = dL/dŷ                                               = [2.5]
            dh  = W2ᵀ (dL/dŷ) = [0.5·2.5, −1·2.5]                      = [1.25, −2.5]
            ds  = dh ⊙ relu'(s) = [1.25·1, −2.5·0]   (s₂ < 0: unit off) = [1.25, 0]
            dW1 = ds xᵀ = [[1.25·1, 1.25·2], [0·1, 0·2]]               = [[1.25, 2.5], [0, 0]]
            db1 = ds                                                  = [1.25, 0]
            dx  = W1ᵀ ds = [1·1.25 + (−3)·0, 2·1.25 + 1·0]             = [1.25, 2.5]

Example 2: x = [0, 1], y = 0
  forward   s = [0 + 2 + 0, 0 + 1 + 0.5] = [2, 1.5],  h = [2, 1.5]
            ŷ = 0.5·2 + (−1)·1.5 + 1 = [0.5],  L = ½ · 0.25 = 0.125
  backward  dL/dŷ = [0.5];  dW2 = 0.5 · [2, 1.5] = [[1, 0.75]];  db2 = [0.5]
            dh = [0.25, −0.5];  ds = [0.25, −0.5] (both units on)
            dW1 = [[0.25·0, 0.25·1], [−0.5·0, −0.5·1]] = [[0, 0.25], [0, −0.5]];  db1 = [0.25, −0.5]
            dx = [1·0.25 + (−3)(−0.5), 2·0.25 + 1·(−0.5)] = [1.75, 0]

The batch of both (summed loss 3.125 + 0.125 = 3.25): the parameter covectors are ADDED,
  dW1 = [[1.25, 2.75], [0, −0.5]],  db1 = [1.5, −0.5],  dW2 = [[13.5, 0.75]],  db2 = [3.0],
and the input covectors stay per example: dX = [[1.25, 2.5], [1.75, 0]].
"""

import jax.numpy as jnp

from lenses import batch_loss, batched, dL, dense, half_squared_error, relu
from lenses.laws import assert_close

W1, b1 = jnp.array([[1.0, 2.0], [-3.0, 1.0]]), jnp.array([0.0, 0.5])
W2, b2 = jnp.array([[0.5, -1.0]]), jnp.array([1.0])
P = ((W1, b1), None, (W2, b2))


def exactly(x, y, what):
    assert_close(x, y, atol=0.0, rtol=0.0, what=what)


def network():
    return dense(2, 2) >> relu >> dense(2, 1)


def test_forward_values_by_hand():
    model = network()
    first, act, second = model.parts
    x = jnp.array([1.0, 2.0])
    s = first.forward(x, P[0])
    exactly(s, jnp.array([5.0, -0.5]), "s = W1 x + b1")
    h = act.forward(s, None)
    exactly(h, jnp.array([5.0, 0.0]), "h = relu(s)")
    exactly(second.forward(h, P[2]), jnp.array([3.5]), "ŷ = W2 h + b2")
    exactly(model.forward(x, P), jnp.array([3.5]), "ŷ through the composite")
    exactly(half_squared_error(jnp.array([1.0])).fn(jnp.array([3.5])), 3.125, "L")


def test_deltas_layer_by_layer_by_hand():
    first, act, second = network().parts
    x, s, h = jnp.array([1.0, 2.0]), jnp.array([5.0, -0.5]), jnp.array([5.0, 0.0])
    c = dL(half_squared_error(jnp.array([1.0])), jnp.array([3.5]))
    exactly(c, jnp.array([2.5]), "dL/dŷ = ŷ − y")
    dh, dp2 = second.backward(h, P[2], c)
    dW2, db2 = dp2.value
    exactly(dW2, jnp.array([[12.5, 0.0]]), "dW2")
    exactly(db2, jnp.array([2.5]), "db2")
    exactly(dh, jnp.array([1.25, -2.5]), "dh = W2ᵀ dL/dŷ")
    ds, none = act.backward(s, None, dh)
    exactly(ds, jnp.array([1.25, 0.0]), "ds = dh ⊙ relu'(s)")
    assert none.value is None
    dx, dp1 = first.backward(x, P[0], ds)
    dW1, db1 = dp1.value
    exactly(dW1, jnp.array([[1.25, 2.5], [0.0, 0.0]]), "dW1 = ds xᵀ")
    exactly(db1, jnp.array([1.25, 0.0]), "db1 = ds")
    exactly(dx, jnp.array([1.25, 2.5]), "dx = W1ᵀ ds")


def test_whole_backward_pass_by_hand():
    model = network()
    x, y = jnp.array([1.0, 2.0]), jnp.array([1.0])
    dx, dp = model.backward(x, P, dL(half_squared_error(y), model.forward(x, P)))
    exactly(dx, jnp.array([1.25, 2.5]), "dx")
    exactly(dp, ((jnp.array([[1.25, 2.5], [0.0, 0.0]]), jnp.array([1.25, 0.0])), None,
                 (jnp.array([[12.5, 0.0]]), jnp.array([2.5]))), "(dW1, db1), None, (dW2, db2)")


def test_second_example_by_hand():
    model = network()
    x, y = jnp.array([0.0, 1.0]), jnp.array([0.0])
    exactly(model.forward(x, P), jnp.array([0.5]), "ŷ")
    dx, dp = model.backward(x, P, dL(half_squared_error(y), model.forward(x, P)))
    exactly(dx, jnp.array([1.75, 0.0]), "dx")
    exactly(dp, ((jnp.array([[0.0, 0.25], [0.0, -0.5]]), jnp.array([0.25, -0.5])), None,
                 (jnp.array([[1.0, 0.75]]), jnp.array([0.5]))), "parameter covectors")


def test_batch_of_both_adds_the_parameter_covectors_by_hand():
    model = network()
    X, Y = jnp.array([[1.0, 2.0], [0.0, 1.0]]), jnp.array([[1.0], [0.0]])
    total = batch_loss(half_squared_error, Y, reduction="sum")
    out = batched(model).forward(X, P)
    exactly(out, jnp.array([[3.5], [0.5]]), "ŷ per example")
    exactly(total.fn(out), 3.25, "summed loss")
    dX, dp = batched(model).backward(X, P, dL(total, out))
    exactly(dX, jnp.array([[1.25, 2.5], [1.75, 0.0]]), "dX, per example")
    exactly(dp, ((jnp.array([[1.25, 2.75], [0.0, -0.5]]), jnp.array([1.5, -0.5])), None,
                 (jnp.array([[13.5, 0.75]]), jnp.array([3.0]))), "parameter covectors, added")
