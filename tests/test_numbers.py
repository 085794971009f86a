"""The one check of a number an argument is (`categories.numbers`), against a plain oracle:
Python's own comparisons on the float the argument stands for."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from categories.errors import DimensionError, DomainError, HyperparameterError
from categories.numbers import integer, real_number
from categories.dimensions import dimension

bounds = st.one_of(st.none(), st.floats(-10, 10, allow_nan=False))
values = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-100, 100))
wrappers = st.sampled_from([lambda v: v, np.float32, np.float64, np.asarray, jnp.asarray])


@settings(max_examples=300, deadline=None)
@given(values, wrappers, bounds, bounds, bounds)
def test_a_real_number_is_accepted_exactly_when_it_is_finite_and_in_range(x, wrap, least, above, below):
    try:
        arg = wrap(x)
    except OverflowError:  # an int too large for the wrapper's dtype: nothing to ask
        return
    v = float(np.asarray(arg).item()) if not isinstance(arg, (int, float)) else float(arg)
    ok = (math.isfinite(v) and (least is None or v >= least) and (above is None or v > above)
          and (below is None or v < below))
    if ok:
        assert real_number(arg, "x", least=least, above=above, below=below) == v
    else:
        with pytest.raises(HyperparameterError, match=r"^x must be a finite number"):
            real_number(arg, "x", least=least, above=above, below=below)


@pytest.mark.parametrize("x", [True, np.bool_(False), "0.1", b"1", None, [0.1], np.array([0.1]),
                               jnp.ones(2), 1 + 2j, np.complex64(1), {}])
def test_what_is_not_one_real_number_is_refused_naming_the_argument(x):
    with pytest.raises(HyperparameterError, match=r"^eps must be a finite number > 0 \(e\.g\. 1e-5\), got"):
        real_number(x, "eps", above=0, hint=" (e.g. 1e-5)")


def test_the_error_class_and_the_range_are_the_callers():
    with pytest.raises(DomainError, match=r"radius must be a finite number > 0, got -1"):
        real_number(-1, "radius", above=0, error=DomainError)
    with pytest.raises(HyperparameterError, match=r"beta must be a finite number in \[0, 1\), got 1\.0"):
        real_number(1.0, "beta", least=0, below=1)
    with pytest.raises(HyperparameterError, match=r"in \(0, 1\)"):
        real_number(0, "p", above=0, below=1)


def test_a_traced_number_passes_only_where_the_caller_allows_it():
    assert jax.jit(lambda t: real_number(t, "lr", above=0, traced=True) * 2)(1.5) == 3.0
    with pytest.raises(HyperparameterError):
        jax.jit(lambda t: real_number(t, "lr", above=0))(1.5)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.integers(-5, 2**32), st.floats(-5, 5), st.booleans(), st.text(max_size=2)),
       st.integers(0, 3))
def test_an_integer_is_accepted_exactly_when_it_is_one_in_range(n, least):
    ok = type(n) is int and least <= n <= 2**31 - 1
    if ok:
        assert integer(n, "k", least) == n == dimension(n, "k", least)
        assert integer(np.int64(n), "k", least) == n
    else:
        with pytest.raises(DimensionError, match="^k must be an integer"):
            dimension(n, "k", least)
        if type(n) is not int or n < least:
            with pytest.raises(HyperparameterError, match="^k must be an integer"):
                integer(n, "k", least)
