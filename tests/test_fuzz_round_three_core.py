"""Round three of malformed inputs at the core entry points (categories/ and the lens-building
side of lenses/): each call, as a hurried user writes it, ends in a catalogued error naming the
problem (on main each raised a raw AttributeError/TypeError/IndexError, or was accepted)."""

import jax
import jax.numpy as jnp
import pytest

from categories import (D, Covector, Linear, OpenBall, OpenBox, Para, Positive, R, Smooth,
                        Vector, check_composable, constant, dual, euclidean, flatten_value,
                        fst, linear_smooth, pairing, para_identity, para_of,
                        reverse_derivative, slot_uses, snd, unflatten_value)
from categories.errors import (CovectorError, DimensionError, DomainError, HyperparameterError,
                               KindError, ParalensError, SlotError, SpaceMismatch)
from categories.numbers import ROOM, too_narrow
from lenses import (Batched, Chain, Checkpointed, Layer, Lens, Parallel, Repeat, Reparam, Site,
                    Stacked, Tied, activation, add, check_backward, dense, draw, expression,
                    family, from_function, largest_slope, lens_identity, rnn_cell, tanh, unroll)

D23 = dense(2, 3)
KEY = jax.random.PRNGKey(0)
X2 = jnp.ones(2)
#: a lens whose get lands in R^2, not in its codomain R^3; one whose put gives a' of 5 entries
GETS_BADLY = Lens(R(2), R(3), lambda a: a, lambda a, b: b[:2], "gets_badly")
PUTS_BADLY = Lens(R(2), R(2), lambda a: a, lambda a, b: jnp.ones(5), "puts_badly")
SIN = Smooth(R(2), R(2), jnp.sin, "sin")
L2 = Linear(R(2), R(2), lambda v: 2 * v, name="L")
SCALE = Para(R(2), R(2), R(), lambda a, p: p * a, "scale")


def _init_gives(param, value):
    return Layer(R(2), R(2), param, lambda a, p: a, name="given", init=lambda k: value)


def _rnn():
    return unroll(rnn_cell(3, 4)).at(R(5, 3))


def _r_to_dense():  # r : R^2 → the parameters of dense(2, 3)
    return Smooth(R(2), D23.param, lambda q: (jnp.ones((3, 2)), jnp.ones(3)), "r")


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
    # round four: a plain lens checks what it is given and what get and put give
    (lambda: GETS_BADLY.get(X2), SpaceMismatch, "get gets_badly : R^2 → R^3 does not land"),
    (lambda: (GETS_BADLY >> lens_identity(R(3))).get(X2), SpaceMismatch, "get gets_badly"),
    (lambda: PUTS_BADLY.put(X2, X2), CovectorError, "the value of put puts_badly is not a covector"),
    (lambda: lens_identity(R(2)).get(jnp.ones(3)), DomainError, "the argument of get id"),
    (lambda: lens_identity(R(2)).put(X2, jnp.ones(3)), CovectorError, "the covector given to put id"),
    (lambda: lens_identity(R(2)) >> None, KindError, "a lens composes with a lens"),
    (lambda: lens_identity(R(2)) @ None, KindError, "a lens composes with a lens"),
    (lambda: lens_identity(R(2)) >> D23, KindError, "a lens composes with a lens"),
    # an init's point is a point of the parameter object: values too, where concrete
    (lambda: _init_gives(Positive(2), -jnp.ones(2)).init(KEY), DomainError,
     "the point the init of given gives lies outside Positive(R^2)"),
    (lambda: _init_gives(R(2), jnp.full(2, jnp.nan)).init(KEY), DomainError, "not a real number"),
    (lambda: D23.reparam(_r_to_dense(), init=lambda k: jnp.ones(5)).init(KEY), SpaceMismatch,
     "the init of dense(2→3)[r] does not give a point of its parameter object R^2"),
    # names are strings, flags True or False: checked once (categories.numbers)
    (lambda: Lens(R(2), R(2), lambda a: a, lambda a, b: b, name=3), KindError,
     "Lens: the name must be a string"),
    (lambda: Layer(R(2), R(2), R(0), lambda a, p: a, name=3), KindError,
     "Layer: the name must be a string"),
    (lambda: Smooth(R(2), R(2), jnp.sin, name=3), KindError, "Smooth: the name must be a string"),
    (lambda: Linear(R(2), R(2), lambda v: v, name=3), KindError, "Linear: the name must be"),
    (lambda: Para(R(2), R(2), R(2), lambda a, p: a, name=3), KindError, "Para: the name must be"),
    (lambda: D23.reparam(Smooth(D23.param, D23.param, lambda q: q), name=3), KindError,
     "dense(2→3).reparam: the name must be a string"),
    (lambda: tanh.reparam(Smooth(R(0), R(0), lambda q: q), name=3), KindError,
     "tanh.reparam: the name must be a string"),
    (lambda: from_function(lambda t, a: a * t["w"], {"w": X2}, R(2), name=3), KindError,
     "from_function: the name must be a string"),
    (lambda: Layer(R(2), R(2), R(0), lambda a, p: a, check="no"), KindError,
     "the check flag of <lambda> must be True or False, got str 'no'"),
    (lambda: Smooth(R(2), R(2), jnp.sin, "sin", check="no"), KindError,
     "Smooth sin: check must be True or False"),
    (lambda: Layer(R(2), R(2), R(0), lambda a, p: a, node=3), KindError, "the node of <lambda>"),
    (lambda: Layer(R(2), R(2), R(0), lambda a, p: a, node="dot"), KindError, "'copy', 'add'"),
    (lambda: expression(D23, types="no"), KindError, "expression: types must be True or False"),
    (lambda: draw(D23, backward="no"), KindError, "draw: backward must be True or False"),
    # kinds: what is not a morphism, a cell, a smooth map, a structure
    (lambda: check_composable(None, None), KindError, "check_composable needs two morphisms"),
    (lambda: check_composable(D23, "x"), KindError, "check_composable needs two morphisms"),
    (lambda: Tied(None, None, 3, None), KindError, "Tied (its lens"),
    (lambda: Tied(_rnn().lens, _rnn().r, 5, None), KindError, "Tied (its cell)"),
    (lambda: Tied(_rnn().lens, _rnn().r, 0, rnn_cell(3, 4)), DimensionError, "Tied: T must be"),
    (lambda: Tied(_rnn().lens, _rnn().r, 5, rnn_cell(3, 5)), SpaceMismatch,
     "of the cell rnn_cell(3→5) are not the domain"),
    (lambda: SCALE.reparam(None), KindError, "scale.reparam needs a Smooth map"),
    (lambda: tanh.reparam(None), KindError, "tanh.reparam needs a smooth map"),
    (lambda: slot_uses(None, [1]), KindError, "slot_uses needs a Smooth map"),
    (lambda: Site(D23, (), 3), KindError, "Site: the structure must be None or Affine"),
    # operators: what each takes, naming both sides
    (lambda: SIN * None, KindError, "cannot form sin * NoneType None: * takes a smooth map"),
    (lambda: None * SIN, KindError, "cannot form NoneType None * sin"),
    (lambda: "x" * SIN, KindError, "cannot form str 'x' * sin"),
    (lambda: SIN + None, KindError, "cannot form sin + NoneType None: the pointwise sum"),
    (lambda: SIN + 3, KindError, "cannot form sin + int 3"),
    (lambda: L2 >> None, KindError, "cannot form L >> NoneType None: a linear map combines"),
    (lambda: L2 * None, KindError, "cannot form L * NoneType None"),
    (lambda: L2.compose(None), KindError, "cannot form L ∘ NoneType None"),
    (lambda: SCALE >> None, KindError, "cannot form scale >> NoneType None"),
    (lambda: SCALE >> 3, KindError, "a parameterised map composes with a parameterised map"),
    (lambda: Para(R(2), R(3), R(), lambda a, p: p * a, "short")(X2, 1.0), SpaceMismatch,
     "short : R^2 → R^3 does not land in its codomain"),
    (lambda: R(2) * None, KindError, "the product R^2 × B needs a Space"),
    (lambda: 3 * R(2), KindError, "the product A × R^2 needs a Space (e.g. R(3)), got int 3"),
    (lambda: R(2).zeros("x"), KindError, "the zeros of R^2 needs a floating dtype"),
    (lambda: (R(2) * R(1)).zeros(jnp.int32), KindError, "the zeros of R^2 × R^1 needs a floating"),
    (lambda: R(0).zeros(int), KindError, "the zeros of R^0 needs a floating dtype"),
    (lambda: D23 * 2, KindError, "a lens has no *; put two lenses side by side with @"),
    (lambda: 2 * D23, KindError, "cannot form int 2 * dense(2→3): a lens has no *"),
    (lambda: D23 * D23, KindError, "a lens has no *"),
    # the ambient category's helpers: spaces, shapes, factors
    (lambda: constant(R(2), None, 1.0), KindError, "constant needs a Space"),
    (lambda: snd(None, R()), KindError, "snd needs a Space"),
    (lambda: fst(R(), "R"), KindError, "fst needs a Space"),
    (lambda: pairing(jnp.ones(3), X2), CovectorError,
     "leaf 0 of the covector has shape (3,), of the vector (2,)"),
    (lambda: flatten_value(jnp.ones(3), R(2)), DomainError, "flatten_value: x is not a point of R^2"),
    (lambda: Vector(X2, R(2)) * "x", KindError, "cannot scale a Vector by str 'x'"),
    (lambda: None * Covector(X2, R(2)), KindError, "cannot scale a Covector by NoneType None"),
    (lambda: Linear(R(2), R(3), lambda v: v, name="short").matrix(), SpaceMismatch,
     "short : R^2 → R^3 does not land in its codomain"),
    (lambda: D(SIN, X2)(None), DomainError, "the argument of dsin is not a point of R^2"),
    (lambda: D(SIN, X2)(jnp.ones(3)), DomainError, "the argument of dsin is not a point of R^2"),
]


@pytest.mark.parametrize("call, error, phrase", CASES, ids=[str(i) for i in range(len(CASES))])
def test_a_malformed_call_ends_in_a_catalogued_error(call, error, phrase):
    with pytest.raises(error) as caught:
        call()
    assert phrase in str(caught.value)


def test_zeros_take_a_floating_dtype_and_unflatten_keeps_the_flat_dtype():
    assert R(2).zeros(jnp.bfloat16).dtype == jnp.bfloat16
    assert [a.dtype for a in (R(2) * R(3)).zeros(jnp.float16)] == [jnp.float16] * 2
    assert R(0).zeros(jnp.float32) is None
    # unflatten_value reads only its template's shapes: an integer vector unflattens as such
    flat = jnp.arange(7)
    parts = unflatten_value(flat, R(2, 2) * R(3))
    assert [(a.shape, a.dtype) for a in parts] == [((2, 2), flat.dtype), ((3,), flat.dtype)]
    assert parts[1].tolist() == [4, 5, 6]


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


def test_a_lens_checks_shapes_under_jit_and_values_only_where_concrete():
    # shapes are static: refused at trace time
    with pytest.raises(SpaceMismatch, match="get gets_badly"):
        jax.jit(GETS_BADLY.get)(X2)
    # values are not: under jit a point outside the open set passes (nothing to look at) ...
    outside = -jnp.ones(2)
    positive = Lens(Positive(2), Positive(2), lambda a: a, lambda a, b: b, "id+")
    assert jax.jit(positive.get)(outside).tolist() == [-1.0, -1.0]
    # ... and is refused where it is concrete
    with pytest.raises(DomainError, match="the argument of get id"):
        positive.get(outside)


def test_a_lens_that_fits_gives_what_its_parts_give():
    # get(a) = 3a and put(a, b') = 3b' (by hand), through the checks, composed and alone
    triple = Lens(R(2), R(2), lambda a: 3 * a, lambda a, b: 3 * b, "triple")
    a, b = jnp.array([1.0, -2.0]), jnp.array([0.5, 4.0])
    assert triple.get(a).tolist() == [3.0, -6.0]
    assert triple.put(a, b).tolist() == [1.5, 12.0]
    both = triple >> triple
    assert both.get(a).tolist() == [9.0, -18.0]
    assert both.put(a, b).tolist() == [4.5, 36.0]


def test_an_init_is_checked_by_shape_under_jit_and_by_value_where_concrete():
    def negative(k):  # a draw in (-1.5, -0.5): never a point of Positive(2)
        return -0.5 - jax.random.uniform(k, (2,))

    below = Layer(R(2), R(2), Positive(2), lambda a, p: a * p, name="below", init=negative)
    with pytest.raises(DomainError, match="the point the init of below gives lies outside"):
        below.init(KEY)
    assert jax.jit(below.init)(KEY).shape == (2,)  # traced: no values to look at
    with pytest.raises(SpaceMismatch, match="does not give a point"):
        jax.jit(_init_gives(Positive(2), jnp.ones(3)).init)(KEY)
    assert _init_gives(Positive(2), jnp.full(2, 0.5)).init(KEY).tolist() == [0.5, 0.5]


def test_largest_slope_of_none_is_none_the_covector_of_a_lens_without_parameters():
    # None is the value of a covector on R^0: a lens without parameters has no slope
    lens = tanh.at(R(2))
    _, p_cov = lens.backward(X2, None, X2)
    assert p_cov.value is None
    assert largest_slope(p_cov.value) is None and largest_slope(None) is None
    assert largest_slope(p_cov) is None


def test_a_smooth_map_times_a_number_is_its_multiple():
    x = jnp.array([0.5, -1.0])
    for c in (2, 2.0, jnp.asarray(2.0)):
        assert (SIN * c)(x).tolist() == pytest.approx([2 * 0.479425538604203, -2 * 0.8414709848078965])
        assert (c * SIN)(x).tolist() == pytest.approx([2 * 0.479425538604203, -2 * 0.8414709848078965])


def test_a_differential_takes_a_raw_tangent_of_its_shape_and_gives_the_jvp():
    # d sin_x (v) = cos(x) ⊙ v, by hand, on a raw value and on a Vector
    x, v = jnp.array([0.0, 1.0]), jnp.array([2.0, 3.0])
    expected = [2.0 * 1.0, 3.0 * 0.5403023058681398]
    assert D(SIN, x)(v).tolist() == pytest.approx(expected)
    assert D(SIN, x)(Vector(v, R(2))).value.tolist() == pytest.approx(expected)
    assert float(pairing(jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0]))) == 11.0
