"""The update and the stateful optimisers (lenses on S × P) against optax and hand calculations.

Oracles: optax's own optimisers (run on gradients from `jax.grad` of a hand-written MLP
loss), the change of coordinates q = G^{1/2} p for a constant metric, and hand formulas.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from categories import Covector, R, Smooth, Vector
from categories.linear import unwrap
from lenses import (Constant, Context, Diagonal, Metric, adagrad, adam, dense, from_optax, gd,
                    momentum, nesterov, sharp_transform, tanh, update)
from lenses.metrics import ravel, unflatten_like
from lenses.optimisers import AdamState, MomentumState

LR, BETA, STEPS = 0.05, 0.9, 20

MODEL = dense(3, 5) >> tanh >> dense(5, 2)
P0 = MODEL.init(jax.random.PRNGKey(0))
X = jax.random.normal(jax.random.PRNGKey(1), (8, 3))
Y = jax.random.normal(jax.random.PRNGKey(2), (8, 2))


def hand_loss(p):
    """½ mean ‖W₂ tanh(W₁x + b₁) + b₂ − y‖², written without the library."""
    (W1, b1), _, (W2, b2) = p
    out = jnp.tanh(X @ W1.T + b1[None, :]) @ W2.T + b2[None, :]
    return 0.5 * jnp.mean(jnp.sum((out - Y) ** 2, axis=1))


grad = jax.jit(jax.grad(hand_loss))

_A = jax.random.normal(jax.random.PRNGKey(3), (MODEL.param.size, MODEL.param.size))
G_SPD = _A @ _A.T / MODEL.param.size + 0.5 * jnp.eye(MODEL.param.size)


def covector(p):
    return Covector(grad(p), MODEL.param)


def ours(opt, g=grad, space=MODEL.param, p0=P0):
    """The lens's iterates: covector at the lookahead point, then the step; records the
    lookahead point (p itself for all but Nesterov)."""
    def body(sp, _):
        s, p = opt.step(*sp, Covector(g(opt.lookahead(*sp)), space))
        return (s, p), opt.lookahead(s, p)

    return (opt.init(p0), p0), body


def theirs(tx, p0=P0):
    """optax's iterates on the same gradients."""
    def body(sp, _):
        s, p = sp
        u, s = tx.update(grad(p), s, p)
        p = optax.apply_updates(p, u)
        return (s, p), p

    return (tx.init(p0), p0), body


def trajectories(*runners):
    """The STEPS iterates of each runner (leaves stacked along a leading axis), in one jit."""
    carries, bodies = [c for c, _ in runners], [b for _, b in runners]

    @jax.jit
    def run(carries):
        return [jax.lax.scan(b, c, None, STEPS)[1] for b, c in zip(bodies, carries)]

    return jax.tree_util.tree_map(np.asarray, run(carries))


def assert_tree_close(a, b, tol=1e-8):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(la, lb):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=tol)


def last(traj):
    return ravel(jax.tree_util.tree_map(lambda a: a[-1], traj))


PAIRS = {
    "gd": (lambda m=None: gd(LR, metric=m), optax.sgd(LR)),
    "momentum": (lambda m=None: momentum(LR, BETA, metric=m), optax.sgd(LR, momentum=BETA)),
    "nesterov": (lambda m=None: nesterov(LR, BETA, metric=m),
                 optax.sgd(LR, momentum=BETA, nesterov=True)),
    "adagrad": (lambda m=None: adagrad(LR, metric=m), optax.adagrad(LR)),
    "adam": (lambda m=None: adam(LR, metric=m), optax.adam(LR)),
}


@pytest.mark.parametrize("name", list(PAIRS))
def test_optimisers_follow_optax_with_any_metric(name):
    """20 steps, 1e-8. Euclidean: = the optax optimiser. With a metric: sharpen first, then the
    rule = optax.chain(sharp_transform(metric), the optax optimiser).

    Nesterov's lens keeps θ and evaluates at the lookahead φ = θ − ηβm (its forward part);
    optax writes the same method in the variable φ (the standard change of variables), so
    optax's iterates are our lookahead points φ_t, which is what `ours` records.
    """
    # A non-diagonal metric: Adam and Adagrad are blind to diagonal rescaling (up to eps).
    metric = Constant(G_SPD)
    make, tx = PAIRS[name]
    ours_e, theirs_e, ours_m, theirs_m = trajectories(
        ours(make()), theirs(tx), ours(make(metric)), theirs(optax.chain(sharp_transform(metric), tx)))
    assert_tree_close(ours_e, theirs_e)
    assert_tree_close(ours_m, theirs_m)
    # they moved, and the metric changed the path: no comparison of resting points
    assert float(jnp.max(jnp.abs(last(theirs_e) - ravel(P0)))) > 1e-2
    assert float(jnp.max(jnp.abs(last(theirs_m) - last(theirs_e)))) > 1e-3


def test_gd_with_diagonal_metric_by_hand():
    w = jax.tree_util.tree_map(lambda a: 1.0 + a ** 2, P0)
    g = grad(P0)
    _, p1 = gd(LR, metric=Diagonal(w)).step((), P0, covector(P0))
    assert_tree_close(p1, jax.tree_util.tree_map(lambda p, gi, wi: p - LR * gi / wi, P0, g, w), 1e-14)


def test_sharp_transform_and_from_optax_with_a_metric_equal_gd_with_the_metric():
    w = jax.tree_util.tree_map(lambda a: 0.3 + a ** 2, P0)
    ref, chained, wrapped = trajectories(
        ours(gd(LR, metric=Diagonal(w))),
        theirs(optax.chain(sharp_transform(Diagonal(w)), optax.sgd(LR))),
        ours(from_optax(optax.sgd(LR), metric=Diagonal(w))))
    assert_tree_close(ref, chained, 1e-12)
    assert_tree_close(ref, wrapped, 1e-12)
    assert float(jnp.max(jnp.abs(last(ref) - ravel(P0)))) > 1e-2


def test_from_optax_adam_equals_adam():
    a, b = trajectories(ours(adam(LR, b1=0.8, b2=0.99, eps=1e-6)),
                        ours(from_optax(optax.adam(LR, b1=0.8, b2=0.99, eps=1e-6))))
    assert_tree_close(a, b, 1e-10)


def _sqrt_psd(G, power):
    vals, vecs = np.linalg.eigh(np.asarray(G))
    return jnp.asarray((vecs * vals ** power) @ vecs.T)


def test_constant_metric_gd_is_gd_in_the_coordinates_G_half_p():
    G = G_SPD
    Gh, Gmh = _sqrt_psd(G, 0.5), _sqrt_psd(G, -0.5)
    # The model in the coordinates q = G^{1/2} p: q ↦ f(x, G^{-1/2} q).
    r = Smooth(MODEL.param, MODEL.param, lambda q: unflatten_like(Gmh @ ravel(q), q), "G^-½",
               check=False)
    reparam = MODEL.reparam(r)
    q_grad = jax.grad(lambda q: hand_loss(r.fn(q)))
    q0 = unflatten_like(Gh @ ravel(P0), P0)
    ps, qs, euclid = trajectories(ours(gd(LR, metric=Constant(G))),
                                  ours(gd(LR), g=q_grad, space=reparam.param, p0=q0),
                                  ours(gd(LR)))
    flat_p = np.stack([np.concatenate([a[t].ravel() for a in jax.tree_util.tree_leaves(ps)])
                       for t in range(STEPS)])
    flat_q = np.stack([np.concatenate([a[t].ravel() for a in jax.tree_util.tree_leaves(qs)])
                       for t in range(STEPS)])
    np.testing.assert_allclose(flat_p, flat_q @ np.asarray(Gmh).T, rtol=0, atol=1e-8)
    assert float(jnp.max(jnp.abs(last(ps) - ravel(P0)))) > 1e-2
    assert float(jnp.max(jnp.abs(last(ps) - last(euclid)))) > 1e-3  # not Euclidean gd


def test_update_subtracts_the_sharpened_covector():
    g = grad(P0)
    u = update(lr=0.1)
    assert_tree_close(u(P0, covector(P0)), jax.tree_util.tree_map(lambda p, gi: p - 0.1 * gi, P0, g),
                      1e-15)
    with pytest.raises(TypeError, match="sharp"):
        P0[0][0] - covector(P0)  # noqa: B018  a covector is not a point


def test_reparameterised_model_at_old_point_is_model_at_new_point():
    u = update(Diagonal(2.0), lr=0.3)
    new_model, p_new = u.reparameterise(MODEL, P0, covector(P0))
    g = grad(P0)
    assert_tree_close(p_new, jax.tree_util.tree_map(lambda p, gi: p - 0.3 * gi / 2.0, P0, g), 1e-14)
    assert new_model.param == MODEL.param
    for x in X:
        np.testing.assert_allclose(new_model.forward(x, P0), MODEL.forward(x, p_new), atol=1e-12)
    # and it is a different layer from the one we started with
    assert float(jnp.max(jnp.abs(new_model.forward(X[0], P0) - MODEL.forward(X[0], P0)))) > 1e-4


def test_states_are_parameter_shaped_with_none_for_parameterless_slots():
    s = momentum(LR).init(P0)
    assert isinstance(s, MomentumState) and s.m[1] is None
    assert s.m[0][0].shape == P0[0][0].shape
    a = adam(LR).init(P0)
    assert isinstance(a, AdamState) and a.mu[1] is None and a.nu[1] is None
    # a stateful step goes through the parameterless slot
    s1, p1 = momentum(LR).step(s, P0, covector(P0))
    assert s1.m[1] is None and p1[1] is None


def test_optimisers_jit():
    opt = adam(LR)
    step = jax.jit(lambda s, p, g: opt.step(s, p, Covector(g, MODEL.param)))
    s, p = opt.init(P0), P0
    s_eager, p_eager = opt.step(s, p, covector(p))
    s_jit, p_jit = step(s, p, grad(p))
    assert_tree_close(p_eager, p_jit, 1e-14)


def test_unknown_domain_policy_is_refused():
    with pytest.raises(ValueError, match="on_domain_error"):
        gd(0.1, on_domain_error="clip")


def test_a_scalar_parameter_object():
    """u on P = R: p − η p'·(1/w) for the diagonal metric with weight w."""
    u = update(Diagonal(4.0), lr=0.5)
    p_new = u(jnp.asarray(1.0), Covector(jnp.asarray(2.0), R()))
    assert float(p_new) == pytest.approx(1.0 - 0.5 * 2.0 / 4.0, abs=1e-15)


class PerExample(Metric):
    """A data-dependent inner product: n·⟨,⟩ with n the batch size read from the context."""

    def sharp(self, p, cov, ctx=None):
        return Vector(jax.tree_util.tree_map(lambda a: a / ctx.x.shape[0], unwrap(cov)))


def test_sharp_transform_passes_the_context():
    ctx = Context(MODEL, None, X, Y)
    tx = optax.chain(sharp_transform(PerExample()), optax.sgd(LR))
    g = grad(P0)
    u, _ = tx.update(g, tx.init(P0), P0, ctx=ctx)
    expected = jax.tree_util.tree_map(lambda gi: -LR * gi / X.shape[0], g)
    assert_tree_close(u, expected, 1e-15)
    _, p1 = gd(LR, metric=PerExample()).step((), P0, covector(P0), ctx)
    assert_tree_close(p1, optax.apply_updates(P0, u), 1e-15)
