"""Malformed inputs at every public entry point meet a catalogued error, or, where the input
is legitimately accepted, the documented result: never an internal error (AttributeError,
IndexError, KeyError, ZeroDivisionError, a raw JAX or numpy error), a hang, or a silent
result.

Each test draws ≥ 60 inputs (`FUZZ`). The oracle of acceptance is written here, apart from
the library: which inputs are valid (integers in range, arrays of the right shape holding
finite real numbers, ...) and, for those, the result computed with numpy. An exception that
is not a `ParalensError` fails the test as it is. Few shapes recur, so that accepted inputs
reuse a few compilations.
"""

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from categories import Covector, OpenBall, OpenBox, Positive, R, Vector
from lenses import (CheckpointError, Euclidean, ParalensError, accuracy, batched,
                    checkpoint, conv2d, dense, fit, gd, half_squared_error, linear, load, predict,
                    repeat, save, softmax_cross_entropy, tanh, tie, train_step)
from lenses.layers.basic import bias

FUZZ = settings(max_examples=60, deadline=None)

# -- what is drawn ---------------------------------------------------------------------------------

JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 6), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=2), st.complex_numbers(max_magnitude=4), st.sampled_from(
        [np.int64(2), np.int32(0), np.float32(2.0), np.bool_(True), [1, 2], (1,), "sqrt", b"1"]))

SHAPES = [(), (1,), (2,), (3,), (2, 2), (2, 3), (4, 2), (1, 2), (4, 3), (0, 2), (4, 2, 1)]
DTYPES = ["float64", "float32", "int32", "bool", "complex128", "<U1"]


@st.composite
def arrays(draw, shapes=SHAPES, dtypes=DTYPES):
    """An array of a drawn shape and dtype, its values drawn small, sometimes NaN or ±inf."""
    shape, dtype = draw(st.sampled_from(shapes)), draw(st.sampled_from(dtypes))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
    values = rng.uniform(-2, 2, shape)
    if dtype.startswith("float") and values.size and draw(st.integers(0, 4)) == 0:
        values.flat[draw(st.integers(0, values.size - 1))] = draw(
            st.sampled_from([np.nan, np.inf, -np.inf]))
    if dtype == "<U1":
        return np.full(shape, "a")
    if dtype == "complex128":
        return values + 1j
    return values.astype(dtype) if dtype != "bool" else values > 0


ANY = st.one_of(JUNK, arrays(), st.tuples(arrays(), arrays()))


def outcome(attempt):
    """('ok', result) or ('refused', error) for a catalogued error; anything else escapes."""
    try:
        return "ok", attempt()
    except ParalensError as e:
        assert str(e), "a catalogued error must say why"
        return "refused", e


def int_at_least(x, least):
    """The oracle for sizes: an int (numpy's too), not a bool, ≥ least."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) and x >= least


def real_finite_array(x, shape):
    """The oracle for points and batches: an array of `shape` holding finite reals."""
    if isinstance(x, (bool, np.bool_)) or not hasattr(x, "shape") or tuple(x.shape) != shape:
        return False
    kind = np.asarray(x).dtype.kind
    return kind in "iuf" and (kind != "f" or bool(np.all(np.isfinite(x))))


def scalar_point(x):
    return (isinstance(x, (int, float, np.integer, np.floating))
            and not isinstance(x, (bool, np.bool_)) and math.isfinite(float(x)))


# -- spaces --------------------------------------------------------------------------------------

@FUZZ
@given(st.lists(JUNK, max_size=3))
def test_R_takes_non_negative_integer_dimensions(dims):
    kind, S = outcome(lambda: R(*dims))
    valid = all(int_at_least(d, 0) for d in dims) and (0 not in dims or list(dims) == [0])
    assert (kind == "ok") == valid, (dims, S)
    if valid:
        assert S.shape == tuple(int(d) for d in dims)


@FUZZ
@given(st.lists(JUNK, max_size=3))
def test_Positive_takes_positive_integer_dimensions(dims):
    kind, S = outcome(lambda: Positive(*dims))
    valid = all(int_at_least(d, 1) for d in dims)
    assert (kind == "ok") == valid, (dims, S)
    if valid:
        assert S.shape == tuple(int(d) for d in dims)


@FUZZ
@given(st.one_of(JUNK, arrays()), st.one_of(JUNK, arrays()),
       st.one_of(st.none(), st.sampled_from([(2,), (), (2, 2), (0,), (-1,), 2, "x"])))
def test_OpenBox_is_accepted_only_with_real_bounds_low_below_high(low, high, shape):
    kind, box = outcome(lambda: OpenBox(low, high, shape))
    if kind == "ok":
        lo, hi = np.asarray(low), np.asarray(high)
        assert lo.dtype.kind in "iuf" and hi.dtype.kind in "iuf"
        assert box.shape == (np.broadcast_shapes(lo.shape, hi.shape) if shape is None else shape)
        assert np.all(np.broadcast_to(lo, box.shape) < np.broadcast_to(hi, box.shape))


@FUZZ
@given(st.one_of(JUNK, arrays()), JUNK)
def test_OpenBall_is_accepted_only_with_a_real_center_and_a_positive_radius(center, radius):
    kind, ball = outcome(lambda: OpenBall(center, radius))
    if kind == "ok":
        c = np.asarray(center)
        assert c.dtype.kind in "iuf" and np.all(np.isfinite(c)) and 0 not in c.shape
        assert scalar_point(radius) and float(radius) > 0 and ball.shape == c.shape


SPACES = [R(2), R(), R(0), Positive(2), OpenBox(-1.0, 1.0, (2,)), OpenBall([0.0, 0.0], 1.5),
          R(2) * Positive(1)]


def member(S, x) -> bool:
    """Membership, written with numpy."""
    if S == R(0):
        return x is None
    if S == R(2) * Positive(1):
        return isinstance(x, tuple) and len(x) == 2 and member(R(2), x[0]) and member(Positive(1), x[1])
    if S == R():
        ok = scalar_point(x) or real_finite_array(x, ())
    else:
        ok = real_finite_array(x, S.shape)
    if not ok:
        return False
    a = np.asarray(x, float)
    if isinstance(S, Positive):
        return bool(np.all(a > 0))
    if isinstance(S, OpenBox):
        return bool(np.all((a > -1) & (a < 1)))
    if isinstance(S, OpenBall):
        return bool(np.sqrt(np.sum(a * a)) < 1.5)
    return True


@FUZZ
@given(st.sampled_from(SPACES), ANY)
def test_check_refuses_what_is_not_a_point(S, x):
    kind, got = outcome(lambda: S.check(x))
    assert (kind == "ok") == member(S, x), (S, x, got)
    if kind == "ok":
        assert got is x
    else:
        assert type(got).__name__ == "DomainError"


# -- layers and combinators ------------------------------------------------------------------------

@FUZZ
@given(st.sampled_from(["dense", "linear", "bias"]), JUNK, JUNK)
def test_layer_sizes_are_positive_integers(which, a, b):
    make = {"dense": lambda: dense(a, b), "linear": lambda: linear(a, b), "bias": lambda: bias(a)}
    kind, layer = outcome(make[which])
    valid = int_at_least(a, 1) and (which == "bias" or int_at_least(b, 1))
    assert (kind == "ok") == valid, (which, a, b, layer)
    if valid:
        assert layer.dom == R(int(a)) and layer.cod == R(int(a) if which == "bias" else int(b))


@FUZZ
@given(st.one_of(st.integers(-1, 3), JUNK), st.one_of(st.integers(0, 3), JUNK),
       st.one_of(st.integers(0, 6), st.tuples(st.integers(0, 3), st.integers(1, 3)), JUNK),
       st.one_of(st.integers(0, 3), JUNK), st.sampled_from(["VALID", "SAME", "same", 0, 1, -1, "x", 1.5]))
@example(1, 1, 6, 1, "VALID")  # a kernel larger than the input, with padding named
def test_conv2d_sizes_and_the_input_they_fit(cin, cout, kernel, stride, padding):
    kind, fam = outcome(lambda: conv2d(cin, cout, kernel, stride, padding))
    def pair(k):  # an int or a pair of them (documented), as a pair; None if neither
        return tuple(k) if isinstance(k, (tuple, list)) and len(k) == 2 else \
            None if isinstance(k, (tuple, list)) else (k, k)

    ks, ss = pair(kernel), pair(stride)
    valid = (int_at_least(cin, 1) and int_at_least(cout, 1) and ks is not None and ss is not None
             and all(int_at_least(k, 1) for k in ks + ss)
             and (padding in ("VALID", "SAME", "same") or int_at_least(padding, 0)))
    assert (kind == "ok") == valid, (cin, cout, kernel, stride, padding, fam)
    if valid:
        kind, layer = outcome(lambda: fam.at(R(int(cin), 5, 5)))
        pad = 0 if isinstance(padding, str) else int(padding)
        fits = isinstance(padding, str) and padding.upper() == "SAME" or all(5 + 2 * pad >= k for k in ks)
        assert (kind == "ok") == fits
        if fits and (not isinstance(padding, str) or padding == "VALID"):  # the sizes it fits
            out = [(5 + 2 * pad - k) // int(t) + 1 for k, t in zip(ks, ss)]
            assert layer.cod == R(int(cout), *out)


MLP = dense(2, 2) >> tanh >> dense(2, 2)  # slots 0 and 2 share a parameter object, slot 1 is R^0


@FUZZ
@given(st.lists(st.one_of(st.integers(-2, 4), JUNK), max_size=4))
def test_tie_takes_integer_slots_of_the_same_parameter_object(slots):
    kind, tied = outcome(lambda: tie(MLP, slots))
    ints = all(int_at_least(s, 0) for s in slots)
    valid = ints and {int(s) for s in slots} == {0, 2}
    assert (kind == "ok") == valid, (slots, tied)
    if valid:
        assert tied.param == R(2, 2) * R(2) * R(0)


@FUZZ
@given(st.one_of(JUNK, st.integers(-1, 4)), st.sampled_from(["checkpoint", "repeat"]))
def test_segments_and_copies_are_positive_integers(k, which):
    if which == "checkpoint":
        kind, lens = outcome(lambda: checkpoint(MLP, segments=k))
        valid = k is None or k == "sqrt" or int_at_least(k, 1)
        assert (kind == "ok") == valid, (k, lens)
        if valid:
            assert lens.param == MLP.param
    else:
        kind, lens = outcome(lambda: repeat(dense(2, 2), k))
        valid = int_at_least(k, 1)
        assert (kind == "ok") == valid, (k, lens)
        if valid:
            assert lens.param == R(int(k), 2, 2) * R(int(k), 2)


@FUZZ
@given(st.one_of(JUNK, st.sampled_from(["model", 3])))
def test_combinators_refuse_what_is_not_a_lens(x):
    for combinator in (batched, checkpoint, lambda m: repeat(m, 2), lambda m: tie(m, [0, 1])):
        kind, _ = outcome(lambda: combinator(x))
        assert kind == "refused"


# -- evaluation ------------------------------------------------------------------------------------

LAYER = dense(2, 3)
W = np.array([[0.5, -1.0], [2.0, 0.25], [-0.75, 1.5]])
B = np.array([0.1, -0.2, 0.3])
PL = (jnp.asarray(W), jnp.asarray(B))


@FUZZ
@given(st.one_of(arrays(shapes=[(4, 2), (1, 2), (4, 3), (0, 2), (4, 2, 1), (2,), ()]), JUNK))
@example(np.arange(8.0).reshape(4, 2))  # accepted: the oracle's result is checked too
def test_batched_forward_takes_a_batch_of_points_of_the_domain(X):
    kind, out = outcome(lambda: batched(LAYER).forward(X, PL))
    valid = hasattr(X, "shape") and X.ndim == 2 and X.shape[0] >= 1 and \
        real_finite_array(X, (X.shape[0], 2))
    assert (kind == "ok") == valid, (X, out)
    if valid:
        np.testing.assert_allclose(out, np.asarray(X, float) @ W.T + B, rtol=1e-6)


COTANGENTS = st.one_of(JUNK, arrays(shapes=[(3,), (2,), (1, 3)]),
                       # a Covector on R(3) is checked when built: only real ones can be built
                       arrays(shapes=[(3,)], dtypes=["float64"]).map(lambda a: Covector(a, R(3))),
                       arrays(shapes=[(3,)], dtypes=["float64"]).map(Vector))


@FUZZ
@given(st.one_of(arrays(shapes=[(2,), (3,), (1, 2), ()]), JUNK), COTANGENTS)
@example(np.array([0.5, -1.0]), Covector(np.array([1.0, 2.0, -1.0]), R(3)))
@example(np.array([1, 2], np.int32), np.array([1, 0, 2], np.int32))
def test_lens_forward_and_backward_take_points_and_covectors(x, c):
    kind, out = outcome(lambda: LAYER.forward(x, PL))
    assert (kind == "ok") == member(R(2), x), (x, out)
    if kind == "ok":
        np.testing.assert_allclose(out, np.asarray(x, float) @ W.T + B, rtol=1e-6)
    kind, back = outcome(lambda: LAYER.backward(x, PL, c))
    value = c.value if isinstance(c, Covector) else c
    c_ok = not isinstance(c, Vector) and hasattr(value, "shape") and value.shape == (3,) and \
        np.asarray(value).dtype.kind in "iuf"
    assert (kind == "ok") == (member(R(2), x) and c_ok), (x, c, back)
    if kind == "ok":
        a_cov, p_cov = back
        cv, xv = np.asarray(value, float), np.asarray(x, float)
        np.testing.assert_allclose(a_cov.value, W.T @ cv, rtol=1e-6, atol=1e-12)
        np.testing.assert_allclose(p_cov.value[0], np.outer(cv, xv), rtol=1e-6, atol=1e-12)


# -- learning --------------------------------------------------------------------------------------

LIN = dense(2, 2)
PLIN = (jnp.asarray(np.array([[0.5, -1.0], [2.0, 0.25]])), jnp.asarray(np.array([0.1, -0.2])))
MODELS = {"lens": LIN, "family": tanh, "str": "model", "none": None, "int": 3}
LOSSES = {"family": half_squared_error, "loss": half_squared_error(jnp.ones(2)), "str": "mse",
          "none": None, "classes": softmax_cross_entropy(classes=2)}
OPTS = {"gd": gd(0.1), "optax": optax.sgd(0.1), "str": "adam", "none": None, "float": 0.1}


@FUZZ
@given(st.sampled_from(sorted(MODELS)), st.sampled_from(sorted(LOSSES)), st.sampled_from(sorted(OPTS)),
       st.sampled_from(["mean", "sum", "avg", None, 1]))
def test_train_step_construction(m, loss, opt, reduction):
    kind, step = outcome(lambda: train_step(MODELS[m], LOSSES[loss], OPTS[opt], reduction))
    valid = m == "lens" and loss in ("family", "classes") and opt in ("gd", "optax") and \
        reduction in ("mean", "sum")
    assert (kind == "ok") == valid, (m, loss, opt, reduction, step)


STEP = train_step(LIN, half_squared_error, gd(0.1))
STATE = STEP.init(PLIN)
STATES = {"state": STATE, "params": PLIN, "none": None,
          "broken": STATE._replace(params=(PLIN[0], None)),
          "other": train_step(dense(2, 3), half_squared_error, gd(0.1)).init(PL)}


@FUZZ
@given(st.sampled_from(sorted(STATES)),
       st.one_of(arrays(shapes=[(4, 2), (4, 3), (0, 2), (4, 2, 1), (2,)]), JUNK),
       st.one_of(arrays(shapes=[(4, 2), (3, 2), (4, 1), (4,)]), JUNK))
@example("state", np.arange(8.0).reshape(4, 2), np.ones((4, 2)))
@example("state", np.arange(8).reshape(4, 2), np.ones((4, 2), np.float32))
@example("state", np.full((4, 2), np.nan), np.ones((4, 2)))
def test_train_step_call(s, X, Y):
    def attempt():
        new, report = STEP(STATES[s], X, Y)
        report.check()
        return new

    kind, new = outcome(attempt)
    valid = s == "state" and real_finite_array(X, (4, 2)) and real_finite_array(Y, (4, 2))
    if s == "state" and X is not None and hasattr(X, "shape") and hasattr(Y, "shape") and \
            X.shape == (4, 2) and Y.shape == (4, 2) and X.dtype.kind in "iuf" and Y.dtype.kind in "iuf":
        # NaN or infinity in the data is a recorded fault, raised at the synchronisation point
        assert kind == ("ok" if valid else "refused"), (X, Y, new)
    else:
        assert kind == "refused" or valid, (s, X, Y, new)
    if kind == "ok":
        Wn, bn = (np.asarray(a) for a in PLIN)
        x, y = np.asarray(X, float), np.asarray(Y, float)
        r = x @ Wn.T + bn - y  # mean ½‖W x + b − y‖²: its gradient
        np.testing.assert_allclose(new.params[0], Wn - 0.1 * r.T @ x / 4, rtol=1e-6)
        np.testing.assert_allclose(new.params[1], bn - 0.1 * r.mean(0), rtol=1e-6)


XF = np.random.default_rng(0).normal(size=(8, 2))
YF = np.random.default_rng(1).normal(size=(8, 2))
DATA = {"good": (XF, YF), "short x": (XF[:6], YF), "short y": (XF, YF[:6]), "wide": (XF, np.ones((8, 5))),
        "empty": (XF[:0], YF[:0]), "rank": (XF[:, :, None], YF), "none": None, "one": (XF,),
        "strings": (np.full((8, 2), "a"), YF)}


@FUZZ
@given(st.sampled_from(sorted(DATA)), st.one_of(st.integers(-2, 9), JUNK),
       st.one_of(st.integers(-3, 0), JUNK), st.one_of(st.none(), st.integers(-1, 3), JUNK),
       st.one_of(st.none(), st.integers(-1, 3)), st.sampled_from([None, "good", "wide"]))
@example("good", 4, 0, None, None, "good")
@example("good", np.int64(3), np.int32(0), 2, 0, None)
@example("good", 9, 2, None, None, None)  # one row more than the data has
@example("good", 9, 0, None, None, None)
def test_fit_arguments(data, batch_size, epochs, dispatch, max_steps, eval_data):
    evals = {None: None, "good": (XF, np.arange(8) % 2), "wide": (XF, np.ones((8, 5)))}
    kind, got = outcome(lambda: fit(LIN, half_squared_error, gd(0.1), PLIN, DATA[data],
                                    epochs=epochs, batch_size=batch_size, steps_per_dispatch=dispatch,
                                    max_steps=max_steps, eval_data=evals[eval_data]))
    # batches of exactly batch_size: more than the 8 rows is refused, not shrunk to 8
    valid = (data == "good" and int_at_least(batch_size, 1) and int(batch_size) <= 8
             and int_at_least(epochs, 0)
             and (dispatch is None or int_at_least(dispatch, 1))
             and (max_steps is None or max_steps >= 0) and eval_data in (None, "good"))
    assert (kind == "ok") == valid, (data, batch_size, epochs, dispatch, max_steps, eval_data, got)
    if valid and int(epochs) == 0:  # no epoch asked for: nothing runs, nothing moves
        state, history = got
        assert history == [] and int(state.count) == 0
        assert all(np.array_equal(a, b) for a, b in zip(state.params, PLIN))
    elif valid:  # JUNK can draw a valid count: that many epochs of 8 // batch_size steps each
        state, history = got
        steps = int(epochs) * (8 // int(batch_size))
        assert int(state.count) == (steps if max_steps is None else min(steps, max_steps))


COVECTORS = st.one_of(
    JUNK, st.just(Vector(PLIN)), st.just(PLIN),
    st.tuples(arrays(shapes=[(2, 2), (2,), (2, 3)], dtypes=["float64"]),
              arrays(shapes=[(2,), (3,)], dtypes=["float64"])).map(Covector),
    arrays(shapes=[(2, 2)], dtypes=["float64"]).map(Covector))


@FUZZ
@given(COVECTORS)
@example(Covector((jnp.ones((2, 2)), jnp.arange(2.0))))
def test_update_steps_on_a_covector_shaped_like_the_point(c):
    kind, new = outcome(lambda: gd(0.1, metric=Euclidean())(PLIN, c))
    valid = isinstance(c, Covector) and isinstance(c.value, tuple) and \
        c.value[0].shape == (2, 2) and c.value[1].shape == (2,) and \
        all(np.all(np.isfinite(a)) for a in c.value)
    assert (kind == "ok") == valid, (c, new)
    if valid:
        for a, p, g in zip(new, PLIN, c.value):
            np.testing.assert_allclose(a, np.asarray(p) - 0.1 * g, rtol=1e-12)


@FUZZ
@given(st.one_of(COVECTORS, arrays()))
def test_sharp_refuses_a_vector_and_is_the_identity_on_covectors(c):
    kind, v = outcome(lambda: Euclidean().sharp(PLIN, c))
    value = c.value if isinstance(c, (Covector, Vector)) else c
    leaves = jax.tree_util.tree_leaves(value)
    real = all((np.asarray(a).dtype.kind in "iuf") and not isinstance(a, (bool, np.bool_, str, bytes))
               for a in leaves)
    assert (kind == "ok") == (not isinstance(c, Vector) and real), (c, v)
    if kind == "ok":
        assert isinstance(v, Vector)
        assert all(np.asarray(a).tobytes() == np.asarray(b).tobytes()
                   for a, b in zip(jax.tree_util.tree_leaves(v.value), leaves))


@FUZZ
@given(st.one_of(arrays(shapes=[(2,), (), (3,)]), JUNK), st.one_of(st.integers(-1, 4), JUNK))
@example(y=4.683093011274118e-155, k=0)  # ½y² is subnormal: flushed to zero
@example(y=1e200, k=1)  # ½y² overflows float64: +inf, the value the loss has
def test_loss_families_at_a_target(y, k):
    kind, L = outcome(lambda: half_squared_error(y))
    # targets of half_squared_error: anything numpy reads as finite reals (booleans as 0, 1)
    a = np.asarray(y) if not isinstance(y, (list, tuple)) or y else np.asarray(y, object)
    valid = a.dtype.kind in "iufb" and (a.dtype.kind != "f" or bool(np.all(np.isfinite(a))))
    assert (kind == "ok") == valid, (y, L)
    if valid:
        c = jnp.zeros(np.shape(y))
        # past |y| ~ 1e154, ½y² is beyond float64: the loss and the oracle are both +inf
        with np.errstate(over="ignore"):
            want = 0.5 * np.sum(np.asarray(y, float) ** 2)
        # atol: XLA on the CPU flushes subnormal results to zero (y = 5e-155 gives ½y² = 0)
        np.testing.assert_allclose(L.fn(c), want, rtol=1e-6, atol=np.finfo(np.float64).tiny)
    kind, fam = outcome(lambda: softmax_cross_entropy(classes=k))
    assert (kind == "ok") == (k is None or int_at_least(k, 2)), (k, fam)  # one class learns nothing


# -- saved work ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def saved_bytes(tmp_path_factory):
    path = tmp_path_factory.mktemp("saved") / "s"
    save(path, STATE, LIN, gd(0.1))
    return open(path, "rb").read()


@FUZZ
@given(st.data())
def test_load_refuses_every_damaged_file(saved_bytes, tmp_path_factory, data):
    damaged = bytearray(saved_bytes)
    how = data.draw(st.sampled_from(["truncate", "flip", "insert", "garbage"]))
    if how == "truncate":
        damaged = damaged[:data.draw(st.integers(0, len(damaged) - 1))]
    elif how == "flip":
        i = data.draw(st.integers(0, len(damaged) - 1))
        damaged[i] ^= data.draw(st.integers(1, 255))
    elif how == "insert":
        i = data.draw(st.integers(0, len(damaged)))
        damaged[i:i] = data.draw(st.binary(min_size=1, max_size=4))
    else:
        damaged = bytearray(data.draw(st.binary(max_size=64)))
    path = tmp_path_factory.getbasetemp() / "damaged"
    path.write_bytes(bytes(damaged))
    with pytest.raises(CheckpointError):
        load(path, LIN, gd(0.1))


@FUZZ
@given(st.sampled_from(sorted(STATES)), st.sampled_from(["lens", "family", "str", "other"]),
       st.one_of(st.just("file"), JUNK.filter(lambda x: not isinstance(x, str)), st.just("")))
def test_save_refuses_what_it_cannot_save_and_round_trips_the_rest(tmp_path_factory, s, m, path):
    models = {"lens": LIN, "family": tanh, "str": "x", "other": dense(2, 3)}
    where = tmp_path_factory.getbasetemp() / "fuzz-save" if path == "file" else path
    kind, got = outcome(lambda: save(where, STATES[s], models[m], gd(0.1)))
    valid = path == "file" and (s, m) in (("state", "lens"), ("other", "other"))
    assert (kind == "ok") == valid, (s, m, path, got)
    if valid:
        back = load(where, models[m], gd(0.1)).state
        assert all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(back),
                                                         jax.tree_util.tree_leaves(STATES[s])))
    assert not [f for f in os.listdir(tmp_path_factory.getbasetemp()) if f.endswith(".tmp")]


CLASSIFIER = dense(2, 3)


@FUZZ
@given(st.one_of(arrays(shapes=[(4, 2), (4, 3), (0, 2), (2,)]), JUNK),
       st.one_of(arrays(shapes=[(4,), (4, 3), (4, 2), (3,)], dtypes=["int32", "float64", "<U1"]),
                 st.sampled_from([np.array([0, 1, 2, 1]), np.array([0, 3, 1, 1]), np.eye(3)[[0, 1, 2, 0]]]),
                 JUNK))
@example(np.arange(8.0).reshape(4, 2) - 3, np.array([0, 1, 2, 1]))
@example(np.arange(8.0).reshape(4, 2) - 3, np.eye(3)[[0, 1, 2, 0]])
def test_predict_and_accuracy(X, Y):
    kind, out = outcome(lambda: predict(CLASSIFIER, PL, X))
    valid_x = real_finite_array(X, (4, 2))
    assert (kind == "ok") == valid_x, (X, out)
    if valid_x:
        np.testing.assert_allclose(out, np.asarray(X, float) @ W.T + B, rtol=1e-6)
    kind, acc = outcome(lambda: accuracy(CLASSIFIER, PL, X, Y))
    if hasattr(Y, "shape") and Y.shape == (4,) and Y.dtype.kind == "i" and np.all((Y >= 0) & (Y < 3)):
        labels = Y
    elif hasattr(Y, "shape") and Y.shape == (4, 3) and Y.dtype.kind in "iuf" and np.all(np.isfinite(Y)):
        labels = np.argmax(Y, axis=-1)
    else:
        labels = None
    assert (kind == "ok") == (valid_x and labels is not None), (X, Y, acc)
    if kind == "ok":
        expected = np.mean(np.argmax(np.asarray(X, float) @ W.T + B, axis=-1) == labels)
        assert acc == pytest.approx(expected)
