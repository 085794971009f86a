"""Models written in Equinox and Flax NNX, and plain functions, as parameterised lenses.

Oracles: the frameworks' own gradients (`eqx.filter_grad`, `nnx.grad`) and their own optax
training loops (`optax.sgd` applied by `eqx.apply_updates` / `nnx.Optimizer`); for KFAC, the
same network built from `dense` (whose affine slots KFAC already factors); `jax.grad` for a
plain function.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from categories import R
from lenses import (KFAC, Context, KindError, SpaceMismatch, batched, dense, fit, from_equinox,
                    from_flax, from_function, gd, half_squared_error, tanh, to_equinox, to_flax)
from lenses.laws import assert_close
from lenses.inner_products.metrics import ravel, unflatten_like

eqx = pytest.importorskip("equinox")
nnx = pytest.importorskip("flax.nnx")

TOL = dict(atol=1e-9, rtol=1e-9)


def data(n=12, seed=0, dtype=jnp.float64):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.standard_normal((n, 3)), dtype),
            jnp.asarray(rng.standard_normal((n, 2)), dtype))


def eqx_mlp(dtype=jnp.float64):
    return eqx.nn.MLP(3, 2, 5, 1, activation=jnp.tanh, key=jax.random.PRNGKey(0), dtype=dtype)


class FlaxMLP(nnx.Module):
    def __init__(self, rngs, dtype=jnp.float64):
        self.l1 = nnx.Linear(3, 5, rngs=rngs, param_dtype=dtype)
        self.l2 = nnx.Linear(5, 2, rngs=rngs, param_dtype=dtype)

    def __call__(self, x):
        return self.l2(jnp.tanh(self.l1(x)))


def dense_twin():
    return dense(3, 5) >> tanh >> dense(5, 2)


@pytest.mark.parametrize("dtype, tol", [(jnp.float64, 1e-9), (jnp.float32, 1e-5)])
def test_equinox_covectors_equal_filter_grad(dtype, tol):
    module = eqx_mlp(dtype)
    lens = from_equinox(module, R(3))
    X, C = data(dtype=dtype)
    p = lens.init(None)
    dX, dp = batched(lens).backward(X, p, C)
    grads = eqx.filter_grad(lambda m: jnp.sum(C * jax.vmap(m)(X)))(module)
    assert_close(dp.value, lens.point(grads), what="parameter covector", atol=tol, rtol=tol)
    dX0 = jax.grad(lambda X: jnp.sum(C * jax.vmap(module)(X)))(X)
    assert_close(dX.value, dX0, what="input covector", atol=tol, rtol=tol)
    assert [s.structure.bias for s in lens.sites()] == [True, True]


def test_flax_covectors_equal_nnx_grad():
    module = FlaxMLP(nnx.Rngs(0))
    lens = from_flax(module, R(3))
    X, C = data()
    p = lens.init(None)
    assert p[0][0].shape == (3, 5)  # Flax's kernel, as Flax keeps it: (n_in, n_out)
    _, dp = batched(lens).backward(X, p, C)
    grads = nnx.grad(lambda m: jnp.sum(C * m(X)))(module)
    assert_close(dp.value, lens.point(grads), what="parameter covector", **TOL)


def kfac_of(model, p, g, X, Y, matrix):
    ctx = Context(model, half_squared_error, X, Y, "mean")
    metric = KFAC(damping=1e-2)
    return metric.sharp(p, g, ctx).value, metric.matrix(p, ctx) if matrix else None


def test_kfac_finds_the_linear_layers_of_both_frameworks_as_it_finds_dense():
    X, Y = data()
    twin = dense_twin()
    rng = np.random.default_rng(3)
    for lens, transposed in ((from_equinox(eqx_mlp(), R(3)), False),
                             (from_flax(FlaxMLP(nnx.Rngs(1)), R(3)), True)):
        p = lens.init(None)
        flip = (lambda W: W.T) if transposed else (lambda W: W)
        q = ((flip(p[0][0]), p[0][1]), None, (flip(p[1][0]), p[1][1]))  # the same network
        g = jax.tree_util.tree_map(lambda a: jnp.asarray(rng.standard_normal(a.shape)), p)
        gq = ((flip(g[0][0]), g[0][1]), None, (flip(g[1][0]), g[1][1]))
        s, M = kfac_of(lens, p, g, X, Y, matrix=transposed)
        s0, M0 = kfac_of(twin, q, gq, X, Y, matrix=transposed)
        assert_close(((flip(s[0][0]), s[0][1]), None, (flip(s[1][0]), s[1][1])), s0,
                     what=f"KFAC sharp, {lens.name}", **TOL)
        if transposed:  # the matrix in ravel(p) coordinates: the twin's, its coordinates permuted
            idx = unflatten_like(jnp.arange(M0.shape[0]), q)
            perm = ravel(((flip(idx[0][0]), idx[0][1]), (flip(idx[2][0]), idx[2][1])))
            assert_close(M, M0[perm][:, perm], what=f"KFAC matrix, {lens.name}", **TOL)
        assert not np.allclose(s[0][0], g[0][0])  # not the identity: the factors were used


def sgd_by_equinox(module, Wb, X, Y, lr, steps):
    """The framework's own loop: eqx.filter_grad, optax.sgd, eqx.apply_updates."""
    tx = optax.sgd(lr)
    model = (module, Wb)
    state = tx.init(eqx.filter(model, eqx.is_inexact_array))

    def loss(model):
        m, (W, b) = model
        Z = jax.vmap(m)(X) @ W.T + b[None, :]
        return jnp.mean(0.5 * jnp.sum((Z - Y) ** 2, axis=1))

    for _ in range(steps):
        grads = eqx.filter_grad(loss)(model)
        updates, state = tx.update(grads, state)
        model = eqx.apply_updates(model, updates)
    return model


def test_equinox_model_composed_with_dense_trains_with_fit_as_its_own_optax_loop():
    X, Y = data(n=16, seed=4)
    Y = Y[:, :1]
    module = eqx_mlp()
    lens = from_equinox(module, R(3))
    model = lens >> dense(2, 1)
    p0 = (lens.init(None), (jnp.asarray([[0.3, -0.2]]), jnp.asarray([0.1])))
    state, history = fit(model, half_squared_error, gd(0.1), p0, (X, Y), epochs=6, batch_size=16,
                         key=jax.random.PRNGKey(0))
    assert history[-1]["loss"] < history[0]["loss"]
    ref_module, ref_Wb = sgd_by_equinox(module, p0[1], X, Y, 0.1, 6)
    trained = to_equinox(lens, state.params[0])
    assert_close(lens.point(eqx.filter(trained, eqx.is_inexact_array)),
                 lens.point(eqx.filter(ref_module, eqx.is_inexact_array)),
                 what="trained Equinox parameters", atol=1e-8, rtol=1e-8)
    assert_close(state.params[1], ref_Wb, what="trained dense parameters", atol=1e-8, rtol=1e-8)
    # back in the framework: the module predicts what the lens predicts
    assert_close(jax.vmap(trained)(X), batched(lens).forward(X, state.params[0]),
                 what="predictions of the module given back", **TOL)


def test_flax_model_trains_with_fit_as_with_nnx_optimizer():
    X, Y = data(n=16, seed=5)
    module = FlaxMLP(nnx.Rngs(2))
    lens = from_flax(module, R(3))
    p0 = lens.init(None)
    state, history = fit(lens, half_squared_error, gd(0.1), p0, (X, Y), epochs=5, batch_size=16,
                         key=jax.random.PRNGKey(1))
    assert history[-1]["loss"] < history[0]["loss"]
    opt = nnx.Optimizer(module, optax.sgd(0.1), wrt=nnx.Param)
    for _ in range(5):
        grads = nnx.grad(lambda m: jnp.mean(0.5 * jnp.sum((m(X) - Y) ** 2, axis=1)))(module)
        opt.update(module, grads)
    trained = to_flax(lens, state.params)
    assert_close(lens.point(nnx.state(trained, nnx.Param)), lens.point(nnx.state(module, nnx.Param)),
                 what="trained Flax parameters", atol=1e-8, rtol=1e-8)
    assert_close(trained(X), module(X), what="predictions of the module given back", atol=1e-8,
                 rtol=1e-8)


def test_a_plain_function_is_a_lens_and_bad_input_is_refused():
    def f(params, x):
        return jnp.tanh(params["W"] @ x) * params["s"]

    params = {"W": jnp.arange(6.0).reshape(2, 3) / 6, "s": jnp.asarray([1.5, -0.5])}
    lens = from_function(f, params, R(3))
    assert lens.cod == R(2) and lens.param == R(2, 3) * R(2)
    x, c = jnp.asarray([0.2, -1.0, 0.4]), jnp.asarray([1.0, 2.0])
    p = lens.point(params)
    dx, dp = lens.backward(x, p, c)
    dparams = jax.grad(lambda q: jnp.dot(c, f(q, x)))(params)
    assert_close(dp.value, (dparams["W"], dparams["s"]), what="parameter covector", **TOL)
    assert_close(dx.value, jax.grad(lambda x: jnp.dot(c, f(params, x)))(x), what="input covector", **TOL)
    assert lens.module(p)["s"] is p[1]
    with pytest.raises(KindError, match="leaf 1"):
        from_function(f, {"W": params["W"], "s": "no"}, R(3))
    with pytest.raises(SpaceMismatch, match="f fails on a point of its domain R\\^4"):
        from_function(f, params, R(4))
    with pytest.raises(KindError, match="to_flax needs a lens made by from_flax"):
        to_flax(lens, p)


def test_flax_model_composed_with_dense_trains_with_fit_as_jax_grad_of_the_composite():
    """A Flax NNX model ≫ a library layer, trained by `fit` (full batches): the same points as
    gradient descent on jax.grad of the whole composite written here."""
    X, Y = data(n=16, seed=6)
    Y = Y[:, :1]
    lens = from_flax(FlaxMLP(nnx.Rngs(3)), R(3))
    model = lens >> dense(2, 1)
    p0 = (lens.init(None), (jnp.asarray([[0.2, -0.4]]), jnp.asarray([0.05])))
    state, history = fit(model, half_squared_error, gd(0.1), p0, (X, Y), epochs=5, batch_size=16)
    assert history[-1]["loss"] < history[0]["loss"]

    def loss(p):
        h = jax.vmap(lambda x: lens.forward(x, p[0]))(X)
        z = h @ p[1][0].T + p[1][1][None, :]
        return jnp.mean(0.5 * jnp.sum((z - Y) ** 2, axis=1))

    p = p0
    for _ in range(5):
        p = jax.tree_util.tree_map(lambda a, g: a - 0.1 * g, p, jax.grad(loss)(p))
    assert_close(state.params, p, what="the composite trained by fit", atol=1e-9, rtol=1e-9)
    trained = to_flax(lens, state.params[0])
    assert_close(trained(X), jax.vmap(lambda x: lens.forward(x, state.params[0]))(X),
                 what="predictions of the module given back", **TOL)


def test_a_module_that_draws_or_carries_state_is_refused_saying_what_to_do():
    from lenses import UnsupportedError

    key = jax.random.PRNGKey(0)
    dropping = eqx.nn.Sequential([eqx.nn.Linear(3, 3, key=key), eqx.nn.Dropout(0.5)])
    with pytest.raises(UnsupportedError, match=r"eqx\.nn\.inference_mode\(module\)"):
        from_equinox(dropping, R(3))
    norm, state = eqx.nn.make_with_state(eqx.nn.BatchNorm)(3, "batch")
    with pytest.raises(UnsupportedError, match="StateIndex.*from_function"):
        from_equinox(norm, R(3))
    for layer in (nnx.Dropout(0.5, rngs=nnx.Rngs(1)), nnx.BatchNorm(3, rngs=nnx.Rngs(0))):
        module = nnx.Sequential(nnx.Linear(3, 3, rngs=nnx.Rngs(0)), layer)
        with pytest.raises(UnsupportedError, match=r"module\.eval\(\)"):
            from_flax(module, R(3))

    # what the messages say to do works: the lens computes what the framework computes
    x = jnp.array([0.5, -1.0, 2.0])
    lens = from_equinox(eqx.nn.inference_mode(dropping), R(3))
    np.testing.assert_allclose(lens(x, lens.init(None)), eqx.nn.inference_mode(dropping)(x), **TOL)
    params, static = eqx.partition(eqx.nn.inference_mode(norm), eqx.is_inexact_array)
    lens = from_function(lambda t, a: eqx.combine(t, static)(a, state)[0], params, R(3))
    np.testing.assert_allclose(lens(x, lens.init(None)),
                               eqx.nn.inference_mode(norm)(x, state)[0], **TOL)
    module = nnx.Sequential(nnx.Linear(3, 3, rngs=nnx.Rngs(0)), nnx.Dropout(0.5, rngs=nnx.Rngs(1)),
                            nnx.BatchNorm(3, rngs=nnx.Rngs(0)))
    module.eval()
    lens = from_flax(module, R(3))
    np.testing.assert_allclose(lens(x, lens.init(None)), module(x), **TOL)


def test_the_domain_is_the_input_size_the_module_declares():
    key = jax.random.PRNGKey(0)
    assert from_equinox(eqx.nn.MLP(4, 2, 8, 1, key=key)).dom == R(4)
    assert from_equinox(eqx.nn.Linear(3, 2, key=key)).dom == R(3)
    assert from_equinox(eqx.nn.Linear("scalar", 2, key=key)).dom == R()
    assert from_flax(nnx.Linear(5, 2, rngs=nnx.Rngs(0))).dom == R(5)
    with pytest.raises(KindError, match="does not declare its input size.*R\\(3\\)"):
        from_flax(FlaxMLP(nnx.Rngs(0)))
    with pytest.raises(KindError, match="does not declare its input size"):
        from_equinox(eqx.nn.Sequential([eqx.nn.Lambda(jnp.tanh)]))
