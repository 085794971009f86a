"""Round three of malformed inputs at the core entry points (categories/ and the lens-building
side of lenses/): each call, as a hurried user writes it, ends in a catalogued error naming the
problem (on main each raised a raw AttributeError/TypeError/IndexError, or was accepted)."""

import jax
import jax.numpy as jnp
import pytest

from categories import (Covector, OpenBall, OpenBox, Para, Positive, R, Smooth, Vector,
                        dual, euclidean, flatten_value, linear_smooth, para_identity,
                        para_of, reverse_derivative)
from categories.errors import (CovectorError, DomainError, HyperparameterError, KindError,
                               ParalensError, SlotError, SpaceMismatch)
from categories.numbers import ROOM, too_narrow
from lenses import (Batched, Chain, Checkpointed, Layer, Lens, Parallel, Repeat, Reparam, Site,
                    Stacked, activation, add, check_backward, dense, family, from_function,
                    largest_slope, lens_identity, rnn_cell, tanh, unroll)

D23 = dense(2, 3)


def _family_on_r(A):
    return Layer(R(A.size), R(A.size), R(0), lambda a, p: a, name="on_r")


CASES = [
    # Vector and Covector are checked against their space when built
    (lambda: Vector(jnp.ones(2), R(3)), DomainError, "expected an array of shape (3,)"),
    (lambda: Covector(jnp.ones(2), R(3)), CovectorError, "expected an array of shape (3,)"),
    (lambda: Vector((jnp.ones(3), jnp.ones(3)), R(3) * R(2)), DomainError, "[1]"),
    (lambda: Vector("abc", R(3)), DomainError, "not a point of R^3"),
    (lambda: Vector(jnp.ones(3, jnp.complex64), R(3)), DomainError, "complex64"),
    (lambda: Covector(jnp.ones(2), [R(2)]), KindError, "needs a Space"),
    # .at: a Space, and a member on A itself
    (lambda: tanh.at(R), KindError, "the class R"),
    (lambda: family(_family_on_r, "on_r").at(Positive(2)), SpaceMismatch, "must build a lens on A"),
    # narrow boxes and balls
    (lambda: OpenBox(1.0, 1.0 + 1e-7, (2,)), DomainError, "narrower than 128 float32 steps"),
    (lambda: OpenBall([0.0], 1e-20), DomainError, "OpenBall: radius"),
    (lambda: OpenBall([1e6], 1e-3), DomainError, "narrower than 128 float32 steps"),
    # kinds of constructor arguments
    (lambda: Para(R(2), R(2), R(2), None), KindError, "fn must be a function"),
    (lambda: Para(R(2), R(2), "R2", lambda a, p: a), KindError, "parameter object"),
    (lambda: Lens(R(2), R(2), None, lambda a, b: a), KindError, "Lens: get"),
    (lambda: Lens(None, R(2), lambda a: a, lambda a, b: a), KindError, "Lens: the domain"),
    (lambda: lens_identity(None), KindError, "lens_identity"),
    (lambda: Chain([dense(2, 3), dense(2, 3)]), SpaceMismatch, "cannot compose dense(2→3)"),
    (lambda: Chain(None), KindError, "Chain needs a non-empty list"),
    (lambda: Chain([]), KindError, "Chain needs a non-empty list"),
    (lambda: Chain({"a": D23}), KindError, "Chain needs a non-empty list"),
    (lambda: Chain([D23, tanh]), KindError, "fix it with"),
    (lambda: Chain([D23, "x"]), KindError, "part 1"),
    (lambda: Parallel(None, D23), KindError, "Parallel"),
    (lambda: Parallel(D23, tanh), KindError, "fix it with"),
    (lambda: Reparam(None, None), KindError, "reparam"),
    (lambda: Repeat(tanh, 2), KindError, "Repeat"),
    (lambda: Stacked(None, 2), KindError, "Stacked"),
    (lambda: Stacked(R(2), 0), ParalensError, "number of copies"),
    (lambda: Batched(None), KindError, "Batched"),
    (lambda: Checkpointed(None), KindError, "Checkpointed"),
    (lambda: Site(None, (0,)), KindError, "Site"),
    (lambda: Site(D23, [0]), KindError, "path must be a tuple"),
    (lambda: Site(D23, (0.0,)), SlotError, "the index 0.0"),
    (lambda: activation("x", None), KindError, "activation('x'): g"),
    (lambda: family(None, "x"), KindError, "the make of the family"),
    (lambda: family(lambda A: tanh.at(A), "f", endo="yes"), KindError, "endo"),
    (lambda: from_function(None, {"w": jnp.ones(2)}, R(2)), KindError, "from_function: f"),
    (lambda: check_backward(dense(2, 1), jnp.ones(2), dense(2, 1).init(jax.random.PRNGKey(0)),
                            jnp.ones(1), tol="1"), HyperparameterError, "tol"),
    (lambda: largest_slope(tanh), CovectorError, "largest_slope needs a parameter covector"),
    (lambda: largest_slope("x"), CovectorError, "largest_slope needs a parameter covector"),
    (lambda: para_of(None), KindError, "para_of"),
    (lambda: para_identity(None), KindError, "para_identity"),
    (lambda: dual(None), KindError, "dual"),
    (lambda: reverse_derivative(None), KindError, "reverse_derivative"),
    (lambda: linear_smooth(None), KindError, "linear_smooth"),
    (lambda: euclidean(None), KindError, "euclidean"),
    (lambda: flatten_value(jnp.ones(2), None), KindError, "flatten_value"),
    # add: leaf by leaf, on spaces closed under addition
    (lambda: add(OpenBox(0.0, 1.0, (2,))), DomainError, "closed under addition"),
    (lambda: add(OpenBall([0.0], 1.0)), DomainError, "closed under addition"),
]


@pytest.mark.parametrize("call, error, phrase", CASES, ids=[str(i) for i in range(len(CASES))])
def test_a_malformed_call_ends_in_a_catalogued_error(call, error, phrase):
    with pytest.raises(error) as caught:
        call()
    assert phrase in str(caught.value)


def test_a_vector_may_carry_leading_batch_axes_but_not_other_shapes():
    with pytest.raises(DomainError):
        Vector(jnp.ones((4, 2)), R(3))
    v = Vector(jnp.ones((4, 3)), R(3))
    assert v.value.shape == (4, 3)
    c = Covector((jnp.ones((5, 3)), jnp.ones((5, 2))), R(3) * R(2))
    assert c.value[1].shape == (5, 2)


def test_jax_rebuilds_a_vector_unchecked_where_a_user_is_checked():
    with pytest.raises(DomainError):
        Vector(jnp.ones(2), R(3))
    v = Vector(jnp.ones(3), R(3))
    # placeholders and tracers: JAX rebuilds the pytree with whatever it holds
    placeholders = jax.tree_util.tree_map(lambda leaf: object(), v)
    assert isinstance(placeholders, Vector)
    summed = jax.jit(lambda w: jax.tree_util.tree_map(jnp.sum, w))(v)
    assert float(summed.value) == 3.0
    assert jax.vmap(lambda w: w)(Vector(jnp.ones((2, 3)), R(3))).value.shape == (2, 3)


def test_add_adds_a_product_leaf_by_leaf():
    a, b = (jnp.array([1.0, 2.0]), jnp.array([3.0])), (jnp.array([10.0, 20.0]), jnp.array([30.0]))
    out = add(R(2) * R(1))((a, b), None)
    assert [x.tolist() for x in out] == [[11.0, 22.0], [33.0]]  # not the tuple a + b, concatenated


def test_a_family_member_has_the_domain_asked_for():
    box = OpenBox(-1.0, 1.0, (5, 3))
    assert unroll(rnn_cell(3, 4)).at(box).dom == box


def test_too_narrow_counts_float32_steps():
    step = float(jnp.finfo(jnp.float32).eps)  # the float32 step at 1.0
    assert too_narrow(1.0, 1.0 + (ROOM - 1) * step)
    assert not too_narrow(1.0, 1.0 + (ROOM + 1) * 2 * step)  # the step at 2.0 is twice that at 1.0
    assert not too_narrow(0.0, 1e-30)
    assert OpenBox(0.0, 1e-3, (2,)).contains(jnp.full(2, 5e-4))
