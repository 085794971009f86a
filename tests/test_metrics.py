"""Inner products on parameter objects: sharp and flat are mutual inverses, and every metric's
`inner` is symmetric and positive definite (bounded below by its known smallest eigenvalue)."""

from functools import lru_cache, partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from categories import Covector, R, Vector
from lenses import (KFAC, Constant, Context, Diagonal, Euclidean, Fisher, GaussNewton, bias,
                    conv2d, dense, flatten, half_squared_error, softmax_cross_entropy, tanh)
from lenses.inner_products.metrics import ravel, unflatten_like

jax.config.update("jax_enable_x64", True)

MODEL = dense(3, 4) >> tanh >> dense(4, 3)
LOSS = partial(softmax_cross_entropy, classes=3)
N, D = 6, 4 * 3 + 4 + 3 * 4 + 3
TEMPLATE = MODEL.init(jax.random.PRNGKey(0))
DAMPING = 0.1

_rng = np.random.default_rng(0)
_W = jax.tree_util.tree_map(lambda a: jnp.asarray(_rng.uniform(0.2, 5.0, a.shape)), TEMPLATE)
_Q = np.linalg.qr(_rng.normal(size=(D, D)))[0]
_EIG = _rng.uniform(0.5, 5.0, D)
_G = jnp.asarray((_Q * _EIG) @ _Q.T)

# name -> (metric, smallest eigenvalue of the metric: g(u, u) ≥ floor ‖u‖²)
METRICS = {
    "euclidean": (Euclidean(), 1.0),
    "diagonal": (Diagonal(_W), float(min(jnp.min(w) for w in jax.tree_util.tree_leaves(_W)))),
    "constant": (Constant(_G, space=MODEL.param), float(_EIG.min())),
    # Damped Gram matrices: positive semi-definite plus λ I.
    "fisher": (Fisher(damping=DAMPING), DAMPING),
    "gauss_newton": (GaussNewton(damping=DAMPING), DAMPING),
    "kfac": (KFAC(damping=DAMPING), DAMPING),
}


@lru_cache(maxsize=None)
def laws(name):
    """One compiled function (data traced) giving everything the laws compare."""
    metric, _ = METRICS[name]

    def run(p, u, v, c, x, y):
        ctx = Context(MODEL, LOSS, x, y)
        U, V = Vector(u, MODEL.param), Vector(v, MODEL.param)
        back = metric.sharp(p, metric.flat(p, U, ctx), ctx)
        forth = metric.flat(p, metric.sharp(p, Covector(c, MODEL.param), ctx), ctx)
        assert isinstance(back, Vector) and isinstance(forth, Covector)
        return (ravel(back.value), ravel(forth.value), metric.inner(p, U, V, ctx),
                metric.inner(p, V, U, ctx), metric.inner(p, U, U, ctx), metric.inner(p, V, V, ctx))

    return jax.jit(run)


def _tree(rng, scale=1.0):
    return jax.tree_util.tree_map(lambda a: jnp.asarray(scale * rng.normal(size=a.shape)), TEMPLATE)


@pytest.mark.parametrize("name", list(METRICS))
@settings(max_examples=100)
@given(seed=st.integers(0, 2**32 - 1), log_scale=st.floats(-3.0, 3.0))
def test_sharp_and_flat_are_mutual_inverses_and_inner_is_an_inner_product(name, seed, log_scale):
    rng = np.random.default_rng(seed)
    scale = 10.0 ** log_scale
    p = _tree(rng)
    u, v, c = _tree(rng, scale), _tree(rng, scale), _tree(rng, scale)
    x = jnp.asarray(rng.normal(size=(N, 3)))
    y = jnp.asarray(rng.integers(0, 3, N))
    back, forth, guv, gvu, guu, gvv = laws(name)(p, u, v, c, x, y)
    fu, fc = ravel(u), ravel(c)
    assert jnp.linalg.norm(back - fu) <= 1e-8 * jnp.linalg.norm(fu)
    assert jnp.linalg.norm(forth - fc) <= 1e-8 * jnp.linalg.norm(fc)
    # Symmetric, to rounding on the scale of |g(u, v)| ≤ ‖u‖_g ‖v‖_g.
    assert abs(guv - gvu) <= 1e-10 * float(jnp.sqrt(guu * gvv))
    # Positive definite: g(u, u) ≥ λ_min ‖u‖² > 0 for u ≠ 0.
    floor = METRICS[name][1]
    assert guu > 0
    assert guu >= (1 - 1e-9) * floor * float(fu @ fu)


def test_constant_sharp_solves_its_matrix():
    rng = np.random.default_rng(1)
    c = _tree(rng)
    x = Constant(_G, space=MODEL.param).sharp(TEMPLATE, Covector(c)).value
    expect = np.linalg.solve(np.asarray(_G), np.asarray(ravel(c)))
    np.testing.assert_allclose(ravel(x), expect, rtol=1e-10, atol=1e-12)


def test_ravel_and_unflatten_like_are_inverse():
    rng = np.random.default_rng(2)
    t = _tree(rng)
    back = unflatten_like(ravel(t), t)
    assert ravel(back).shape == (D,) and back[1] is None
    np.testing.assert_array_equal(ravel(back), ravel(t))


def test_data_dependent_metrics_need_the_data():
    for metric in (Fisher(), GaussNewton(), KFAC()):
        with pytest.raises(TypeError, match="Context"):
            metric.flat(TEMPLATE, Vector(TEMPLATE), None)
    with pytest.raises(ValueError, match="reduction"):
        GaussNewton().flat(TEMPLATE, Vector(TEMPLATE),
                           Context(MODEL, LOSS, jnp.zeros((N, 3)), jnp.zeros(N, int), "median"))


def test_fisher_refuses_a_loss_without_a_predictive_distribution():
    def custom(y):  # a loss family Fisher cannot identify with a distribution
        return half_squared_error(y)

    ctx = Context(MODEL, custom, jnp.zeros((N, 3)), jnp.zeros((N, 3)))
    with pytest.raises(TypeError, match="predictive distribution"):
        Fisher().flat(TEMPLATE, Vector(TEMPLATE), ctx)


def test_kfac_names_a_layer_it_cannot_factor():
    model = conv2d(1, 2, 2).at(R(1, 3, 3)) >> flatten >> dense(8, 2)
    p = model.param.zeros()
    ctx = Context(model, half_squared_error, jnp.zeros((2, 1, 3, 3)), jnp.zeros((2, 2)))
    with pytest.raises(TypeError, match="conv2d"):
        KFAC().sharp(p, Covector(p), ctx)


def test_kfac_fallback_gives_other_layers_the_identity_block():
    model = dense(3, 2) >> bias(2)
    p = ((jnp.asarray([[1.0, -2.0, 0.5], [0.3, 0.1, 2.0]]), jnp.zeros(2)), jnp.asarray([0.5, -1.0]))
    sharp = jax.jit(lambda p, x, y: KFAC(damping=0.1, fallback="euclidean").sharp(
        p, Covector(p), Context(model, half_squared_error, x, y)).value)
    out = sharp(p, jnp.ones((4, 3)), jnp.zeros((4, 2)))
    np.testing.assert_array_equal(out[1], p[1])  # the bias slot: identity
    assert not np.allclose(ravel(out[0]), ravel(p[0]))  # the dense slot: its Kronecker block


def test_an_undamped_singular_metric_refuses_to_sharpen():
    # Zero inputs: the weights of dense(3, 2) do not move the output, so G has zero rows.
    model = dense(3, 2)
    p = (jnp.ones((2, 3)), jnp.zeros(2))
    ctx = Context(model, half_squared_error, jnp.zeros((4, 3)), jnp.ones((4, 2)))
    with pytest.raises(ValueError, match="positive definite"):
        GaussNewton(damping=0.0).sharp(p, Covector(p), ctx)
    out = GaussNewton(damping=1.0).sharp(p, Covector(p), ctx).value  # damping repairs it
    np.testing.assert_allclose(out[0], jnp.ones((2, 3)))  # the W block is λ I = I
    np.testing.assert_allclose(out[1], jnp.zeros(2))


def test_metrics_does_not_import_natural():
    """The constant metrics are the base that natural.py builds on, not the other way round."""
    import ast
    import lenses.inner_products.metrics

    tree = ast.parse(open(lenses.inner_products.metrics.__file__, encoding="utf-8").read())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not any(m and m.split(".")[-1] == "natural" for m in imported)
