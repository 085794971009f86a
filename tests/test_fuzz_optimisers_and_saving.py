"""Optimisers and saved work at their edges: bad input meets a catalogued error and loses
nothing; what is accepted does what the oracle says.

- A training state of every float dtype the library trains in (bfloat16, float16, float32,
  float64), and extra arrays of the integer and boolean dtypes, are read back bit for bit.
- `save` refuses, before anything is written, what the file would mislabel (the state of
  another optimiser) or cannot hold (a key that is not one, extra arrays not a dict of
  arrays, a progress record JSON cannot write); an existing file is left as it was.
- An optimiser's rule computes its numbers in float32 at least: Adam, momentum and Adagrad
  move a bfloat16 or float16 point as optax's float32 rules do, cast (in bfloat16 Adam's
  b2 = 0.999 is 1, and its bias correction 1 − b2^t was 0: the step did nothing).
- A stateful optimiser is not called without its state, nor stepped with another's.
- `GaussNewton`'s iteration counts are counts.

The oracles are written here, apart from the library: the bytes of the arrays saved, optax's
rules, the hand formula of gradient descent, and which inputs are valid. Few shapes recur
and nothing is jitted but one training step, so the file runs in seconds.
"""

import hashlib
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from safetensors.numpy import load as st_load

from categories import Covector, R
from lenses import (KFAC, Fisher, GaussNewton, HyperparameterError, KindError, ParalensError,
                    SpaceMismatch, TrainState, adagrad, adam, dense, gd, half_squared_error,
                    load, momentum, nesterov, save, train_step)

FUZZ = settings(max_examples=60, deadline=None)
MODEL = dense(2, 1)
P0 = (jnp.array([[0.7, -1.2]]), jnp.array([0.4]))
# six covectors of P0's shapes, of both signs, none near 0 (float16 squares them)
COVECTORS = [(np.array([[g, -0.5 * g]]), np.array([1.5 - g]))
             for g in (1.0, 2.0, -1.5, 0.75, 1.25, -2.0)]


def cast(tree, dtype):
    return jax.tree_util.tree_map(lambda a: jnp.asarray(a).astype(dtype), tree)


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def untouched(path, before):
    """The file holds what it held, and no temporary file of a failed write is left."""
    assert open(path, "rb").read() == before
    assert [f for f in os.listdir(os.path.dirname(path)) if f.endswith(".tmp")] == []


# -- saved work: every dtype read back bit for bit -------------------------------------------------

@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "float64"])
def test_a_state_of_every_float_dtype_is_read_back_bit_for_bit(tmp_path, dtype):
    params, opt = cast(P0, dtype), adam(0.1)
    s = opt.init(params)
    for g in COVECTORS[:2]:  # moments that are not zero
        s, params = opt.step(s, params, Covector(cast(g, dtype), MODEL.param))
    state = TrainState.of(params, s, 2)
    extra = {"ema": cast(P0[0], dtype), "flags": np.array([True, False]),
             "codes": np.array([-3, 7], np.int8), "ids": np.array([1, 2 ** 31], np.uint32),
             "wide": np.array([1e300, -2.5])}
    key = jax.random.PRNGKey(3)
    path = save(tmp_path / "s", state, MODEL, opt, key, extra_arrays=extra)
    saved = load(path, MODEL, adam(0.1))
    got, want = jax.tree_util.tree_leaves(saved.state), jax.tree_util.tree_leaves(state)
    assert len(got) == len(want) and all(map(same_bits, got, want))
    assert all(same_bits(saved.info["extra"][k], v) for k, v in extra.items())
    assert same_bits(saved.key, key)


def test_a_float32_file_keeps_the_checksum_of_format_1(tmp_path):
    """Files saved before bfloat16 was readable still load: the checksum of numpy's dtypes is
    the one format 1 defined (the SHA-256 of the metadata, then of each array's name, type
    string, shape (a scalar's as (1,): numpy's ascontiguousarray) and bytes, in name order),
    recomputed here from the file itself."""
    path = save(tmp_path / "s", train_step(MODEL, half_squared_error, adam(0.1)).init(
        cast(P0, "float32")), MODEL, adam(0.1))
    data = open(path, "rb").read()
    meta = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])["__metadata__"]
    tensors = st_load(data)
    h = hashlib.sha256(meta["paralens"].encode())
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        h.update(f"\0{name}\0{a.dtype.str}\0{a.shape}\0".encode() + a.tobytes())
    assert h.hexdigest() == meta["paralens.sha256"]


# -- saved work: refused before anything is written ------------------------------------------------

@pytest.mark.parametrize("made_by, named", [(gd(0.1), adam(0.1)), (adam(0.1), momentum(0.1)),
                                            (momentum(0.1), adagrad(0.1)), (adam(0.1), None)],
                         ids=["gd_as_adam", "adam_as_momentum", "momentum_as_adagrad", "adam_as_none"])
def test_save_refuses_a_state_of_another_optimiser_than_the_one_named(tmp_path, made_by, named):
    path = str(tmp_path / "s")
    save(path, TrainState.of(P0, made_by.init(P0)), MODEL, made_by)  # an earlier save
    before = open(path, "rb").read()
    with pytest.raises(SpaceMismatch if named is not None else KindError,
                       match="not one of" if named is not None else "pass that optimiser"):
        save(path, TrainState.of(P0, made_by.init(P0)), MODEL, named)
    untouched(path, before)
    assert same_bits(load(path, MODEL, made_by).state.params[0], P0[0])


def _json_able(x):
    try:
        json.dumps(x)
        return True
    except (TypeError, ValueError):
        return False


def _dtype(a):
    try:
        return np.asarray(a).dtype
    except ValueError:  # ragged
        return np.dtype(object)


def _holdable(a):
    """A dtype a file holds: numpy's booleans, integers and floats (no wider than float64,
    which nothing drawn here is), and bfloat16."""
    return _dtype(a).kind in "biuf" or _dtype(a) == jnp.bfloat16


JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 6), st.floats(allow_nan=True),
    st.text(max_size=2), st.complex_numbers(max_magnitude=4), st.sampled_from(
        [np.float32(2.0), np.bool_(True), [1, 2], (1,), "k", b"1", object(), np.array(["a"]),
         [[1], [1, 2]],  # ragged: numpy makes no array of it
         np.array([1 + 2j]), np.array([0.5, 1.5]), np.array([3, 4], np.uint32)]))
KEYS = st.one_of(JUNK, st.sampled_from([jax.random.PRNGKey(1), jax.random.key(2)]))
EXTRAS = st.one_of(JUNK, st.lists(JUNK, max_size=2),
                   st.dictionaries(st.one_of(st.text(max_size=2), st.integers(0, 2)), JUNK,
                                   max_size=2))
FITS = st.one_of(JUNK, st.dictionaries(st.text(max_size=2), JUNK, max_size=2))


def _typed(k):
    return jnp.issubdtype(getattr(k, "dtype", np.float32), jax.dtypes.prng_key)


def _key_ok(k):
    """A key: a typed one, or raw key data (uint32 words along a last axis, as PRNGKey gives;
    a seed such as 0 is no key: load could not give it back as one)."""
    return k is None or _typed(k) or (_dtype(k) == np.uint32 and np.ndim(k) >= 1
                                      and np.shape(k)[-1] > 0)


def _extras_ok(e):
    return e is None or (isinstance(e, dict) and all(
        isinstance(n, str) and _holdable(a) for n, a in e.items()))


@FUZZ
@given(KEYS, EXTRAS, FITS)
@example("k", None, None)                      # a string as the key
@example(None, [jnp.ones(2)], None)            # extra arrays as a list
@example(None, None, {"a": object()})          # a progress record JSON cannot write
@example(None, {"x": np.array(["a"])}, None)   # an array of strings
@example([[1], [1, 2]], None, None)            # a ragged list: no array at all
@example(None, {"x": [[1], [1, 2]]}, None)
@example(jax.random.key(2), {"ema": jnp.ones(2, jnp.bfloat16)}, {"epoch": 1})
def test_save_refuses_optional_arguments_it_cannot_write_and_keeps_the_file(
        tmp_path_factory, key, extra, fit_record):
    path = str(tmp_path_factory.mktemp("args") / "s")
    state = TrainState.of(P0, gd(0.1).init(P0))
    save(path, state, MODEL, gd(0.1))
    before = open(path, "rb").read()
    valid = _key_ok(key) and _extras_ok(extra) and \
        (fit_record is None or (isinstance(fit_record, dict) and _json_able(fit_record)))
    try:
        save(path, state, MODEL, gd(0.1), key, fit=fit_record, extra_arrays=extra)
    except ParalensError as e:
        assert not valid, (key, extra, fit_record, e)
        assert isinstance(e, KindError)
        name = "key" if not _key_ok(key) else "extra_arrays" if not _extras_ok(extra) else "fit"
        assert name in str(e), (name, e)
        untouched(path, before)
        return
    assert valid, (key, extra, fit_record)
    saved = load(path, MODEL, gd(0.1))
    if _typed(key):
        assert _typed(saved.key) and same_bits(jax.random.key_data(saved.key),
                                               jax.random.key_data(key))
    elif key is not None:
        np.testing.assert_array_equal(saved.key, np.asarray(key))
    for n, a in (extra or {}).items():
        assert same_bits(saved.info["extra"][n], np.asarray(a))
    assert json.dumps(saved.info["fit"], sort_keys=True) == json.dumps(fit_record, sort_keys=True)


# -- the optimisers' numbers in float32 at least ---------------------------------------------------

# (the library's optimiser, optax's, the tolerance per dtype): bfloat16 keeps 8 bits, so a point
# near 1 moves in steps of 2^-7 (float16: 2^-10), and six steps can each round; in float32,
# Adam's 1 − b2^t cancels (b2 = 0.999 rounds by 3e-8, 6e-5 of 1 − b2) where optax, under x64,
# computes it in float64
TOL = {"bfloat16": 0.03, "float16": 4e-3, "float32": 2e-5, "float64": 1e-12}
RULES = {"adam": (adam(0.1), optax.adam(0.1)),
         "momentum": (momentum(0.1, 0.9), optax.sgd(0.1, momentum=0.9)),
         "adagrad": (adagrad(0.1), optax.adagrad(0.1, initial_accumulator_value=0.1, eps=1e-7))}


@pytest.mark.parametrize("rule, dtype", [("adam", d) for d in TOL] +
                         [(r, d) for r in ("momentum", "adagrad") for d in ("bfloat16", "float16")])
def test_a_half_precision_point_moves_as_optax_moves_it_in_float32(rule, dtype):
    ours, theirs = RULES[rule]
    wide = jnp.promote_types(dtype, jnp.float32)  # optax runs in float32 (float64 as itself)
    p, q = cast(P0, dtype), cast(P0, wide)
    s, t = ours.init(p), theirs.init(q)
    for g in COVECTORS:
        g = cast(g, dtype)  # the covector a half-precision network gives, exactly
        s, p = ours.step(s, p, Covector(g, MODEL.param))
        u, t = theirs.update(cast(g, wide), t, q)
        q = optax.apply_updates(q, u)
    for mine, oracle, start in zip(p, q, P0):
        assert mine.dtype == jnp.dtype(dtype)
        np.testing.assert_allclose(np.asarray(mine, np.float64), np.asarray(oracle.astype(dtype),
                                   np.float64), atol=TOL[dtype], rtol=TOL[dtype])
        assert float(jnp.max(jnp.abs(mine.astype(wide) - start))) > 0.1  # it moved


def test_adam_trains_a_bfloat16_model():
    """The audit's case: three Adam steps on bfloat16 parameters moved nothing (count 3, no
    fault, the loss unchanged); now the point moves and the loss falls."""
    step = train_step(MODEL, half_squared_error, adam(0.1))
    X, Y = jnp.ones((4, 2), jnp.bfloat16), jnp.zeros((4, 1), jnp.bfloat16)
    s = step.init(cast(P0, jnp.bfloat16))
    losses = []
    for _ in range(3):
        s, r = step(s, X, Y)
        losses.append(float(r.loss))
    assert int(s.count) == 3 and int(s.fault[0]) == 0
    assert losses[2] < losses[0]
    assert not same_bits(s.params[0], cast(P0[0], jnp.bfloat16))


# -- a stateful optimiser is stepped with its own state --------------------------------------------

PC = Covector(tuple(jnp.asarray(a) for a in COVECTORS[0]), MODEL.param)
STATEFUL = [adam(0.1), momentum(0.1), nesterov(0.1), adagrad(0.1), gd(lambda count: 0.1)]
NAMES = ["adam", "momentum", "nesterov", "adagrad", "gd_scheduled"]  # ids the same in every worker


@pytest.mark.parametrize("opt", STATEFUL, ids=NAMES)
def test_a_stateful_optimiser_is_not_called_without_its_state(opt):
    with pytest.raises(KindError, match=r"keeps a state.*opt\.step\(opt\.init\(p\), p, p_cov\)"):
        opt(P0, PC)
    # callable or not, an optimiser is no loss (arguments swapped)
    with pytest.raises(KindError, match="got the optimiser"):
        train_step(MODEL, opt, gd(0.1))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gd_called_is_the_hand_formula(dtype):
    with pytest.raises(KindError, match="got the optimiser"):
        train_step(MODEL, gd(0.1), gd(0.1))  # callable, but no loss
    p = cast(P0, dtype)
    new = gd(0.1)(p, Covector(cast(PC.value, dtype), MODEL.param))
    for a, b, g in zip(new, p, PC.value):
        np.testing.assert_allclose(a, np.asarray(b) - 0.1 * np.asarray(g), rtol=1e-6)


OPTIMISERS = [gd(0.1)] + STATEFUL


@pytest.mark.parametrize("i", range(len(OPTIMISERS)))
def test_step_refuses_another_optimisers_state(i):
    opt = OPTIMISERS[i]
    for other in OPTIMISERS:
        theirs = other.init(P0)
        alike = jax.tree_util.tree_structure(theirs) == \
            jax.tree_util.tree_structure(opt.init(P0))  # momentum and nesterov: one structure
        try:
            s, p = opt.step(theirs, P0, PC)
        except ParalensError as e:
            assert not alike and isinstance(e, (SpaceMismatch, KindError)), (opt, other, e)
            continue
        assert alike, (opt, other)
        assert all(map(same_bits, p, opt.step(opt.init(P0), P0, PC)[1]))
    with pytest.raises(SpaceMismatch, match="not one of"):
        opt.step(P0, P0, PC)  # the parameters where the state belongs


@pytest.mark.parametrize("space", ["R2", 3, R(2), None])
def test_step_takes_a_space_or_none(space):
    opt = adam(0.1)
    try:
        _, p = opt.step(opt.init(P0), P0, PC, space=space)
    except ParalensError as e:
        assert isinstance(e, (KindError, SpaceMismatch)) and space is not None, e
        assert not isinstance(space, str) or "must be a Space" in str(e)
        return
    assert space is None
    assert all(map(same_bits, p, opt.step(opt.init(P0), P0, PC, space=MODEL.param)[1]))


# -- GaussNewton's counts --------------------------------------------------------------------------

def _count(x, least):
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) and x >= least


@FUZZ
@given(st.one_of(JUNK, st.integers(-2, 3)), st.one_of(JUNK, st.integers(-2, 3)))
@example(0, 2000)   # no CG iteration: the covector was never solved for, the step 0
@example(500, -1)   # a negative dense_max
def test_gauss_newton_takes_counts(cg_iters, dense_max):
    for kind in (GaussNewton, Fisher):
        try:
            metric = kind(solver="cg", cg_iters=cg_iters, dense_max=dense_max)
        except ParalensError as e:
            assert isinstance(e, HyperparameterError), e
            assert not (_count(cg_iters, 1) and _count(dense_max, 0)), (cg_iters, dense_max)
            assert kind.__name__ in str(e)
            continue
        assert _count(cg_iters, 1) and _count(dense_max, 0), (cg_iters, dense_max)
        assert (metric.cg_iters, metric.dense_max) == (cg_iters, dense_max)


def _number(x, least):
    if isinstance(x, (np.ndarray, jax.Array)) and x.ndim == 0:
        x = x.item()
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_)) \
        and bool(np.isfinite(x)) and x >= least


@FUZZ
@given(st.one_of(JUNK, st.floats(-1, 1), st.sampled_from([np.float32(0.1), np.int64(2)])),
       st.one_of(JUNK, st.floats(-1e-3, 1e-3)))
@example("0.1", 1e-10)       # a string damping: a raw TypeError from `<` before
@example(float("nan"), 1e-10)  # a NaN damping: accepted before, every step NaN
@example(0.1, "tight")       # a string tolerance: accepted before
@example(jnp.asarray(0.1), np.asarray(1e-10))  # 0-d arrays: numbers, as float() always took them
def test_the_data_metrics_take_finite_numbers(damping, cg_tol):
    for kind in (GaussNewton, Fisher, KFAC):
        args = dict(damping=damping) if kind is KFAC else dict(damping=damping, cg_tol=cg_tol)
        try:
            metric = kind(**args)
        except ParalensError as e:
            assert isinstance(e, HyperparameterError), e
            assert not (_number(damping, 0) and (kind is KFAC or _number(cg_tol, 0))), args
            assert kind.__name__ in str(e)
            continue
        assert _number(damping, 0) and (kind is KFAC or _number(cg_tol, 0)), args
        assert metric.damping == float(damping)


def test_a_misspelt_keyword_of_fisher_names_fisher():
    with pytest.raises(TypeError, match=r"Fisher\.__init__\(\) got an unexpected keyword"):
        Fisher(dampning=1e-3)


def test_an_optimiser_is_no_lookahead():
    """Every optimiser is callable (the call is refused), so `callable` alone took one as a
    lookahead (s, p) -> point; it is refused where it is given."""
    from lenses import chain, scale_by_learning_rate, sharp
    with pytest.raises(KindError, match="lookahead must be"):
        chain(sharp(), scale_by_learning_rate(0.1), lookahead=adam(0.1))
