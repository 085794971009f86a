"""K-FAC as published (lenses/kfac.py) against hand formulas.

The oracle is the two-layer network x ↦ W2 tanh(W1 x + b1) + b2 written out in numpy: its
Kronecker factors by hand (A = mean ā āᵀ; G = s Σ Bᵀ F B with B = I for the last layer and
B = W2 diag(1 − a²) for the first; F = diag π − π πᵀ for softmax cross-entropy), and the
damped blocks solved densely as (G ⊗ A + λ I) vec(X) = vec(V) on the row-major vec of
Θ = [W b]. Nothing below is computed by the code under test."""

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest

from categories import Covector
from categories import R
from lenses import (KFAC, Context, HyperparameterError, KindError, dense, fit, from_equinox, gd,
                    kfac_error, softmax_cross_entropy, tanh)

jax.config.update("jax_enable_x64", True)

NET = dense(3, 4) >> tanh >> dense(4, 3)
CE = softmax_cross_entropy(classes=3)
N = 10
KFAC_005 = KFAC(0.05)  # one instance where the tests can share its compiled functions


def batch(seed, n=N, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.normal(size=(n, 3)).astype(dtype)),
            jnp.asarray(rng.integers(0, 3, n)))


def point(seed, dtype=np.float64, scale=0.8):
    rng = np.random.default_rng(seed)
    return ((jnp.asarray((scale * rng.normal(size=(4, 3))).astype(dtype)),
             jnp.asarray((scale * rng.normal(size=4)).astype(dtype))), None,
            (jnp.asarray((scale * rng.normal(size=(3, 4))).astype(dtype)),
             jnp.asarray((scale * rng.normal(size=3)).astype(dtype))))


def oracle_factors(p, x, y, curvature="fisher"):
    """[(A1, G1), (A2, G2)] by hand (mean reduction)."""
    (W1, b1), _, (W2, b2) = [None if q is None else tuple(np.asarray(a, np.float64) for a in q)
                             for q in p]
    x = np.asarray(x, np.float64)
    n = len(x)
    a1 = np.tanh(x @ W1.T + b1)
    z = a1 @ W2.T + b2
    pi = np.exp(z - z.max(1, keepdims=True))
    pi /= pi.sum(1, keepdims=True)
    if curvature == "fisher":
        F = np.stack([np.diag(q) - np.outer(q, q) for q in pi])
    else:  # the empirical Fisher: d dᵀ with d = π − e_y
        d = pi - np.eye(3)[np.asarray(y)]
        F = np.einsum("ia,ib->iab", d, d)
    B1 = np.einsum("ab,ib->iab", W2, 1 - a1 ** 2)  # W2 diag(1 − a1²)
    xb = np.concatenate([x, np.ones((n, 1))], 1)
    ab = np.concatenate([a1, np.ones((n, 1))], 1)
    return [(xb.T @ xb / n, np.einsum("ima,imk,ikb->ab", B1, F, B1) / n),
            (ab.T @ ab / n, F.mean(0))]


def oracle_sharp(factors, g, lam):
    """Per dense layer, X solving (G ⊗ A + λ I) vec(X) = vec([W b]) densely; as (W, b)."""
    out = []
    for (A, G), (gW, gb) in zip(factors, (g[0], g[2])):
        V = np.concatenate([np.asarray(gW, np.float64), np.asarray(gb, np.float64)[:, None]], 1)
        M = np.kron(G, A) + lam * np.eye(A.shape[0] * G.shape[0])
        X = np.linalg.solve(M, V.ravel()).reshape(V.shape)
        out.append((X[:, :-1], X[:, -1]))
    return (out[0], None, out[1])


def close(a, b, rtol, atol):
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(u, np.float64), v, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-9), (np.float32, 2e-4)])
def test_without_averaging_the_batch_factors_give_the_dense_solve(dtype, rtol):
    """Default KFAC() (stateless) solves with the batch's own exact factors (the stateful
    KFAC(model=...) with decay 0 and periods 1: the next test)."""
    lam = 0.05
    p, (x, y) = point(1, dtype), batch(2, dtype=dtype)
    g = point(3, dtype)
    ctx = Context(NET, CE, x, y)
    got = KFAC_005.sharp(p, Covector(g), ctx).value
    close(got, oracle_sharp(oracle_factors(p, x, y), g, lam), rtol, rtol * 1e-2)


def test_the_optimiser_with_the_state_takes_the_dense_natural_step():
    """Two steps of gd(lr, KFAC(λ, model=net)) (decay 0, periods 1, the factors kept in the
    sharp part's state): p ← p − lr (K + λ I)⁻¹ ∇h on each step's own batch, nothing carried
    over; the gradient of the plain network by JAX, the solve dense."""
    lam, lr = 0.1, 0.5

    def h(p, x, y):  # the batch loss of the written-out network
        (W1, b1), _, (W2, b2) = p
        z = jnp.tanh(x @ W1.T + b1[None]) @ W2.T + b2[None]
        return jnp.mean(jax.nn.logsumexp(z, axis=1) - z[jnp.arange(len(y)), y])

    dh = jax.jit(jax.grad(h))
    opt = gd(lr, metric=KFAC(lam, model=NET))
    p = point(6)
    state, q = opt.init(p), p
    for seed in (7, 8):
        x, y = batch(seed)
        grad = dh(q, x, y)
        v = oracle_sharp(oracle_factors(p, x, y), dh(p, x, y), lam)
        p = jax.tree_util.tree_map(lambda a, d: np.asarray(a) - lr * d, p, v)
        state, q = opt.step(state, q, Covector(grad, NET.param), Context(NET, CE, x, y))
        close(q, p, 1e-9, 1e-12)
    kfac = state[0]  # the state of the sharp part, the first of the chain's parts
    assert int(kfac.count) == 2 and int(kfac.updates) == 2


def test_moving_averages_converge_to_the_factors_of_a_repeated_batch():
    """Â_k = ε_k Â_{k−1} + (1 − ε_k) A_k, ε_k = min(1 − 1/k, ε): after one batch B1 and then
    K copies of B2, Â − A(B2) = Π_{k=2}^{K+1} ε_k (A(B1) − A(B2)), which tends to 0."""
    decay, K = 0.9, 40
    metric = KFAC(0.1, decay=decay, model=NET)
    p, g = point(9), point(10)
    b1, b2 = batch(11), batch(12)
    f1, f2 = oracle_factors(p, *b1), oracle_factors(p, *b2)
    state = metric.init_state(p)
    _, state = metric.sharp_state(p, Covector(g), Context(NET, CE, *b1), state)
    # ε_1 = 0: the first estimate is the batch's (the sites are the two dense layers)
    close(state.factors[0], f1[0], 1e-9, 1e-12)
    weight = 1.0
    for k in range(2, K + 2):
        _, state = metric.sharp_state(p, Covector(g), Context(NET, CE, *b2), state)
        weight *= min(1 - 1 / k, decay)
        if k in (3, K + 1):
            expected = [tuple(w * u + (1 - w) * v for u, v in zip(a, b))
                        for a, b, w in zip(f1, f2, (weight, weight))]
            close(state.factors, expected, 1e-9, 1e-12)
    assert weight < 0.02  # so the averages are within 2 % of the repeated batch's factors
    close(state.factors, f2, 0.0, 0.02 * max(
        np.max(np.abs(a - b)) for u, v in zip(f1, f2) for a, b in zip(u, v)) + 1e-12)


def test_factor_and_inverse_periods_reuse_what_they_last_computed():
    """factor_period 2, inverse_period 3: the factors are estimated at steps 0 and 2, the
    decompositions made at steps 0 and 3, so steps 0–2 solve with batch 0's factors and step
    3 with batch 2's, whatever the batches of steps 1–3."""
    lam = 0.05
    metric = KFAC(lam, factor_period=2, inverse_period=3, model=NET)
    p, g = point(13), point(14)
    batches = [batch(20 + t) for t in range(4)]
    state = metric.init_state(p)
    used = [0, 0, 0, 2]
    for t, (x, y) in enumerate(batches):
        v, state = metric.sharp_state(p, Covector(g), Context(NET, CE, x, y), state)
        close(v.value, oracle_sharp(oracle_factors(p, *batches[used[t]]), g, lam), 1e-9, 1e-12)
    assert int(state.updates) == 2


def test_empirical_and_sampled_fisher_factors():
    """curvature="empirical": F_i = d_i d_iᵀ at the data's labels, by hand; "sampled": labels
    drawn from softmax(z), whose factors tend to the true Fisher's (Monte Carlo, loose)."""
    p, (x, y) = point(15), batch(16, n=6)
    ctx = Context(NET, CE, x, y)
    emp = KFAC(0.1, curvature="empirical").factors(p, ctx)
    close(emp, oracle_factors(p, x, y, "empirical"), 1e-9, 1e-12)
    fisher = oracle_factors(p, x, y)
    sampled = KFAC(0.1, curvature="sampled", samples=1000, model=NET)
    draws = [sampled.factors(p, ctx, jax.random.PRNGKey(key)) for key in (0, 1)]
    for f in draws:
        for (A, G), (A0, G0) in zip(f, fisher):
            np.testing.assert_allclose(A, A0, rtol=1e-9)  # A does not depend on the labels
            assert np.linalg.norm(G - G0) < 0.1 * np.linalg.norm(G0)
    # Drawn, not computed: two keys give two estimates, and neither is the empirical Fisher.
    assert np.linalg.norm(draws[0][1][1] - draws[1][1][1]) > 1e-6
    assert np.linalg.norm(draws[0][1][1] - emp[1][1]) > 1e-3


def written_out(p, x):
    """The network NET written out: W2 tanh(W1 x + b1) + b2, on a batch."""
    (W1, b1), _, (W2, b2) = p
    return jnp.tanh(x @ W1.T + b1[None]) @ W2.T + b2[None]


def ce(p, x, y):
    """The mean softmax cross-entropy of the written-out network."""
    z = written_out(p, x)
    return jnp.mean(jax.nn.logsumexp(z, axis=1) - z[jnp.arange(len(y)), y])


def flat(tree):
    return np.asarray(jax.flatten_util.ravel_pytree(
        jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), tree))[0])


def dense_fisher(p, x):
    """F = (1/n) Σ_i J_iᵀ (diag π_i − π_i π_iᵀ) J_i, J_i = ∂z_i/∂θ by jax.jacobian of the
    written-out network, in float64, in `ravel_pytree` order."""
    p64 = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float64), p)
    theta, unravel = jax.flatten_util.ravel_pytree(p64)
    x = jnp.asarray(x, jnp.float64)
    J = np.asarray(jax.jacobian(lambda th: written_out(unravel(th), x))(theta))  # (n, 3, d)
    pi = np.asarray(jax.nn.softmax(written_out(p64, x)))
    Fout = np.stack([np.diag(q) - np.outer(q, q) for q in pi])
    return np.einsum("imd,imk,ike->de", J, Fout, J) / len(x)


def h64(p, x, y):
    return float(jax.jit(ce)(jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float64), p),
                             jnp.asarray(x, jnp.float64), y))


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-10), (np.float32, 2e-3)])
def test_rescaled_step_minimises_the_exact_fisher_quadratic_model(dtype, rtol):
    """rescale: δ = αΔ + μδ₀, Δ = −K⁻¹∇h (the dense K-FAC solve of the oracle), δ₀ the last
    move, (α, μ) the closed form of the 2×2 system of M(δ) = ½ δᵀ(F + λI)δ + ∇hᵀδ with F the
    explicit Fisher of the batch (jax.jacobian of the written-out network); at the first step
    δ₀ = 0 and α = −∇hᵀΔ / Δᵀ(F + λI)Δ. With adapt_damping, λ follows ρ of that very step."""
    lam, omega = 0.05, 0.8
    metric = KFAC(lam, rescale=True, adapt_damping=True, damping_period=1, omega=omega,
                  model=NET)
    x, y = batch(31, dtype=dtype)
    ctx = Context(NET, CE, x, y)
    p_prev = point(32, dtype)
    p = jax.tree_util.tree_map(lambda a, b: a + 0.3 * b, p_prev, point(33, dtype))
    state = metric.init_state(p_prev)
    for t, q in enumerate((p_prev, p)):
        grad = jax.grad(ce)(q, x, y)
        v, new = metric.sharp_state(q, Covector(grad), ctx, state)
        g = flat(grad)
        Delta = -flat(oracle_sharp(oracle_factors(q, x, y), grad, lam))
        d0 = flat(q) - flat(p_prev)  # 0 at the first step
        C = dense_fisher(q, x) + lam * np.eye(g.size)
        if t == 0:
            alpha, mu = -(g @ Delta) / (Delta @ C @ Delta), 0.0
        else:
            S = np.array([[Delta @ C @ Delta, Delta @ C @ d0], [d0 @ C @ Delta, d0 @ C @ d0]])
            alpha, mu = np.linalg.solve(S, -np.array([g @ Delta, g @ d0]))
            # the returned vector −(αΔ + μδ₀) read back as (α, μ) by least squares
            got = np.linalg.lstsq(np.stack([Delta, d0], 1), -flat(v.value), rcond=None)[0]
            np.testing.assert_allclose(got, [alpha, mu], rtol=rtol)
            assert abs(mu) > 1e-3  # the momentum term is really there
        delta = alpha * Delta + mu * d0
        np.testing.assert_allclose(-flat(v.value), delta, rtol=rtol,
                                   atol=rtol * 1e-2 * np.abs(delta).max())
        # ρ on this step's batch, for this step
        model_change = 0.5 * delta @ C @ delta + g @ delta
        moved = jax.tree_util.tree_map(
            lambda a, b: np.asarray(a, np.float64) - np.asarray(b, np.float64), q, v.value)
        rho = (h64(moved, x, y) - h64(q, x, y)) / model_change
        expected = lam * omega if rho > 0.75 else lam / omega if rho < 0.25 else lam
        assert min(abs(rho - 0.75), abs(rho - 0.25)) > 0.01  # not on a threshold
        np.testing.assert_allclose(float(new.damping), expected, rtol=1e-6)
        state = new._replace(damping=jnp.asarray(lam, new.damping.dtype))
    assert int(state.count) == 2


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-9), (np.float32, 2e-4)])
def test_factored_tikhonov_damping(dtype, rtol):
    """tikhonov="factored": (A + π√λ I) ⊗ (G + √λ/π I) on vec([W b]) with π = √[(tr A / dim A)
    / (tr G / dim G)] from the oracle's factors, solved densely; and its matrix."""
    lam = 0.05
    p, (x, y), g = point(41, dtype), batch(42, dtype=dtype), point(43, dtype)
    ctx = Context(NET, CE, x, y)
    metric = KFAC(lam, tikhonov="factored")
    expected = []
    for (A, G), (gW, gb) in zip(oracle_factors(p, x, y), (g[0], g[2])):
        pi = np.sqrt((np.trace(A) / len(A)) / (np.trace(G) / len(G)))
        M = np.kron(G + np.sqrt(lam) / pi * np.eye(len(G)), A + pi * np.sqrt(lam) * np.eye(len(A)))
        V = np.concatenate([np.asarray(gW, np.float64), np.asarray(gb, np.float64)[:, None]], 1)
        X = np.linalg.solve(M, V.ravel()).reshape(V.shape)
        expected.append((X[:, :-1], X[:, -1]))
    assert abs(pi - 1) > 0.1  # the split is uneven: π matters
    close(metric.sharp(p, Covector(g), ctx).value, (expected[0], None, expected[1]), rtol,
          rtol * 1e-2)
    # flat undoes sharp, and the matrix is the block of M on ravel((W, b))
    close(metric.flat(p, metric.sharp(p, Covector(g), ctx), ctx).value, g, rtol * 10, rtol)
    A, G = oracle_factors(p, x, y)[1]
    pi = np.sqrt((np.trace(A) / len(A)) / (np.trace(G) / len(G)))
    M = np.kron(G + np.sqrt(lam) / pi * np.eye(3), A + pi * np.sqrt(lam) * np.eye(5))
    perm = np.concatenate([(np.arange(3)[:, None] * 5 + np.arange(4)[None]).ravel(),
                           np.arange(3) * 5 + 4])  # W row-major, then b
    np.testing.assert_allclose(np.asarray(metric.matrix(p, ctx))[16:, 16:], M[perm][:, perm],
                               rtol=rtol * 10, atol=rtol * 1e-2)


def lm_step(lam, x, y, p, judge=None):
    """(λ after one step of KFAC(λ, adapt_damping) at p on (x, y), the test's λ and ρ for the
    step the K-FAC direction proposes, Δ = −(K + λI)⁻¹∇h by the oracle, on that batch or on
    the batch `judge`)."""
    omega = 0.8
    metric = KFAC(lam, adapt_damping=True, damping_period=1, omega=omega, model=NET)
    grad = jax.grad(ce)(p, x, y)
    _, new = metric.sharp_state(p, Covector(grad), Context(NET, CE, x, y), metric.init_state(p))
    Delta = oracle_sharp(oracle_factors(p, x, y), grad, lam)
    x, y = (x, y) if judge is None else judge
    d, g = -flat(Delta), flat(jax.grad(ce)(p, x, y))
    C = dense_fisher(p, x) + lam * np.eye(g.size)
    moved = jax.tree_util.tree_map(lambda a, b: np.asarray(a, np.float64) - b, p, Delta)
    rho = (h64(moved, x, y) - h64(p, x, y)) / (0.5 * d @ C @ d + g @ d)
    expected = lam * omega if rho > 0.75 else lam / omega if rho < 0.25 else lam
    return float(new.damping), expected, rho


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_damping_rises_on_a_step_the_model_over_predicts_and_falls_on_one_it_predicts(dtype):
    """ρ = [h(θ + δ) − h(θ)] / M(δ) on the step's own batch, M(δ) = ½δᵀ(F + λI)δ + ∇hᵀδ by the
    explicit Fisher: with a small λ the K-FAC step is long and the loss falls far less than
    the model predicts (ρ < 1/4: λ rises); with a large λ it is short and predicted well
    (ρ > 3/4: λ falls). Both at the very first step: ρ judges the step being taken."""
    p, (x, y) = point(51, dtype, scale=3.0), batch(53, dtype=dtype)
    got, expected, rho = lm_step(1e-4, x, y, p)
    assert rho < 0.2 and expected > 1e-4
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    got, expected, rho = lm_step(0.1, x, y, p)
    assert 0.8 < rho < 1.2 and expected < 0.1
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_reduction_ratio_is_computed_on_the_steps_own_batch():
    """The step a batch proposes is judged on that batch: λ follows ρ on the step's own batch,
    and each of the two batches' steps would get another verdict on the other batch."""
    p, b52, b53 = point(51, scale=3.0), batch(52), batch(53)
    for own, other in ((b53, b52), (b52, b53)):
        got, expected, rho = lm_step(0.1, *own, p)
        np.testing.assert_allclose(got, expected, rtol=1e-9)
        _, elsewhere, _ = lm_step(0.1, *own, p, judge=other)
        assert elsewhere != expected


def test_defaults_hold_no_state_and_options_are_checked():
    assert not jax.tree_util.tree_leaves(gd(0.1, metric=KFAC()).init(point(0)))  # nothing kept
    with pytest.raises(KindError, match="model="):
        KFAC(decay=0.95)
    with pytest.raises(HyperparameterError, match="decay"):
        KFAC(decay=1.0, model=NET)
    with pytest.raises(HyperparameterError, match="inverse_period"):
        KFAC(inverse_period=0, model=NET)
    with pytest.raises(HyperparameterError, match="curvature"):
        KFAC(curvature="hessian")
    with pytest.raises(HyperparameterError, match="omega"):
        KFAC(adapt_damping=True, omega=1.5, model=NET)
    with pytest.raises(HyperparameterError, match="tikhonov"):
        KFAC(tikhonov="split")
    with pytest.raises(KindError, match="rescale.*model="):
        KFAC(rescale=True)
    with pytest.raises(KindError, match="opt.init"):  # a state that is not K-FAC's
        KFAC(model=NET).sharp_state(point(0), Covector(point(1)), Context(NET, CE, *batch(0)), ())


def test_kfac_error_is_the_distance_to_the_dense_fisher_direction():
    """kfac_error = ‖K♯c − F♯c‖ / ‖F♯c‖, K♯c by the dense block solve above and F♯c by the
    dense Fisher (1/n) Σ Jᵀ (diag π − π πᵀ) J + λ I, J the Jacobian of the written-out net."""
    lam = 0.05
    p, (x, y), c = point(21), batch(22), point(23)
    theta, unravel = jax.flatten_util.ravel_pytree(p)

    def net(th, x):
        (W1, b1), _, (W2, b2) = unravel(th)
        return W2 @ jnp.tanh(W1 @ x + b1) + b2

    J = np.asarray(jax.jit(jax.vmap(jax.jacobian(net), (None, 0)))(theta, x))  # (n, 3, d)
    pi = np.asarray(jax.nn.softmax(jax.vmap(net, (None, 0))(theta, x)))
    Fout = np.stack([np.diag(q) - np.outer(q, q) for q in pi])
    F = np.einsum("imd,imk,ike->de", J, Fout, J) / N + lam * np.eye(theta.size)
    cf = np.asarray(jax.flatten_util.ravel_pytree(c)[0])
    exact = np.linalg.solve(F, cf)
    kfac = np.asarray(jax.flatten_util.ravel_pytree(
        oracle_sharp(oracle_factors(p, x, y), c, lam))[0])
    expected = np.linalg.norm(kfac - exact) / np.linalg.norm(exact)
    got = kfac_error(KFAC_005, p, Covector(c, NET.param), Context(NET, CE, x, y))
    assert expected > 1e-3  # behind a tanh the factorisation is not exact
    assert got == pytest.approx(expected, rel=1e-7)


def iris_runs(dtype, metric):
    """The README snippet of "At home in the ecosystem": an Equinox MLP >> dense(8, 3) trained
    by fit(model, softmax_cross_entropy(classes=3), gd(0.1, metric=metric), ...) on Iris
    (standardised), 25 epochs of 4 batches, on 10 seeds (one compilation for all: each seed's
    MLP gives the starting point of one model). Yields (state, history) per seed, or the
    NonFiniteError that stopped the seed's run."""
    eqx = pytest.importorskip("equinox")
    from sklearn.datasets import load_iris

    from lenses import NonFiniteError
    X, Y = load_iris(return_X_y=True)
    X = ((X - X.mean(0)) / X.std(0)).astype(dtype)

    def model_of(seed):
        lens = from_equinox(eqx.nn.MLP(4, 8, 16, 2, key=jax.random.PRNGKey(seed)), R(4))
        return lens, lens >> dense(8, 3)

    _, model = model_of(0)
    for seed in range(10):
        lens, m = model_of(seed)
        p = jax.tree_util.tree_map(lambda a: jnp.asarray(a, dtype),
                                   (lens.init(None), m.init(jax.random.PRNGKey(seed))[1]))
        try:
            yield fit(model, softmax_cross_entropy(classes=3), gd(0.1, metric=metric), p, (X, Y),
                      epochs=25, key=jax.random.PRNGKey(seed), progress=False)
        except NonFiniteError as e:
            yield e


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_readme_snippet_trains_with_the_default_kfac(dtype):
    """With the default damping (λ = 0.1), every seed: no fault, and the loss falls to a third."""
    for run in iris_runs(dtype, KFAC()):
        assert not isinstance(run, Exception), run
        state, history = run
        assert int(state.count) == 100
        assert all(np.isfinite(h["loss"]) for h in history)
        assert history[-1]["loss"] < history[0]["loss"] / 3, history[-1]["loss"]
        assert jax.tree_util.tree_leaves(state.params)[0].dtype == dtype


def test_the_readme_snippet_stops_on_a_non_finite_step_with_a_small_damping():
    """docs/inner-products/index.md, why the default is λ = 0.1: with λ = 1e-3 (float32, what a
    user runs) most of the 10 seeds stop on a non-finite step within their 100 steps."""
    stopped = [run for run in iris_runs(np.float32, KFAC(1e-3)) if isinstance(run, Exception)]
    assert len(stopped) >= 8, f"{len(stopped)} of 10 seeds stopped"


def test_the_full_kfac_trains_in_the_checked_step_and_a_fault_keeps_its_state():
    """gd(1, KFAC(rescale, adapt_damping, factored damping, averages, periods)) through
    train_step: the state is a pytree the checked step carries (the loss falls over 8 steps
    of one batch); a batch with a NaN is refused with NonFiniteError, and the parameters and
    the K-FAC state stay as they were, bit for bit."""
    from lenses import NonFiniteError, train_step
    metric = KFAC(0.1, decay=0.9, inverse_period=2, adapt_damping=True, damping_period=2,
                  rescale=True, tikhonov="factored", model=NET)
    step = train_step(NET, CE, gd(1.0, metric=metric))
    x, y = batch(71, n=32)
    state = step.init(point(72))
    losses = []
    for _ in range(8):
        state, report = step(state, x, y)
        losses.append(float(report.loss))
    assert losses[-1] < 0.5 * losses[0], losses
    assert int(state.opt_state[0].count) == 8  # the sharp part's KFACState
    before = jax.tree_util.tree_leaves((state.params, state.opt_state))
    bad = x.at[0, 0].set(np.nan)
    after, _ = step(state, bad, y)
    with pytest.raises(NonFiniteError):
        after.check()
    for a, b in zip(before, jax.tree_util.tree_leaves((after.params, after.opt_state)),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
