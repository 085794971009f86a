"""Natural-gradient metrics against independent oracles.

The oracles are plain-jnp networks on a flat parameter vector θ, laid out as the metrics'
`ravel(p)` should be (W_1 row-major, b_1, W_2, b_2, ...), and differentiated by JAX as a
whole: the loss Hessian, the Hessian of the loss of the linearised network (= Gauss–Newton),
and the expectation over the predictive distribution of the outer product of score vectors
(= Fisher)."""

from functools import lru_cache, partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from hypothesis import assume, given, settings, strategies as st

from categories import Covector, R, Smooth
from lenses import (KFAC, Context, Euclidean, Fisher, GaussNewton, Layer,
                    binary_cross_entropy, dense, half_squared_error, identity,
                    softmax_cross_entropy, tanh)
from lenses.inner_products.metrics import ravel

jax.config.update("jax_enable_x64", True)


# -- plain oracles -------------------------------------------------------------------------------

def plain_net(sizes, act=jnp.tanh):
    """θ, x ↦ the network dense(sizes[0]→sizes[1]) ≫ act ≫ ... on the flat vector θ."""
    def net(theta, x):
        a, i = x, 0
        for layer, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            W = jnp.reshape(theta[i:i + n_in * n_out], (n_out, n_in))
            b = theta[i + n_in * n_out:i + n_in * n_out + n_out]
            i += n_in * n_out + n_out
            a = W @ a + b
            if layer < len(sizes) - 2:
                a = act(a)
        return a
    return net


def sq(z, y):
    return 0.5 * jnp.sum((z - y) ** 2)


def ce(z, y):
    return jax.scipy.special.logsumexp(z) - z[y]


def bce(z, y):
    return -jnp.sum(y * jnp.log(jax.nn.sigmoid(z)) + (1 - y) * jnp.log(jax.nn.sigmoid(-z)))


def reduce(terms, reduction):
    return jnp.mean(terms, axis=0) if reduction == "mean" else jnp.sum(terms, axis=0)


@partial(jax.jit, static_argnums=(0, 4, 5))
def loss_hessian(net, theta, X, Y, loss, reduction):
    def total(t):
        return reduce(jax.vmap(lambda x, y: loss(net(t, x), y))(X, Y), reduction)
    return jax.hessian(total)(theta)


@partial(jax.jit, static_argnums=(0, 4, 5))
def gauss_newton_oracle(net, theta0, X, Y, loss, reduction):
    """The Hessian of θ ↦ L(f(θ0) + J(θ − θ0)): exactly Jᵀ H J."""
    def total(theta):
        def one(x, y):
            z0, dz = jax.jvp(lambda t: net(t, x), (theta0,), (theta - theta0,))
            return loss(z0 + dz, y)
        return reduce(jax.vmap(one)(X, Y), reduction)
    return jax.hessian(total)(theta0)


@partial(jax.jit, static_argnums=(0, 3, 4))
def fisher_oracle(net, theta, X, log_p, reduction):
    """s Σ_i Σ_y p(y | x_i) ∇_θ log p(y | x_i) ∇_θ log p(y | x_i)ᵀ, y over every outcome."""
    def one(x):
        S = jax.jacrev(lambda t: log_p(net(t, x)))(theta)  # (outcomes, d): score vectors
        pi = jnp.exp(log_p(net(theta, x)))
        return (S * pi[:, None]).T @ S
    return reduce(jax.vmap(one)(X), reduction)


def categorical_log_p(z):
    return jax.nn.log_softmax(z)


def bernoulli_log_p(z):
    ys = jnp.asarray([[a, b] for a in (0.0, 1.0) for b in (0.0, 1.0)])  # every y ∈ {0,1}²
    return jax.vmap(lambda y: -bce(z, y))(ys)


def data(seed, n, n_in):
    rng = np.random.default_rng(seed)
    return rng, jnp.asarray(rng.normal(size=(n, n_in)))


def params(model, rng, scale=0.7):
    """A random point of the model's parameter object (numpy draws: no per-shape compiling)."""
    return jax.tree_util.tree_map(lambda a: jnp.asarray(scale * rng.normal(size=a.shape)),
                                  model.param.zeros())


def flat(tree):
    """The test's own flattening: leaves in order, each row-major (W_1, b_1, W_2, b_2, ...)."""
    return np.concatenate([np.ravel(a) for a in jax.tree_util.tree_leaves(tree)] + [np.zeros(0)])


# -- invariance under reparameterisation ---------------------------------------------------------

K = 3 * 3 + 3 + 3 * 3 + 3  # a 3 → 3 → 3 tanh network on a flat parameter vector R^K
NET = plain_net((3, 3, 3))
BASE = Layer(R(3), R(3), R(K), lambda x, theta: NET(theta, x), name="mlp")
N_INV = 40  # 40 examples × 3 outputs > K parameters: the metrics have full rank
# (not softmax cross-entropy: adding one number to every logit leaves the categorical
# distribution unchanged, so its Fisher is singular along those directions of W_2 and b_2)

INVARIANCE_CASES = {
    "fisher": (Fisher(damping=0.0), binary_cross_entropy),
    "gauss_newton": (GaussNewton(damping=0.0), half_squared_error),
}


@lru_cache(maxsize=None)
def both_sides(name):
    metric, loss = INVARIANCE_CASES[name]

    def run(B, q, g, x, y):
        # p = B q; the model reparameterised along q ↦ B q receives the covector Bᵀ g.
        model_q = BASE.reparam(Smooth(R(K), R(K), lambda q: B @ q, "B"))
        sharp_q = metric.sharp(q, Covector(B.T @ g), Context(model_q, loss, x, y)).value
        ctx_p = Context(BASE, loss, x, y)
        sharp_p = metric.sharp(B @ q, Covector(g), ctx_p).value
        return B @ sharp_q, sharp_p, jnp.linalg.cond(metric.matrix(B @ q, ctx_p))

    return jax.jit(run)


def invertible(rng, orthogonal=False):
    U = np.linalg.qr(rng.normal(size=(K, K)))[0]
    V = np.linalg.qr(rng.normal(size=(K, K)))[0]
    if orthogonal:
        return jnp.asarray(U @ V.T)
    # Every singular value far from 1 (in [0.3, 0.7] or [1.5, 2.5]): B Bᵀ − I is invertible.
    s = np.where(rng.random(K) < 0.5, rng.uniform(0.3, 0.7, K), rng.uniform(1.5, 2.5, K))
    return jnp.asarray((U * s) @ V.T)


@pytest.mark.parametrize("name", list(INVARIANCE_CASES))
@settings(max_examples=50)
@given(seed=st.integers(0, 2**32 - 1))
def test_natural_gradient_is_invariant_under_linear_reparameterisation(name, seed):
    rng, x = data(seed, N_INV, 3)
    y = (jnp.asarray(rng.integers(0, 2, (N_INV, 3)).astype(float)) if name == "fisher"
         else jnp.asarray(rng.normal(size=(N_INV, 3))))
    B, p, g = invertible(rng), rng.normal(size=K), jnp.asarray(rng.normal(size=K))
    q = jnp.asarray(np.linalg.solve(np.asarray(B), p))
    lhs, rhs, cond = both_sides(name)(B, q, g, x, y)
    # Both sides are computed to cond(G) × rounding; a random tanh network is now and then
    # nearly degenerate (a unit whose outgoing weights almost vanish), which is not the claim.
    assume(cond < 1e6)
    assert jnp.linalg.norm(lhs - rhs) <= 1e-8 * jnp.linalg.norm(rhs)


@settings(max_examples=100)
@given(seed=st.integers(0, 2**32 - 1))
def test_euclidean_gradient_is_invariant_only_under_orthogonal_maps(seed):
    rng = np.random.default_rng(seed)
    g, q = jnp.asarray(rng.normal(size=K)), jnp.asarray(rng.normal(size=K))
    for B, holds in ((invertible(rng), False), (invertible(rng, orthogonal=True), True)):
        lhs = B @ Euclidean().sharp(q, Covector(B.T @ g)).value
        rhs = Euclidean().sharp(B @ q, Covector(g)).value
        gap = float(jnp.linalg.norm(lhs - rhs) / jnp.linalg.norm(rhs))
        # ‖(B Bᵀ − I) g‖ ≥ min_i |s_i² − 1| ‖g‖ ≥ 0.51 ‖g‖ for the non-orthogonal B.
        assert gap <= 1e-12 if holds else gap >= 0.5


# -- Fisher ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("k, family, loss, reduction", [
    (1, binary_cross_entropy, bce, "mean"),
    (4, partial(softmax_cross_entropy, classes=4), ce, "sum"),
])
def test_fisher_is_the_loss_hessian_for_logistic_regression(k, family, loss, reduction):
    model = dense(3, k)
    rng, x = data(1, 20, 3)
    y = (jnp.asarray(rng.integers(0, 2, (20, 1)).astype(float)) if k == 1
         else jnp.asarray(rng.integers(0, k, 20)))
    p = params(model, rng)
    F = Fisher(damping=0.0).matrix(p, Context(model, family, x, y, reduction))
    H = loss_hessian(plain_net((3, k)), flat(p), x, y, loss, reduction)
    assert F.shape == (4 * k, 4 * k)
    np.testing.assert_allclose(F, H, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("sizes, family, log_p, targets", [
    ((3, 4, 3), partial(softmax_cross_entropy, classes=3), categorical_log_p, "classes"),
    ((3, 4, 2), binary_cross_entropy, bernoulli_log_p, "bits"),
])
def test_fisher_is_the_expected_outer_product_of_scores(sizes, family, log_p, targets):
    model = dense(sizes[0], sizes[1]) >> tanh >> dense(sizes[1], sizes[2])
    rng, x = data(2, 10, 3)
    y = (jnp.asarray(rng.integers(0, 3, 10)) if targets == "classes"
         else jnp.asarray(rng.integers(0, 2, (10, 2)).astype(float)))
    p = params(model, rng)
    F = Fisher(damping=0.0).matrix(p, Context(model, family, x, y))
    expected = fisher_oracle(plain_net(sizes), flat(p), x, log_p, "mean")
    np.testing.assert_allclose(F, expected, rtol=1e-10, atol=1e-12)
    # For a nonlinear network the Fisher is not the loss Hessian: the oracle discriminates.
    loss = ce if targets == "classes" else bce
    H = loss_hessian(plain_net(sizes), flat(p), x, y, loss, "mean")
    assert np.max(np.abs(np.asarray(F) - np.asarray(H))) > 1e-3


def test_empirical_fisher_is_the_mean_outer_product_of_per_example_gradients():
    model = dense(3, 4) >> tanh >> dense(4, 3)
    rng, x = data(3, 10, 3)
    y = jnp.asarray(rng.integers(0, 3, 10))
    p = params(model, rng)
    F = Fisher(damping=0.01, empirical=True).matrix(
        p, Context(model, partial(softmax_cross_entropy, classes=3), x, y))
    net = plain_net((3, 4, 3))
    G = jax.jit(jax.vmap(lambda x, y: jax.grad(lambda t: ce(net(t, x), y))(flat(p))))(x, y)
    np.testing.assert_allclose(F, G.T @ G / 10 + 0.01 * np.eye(G.shape[1]), rtol=1e-10, atol=1e-12)


# -- Gauss–Newton -------------------------------------------------------------------------------

@pytest.mark.parametrize("family, loss, reduction", [
    (half_squared_error, sq, "mean"),
    (partial(softmax_cross_entropy, classes=3), ce, "sum"),
])
def test_gauss_newton_is_the_hessian_of_the_linearised_loss(family, loss, reduction):
    model = dense(3, 4) >> tanh >> dense(4, 3)
    rng, x = data(4, 10, 3)
    y = jnp.asarray(rng.normal(size=(10, 3)) if loss is sq else rng.integers(0, 3, 10))
    p = params(model, rng)
    G = GaussNewton(damping=0.0).matrix(p, Context(model, family, x, y, reduction))
    expected = gauss_newton_oracle(plain_net((3, 4, 3)), flat(p), x, y, loss, reduction)
    np.testing.assert_allclose(G, expected, rtol=1e-10, atol=1e-12)


# -- KFAC -----------------------------------------------------------------------------------------

def blocks(model, p, M):
    """The diagonal blocks of M (in ravel(p) coordinates) of the parameterised slots."""
    out, i, M = [], 0, np.asarray(M)
    for slot in p:
        d = flat(slot).size
        if d:
            out.append(M[i:i + d, i:i + d])
        i += d
    return out


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_kfac_is_the_exact_gauss_newton_block_of_a_deep_linear_network(reduction):
    model = dense(3, 4) >> identity >> dense(4, 5) >> dense(5, 2)
    rng, x = data(5, 12, 3)
    y = jnp.asarray(rng.normal(size=(12, 2)))
    p = params(model, rng)
    ctx = Context(model, half_squared_error, x, y, reduction)
    K_ = KFAC(damping=0.0).matrix(p, ctx)
    G = gauss_newton_oracle(plain_net((3, 4, 5, 2), act=lambda a: a), flat(p), x, y, sq, reduction)
    assert K_.shape == G.shape
    # The first layer's input factor is the second moment of (x, 1), by hand.
    xbar = np.concatenate([np.asarray(x), np.ones((12, 1))], axis=1)
    np.testing.assert_allclose(KFAC().factors(p, ctx)[0][0], xbar.T @ xbar / 12, rtol=1e-12)
    for kb, gb in zip(blocks(model, p, K_), blocks(model, p, G), strict=True):
        np.testing.assert_allclose(kb, gb, rtol=1e-8, atol=1e-10)
    # Between layers KFAC is zero, where the Gauss–Newton matrix is not.
    assert np.max(np.abs(np.asarray(G)[:16, 16:])) > 1e-3 and not np.any(np.asarray(K_)[:16, 16:])


def test_kfac_approximates_the_inner_blocks_of_a_nonlinear_network():
    model = dense(3, 4) >> tanh >> dense(4, 2)
    rng, x = data(6, 12, 3)
    y = jnp.asarray(rng.normal(size=(12, 2)))
    p = params(model, rng, scale=1.5)
    K_ = KFAC(damping=0.0).matrix(p, Context(model, half_squared_error, x, y))
    G = gauss_newton_oracle(plain_net((3, 4, 2)), flat(p), x, y, sq, "mean")
    first_k, last_k = blocks(model, p, K_)
    first_g, last_g = blocks(model, p, G)
    # The last layer's output is the network's output (B = I for every example): exact there.
    np.testing.assert_allclose(last_k, last_g, rtol=1e-8, atol=1e-10)
    # Behind a tanh, B_i varies with the example and the Kronecker factorisation is approximate.
    assert np.max(np.abs(first_k - first_g)) > 1e-3


# -- solvers and jit ------------------------------------------------------------------------------

SOLVER_MODEL = dense(3, 4) >> tanh >> dense(4, 3)
SOLVER_LOSS = partial(softmax_cross_entropy, classes=3)


@pytest.mark.parametrize("make", [GaussNewton, Fisher, partial(Fisher, empirical=True)],
                         ids=["gauss_newton", "fisher", "empirical_fisher"])
def test_cg_and_dense_solves_agree(make):
    dense_m = make(damping=1e-3, solver="dense")
    cg_m = make(damping=1e-3, solver="cg", cg_tol=1e-12)

    @jax.jit
    def run(p, c, v, x, y):
        ctx = Context(SOLVER_MODEL, SOLVER_LOSS, x, y)
        return (ravel(dense_m.sharp(p, Covector(c), ctx).value),
                ravel(cg_m.sharp(p, Covector(c), ctx).value),
                ravel(cg_m.flat(p, Covector(v), ctx).value), dense_m.matrix(p, ctx))

    rng, x = data(7, 6, 3)
    y = jnp.asarray(rng.integers(0, 3, 6))
    p = params(SOLVER_MODEL, rng)
    c, v = params(SOLVER_MODEL, rng, 1.0), params(SOLVER_MODEL, rng, 1.0)
    by_dense, by_cg, flat_v, M = run(p, c, v, x, y)
    by_dense, by_cg, flat_v, M = map(np.asarray, (by_dense, by_cg, flat_v, M))
    assert np.linalg.norm(by_cg - by_dense) <= 1e-6 * np.linalg.norm(by_dense)
    np.testing.assert_allclose(M @ by_dense, flat(c), rtol=1e-9, atol=1e-9)
    # The matrix-free product and the dense matrix are two computations of one map.
    np.testing.assert_allclose(flat_v, M @ flat(v), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["gauss_newton", "fisher", "kfac"])
def test_sharp_compiles_with_the_batch_traced(name):
    """Under jit, sharp reads the batch it is given: two batches, one compilation, and each
    answer solves the oracle's matrix for its own batch."""
    lam = 0.05
    if name == "kfac":  # deep linear, where KFAC's blocks are the Gauss–Newton blocks
        model, sizes, act = dense(3, 4) >> dense(4, 2), (3, 4, 2), (lambda a: a)
        metric = KFAC(damping=lam)
    else:
        model, sizes, act = dense(3, 4) >> tanh >> dense(4, 2), (3, 4, 2), jnp.tanh
        metric = (GaussNewton if name == "gauss_newton" else Fisher)(damping=lam)
    traces = []

    def sharp_of(p, c, x, y):
        traces.append(1)  # runs only while jit traces it
        return metric.sharp(p, Covector(c), Context(model, half_squared_error, x, y)).value

    sharp = jax.jit(sharp_of)
    rng = np.random.default_rng(8)
    p, c = params(model, rng), params(model, rng, 1.0)
    answers = []
    for _ in range(2):
        x, y = jnp.asarray(rng.normal(size=(7, 3))), jnp.asarray(rng.normal(size=(7, 2)))
        G = np.asarray(gauss_newton_oracle(plain_net(sizes, act), flat(p), x, y, sq, "mean"))
        if name == "kfac":
            G = scipy.linalg.block_diag(*blocks(model, p, G))
        out = sharp(p, c, x, y)
        assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(p)
        expected = np.linalg.solve(G + lam * np.eye(G.shape[0]), flat(c))
        np.testing.assert_allclose(flat(out), expected, rtol=1e-9, atol=1e-11)
        answers.append(flat(out))
    assert not np.allclose(answers[0], answers[1])
    assert len(traces) == 1  # the second batch reused the first one's compilation

