"""Malformed inputs at the training entry points (`train_step`, `fit`, `epoch_order`, a step's
doors) meet a catalogued error that names the argument and the fix, when the step is built or
the run starts, and a refusal in the middle of a run loses none of the steps before it.

One fixed example per finding of the audit (each failed on the code before it: a raw
TypeError, a lost run, an internal-looking error, a run that learns nothing, a wrong
reason), and, where cheap, a Hypothesis property whose oracle of acceptance is written here,
apart from the library. Few shapes recur, so accepted inputs reuse a few compilations.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from categories import R, Smooth
from lenses import (DomainError, HyperparameterError, KindError, LossFamily, ParalensError,
                    ShapeError, TargetError, TargetTypeError, TrainState, UnsupportedError,
                    accuracy, binary_cross_entropy, dense, fit, gd, half_squared_error,
                    loss_family, softmax_cross_entropy, train_step)
from lenses.training.sources import epoch_order

FEW = settings(max_examples=15, deadline=None)
X, Y = np.ones((4, 2)), np.zeros((4, 1))


def params(dtype=np.float64):
    return (np.array([[0.5, -0.25]], dtype), np.array([0.125], dtype))


def gd_oracle(p, steps, lr=0.1):
    """dense(2, 1) at x = (1, 1), target 0, half squared error, mean over identical rows:
    the residual r = w·x + b, and gd moves w by −lr·r·x and b by −lr·r (numpy, by hand)."""
    w, b = (np.asarray(a, np.float64) for a in p)
    for _ in range(steps):
        r = float(w.sum() + b[0])
        w, b = w - lr * r, b - lr * r
    return w, b


# -- 1. a loss (output, target) ↦ number where a family y ↦ L_y belongs -----------------------------

def test_a_two_argument_loss_is_refused_when_the_step_is_built():
    with pytest.raises(KindError, match=r"<lambda>\(out, y\) takes 2 arguments.*LossFamily"):
        train_step(dense(2, 1), lambda out, y: jnp.sum((out - y) ** 2), gd(0.1))
    onehot = np.eye(3)[np.zeros(4, int)]
    with pytest.raises(KindError, match=r"softmax_cross_entropy\(logits, labels\).*optax"):
        fit(dense(2, 3), optax.softmax_cross_entropy, gd(0.1), dense(2, 3).init(jax.random.PRNGKey(0)),
            (X, onehot), epochs=1, batch_size=4, progress=False)


def test_the_fix_the_refusal_names_trains_with_the_optax_loss():
    """The message's fix, a LossFamily whose value(c, y) is the optax loss, gives the loss
    optax gives (first report, against optax at the initial point, by numpy's matmul)."""

    class OptaxCE(LossFamily):
        def value(self, c, y):
            return optax.softmax_cross_entropy(c, y)

    model, onehot = dense(2, 3), np.eye(3)[np.array([0, 1, 2, 0])]
    p = model.init(jax.random.PRNGKey(0))
    step = train_step(model, OptaxCE(), gd(0.1))
    _, report = step(step.init(p), X, onehot)
    logits = X @ np.asarray(p[0]).T + np.asarray(p[1])
    want = np.mean(optax.softmax_cross_entropy(logits, onehot))
    np.testing.assert_allclose(float(report.loss), want, rtol=1e-6)


@FEW
@given(st.integers(0, 3), st.integers(0, 2), st.booleans())
def test_a_function_is_a_family_only_if_it_needs_at_most_one_argument(required, optional, star):
    names = [f"a{i}" for i in range(required)] + [f"o{i}=0" for i in range(optional)]
    names += ["*rest"] if star else []
    scope = {}
    exec(f"def fn({', '.join(names)}):\n    return None", scope)
    try:
        loss_family(scope["fn"])
        refused = False
    except KindError as e:
        assert f"takes {required} arguments" in str(e)
        refused = True
    assert refused == (required >= 2)
    # a partial that fixes all but the target is a family
    if required >= 1:
        loss_family(functools.partial(scope["fn"], *range(required - 1)))


# -- 2. a batch of an iterable refused in the middle of a run -----------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_refused_batch_of_an_iterable_keeps_the_steps_before_it(dtype):
    def batches():
        for _ in range(50):
            yield X, Y
        yield X[:0], Y[:0]

    p = params(dtype)  # lr 0.01: 50 steps take the residual to 0.97⁵⁰ ≈ 0.22 of itself
    with pytest.raises(ShapeError, match="batch 50 of the iterable") as caught:
        fit(dense(2, 1), half_squared_error, gd(0.01), p, batches(), epochs=1, progress=False)
    state = caught.value.state
    assert int(state.count) == 50 and caught.value.history == []
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for got, want in zip(state.params, gd_oracle(p, 50, lr=0.01)):
        np.testing.assert_allclose(np.asarray(got), want, rtol=tol, atol=tol)
    # the run continues from it: 10 more steps reach what 60 steps reach
    more, _ = fit(dense(2, 1), half_squared_error, gd(0.01), state, [(X, Y)] * 10, epochs=1,
                  progress=False)
    for got, want in zip(more.params, gd_oracle(p, 60, lr=0.01)):
        np.testing.assert_allclose(np.asarray(got), want, rtol=tol, atol=tol)


BAD_BATCHES = {
    "empty": (X[:0], Y[:0]),
    "width": (np.ones((4, 3)), Y),
    "strings": (np.full((4, 2), "a"), Y),
    "not a pair": (X, Y, Y),
    "targets": (X, np.zeros((3, 1))),
}


class LoaderFailed(RuntimeError):
    """An error of the user's data loader (not the library's)."""


@FEW
@given(st.integers(0, 5), st.sampled_from(sorted(BAD_BATCHES) + ["the loader raises"]))
def test_every_step_before_a_refused_batch_is_kept(k, bad):
    def batches():
        for _ in range(k):
            yield X, Y
        if bad == "the loader raises":
            raise LoaderFailed("disk gone")
        yield BAD_BATCHES[bad]
        yield X, Y  # never reached

    with pytest.raises((ParalensError, LoaderFailed)) as caught:
        fit(dense(2, 1), half_squared_error, gd(0.1), params(), batches(), epochs=1,
            steps_per_dispatch=2, progress=False)
    assert isinstance(caught.value, LoaderFailed) == (bad == "the loader raises")
    assert int(caught.value.state.count) == k
    for got, want in zip(caught.value.state.params, gd_oracle(params(), k)):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)


# -- 3. parameters of an integer dtype -----------------------------------------------------------------

def test_integer_parameters_are_refused_at_init_and_by_fit():
    p = (np.array([[1, 2]], np.int32), np.array([0.0]))
    step = train_step(dense(2, 1), half_squared_error, gd(0.1))
    with pytest.raises(DomainError, match=r"slot 0 holds an array of dtype int32.*astype"):
        step.init(p)
    with pytest.raises(DomainError, match="int32"):
        fit(dense(2, 1), half_squared_error, gd(0.1), p, (X, Y), epochs=1, batch_size=4,
            progress=False)
    state = TrainState.of(p, step.opt.init(params()))
    with pytest.raises(DomainError, match=r"the state's parameters: slot 0 .*int32"):
        fit(dense(2, 1), half_squared_error, gd(0.1), state, (X, Y), epochs=1, batch_size=4,
            progress=False)


@FEW
@given(st.sampled_from(["int8", "int32", "int64", "uint8", "float16", "bfloat16", "float32",
                        "float64"]), st.integers(0, 1))
def test_a_step_takes_parameters_of_any_float_dtype_and_no_integer_one(dtype, slot):
    p = [np.asarray(a) for a in params()]
    p[slot] = jnp.asarray(p[slot]).astype(dtype)
    step = train_step(dense(2, 1), half_squared_error, gd(0.1))
    floating = jnp.issubdtype(jnp.dtype(dtype), jnp.floating)
    try:
        state = step.init(tuple(p))
    except DomainError as e:
        assert not floating and f"slot {slot}" in str(e) and dtype in str(e)
        return
    assert floating
    state, report = step(state, X, Y)
    want = gd_oracle(params(), 1)
    tol = 1e-2 if dtype in ("float16", "bfloat16") else 1e-6
    np.testing.assert_allclose(np.asarray(state.params[slot], np.float64), want[slot], atol=tol)


# -- 4. loss families that learn nothing -------------------------------------------------------------

def test_softmax_cross_entropy_over_one_class_is_refused():
    with pytest.raises(HyperparameterError, match="binary_cross_entropy"):
        softmax_cross_entropy(classes=1)
    step = train_step(dense(2, 1), softmax_cross_entropy, gd(0.1))
    with pytest.raises(TargetError, match=r"at least 2 entries.*binary_cross_entropy"):
        step(step.init(params()), X, np.ones((4, 1)))
    # two classes learn: the loss of the first step is log 2 at zero logits (by hand)
    step = train_step(dense(2, 2), softmax_cross_entropy(classes=2), gd(0.1))
    _, report = step(step.init((np.zeros((2, 2)), np.zeros(2))), X, np.array([0, 1, 0, 1]))
    np.testing.assert_allclose(float(report.loss), np.log(2), rtol=1e-12)


@FEW
@given(st.integers(-2, 5))
def test_classes_is_an_integer_of_at_least_two(k):
    try:
        softmax_cross_entropy(classes=k)
        accepted = True
    except HyperparameterError:
        accepted = False
    assert accepted == (k >= 2)


# -- 5. global_batch without a mesh ------------------------------------------------------------------

def test_global_batch_without_a_mesh_is_refused():
    step = train_step(dense(2, 1), half_squared_error, gd(0.1))
    with pytest.raises(UnsupportedError, match="has none: pass the batch to the step as it is"):
        step.global_batch((X, Y))


# -- 6. targets of every real dtype -------------------------------------------------------------------

def test_bfloat16_targets_are_real():
    Yb = np.array([[0.5], [-1.0], [2.0], [0.0]])  # exactly representable in bfloat16
    p = (np.zeros((1, 2)), np.zeros(1))
    _, history = fit(dense(2, 1), half_squared_error, gd(0.1), p, (X, Yb.astype(jnp.bfloat16)),
                     epochs=1, batch_size=4, progress=False)
    np.testing.assert_allclose(history[0]["loss"], 0.5 * np.mean(Yb ** 2), rtol=1e-12)
    onehot = np.eye(2)[[0, 1, 1, 0]].astype(jnp.bfloat16)
    assert accuracy(dense(2, 2), (np.eye(2), np.zeros(2)), np.eye(2)[[0, 1, 1, 0]], onehot) == 1.0
    binary_cross_entropy.check_targets(np.full((2, 1), 0.5, jnp.bfloat16))


@FEW
@given(st.sampled_from(["bfloat16", "float16", "float32", "float64", "int8", "uint16", "bool",
                        "complex64", "<U1", "object"]))
def test_targets_are_refused_by_their_dtype_only_when_not_real(dtype):
    Yd = np.zeros((4, 1)).astype(jnp.dtype(dtype) if dtype == "bfloat16" else dtype)
    try:
        half_squared_error.check_targets(Yd)
        accepted = True
    except TargetTypeError as e:
        assert "real numbers" in str(e)
        accepted = False
    assert accepted == (dtype not in ("complex64", "<U1", "object"))


# -- 7. epoch_order's arguments ------------------------------------------------------------------------

def test_epoch_order_names_the_argument_it_refuses():
    with pytest.raises(HyperparameterError, match="epoch_order: epoch"):
        epoch_order(0, 0, 10, 0)
    with pytest.raises(HyperparameterError, match="epoch_order: epoch"):
        epoch_order(0, -1, 10, 3)
    with pytest.raises(HyperparameterError, match="epoch_order: batch_size"):
        epoch_order(0, 1, 10, 0)
    with pytest.raises(HyperparameterError, match="epoch_order: n"):
        epoch_order(0, 1, -4, 2)


@FEW
@given(st.integers(-2, 3), st.integers(-3, 9), st.one_of(st.integers(-1, 4), st.just(2.0)))
def test_epoch_order_is_a_permutation_cut_into_batches(epoch, n, batch_size):
    valid = epoch >= 1 and n >= 0 and isinstance(batch_size, int) and batch_size >= 1
    try:
        order = epoch_order(0, epoch, n, batch_size)
    except HyperparameterError:
        assert not valid
        return
    assert valid
    assert order.shape == (n // batch_size, batch_size)
    assert len(set(order.ravel().tolist())) == order.size and np.all((0 <= order) & (order < n))


# -- 8. the step's doors, the fault record, flags -------------------------------------------------------

def test_the_doors_refuse_what_they_do_not_take():
    step = train_step(dense(2, 1), half_squared_error, gd(0.1))
    state = step.init(params())
    with pytest.raises(KindError, match="dispatch takes data"):
        step.dispatch(state, None)
    with pytest.raises(KindError, match="takes a TrainState"):
        step.dispatch(params(), (X[None], Y[None]))
    with pytest.raises(KindError, match="settle takes what dispatch returned"):
        step.settle(None)
    with pytest.raises(KindError, match=r"kind one of \[0, 1, 2, 3, 4\]"):
        TrainState.of(params(), (), fault=(9, 1, 0))
    with pytest.raises(KindError, match="progress must be True, False or None"):
        fit(dense(2, 1), half_squared_error, gd(0.1), params(), (X, Y), epochs=1, batch_size=4,
            progress="yes")
    with pytest.raises(KindError, match="on_device must be True, False or None"):
        fit(dense(2, 1), half_squared_error, gd(0.1), params(), (X, Y), epochs=1, batch_size=4,
            progress=False, on_device="no")


def test_a_run_that_ends_at_max_steps_before_a_refused_batch_ends_normally():
    """The refused batch comes after the last step asked for: the run ends there, as if the
    iterable had ended (the lookahead that tells where an iterable ends is no step)."""
    batches = [(X, Y)] * 3 + [(X[:0], Y[:0])]
    state, _ = fit(dense(2, 1), half_squared_error, gd(0.1), params(), iter(batches),
                   epochs=1, max_steps=3, progress=False)
    for got, want in zip(state.params, gd_oracle(params(), 3)):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)
