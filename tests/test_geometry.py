"""Inner products that know their open set (lenses/geometry.py): the metric laws, against hand
formulas of each metric; the moves they make are exponential maps or retractions (finite
differences, geodesic distances); and no update of any size, by any optimiser, leaves the set."""

from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import assume, given, settings, strategies as st

from categories import Covector, DomainError, OpenBall, OpenBox, Positive, Product, R, Vector
from categories.linear import pairing
from categories.numbers import too_narrow
from lenses import (BoxBarrier, InteriorMetric, LogBarrier, LossFamily, Layer, Poincare, adagrad,
                    adam, from_optax, gd, half_squared_error, momentum, nesterov, sharp, train_step)

jax.config.update("jax_enable_x64", True)

CENTER, RADIUS = np.array([1.5, -2.0, 0.5]), 0.3
LOW, HIGH = np.array([-1.0, 0.0]), np.array([2.0, 1e-3])
# A parameter point as models have them: Euclidean slots (a dense layer's (W, b), a bias, R^0)
# beside one slot of each open kind.
SPACE = Product(R(2, 2) * R(2), Positive(3), OpenBall(CENTER, RADIUS), OpenBox(LOW, HIGH, (2,)), R(0))
METRICS = {"log_barrier": LogBarrier(), "poincare": Poincare(), "box_barrier": BoxBarrier(),
           "interior": InteriorMetric()}
KINDS = {"log_barrier": (Positive,), "poincare": (OpenBall,), "box_barrier": (OpenBox,),
         "interior": (Positive, OpenBall, OpenBox)}


# -- the oracle: each metric's diagonal by its hand formula, in numpy ---------------------------

def hand_weights(name, p):
    """The diagonal of g_p per slot, from the formulas of the metrics (numpy, not the library)."""
    (W, b), pos, ball, box, _ = (jax.tree_util.tree_map(np.asarray, p[0]),) + tuple(
        None if q is None else np.asarray(q) for q in p[1:])
    kinds = KINDS[name]
    w_pos = 1.0 / pos ** 2 if Positive in kinds else np.ones(3)
    d2 = np.sum((ball - CENTER) ** 2)
    w_ball = np.full(3, (2 * RADIUS / (RADIUS ** 2 - d2)) ** 2) if OpenBall in kinds else np.ones(3)
    w_box = 1 / (box - LOW) ** 2 + 1 / (HIGH - box) ** 2 if OpenBox in kinds else np.ones(2)
    return np.concatenate([np.ones(6), w_pos, w_ball, w_box])


def flat_np(t):
    (W, b), pos, ball, box, _ = t
    return np.concatenate([np.ravel(W), b, pos, ball, box]).astype(float)


def draw_point(rng):
    """A point of SPACE, often very near the walls (within 1e-12 of them, relatively)."""
    pos = 10.0 ** rng.uniform(-6, 6, 3)
    d = rng.normal(size=3)
    ball = CENTER + RADIUS * (1 - 10.0 ** rng.uniform(-12, 0)) * d / np.linalg.norm(d)
    box = LOW + (HIGH - LOW) / (1 + np.exp(-rng.uniform(-25, 25, 2)))
    p = ((jnp.asarray(rng.normal(size=(2, 2))), jnp.asarray(rng.normal(size=2))), jnp.asarray(pos),
         jnp.asarray(ball), jnp.asarray(box), None)
    return p if SPACE.contains(p) else draw_point(rng)


def draw_tangent(rng, scale=1.0):
    return ((jnp.asarray(scale * rng.normal(size=(2, 2))), jnp.asarray(scale * rng.normal(size=2))),
            jnp.asarray(scale * rng.normal(size=3)), jnp.asarray(scale * rng.normal(size=3)),
            jnp.asarray(scale * rng.normal(size=2)), None)


@lru_cache(maxsize=None)
def laws(name):
    metric = METRICS[name]

    def run(p, u, v, c):
        U, V, C = Vector(u, SPACE), Vector(v, SPACE), Covector(c, SPACE)
        back = metric.sharp(p, metric.flat(p, U))
        forth = metric.flat(p, metric.sharp(p, C))
        cs = metric.sharp(p, C)
        return (back.value, forth.value, metric.inner(p, U, V), metric.inner(p, V, U),
                metric.inner(p, U, U), metric.inner(p, cs, V), pairing(c, v))

    return jax.jit(run)


@pytest.mark.parametrize("name", list(METRICS))
@settings(max_examples=100)
@given(seed=st.integers(0, 2**32 - 1), log_scale=st.floats(-3.0, 3.0))
def test_sharp_and_flat_are_inverse_and_inner_is_the_hand_formula(name, seed, log_scale):
    rng = np.random.default_rng(seed)
    p = draw_point(rng)
    u, v, c = (draw_tangent(rng, 10.0 ** log_scale) for _ in range(3))
    back, forth, guv, gvu, guu, g_sharp_v, cv = laws(name)(p, u, v, c)
    fu, fv, fc = flat_np(u), flat_np(v), flat_np(c)
    np.testing.assert_allclose(flat_np(back), fu, rtol=1e-12, atol=0)
    np.testing.assert_allclose(flat_np(forth), fc, rtol=1e-12, atol=0)
    w = hand_weights(name, p)
    # r² − ‖x − c‖² loses digits near the sphere (x itself is rounded, by ~eps ‖c‖): the two
    # evaluations of λ may differ by that much, and no more.
    gap = RADIUS ** 2 - np.sum((np.asarray(p[2]) - CENTER) ** 2)
    tol = 1e-10 + 64 * np.finfo(float).eps * (np.abs(CENTER).max() + RADIUS) * RADIUS / gap
    hand_uu = float(np.sum(w * fu * fu))
    assert guu > 0 and abs(float(guu) - hand_uu) <= tol * hand_uu  # SPD: Σ w_i u_i², w_i > 0
    assert np.all(w > 0)
    scale = float(np.sqrt(hand_uu * np.sum(w * fv * fv)))
    assert abs(float(guv) - float(np.sum(w * fu * fv))) <= tol * scale
    assert abs(float(guv) - float(gvu)) <= 1e-12 * scale  # symmetric
    # g_p(p'♯, v) = p'(v): the sharp represents the covector
    assert abs(float(g_sharp_v) - float(cv)) <= 1e-10 * float(np.sum(np.abs(fc * fv)))


# -- the moves: exponential maps and retractions ---------------------------------------------

def test_log_barrier_move_is_the_multiplicative_update_and_a_geodesic():
    rng = np.random.default_rng(3)
    p, c = 10.0 ** rng.uniform(-2, 2, 5), rng.normal(size=5)
    S, lr = Positive(5), 0.7
    q = np.asarray(gd(lr, metric=LogBarrier())(jnp.asarray(p), Covector(jnp.asarray(c), S)))
    np.testing.assert_allclose(q, p * np.exp(-lr * p * c), rtol=1e-13)  # p · exp(−η p p')
    # The distance of g = diag(1/p²) is ‖log q − log p‖, and a geodesic of initial velocity v
    # has covered ‖v‖_g at time 1.
    v = -lr * p ** 2 * c
    np.testing.assert_allclose(np.linalg.norm(np.log(q) - np.log(p)),
                               np.sqrt(np.sum(v ** 2 / p ** 2)), rtol=1e-12)


def _hyperbolic_distance(x, y, c, r):
    """arcosh(1 + 2 r² ‖x − y‖² / ((r² − ‖x−c‖²)(r² − ‖y−c‖²))): the Poincaré ball of radius r."""
    num = 2 * r * r * np.sum((x - y) ** 2)
    return np.arccosh(1 + num / ((r * r - np.sum((x - c) ** 2)) * (r * r - np.sum((y - c) ** 2))))


@settings(max_examples=30)
@given(seed=st.integers(0, 2**32 - 1))
def test_poincare_move_is_the_exponential_map(seed):
    rng = np.random.default_rng(seed)
    S = OpenBall(CENTER, RADIUS)
    d = rng.normal(size=3)
    x = CENTER + RADIUS * rng.uniform(0, 0.95) * d / np.linalg.norm(d)
    lam = 2 * RADIUS / (RADIUS ** 2 - np.sum((x - CENTER) ** 2))
    v = rng.normal(size=3) * rng.uniform(0.01, 8.0) / lam / np.sqrt(3)  # g-length up to ~8
    y = np.asarray(Poincare().retract(jnp.asarray(x), jnp.asarray(v), S))
    # a geodesic of initial velocity v has covered ‖v‖_g = λ ‖v‖ at time 1
    np.testing.assert_allclose(_hyperbolic_distance(x, y, CENTER, RADIUS), lam * np.linalg.norm(v),
                               rtol=1e-8)
    # and every point of it is as far along as its time says (constant speed)
    y_half = np.asarray(Poincare().retract(jnp.asarray(x), jnp.asarray(v / 2), S))
    np.testing.assert_allclose(_hyperbolic_distance(y_half, y, CENTER, RADIUS),
                               lam * np.linalg.norm(v) / 2, rtol=1e-7)


def test_box_move_is_the_logit_retraction():
    rng = np.random.default_rng(4)
    S = OpenBox(LOW, HIGH, (2,))
    x = LOW + (HIGH - LOW) * rng.uniform(0.05, 0.95, 2)
    v = rng.normal(size=2) * (HIGH - LOW)
    y = np.asarray(BoxBarrier().retract(jnp.asarray(x), jnp.asarray(v), S))
    s = np.log((x - LOW) / (HIGH - x)) + (HIGH - LOW) / ((x - LOW) * (HIGH - x)) * v
    np.testing.assert_allclose(y, LOW + (HIGH - LOW) / (1 + np.exp(-s)), rtol=1e-12)


@pytest.mark.parametrize("name", list(METRICS))
def test_every_move_starts_at_p_with_velocity_v(name):
    """R_p(0) = p bit for bit, and d/dt R_p(t v) at t = 0 is v (central finite differences)."""
    metric, rng = METRICS[name], np.random.default_rng(5)
    p, v = draw_point(rng), draw_tangent(rng)
    # a point well inside, so that the finite differences see the smooth part of the move
    p = (p[0], jnp.asarray([0.5, 1.0, 2.0]), jnp.asarray(CENTER + 0.1), jnp.asarray([0.3, 5e-4]), None)
    zero = jax.tree_util.tree_map(jnp.zeros_like, v)
    same = metric.retract(p, zero, SPACE)
    assert all(bool(jnp.all(a == b)) for a, b in zip(jax.tree_util.tree_leaves(same),
                                                     jax.tree_util.tree_leaves(p)))
    v = v[:3] + (v[3] * 1e-3,) + v[4:]  # the box's second side is 1e-3 wide: a move its size
    h = 1e-7
    scale = lambda t: jax.tree_util.tree_map(lambda a: t * a, v)  # noqa: E731
    plus, minus = metric.retract(p, scale(h), SPACE), metric.retract(p, scale(-h), SPACE)
    fd = (flat_np(plus) - flat_np(minus)) / (2 * h)
    np.testing.assert_allclose(fd, flat_np(v), rtol=1e-6, atol=1e-8)


# -- no update of any size leaves the set ----------------------------------------------------

@lru_cache(maxsize=None)
def proposer():
    opt = gd(1.0, metric=InteriorMetric())  # the learning rate enters as a scale of p'
    return jax.jit(lambda p, c: opt.propose(opt.init(p), p, Covector(c, SPACE), None, SPACE))


@settings(max_examples=200)
@given(seed=st.integers(0, 2**32 - 1), log_lr=st.floats(-4.0, 12.0), log_scale=st.floats(-3.0, 6.0))
def test_no_step_of_any_size_leaves_the_open_set(seed, log_lr, log_scale):
    rng = np.random.default_rng(seed)
    p = draw_point(rng)
    c = draw_tangent(rng, 10.0 ** (log_lr + log_scale))  # η p' with η up to 1e12
    _, q, inside = proposer()(p, c)
    assert bool(inside)
    SPACE.check(q, "the new point")  # raises DomainError naming the coordinate outside
    assert all(bool(jnp.all(jnp.isfinite(a))) for a in jax.tree_util.tree_leaves(q))


@settings(max_examples=30)
@given(seed=st.integers(0, 2**32 - 1), log_c=st.floats(-3.0, 3.0), log_r=st.floats(-3.0, 2.0),
       log_v=st.floats(0.0, 12.0))
def test_the_floating_point_clamps_hold_for_any_centre_and_size(seed, log_c, log_r, log_v):
    """The margins of the moves survive rounding of centres and walls far from 0 (un-jitted)."""
    rng = np.random.default_rng(seed)
    c, r = rng.normal(size=2) * 10.0 ** log_c, 10.0 ** log_r
    assume(not too_narrow(c - r, c + r))  # narrower sets are refused (categories.numbers.ROOM)
    ball, box = OpenBall(c, r), OpenBox(c, c + r, (2,))
    v = jnp.asarray(rng.normal(size=2) * 10.0 ** log_v)
    x_ball = jnp.asarray(c + 0.5 * r * np.array([0.6, -0.8]))
    x_box = jnp.asarray(c + r * np.array([0.3, 0.9]))
    for S, x in ((ball, x_ball), (box, x_box)):
        for sign in (1.0, -1.0):
            y = InteriorMetric().retract(x, sign * v, S)
            S.check(y, f"the move in {S!r}")


OPTIMISERS = {
    "gd": lambda m: gd(1e6, metric=m),
    "momentum": lambda m: momentum(1e3, 0.9, metric=m),
    "nesterov": lambda m: nesterov(1e3, 0.9, metric=m),  # its lookahead is a move too
    "adagrad": lambda m: adagrad(1e4, metric=m),
    "adam": lambda m: adam(1e4, metric=m),
    "optax_sgd": lambda m: from_optax(optax.sgd(1e3, momentum=0.5), metric=m),
}


@pytest.mark.parametrize("opt", list(OPTIMISERS))
@settings(max_examples=15)
@given(seed=st.integers(0, 2**32 - 1))
def test_every_optimiser_stays_inside_with_the_interior_metric(opt, seed):
    rng = np.random.default_rng(seed)
    o = OPTIMISERS[opt](InteriorMetric())
    p = draw_point(rng)
    s = o.init(p)
    for _ in range(3):  # steps raise DomainError on leaving the set (no backtracking asked for)
        s, p = o.step(s, p, Covector(draw_tangent(rng, 10.0), SPACE), None, SPACE)
        SPACE.check(o.lookahead(s, p, SPACE), "the lookahead point")


def test_euclidean_steps_of_the_same_size_leave_the_set():
    """The property above is not vacuous: the straight move of the same step leaves."""
    rng = np.random.default_rng(6)
    p, c = draw_point(rng), draw_tangent(rng, 1e3)
    with pytest.raises(DomainError):
        gd(1.0)(p, Covector(c, SPACE))
    gd(1.0, metric=InteriorMetric())(p, Covector(c, SPACE))  # does not raise


# -- per slot: where the space comes from ---------------------------------------------------

def test_euclidean_slots_move_as_p_plus_v_and_open_slots_follow_their_geometry():
    rng = np.random.default_rng(7)
    p, c = draw_point(rng), draw_tangent(rng)
    c = c[:2] + (c[2] * 1e-9, c[3] * 1e-9, None)  # straight moves that stay in the ball and box
    p = p[:1] + (jnp.asarray([0.5, 1.0, 2.0]),) + p[2:]  # where p · exp(−η p p') is not clamped
    ours = gd(0.1, metric=LogBarrier())(p, Covector(c, SPACE))
    flat = jax.tree_util.tree_map(lambda a, d: a - 0.1 * d, p, c)  # p − η p', by hand
    for i in (0, 2, 3):  # not Positive: Euclidean for LogBarrier, bit for bit p − η p'
        for a, b in zip(jax.tree_util.tree_leaves(ours[i]), jax.tree_util.tree_leaves(flat[i])):
            assert bool(jnp.all(a == b))
    assert ours[4] is None
    np.testing.assert_allclose(ours[1], p[1] * np.exp(-0.1 * p[1] * c[1]), rtol=1e-12)


def test_the_space_comes_from_the_covector_or_is_given():
    p, c = jnp.asarray([1.0, 2.0]), jnp.asarray([3.0, -1.0])
    with pytest.raises(TypeError, match="space"):
        LogBarrier().sharp(p, Covector(c))
    given = LogBarrier(space=Positive(2)).sharp(p, Covector(c)).value
    np.testing.assert_allclose(given, p ** 2 * c)
    # inside optax.chain the sharp part receives a raw pytree: the given space serves
    tx = optax.chain(sharp(LogBarrier(space=Positive(2))), optax.scale(-1.0))
    out, _ = tx.update(c, tx.init(p), p)
    np.testing.assert_allclose(out, -(p ** 2) * c)


# -- training: a model in Positive, no refused step where Euclidean steps are refused ----------

class GaussianNLL(LossFamily):
    """L_y(v) = ½ Σ_i (y_i² / v_i + log v_i): the negative log-likelihood of y ~ N(0, diag v)."""

    def value(self, c, y):
        return 0.5 * jnp.sum(y * y / c + jnp.log(c))


def _variances():
    """The model of the data: its variances v ∈ Positive(3) (the input is a constant 1)."""
    return Layer(R(1), R(3), Positive(3), lambda x, v: v * x, name="variances",
                    init=lambda k: jnp.ones((3,)))


def test_training_in_positive_refuses_no_step_where_euclidean_steps_are_refused():
    rng = np.random.default_rng(8)
    Y = rng.normal(size=(64, 3)) * np.sqrt([0.05, 1.0, 2.0])[None, :]
    X, v0, lr = np.ones((64, 1)), jnp.ones(3), 2.5
    # At v0 = 1 the two inner products agree (1/v² = 1): both sharps are the same vector,
    # ½(1 − mean y²), and the straight step of it takes the first variance below 0.
    euclid = train_step(_variances(), GaussianNLL(), gd(lr))
    state, report = euclid(euclid.init(v0), X, Y)
    with pytest.raises(DomainError, match="step 1: .*Positive"):
        report.check()
    barrier = train_step(_variances(), GaussianNLL(), gd(lr, metric=LogBarrier()))
    state = barrier.init(v0)
    for _ in range(100):
        state, report = barrier(state, X, Y)
        report.check()  # a synchronisation point: raises any refused step
    assert int(state.count) == 100  # every step taken
    # the maximum-likelihood variances of a centred Gaussian: the mean squares
    np.testing.assert_allclose(state.params, np.mean(Y ** 2, axis=0), rtol=1e-10)


def _scales():
    """x ↦ s ⊙ x with s ∈ Positive(3): per-coordinate gains."""
    return Layer(R(3), R(3), Positive(3), lambda x, s: s * x, name="gain",
                    init=lambda k: jnp.ones((3,)))


def test_adam_with_the_interior_metric_trains_inside_the_set():
    rng = np.random.default_rng(9)
    X = rng.normal(size=(32, 3))
    Y = X * np.array([0.01, 0.5, 3.0])[None, :]
    step = train_step(_scales(), half_squared_error, adam(0.5, metric=InteriorMetric()))
    state = step.init(jnp.ones(3))
    for _ in range(100):
        state, report = step(state, X, Y)
    report.check()
    assert int(state.count) == 100 and bool(jnp.all(state.params > 0))


def test_a_metric_without_retract_moves_the_point_in_a_straight_line():
    """The optimisers use `metric.retract` where the metric has one, else p + v: a duck-typed
    inner product (only `sharp`) and the base `Metric` both give the straight move."""
    from categories.linear import unwrap
    from lenses import Diagonal

    class Halves:  # g(u, v) = 2 ⟨u, v⟩, given by its sharp alone
        def sharp(self, p, cov, ctx=None):
            return Vector(jax.tree_util.tree_map(lambda c: c / 2.0, unwrap(cov)))

    p, c = jnp.asarray([1.0, -2.0]), jnp.asarray([0.5, 4.0])
    np.testing.assert_array_equal(gd(0.1, metric=Halves())(p, Covector(c, R(2))), p - 0.1 * c / 2.0)
    np.testing.assert_array_equal(Diagonal(3.0).retract(p, Vector(c)), p + c)
