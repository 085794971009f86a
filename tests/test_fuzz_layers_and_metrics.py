"""Fuzzing the layers and inner products: the entry points tests/test_fuzz_edges.py does not reach (metric
constructors and methods, the geometry metrics' moves, the sequence, discrete and recurrent
layers, user loss families). Each draws ≥ 50 inputs; the oracle of acceptance is written
here (which inputs are valid) and, for accepted ones, the result is computed with numpy.
An exception that is not a `ParalensError` fails the test as it is. Small, recurring
shapes, un-jitted: a few compilations only."""

import math

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from categories import Covector, OpenBall, OpenBox, Positive, R, Smooth, Vector
from lenses import (Fault, NonFiniteError, dL, dense, epoch_order, fit, gd, linear, loss_family,
                    tie, train_step)
from lenses import (BoxBarrier, LogBarrier, ParalensError, Poincare, Tokens, batched, dropout,
                    embedding, gru_cell, layer_norm, multi_head_attention, rnn_cell,
                    softmax_cross_entropy, half_squared_error, transformer_block, unroll)
from lenses.losses import LossFamily, batch_loss
from lenses.inner_products.metrics import Constant, Diagonal, Euclidean
from lenses.layers.sequence import positionwise_dense

FUZZ = settings(max_examples=50, deadline=None)

JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 6), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=2), st.complex_numbers(max_magnitude=4),
    st.sampled_from([np.int64(2), np.float32(2.0), np.bool_(True), [1, 2], (1,), b"1"]))


@st.composite
def arrays(draw, shapes=((2,), (3,), (2, 2), ()), dtypes=("float64", "int32", "complex128")):
    shape, dtype = draw(st.sampled_from(shapes)), draw(st.sampled_from(dtypes))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
    values = rng.uniform(-2, 2, shape)
    if values.size and draw(st.integers(0, 3)) == 0:
        values.flat[0] = draw(st.sampled_from([np.nan, np.inf, 0.0]))
    if dtype == "complex128":
        return values + 1j
    return values.astype(dtype) if dtype != "int32" else np.round(
        np.nan_to_num(values, posinf=2, neginf=-2)).astype(dtype)


def _refused_or(fn):
    """fn() or None if it raised a catalogued error (anything else propagates)."""
    try:
        return fn()
    except ParalensError:
        return None


def _size(x, least=1):
    """x as an int if it is an integer ≥ least (numpy's welcome, bools not), else None."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        return None
    return int(x) if x >= least else None


# -- metrics --------------------------------------------------------------------------------

@FUZZ
@given(st.one_of(JUNK, arrays()))
@example(5e-324)  # positive and finite, but subnormal: 1.5 / w overflows, so refused
@example(2.0 ** 1023)  # the flat overflows in float64 (--hypothesis-seed=0 found it)
@example(np.float32(1e-45))  # subnormal in float32, the dtype the arithmetic then uses
@example(np.array([1e-40, 1.0], np.float32))
@pytest.mark.filterwarnings("error")
def test_diagonal_takes_positive_finite_real_weights(w):
    """Accepted: real weights, each w with w and 1/w normal in the dtype the sharp and flat
    compute in (float32 for float32 weights; here, with x64, float64 for all others)."""
    metric = _refused_or(lambda: Diagonal(w))
    if w is None:  # no weights: the metric of R^0, nothing to compare
        return
    a = np.asarray(w)
    tiny = np.finfo(np.float32 if a.dtype == np.float32 else np.float64).tiny
    positive = (a.dtype.kind in "fiu" and not isinstance(w, (bool, np.bool_))
                and bool(np.all(np.isfinite(a))) and bool(np.all(a >= tiny))
                and bool(np.all(a <= 1 / tiny)))
    if not positive:
        assert metric is None, w
        return
    c = np.array([1.5, -2.0])
    fits = isinstance(w, (np.ndarray, int, float, np.number)) and a.shape in ((), (2,))
    sharp = _refused_or(lambda: metric.sharp(None, Covector(c, R(2))))
    assert (sharp is not None) == fits, w  # weights shaped like the point, or one number
    if fits:
        want = c / a
        np.testing.assert_allclose(sharp.value, want)
        np.testing.assert_allclose(metric.flat(None, Vector(c, R(2))).value, c * a)
        assert np.all(np.isfinite(sharp.value)), w  # never an infinity from accepted weights


@FUZZ
@given(st.integers(0, 2 ** 16), st.sampled_from(["spd", "asym", "neg", "nan", "rect", "singular"]))
def test_constant_takes_symmetric_positive_definite_matrices(seed, kind):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(3, 3))
    G = {"spd": A @ A.T + 0.5 * np.eye(3), "asym": A @ A.T + np.eye(3) + np.triu(np.ones((3, 3)), 1),
         "neg": -(A @ A.T) - np.eye(3), "nan": np.where(np.eye(3) > 0, np.nan, 0.0),
         "rect": rng.normal(size=(3, 2)), "singular": np.outer(A[0], A[0])}[kind]
    metric = _refused_or(lambda: Constant(G))
    if kind != "spd":
        assert metric is None, kind
        return
    v = rng.normal(size=3)
    np.testing.assert_allclose(metric.flat(None, Vector(v, R(3))).value, G @ v, rtol=1e-10)
    np.testing.assert_allclose(metric.sharp(None, Covector(G @ v, R(3))).value, v,
                               rtol=1e-6, atol=1e-8)


@FUZZ
@given(st.sampled_from(["euclid", "diag", "const"]), st.sampled_from(["sharp", "flat"]),
       st.one_of(JUNK, arrays(), st.builds(Covector, arrays(dtypes=("float64",))),
                 st.builds(Vector, arrays(dtypes=("float64",)))))
@example("diag", "flat", 8.98846567431158e+307)  # 2x overflows: +inf in the flat and the oracle
@example("const", "flat", np.array([8.98846567431158e+307, 1.0]))
@pytest.mark.filterwarnings("error")
def test_sharp_and_flat_take_covectors_and_vectors(which, op, x):
    metric = {"euclid": Euclidean(), "diag": Diagonal(2.0), "const": Constant(2.0 * np.eye(2))}[which]
    with np.errstate(over="ignore"):  # numpy's arithmetic on numpy values may overflow to ±inf
        out = _refused_or(lambda: getattr(metric, op)(jnp.zeros(2), x))
    wrong_kind = isinstance(x, Vector) if op == "sharp" else isinstance(x, Covector)
    if wrong_kind:
        assert out is None
        return
    if out is None:
        return  # junk refused
    if x is None:  # the point of R^0 and its (co)vector
        assert out.value is None
        return
    value = np.asarray(x.value if isinstance(x, (Vector, Covector)) else x)
    assert value.dtype.kind in "fiu"  # only real numbers got through
    scale = 1.0 if which == "euclid" else 2.0
    with np.errstate(over="ignore"):
        want = value / scale if op == "sharp" else value * scale
    if np.all(np.isfinite(value)):
        np.testing.assert_allclose(np.asarray(out.value), want)
    else:  # NaN goes through (the optimiser refuses a non-finite step), never made finite
        assert not np.all(np.isfinite(np.asarray(out.value)))


SPACES = {"ball": (Poincare(), OpenBall([0.0, 0.0], 1.0)),
          "positive": (LogBarrier(), Positive(2)),
          "box": (BoxBarrier(), OpenBox(-1.0, 2.0, (2,)))}


@FUZZ
@given(st.sampled_from(sorted(SPACES)), st.one_of(JUNK, arrays()), st.one_of(arrays(), JUNK),
       st.floats(-60, 60))
@example("ball", np.zeros(2), None, 1.0)  # a point inside and no vector
@example("positive", np.ones(2), None, 1.0)
@pytest.mark.filterwarnings("error")  # JAX's deprecations (shape of None) included
def test_geometry_moves_start_inside_and_end_inside(which, p, v, scale):
    metric, S = SPACES[which]
    v = v * scale if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v
    new = _refused_or(lambda: metric.retract(p, v, S))
    p_ok = (isinstance(p, np.ndarray) and p.shape == (2,) and p.dtype.kind in "fiu"
            and S.contains(p))
    v_ok = (isinstance(v, np.ndarray) and v.shape == (2,) and v.dtype.kind in "fiu"
            and np.all(np.isfinite(v)))
    if not p_ok:
        assert new is None, (p, v)
        return
    if new is None:
        assert not v_ok, v
        return
    if v_ok:
        assert S.contains(np.asarray(new)), (p, v, new)


# -- sequence, discrete and recurrent layers -----------------------------------------------------

@FUZZ
@given(st.sampled_from(["layer_norm", "mha", "block", "positionwise", "rnn", "gru", "embedding"]),
       st.one_of(st.integers(-1, 8), JUNK), st.one_of(st.integers(-1, 4), JUNK),
       st.one_of(st.floats(-1, 1), JUNK))
def test_sequence_discrete_and_recurrent_constructors(which, a, b, x):
    make = {"layer_norm": lambda: layer_norm(a, eps=x), "mha": lambda: multi_head_attention(a, b),
            "block": lambda: transformer_block(a, b, 4), "positionwise": lambda: positionwise_dense(a, b),
            "rnn": lambda: rnn_cell(a, b), "gru": lambda: gru_cell(a, b),
            "embedding": lambda: embedding(a, b)}[which]
    lens = _refused_or(make)
    A, B = _size(a), _size(b)
    valid = {"layer_norm": A is not None and isinstance(x, (float, int, np.floating))
             and not isinstance(x, (bool, np.bool_)) and math.isfinite(float(x)) and x > 0,
             "mha": A is not None and B is not None and A % B == 0,
             "block": A is not None and B is not None and A % B == 0,
             "positionwise": A is not None and B is not None, "rnn": A is not None and B is not None,
             "gru": A is not None and B is not None, "embedding": A is not None and B is not None}
    assert (lens is not None) == valid[which], (which, a, b, x)


@FUZZ
@given(st.one_of(JUNK, st.floats(-0.5, 1.5)))
def test_dropout_takes_a_rate_in_zero_one(rate):
    lens = _refused_or(lambda: dropout(rate))
    valid = (isinstance(rate, (int, float, np.integer, np.floating))
             and not isinstance(rate, (bool, np.bool_)) and 0 <= float(rate) < 1)
    assert (lens is not None) == valid, rate


E = np.arange(10.0).reshape(2, 5)  # the embedding's columns: d = 2, V = 5
EMB = embedding(5, 2).at(Tokens(3, 5))


@FUZZ
@given(st.integers(0, 2 ** 16), st.sampled_from(["int32", "float64", "uint32", "bool", "complex"]),
       st.sampled_from(["ok", "high", "negative", "half", "near", "nan"]),
       st.sampled_from([(2, 3), (1, 3), (2, 4), (3,)]))
def test_batched_embedding_takes_token_ids_in_range(seed, dtype, kind, shape):
    rng = np.random.default_rng(seed)
    X = rng.integers(0, 5, shape).astype(float)
    if kind != "ok":
        X.flat[rng.integers(X.size)] = {"high": 5, "negative": -1, "half": 2.5, "near": 2.25,
                                        "nan": np.nan}[kind]
    if dtype in ("int32", "uint32") and np.all(np.isfinite(X)) and np.all(X == np.round(X)) \
            and (dtype == "int32" or np.all(X >= 0)):
        X = X.astype(dtype)
    elif dtype == "bool":
        X = X != 0
    elif dtype == "complex":
        X = X + 0j
    out = _refused_or(lambda: batched(EMB).forward(X, E))
    valid = len(shape) == 2 and shape[1] == 3 and X.dtype.kind in "fiu" and kind in ("ok", "near")
    assert (out is not None) == valid, (X, kind)
    if valid:
        idx = np.round(np.asarray(X, float)).astype(int)
        np.testing.assert_allclose(np.asarray(out), np.transpose(E[:, idx], (1, 2, 0)))


CELL = rnn_cell(2, 3)


@FUZZ
@given(st.sampled_from([R(4, 2), R(4, 3), R(2), R(1, 2), Positive(4, 2), R(2, 2, 2)]))
def test_unroll_fits_sequences_of_the_cells_input(A):
    lens = _refused_or(lambda: unroll(CELL).at(A))
    valid = len(A.shape) == 2 and A.shape[1] == 2  # sequences of the cell's inputs (in any open set)
    assert (lens is not None) == valid, A


# -- user loss families ------------------------------------------------------------------------

def scaled_ce(y):
    return 0.25 * softmax_cross_entropy(y)


def mixed(y):
    return 0.5 * half_squared_error(y) + 2.0 * half_squared_error(y)


@FUZZ
@given(st.integers(0, 2 ** 16), st.sampled_from(["onehot", "soft", "unnormalised", "negative",
                                                 "nan", "shape"]),
       st.sampled_from(["scaled_ce", "mixed"]))
def test_user_loss_families_built_from_builtin_ones(seed, kind, which):
    rng = np.random.default_rng(seed)
    C = rng.normal(size=(3, 4))
    Y = np.eye(4)[rng.integers(0, 4, 3)]
    if kind == "soft":
        Y = rng.dirichlet(np.ones(4), 3)
    elif kind == "unnormalised":
        Y = Y * 0.5
    elif kind == "negative":
        Y = Y - 0.5
    elif kind == "nan":
        Y[0, 0] = np.nan
    elif kind == "shape":
        Y = Y[:, :3]
    family = {"scaled_ce": scaled_ce, "mixed": mixed}[which]
    L = _refused_or(lambda: batch_loss(family, Y, "mean"))
    if which == "scaled_ce":  # probability vectors (a cut one-hot one may still be one)
        valid = kind in ("onehot", "soft") or (kind == "shape" and np.allclose(Y.sum(1), 1))
    else:
        valid = kind != "nan"
    assert (L is not None) == valid, (which, kind)
    if not valid:
        return
    if kind == "shape":  # a valid target for another output space: its loss refuses C
        assert _refused_or(lambda: L(C)) is None
        return
    value = float(L(C))
    if which == "scaled_ce":
        logp = C - np.log(np.sum(np.exp(C), axis=1, keepdims=True))
        want = 0.25 * np.mean(-np.sum(Y * logp, axis=1))
    else:
        want = 2.5 * np.mean(0.5 * np.sum((C - Y) ** 2, axis=1))
    np.testing.assert_allclose(value, want, rtol=1e-10)


# -- round three: the last families of malformed arguments (issue 40) ---------------------------
# Each test's fixed examples fail on the code before it: a raw error of Python, NumPy or JAX,
# or a result where the argument is malformed.


@FUZZ
@given(JUNK)
@example(None)
@example("abc")
def test_smooth_takes_a_function(fn):
    made = _refused_or(lambda: Smooth(R(2), R(2), fn))
    assert (made is not None) == callable(fn), fn


@FUZZ
@given(st.integers(1, 4), st.integers(1, 4))
@example(3, 2)  # declared R^2 → R^3, gives a 2-vector: the composite evaluated before
def test_a_composite_checks_what_each_map_gives_the_next(declared, given_):
    f = Smooth(R(2), R(declared), lambda x: x[0] * jnp.ones(given_), "f")
    g = Smooth(R(declared), R(), lambda y: jnp.sum(y), "g")
    got = _refused_or(lambda: (f >> g)(jnp.ones(2)))
    assert (got is not None) == (declared == given_)
    if got is not None:
        assert float(got) == declared  # Σ of `declared` ones


@FUZZ
@given(st.one_of(JUNK, st.sampled_from([[], np.zeros((0, 0)), [["a", "b"], ["c", "d"]]])))
@example(None)
@example("ab")
@example(np.zeros((0, 0)))
def test_constant_refuses_what_is_not_a_matrix(G):
    """None of these is a symmetric positive-definite matrix on R^2."""
    assert _refused_or(lambda: Constant(G, R(2))) is None, G


@FUZZ
@given(JUNK)
@example(0)
@example(None)
def test_init_takes_a_prng_key(key):
    """No value of JUNK is a key (a seed is not one): each refused by a catalogued error."""
    assert _refused_or(lambda: dense(2, 1).init(key)) is None, key


@FUZZ
@given(st.sampled_from([Euclidean, Diagonal, Constant]))
@example(Euclidean)
def test_an_optimiser_takes_a_metric_not_its_class(cls):
    assert _refused_or(lambda: gd(0.1, metric=cls)) is None


@FUZZ
@given(st.sampled_from(["none", "other", "own"]))
@example("none")
def test_an_optimiser_steps_only_on_a_covector_of_the_points_space(which):
    model = dense(2, 1)
    p = (jnp.ones((1, 2)), jnp.zeros(1))
    space = {"none": None, "other": Positive(1, 2) * Positive(1), "own": model.param}[which]
    opt = gd(0.1)
    moved = _refused_or(lambda: opt.step(opt.init(p), p, Covector(p, space), space=model.param))
    assert (moved is not None) == (which == "own")
    if moved is not None:  # p − 0.1 p
        np.testing.assert_allclose(moved[1][0], 0.9 * np.ones((1, 2)))


@FUZZ
@given(st.one_of(st.lists(st.integers(0, 1), min_size=2, max_size=2),
                 st.dictionaries(st.integers(0, 1), st.integers(0, 1), min_size=1, max_size=2),
                 st.sets(st.integers(0, 1), min_size=2, max_size=2)))
@example({0: 1})
@example({0, 1})
def test_tie_takes_a_list_of_slots(slots):
    layer = linear(2, 2)
    tied = _refused_or(lambda: tie(layer >> layer, slots))
    accepted = isinstance(slots, list) and sorted(set(slots)) == [0, 1]
    assert (tied is not None) == accepted, slots


@FUZZ
@given(st.integers(-2 ** 40, 2 ** 40))
@example(-1)  # was seed 2^32 − 1, silently
@example(2 ** 32)  # was seed 0, silently
def test_a_seed_is_a_non_negative_32_bit_integer(seed):
    order = _refused_or(lambda: epoch_order(seed, 1, 8, 4))
    assert (order is not None) == (0 <= seed < 2 ** 32), seed


@FUZZ
@given(st.lists(st.integers(-5, 5), min_size=2, max_size=2))
@example([1, 2])
def test_dl_at_an_integer_output_is_the_differential_at_that_point(c):
    """Accepted: an integer-valued output is a point of R^2; dL of ½|c − y|² is c − y."""
    y = np.array([0.5, -1.0])
    got = dL(half_squared_error(y), np.array(c, np.int32))
    np.testing.assert_allclose(got.value, np.array(c) - y)


def test_a_fault_is_raised_to_a_reader_of_parameters_through_check_and_by_fit():
    """The documented way to read parameters, `state.check().params`, raises a pending fault;
    `fit` raises it at the end of its chunk."""
    model = dense(2, 1)
    p = (jnp.ones((1, 2)), jnp.zeros(1))
    X, Y = np.ones((8, 2)), np.zeros((8, 1))
    X[5, 0] = np.nan
    step = train_step(model, half_squared_error, gd(0.1))
    state, _ = step(step.init(p), X[4:], Y[4:])
    with pytest.raises(NonFiniteError, match="step 1") as e:
        state.check().params
    assert e.value.kind == Fault.COVECTOR
    with pytest.raises(NonFiniteError):
        fit(model, half_squared_error, gd(0.1), p, (X, Y), epochs=1, batch_size=4, key=0,
            progress=False)


class _Declared(LossFamily):
    """A user's family whose output_space returns `space` (drawn: a Space or not)."""

    def __init__(self, space):
        self.space = space

    def value(self, c, y):
        return jnp.sum((c - y) ** 2)

    def output_space(self, y):
        return self.space


@FUZZ
@given(st.one_of(JUNK, st.sampled_from([R(2), R(3), (2,), [2]])))
@example((2,))  # an AttributeError deep in the batch loss before
def test_a_loss_family_must_declare_a_space(space):
    """Accepted: a Space of the targets' shape (2,); refused, by a catalogued error, else."""
    family = _Declared(space)
    got = _refused_or(lambda: batch_loss(family, np.ones((3, 2)))(np.zeros((3, 2))))
    assert (got is not None) == (space == R(2)), space
    if got is not None:
        assert float(got) == 6.0  # Σ over 3 examples of |0 − 1|² over 2 coordinates


@FUZZ
@given(st.integers(-3, 6))
@example(7 - 4)  # the label 3 of 3 classes: trained on as class 2 before
def test_a_user_family_wrapping_softmax_cross_entropy_refuses_labels_out_of_range(label):
    """Inside a compiled step a user's family cannot be asked about its targets; the label's
    loss is NaN, value and covector, so the step is refused (for a label in range: the
    covector softmax(z) − onehot(y) of the composite, by numpy)."""
    family = loss_family(lambda y: softmax_cross_entropy(classes=3)(y))
    model = dense(2, 3)
    p = (jnp.zeros((3, 2)), jnp.array([1.0, 0.0, -1.0]))
    step = train_step(model, family, gd(1.0))
    state, report = step(step.init(p), np.zeros((1, 2)), np.array([label], np.int32))
    if 0 <= label < 3:
        z = np.array([1.0, 0.0, -1.0])
        pi = np.exp(z - np.logaddexp.reduce(z))
        np.testing.assert_allclose(state.params[1], z - (pi - np.eye(3)[label]), rtol=1e-6)
    else:
        with pytest.raises(NonFiniteError):
            report.check()
        assert np.array_equal(state.params[1], p[1])
