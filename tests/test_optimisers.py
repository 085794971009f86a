"""The update and the stateful optimisers (lenses on S × P) against optax and hand calculations.

Oracles: optax's own optimisers (run on gradients from `jax.grad` of a hand-written MLP
loss), the change of coordinates q = G^{1/2} p for a constant metric, and hand formulas.
The optimisers are chains of parts (sharp, a rule, the learning rate): the short-hands are
compared bit for bit with their explicit chains, optax parts stand in for the library's, and
a part written here (not in the library) composes and trains.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from categories import Covector, R, Smooth, Vector, draws
from categories.linear import unwrap
from lenses import (Constant, Context, Diagonal, Euclidean, Metric, adagrad, adam, dense,
                    from_optax, gd, half_squared_error, momentum, nesterov, tanh, train_step)
from lenses.inner_products.metrics import ravel, unflatten_like
from lenses.optimisers import (AdamState, EmptyState, MomentumState, Optimiser, chain,
                               scale_by_adagrad, scale_by_adam, scale_by_learning_rate,
                               scale_by_momentum, sharp)
from lenses.optimisers.lens import Update

LR, BETA, STEPS = 0.05, 0.9, 20

MODEL = dense(3, 5) >> tanh >> dense(5, 2)
P0 = MODEL.init(jax.random.PRNGKey(0))
X = draws.normal(jax.random.PRNGKey(1), (8, 3))
Y = draws.normal(jax.random.PRNGKey(2), (8, 2))


def hand_loss(p):
    """½ mean ‖W₂ tanh(W₁x + b₁) + b₂ − y‖², written without the library."""
    (W1, b1), _, (W2, b2) = p
    out = jnp.tanh(X @ W1.T + b1[None, :]) @ W2.T + b2[None, :]
    return 0.5 * jnp.mean(jnp.sum((out - Y) ** 2, axis=1))


grad = jax.jit(jax.grad(hand_loss))

_A = draws.normal(jax.random.PRNGKey(3), (MODEL.param.size, MODEL.param.size))
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
    rule = optax.chain(sharp(metric), the optax optimiser).

    Nesterov's lens keeps θ and evaluates at the lookahead φ = θ − ηβm (its forward part);
    optax writes the same method in the variable φ (the standard change of variables), so
    optax's iterates are our lookahead points φ_t, which is what `ours` records.
    """
    # A non-diagonal metric: Adam and Adagrad are blind to diagonal rescaling (up to eps).
    metric = Constant(G_SPD)
    make, tx = PAIRS[name]
    ours_e, theirs_e, ours_m, theirs_m = trajectories(
        ours(make()), theirs(tx), ours(make(metric)), theirs(optax.chain(sharp(metric), tx)))
    assert_tree_close(ours_e, theirs_e)
    assert_tree_close(ours_m, theirs_m)
    # they moved, and the metric changed the path: no comparison of resting points
    assert float(jnp.max(jnp.abs(last(theirs_e) - ravel(P0)))) > 1e-2
    assert float(jnp.max(jnp.abs(last(theirs_m) - last(theirs_e)))) > 1e-3


def test_gd_with_diagonal_metric_by_hand():
    w = jax.tree_util.tree_map(lambda a: 1.0 + a ** 2, P0)
    g = grad(P0)
    u = gd(LR, metric=Diagonal(w))
    _, p1 = u.step(u.init(P0), P0, covector(P0))
    assert_tree_close(p1, jax.tree_util.tree_map(lambda p, gi, wi: p - LR * gi / wi, P0, g, w), 1e-14)


def test_sharp_and_from_optax_with_a_metric_equal_gd_with_the_metric():
    w = jax.tree_util.tree_map(lambda a: 0.3 + a ** 2, P0)
    ref, chained, wrapped = trajectories(
        ours(gd(LR, metric=Diagonal(w))),
        theirs(optax.chain(sharp(Diagonal(w)), optax.sgd(LR))),
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
    u = gd(0.1)
    assert_tree_close(u(P0, covector(P0)), jax.tree_util.tree_map(lambda p, gi: p - 0.1 * gi, P0, g),
                      1e-15)
    with pytest.raises(TypeError, match="sharp"):
        P0[0][0] - covector(P0)  # noqa: B018  a covector is not a point


def test_reparameterised_model_at_old_point_is_model_at_new_point():
    u = gd(0.3, metric=Diagonal(2.0))
    new_model, p_new = u.reparameterise(MODEL, P0, covector(P0))
    g = grad(P0)
    assert_tree_close(p_new, jax.tree_util.tree_map(lambda p, gi: p - 0.3 * gi / 2.0, P0, g), 1e-14)
    assert new_model.param == MODEL.param
    for x in X:
        np.testing.assert_allclose(new_model.forward(x, P0), MODEL.forward(x, p_new), atol=1e-12)
    # and it is a different layer from the one we started with
    assert float(jnp.max(jnp.abs(new_model.forward(X[0], P0) - MODEL.forward(X[0], P0)))) > 1e-4


def test_states_are_parameter_shaped_with_none_for_parameterless_slots():
    s = momentum(LR).init(P0)  # (sharp's, momentum's, the rate's): optax.chain's tuple
    assert isinstance(s[1], MomentumState) and s[1].m[1] is None
    assert s[1].m[0][0].shape == P0[0][0].shape
    a = adam(LR).init(P0)[1]
    assert isinstance(a, AdamState) and a.mu[1] is None and a.nu[1] is None
    # a stateful step goes through the parameterless slot
    s1, p1 = momentum(LR).step(s, P0, covector(P0))
    assert s1[1].m[1] is None and p1[1] is None


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
    u = gd(0.5, metric=Diagonal(4.0))
    p_new = u(jnp.asarray(1.0), Covector(jnp.asarray(2.0), R()))
    assert float(p_new) == pytest.approx(1.0 - 0.5 * 2.0 / 4.0, abs=1e-15)


class PerExample(Metric):
    """A data-dependent inner product: n·⟨,⟩ with n the batch size read from the context."""

    def sharp(self, p, cov, ctx=None):
        return Vector(jax.tree_util.tree_map(lambda a: a / ctx.x.shape[0], unwrap(cov)))

    def flat(self, p, vec, ctx=None):
        return Covector(jax.tree_util.tree_map(lambda a: a * ctx.x.shape[0], unwrap(vec)))


def test_sharp_passes_the_context():
    ctx = Context(MODEL, None, X, Y)
    tx = optax.chain(sharp(PerExample()), optax.sgd(LR))
    g = grad(P0)
    u, _ = tx.update(g, tx.init(P0), P0, ctx=ctx)
    expected = jax.tree_util.tree_map(lambda gi: -LR * gi / X.shape[0], g)
    assert_tree_close(u, expected, 1e-15)
    plain = gd(LR, metric=PerExample())
    _, p1 = plain.step(plain.init(P0), P0, covector(P0), ctx)
    assert_tree_close(p1, optax.apply_updates(P0, u), 1e-15)


# -- optimisers are chains of parts ------------------------------------------------------------

def assert_bits_equal(a, b):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and np.array_equal(x, y)


SHORT_HANDS = {
    "gd": (lambda m: gd(LR, metric=m), lambda m: chain(sharp(m), scale_by_learning_rate(LR))),
    "momentum": (lambda m: momentum(LR, BETA, metric=m),
                 lambda m: chain(sharp(m), scale_by_momentum(BETA), scale_by_learning_rate(LR))),
    "nesterov": (lambda m: nesterov(LR, BETA, metric=m),
                 lambda m: chain(sharp(m), scale_by_momentum(BETA), scale_by_learning_rate(LR),
                                 lookahead=True)),
    "adagrad": (lambda m: adagrad(LR, 0.2, 1e-6, metric=m),
                lambda m: chain(sharp(m), scale_by_adagrad(0.2, 1e-6), scale_by_learning_rate(LR))),
    "adam": (lambda m: adam(LR, b1=0.8, b2=0.99, eps=1e-6, metric=m),
             lambda m: chain(sharp(m), scale_by_adam(0.8, 0.99, 1e-6), scale_by_learning_rate(LR))),
    "from_optax": (lambda m: from_optax(optax.adam(LR), metric=m),
                   lambda m: chain(sharp(m), optax.adam(LR))),
}


@pytest.mark.parametrize("metric", [None, Constant(G_SPD)], ids=["euclidean", "constant"])
@pytest.mark.parametrize("name", list(SHORT_HANDS))
def test_each_short_hand_is_its_chain_of_parts_bit_for_bit(name, metric):
    short, explicit = (make(metric) for make in SHORT_HANDS[name])
    assert isinstance(short, Optimiser) and isinstance(explicit, Optimiser)
    assert_bits_equal(short.init(P0), explicit.init(P0))
    a, b = trajectories(ours(short), ours(explicit))
    assert_bits_equal(a, b)
    assert float(jnp.max(jnp.abs(last(a) - ravel(P0)))) > 1e-2  # they moved


M = Constant(G_SPD)
STAND_INS = {
    # (chain with optax parts, the library's short-hand, tolerance between them, optax oracle)
    "adam": (chain(sharp(M), optax.scale_by_adam(), scale_by_learning_rate(LR)),
             adam(LR, metric=M), 1e-12, optax.adam(LR)),
    "adagrad": (chain(sharp(M), optax.scale_by_rss(), optax.scale_by_learning_rate(LR)),
                adagrad(LR, metric=M), 0, optax.adagrad(LR)),
    "momentum": (chain(sharp(M), optax.trace(BETA), optax.scale_by_learning_rate(LR)),
                 momentum(LR, BETA, metric=M), 0, optax.sgd(LR, momentum=BETA)),
    "nesterov": (chain(sharp(M), optax.trace(BETA), scale_by_learning_rate(LR), lookahead=True),
                 nesterov(LR, BETA, metric=M), 0, optax.sgd(LR, momentum=BETA, nesterov=True)),
    "gd": (chain(sharp(M), optax.sgd(LR)), gd(LR, metric=M), 0, optax.sgd(LR)),
}


@pytest.mark.parametrize("name", list(STAND_INS))
def test_optax_parts_stand_in_for_the_library_parts(name):
    """Bit for bit where optax computes the same numbers (Adam's bias correction rounds
    differently in optax); and both follow optax's optimiser after sharpening."""
    mixed, short, tol, tx = STAND_INS[name]
    a, b, oracle = trajectories(ours(mixed), ours(short),
                                theirs(optax.chain(sharp(M), tx)))
    if tol == 0:
        assert_bits_equal(a, b)
    else:
        assert_tree_close(a, b, tol)
    assert_tree_close(a, oracle)
    assert float(jnp.max(jnp.abs(last(oracle) - ravel(P0)))) > 1e-2


class AtPoint(Metric):
    """An inner product that depends on the point: g_p = diag(1 + p²), so (p')♯ = p' / (1 + p²)."""

    def sharp(self, p, cov, ctx=None):
        return Vector(jax.tree_util.tree_map(lambda c, q: c / (1 + q * q), unwrap(cov), p))

    def flat(self, p, vec, ctx=None):
        return Covector(jax.tree_util.tree_map(lambda v, q: v * (1 + q * q), unwrap(vec), p))


def _random_like(p, seed):
    leaves, treedef = jax.tree_util.tree_flatten(p)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    return jax.tree_util.tree_unflatten(
        treedef, [jax.random.normal(k, a.shape, a.dtype) for k, a in zip(keys, leaves)])


def test_nesterov_lookahead_is_the_hand_formula_and_the_metric_is_taken_there():
    m = _random_like(P0, 11)  # a momentum built by hand (None at the parameterless slot)
    opt = nesterov(LR, BETA, metric=AtPoint())
    empty = opt.init(P0)  # the parts' states: sharp, momentum, rate; the momentum by hand
    s = (empty[0], MomentumState(m), empty[2])
    tm = jax.tree_util.tree_map
    phi = tm(lambda p, mi: p - LR * BETA * mi, P0, m)  # φ = p − η β m
    assert_tree_close(opt.lookahead(s, P0), phi, 1e-15)
    assert momentum(LR, BETA).lookahead(s, P0) is P0  # heavy ball evaluates at p itself
    # the step: v = (p')♯ at φ, m ← v + β m, p ← p − η m
    g = grad(phi)
    s1, p1 = opt.step(s, P0, Covector(g, MODEL.param))
    m1 = tm(lambda gi, q, mi: gi / (1 + q * q) + BETA * mi, g, phi, m)
    assert_tree_close(s1[1].m, m1, 1e-14)
    assert_tree_close(p1, tm(lambda p, mi: p - LR * mi, P0, m1), 1e-14)
    # sharpened at p instead of φ, the step would differ
    at_p = tm(lambda p, gi, q, mi: p - LR * (gi / (1 + q * q) + BETA * mi), P0, g, P0, m)
    assert float(jnp.max(jnp.abs(ravel(p1) - ravel(at_p)))) > 1e-6


def test_the_lookahead_of_an_optax_momentum_is_nesterov():
    """The inertial point is derived from the chain, not declared: optax's heavy ball with
    lookahead=True evaluates at optax's own Nesterov iterates."""
    look, oracle, heavy = trajectories(
        ours(from_optax(optax.sgd(LR, momentum=BETA), lookahead=True)),
        theirs(optax.sgd(LR, momentum=BETA, nesterov=True)),
        theirs(optax.sgd(LR, momentum=BETA)))
    assert_tree_close(look, oracle)
    assert float(jnp.max(jnp.abs(last(oracle) - last(heavy)))) > 1e-3  # not the heavy ball


def test_an_explicit_lookahead_is_the_forward_part():
    def phi(s, p):
        return jax.tree_util.tree_map(lambda a, t: a - 0.5 * t, p, s.m)

    opt = chain(sharp(), scale_by_momentum(BETA), scale_by_learning_rate(LR), lookahead=phi)
    m = _random_like(P0, 12)
    assert_tree_close(opt.lookahead(MomentumState(m), P0), phi(MomentumState(m), P0), 0)


class InverseSqrtCount:
    """A part written by the user, not by the library (any object with init and update):
    v ↦ v / √t at the t-th step, the count t its state."""

    def init(self, params):
        return jnp.zeros((), jnp.int32)

    def update(self, updates, state, params=None):
        t = state + 1
        return jax.tree_util.tree_map(lambda v: v / jnp.sqrt(t.astype(v.dtype)), updates), t


def test_a_part_written_by_the_user_composes_and_trains():
    opt = chain(sharp(), InverseSqrtCount(), scale_by_momentum(BETA), scale_by_learning_rate(LR))
    step = train_step(MODEL, half_squared_error, opt)
    state = step.init(P0)
    _, count, mom, _ = state.opt_state  # the parts' states, in chain order
    assert int(count) == 0 and isinstance(mom, MomentumState)
    tm = jax.tree_util.tree_map
    p, m = P0, tm(jnp.zeros_like, P0)
    for t in range(1, 6):
        state, report = step(state, X, Y)
        assert float(report.loss) == pytest.approx(float(hand_loss(p)), abs=1e-12)
        m = tm(lambda gi, mi: gi / np.sqrt(t) + BETA * mi, grad(p), m)
        p = tm(lambda a, mi: a - LR * mi, p, m)
        assert_tree_close(state.params, p, 1e-12)
    assert int(state.opt_state[1]) == 5
    plain = momentum(LR, BETA)
    ps = trajectories(ours(plain))
    assert float(jnp.max(jnp.abs(ravel(state.params) - ravel(
        jax.tree_util.tree_map(lambda a: a[4], ps))))) > 1e-4  # the part changed the path


def test_a_learning_rate_schedule_is_a_stateful_part():
    schedule = optax.linear_schedule(0.1, 0.01, STEPS)
    a, b = trajectories(ours(chain(sharp(), scale_by_learning_rate(schedule))),
                        theirs(optax.sgd(schedule)))
    assert_tree_close(a, b, 1e-14)


def test_gd_takes_a_schedule_as_adam_does():
    # gd(schedule) against optax.sgd(schedule): the same iterates, the rate read at each count
    schedule = optax.linear_schedule(0.1, 0.01, STEPS)
    opt = gd(schedule)
    assert isinstance(opt, Optimiser) and opt.init(P0) is not None
    a, b = trajectories(ours(opt), theirs(optax.sgd(schedule)))
    assert_tree_close(a, b, 1e-14)
    a, b = trajectories(ours(gd(schedule, metric=Diagonal(2.0))),
                        theirs(optax.chain(optax.scale(0.5), optax.sgd(schedule))))
    assert_tree_close(a, b, 1e-14)


def test_every_spelling_of_gd_builds_the_same_map():
    w = Diagonal(2.0)
    expected = jax.tree_util.tree_map(lambda p, gi: p - 0.1 * gi / 2.0, P0, grad(P0))
    for u in [gd(0.1, w), gd(0.1, metric=w), gd(lr=0.1, metric=w)]:
        assert type(u) is Update
        assert u.init(P0) == (EmptyState(), EmptyState())  # sharp's and the rate's: nothing
        assert_tree_close(u(P0, covector(P0)), expected, 1e-15)
        assert_tree_close(u.step(u.init(P0), P0, covector(P0))[1], expected, 1e-15)


@pytest.mark.parametrize("build, message", [
    (lambda: gd(0.0), r"learning rate lr must be a finite number > 0 \(or a schedule\), got 0\.0"),
    (lambda: gd(-0.1), r"learning rate lr must be a finite number > 0"),
    (lambda: gd(float("nan")), r"learning rate lr must be a finite number"),
    (lambda: gd(float("inf")), r"learning rate lr must be a finite number"),
    (lambda: gd("0.1"), r"lr must be a finite number > 0"),
    (lambda: gd(lr=0.0, metric=Euclidean()), r"learning rate lr"),
    (lambda: adam(-1e-3), r"learning rate lr"),
    (lambda: scale_by_learning_rate(0), r"learning rate lr"),
    (lambda: momentum(0.1, beta=1.0), r"beta must be a finite number in \[0, 1\), got 1\.0"),
    (lambda: momentum(0.1, beta=-0.1), r"beta must be a finite number in \[0, 1\)"),
    (lambda: nesterov(0.1, beta=1.5), r"beta must be a finite number in \[0, 1\)"),
    (lambda: adam(0.1, b1=1.0), r"b1 must be a finite number in \[0, 1\), got 1\.0"),
    (lambda: adam(0.1, b2=1.0), r"b2 must be a finite number in \[0, 1\)"),
    (lambda: adam(0.1, eps=0.0), r"eps must be a finite number > 0, got 0\.0"),
    (lambda: scale_by_adam(b1=-0.5), r"b1 must be a finite number in \[0, 1\)"),
    (lambda: adagrad(0.1, initial_accumulator_value=-0.1),
     r"initial_accumulator_value must be a finite number ≥ 0, got -0\.1"),
    (lambda: adagrad(0.1, eps=-1e-7), r"eps must be a finite number > 0"),
    (lambda: gd(0.1, max_halvings=-1), r"max_halvings must be an integer ≥ 0"),
    (lambda: gd(Euclidean(), 0.1), r"lr must be a finite number > 0"),  # arguments swapped
])
def test_hyperparameters_are_checked_at_construction(build, message):
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize("build, message", [
    (lambda: from_optax(object()), r"from_optax needs an optax.GradientTransformation"),
    (lambda: from_optax(optax.adam), r"from_optax needs an optax.GradientTransformation"),
    (lambda: chain(scale_by_adam(), scale_by_learning_rate(0.1)), r"first part must be sharp"),
    (lambda: chain(sharp(), sharp(), scale_by_learning_rate(0.1)), r"only the first part sharpens"),
    (lambda: chain(sharp(), 3), r"part 1 \(3\) is not a part"),
    (lambda: chain(), r"at least its first part"),
    (lambda: sharp(object()), r"sharp needs an inner product"),
    (lambda: gd(0.1, 0.2), r"sharp needs an inner product"),  # a number where the metric goes
])
def test_what_is_not_an_optimiser_part_is_refused(build, message):
    with pytest.raises(TypeError, match=message):
        build()


def test_a_part_goes_into_optax_chain_with_the_context():
    """The library's parts are optax transformations: sharp receives ctx through optax.chain."""
    ctx = Context(MODEL, None, X, Y)
    tx = optax.chain(sharp(PerExample()), scale_by_momentum(BETA), scale_by_learning_rate(LR))
    g = grad(P0)
    u, _ = tx.update(g, tx.init(P0), P0, ctx=ctx)
    assert_tree_close(u, jax.tree_util.tree_map(lambda gi: -LR * gi / X.shape[0], g), 1e-15)
