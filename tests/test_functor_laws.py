"""The differential D (covariant), the dual (contravariant) and the reverse derivative R.

D and R are checked on drawn smooth maps between drawn spaces (open subsets included: the
tangent space of an open set is the Euclidean space around it), the dual on drawn matrices.
RD.1–RD.7 are the reverse-derivative axioms (see `categories.laws`). Each group also meets a
deliberately wrong construction.
"""

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from categories import D, Linear, R, Smooth, linear_identity, laws, reverse_derivative
from categories import strategies as cs


def draw_spaces(data, n, strategy=cs.spaces):
    return [data.draw(strategy(), label=f"space {i}") for i in range(n)]


# -- D is a functor ----------------------------------------------------------------------------

@given(st.data())
def test_D_composition(data):
    A, B, C = draw_spaces(data, 3)
    f, g = data.draw(cs.smooth_maps(A, B, depth=1), "f"), data.draw(cs.smooth_maps(B, C, depth=1), "g")
    laws.check_D_composition(f, g, data.draw(cs.points(A), "x"), data.draw(cs.tangents(A), "v"))


@given(st.data())
def test_D_identity(data):
    (A,) = draw_spaces(data, 1)
    laws.check_D_identity(A, data.draw(cs.points(A), "x"), data.draw(cs.tangents(A), "v"))


@given(st.data())
def test_D_product(data):
    A, B, C, E = draw_spaces(data, 4)
    f, g = data.draw(cs.smooth_maps(A, B, depth=1), "f"), data.draw(cs.smooth_maps(C, E, depth=1), "g")
    laws.check_D_product(f, g, data.draw(cs.points(A), "x"), data.draw(cs.points(C), "y"),
                         data.draw(cs.tangents(A), "v"), data.draw(cs.tangents(C), "w"))


@given(st.data())
def test_D_of_a_linear_map_is_itself(data):
    A, B = draw_spaces(data, 2, cs.euclidean_spaces)
    L = data.draw(cs.linear_maps(A, B), "L")
    laws.check_D_linear(L, data.draw(cs.points(A), "x"), data.draw(cs.tangents(A), "v"))


# -- the dual is a contravariant functor -----------------------------------------------------------

@given(st.data())
def test_dual_reverses_composition(data):
    U, V, W = draw_spaces(data, 3, cs.euclidean_spaces)
    A, B = data.draw(cs.linear_maps(U, V), "A"), data.draw(cs.linear_maps(V, W), "B")
    laws.check_dual_composition(A, B, data.draw(cs.covectors(W), "y'"))


@given(st.data())
def test_dual_of_identity(data):
    (V,) = draw_spaces(data, 1, cs.euclidean_spaces)
    laws.check_dual_identity(V, data.draw(cs.covectors(V), "y'"))


@given(st.data())
def test_dual_pairing(data):
    V, W = draw_spaces(data, 2, cs.euclidean_spaces)
    A = data.draw(cs.linear_maps(V, W), "A")
    laws.check_dual_pairing(A, data.draw(cs.covectors(W), "y'"), data.draw(cs.tangents(V), "v"))


# -- the reverse-derivative axioms ------------------------------------------------------------------

@given(st.data())
def test_rd1_additive_in_the_map(data):
    (A,) = draw_spaces(data, 1)
    (B,) = draw_spaces(data, 1, cs.euclidean_spaces)  # f + g needs a vector space
    f, g = data.draw(cs.smooth_maps(A, B, depth=1), "f"), data.draw(cs.smooth_maps(A, B, depth=1), "g")
    laws.check_rd1(f, g, data.draw(cs.points(A), "x"), data.draw(cs.covectors(B), "c"))


@given(st.data())
def test_rd2_linear_in_the_covector(data):
    A, B = draw_spaces(data, 2)
    f = data.draw(cs.smooth_maps(A, B, depth=1), "f")
    laws.check_rd2(f, data.draw(cs.points(A), "x"), data.draw(cs.covectors(B), "a"),
                   data.draw(cs.covectors(B), "b"), data.draw(cs.scalars(), "s"))


@given(st.data())
def test_rd3_identity_and_projections(data):
    A, B = draw_spaces(data, 2)
    laws.check_rd3(A, B, data.draw(cs.points(A), "x"), data.draw(cs.points(B), "y"),
                   data.draw(cs.covectors(A), "a"), data.draw(cs.covectors(B), "b"))


@given(st.data())
def test_rd4_pairing(data):
    A, B, C = draw_spaces(data, 3)
    f, g = data.draw(cs.smooth_maps(A, B, depth=1), "f"), data.draw(cs.smooth_maps(A, C, depth=1), "g")
    laws.check_rd4(f, g, data.draw(cs.points(A), "x"), data.draw(cs.covectors(B), "v"),
                   data.draw(cs.covectors(C), "w"))


@given(st.data())
def test_rd5_reverse_chain_rule(data):
    A, B, C = draw_spaces(data, 3)
    f, g = data.draw(cs.smooth_maps(A, B, depth=1), "f"), data.draw(cs.smooth_maps(B, C, depth=1), "g")
    laws.check_rd5(f, g, data.draw(cs.points(A), "x"), data.draw(cs.covectors(C), "c"))


@given(st.data())
def test_rd6_reverse_derivative_of_the_reverse_derivative(data):
    A, B = draw_spaces(data, 2)
    f = data.draw(cs.smooth_maps(A, B, depth=1), "f")
    laws.check_rd6(f, data.draw(cs.points(A), "x"), data.draw(cs.covectors(B), "y"),
                   data.draw(cs.tangents(A), "v"))


@given(st.data())
def test_rd7_symmetry_of_second_derivatives(data):
    A, B = draw_spaces(data, 2)
    f = data.draw(cs.smooth_maps(A, B, depth=1), "f")
    laws.check_rd7(f, data.draw(cs.points(A), "x"), data.draw(cs.covectors(B), "c"),
                   data.draw(cs.tangents(A), "u"), data.draw(cs.tangents(A), "v"))


# -- wrong constructions are reported ---------------------------------------------------------------

V, W = R(3), R(2)
M = jnp.array([[1.0, 2.0, 0.0], [0.0, 1.0, -1.0], [3.0, 0.0, 1.0]])  # not symmetric
N = jnp.array([[0.5, -1.0, 0.0], [1.0, 0.0, 2.0], [0.0, 1.0, 1.0]])  # does not commute with M
F = Smooth(V, V, lambda x: jnp.tanh(M @ x + 0.3), "tanh(Mx + 0.3)")
G = Smooth(V, V, lambda x: jnp.sin(N @ x), "sin(Nx)")
TO_W = Smooth(V, W, lambda x: jnp.tanh(x[:2] * x[1:]), "non-square")
x = jnp.array([0.4, -0.3, 0.8])
v, c = jnp.array([1.0, -2.0, 0.5]), jnp.array([0.3, 0.7, -1.1])


class Recorded(Smooth):
    """A smooth map whose composites remember their factors (so that a fake D can misuse them)."""

    def __rshift__(self, other):
        out = super().__rshift__(other)
        out.factors = (self, other)
        return out


def D_ignoring_inner(f, x):
    """A 'differential' of a composite that forgets the inner map's derivative."""
    if hasattr(f, "factors"):
        inner, outer = f.factors
        return D(outer, inner(x))
    return D(f, x)


def D_at_zero(f, x):
    """A 'differential' taken at the wrong point."""
    return D(f, jnp.zeros_like(x))


def D_transposed(f, x):
    """The transpose of the differential in place of the differential."""
    d = D(f, x)
    return Linear(f.dom, f.cod, d.dual().apply, name="(df)*")


@pytest.mark.parametrize("tangent", [v, None], ids=["on a tangent", "as matrices"])
def test_D_that_breaks_the_chain_rule_is_reported(tangent):
    f, g = Recorded(V, V, F.fn, F.name), Recorded(V, V, G.fn, G.name)
    laws.check_D_composition(f, g, x, tangent)
    with pytest.raises(AssertionError, match="check_D_composition failed"):
        laws.check_D_composition(f, g, x, tangent, D=D_ignoring_inner)
    with pytest.raises(AssertionError, match="check_D_composition failed"):
        laws.check_D_composition(F, G, x, tangent, D=D_at_zero)


def test_transposed_D_is_reported():
    L = Linear(V, V, lambda u: M @ u, name="M")
    with pytest.raises(AssertionError, match=r"(?s)check_D_linear failed.*D\(L\)_x vs L"):
        laws.check_D_linear(L, x, v, D=D_transposed)
    with pytest.raises(AssertionError, match="check_D_identity failed"):
        laws.check_D_identity(V, x, v, D=lambda f, x: D(Smooth(V, V, lambda u: M @ u), x))


def test_D_product_that_swaps_the_factors_is_reported():
    def swapped(f, g):
        return Smooth(f.dom * g.dom, f.cod * g.cod, lambda xy: (f.fn(xy[1]), g.fn(xy[0])))

    with pytest.raises(AssertionError, match="check_D_product failed"):
        laws.check_D_product(F, G, x, -x, v, c, product=swapped)


class RecordedLinear(Linear):
    """A linear map whose composites remember their factors (so that a fake dual can misuse them)."""

    def __rshift__(self, other):
        out = super().__rshift__(other)
        out.factors = (self, other)
        return out


def dual_keeping_order(L):
    """A 'dual' of A ≫ B that composes A* ≫ B* instead of B* ≫ A*."""
    if hasattr(L, "factors"):
        A, B = L.factors
        return A.dual() >> B.dual()
    return L.dual()


def dual_without_transpose(L):
    """A 'dual' that acts by the map itself instead of its transpose."""
    return Linear(L.cod, L.dom, L.apply, on="covectors", name=L.name + "*?")


@pytest.mark.parametrize("y", [c, None], ids=["on a covector", "as matrices"])
def test_dual_that_does_not_reverse_order_is_reported(y):
    A = RecordedLinear(V, V, lambda u: M @ u, name="M")
    B = RecordedLinear(V, V, lambda u: N @ u, name="N")
    laws.check_dual_composition(A, B, y)
    with pytest.raises(AssertionError, match=r"(?s)check_dual_composition failed.*\(A ≫ B\)\* vs B\* ≫ A\*"):
        laws.check_dual_composition(A, B, y, dual=dual_keeping_order)


def test_dual_without_transpose_is_reported():
    A = Linear(V, V, lambda u: M @ u, name="M")
    laws.check_dual_identity(V, c, dual=dual_without_transpose)  # 1* = 1 cannot tell
    with pytest.raises(AssertionError, match=r"(?s)check_dual_pairing failed.*⟨A\* y', v⟩"):
        laws.check_dual_pairing(A, c, v, dual=dual_without_transpose)
    with pytest.raises(AssertionError, match="check_dual_identity failed"):
        laws.check_dual_identity(V, c, dual=lambda L: Linear(L.cod, L.dom, lambda y: 2 * y,
                                                             on="covectors"))


def R_without_transpose(f):
    """A 'reverse derivative' that applies df_x (a JVP) where (df_x)* (a VJP) belongs."""
    fn = f.fn
    return Smooth(f.dom * f.cod.tangent, f.dom.tangent,
                  lambda xy: jax.jvp(fn, (xy[0],), (xy[1],))[1], f"R?[{f.name}]")


def test_reverse_derivative_without_transpose_is_reported():
    laws.check_rd5(F, G, x, c)
    laws.check_rd7(F, x, c, v, c)
    # Additive and linear all the same: RD.1 and RD.2 cannot tell ...
    laws.check_rd1(F, G, x, c, R=R_without_transpose)
    laws.check_rd2(F, x, c, v, 3.0, R=R_without_transpose)
    # ... the chain rule and the symmetry of second derivatives can (a non-symmetric map),
    with pytest.raises(AssertionError, match=r"(?s)check_rd5 failed: RD\.5.*R\[f ≫ g\]\(x, c\)"):
        laws.check_rd5(F, G, x, c, R=R_without_transpose)
    with pytest.raises(AssertionError, match=r"(?s)check_rd7 failed: RD\.7.*⟨dh_x u, v⟩"):
        laws.check_rd7(F, x, c, v, c, R=R_without_transpose)
    # and on a non-square map the types do not even fit: reported, not crashed.
    for check, args in [(laws.check_rd2, (TO_W, x, c[:2], v[:2])),
                        (laws.check_rd3, (V, W, x, c[:2], v, c[:2])),
                        (laws.check_rd4, (F, TO_W, x, c, v[:2])),
                        (laws.check_rd6, (TO_W, x, c[:2], v))]:
        with pytest.raises(AssertionError, match="evaluating it raised"):
            check(*args, R=R_without_transpose)


def test_other_wrong_reverse_derivatives_are_reported():
    def R_doubled_on_sums(f):  # right on f, twice too much on a sum of maps
        right = reverse_derivative(f)
        k = 2.0 if f.name.startswith("(") else 1.0
        return Smooth(right.dom, right.cod, lambda xy: k * right.fn(xy), "R?")

    with pytest.raises(AssertionError, match="check_rd1 failed"):
        laws.check_rd1(F, G, x, c, R=R_doubled_on_sums)

    def R_affine(f):  # not linear in the covector
        right = reverse_derivative(f)
        return Smooth(right.dom, right.cod,
                      lambda xy: jax.tree_util.tree_map(lambda a: a + 0.01, right.fn(xy)), "R?")

    with pytest.raises(AssertionError, match=r"(?s)check_rd2 failed.*R\[f\]\(x, a \+ b\)"):
        laws.check_rd2(F, x, c, v, R=R_affine)
    with pytest.raises(AssertionError, match="check_rd3 failed"):
        laws.check_rd3(V, W, x, c[:2], v, c[:2], R=R_affine)
    with pytest.raises(AssertionError, match="check_rd4 failed"):
        laws.check_rd4(F, G, x, c, v, R=R_affine)
    with pytest.raises(AssertionError, match="check_rd6 failed"):
        laws.check_rd6(F, x, c, v, R=R_affine)


def test_reverse_derivative_axioms_with_the_terminal_object():
    Z = R(0)
    to_z = Smooth(V, Z, lambda x: None, "!")
    from_z = Smooth(Z, V, lambda z: jnp.array([1.0, 2.0, 3.0]), "const")
    laws.check_rd1(from_z, from_z, None, c)
    laws.check_rd2(to_z, x, None, None)
    laws.check_rd3(Z, V, None, x, None, v)
    laws.check_rd4(to_z, F, x, None, c)
    laws.check_rd5(F, to_z, x, None)
    laws.check_rd5(to_z, from_z, x, c)
    laws.check_rd6(from_z, None, c, None)
    laws.check_rd7(to_z, x, None, v, c)
    laws.check_D_composition(to_z, from_z, x, v)
    laws.check_D_composition(to_z, from_z, x)
    laws.check_dual_identity(Z, None)
    laws.check_dual_pairing(linear_identity(V), c, v)
