"""Fuzzing spaces and maps: bad input to the layer sizes of lstm_cell, an OpenBox's bounds, the
discrete spaces Keys and Tokens, and the constructors and calls of Linear, D, scale and the
Constant metric gets a catalogued error naming the argument and the fix; good input is kept.
The oracle of acceptance (which inputs are valid) is written here. An exception that is not a
`ParalensError` fails the test as it is. Un-jitted, small recurring shapes."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from categories import D, OpenBox, Positive, R, Smooth, Vector, Covector, scale
from categories.errors import (DimensionError, DomainError, KindError, MetricError,
                               ShapeError, SpaceMismatch)
from categories.linear import Linear
from lenses import Keys, Tokens, batched, dropout, gru_cell, lstm_cell, rnn_cell
from lenses.inner_products.metrics import Constant

FUZZ = settings(max_examples=50, deadline=None)


# -- 1. lstm_cell's sizes, as rnn_cell's and gru_cell's ----------------------------------------

@pytest.mark.parametrize("n_in, n_hidden, arg, value", [(0, 3, "n_in", "0"), (2.5, 3, "n_in", "2.5"),
                                                        (3, 0, "n_hidden", "0")])
def test_lstm_cell_names_itself_and_the_size(n_in, n_hidden, arg, value):
    with pytest.raises(DimensionError, match=f"lstm_cell: {arg} must be an integer ≥ 1, got {value}"):
        lstm_cell(n_in, n_hidden)


@FUZZ
@given(cell=st.sampled_from([rnn_cell, gru_cell, lstm_cell]),
       n=st.one_of(st.integers(-2, 4), st.floats(-2, 4), st.booleans(), st.text(max_size=1)))
def test_every_cell_refuses_a_size_in_its_own_name(cell, n):
    valid = not isinstance(n, bool) and isinstance(n, int) and n >= 1
    try:
        c = cell(n, 2)
    except DimensionError as e:
        assert not valid and str(e).startswith(f"{cell.__name__}: n_in must be an integer ≥ 1")
        return
    assert valid and c.dom.factors[0] == R(n)


# -- 2. OpenBox: finite bounds only (an infinite one has no interior point to sample) ---------

@pytest.mark.parametrize("low, high", [(0.0, math.inf), (-math.inf, math.inf), (-math.inf, 1.0)])
def test_openbox_refuses_infinite_bounds_naming_the_fix(low, high):
    with pytest.raises(DomainError, match=r"finite bounds.*Positive.*R\(\*shape\)"):
        OpenBox(low, high, (2,))


@FUZZ
@example(low=0.0, width=math.inf, seed=0)  # the half-line: its sample was inf
@example(low=-math.inf, width=math.inf, seed=0)
# widths well above float32's resolution at |low| ≤ 1e3 (a box narrower than a float32 step
# has no float32 point strictly inside: that edge is not what this test is about)
@given(low=st.one_of(st.floats(-1e3, 1e3), st.sampled_from([math.inf, -math.inf, math.nan])),
       width=st.one_of(st.floats(1e-2, 1e3), st.sampled_from([0.0, -1.0, math.inf, math.nan])),
       seed=st.integers(0, 99))
def test_an_accepted_openbox_samples_a_finite_point_inside_itself(low, width, seed):
    high = low + width
    valid = math.isfinite(low) and math.isfinite(high) and low < high
    try:
        B = OpenBox(low, high, (3,))
    except DomainError:
        assert not valid
        return
    assert valid
    x = np.asarray(B.sample_interior(jax.random.PRNGKey(seed)))
    assert np.isfinite(x).all() and (x > low).all() and (x < high).all()


# -- 3. Keys: raw uint32 key data; a typed key is named with its fix -------------------------

def test_keys_refuse_a_typed_key_with_key_data_as_the_fix():
    with pytest.raises(DomainError, match=r"typed key.*jax\.random\.key_data\(key\)"):
        Keys().check(jax.random.key(0))
    assert Keys().contains(jax.random.key_data(jax.random.key(0)))


def test_dropout_refuses_float_keys():
    drop = dropout(0.5).at(R(3) * Keys())
    with pytest.raises(DomainError, match=r"uint32.*got dtype float.*jax\.random\.PRNGKey\(seed\)"):
        drop.forward((jnp.ones(3), jnp.ones(2)), None)
    y = np.asarray(drop((jnp.ones(3), jax.random.PRNGKey(1)), None))
    assert set(y.tolist()) <= {0.0, 2.0}


def test_a_batch_of_float_or_typed_keys_is_refused_with_the_fix():
    drop = batched(dropout(0.5).at(R(3) * Keys()))
    with pytest.raises(DomainError, match=r"example 0 of the batch\[1\] .*uint32.*got dtype float"):
        drop((jnp.ones((2, 3)), jnp.ones((2, 2))), None)
    with pytest.raises(ShapeError, match=r"jax\.random\.key_data\(keys\)"):
        drop((jnp.ones((2, 3)), jax.random.split(jax.random.key(0), 2)), None)
    y = np.asarray(drop((jnp.ones((2, 3)), jax.random.split(jax.random.PRNGKey(0), 2)), None))
    assert set(y.ravel().tolist()) <= {0.0, 2.0}


@settings(max_examples=20, deadline=None)
@given(dtype=st.sampled_from(["uint32", "int32", "float32", "float64", "uint8", "int64"]),
       seed=st.integers(0, 2 ** 31 - 1))
def test_keys_accept_exactly_uint32_data(dtype, seed):
    data = np.asarray(jax.random.PRNGKey(seed)).astype(dtype)
    assert Keys().contains(data) == (dtype == "uint32")


# -- 4. Tokens: said in tokens, not as an open-set margin -------------------------------------

@pytest.mark.parametrize("x, bad, at", [([0.5, 1.0, 2.0], "0.5", 0), ([0, 1, 7], "7", 2),
                                        ([0, -1, 2], "-1", 1)])
def test_tokens_name_the_bad_token_and_its_position(x, bad, at):
    with pytest.raises(DomainError, match=rf"token ids must be integers in \[0, 5\).*got {bad} at "
                                          rf"position {at}"):
        Tokens(3, 5).check(jnp.array(x))


@FUZZ
@example(values=[0.5, 1.0, 4.49])  # on a boundary between two cubes: not a token
@example(values=[0.0, -0.49, 4.51])  # the last is past the vocabulary
@given(values=st.lists(st.floats(-2, 7, width=32), min_size=3, max_size=3))
def test_tokens_accept_what_is_within_a_half_of_a_token_id(values):
    x = np.asarray(values, np.float32)
    v = x.astype(float)
    valid = bool(np.all([any(abs(t - k) < 0.5 for k in range(5)) for t in v]))
    assert Tokens(3, 5).contains(x) == valid


# -- 5. Linear: the constructor checks of Smooth, and the shapes of a Vector ------------------

@pytest.mark.parametrize("make, error, words", [
    (lambda: Linear(2, R(2), lambda v: v), KindError, "must be Spaces"),
    (lambda: Linear(R(2), R(2), 3), KindError, "apply must be a function"),
    (lambda: Linear(R(2), R(2), lambda v: v, on="junk"), KindError, "on must be"),
    (lambda: Linear(R(2), R(2), lambda v: v, transpose=3), KindError, "transpose must be"),
])
def test_linear_refuses_a_bad_constructor_argument(make, error, words):
    with pytest.raises(error, match=words):
        make()


@FUZZ
@given(n_in=st.integers(1, 3), n_out=st.integers(1, 3), m=st.integers(1, 3),
       on=st.sampled_from(["vectors", "covectors"]))
def test_linear_gives_a_vector_on_its_codomain_or_refuses(n_in, n_out, m, on):
    W = np.arange(1.0, 1.0 + m * n_in).reshape(m, n_in)  # a map R^{n_in} → R^m, declared R^n_out
    L = Linear(R(n_in), R(n_out), lambda v: jnp.asarray(W) @ v, on=on)
    kind = Vector if on == "vectors" else Covector
    try:
        y = L(kind(jnp.ones(n_in)))
    except SpaceMismatch:
        assert m != n_out
        return
    assert m == n_out and isinstance(y, kind) and y.space == R(m)
    np.testing.assert_allclose(np.asarray(y.value), W.sum(axis=1))


def test_linear_refuses_a_vector_of_another_shape():
    with pytest.raises(DomainError, match=r"argument of L is not a point of R\^2"):
        Linear(R(2), R(2), lambda v: 2 * v)(Vector(jnp.ones(3)))


# -- 6. D and scale: a Smooth map, a point of its domain, a real factor -----------------------

SQUARE = Smooth(R(2), R(2), lambda x: x * x, "sq")


def test_differential_refuses_a_non_smooth_map_and_a_point_outside_its_domain():
    with pytest.raises(KindError, match=r"D\(f, x\) needs a Smooth map"):
        D(3, jnp.ones(2))
    with pytest.raises(DomainError, match=r"the point x of D\(sq, x\) is not a point of R\^2"):
        D(SQUARE, jnp.ones(3))
    with pytest.raises(DomainError, match="outside"):
        D(Smooth(Positive(2), R(2), lambda x: x, "f"), -jnp.ones(2))
    dv = D(SQUARE, jnp.array([1.0, 3.0]))(Vector(jnp.ones(2)))  # d(x²) = 2x by hand
    np.testing.assert_allclose(np.asarray(dv.value), [2.0, 6.0])


@FUZZ
@given(c=st.one_of(st.floats(-3, 3), st.integers(-3, 3), st.text(max_size=2), st.none(),
                   st.booleans(), st.sampled_from([np.float32(2.0), jnp.asarray(0.5),
                                                    jnp.ones(2), [1.0], 1j])))
def test_scale_multiplies_by_a_real_number_or_refuses(c):
    valid = (not isinstance(c, bool) and isinstance(c, (int, float, np.floating))) or (
        isinstance(c, jax.Array) and c.ndim == 0)
    try:
        f = scale(c, SQUARE)
    except KindError as e:
        assert not valid and "c must be a real number" in str(e)
        return
    assert valid
    np.testing.assert_allclose(np.asarray(f(jnp.array([1.0, 2.0]))), float(c) * np.array([1.0, 4.0]),
                               rtol=1e-6, atol=1e-30)  # float32 flushes tiny c to 0


def test_scale_refuses_a_non_smooth_map():
    with pytest.raises(KindError, match=r"scale\(c, f\) needs a Smooth map"):
        scale(2.0, lambda x: x)


# -- 7. Constant: G's size against the space's, at construction -------------------------------

@pytest.mark.parametrize("n, space, slot", [(2, R(3), None), (2, R(3) * R(2, 2), 1),
                                            (3, R(3) * R(2, 2), 1)])
def test_constant_refuses_a_matrix_of_another_size_than_its_space(n, space, slot):
    with pytest.raises(MetricError, match=r"G is \d×\d but the (space|slot) has \d coordinates"):
        Constant(jnp.eye(n), space, slot=slot)


def test_constant_of_the_right_size_is_kept():
    G = jnp.array([[2.0, 0.0], [0.0, 4.0]])
    P = R(3) * R(2)
    v = Constant(G, P, slot=1).sharp(None, Covector((jnp.ones(3), jnp.array([2.0, 2.0])), P))
    np.testing.assert_allclose(np.asarray(v.value[0]), np.ones(3))  # other slots untouched
    np.testing.assert_allclose(np.asarray(v.value[1]), [1.0, 0.5])  # G⁻¹ p' by hand
