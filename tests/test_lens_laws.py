"""The laws of lenses and parameterised lenses (lenses.laws), on drawn lenses and points.

Each property runs the reusable check on random lenses (lenses.strategies); the last tests
feed deliberately broken constructions to the same checks, to show that they can fail.
"""

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings, strategies as st

from categories import R, Smooth
from categories import strategies as cs
from lenses import Layer, checkpoint, dense, tanh
from lenses import laws
from lenses import strategies as ls


def examples(n):
    """At most n examples (fewer under a quicker Hypothesis profile): un-jitted JAX costs
    milliseconds per operation, so the heavier properties run fewer examples."""
    return settings(max_examples=min(n, settings.default.max_examples))


def draw_para(data, dom, cod, **kw):
    f = data.draw(ls.para_lenses(dom, cod, **kw))
    return f, data.draw(ls.parameter_points(f.param))


# -- plain lenses -----------------------------------------------------------------------------------

@examples(100)
@given(st.data())
def test_lens_composition_is_associative(data):
    A, B, C, D = (data.draw(ls.spaces()) for _ in range(4))
    f, g, h = data.draw(ls.lenses(A, B)), data.draw(ls.lenses(B, C)), data.draw(ls.lenses(C, D))
    laws.check_lens_associativity(f, g, h, data.draw(ls.points(A)), data.draw(ls.covectors(D)))


@examples(100)
@given(st.data())
def test_lens_identities(data):
    A, B = data.draw(ls.spaces()), data.draw(ls.spaces())
    f = data.draw(ls.lenses(A, B))
    laws.check_lens_identities(f, data.draw(ls.points(A)), data.draw(ls.covectors(B)))
    laws.check_lens_of_identity(A, data.draw(ls.points(A)), data.draw(ls.covectors(A)))


@examples(100)
@given(st.data())
def test_lens_of_preserves_composition(data):
    A, B, C = (data.draw(ls.spaces()) for _ in range(3))
    f, g = data.draw(ls.affine_maps(A, B)), data.draw(ls.affine_maps(B, C))
    laws.check_lens_of_composition(f, g, data.draw(ls.points(A)), data.draw(ls.covectors(C)))


# -- parameterised lenses ----------------------------------------------------------------------

@examples(40)
@given(st.data())
def test_para_lens_composition_is_associative_up_to_flattening(data):
    A, B, C, D = (data.draw(ls.spaces()) for _ in range(4))
    (f, p), (g, q), (h, r) = draw_para(data, A, B), draw_para(data, B, C), draw_para(data, C, D)
    laws.check_para_lens_associativity(f, g, h, data.draw(ls.points(A)), p, q, r,
                                       data.draw(ls.covectors(D)))


@examples(100)
@given(st.data())
def test_para_lens_identities(data):
    A, B = data.draw(ls.spaces()), data.draw(ls.spaces())
    f, p = draw_para(data, A, B)
    laws.check_para_lens_identities(f, data.draw(ls.points(A)), p, data.draw(ls.covectors(B)))


@examples(40)
@given(st.data())
def test_parallel_product_is_functorial(data):
    A, B, B2, C, D, D2 = (data.draw(ls.spaces()) for _ in range(6))
    (f, p), (h, r) = draw_para(data, A, B), draw_para(data, B, B2)
    (g, q), (k, s) = draw_para(data, C, D), draw_para(data, D, D2)
    laws.check_parallel_interchange(
        f, g, h, k, data.draw(ls.points(A)), data.draw(ls.points(C)), p, q, r, s,
        data.draw(ls.covectors(B2)), data.draw(ls.covectors(D2)))


# -- copy, discard, add ---------------------------------------------------------------------------

@examples(100)
@given(st.data())
def test_copy_discard_add(data):
    A = data.draw(ls.spaces())
    a, a2 = data.draw(ls.points(A)), data.draw(ls.points(A))
    u, v, w = (data.draw(ls.covectors(A)) for _ in range(3))
    laws.check_copy_counit(A, a, u)
    laws.check_copy_backward_adds(A, a, u, v)
    laws.check_discard_backward_zero(A, a)
    laws.check_copy_commutative(A, a, u, v)
    laws.check_copy_coassociative(A, a, u, v, w)
    if A in (R(1), R(3)):  # add needs a vector space: the sum of two points of a box can leave it
        laws.check_add_backward_copies(A, a, a2, w)


# -- reparameterisation, tying, checkpointing ------------------------------------------------------

@examples(100)
@given(st.data())
def test_reparam_along_identity_changes_nothing(data):
    A, B = data.draw(ls.spaces()), data.draw(ls.spaces())
    f, p = draw_para(data, A, B)
    laws.check_reparam_identity(f, data.draw(ls.points(A)), p, data.draw(ls.covectors(B)))


@examples(40)
@given(st.data())
def test_reparam_twice_is_reparam_along_the_composite(data):
    A, B = data.draw(ls.spaces()), data.draw(ls.spaces())
    P = data.draw(st.sampled_from([R(3), R(2, 3)]))
    Q1, Q2 = data.draw(st.sampled_from([R(1), R(3)])), data.draw(st.sampled_from([R(1), R(3)]))
    f, _ = draw_para(data, A, B, param=P)
    r1, r2 = data.draw(ls.affine_maps(Q1, P)), data.draw(ls.affine_maps(Q2, Q1))
    laws.check_reparam_composition(f, r1, r2, data.draw(ls.points(A)), data.draw(ls.points(Q2)),
                                   data.draw(ls.covectors(B)))


@examples(40)
@given(st.data())
def test_tying_along_the_diagonal_adds_the_covectors(data):
    A, B, C = (data.draw(ls.spaces()) for _ in range(3))
    P = data.draw(st.sampled_from([R(3), R(2, 3)]))
    (f, p), (g, _) = draw_para(data, A, B, param=P), draw_para(data, B, C, param=P)
    laws.check_tie_sums(f, g, data.draw(ls.points(A)), p, data.draw(ls.covectors(C)))


@examples(6)
@given(ls.architectures(depth=(1, 2), widths=(1, 3)), st.data())
def test_store_rule_equals_recompute_rule(arch, data):
    f = arch.lens
    n = 3  # one batch size: each new shape costs un-jitted JAX a compilation
    X = jnp.asarray(data.draw(cs.arrays((n,) + f.dom.shape)))
    Bc = jnp.asarray(data.draw(cs.arrays((n,) + f.cod.shape)))
    laws.check_store_equals_recompute(f, X[0], data.draw(ls.parameter_points(f.param)), Bc[0], X, Bc)


# -- the checks can fail ------------------------------------------------------------------------

A3 = R(3)
a, u, v = jnp.array([0.5, -1.0, 2.0]), jnp.array([1.0, 2.0, 3.0]), jnp.array([-1.0, 0.5, 4.0])
Wb = (jnp.array([[1.0, -0.5, 0.2], [0.3, 0.8, -1.0], [0.0, 0.4, 0.6]]), jnp.array([0.1, 0.2, -0.3]))


def with_backward(h, backward, name):
    """h's forward part with a hand-written (here: wrong) backward part."""
    return Layer(h.dom, h.cod, h.param, h.forward, backward=backward, name=name)


def test_a_copy_that_does_not_add_breaks_the_law():
    def keeps_first(A):
        return Layer(A, A * A, R(0), lambda x, p: (x, x), backward=lambda x, p, c: (c[0], None),
                        name="copy")

    with pytest.raises(AssertionError, match="check_copy_backward_adds"):
        laws.check_copy_backward_adds(A3, a, u, v, copy=keeps_first)


def test_a_recompute_rule_that_loses_the_parameter_covector_breaks_the_law():
    f, p = dense(3, 3) >> tanh, (Wb, None)

    def loses(f):
        zero = lambda p: jax.tree_util.tree_map(jnp.zeros_like, p)
        return with_backward(f, lambda x, p, c: (f.backward(x, p, c)[0].value, zero(p)), "bad")

    with pytest.raises(AssertionError, match="check_store_equals_recompute"):
        laws.check_store_equals_recompute(f, a, p, u, checkpoint=loses)
    laws.check_store_equals_recompute(f, a, p, u, checkpoint=checkpoint)


def test_a_composite_that_skips_a_backward_part_breaks_associativity():
    def sloppy(f, g):  # the input covector of f ≫ g computed as if g' were the identity
        h = f >> g
        n = len(f.parts)
        return with_backward(h, lambda x, p, c: (f.backward(x, p[:n] if n > 1 else p[0], c)[0].value,
                                                 h.backward(x, p, c)[1].value), "sloppy")

    f, g, k = dense(3, 3), tanh.at(R(3)), dense(3, 3)
    with pytest.raises(AssertionError, match="check_para_lens_associativity"):
        laws.check_para_lens_associativity(f, g, k, a, Wb, None, Wb, u, compose=sloppy)


def test_a_tie_that_averages_breaks_the_law():
    def averaging_tie(h, slots):
        t = h.reparam(Smooth(h.param.factors[0], h.param, lambda q: (q, q), "Δ"))
        half = lambda x, q, c: jax.tree_util.tree_map(lambda y: 0.5 * y, t.backward(x, q, c)[1].value)
        return with_backward(t, lambda x, q, c: (t.backward(x, q, c)[0].value, half(x, q, c)), "avg")

    with pytest.raises(AssertionError, match="check_tie_sums"):
        laws.check_tie_sums(dense(3, 3), dense(3, 3), a, Wb, u, tie=averaging_tie, uses=lambda t: 2)
    laws.check_tie_sums(dense(3, 3), dense(3, 3), a, Wb, u)


def test_every_law_has_a_statement():
    assert len(laws.LAWS) >= 18
    assert all(statement for statement in laws.LAWS.values())
