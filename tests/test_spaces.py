"""Objects of the ambient category: open subsets of Euclidean spaces and their products."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from categories import OpenBall, OpenBox, Positive, Product, R, euclidean
from categories import strategies as cs


# -- equality and hashing are structural --------------------------------------------------------

def test_equality_and_hashing_by_structure():
    pairs = [
        (R(3), R(3)),
        (R(), R()),
        (R(0), R(0)),
        (R(2, 3), R(*(2, 3))),
        (OpenBox(-1.0, 1.0, (3,)), OpenBox(np.full(3, -1.0), np.ones(3))),
        (OpenBall(np.zeros(2), 1.0), OpenBall([0.0, 0.0], 1)),
        (Positive(3), Positive(3)),
        (R(3) * R(2, 3), Product(R(3), R(2, 3))),
        (R(3) * R(0) * Positive(), Product(Product(R(3), R(0)), Positive())),
    ]
    for a, b in pairs:
        assert a == b and hash(a) == hash(b), (a, b)
    assert len({a for a, _ in pairs} | {b for _, b in pairs}) == len(pairs)
    different = [R(3), R(2), R(), R(0), R(1), R(2, 3), R(3, 2), Positive(3), OpenBox(-1.0, 1.0, (3,)),
                 OpenBox(-1.0, 2.0, (3,)), OpenBall(np.zeros(3), 1.0), OpenBall(np.zeros(3), 2.0),
                 R(3) * R(2), R(2) * R(3), (R(3) * R(2)) * R(), R(3) * (R(2) * R())]
    assert len(set(different)) == len(different)
    assert {R(3): "x"}[R(3)] == "x"


def test_repr():
    assert repr(R(3) * R(2, 3)) == "R^3 × R^{2×3}"
    assert repr(R()) == "R"
    assert repr(R(0)) == "R^0"
    assert repr(R(1)) == "R^1"
    assert repr((R(3) * R(2)) * R()) == "(R^3 × R^2) × R"
    assert repr(Positive(3)) == "Positive(R^3)"
    assert repr(OpenBox(-1.0, 1.0, (2, 3))) == "OpenBox(-1.0, 1.0) ⊆ R^{2×3}"
    assert repr(OpenBall([0.0, 0.0], 1.0)) == "OpenBall([0.0, 0.0], 1.0) ⊆ R^2"


def test_invalid_spaces_are_refused():
    with pytest.raises(ValueError, match=r"use R\(0\)"):
        R(2, 0)
    with pytest.raises(ValueError):
        R(-1)
    with pytest.raises(ValueError):
        OpenBox(1.0, 1.0, (2,))
    with pytest.raises(ValueError):
        OpenBall([0.0], 0.0)
    with pytest.raises(TypeError):
        Product(R(3), "R^2")


# -- membership ------------------------------------------------------------------------------------

def test_euclidean_space_contains_every_point_of_its_shape():
    assert R(3).contains(jnp.array([1e300, -1e300, 0.0]))
    assert R().contains(2.5) and R().contains(jnp.asarray(2.5))
    assert not R().contains(jnp.zeros(1))
    assert not R(3).contains(jnp.zeros(2))
    assert not R(3).contains((jnp.zeros(3),))
    assert R(2, 3).contains(np.zeros((2, 3))) and not R(2, 3).contains(np.zeros((3, 2)))
    x = jnp.zeros(3)
    assert R(3).check(x) is x


def test_open_box_excludes_its_boundary():
    box = OpenBox(-1.0, [1.0, 2.0], (2,))
    assert box.contains(jnp.array([0.0, 1.9]))
    assert not box.contains(jnp.array([1.0, 0.0]))  # on the boundary
    assert not box.contains(jnp.array([0.0, -1.0]))
    assert not box.contains(jnp.array([0.0, 2.5]))
    assert OpenBox(0.0, 1.0, ()).contains(0.5) and not OpenBox(0.0, 1.0, ()).contains(1.5)


def test_open_ball_excludes_its_sphere():
    ball = OpenBall([1.0, 0.0], 2.0)
    assert ball.contains(jnp.array([2.9, 0.0]))
    assert not ball.contains(jnp.array([3.0, 0.0]))
    assert not ball.contains(jnp.array([2.5, 1.5]))
    assert ball.contains(jnp.array([2.0, 1.0]))


def test_positive_orthant_excludes_zero():
    assert Positive(3).contains(jnp.array([1e-9, 1.0, 3.0]))
    assert not Positive(3).contains(jnp.array([0.0, 1.0, 3.0]))
    assert not Positive().contains(-1.0)


def test_products_hold_tuples_of_points():
    P = R(3) * Positive(2) * R(0)
    good = ((jnp.zeros(3), jnp.ones(2)), None)
    assert P.contains(good)
    assert P.check(good) is good
    assert not P.contains(((jnp.zeros(3), -jnp.ones(2)), None))
    assert not P.contains((jnp.zeros(3), jnp.ones(2), None))  # wrong nesting
    assert not P.contains([[jnp.zeros(3), jnp.ones(2)], None])  # a list is not a point
    assert P.size == 5 and P.shape == (((3,), (2,)), (0,))
    assert euclidean(R(3) * R(0)) and not euclidean(P)


def test_terminal_object_has_the_single_point_None():
    Z = R(0)
    assert Z.is_terminal and Z.size == 0 and Z.tangent == Z
    assert Z.contains(None) and Z.check(None) is None
    for not_a_point in (jnp.zeros(0), 0.0, (), np.zeros(0)):
        assert not Z.contains(not_a_point)
    assert Z.zeros() is None
    assert Z.sample_interior(jax.random.PRNGKey(0)) is None
    assert not any(S.is_terminal for S in (R(), R(1), Positive(3), R(0) * R(0)))


def test_tangent_spaces_are_euclidean():
    assert OpenBox(0.0, 1.0, (2, 3)).tangent == R(2, 3)
    assert OpenBall([0.0, 0.0, 0.0], 1.0).tangent == R(3)
    assert (Positive() * R(0)).tangent == R() * R(0)


# -- the strategies draw what they promise ---------------------------------------------------------

@given(st.data())
def test_drawn_points_lie_inside_and_tangents_fit(data):
    space = data.draw(cs.spaces(), "space")
    x = data.draw(cs.points(space), "x")
    space.check(x)
    space.tangent.check(data.draw(cs.tangents(space), "v"))
    for leaf in jax.tree_util.tree_leaves(x):
        assert leaf.dtype == jnp.float64


def test_strategies_cover_scalars_matrices_and_the_terminal_object():
    seen = set()

    @given(cs.spaces())
    def collect(space):
        seen.add(type(space).__name__ if not isinstance(space, R) else repr(space))

    collect()
    assert {"R", "R^{2×3}", "R^0", "OpenBox", "OpenBall", "Positive", "Product"} <= seen
    assert set(cs.SHAPES) >= {(), (2, 3)} and all(max(s, default=1) <= 4 for s in cs.SHAPES)
