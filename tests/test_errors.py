"""Errors name the user's own things: the space, the point, the maps (a mismatch names both sides; a domain error the space and the point)."""

import jax.numpy as jnp
import numpy as np
import pytest

from categories import (Covector, DomainError, Linear, OpenBall, OpenBox, Para, Positive, R, Smooth,
                        Vector)


# -- DomainError: the space, the point's shape, and where and by how much ------------------------

def test_point_of_the_wrong_shape():
    with pytest.raises(DomainError) as e:
        R(3).check(jnp.zeros(2))
    assert "is not a point of R^3" in str(e.value)
    assert "expected an array of shape (3,)" in str(e.value)
    assert "got an array of shape (2,)" in str(e.value)
    assert isinstance(e.value, ValueError)


def test_point_outside_a_box_names_the_coordinate_and_the_distance():
    box = OpenBox(-1.0, 1.0, (3,))
    with pytest.raises(DomainError) as e:
        box.check(jnp.array([0.5, 1.5, 0.2]))
    msg = str(e.value)
    assert "lies outside OpenBox(-1.0, 1.0) ⊆ R^3" in msg
    assert "coordinate (1,) = 1.5 is outside by 0.5" in msg
    assert "point of shape (3,)" in msg


def test_point_outside_a_matrix_box():
    with pytest.raises(DomainError) as e:
        OpenBox(0.0, 1.0, (2, 3)).check(jnp.full((2, 3), 0.5).at[1, 2].set(-0.25))
    assert "coordinate (1, 2) = -0.25 is outside by 0.25" in str(e.value)
    assert "point of shape (2, 3)" in str(e.value)


def test_point_outside_the_positive_orthant():
    with pytest.raises(DomainError) as e:
        Positive(3).check(jnp.array([1.0, -0.5, 2.0]))
    assert "lies outside Positive(R^3)" in str(e.value)
    assert "coordinate (1,) = -0.5 is outside by 0.5" in str(e.value)


def test_point_outside_a_ball_names_the_furthest_coordinate():
    with pytest.raises(DomainError) as e:
        OpenBall([0.0, 0.0], 1.0).check(jnp.array([0.6, 1.2]))
    msg = str(e.value)
    assert "lies outside OpenBall([0.0, 0.0], 1.0) ⊆ R^2" in msg
    assert "coordinate (1,) = 1.2" in msg
    outside_by = float(msg.split("outside by ")[1].split(" ")[0])
    assert outside_by == pytest.approx(np.hypot(0.6, 1.2) - 1.0)


def test_scalar_point_outside():
    with pytest.raises(DomainError) as e:
        OpenBox(0.0, 1.0, ()).check(jnp.asarray(-0.25))
    assert "coordinate () = -0.25 is outside by 0.25" in str(e.value)
    assert "point of shape ()" in str(e.value)


def test_product_points_name_the_factor():
    P = R(3) * Positive(2)
    with pytest.raises(DomainError, match=r"point\[1\] lies outside Positive\(R\^2\): coordinate \(0,\)"):
        P.check((jnp.zeros(3), jnp.array([-1.0, 1.0])))
    with pytest.raises(DomainError, match=r"is not a point of R\^3 × Positive\(R\^2\): expected a tuple of 2"):
        P.check(jnp.zeros(5))


def test_terminal_object_refuses_everything_but_None():
    with pytest.raises(DomainError, match="is not a point of R\\^0: its only point is None, got an array of shape \\(0,\\)"):
        R(0).check(jnp.zeros(0))


def test_maps_name_their_argument():
    f = Smooth(Positive(2), R(), lambda x: jnp.sum(jnp.log(x)), "logsum")
    with pytest.raises(DomainError) as e:
        f(jnp.array([1.0, 0.0]))
    assert "the argument of logsum lies outside Positive(R^2)" in str(e.value)
    assert "coordinate (1,) = 0.0 is outside by 0.0" in str(e.value)
    with pytest.raises(DomainError, match="the argument of logsum is not a point of Positive\\(R\\^2\\)"):
        f(jnp.ones(3))


# -- composition: both maps and both spaces -----------------------------------------------------------

def test_smooth_composition_names_both_maps_and_spaces():
    f = Smooth(R(3), R(2), lambda x: x[:2], "head")
    g = Smooth(R(4), R(), jnp.sum, "total")
    with pytest.raises(TypeError) as e:
        f >> g
    msg = str(e.value)
    assert "head : R^3 → R^2" in msg and "total : R^4 → R" in msg
    assert "the codomain R^2 of head is not the domain R^4 of total" in msg


def test_para_composition_names_both_maps_and_spaces():
    f = Para(R(3), R(2), R(2, 3), lambda a, p: p @ a, "dense")
    g = Para(R(2, 3), R(), R(0), lambda a, p: jnp.sum(a), "total")
    with pytest.raises(TypeError) as e:
        f >> g
    msg = str(e.value)
    assert "dense : R^3 → R^2" in msg and "total : R^{2×3} → R" in msg
    assert "the codomain R^2 of dense is not the domain R^{2×3} of total" in msg


def test_linear_composition_names_both_maps_and_spaces():
    A = Linear(R(3), R(2), lambda v: v[:2], name="A")
    B = Linear(R(3), R(3), lambda v: v, name="B")
    with pytest.raises(TypeError, match=r"cannot compose A : R\^3 → R\^2 with B : R\^3 → R\^3"):
        A >> B


# -- a covector is not a point: the message says to apply a sharp map --------------------------------

p = jnp.array([1.0, 2.0, 3.0])
cov = Covector(jnp.array([0.1, 0.2, 0.3]), R(3))
vec = Vector(jnp.array([0.1, 0.2, 0.3]), R(3))


@pytest.mark.parametrize("attempt", [
    lambda: p - 0.1 * cov,
    lambda: p + cov,
    lambda: cov + p,
    lambda: cov - p,
    lambda: vec + cov,
    lambda: cov + vec,
    lambda: vec - cov,
    lambda: np.asarray(p) - cov,
    lambda: np.asarray(p) + cov,
    lambda: (p, p) - Covector((p, p)),
    lambda: 0.5 - Covector(jnp.asarray(1.0)),
], ids=["point - eta*covector", "point + covector", "covector + point", "covector - point",
        "vector + covector", "covector + vector", "vector - covector", "numpy - covector",
        "numpy + covector", "tuple - covector", "scalar - covector"])
def test_covector_is_not_a_point(attempt):
    with pytest.raises(TypeError, match="sharp"):
        attempt()


def test_a_vector_moves_a_point():
    np.testing.assert_allclose(p - vec, p - vec.value)
    np.testing.assert_allclose((2 * cov + cov).value, 3 * cov.value)  # covectors form a vector space
