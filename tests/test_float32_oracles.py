"""The layer and optimiser oracle tests in float32 too, what users run: the library's
results in the dtype it is given, against an oracle written here (the network written
directly in JAX, or optax) evaluated in float64 from the same (float32-representable)
inputs; tolerances of each width. A bug that only rounding reveals (a value converted to
another width on the way, a key rounded) fails here."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from categories import Covector, Product, R
from lenses import (Tokens, adagrad, adam, avg_pool, batched, conv2d, dense, embedding, gd, gru_cell,
                    layer_norm, max_pool, momentum, rnn_cell)
from oracles import conv_by_hand, elman, gru, pool_by_hand

TOL = {"float32": dict(rtol=2e-4, atol=2e-5), "float64": dict(rtol=1e-9, atol=1e-12)}
#: the widths run here: float64 oracle tests of the same layers and optimisers are in
#: test_layers, test_modern_layers, test_recurrent and test_optimisers (the same oracles,
#: tests/oracles.py); the float64 case is kept for the cheap embedding check (both widths
#: side by side)
WIDTHS = ["float32"]
T, D, N = 3, 4, 2


def _cast(tree, dtype):
    return jax.tree_util.tree_map(lambda a: None if a is None else jnp.asarray(a, dtype), tree)


def _ln(x, g, b):
    mu = jnp.mean(x, -1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, -1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + 1e-5) * g[None, :] + b[None, :]


CASES = {
    "dense": (lambda: dense(3, 2), lambda x, p: p[0] @ x + p[1], (3,)),
    "layer_norm": (lambda: layer_norm(D).at(R(T, D)), lambda x, p: _ln(x, p[0], p[1]), (T, D)),
    "rnn_cell": (lambda: rnn_cell(2, 3), lambda xh, p: elman(xh[0], xh[1], p), None),
    "gru_cell": (lambda: gru_cell(2, 3), lambda xh, p: gru(xh[0], xh[1], p), None),
    "conv2d": (lambda: conv2d(2, 3, 3).at(R(2, 5, 5)), lambda x, p: conv_by_hand(x, *p), (2, 5, 5)),
    "max_pool": (lambda: max_pool(2).at(R(2, 4, 4)), lambda x, p: pool_by_hand(x, jnp.max), (2, 4, 4)),
    "avg_pool": (lambda: avg_pool(2).at(R(2, 4, 4)), lambda x, p: pool_by_hand(x, jnp.mean), (2, 4, 4)),
}


@pytest.mark.parametrize("dtype", WIDTHS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_layers_batched_forward_and_backward_in_each_width(name, dtype):
    make, direct, shape = CASES[name]
    lens = make()
    rng = np.random.default_rng(0)
    p = _cast(lens.init(jax.random.PRNGKey(1)), dtype)
    p = jax.tree_util.tree_map(lambda a: a + jnp.asarray(0.1 * rng.normal(size=a.shape), dtype), p)
    if shape is None:
        X = (jnp.asarray(rng.normal(size=(N, 2)), dtype), jnp.asarray(rng.normal(size=(N, 3)), dtype))
    else:
        X = jnp.asarray(rng.normal(size=(N,) + shape), dtype)
    out, pull = batched(lens).vjp(X, p)
    C = jnp.asarray(rng.normal(size=out.shape), dtype)
    dX, dp = pull(C)
    # the oracle: the network written here, in float64, at the same (float32) numbers
    X64, p64, C64 = _cast(X, "float64"), _cast(p, "float64"), _cast(C, "float64")
    want, vjp = jax.vjp(lambda X, p: jax.vmap(direct, (0, None))(X, p), X64, p64)
    want_dX, want_dp = vjp(C64)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_allclose(out, want, **TOL[dtype])
    for got, ref in zip(jax.tree_util.tree_leaves((dX.value, dp.value)),
                        jax.tree_util.tree_leaves((want_dX, want_dp))):
        assert got.dtype == np.dtype(dtype)  # kept in the width it was given
        np.testing.assert_allclose(got, ref, **TOL[dtype])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_embedding_in_each_width(dtype):
    lens = embedding(5, 2).at(Tokens(T, 5))
    E = jnp.asarray(np.random.default_rng(2).normal(size=(2, 5)), dtype)
    X = np.array([[0, 4, 2], [1, 1, 3]], np.int32)
    out, pull = batched(lens).vjp(X, E)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, np.transpose(np.asarray(E)[:, X], (1, 2, 0)))
    C = np.ones((2, T, 2), dtype)
    dE = np.zeros((2, 5))
    for i, t in np.ndindex(X.shape):
        dE[:, X[i, t]] += 1.0
    got = pull(C)[1].value
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got, dE, **TOL[dtype])


OPTIMISERS = {"gd": (lambda: gd(0.1), lambda: optax.sgd(0.1)),
              "momentum": (lambda: momentum(0.1, 0.9), lambda: optax.sgd(0.1, momentum=0.9)),
              "adam": (lambda: adam(0.01), lambda: optax.adam(0.01)),
              "adagrad": (lambda: adagrad(0.1), lambda: optax.adagrad(0.1))}


@pytest.mark.parametrize("dtype", WIDTHS)
@pytest.mark.parametrize("name", sorted(OPTIMISERS))
def test_optimisers_in_each_width_follow_optax(name, dtype):
    ours, theirs = (f() for f in OPTIMISERS[name])
    P = Product(R(2, 2), R(2))
    rng = np.random.default_rng(3)
    p = (jnp.asarray(rng.normal(size=(2, 2)), dtype), jnp.asarray(rng.normal(size=2), dtype))
    q = _cast(p, "float64")
    s, st = ours.init(p), theirs.init(q)
    for k in range(3):
        g = (jnp.asarray(rng.normal(size=(2, 2)), dtype), jnp.asarray(rng.normal(size=2), dtype))
        s, p = ours.step(s, p, Covector(g, P))
        u, st = theirs.update(_cast(g, "float64"), st, q)
        q = optax.apply_updates(q, u)
        for a, b in zip(p, q):
            assert a.dtype == np.dtype(dtype)  # the point stays in its width
            np.testing.assert_allclose(a, b, **TOL[dtype])
