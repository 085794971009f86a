"""The category of smooth maps and its finite products, checked by `categories.laws`.

Each law is a Hypothesis property over drawn spaces (scalars, vectors, matrices, R^0, open
boxes/balls/orthants, products), maps and points; each group also gets a deliberately wrong
construction, to show that the check notices.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from categories import OpenBox, Positive, Product, R, Smooth, laws, pair, smooth_discard, smooth_identity
from categories import strategies as cs


def draw_spaces(data, n):
    return [data.draw(cs.spaces(), label=f"space {i}") for i in range(n)]


# -- the category ------------------------------------------------------------------------------

@given(st.data())
def test_composition(data):
    A, B, C = draw_spaces(data, 3)
    f, g = data.draw(cs.smooth_maps(A, B, depth=2), "f"), data.draw(cs.smooth_maps(B, C, depth=2), "g")
    laws.check_composition(f, g, data.draw(cs.points(A), "x"))


@given(st.data())
def test_associativity(data):
    A, B, C, D = draw_spaces(data, 4)
    f, g, h = (data.draw(cs.smooth_maps(X, Y, depth=1), n) for X, Y, n in
               ((A, B, "f"), (B, C, "g"), (C, D, "h")))
    laws.check_associativity(f, g, h, data.draw(cs.points(A), "x"))


@given(st.data())
def test_identity_laws(data):
    A, B = draw_spaces(data, 2)
    laws.check_identity_laws(data.draw(cs.smooth_maps(A, B, depth=1), "f"), data.draw(cs.points(A), "x"))


# -- products ----------------------------------------------------------------------------------

@given(st.data())
def test_pair_projections(data):
    A, B, C = draw_spaces(data, 3)
    f, g = data.draw(cs.smooth_maps(A, B, depth=1), "f"), data.draw(cs.smooth_maps(A, C, depth=1), "g")
    laws.check_pair_projections(f, g, data.draw(cs.points(A), "x"))


@given(st.data())
def test_pairing_uniqueness(data):
    A, B, C = draw_spaces(data, 3)
    h = data.draw(cs.smooth_maps(A, B * C, depth=1), "h")
    laws.check_pairing_uniqueness(h, data.draw(cs.points(A), "x"))


@given(st.data())
def test_product_map(data):
    A, B, C, D = draw_spaces(data, 4)
    f, g = data.draw(cs.smooth_maps(A, B, depth=1), "f"), data.draw(cs.smooth_maps(C, D, depth=1), "g")
    laws.check_product_map(f, g, data.draw(cs.points(A), "x"), data.draw(cs.points(C), "y"))


@given(st.data())
def test_diagonal(data):
    A, B = draw_spaces(data, 2)
    laws.check_diagonal(data.draw(cs.smooth_maps(A, B, depth=1), "f"), data.draw(cs.points(A), "x"))


@given(st.data())
def test_discard(data):
    A, B = draw_spaces(data, 2)
    x = data.draw(cs.points(A), "x")
    g = data.draw(cs.smooth_maps(A, B, depth=1), "g")
    laws.check_discard(g >> smooth_discard(B), x)  # g ≫ !_B = !_A: R^0 is terminal
    laws.check_discard(data.draw(cs.smooth_maps(A, R(0), depth=1), "f : A → R^0"), x)


# R^0 in every position of the product laws, explicitly (the properties draw it too).
Z, V, M = R(0), R(3), R(2, 3)
SQUARE = Smooth(V, V, lambda x: jnp.tanh(x) * x[::-1], "tanh(x)·rev(x)")
TO_M = Smooth(V, M, lambda x: jnp.outer(jnp.sin(x[:2]), x), "sin ⊗ id")
TO_Z = Smooth(V, Z, lambda x: None, "to R^0")
FROM_Z = Smooth(Z, V, lambda z: jnp.array([1.0, -2.0, 0.5]), "const")
x3 = jnp.array([0.3, -1.2, 0.7])


@pytest.mark.parametrize("f,g", [(TO_Z, SQUARE), (SQUARE, TO_Z), (TO_Z, TO_Z), (TO_M, TO_Z)],
                         ids=["R0×V", "V×R0", "R0×R0", "M×R0"])
def test_product_laws_with_terminal_factors(f, g):
    laws.check_pair_projections(f, g, x3)
    laws.check_pairing_uniqueness(pair(f, g), x3)
    laws.check_product_map(f, g, x3, x3)
    laws.check_diagonal(f, x3)
    laws.check_diagonal(g, x3)


def test_laws_on_the_terminal_object():
    laws.check_identity_laws(FROM_Z, None)
    laws.check_composition(FROM_Z, SQUARE, None)
    laws.check_associativity(TO_Z, FROM_Z, TO_Z, x3)
    laws.check_diagonal(smooth_identity(Z), None)
    laws.check_diagonal(FROM_Z, None)
    laws.check_product_map(FROM_Z, TO_Z, None, x3)
    laws.check_discard(smooth_discard(Z), None)
    laws.check_discard(TO_Z, x3)
    laws.check_discard(SQUARE >> TO_M >> smooth_discard(M), x3)


# -- wrong constructions are reported ----------------------------------------------------------

def backwards(f, g):
    """A 'composition' that applies g before f (typed only when all spaces agree)."""
    return Smooth(f.dom, g.cod, lambda x: f.fn(g.fn(x)), f"{g.name} then {f.name}")


SHIFT = Smooth(V, V, lambda x: x + jnp.array([1.0, 0.0, -1.0]), "shift")


def test_composition_in_the_wrong_order_is_reported():
    with pytest.raises(AssertionError, match=r"(?s)check_composition failed.*g\(f\(x\)\)"):
        laws.check_composition(SQUARE, SHIFT, x3, compose=backwards)
    # The opposite category is a category: associativity and units cannot see the reversal,
    # which is why composition is also checked against evaluation.
    laws.check_associativity(SQUARE, SHIFT, SQUARE, x3, compose=backwards)
    laws.check_identity_laws(SQUARE, x3, compose=backwards)


def test_non_associative_composition_is_reported():
    def lopsided(f, g):  # shifts a composite whose first factor is itself a composite
        offset = 0.1 if "≫" in f.name else 0.0
        ff, gg = f.fn, g.fn
        return Smooth(f.dom, g.cod, lambda x: gg(ff(x)) + offset, f"{f.name} ≫ {g.name}")

    laws.check_composition(SQUARE, SHIFT, x3, compose=lopsided)
    with pytest.raises(AssertionError, match=r"\(\(f ≫ g\) ≫ h\)\(x\) vs \(f ≫ \(g ≫ h\)\)\(x\)"):
        laws.check_associativity(SQUARE, SHIFT, SQUARE, x3, compose=lopsided)


def test_wrong_identity_is_reported():
    def double(A):
        return Smooth(A, A, lambda x: 2 * x, "2·id")

    with pytest.raises(AssertionError, match=r"(?s)check_identity_laws failed.*\(1 ≫ f\)\(x\) vs f\(x\)"):
        laws.check_identity_laws(SQUARE, x3, identity=double)


def fake_fst(A, B=None):
    """π₀ that returns the second component (typed as A × B → A)."""
    AB = A if B is None else A * B
    return Smooth(AB, AB.factors[0], lambda ab: ab[1], "fake π₀")


def test_fst_returning_the_second_component_is_reported():
    with pytest.raises(AssertionError, match=r"⟨f, g⟩ ≫ π₀"):
        laws.check_pair_projections(SQUARE, SHIFT, x3, fst=fake_fst)
    with pytest.raises(AssertionError, match="check_pairing_uniqueness"):
        laws.check_pairing_uniqueness(pair(SQUARE, SHIFT), x3, fst=fake_fst)
    # On different factors the wrong component has the wrong shape: still a failed law.
    with pytest.raises(AssertionError, match="shapes differ"):
        laws.check_pair_projections(SQUARE, TO_M, x3, fst=fake_fst)


def test_swapped_pairing_and_product_are_reported():
    def swapped_pair(f, g):
        return Smooth(f.dom, f.cod * g.cod, lambda x: (g.fn(x), f.fn(x)), "swapped")

    def swapped_product(f, g):
        return Smooth(f.dom * g.dom, f.cod * g.cod, lambda xy: (f.fn(xy[1]), g.fn(xy[0])), "×?")

    with pytest.raises(AssertionError, match="check_pair_projections"):
        laws.check_pair_projections(SQUARE, SHIFT, x3, pair=swapped_pair)
    with pytest.raises(AssertionError, match="check_pairing_uniqueness"):
        laws.check_pairing_uniqueness(pair(SQUARE, SHIFT), x3, pair=swapped_pair)
    with pytest.raises(AssertionError, match="check_product_map"):
        laws.check_product_map(SQUARE, SHIFT, x3, -x3, product=swapped_product)


def test_diagonal_that_does_not_copy_is_reported():
    def half_copy(A):
        return Smooth(A, A * A, lambda x: (x, 0.0 * x), "not Δ")

    with pytest.raises(AssertionError, match=r"Δ ≫ π₁"):
        laws.check_diagonal(SQUARE, x3, diagonal=half_copy)


def test_discard_that_returns_something_is_reported():
    def keep(A):
        return Smooth(A, R(0), lambda x: x, "not !")

    with pytest.raises(AssertionError, match="single point None"):
        laws.check_discard(TO_Z, x3, discard=keep)
    with pytest.raises(AssertionError, match="single point None"):
        laws.check_discard(Smooth(V, Z, lambda x: jnp.zeros(0)), x3)
    with pytest.raises(AssertionError, match="terminal"):
        laws.check_discard(SQUARE, x3)


# -- the comparison itself -----------------------------------------------------------------------

def test_assert_close_reports_where_and_by_how_much():
    laws.assert_close((jnp.ones(3), None), (jnp.ones(3) + 1e-12, None))
    with pytest.raises(AssertionError, match=r"^x: at \[1\]\[2\]: .*\|difference\| 0\.5"):
        laws.assert_close((None, np.zeros(3)), (None, np.array([0.0, 0.0, 0.5])), what="x")
    with pytest.raises(AssertionError, match="different structures"):
        laws.assert_close((jnp.ones(2), None), (None, jnp.ones(2)))
    with pytest.raises(AssertionError, match="shapes differ"):
        laws.assert_close(jnp.ones((2, 3)), jnp.ones((3, 2)))
    with pytest.raises(AssertionError):
        laws.assert_close(jnp.array([jnp.nan]), jnp.array([jnp.nan]))
    laws.assert_close(1.0, 1.001, atol=0.01)  # tolerances are configurable


def test_laws_are_registered_with_their_statements():
    assert laws.LAWS["check_rd5"].startswith("RD.5")
    assert all(name in laws.__all__ for name in laws.LAWS)
    assert len(laws.LAWS) >= 27


def test_open_domains_are_respected_by_drawn_maps():
    box = OpenBox(-1.0, 1.0, (3,))
    f = Smooth(box, Positive(3), lambda x: jnp.exp(x), "exp")
    laws.check_composition(f, Smooth(Positive(3), V, jnp.log, "log"), x3 * 0.5)
    with pytest.raises(AssertionError, match="evaluating it raised DomainError"):
        laws.check_composition(f, Smooth(Positive(3), V, jnp.log, "log"), x3 * 2)
    assert Product(box, Z).contains((x3 * 0.5, None))
