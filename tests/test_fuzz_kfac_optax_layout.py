"""Malformed arguments of KFAC, from_optax, Layout.specs and from_function meet a catalogued
error when they are given (or when the training step is built), never a raw error at the first
step; the valid neighbours of each are accepted with the documented result.

The oracle of acceptance is written here: which arguments are valid (a lens, a callable, an
integer ≥ 0 or ≥ 1, a model with the trained model's parameter object, a transformation that
runs on the parameters' shapes) and, for layouts, the partition worked out by hand. Nothing
here runs a compiled step: every refusal comes before tracing.
"""

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from categories import R
from lenses import (KFAC, DimensionError, HyperparameterError, KindError, Layout, LayoutError,
                    ParalensError, SpaceMismatch, dense, from_function, from_optax, gd,
                    half_squared_error, train_step)

FUZZ = settings(max_examples=60, deadline=None)

JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 6), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=2), st.sampled_from([np.int64(2), np.int32(0), np.float32(2.0),
                                          np.bool_(True), [1, 2], (1,), b"1"]))


def _is_int(x):
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


# -- KFAC ------------------------------------------------------------------------------------------

def test_kfac_model_must_be_a_lens():
    with pytest.raises(KindError, match="KFAC\\(model=...\\) needs a lens"):
        KFAC(model=3)


def test_kfac_model_other_than_the_trained_one_is_refused_when_the_step_is_built():
    trained, other = dense(2, 1), dense(3, 1)
    with pytest.raises(SpaceMismatch, match=r"dense\(3→1\).*dense\(2→1\)"):
        train_step(trained, half_squared_error, gd(0.1, metric=KFAC(model=other)))
    # the same refusal where the optimiser is started on the trained model's parameters
    with pytest.raises(SpaceMismatch, match=r"dense\(3→1\)"):
        gd(0.1, metric=KFAC(model=other)).init((jnp.ones((1, 2)), jnp.ones(1)))
    # a model equal to the trained one (another instance) is accepted
    train_step(trained, half_squared_error, gd(0.1, metric=KFAC(model=dense(2, 1))))


@pytest.mark.parametrize("name", ["output_fisher", "sampler"])
def test_kfac_functions_must_be_callable(name):
    with pytest.raises(KindError, match=f"KFAC: {name} must be a function"):
        KFAC(model=dense(2, 1), curvature="sampled", **{name: 3})
    KFAC(model=dense(2, 1), curvature="sampled", **{name: lambda a, b: b})  # a function: taken


@FUZZ
@given(JUNK)
@example("a")
@example(-1)
@example(np.int64(7))
def test_kfac_seed_is_an_integer_at_least_zero(seed):
    valid = _is_int(seed) and seed >= 0
    try:
        metric = KFAC(seed=seed)
    except ParalensError as e:
        assert not valid, f"KFAC(seed={seed!r}) refused: {e}"
        assert isinstance(e, HyperparameterError) and "seed" in str(e)
        return
    assert valid, f"KFAC(seed={seed!r}) accepted"
    assert metric.seed == int(seed) and type(metric.seed) is int


# -- from_optax --------------------------------------------------------------------------------------

@pytest.mark.parametrize("wrap", [from_optax, lambda tx: tx], ids=["from_optax", "raw optax"])
def test_optax_transformation_failing_on_the_parameters_is_refused_when_the_step_is_built(wrap):
    with pytest.raises(HyperparameterError, match="the optax transformation fails on a covector "
                                                  "of the parameters"):
        train_step(dense(2, 1), half_squared_error, wrap(optax.adam("a")))
    train_step(dense(2, 1), half_squared_error, wrap(optax.adam(0.1)))  # a number: taken


# -- Layout.specs --------------------------------------------------------------------------------

def test_layout_specs_needs_a_lens_and_a_mapping():
    with pytest.raises(KindError, match="Layout.specs needs a lens"):
        Layout().specs(3, {"model": 1})
    with pytest.raises(KindError, match="Layout.specs: axes must be"):
        Layout().specs(dense(2, 1), "junk")


@FUZZ
@given(JUNK)
@example(-2)
@example(0)
@example(2.5)
@example(True)
@example(np.int64(2))
def test_layout_axis_sizes_are_integers_at_least_one(size):
    valid = _is_int(size) and size >= 1
    try:
        specs = Layout().specs(dense(2, 1), {"model": size})
    except ParalensError as e:
        assert not valid, f"size {size!r} refused: {e}"
        assert isinstance(e, (LayoutError, DimensionError)) and "'model'" in str(e)
        return
    assert valid, f"size {size!r} accepted: {specs}"
    # by hand: dense(2→1)'s weight (1, 2) splits along its 2 columns over 2 devices; over 1
    # (nothing to split) or a number dividing neither dimension it is replicated, as is the
    # bias (1,)
    weight = (None, "model") if size == 2 else ()
    assert tuple(specs[0]) == weight and tuple(specs[1]) == ()


# -- from_function ------------------------------------------------------------------------------

def test_from_function_codomain_given_as_a_size_is_read_like_the_domain():
    f = lambda t, x: t["w"] @ x  # noqa: E731
    with pytest.raises(SpaceMismatch, match="not to its codomain R\\^5"):
        from_function(f, {"w": jnp.ones((1, 2))}, R(2), cod=5)
    assert from_function(f, {"w": jnp.ones((1, 2))}, R(2), cod=1).cod == R(1)
    with pytest.raises(KindError, match="codomain as a Space"):
        from_function(f, {"w": jnp.ones((1, 2))}, R(2), cod="R1")


@pytest.mark.parametrize("out", [lambda x: jnp.argmax(x), lambda x: x > 0])
def test_from_function_with_an_integer_or_boolean_output_is_refused(out):
    with pytest.raises(KindError, match="not a point of a real space"):
        from_function(lambda t, x: out(t["w"] @ x), {"w": jnp.ones((1, 2))}, R(2))
