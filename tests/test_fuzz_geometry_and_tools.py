"""Bad input to the geometry metrics, the diagnostics, the drawings, the layer constructors,
`Para` and `unflatten_value` gets a catalogued error and loses nothing. One fixed example per
case the audit found (each raised a raw error or returned a wrong value before), and a
Hypothesis property where it is cheap: the oracle of acceptance is written here (which inputs
are valid) and, for accepted ones, the value is computed with numpy. Un-jitted, small shapes."""

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from categories import (Covector, OpenBall, Para, ParaChain, Positive, Product, R, Smooth, Vector,
                        diagonal, pair, projection, swap, unflatten_value)
from categories.linear import unwrap
from lenses import (CheckpointError, CovectorError, DimensionError, DomainError, HyperparameterError, KindError,
                    LogBarrier, ParalensError, Poincare, ShapeError, SpaceMismatch, attention_core,
                    conv2d, dense, diagram, draw, expression, n_params, position_embedding, relu,
                    repeat, shift_step, uses)
from lenses import (as_lens, check_backward, composition_rule, copy, derived, evaluation, lens_of,
                    stacked, unroll)
from lenses.drawing.diagrams import svg
from lenses.inner_products.instruments import (check_metric, condition_number, kfac_error,
                                               metric_matrix, natural_angle)
from lenses.inner_products.metrics import Diagonal, Euclidean

FAST = settings(max_examples=30, deadline=None)
BALL = OpenBall([0.0, 0.0], 1.0)

JUNK = st.one_of(st.none(), st.integers(-2, 3), st.floats(allow_nan=True), st.text(max_size=2),
                 st.sampled_from([np.bool_(True), np.int64(1), "no", "yes", [True], b"1"]))


def _refused_or(fn):
    """fn() or None if it raised a catalogued error (anything else propagates)."""
    try:
        return fn()
    except ParalensError:
        return None


# -- 1. sharp and flat of the geometry metrics need a point of the open set -------------------

@pytest.mark.parametrize("call", [
    lambda: Poincare(BALL).sharp(jnp.array([2.0, 0.0]), Covector(jnp.ones(2), BALL)),
    lambda: Poincare(BALL).flat(jnp.array([2.0, 0.0]), Vector(jnp.ones(2), BALL)),
    lambda: LogBarrier(Positive(2)).sharp(jnp.array([-1.0, 1.0]), Covector(jnp.ones(2), Positive(2))),
    lambda: LogBarrier(Positive(2)).weights(jnp.array([-1.0, 1.0]), Positive(2)),
], ids=["poincare-sharp", "poincare-flat", "logbarrier-sharp", "logbarrier-weights"])
def test_geometry_refuses_a_point_outside_its_open_set(call):
    with pytest.raises(DomainError, match="lies outside"):
        call()


@FAST
@given(st.sampled_from(["ball", "positive"]), st.sampled_from(["sharp", "flat"]),
       st.sampled_from([np.float32, np.float64]),
       st.lists(st.floats(-2.0, 2.0).map(lambda v: round(v, 3)), min_size=2, max_size=2))
def test_geometry_sharp_and_flat_accept_exactly_the_open_set(which, op, dtype, coords):
    x = np.asarray(coords, dtype)
    c = np.asarray([1.0, -2.0], dtype)
    if which == "ball":
        metric, S = Poincare(BALL), BALL
        inside = float(np.sum(x.astype(np.float64) ** 2)) < 1.0
        lam2 = (2.0 / (1.0 - np.sum(x.astype(np.float64) ** 2))) ** 2 if inside else None
        weight = np.full(2, lam2) if inside else None
    else:
        metric, S = LogBarrier(Positive(2)), Positive(2)
        inside = bool(np.all(x > 0))
        weight = 1.0 / x.astype(np.float64) ** 2 if inside else None
    wrap = Covector if op == "sharp" else Vector
    out = _refused_or(lambda: getattr(metric, op)(jnp.asarray(x), wrap(jnp.asarray(c), S)))
    assert (out is not None) == inside, (which, x)
    if inside:
        want = c / weight if op == "sharp" else c * weight  # g = diag(weight), by hand
        rtol = 1e-4 if dtype == np.float32 else 1e-10
        np.testing.assert_allclose(np.asarray(unwrap(out), np.float64), want, rtol=rtol)


def test_geometry_sharp_under_jit_checks_nothing_and_agrees():
    # Under a trace there are no values to look at (the library checks concrete points only).
    x = jnp.array([0.5, 0.0])
    f = jax.jit(lambda p: unwrap(Poincare(BALL).sharp(p, Covector(jnp.ones(2), BALL))))
    np.testing.assert_allclose(f(x), np.full(2, ((1 - 0.25) / 2) ** 2))


# -- 2. the diagnostics ------------------------------------------------------------------------

def test_natural_angle_at_a_zero_covector_is_nan():
    assert math.isnan(natural_angle(Diagonal(2.0), jnp.zeros(2), Covector(jnp.zeros(2), R(2)),
                                    space=R(2)))


@pytest.mark.parametrize("call, error", [
    (lambda: natural_angle(Diagonal(2.0), jnp.zeros(2), Covector(jnp.array([np.nan, 1.0]), R(2))),
     DomainError),
    (lambda: condition_number(Euclidean(), None, space=R(2)), DomainError),
    (lambda: kfac_error(Euclidean(), jnp.zeros(2), Covector(jnp.ones(2), R(2)), None), KindError),
    (lambda: metric_matrix(Euclidean(), jnp.zeros(3), R(2)), DomainError),
    (lambda: metric_matrix("euclid", jnp.zeros(2), R(2)), KindError),
    (lambda: check_metric(Euclidean(), "R2"), KindError),
    (lambda: check_metric(Euclidean(), R(2), examples=0), DimensionError),
], ids=["angle-nan-covector", "condition-none", "kfac-error-euclidean", "matrix-wrong-point",
        "matrix-not-a-metric", "check-metric-space", "check-metric-examples"])
def test_diagnostics_refuse_bad_arguments(call, error):
    with pytest.raises(error):
        call()


@FAST
@given(st.lists(st.floats(-3, 3), min_size=2, max_size=2),
       st.lists(st.floats(0.25, 4.0), min_size=2, max_size=2))
def test_natural_angle_against_numpy(c, w):
    c, w = np.asarray(c), np.asarray(w)
    got = natural_angle(Diagonal(jnp.asarray(w)), jnp.zeros(2), Covector(jnp.asarray(c), R(2)))
    if not np.any(c):
        assert math.isnan(got)
        return
    c = c / np.max(np.abs(c))  # the angle is scale-free; tiny entries' squares underflow
    nat = c / w  # the sharp of diag(w)
    cos = np.dot(nat, c) / (np.linalg.norm(nat) * np.linalg.norm(c))
    assert got == pytest.approx(float(np.arccos(np.clip(cos, -1, 1))), abs=1e-6)


# -- 3. slots of a family ----------------------------------------------------------------------

def test_n_params_of_a_family_says_how_to_fix_it():
    with pytest.raises(KindError, match=r"\.at\(R\("):
        n_params(conv2d(1, 4, 3) >> relu)
    for junk in (None, 3):
        with pytest.raises(KindError):
            n_params(junk)
        with pytest.raises(KindError):
            uses(junk)


# -- 4. drawing --------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [expression, diagram, draw, svg])
def test_drawings_refuse_what_is_not_a_lens(fn):
    with pytest.raises(KindError, match="needs a lens"):
        fn(None)


def test_draw_refuses_a_bad_fontsize_or_axes():
    pytest.importorskip("matplotlib")
    with pytest.raises(HyperparameterError, match="fontsize"):
        draw(dense(2, 1), fontsize="big")
    with pytest.raises(HyperparameterError, match="fontsize"):
        svg(dense(2, 1), fontsize=-1.0)
    with pytest.raises(KindError, match="ax"):
        draw(dense(2, 1), ax=3)


def test_to_tikz_into_a_missing_directory(tmp_path):
    pytest.importorskip("discopy")
    from lenses import to_tikz

    target = os.path.join(tmp_path, "missing", "x.tikz")
    with pytest.raises(CheckpointError, match="missing"):
        to_tikz(dense(2, 1), target)
    assert not os.path.exists(os.path.dirname(target))


# -- 5. layer hyperparameters and switches -----------------------------------------------------

@pytest.mark.parametrize("call, error", [
    (lambda: attention_core(R(4, 4), 0), DimensionError),
    (lambda: attention_core(R(4, 4), 2, causal="no"), KindError),
    (lambda: position_embedding(float("nan")), HyperparameterError),
    (lambda: position_embedding(-0.5), HyperparameterError),
    (lambda: position_embedding("a"), HyperparameterError),
    (lambda: shift_step(dense(2, 3), 3), SpaceMismatch),
    (lambda: repeat(dense(2, 2), 2, remat="yes"), KindError),
], ids=["heads-0", "causal-str", "scale-nan", "scale-negative", "scale-str", "shift-step-dense",
        "remat-str"])
def test_layer_constructors_refuse_bad_hyperparameters(call, error):
    with pytest.raises(error):
        call()


@settings(max_examples=40, deadline=None)
@given(st.one_of(st.booleans(), JUNK))
def test_switches_take_only_bools(causal):
    core = _refused_or(lambda: attention_core(R(2, 2), 1, causal=causal))
    is_bool = isinstance(causal, (bool, np.bool_))
    assert (core is not None) == is_bool, causal
    if is_bool:  # causal: the first position sees only itself, so its output is V's first row
        Q = K = jnp.array([[1.0, 0.0], [0.0, 1.0]])
        V = jnp.array([[1.0, 2.0], [3.0, 4.0]])
        first = np.asarray(core(((Q, K), V), None))[0]
        e = math.exp(1.0 / math.sqrt(2.0))
        want = V[0] if causal else (e * V[0] + V[1]) / (e + 1.0)  # softmax of (1/√2, 0), by hand
        np.testing.assert_allclose(first, np.asarray(want), rtol=1e-6)


# -- 6. Para: chains compose, calls take points ------------------------------------------------

def _matmul(x, q):
    return q @ x


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3))
def test_para_chain_composes_only_matching_spaces(a, b, c, d):
    f, g = Para(R(a), R(b), R(b, a), _matmul, "f"), Para(R(c), R(d), R(d, c), _matmul, "g")
    chained, composed = _refused_or(lambda: ParaChain([f, g])), _refused_or(lambda: f >> g)
    assert (chained is not None) == (composed is not None) == (b == c), (a, b, c, d)
    if b == c:
        rng = np.random.default_rng(a * 27 + b * 9 + d)
        x, p, q = rng.normal(size=a), rng.normal(size=(b, a)), rng.normal(size=(d, c))
        np.testing.assert_allclose(np.asarray(chained(jnp.asarray(x), (jnp.asarray(p), jnp.asarray(q)))),
                                   q @ (p @ x), rtol=1e-10)


def test_para_chain_and_call_refuse_fixed_examples():
    with pytest.raises(SpaceMismatch):
        ParaChain([Para(R(2), R(3), R(3, 2), _matmul), Para(R(4), R(1), R(1, 4), _matmul)])
    with pytest.raises(KindError):
        ParaChain([])
    scale = Para(R(2), R(2), R(1), lambda x, q: x * q)
    with pytest.raises(DomainError, match="argument"):
        scale(jnp.ones(3), jnp.ones(1))
    with pytest.raises(DomainError, match="parameters"):
        scale(jnp.ones(2), jnp.ones(2))


# -- 7. unflatten_value ------------------------------------------------------------------------

@settings(max_examples=30, deadline=None)
@given(st.integers(0, 6), st.integers(1, 3), st.integers(1, 3))
def test_unflatten_value_takes_exactly_the_size(n, k, m):
    flat = jnp.arange(float(n))
    out = _refused_or(lambda: unflatten_value(flat, R(k) * R(m)))
    assert (out is not None) == (n == k + m), (n, k, m)
    if out is not None:
        np.testing.assert_array_equal(np.asarray(out[0]), np.arange(k))
        np.testing.assert_array_equal(np.asarray(out[1]), np.arange(k, k + m))


def test_unflatten_value_names_the_sizes():
    with pytest.raises(ShapeError, match=r"4 coordinates.*\(5,\)"):
        unflatten_value(jnp.arange(5.0), R(2) * R(2))
    with pytest.raises(ShapeError, match=r"2 coordinates.*\(3,\)"):
        unflatten_value(jnp.arange(3.0), R(2))


# -- 8. tangent arithmetic and junk arguments --------------------------------------------------

def test_tangent_arithmetic_keeps_to_one_space():
    with pytest.raises(SpaceMismatch):
        Vector(jnp.ones(2), R(2)) + Vector(jnp.ones(1), R(1))
    with pytest.raises(SpaceMismatch):
        Covector(jnp.ones(2), R(2)) + Covector(jnp.ones(3), R(3))
    with pytest.raises(CovectorError, match="different shapes"):
        Covector(jnp.ones(2)) + Covector(jnp.ones(3))
    # one tangent space R^2 under two spaces: added, entry by entry
    total = Covector(jnp.array([1.0, 2.0]), Positive(2)) + Covector(jnp.array([3.0, 5.0]), R(2))
    np.testing.assert_array_equal(np.asarray(total.value), [4.0, 7.0])


@settings(max_examples=30, deadline=None)
@given(st.one_of(st.integers(-3, 4), JUNK))
def test_projection_takes_an_index_of_a_factor(i):
    P = Product(R(1), R(2), R(3))
    pi = _refused_or(lambda: projection(P, i))
    valid = isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_)) and 0 <= i < 3
    assert (pi is not None) == valid, i
    if valid:
        x = (jnp.zeros(1), jnp.ones(2), 2 * jnp.ones(3))
        np.testing.assert_array_equal(np.asarray(pi(x)), np.full(int(i) + 1, float(i)))


@pytest.mark.parametrize("call, error", [
    (lambda: uses(None), KindError), (lambda: copy(None), KindError),
    (lambda: diagonal(None), KindError), (lambda: swap(R(2), None), KindError),
    (lambda: pair(Smooth(R(2), R(2), lambda x: x), 3), KindError),
    (lambda: unroll(3), KindError), (lambda: stacked("R2", 2), KindError),
    (lambda: derived(None), KindError), (lambda: lens_of(3), KindError),
    (lambda: as_lens(3), KindError), (lambda: evaluation(3), KindError),
    (lambda: check_backward(None, jnp.ones(2), None, jnp.ones(1)), KindError),
    (lambda: check_backward(dense(2, 1), jnp.ones(2), dense(2, 1).init(jax.random.PRNGKey(0)),
                            jnp.ones(1), eps=0), HyperparameterError),
], ids=["uses", "copy", "diagonal", "swap", "pair", "unroll", "stacked", "derived", "lens_of",
        "as_lens", "evaluation", "check_backward", "check_backward-eps"])
def test_junk_arguments_get_catalogued_errors(call, error):
    with pytest.raises(error):
        call()


def test_composition_rule_fixes_a_family_as_composition_does():
    f = dense(2, 3)
    rule = composition_rule(f, relu)
    assert rule.morphism.dom == composition_rule(f, relu.at(R(3))).morphism.dom
