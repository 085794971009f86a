"""Discrete inputs stay discrete: token ids and PRNG keys keep their integer dtype through
the combinators, `batched`, `checkpoint`, `tie` and the training step (read inside the
step, at trace time); their covectors are JAX's float0; out-of-range and non-integer tokens
are refused on the batched path as on the per-example path. And dropout in float32 trains
with the mask of its forward pass (a float32-rounded key would be another key)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from categories import R
from lenses import (DomainError, Keys, Layer, Tokens, batched, checkpoint, dense, dropout,
                    embedding, gd, half_squared_error, tie, train_step)

T, V, D = 3, 5, 2


def _recorder(seen):
    """The identity of Tokens(T, V) × Keys that records the dtypes it is given when run."""
    def fwd(xk, p):
        seen.append((xk[0].dtype, xk[1].dtype))
        return xk

    # check=False: the construction's shape probe would be recorded too (with floats)
    return Layer(Tokens(T, V) * Keys(), Tokens(T, V) * Keys(), R(0), fwd, name="recorder",
                 check=False)


def _mixer():
    """(tokens, key) ↦ dropout(embedding(tokens)) flattened: a real use of both."""
    def fwd(xk, E):
        x, k = xk
        rows = jnp.take(E, jnp.round(x).astype(jnp.int32), axis=1).T  # (T, D)
        keep = jax.random.bernoulli(k.astype(jnp.uint32), 0.5, rows.shape)
        return jnp.where(keep, 2.0 * rows, 0.0).reshape(-1)

    return Layer(Tokens(T, V) * Keys(), R(T * D), R(D, V), fwd, name="mixer", check=False)


def _batch(n=4, dtype=np.int32):
    tokens = np.arange(n * T).reshape(n, T).astype(dtype) % V
    keys = np.stack([np.asarray(jax.random.PRNGKey(i)) for i in range(n)])
    return tokens, keys


def test_a_token_and_a_key_keep_their_dtype_inside_a_training_step():
    # through a chain, `tie` (two recorders sharing their slot), `checkpoint` and the step
    seen = []
    model = (tie(_recorder(seen) >> _recorder(seen), [0, 1])
             >> checkpoint(_recorder(seen) >> _mixer()) >> dense(T * D, 1))
    step = train_step(model, half_squared_error, gd(0.1))
    state = step.init(model.init(jax.random.PRNGKey(0)))
    seen.clear()
    state, report = step(state, _batch(), np.zeros((4, 1)))
    assert np.isfinite(float(report.loss))
    assert len(seen) >= 3, "the recorders ran inside the step"
    for tok, key in seen:
        assert tok == np.int32 and key == np.uint32, (tok, key)


def test_the_covectors_of_tokens_and_keys_are_float0_batched_and_per_example():
    model = _mixer()
    E = model.init(jax.random.PRNGKey(1))
    X = _batch(2)
    _, pull = batched(model).vjp(X, E)
    dx, dk = pull(np.ones((2, T * D)))[0].value
    assert dx.dtype == jax.dtypes.float0 and dk.dtype == jax.dtypes.float0
    _, pull = model.vjp((X[0][0], X[1][0]), E)
    dx, dk = pull(np.ones(T * D))[0].value
    assert dx.dtype == jax.dtypes.float0 and dk.dtype == jax.dtypes.float0
    # through the recompute rule too
    _, pull = batched(checkpoint(model)).vjp(X, E)
    dx, dk = pull(np.ones((2, T * D)))[0].value
    assert dx.dtype == jax.dtypes.float0 and dk.dtype == jax.dtypes.float0


def test_dropout_in_float32_trains_with_the_mask_of_its_forward_pass():
    with jax.enable_x64(False):  # what users run: float32 the default float type
        _dropout_masks_agree()


def _dropout_masks_agree():
    # the key's words are above 2^24: a float32 copy of them is another key
    key = np.array([[2_000_000_123, 4_000_000_007]], np.uint32)
    assert np.any(key.astype(np.float32).astype(np.uint32) != key)
    x = np.ones((1, 64), np.float32)
    lens = dropout(0.5).at(R(64) * Keys())
    want = np.asarray(jax.random.bernoulli(jnp.asarray(key[0]), 0.5, (64,)))
    out, pull = batched(lens).vjp((x, key), None)
    np.testing.assert_array_equal(np.asarray(out[0]) != 0, want)  # the mask of bernoulli(key)
    np.testing.assert_array_equal(np.asarray(batched(lens).forward((x, key), None)), out)
    dx = np.asarray(pull(np.ones((1, 64), np.float32))[0].value[0])
    np.testing.assert_array_equal(dx[0] != 0, want)  # the backward pass: the same mask


def test_bad_tokens_are_refused_on_the_batched_path_as_per_example():
    lens = embedding(V, D).at(Tokens(T, V))
    E = lens.init(jax.random.PRNGKey(0))
    for bad in (np.array([[0, 1, 7]]), np.array([[0.0, 1.0, 2.5]]), np.array([[0, -1, 2]])):
        with pytest.raises(DomainError, match=r"batched\(embedding\(5→2\)\).*Tokens\(3, V=5\)"):
            batched(lens).forward(bad, E)
        with pytest.raises(DomainError):
            batched(lens).vjp(bad, E)
        with pytest.raises(DomainError):
            lens.forward(bad[0], E)
    # integer tokens and floats of integer value agree, and integer ones stay integer
    ok = np.array([[0, 4, 2]])
    np.testing.assert_array_equal(batched(lens).forward(ok, E),
                                  batched(lens).forward(ok.astype(float), E))
    np.testing.assert_allclose(batched(lens).forward(ok, E)[0], np.asarray(E)[:, [0, 4, 2]].T)
