"""A hyperparameter is a number of the optimiser pytree, traced by the compiled step: sweeps over
learning rates or dampings, and an equal optimiser built afresh, compile the step once.

Compilations are counted by JAX's own compile events (`jax.monitoring`, the backend-compile
event, which names the function compiled: the step's loops are `jit(paralens_step_*)`), not
by the library's counters. Each model here has widths no other test uses, so that the first
run of each test compiles its step (the counter is seen to count) whatever ran before it. The
numbers are checked too: each run's new point against the step written by hand with its own
rate or damping (jax.grad of the composite's mean loss), so a compilation shared by mistake
(a rate baked in as a constant) would show as a wrong point, and a sweep as one compilation.
"""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lenses import (Diagonal, Euclidean, GaussNewton, adam, chain, dense, fit, gd, half_squared_error, momentum,
                    scale_by_adam, scale_by_learning_rate, sharp, tanh, train_step)

COMPILE = "/jax/core/compile/backend_compile_duration"
RATES = (0.01, 0.02, 0.05, 0.1, 0.2)


@contextlib.contextmanager
def step_compiles():
    """The names of the training step's loops JAX compiles inside the block, one per compile."""
    names: list = []

    def listen(event, duration, fun_name="", **kw):
        name = str(fun_name).removeprefix("jit(").removesuffix(")")  # "jit(paralens_step_call)"
        if event == COMPILE and name.startswith("paralens_step"):
            names.append(name)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield names
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


def problem(n_in, n_hidden, n_out, dtype, n=16, seed=0):
    """A network of these widths, its initial point and a batch, in `dtype`."""
    model = dense(n_in, n_hidden) >> tanh >> dense(n_hidden, n_out)
    cast = lambda a: jnp.asarray(a, dtype)  # noqa: E731
    p0 = jax.tree_util.tree_map(cast, model.init(jax.random.PRNGKey(seed)))
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, n_in)).astype(dtype)
    Y = rng.standard_normal((n, n_out)).astype(dtype)
    return model, p0, X, Y


def loss_grad(model, p, X, Y):
    """jax.grad of the whole composite's mean loss ½‖f(x) − y‖²: the oracle's covector."""
    def loss(q):
        z = jax.vmap(lambda x: model.forward(x, q))(X)
        return jnp.mean(0.5 * jnp.sum((z - Y) ** 2, axis=-1))
    return jax.grad(loss)(p)


def close(got, want, dtype):
    tol = dict(rtol=2e-5, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-12)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), **tol)


DTYPES = [np.float32, np.float64]


@pytest.mark.parametrize("dtype", DTYPES)
def test_five_learning_rates_through_train_step_compile_the_step_once(dtype):
    model, p0, X, Y = problem(3, 13, 2, dtype)
    g = loss_grad(model, p0, X, Y)
    with step_compiles() as names:
        for lr in RATES:  # a fresh optimiser and a fresh step each time, as a sweep is written
            step = train_step(model, half_squared_error, gd(lr))
            state, _ = step(step.init(p0), X, Y)
            close(state.params, jax.tree_util.tree_map(lambda p, d: p - lr * d, p0, g), dtype)
    assert names == ["paralens_step_call"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_five_learning_rates_through_fit_compile_the_step_once(dtype):
    model, p0, X, Y = problem(3, 14, 2, dtype)
    g = loss_grad(model, p0, X, Y)
    with step_compiles() as names:
        for lr in RATES:  # one epoch of one batch: the step of gd(lr) from p0
            state, _ = fit(model, half_squared_error, gd(lr), p0, (X, Y), epochs=1,
                           batch_size=len(X), key=0, progress=False)
            close(state.params, jax.tree_util.tree_map(lambda p, d: p - lr * d, p0, g), dtype)
    assert len(names) == 1, names


def test_an_equal_optimiser_built_afresh_compiles_nothing_and_another_structure_compiles():
    model, p0, X, Y = problem(3, 15, 2, np.float32)
    with step_compiles() as names:
        first = train_step(model, half_squared_error, adam(0.1, b1=0.8))
        a, _ = first(first.init(p0), X, Y)
        again = train_step(model, half_squared_error, adam(0.1, b1=0.8))  # rebuilt from scratch
        b, _ = again(again.init(p0), X, Y)
        assert len(names) == 1
        other = train_step(model, half_squared_error, momentum(0.1))  # another structure
        other(other.init(p0), X, Y)
    assert len(names) == 2
    assert all(np.array_equal(x, y) for x, y in zip(jax.tree_util.tree_leaves(a),
                                                     jax.tree_util.tree_leaves(b)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_sweep_of_a_diagonals_weights_compiles_the_step_once(dtype):
    model, p0, X, Y = problem(3, 16, 2, dtype)
    g = loss_grad(model, p0, X, Y)
    with step_compiles() as names:
        for w in (0.5, 1.0, 2.0, 4.0, 8.0):
            step = train_step(model, half_squared_error, gd(0.1, metric=Diagonal(w)))
            state, _ = step(step.init(p0), X, Y)
            close(state.params, jax.tree_util.tree_map(lambda p, d: p - 0.1 * d / w, p0, g), dtype)
    assert names == ["paralens_step_call"]


def gauss_newton_step(model, p, X, Y, lr, damping):
    """p − lr (J̄ᵀJ̄ / n + λ I)⁻¹ g by hand, J̄ the Jacobian of the stacked outputs in ravel(p)."""
    flat, unravel = jax.flatten_util.ravel_pytree(p)
    out = lambda th: jax.vmap(lambda x: model.forward(x, unravel(th)))(X).ravel()  # noqa: E731
    J = jax.jacobian(out)(flat)
    G = J.T @ J / len(X) + damping * jnp.eye(flat.size, dtype=flat.dtype)
    g, _ = jax.flatten_util.ravel_pytree(loss_grad(model, p, X, Y))
    return unravel(flat - lr * jnp.linalg.solve(G, g))


def test_a_damping_sweep_of_gauss_newton_compiles_the_step_once():
    import jax.flatten_util  # noqa: F401  (ravel_pytree)

    dtype = np.float64  # a solve of a damped Gram matrix: compared in float64
    model, p0, X, Y = problem(2, 5, 1, dtype, n=8)
    with step_compiles() as names:
        for lam in (1e-2, 1e-1, 1.0):
            step = train_step(model, half_squared_error, gd(0.5, metric=GaussNewton(lam)))
            state, _ = step(step.init(p0), X, Y)
            close(state.params, gauss_newton_step(model, p0, X, Y, 0.5, lam), dtype)
    assert names == ["paralens_step_call"]


def test_an_optimiser_is_an_immutable_pytree_whose_leaves_are_its_numbers():
    import dataclasses

    opt = adam(0.1, b1=0.8, metric=Diagonal(2.0))
    # sharp's metric, Adam's b1, b2, eps, the rate: in chain order
    assert jax.tree_util.tree_leaves(opt) == [2.0, 0.8, 0.999, 1e-8, 0.1]
    halved = jax.tree_util.tree_map(lambda x: x / 2, opt)  # rebuilt from its leaves
    assert halved == adam(0.05, b1=0.4, b2=0.4995, eps=5e-9, metric=Diagonal(1.0))
    assert opt == adam(0.1, b1=0.8, metric=Diagonal(2.0)) and hash(opt) == hash(
        adam(0.1, b1=0.8, metric=Diagonal(2.0)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        opt.parts[-1].lr = 0.2  # type: ignore[misc]
    # what ARCHITECTURE.md writes adam(0.1) as: equal with the name, another structure without
    parts = (sharp(Euclidean()), scale_by_adam(0.9, 0.999, 1e-8), scale_by_learning_rate(0.1))
    assert adam(0.1) == chain(*parts, name="adam")
    assert adam(0.1) != chain(*parts) and jax.tree_util.tree_leaves(chain(*parts)) == [0.9, 0.999, 1e-8, 0.1]
