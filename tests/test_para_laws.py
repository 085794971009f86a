"""The Para construction: composition with product parameters, units, reparameterisation, tying.

Parameter objects are drawn like any space (R^0 included: a layer without parameters), and
composites are drawn both as single maps and as chains, to exercise the flattening of the
parameter point. Each group also meets a deliberately wrong construction.
"""

import jax.numpy as jnp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from categories import (OpenBox, Para, Positive, Product, R, Smooth, laws, para_identity,
                        para_of, para_tie, smooth_identity, tying_map)
from categories import strategies as cs


def draw_spaces(data, n, strategy=cs.spaces):
    return [data.draw(strategy(), label=f"space {i}") for i in range(n)]


@st.composite
def para_chains(draw, dom, cod):
    """A parameterised map dom → cod and a parameter point for it: one map, or a chain of two."""
    if draw(st.booleans()):
        mid = draw(cs.spaces())
        f, g = draw(cs.para_maps(dom, mid)), draw(cs.para_maps(mid, cod))
        fg = f >> g
        return fg, (draw(cs.points(f.param)), draw(cs.points(g.param)))
    f = draw(cs.para_maps(dom, cod))
    return f, draw(cs.points(f.param))


@given(st.data())
def test_para_composition(data):
    A, B, C = draw_spaces(data, 3)
    f, p = data.draw(para_chains(A, B), "f, p")
    g, q = data.draw(para_chains(B, C), "g, q")
    laws.check_para_composition(f, g, data.draw(cs.points(A), "a"), p, q)


@given(st.data())
def test_para_associativity(data):
    A, B, C, D = draw_spaces(data, 4)
    f, p = data.draw(para_chains(A, B), "f, p")
    g, q = data.draw(para_chains(B, C), "g, q")
    h, r = data.draw(para_chains(C, D), "h, r")
    laws.check_para_associativity(f, g, h, data.draw(cs.points(A), "a"), p, q, r)


@given(st.data())
def test_para_units(data):
    A, B = draw_spaces(data, 2)
    f, p = data.draw(para_chains(A, B), "f, p")
    laws.check_para_units(f, data.draw(cs.points(A), "a"), p)


@given(st.data())
def test_reparam_along_identity(data):
    A, B = draw_spaces(data, 2)
    f = data.draw(cs.para_maps(A, B), "f")
    laws.check_reparam_identity(f, data.draw(cs.points(A), "a"), data.draw(cs.points(f.param), "p"))


@given(st.data())
def test_reparam_composition(data):
    A, B, Q, Q2 = draw_spaces(data, 4)
    f = data.draw(cs.para_maps(A, B), "f")
    r1 = data.draw(cs.smooth_maps(Q, f.param, depth=1), "r1")
    r2 = data.draw(cs.smooth_maps(Q2, Q, depth=1), "r2")
    laws.check_reparam_composition(f, r1, r2, data.draw(cs.points(A), "a"),
                                   data.draw(cs.points(Q2), "q"))


@given(st.data())
def test_weight_tying(data):
    A, B, C, P = draw_spaces(data, 4)
    f, g = data.draw(cs.para_maps(A, B, P), "f"), data.draw(cs.para_maps(B, C, P), "g")
    laws.check_weight_tying(f, g, data.draw(cs.points(A), "a"), data.draw(cs.points(P), "p"))


# -- explicit cases with R^0 -------------------------------------------------------------------------

V, M, Z = R(3), R(2, 3), R(0)
DENSE = Para(V, R(2), Product(M, R(2)), lambda a, p: jnp.tanh(p[0] @ a + p[1]), "dense")
SCALE = Para(R(2), R(2), R(), lambda a, s: s * a, "scale")
SIN = para_of(Smooth(R(2), R(2), jnp.sin, "sin"))
a = jnp.array([0.5, -1.0, 2.0])
w = (jnp.arange(6.0).reshape(2, 3) / 10, jnp.array([0.1, -0.2]))
s = jnp.asarray(1.5)


def test_para_laws_with_parameterless_layers():
    laws.check_para_composition(DENSE, SIN, a, w, None)
    laws.check_para_composition(para_identity(V), DENSE, a, None, w)
    laws.check_para_associativity(DENSE, SIN, SCALE, a, w, None, s)
    laws.check_para_associativity(para_identity(V), para_of(smooth_identity(V)), DENSE, a, None, None, w)
    laws.check_para_units(DENSE, a, w)
    laws.check_para_units(SIN, a[:2], None)
    laws.check_para_units(DENSE >> SIN >> SCALE, a, (w, None, s))
    laws.check_reparam_identity(SIN, a[:2], None)
    laws.check_weight_tying(SIN, SIN, a[:2], None)
    laws.check_weight_tying(SCALE, SCALE, a[:2], s)
    laws.check_weight_tying(Para(V, V, M, lambda x, p: p.T @ (p @ x)), Para(V, V, M, lambda x, p: p[0] * x),
                            a, w[0])
    # a reparameterisation from R^0 fixes the parameters: a constant map
    fixed = Smooth(Z, SCALE.param, lambda _: jnp.asarray(2.0), "2")
    laws.check_reparam_composition(SCALE, fixed, smooth_identity(Z), a[:2], None)


def test_tying_the_two_uses_of_one_layer():
    tied = para_tie(SCALE >> SCALE, [0, 1])
    laws.assert_close(tied(a[:2], s), s * s * a[:2])
    assert tying_map((SCALE >> SCALE).param, [0, 1]).dom in (SCALE.param, Product(SCALE.param))


def test_reparam_laws_on_open_parameter_objects():
    box, pos = OpenBox(-1.0, 1.0, ()), Positive()
    f = Para(R(2), R(2), pos, lambda x, p: jnp.log(p) * x, "log-scale")
    r1 = Smooth(box, pos, lambda t: jnp.exp(t), "exp")
    r2 = Smooth(R(), box, lambda t: jnp.tanh(t), "tanh")
    laws.check_reparam_composition(f, r1, r2, a[:2], jnp.asarray(0.7))
    laws.check_reparam_identity(f, a[:2], jnp.asarray(0.7))


# -- wrong constructions are reported -----------------------------------------------------------------

ENDO = Para(V, V, R(), lambda x, p: jnp.tanh(p * x + 1.0), "endo")
ENDO2 = Para(V, V, R(), lambda x, p: p * x[::-1] + x ** 2, "endo2")


def para_backwards(f, g):
    """A 'composite' that runs g first (typed only for endomorphisms)."""
    return Para(f.dom, g.cod, Product(f.param, g.param), lambda x, pq: f(g(x, pq[1]), pq[0]), "g;f")


def para_nested(f, g):
    """A composite whose parameter is the nested pair, never flattened."""
    return Para(f.dom, g.cod, Product(f.param, g.param), lambda x, pq: g(f(x, pq[0]), pq[1]),
                f"({f.name} ≫ {g.name})")


def test_para_composition_in_the_wrong_order_is_reported():
    with pytest.raises(AssertionError, match=r"(?s)check_para_composition failed.*g\(f\(a, p\), q\)"):
        laws.check_para_composition(ENDO, ENDO2, a, s, -s, compose=para_backwards)


def test_para_composition_without_flattening_is_reported():
    laws.check_para_composition(ENDO, ENDO2, a, s, -s, compose=para_nested)  # one step is fine
    with pytest.raises(AssertionError, match=r"(?s)check_para_associativity failed.*P × Q × R"):
        laws.check_para_associativity(ENDO, ENDO2, ENDO, a, s, -s, 2 * s, compose=para_nested)


def test_identity_with_parameters_is_reported():
    def scaled_identity(A):
        return Para(A, A, R(), lambda x, p: p * x, "not id")

    with pytest.raises(AssertionError, match=r"(?s)check_para_units failed.*parameter object of id ≫ f"):
        laws.check_para_units(ENDO, a, s, identity=scaled_identity)

    def shifting_identity(A):
        return Para(A, A, Z, lambda x, p: x + 1.0, "not id")

    with pytest.raises(AssertionError, match=r"\(id ≫ f\)\(a, \.\.\.\) vs f\(a, p\)"):
        laws.check_para_units(ENDO, a, s, identity=shifting_identity)


def reparam_ignoring_r(f, r):
    """A 'reparameterisation' that retypes the parameter but never applies r."""
    return Para(f.dom, f.cod, r.dom, f.fn, f.name + "[?]")


def test_reparam_that_ignores_r_is_reported():
    double = Smooth(R(), R(), lambda t: 2.0 * t, "2·")
    shift = Smooth(R(), R(), lambda t: t + 0.5, "+½")
    laws.check_reparam_identity(ENDO, a, s, reparam=reparam_ignoring_r)  # 1 cannot tell
    with pytest.raises(AssertionError, match=r"(?s)check_reparam_composition failed.*r1\(r2 q\)"):
        laws.check_reparam_composition(ENDO, double, shift, a, s, reparam=reparam_ignoring_r)



def test_tying_that_shares_nothing_is_reported():
    def tie_first_only(f, slots):  # the second slot gets a fixed value instead of the shared one
        return Para(f.dom, f.cod, f.param.factors[0], lambda x, p: f(x, (p, jnp.ones_like(p))), "tied?")

    with pytest.raises(AssertionError, match=r"(?s)check_weight_tying failed.*\(f ≫ g\)\(a, \(p, p\)\)"):
        laws.check_weight_tying(ENDO, ENDO2, a, s, tie=tie_first_only)
    with pytest.raises(AssertionError, match="slot_uses reports"):
        laws.check_weight_tying(ENDO, ENDO2, a, s, slot_uses=lambda r, uses: (1,))
    with pytest.raises(AssertionError, match="one parameter object"):
        laws.check_weight_tying(ENDO, DENSE, a, s)
