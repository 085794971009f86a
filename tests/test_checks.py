"""The public checks: check_backward catches wrong hand-written backward parts; the composition
rule written as a composite of smooth maps agrees with the library's composite."""

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings, strategies as st

from categories import R
from categories.errors import CovectorError
from lenses import Layer, check_backward, composition_rule, dense
from lenses import strategies as ls
from lenses.laws import assert_close

W = jnp.array([[1.0, 2.0, -1.0], [0.5, -3.0, 4.0], [2.0, 0.0, 1.5]])  # square, not symmetric
B = jnp.array([0.1, -0.2, 0.3])
X = jnp.array([0.7, -1.1, 0.4])
C = jnp.array([1.0, -2.0, 0.5])


def dense_with(backward, n_in=3, n_out=3, name="hand-written dense"):
    return Layer(R(n_in), R(n_out), R(n_out, n_in) * R(n_out), lambda x, Wb: Wb[0] @ x + Wb[1],
                    backward=backward, name=name)


def correct(x, Wb, c):
    return Wb[0].T @ c, (jnp.outer(c, x), c)


def missing_transpose(x, Wb, c):
    return Wb[0] @ c, (jnp.outer(c, x), c)  # W where Wᵀ belongs


def wrong_sign(x, Wb, c):
    return -(Wb[0].T @ c), (jnp.outer(c, x), c)


def test_a_correct_hand_written_backward_passes():
    report = check_backward(dense_with(correct), X, (W, B), C, tol=1e-6)
    assert report.max_error < 1e-6
    assert set(report.vs_derived) == {"a", "p[0]", "p[1]"}


def test_a_missing_transpose_is_caught():
    lens = dense_with(missing_transpose)
    report = check_backward(lens, X, (W, B), C)
    assert report.max_error > 1.0
    assert report.vs_derived["a"] > 1.0 and report.vs_finite_differences["a"] > 1.0
    assert report.vs_derived["p[0]"] < 1e-9  # the parameter covector was right: only a' is named
    with pytest.raises(AssertionError, match="hand-written dense"):
        check_backward(lens, X, (W, B), C, tol=1e-6)


def test_a_missing_transpose_on_a_non_square_layer_is_caught():
    def transposed_dW(x, Wb, c):
        return Wb[0].T @ c, (jnp.outer(x, c), c)  # (n_in, n_out) where (n_out, n_in) belongs

    # a covector of the wrong shape is refused at the backward part's first use, naming it
    lens = dense_with(transposed_dW, n_in=2, n_out=3)
    W23 = W[:, :2]
    with pytest.raises(CovectorError, match=r"hand-written dense gives p' .*shape \(3, 2\).*\(2, 3\)"):
        check_backward(lens, X[:2], (W23, B), C)


def test_a_wrong_sign_is_caught():
    lens = dense_with(wrong_sign)
    report = check_backward(lens, X, (W, B), C)
    expected = 2 * float(jnp.max(jnp.abs(W.T @ C)))  # the sign flip is off by twice a'
    assert report.max_error == pytest.approx(expected, rel=1e-6)
    with pytest.raises(AssertionError, match="backward part discrepancies"):
        check_backward(lens, X, (W, B), C, tol=1e-3)


def test_check_backward_on_a_derived_layer_agrees_with_finite_differences():
    report = check_backward(dense(3, 2), X, (W[:2], B[:2]), C[:2], tol=1e-6)
    assert max(report.vs_finite_differences.values()) < 1e-6


# -- the composition rule as a composite of smooth maps -------------------------------------------

@settings(max_examples=min(40, settings.default.max_examples))
@given(st.data())
def test_composition_rule_is_the_composite_backward_part(data):
    A, B_, C_ = (data.draw(ls.spaces()) for _ in range(3))
    f, g = data.draw(ls.para_lenses(A, B_)), data.draw(ls.para_lenses(B_, C_))
    a = data.draw(ls.points(A))
    p, q = data.draw(ls.parameter_points(f.param)), data.draw(ls.parameter_points(g.param))
    c = data.draw(ls.covectors(C_))
    rule = composition_rule(f, g)
    value, (da, (dp, dq)) = rule.morphism(((a, (p, q)), c))
    h = f >> g
    flat = lambda m, x: tuple(x) if len(m.parts) > 1 else (x,)
    pq = flat(f, p) + flat(g, q)
    assert_close(value, h.forward(a, pq), what="rule's value vs (f ≫ g)(a, (p, q))")
    ha, hp = h.backward(a, pq, c)
    assert_close(da, ha, what="rule's a' vs (f ≫ g)'")
    assert_close(flat(f, dp) + flat(g, dq), hp, what="rule's (p', q') vs (f ≫ g)' (flattened)")
    # the two copies the rule makes: (a, p), read by f and f'; (f(a, p), q), read by g and g'
    assert rule.copies == {"(a, p)": 2, "(f(a, p), q)": 2}


def test_composition_rule_against_jax_grad():
    f, g = dense(3, 2), dense(2, 1)
    p = (W[:2], B[:2])
    q = (jnp.array([[1.0, -1.0]]), jnp.array([0.5]))
    value, (da, (dp, dq)) = composition_rule(f, g).morphism(((X, (p, q)), jnp.array([2.0])))
    gx, gp, gq = jax.grad(lambda x, p, q: 2.0 * (q[0] @ (p[0] @ x + p[1]) + q[1])[0],
                          argnums=(0, 1, 2))(X, p, q)
    assert_close((da, dp, dq), (gx, gp, gq), what="rule vs jax.grad")


def test_composition_rule_names_mismatched_lenses():
    with pytest.raises(TypeError, match="R\\^3.*R\\^4"):
        composition_rule(dense(2, 3), dense(4, 1))
