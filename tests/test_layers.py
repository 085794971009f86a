"""Layers, losses and their descriptions: convolution and pooling against second
implementations, losses against finite differences, initial points, errors that name things."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from categories import R
from lenses import (Layer, avg_pool, bias, binary_cross_entropy, conv2d, dL, dense, flatten,
                    half_squared_error, linear, max_pool, relu, sigmoid, softmax_cross_entropy, tanh,
                    tie)
from lenses.laws import assert_close
from oracles import conv_by_hand, pool_by_hand

KEY = jax.random.PRNGKey(3)
# Test data from numpy: each new shape drawn by jax.random costs an XLA compilation (seconds).
RNG = np.random.default_rng(11)
X = jnp.asarray(RNG.standard_normal((2, 6, 6)))  # channels first: C × H × W
A = R(2, 6, 6)


def test_repr_of_a_chain():
    assert repr(dense(2, 3) >> relu >> dense(3, 1)) == (
        "dense(2→3) ≫ relu ≫ dense(3→1) : R^2 → R^1, params R^{3×2}×R^3 × R^0 × R^{1×3}×R^1")


def test_relu_is_marked_not_smooth_and_its_derivative_at_zero_is_zero():
    assert relu.smooth is False
    assert relu.at(R(3)).smooth is False
    assert (dense(2, 3) >> relu).smooth is False
    assert tanh.smooth is True and (dense(2, 3) >> tanh).smooth is True
    assert max_pool(2).smooth is False and avg_pool(2).smooth is True
    # a family composed of families is as smooth as its members, before and after `.at`
    assert (relu >> tanh).smooth is False and (tanh >> sigmoid).smooth is True
    assert (relu >> tanh).at(R(3)).smooth is False
    da, _ = relu.at(R(3)).backward(jnp.array([0.0, 2.0, -2.0]), None, jnp.array([5.0, 5.0, 5.0]))
    assert_close(da, jnp.array([0.0, 5.0, 0.0]), atol=0.0, rtol=0.0, what="relu'(0) = 0")


# -- convolution, pooling, flatten against second implementations ----------------------------

def compare(lens, oracle, x, p, seed):
    """forward vs oracle; backward (a', p') vs jax.grad of ⟨c', oracle⟩ for a random c'."""
    out = oracle(x, p)
    assert_close(lens.forward(x, p), out, 1e-12, 1e-12, f"{lens.name}: forward vs by hand")
    c = jnp.asarray(np.random.default_rng(seed).standard_normal(out.shape))
    ga, gp = jax.grad(lambda x, p: jnp.sum(c * oracle(x, p)), argnums=(0, 1))(x, p)
    da, dp = lens.backward(x, p, c)
    assert_close(da, ga, 1e-12, 1e-12, f"{lens.name}: input covector vs jax.grad by hand")
    assert_close(dp, gp, 1e-12, 1e-12, f"{lens.name}: parameter covector vs jax.grad by hand")


def test_conv2d_against_a_convolution_written_by_hand():
    layer = conv2d(2, 3, 3).at(A)
    assert layer.cod == R(3, 4, 4)
    K = jnp.asarray(RNG.standard_normal((3, 2, 3, 3)))
    compare(layer, lambda x, Kb: conv_by_hand(x, *Kb), X, (K, jnp.array([0.1, -0.2, 0.3])), 1)


def test_pooling_and_flatten_against_reshapes():
    compare(max_pool(2).at(A), lambda x, p: pool_by_hand(x, jnp.max), X, None, 2)
    compare(avg_pool(2).at(A), lambda x, p: pool_by_hand(x, jnp.mean), X, None, 3)
    compare(flatten.at(A), lambda x, p: jnp.reshape(x, (-1,)), X, None, 4)
    assert max_pool(2).at(A).cod == R(2, 3, 3) and flatten.at(A).cod == R(72)


def test_avg_pool_same_counts_the_padded_zeros():
    """SAME pads 6 → 7 (stride 2, window 3: nothing low, one high) with zeros, and every
    window's sum is divided by 9 (flax's count_include_pad=True), padded zeros included."""
    def by_hand(x, p):
        z = jnp.pad(x, ((0, 0), (0, 1), (0, 1)))
        return jnp.stack([jnp.stack([z[:, i:i + 3, j:j + 3].sum((1, 2)) / 9 for j in (0, 2, 4)], -1)
                          for i in (0, 2, 4)], -2)
    compare(avg_pool(3, stride=2, padding="SAME").at(A), by_hand, X, None, 5)


def test_a_small_convolutional_network_against_jax_grad_by_hand():
    net = conv2d(2, 3, 3).at(A) >> relu >> max_pool(2) >> flatten >> dense(12, 2)
    p = ((jnp.asarray(RNG.standard_normal((3, 2, 3, 3))), jnp.array([0.1, 0.0, -0.1])), None, None,
         None, (jnp.asarray(RNG.standard_normal((2, 12))), jnp.array([0.5, -0.5])))

    def by_hand(x, p):
        (K, b), _, _, _, (W, c) = p
        h = pool_by_hand(jnp.where(conv_by_hand(x, K, b) > 0, conv_by_hand(x, K, b), 0.0), jnp.max)
        return W @ jnp.reshape(h, (-1,)) + c

    compare(net, by_hand, X, p, 5)


# -- losses ----------------------------------------------------------------------------------

def central_differences(fn, c, eps=1e-6):
    flat = np.asarray(c, dtype=float).reshape(-1)
    out = []
    for i in range(flat.size):
        e = np.zeros_like(flat)
        e[i] = eps
        out.append((float(fn(jnp.asarray((flat + e).reshape(c.shape))))
                    - float(fn(jnp.asarray((flat - e).reshape(c.shape))))) / (2 * eps))
    return np.asarray(out).reshape(c.shape)


LOSSES = {
    # name: (loss, point, the value by an independent formula)
    "half squared error": (half_squared_error(jnp.array([1.0, -2.0, 0.5])), jnp.array([0.3, 0.1, -1.2]),
                           0.5 * ((0.3 - 1.0) ** 2 + (0.1 + 2.0) ** 2 + (-1.2 - 0.5) ** 2)),
    "cross-entropy, class 2": (softmax_cross_entropy(2, classes=3), jnp.array([0.5, -1.0, 2.0]),
                               -2.0 + np.log(np.exp(0.5) + np.exp(-1.0) + np.exp(2.0))),
    "cross-entropy, probabilities": (softmax_cross_entropy(jnp.array([0.2, 0.8])), jnp.array([1.0, -1.0]),
                                     -(0.2 * (1.0 - np.log(np.e + np.exp(-1.0)))
                                       + 0.8 * (-1.0 - np.log(np.e + np.exp(-1.0))))),
    "binary cross-entropy": (binary_cross_entropy(jnp.array([1.0, 0.0, 0.3])), jnp.array([0.7, -0.4, 2.0]),
                             -(np.log(1 / (1 + np.exp(-0.7))) + np.log(1 - 1 / (1 + np.exp(0.4)))
                               + 0.3 * np.log(1 / (1 + np.exp(-2.0)))
                               + 0.7 * np.log(1 - 1 / (1 + np.exp(-2.0))))),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_losses_and_their_differentials(name):
    loss, c, value = LOSSES[name]
    assert loss.cod == R()
    assert float(loss.fn(c)) == pytest.approx(value, rel=1e-12)
    d = dL(loss, c)
    assert type(d).__name__ == "Covector"
    assert_close(d, central_differences(loss.fn, c), atol=1e-8, rtol=1e-7,
                 what=f"dL of {name} vs central differences")


# -- initial points ------------------------------------------------------------------------------

def test_init_gives_points_of_the_parameter_object_with_documented_shapes():
    W, b = dense(3, 2).init(KEY)
    assert W.shape == (2, 3) and b.shape == (2,)  # a row per neuron
    assert float(jnp.max(jnp.abs(b))) == 0.0
    assert linear(3, 2).init(KEY).shape == (2, 3)
    assert_close(bias(4).init(KEY), jnp.zeros(4), what="bias starts at 0")
    K, kb = conv2d(2, 4, 3).at(A).init(KEY)
    assert K.shape == (4, 2, 3, 3) and kb.shape == (4,)
    chain = dense(3, 2) >> tanh
    p = chain.init(KEY)
    assert p[1] is None and p[0][0].shape == (2, 3) and p[0][1].shape == (2,)
    assert chain.param.contains(p)
    tied = tie(dense(3, 2) @ dense(3, 2), [0, 1])  # (shapes reused: each new one compiles)
    q = tied.init(KEY)
    assert tied.param == R(2, 3) * R(2) and tied.param.contains(q)
    # different keys, different points; the same key, the same point
    assert not np.allclose(dense(3, 2).init(jax.random.PRNGKey(1))[0], W)
    assert np.array_equal(dense(3, 2).init(KEY)[0], W)


# -- errors that name the user's own things ---------------------------------------------------

def test_composition_errors_name_both_lenses_and_spaces():
    with pytest.raises(TypeError) as e:
        dense(2, 3) >> dense(4, 1)
    message = str(e.value)
    for name in ("dense(2→3)", "dense(4→1)", "R^3", "R^4"):
        assert name in message


def test_a_forward_part_of_the_wrong_shape_is_reported_at_construction():
    with pytest.raises(TypeError, match="my_layer.*R\\^3") as e:
        Layer(R(2), R(3), R(0), lambda x, p: x, name="my_layer")
    assert "(2,)" in str(e.value)
    with pytest.raises(TypeError, match="other_layer"):
        Layer(R(2), R(2), R(3), lambda x, p: p @ x, name="other_layer")  # fails on its domain


def test_families_in_parallel_are_a_family_until_fixed():
    both = tanh @ dense(2, 2)
    with pytest.raises(TypeError, match=r"tanh.*\.at\(R\("):
        both.forward((jnp.ones(3), jnp.ones(2)), (None, dense(2, 2).init(jax.random.PRNGKey(0))))
    assert both.at(R(3) * R(2)).dom == R(3) * R(2)
    assert (tanh.at(R(2)) @ sigmoid.at(R(3))).dom == R(2) * R(3)
