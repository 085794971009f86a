"""Bad input to the core of a lens (its key, its operators, its hand-written parts) meets a
catalogued error naming what was given and the fix, and loses nothing: a fixed example per
finding, and an oracle check where numbers matter (a hand-written backward part that is
accepted must give the true gradient step, computed here by hand)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from categories import R, Smooth
from categories.errors import CovectorError, KindError, SpaceMismatch
from lenses import (Affine, Layer, batched, dense, family, gd, half_squared_error, linear, relu,
                    tanh, train_step)

KEY = jax.random.PRNGKey(0)


# -- 1. init takes one key ---------------------------------------------------------------------
@pytest.mark.parametrize("key", [jax.random.split(KEY), jnp.array([1, 2, 3], jnp.uint32),
                                 jax.random.split(jax.random.key(0))],
                         ids=["split raw", "raw of shape 3", "split typed"])
def test_init_refuses_other_than_one_key(key):
    model = dense(2, 3) >> relu >> dense(3, 1)
    with pytest.raises(KindError, match=r"one PRNG key.*got .*shape.*jax.random.split\(k\)\[0\]"):
        model.init(key)


def test_init_takes_one_key_of_either_kind():
    model = dense(2, 3) >> relu >> dense(3, 1)
    for key in (KEY, jax.random.key(0), jax.random.split(KEY)[0]):
        assert jax.tree_util.tree_structure(model.init(key)) == \
            jax.tree_util.tree_structure(model.init(KEY))


# -- 2. >> and @ take lenses -------------------------------------------------------------------
@pytest.mark.parametrize("make", [lambda: dense(2, 2) >> jnp.tanh, lambda: dense(2, 2) >> 3,
                                  lambda: dense(2, 2) @ 3, lambda: 3 >> dense(2, 2),
                                  lambda: 3 @ dense(2, 2), lambda: tanh >> 3, lambda: tanh @ 3,
                                  lambda: 3 @ tanh],
                         ids=[">> jnp.tanh", ">> 3", "@ 3", "3 >>", "3 @", "tanh >> 3",
                              "tanh @ 3", "3 @ tanh"])
def test_operators_refuse_what_is_not_a_lens(make):
    with pytest.raises(KindError, match="is not a lens or a family of lenses"):
        make()


def test_a_jax_function_is_pointed_to_activation():
    with pytest.raises(KindError, match=r"the function tanh .*activation\(name, fn\)"):
        dense(2, 2) >> jnp.tanh


def test_batched_is_not_composed():
    with pytest.raises(KindError, match=r"compose first, then batch: batched\(f >> g\)"):
        batched(dense(2, 1)) >> dense(1, 1)


def test_smooth_composes_only_with_smooth():
    with pytest.raises(KindError, match="a smooth map composes with a smooth map"):
        Smooth(R(1), R(1), jnp.sin, "sin") >> 3


# -- 3. a hand-written backward part -----------------------------------------------------------
def _scale(backward):
    return Layer(R(2), R(2), R(2), lambda a, p: a * p, backward=backward, name="scale")


def test_wrongly_shaped_backward_is_refused():
    bad = _scale(lambda a, p, b: (b[:1], b[:1]))
    with pytest.raises(CovectorError, match=r"scale gives a' .*shape \(2,\).*shape \(1,\)"):
        bad.backward(jnp.ones(2), jnp.array([1.0, 2.0]), jnp.ones(2))


def test_wrongly_shaped_backward_is_refused_in_training():
    step = train_step(_scale(lambda a, p, b: (b[:1], b[:1])), half_squared_error, gd(0.1))
    X, Y = jnp.ones((1, 2)), jnp.zeros((1, 2))
    with pytest.raises(CovectorError, match="the backward part of scale"):
        step(step.init(jnp.array([1.0, 2.0])), X, Y)


def test_backward_not_a_pair_or_not_callable():
    with pytest.raises(CovectorError, match=r"must return a pair \(a', p'\)"):
        _scale(lambda a, p, b: b).backward(jnp.ones(2), jnp.ones(2), jnp.ones(2))
    with pytest.raises(KindError, match="backward part of scale must be a function"):
        _scale(3)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_a_correct_backward_steps_by_the_true_gradient(dtype):
    """Oracle by hand: loss ½|x ⊙ p − y|² at x = 1, y = 0 has gradient p, so one step of
    gd(0.1) from p = (1, 2) lands at (0.9, 1.8)."""
    step = train_step(_scale(lambda a, p, b: (b * p, b * a)), half_squared_error, gd(0.1))
    p0 = jnp.array([1.0, 2.0], dtype)
    state, _ = step(step.init(p0), jnp.ones((1, 2), dtype), jnp.zeros((1, 2), dtype))
    assert state.params.dtype == dtype
    np.testing.assert_allclose(np.asarray(state.params), [0.9, 1.8], rtol=1e-6)


# -- 5. what a Layer is given -------------------------------------------------------------------
def _layer(**kw):
    return Layer(R(2), R(2), R(2), lambda a, p: a * p, name="scale", **kw)


@pytest.mark.parametrize("kw, error, match", [
    (dict(init=5), KindError, "init part of scale must be a function"),
    (dict(smooth="no"), KindError, "smooth flag of scale must be True or False"),
    (dict(at_evaluation=5), KindError, "at_evaluation of scale needs a lens"),
    (dict(structure=Affine(bias=True)), KindError, r"must be R\^\{2×2\} × R\^2"),
    (dict(structure="affine"), KindError, r"must be None or Affine"),
], ids=["init=5", "smooth='no'", "at_evaluation=5", "Affine without bias", "structure str"])
def test_layer_refuses_bad_parts(kw, error, match):
    with pytest.raises(error, match=match):
        _layer(**kw)


def test_affine_flags_and_init_result():
    with pytest.raises(KindError, match="Affine's bias must be True or False"):
        Affine(bias="x")
    with pytest.raises(SpaceMismatch, match=r"init of scale .*shape \(2,\).*shape \(3,\)"):
        _layer(init=lambda k: jnp.ones(3)).init(KEY)
    assert _layer(init=lambda k: jnp.ones(2)).init(KEY).shape == (2,)


def test_reparam_needs_a_smooth_map_and_a_function_init():
    with pytest.raises(KindError, match=r"dense\(2→2\).reparam needs a smooth map"):
        dense(2, 2).reparam(3)
    w = Smooth(R(), R(1, 1), lambda q: jnp.reshape(q, (1, 1)), "w")
    with pytest.raises(KindError, match="init of linear.*reparam must be a function"):
        linear(1, 1).reparam(w, init=5)


# -- 4. .at on a fixed lens ---------------------------------------------------------------------
def test_at_on_a_lens_is_itself_at_its_domain_only():
    lens = dense(2, 1)
    assert lens.at(R(2)) is lens
    with pytest.raises(SpaceMismatch, match=r"dense\(2→1\) is already fixed at R\^2, got R\^3"):
        lens.at(R(3))
    with pytest.raises(KindError, match="needs a Space"):
        lens.at(3)


# -- 6. what a family builds --------------------------------------------------------------------
def test_family_refuses_bad_make_and_bad_members():
    with pytest.raises(KindError, match="make of the family 'x' must be a function"):
        family(3, "x")
    with pytest.raises(KindError, match="family x at R\\^2 gives int 3, not a lens"):
        family(lambda A: 3, "x").at(R(2))
    with pytest.raises(SpaceMismatch, match=r"gives dense\(3→1\), whose domain is R\^3"):
        family(lambda A: dense(3, 1), "x").at(R(2))


def test_family_member_is_a_lens_on_its_domain():
    """Oracle by hand: the doubling family at R^2 doubles (1, 2)."""
    double = family(lambda A: Layer(A, A, R(0), lambda a, p: 2 * a, name="double"), "double")
    np.testing.assert_allclose(np.asarray(double.at(R(2))(jnp.array([1.0, 2.0]), None)), [2.0, 4.0])
