"""Hypothesis strategies for the ambient category: spaces, points, tangents, smooth and linear maps.

For property tests of the laws in `categories.laws`, on the library's constructions or your own:

    from hypothesis import given, strategies as st
    from categories import laws, strategies as cs

    @given(st.data())
    def test_chain_rule(data):
        A, B, C = (data.draw(cs.spaces()) for _ in range(3))
        f, g = data.draw(cs.smooth_maps(A, B)), data.draw(cs.smooth_maps(B, C))
        laws.check_D_composition(f, g, data.draw(cs.points(A)), data.draw(cs.tangents(A)))

Numbers are float64 drawn from bounded ranges (no NaN, no infinity, no subnormals), and every
map is built so that it stays well inside the open set it maps into, so nothing overflows
and no law fails for numerical rather than logical reasons. Shapes are few and small (scalars,
vectors, one matrix shape, R^0), which keeps un-jitted JAX quick. Requires `hypothesis`
(a test extra): `categories` itself does not import this module.
"""

from __future__ import annotations

import functools
from typing import cast

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from hypothesis import strategies as st

from .linear import Linear
from .para import Para
from .smooth import Smooth, fst, pair, snd
from .spaces import OpenBall, OpenBox, Positive, Product, R, Space, euclidean
from .errors import UnsupportedError

#: The array shapes drawn: a scalar, a vector, a matrix (sides ≤ 4). R^0 is drawn separately.
#: Few shapes on purpose: un-jitted JAX compiles every operation once per shape it meets.
SHAPES = ((), (3,), (2, 3))
#: Magnitude bound of every drawn number.
BOUND = 2.0

tree_map = jax.tree_util.tree_map


def _cached(make):
    """Reuse the strategy built for equal (hashable) arguments.

    Hypothesis validates every new strategy object before drawing from it; building one per
    draw (per space, per shape) costs more than the draw itself.
    """
    cached = functools.lru_cache(maxsize=4096)(make)

    @functools.wraps(make)
    def strategy(*args, **kwargs):
        try:
            return cached(*args, **kwargs)
        except TypeError:  # an unhashable argument, e.g. a space of the user's own
            return make(*args, **kwargs)

    return strategy



@_cached
def floats(low: float = -BOUND, high: float = BOUND):
    """Finite float64 numbers in [low, high] (no NaN, infinity or subnormals)."""
    return st.floats(low, high, allow_nan=False, allow_infinity=False, allow_subnormal=False,
                     width=64)


@_cached
def arrays(shape, low: float = -BOUND, high: float = BOUND):
    """float64 numpy arrays of `shape` with entries in [low, high]."""
    shape = tuple(shape)
    n = int(np.prod(shape, dtype=int))
    # A list of n floats is about twice as quick to draw as `hypothesis.extra.numpy.arrays`.
    return st.lists(floats(low, high), min_size=n, max_size=n).map(
        lambda xs: np.asarray(xs, dtype=np.float64).reshape(shape))


@_cached
def shapes():
    """Array shapes: () (scalars), (3,) (vectors) and (2, 3) (matrices)."""
    return st.sampled_from(SHAPES)


def _binary(space) -> bool:
    return isinstance(space, Product) and len(space.factors) == 2


@_cached
def _sampled(options: tuple):
    return st.sampled_from(options)


# -- spaces ---------------------------------------------------------------------------------------

_PRODUCT_OR_NOT = st.sampled_from(["base", "base", "product"])  # shrinks towards "base"
_OPEN_KINDS = st.sampled_from(["box", "ball", "positive"])
_SPACE_KINDS = st.sampled_from(["euclidean", "open", "terminal"])
_SPACE_KINDS_NO_TERMINAL = st.sampled_from(["euclidean", "open"])

@_cached
@st.composite
def euclidean_spaces(draw, terminal: bool = True, products: bool = True):
    """R^shape for the drawn shapes, R^0 (if `terminal`), and binary products of them."""
    base = _sampled(tuple(R(*s) for s in SHAPES) + ((R(0),) if terminal else ()))
    if products and draw(_PRODUCT_OR_NOT) == "product":
        return Product(draw(base), draw(base))
    return draw(base)


@_cached
@st.composite
def open_sets(draw, shape=None):
    """A proper open subset of R^shape: an `OpenBox`, an `OpenBall` or the orthant `Positive`."""
    shape = draw(shapes()) if shape is None else tuple(shape)
    kind = draw(_OPEN_KINDS)
    if kind == "box":
        low = draw(arrays(shape, -BOUND, 1.0))
        width = draw(arrays(shape, 0.5, 3.0))
        return OpenBox(low, low + width, shape)
    if kind == "ball":
        return OpenBall(draw(arrays(shape)), draw(floats(0.5, 3.0)))
    return Positive(*shape)


@_cached
@st.composite
def spaces(draw, terminal: bool = True, products: bool = True):
    """Any space: R^shape, R^0, OpenBox, OpenBall, Positive, and binary products of them."""
    def base():
        kind = draw(_SPACE_KINDS if terminal else _SPACE_KINDS_NO_TERMINAL)
        if kind == "terminal":
            return R(0)
        if kind == "open":
            return draw(open_sets())
        return draw(euclidean_spaces(terminal=False, products=False))

    if products and draw(_PRODUCT_OR_NOT) == "product":
        return Product(base(), base())
    return base()


# -- points and tangents --------------------------------------------------------------------------

@_cached
@st.composite
def points(draw, space: Space):
    """A point strictly inside `space` (float64 jnp arrays; tuples for products; None for R^0)."""
    if isinstance(space, Product):
        return tuple(draw(points(f)) for f in space.factors)
    if isinstance(space, R):
        return None if space.is_terminal else jnp.asarray(draw(arrays(space.shape)))
    if isinstance(space, OpenBox):
        low, high = space.bounds()
        u = draw(arrays(space.shape, 0.05, 0.95))
        return jnp.asarray(low + u * (high - low))
    if isinstance(space, OpenBall):
        direction = draw(arrays(space.shape, -1.0, 1.0))
        norm = np.sqrt(np.sum(direction ** 2))
        r = space.radius * draw(floats(0.0, 0.9))
        offset = direction * (r / norm) if norm > 0 else direction * 0.0
        return jnp.asarray(space.center_array() + offset)
    if isinstance(space, Positive):
        return jnp.asarray(draw(arrays(space.shape, 0.1, 3.0)))
    # a space of the user's own: trust its sampler
    key = jax.random.PRNGKey(draw(st.integers(0, 2 ** 32 - 1)))
    return space.check(space.sample_interior(key), "a sampled interior point")


@_cached
@st.composite
def tangents(draw, space: Space):
    """A tangent vector at any point of `space` (the raw pytree: arrays, tuples, None for R^0)."""
    if isinstance(space, Product):
        return tuple(draw(tangents(f)) for f in space.factors)
    if space.size == 0:
        return None
    return jnp.asarray(draw(arrays(space.shape)))


def covectors(space: Space):
    """A cotangent vector on `space` (the raw pytree; (R^n)* has the shape of R^n)."""
    return tangents(space)


def scalars():
    """A real number in [-2, 2] (as a Python float)."""
    return floats()


# -- smooth maps ----------------------------------------------------------------------------------

# Maps are written with `lax` primitives: differentiated op by op (un-jitted), a primitive
# costs a fraction of a `jax.numpy` function, which is itself a small jitted program.
ACTIVATIONS = {
    "id": lambda z: z,
    "tanh": lax.tanh,
    "sin": lax.sin,
    "softplus": lambda z: lax.log1p(lax.exp(z)),  # arguments stay small: no overflow
    "exp∘tanh": lambda z: lax.exp(lax.tanh(z)),  # exp of a bounded argument
}


def _leaves(space: Space) -> list:
    """The factors of `space` that carry an array, in pytree order (R^0 carries none)."""
    if isinstance(space, Product):
        return [leaf for f in space.factors for leaf in _leaves(f)]
    return [] if space.size == 0 else [space]


def _treedef(space: Space):
    """The pytree structure of a value of `space` (tuples for products, None for R^0)."""
    def template(s):
        if isinstance(s, Product):
            return tuple(template(f) for f in s.factors)
        return None if s.size == 0 else 0.0
    return jax.tree_util.tree_structure(template(space))


def _into(space: Space):
    """(kind, constants) of a smooth map from R^shape onto a region well inside `space`."""
    c = jnp.asarray  # constants in JAX's float type, so that lax sees one dtype
    if isinstance(space, R):
        return "R", ()
    if isinstance(space, OpenBox):
        low, high = space.bounds()
        return "box", (c(0.5 * (low + high)), c(0.45 * (high - low)))
    if isinstance(space, OpenBall):
        return "ball", (c(space.center_array()), c(0.9 * space.radius), c(1.0))
    if isinstance(space, Positive):
        return "positive", (c(np.full(space.shape, 0.1)),)
    raise UnsupportedError(f"smooth_maps cannot build maps into {space!r}")


def _squash(kind: str, constants, z):
    """Onto the box (mid ± half·tanh), into the ball (a radial squash), onto (0.1, ∞)."""
    if kind == "box":
        mid, half = constants
        return lax.add(mid, lax.mul(half, lax.tanh(z)))
    if kind == "ball":
        center, radius, one = constants
        dims = tuple(range(z.ndim))
        norm2 = lax.dot_general(z, z, ((dims, dims), ((), ())))
        scale = lax.mul(radius, lax.rsqrt(lax.add(norm2, one)))
        return lax.add(center, lax.mul(lax.broadcast(scale, z.shape), z))
    if kind == "positive":
        (floor,) = constants
        return lax.add(floor, lax.log1p(lax.exp(z)))
    return z


def _contract(W, x):
    """W · x, contracting all of x's axes with the trailing axes of W."""
    if x.ndim == 0:
        return lax.mul(W, lax.broadcast(x, W.shape))
    dims_x = tuple(range(x.ndim))
    dims_W = tuple(range(W.ndim - x.ndim, W.ndim))
    return lax.dot_general(W, x, ((dims_W, dims_x), ((), ())))


def _sum(terms):
    return functools.reduce(lax.add, terms)


def _layer_kernel(x, Ws, bs, params, *, act, kinds, treedef):
    xs = [jnp.asarray(leaf) for leaf in jax.tree_util.tree_leaves(x)]
    outs = []
    for row, b, kind, prm in zip(Ws, bs, kinds, params):
        z = _sum([b] + [_contract(W, xi) for W, xi in zip(row, xs)])
        outs.append(_squash(kind, prm, ACTIVATIONS[act](z)))
    return jax.tree_util.tree_unflatten(treedef, outs)


def _linear_kernel(v, Ws, *, shapes, treedef):
    xs = [jnp.asarray(leaf) for leaf in jax.tree_util.tree_leaves(v)]
    outs = [_sum([_contract(W, xi) for W, xi in zip(row, xs)]) if xs else jnp.zeros(shape)
            for row, shape in zip(Ws, shapes)]
    return jax.tree_util.tree_unflatten(treedef, outs)


def _elementwise_kernel(x, *, act):
    return tree_map(ACTIVATIONS[act], x)


_ACTIVATION_NAMES = st.sampled_from(sorted(ACTIVATIONS))
_SEEDS = st.integers(0, 2 ** 32 - 1)


def _rng(draw) -> np.random.Generator:
    # Weights come from a drawn seed: drawing every entry through Hypothesis costs more
    # than the whole evaluation of a law.
    return np.random.default_rng(draw(_SEEDS))


def _weights(rng: np.random.Generator, dom: Space, cod: Space, scale: float):
    """One random matrix (a tensor of shape out + in) per pair of leaves, scaled by fan-in."""
    ins, outs = _leaves(dom), _leaves(cod)
    fan_in = max(sum(s.size for s in ins), 1)
    return [[jnp.asarray(scale * rng.uniform(-1.0, 1.0, o.shape + i.shape) / np.sqrt(fan_in))
             for i in ins] for o in outs]


@_cached
@st.composite
def _layer(draw, dom: Space, cod: Space):
    """x ↦ into_cod(σ(W x + b)): a random affine map, an activation, a map into cod."""
    rng = _rng(draw)
    Ws = _weights(rng, dom, cod, 1.5)
    leaves = _leaves(cod)
    bs = [jnp.asarray(rng.uniform(-1.0, 1.0, leaf.shape)) for leaf in leaves]
    kinds, params = zip(*(_into(leaf) for leaf in leaves)) if leaves else ((), ())
    act = draw(_ACTIVATION_NAMES)
    kernel = functools.partial(_layer_kernel, Ws=Ws, bs=bs, params=params, act=act,
                               kinds=tuple(kinds), treedef=_treedef(cod))
    return Smooth(dom, cod, kernel, f"{act}∘affine" if act != "id" else "affine")


def _elementwise(space: Space, act: str) -> Smooth:
    return Smooth(space, space, functools.partial(_elementwise_kernel, act=act), act)


@_cached
@st.composite
def smooth_maps(draw, dom: Space | None = None, cod: Space | None = None, depth: int = 2):
    """A random smooth map dom → cod built from primitives.

    Primitives: affine maps with random matrices followed by an activation (id, tanh, sin,
    softplus, exp∘tanh) and, into an open set, a squashing map that lands well inside it;
    elementwise activations; projections. Combinators (up to `depth` deep): composition
    through a drawn middle space, pairing ⟨f, g⟩ into a product, products f × g.
    `dom` may be any space, `cod` any of R^n, R^0, OpenBox, OpenBall, Positive and their
    products (the map lands well inside it); both default to drawn Euclidean spaces.
    """
    dom = draw(euclidean_spaces()) if dom is None else dom
    cod = draw(euclidean_spaces()) if cod is None else cod
    options = ["layer"]
    if depth > 0:
        options += ["compose"]
        if _binary(cod):
            options += ["pair"]
        if _binary(dom) and _binary(cod):
            options += ["product"]
        if dom == cod and euclidean(dom):
            options += ["elementwise"]
        if _binary(dom) and cod in cast(Product, dom).factors:
            options += ["projection"]
    kind = draw(_sampled(tuple(options)))
    if kind == "compose":
        mid = draw(euclidean_spaces(products=False))
        return draw(smooth_maps(dom, mid, depth - 1)) >> draw(smooth_maps(mid, cod, depth - 1))
    if kind == "pair":
        B, C = cast(Product, cod).factors  # "pair" is drawn only for a binary product
        return pair(draw(smooth_maps(dom, B, depth - 1)), draw(smooth_maps(dom, C, depth - 1)))
    if kind == "product":
        (A, C), (B, D) = cast(Product, dom).factors, cast(Product, cod).factors
        return draw(smooth_maps(A, B, depth - 1)) * draw(smooth_maps(C, D, depth - 1))
    if kind == "elementwise":
        return _elementwise(dom, draw(_ACTIVATION_NAMES))
    if kind == "projection":
        A, B = cast(Product, dom).factors
        which = draw(_sampled(("fst",) * (A == cod) + ("snd",) * (B == cod)))
        return (fst if which == "fst" else snd)(A, B)
    return draw(_layer(dom, cod))


@_cached
@st.composite
def endomorphisms(draw, space: Space | None = None, depth: int = 2):
    """A smooth map A → A (with A drawn if not given)."""
    space = draw(spaces()) if space is None else space
    return draw(smooth_maps(space, space, depth))


@_cached
@st.composite
def linear_maps(draw, dom: Space | None = None, cod: Space | None = None):
    """A linear map between tangent spaces, given by random matrices (one per pair of leaves).

    No transpose is supplied, so its dual is computed by the library (`jax.linear_transpose`).
    """
    dom = draw(euclidean_spaces()) if dom is None else dom
    cod = draw(euclidean_spaces()) if cod is None else cod
    Ws = _weights(_rng(draw), dom, cod, 2.0)
    apply = functools.partial(_linear_kernel, Ws=Ws, shapes=tuple(leaf.shape for leaf in _leaves(cod)),
                              treedef=_treedef(cod.tangent))
    return Linear(dom, cod, apply, name="M")


# -- parameterised maps ---------------------------------------------------------------------------

@_cached
@st.composite
def para_maps(draw, dom: Space | None = None, cod: Space | None = None, param: Space | None = None,
              depth: int = 1):
    """A parameterised map (P, f : A × P → B) whose f is a drawn smooth map (P may be R^0)."""
    dom = draw(spaces()) if dom is None else dom
    cod = draw(euclidean_spaces()) if cod is None else cod
    param = draw(spaces()) if param is None else param
    g = draw(smooth_maps(dom * param, cod, depth))
    return Para(dom, cod, param, lambda a, p: g((a, p)), f"para({g.name})")


__all__ = [
    "SHAPES", "BOUND", "ACTIVATIONS", "floats", "arrays", "shapes", "euclidean_spaces", "open_sets",
    "spaces", "points", "tangents", "covectors", "scalars", "smooth_maps", "endomorphisms",
    "linear_maps", "para_maps",
]
