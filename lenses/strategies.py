"""Hypothesis strategies for parameterised lenses: random architectures, lenses, points.

For property tests of the laws in `lenses.laws`, on the library's layers or on your own:

    from hypothesis import given, strategies as st
    from lenses import strategies as ls

    @given(ls.architectures(), st.data())
    def test_backward_is_the_gradient(arch, data):
        x = data.draw(ls.points(arch.lens.dom))
        p = data.draw(ls.parameter_points(arch.lens.param))
        ...

`architectures()` draws a chain of the library's layers (dense layers of widths 1–8, smooth
activations, residual blocks, parallel `@` blocks, weight tying) together with a **second
implementation** of the same network written directly in JAX (`Architecture.reference`),
which takes the same parameter point: an oracle that does not go through the lens code.
`para_lenses(A, B)` draws a parameterised lens A → B whose forward part is a random smooth
map (`affine_maps`) or a small architecture; `lenses(A, B)` a plain lens `lens_of(f)`.

Un-jitted JAX spends about a millisecond on each operation it differentiates, and compiles
each primitive afresh for each new shape: the drawn maps use few operations, the spaces come
from a short list (`SPACES`, `PARAMS`), and parameter points are drawn from a seed (not
element by element), which keeps drawing fast for networks with a few hundred parameters.
Requires `hypothesis` (a test extra).
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, field
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

from categories import OpenBox, Positive, Product, R, Smooth, Space
from categories import strategies as cs

from .layers import basic as layers
from .lens import lens_of
from .losses import binary_cross_entropy, half_squared_error, softmax_cross_entropy
from .layer import Layer
from .para_lens import ParaLens
from .slots import tie
from .structure import add, copy
from categories.errors import UnsupportedError

points = cs.points
covectors = cs.covectors

#: Smooth activations: the library's layer and an independent formula for the reference.
SMOOTH_ACTIVATIONS: dict[str, tuple] = {
    "tanh": (layers.tanh, jnp.tanh),
    "sigmoid": (layers.sigmoid, lambda x: 1.0 / (1.0 + jnp.exp(-x))),
    "softplus": (layers.softplus, lambda x: jnp.logaddexp(0.0, x)),
    "gelu": (layers.gelu, lambda x: 0.5 * x * (1.0 + jax.scipy.special.erf(x / np.sqrt(2.0)))),
    "id": (layers.identity, lambda x: x),
}
#: relu is not smooth at 0; its derivative there is taken to be 0 (as in JAX).
RELU = {"relu": (layers.relu, lambda x: jnp.where(x > 0, x, 0.0))}
ACTIVATIONS = {**SMOOTH_ACTIVATIONS, **RELU}

WIDTHS = tuple(range(1, 9))
BLOCKS = ("dense", "residual", "parallel")


@dataclass(repr=False)
class Architecture:
    """A drawn network: the lens, an independent JAX implementation, and how it was drawn.

    `reference(x, p)` computes the network's output from the same parameter point as
    `lens.forward(x, p)`, written with plain jnp operations block by block; `tied` is the
    pair of slots (of the untied chain) shared by weight tying, or None.
    """

    lens: ParaLens
    reference: Callable
    blocks: tuple
    tied: tuple | None = None
    untied: ParaLens | None = field(default=None, repr=False)

    def __repr__(self):
        tied = f", tied slots {list(self.tied)}" if self.tied else ""
        return f"Architecture({' ≫ '.join(self.blocks)}{tied})"


# -- the blocks: (lens, number of slots it adds to a chain, reference on its slots) -----------

def _dense_ref(x, Wb):
    W, b = Wb
    return jnp.einsum("ij,j->i", W, x) + b  # written without `@` on purpose: a second implementation


@functools.lru_cache(maxsize=None)
def _block(kind: str, n: int, m: int, act: str):
    """One drawn block R^n → R^m (and its reference), `act` the activation it uses inside.
    Lenses are immutable, so blocks are built once and shared between examples."""
    layer, g = ACTIVATIONS[act]
    if kind == "dense":
        return layers.dense(n, m), (_dense_ref,), f"dense({n}→{m})"
    if kind == "residual":  # copy ≫ ((dense ≫ act) ⊗ id) ≫ add: three slots, the middle nested
        lens = layers.residual(layers.dense(n, n) >> layer)

        def ref(x, s):  # s = ((Wb, None), None): the block's chain and the identity
            (Wb, _), _ = s
            return x + g(_dense_ref(x, Wb))

        return lens, (None, ref, None), f"residual(dense({n}→{n}) ≫ {act})"
    # parallel: copy ≫ (dense ⊗ (dense ≫ act)) ≫ add
    lens = copy(R(n)) >> (layers.dense(n, m) @ (layers.dense(n, m) >> layer)) >> add(R(m))

    def both(x, s):  # s = (Wb1, (Wb2, None))
        Wb1, (Wb2, _) = s
        return _dense_ref(x, Wb1) + g(_dense_ref(x, Wb2))

    return lens, (None, both, None), f"copy ≫ (dense({n}→{m}) ⊗ (dense({n}→{m}) ≫ {act})) ≫ add"


@functools.lru_cache(maxsize=None)
def _activation_block(n: int, act: str):
    layer, g = ACTIVATIONS[act]
    return layer.at(R(n)), (lambda x, s: g(x),), act


@st.composite
def architectures(draw, depth=(1, 6), widths=WIDTHS, activations=tuple(SMOOTH_ACTIVATIONS),
                  blocks=BLOCKS, tied: bool | None = None, n_in: int | None = None,
                  n_out: int | None = None):
    """A chain of `depth` blocks (dense, residual or parallel, each maybe followed by an
    activation) between widths drawn from `widths`; with `tied` (drawn when None) a pair of
    dense(n→n) layers around an activation is inserted and their slots are tied."""
    k = draw(st.integers(*depth)) if isinstance(depth, tuple) else depth
    ws = [draw(st.sampled_from(widths)) for _ in range(k + 1)]
    if n_in is not None:
        ws[0] = n_in
    if n_out is not None:
        ws[-1] = n_out
    tie_it = draw(st.booleans()) if tied is None else tied
    tie_at = draw(st.integers(0, k)) if tie_it else None
    parts, refs, names, tied_slots = [], [], [], None

    def push(piece):
        lens, slot_refs, name = piece
        parts.append(lens)
        refs.extend(slot_refs)
        names.append(name)

    for i in range(k + 1):
        if i == tie_at:  # dense(n→n) ≫ act ≫ dense(n→n), the two dense slots to be tied
            n, act = ws[i], draw(st.sampled_from(activations))
            tied_slots = (len(refs), len(refs) + 2)
            push(_block("dense", n, n, act))
            push(_activation_block(n, act))
            push(_block("dense", n, n, act))
        if i == k:
            break
        kind = draw(st.sampled_from(blocks))
        if kind == "residual" and ws[i] != ws[i + 1]:  # a residual block needs A → A
            ws[i + 1] = ws[i] if i + 1 < k or n_out is None else ws[i + 1]
            kind = kind if ws[i] == ws[i + 1] else "parallel"
        act = draw(st.sampled_from(activations))
        push(_block(kind, ws[i], ws[i + 1], act))
        if draw(st.booleans()):
            push(_activation_block(ws[i + 1], draw(st.sampled_from(activations))))

    chain = functools.reduce(operator.rshift, parts)

    def reference(x, slots):  # slot by slot; a structural slot (copy, add) has no reference of its own
        for ref, s in zip(refs, slots):
            if ref is not None:
                x = ref(x, s)
        return x

    if tied_slots is None:
        return Architecture(chain, lambda x, p: reference(x, p if len(refs) > 1 else (p,)), tuple(names))
    i, j = tied_slots
    keep = [s for s in range(len(refs)) if s != j]

    def untie(q):  # Q → P: the diagonal placed in the product, written again here
        by_slot = dict(zip(keep, (q,) if len(keep) == 1 else q))
        return tuple(by_slot[i] if s == j else by_slot[s] for s in range(len(refs)))

    return Architecture(tie(chain, [i, j]), lambda x, q: reference(x, untie(q)), tuple(names), (i, j),
                        chain)


# -- points ----------------------------------------------------------------------------------

@st.composite
def parameter_points(draw, space: Space, scale=(0.3, 1.5)):
    """A point of a parameter object: Gaussian arrays (matrices scaled by 1/√columns) from a
    drawn seed and scale; None on R^0; tuples on products; drawn points on open sets."""
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    s = draw(st.floats(*scale))

    def point(S):
        if isinstance(S, Product):
            return tuple(point(f) for f in S.factors)
        if not isinstance(S, R):
            return draw(cs.points(S))
        if S.is_terminal:
            return None
        x = rng.standard_normal(S.shape) * s
        return jnp.asarray(x / np.sqrt(S.shape[-1]) if len(S.shape) >= 2 else x)

    return point(space)


@st.composite
def batches(draw, space: Space, size=(1, 4)):
    """A batch of points of a Euclidean space: an array with a leading batch axis."""
    n = draw(st.integers(*size))
    return jnp.asarray(draw(cs.arrays((n,) + tuple(space.shape))))


# -- losses ----------------------------------------------------------------------------------

@st.composite
def losses(draw, space: Space, kinds=("half_squared_error", "softmax_cross_entropy",
                                      "binary_cross_entropy")):
    """A loss C → R for a drawn target: ½‖ŷ − y‖², cross-entropy against a probability vector,
    or binary cross-entropy on logits against targets in [0, 1] (cross-entropy only over two
    classes or more: over one it is refused, its loss 0 whatever the output)."""
    if not space.shape or space.shape[-1] < 2:
        kinds = tuple(k for k in kinds if k != "softmax_cross_entropy")
    kind = draw(st.sampled_from(kinds))
    if kind == "half_squared_error":
        return half_squared_error(jnp.asarray(draw(cs.arrays(space.shape))))
    if kind == "binary_cross_entropy":
        return binary_cross_entropy(jnp.asarray(draw(cs.arrays(space.shape, 0.0, 1.0))))
    w = np.asarray(draw(cs.arrays(space.shape, 0.01, 1.0)))
    return softmax_cross_entropy(jnp.asarray(w / w.sum()))


# -- lenses ----------------------------------------------------------------------------------

#: The few spaces the law tests draw from (few shapes keep un-jitted JAX from recompiling).
SPACES = (R(1), R(3), OpenBox(-1.0, 2.0, (3,)), Product(R(1), R(3)))
#: The few parameter objects drawn for `para_lenses` (R^0: a parameterless lens).
PARAMS = (R(0), R(3), R(2, 3), Positive(2))
#: The activations of `affine_maps` (cheap to differentiate un-jitted: one operation each).
MAP_ACTIVATIONS = {"tanh": jnp.tanh, "sin": jnp.sin, "id": lambda z: z}


def spaces():
    """One of `SPACES`: vectors, an open box, a product."""
    return st.sampled_from(SPACES)


def _vector(S) -> bool:
    return isinstance(S, R) and len(S.shape) == 1 and not S.is_terminal


def _leaf_spaces(space: Space) -> list:
    """The array-valued factors of a space, in the order of its pytree leaves (R^0 has none)."""
    if isinstance(space, Product):
        return [leaf for f in space.factors for leaf in _leaf_spaces(f)]
    return [] if space.size == 0 else [space]


def _squash(space: Space):
    """A smooth map from R^shape onto a region well inside `space` (its constants made once)."""
    if isinstance(space, OpenBox):
        lo, hi = space.bounds()
        mid, half = jnp.asarray((lo + hi) / 2), jnp.asarray((hi - lo) * 0.45)
        return lambda x: mid + half * jnp.tanh(x)
    if isinstance(space, Positive):
        return lambda x: 0.1 + jax.nn.softplus(x)
    if isinstance(space, R):
        return lambda x: x
    raise UnsupportedError(f"affine_maps cannot build maps into {space!r}")


@st.composite
def affine_maps(draw, dom: Space, cod: Space):
    """A smooth map x ↦ squash(σ(M x + c)) : dom → cod, leaf by leaf (each output leaf an affine
    map of all input leaves), σ drawn from `MAP_ACTIVATIONS`, M and c Gaussian from a drawn
    seed; `squash` lands well inside cod. Few operations, so that un-jitted derivatives stay
    cheap (a lighter cousin of categories.strategies.smooth_maps)."""
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    name = draw(st.sampled_from(sorted(MAP_ACTIVATIONS)))
    act = MAP_ACTIVATIONS[name]
    ins, outs = _leaf_spaces(dom), _leaf_spaces(cod)
    n_in = max(sum(S.size for S in ins), 1)
    # one matrix per (output leaf, input leaf), on flattened leaves: `@` is the cheapest
    # contraction to differentiate un-jitted
    Ms = [[jnp.asarray(rng.standard_normal((O.size, I.size)) / np.sqrt(n_in)) for I in ins]
          for O in outs]
    cs_ = [jnp.asarray(rng.standard_normal((O.size,)) * 0.5) for O in outs]
    squashes = [_squash(O) for O in outs]
    template = jax.tree_util.tree_structure(cod.zeros())

    def fn(x):
        xs = [xi if xi.ndim == 1 else jnp.reshape(xi, (-1,)) for xi in jax.tree_util.tree_leaves(x)]
        ys = []
        for O, row, c, squash in zip(outs, Ms, cs_, squashes):
            z = c
            for M, xi in zip(row, xs):
                z = z + M @ xi
            z = act(z)
            ys.append(squash(z if len(O.shape) == 1 else jnp.reshape(z, O.shape)))
        return jax.tree_util.tree_unflatten(template, ys)

    return Smooth(dom, cod, fn, f"{name}∘affine" if name != "id" else "affine")


@st.composite
def para_lenses(draw, dom: Space | None = None, cod: Space | None = None,
                param: Space | None = None, architecture: bool = True):
    """A parameterised lens dom → cod: a forward part A × P → B drawn by `affine_maps` (backward
    part derived; P drawn from `PARAMS` unless given), or, between vector spaces R^n → R^m when
    `architecture` and no P is asked for, a small chain of the library's layers."""
    dom = draw(spaces()) if dom is None else dom
    cod = draw(spaces()) if cod is None else cod
    if architecture and param is None and _vector(dom) and _vector(cod) and draw(st.booleans()):
        return draw(architectures(depth=(1, 2), widths=(1, 3), blocks=("dense", "parallel"),
                                  tied=False, n_in=dom.shape[0], n_out=cod.shape[0])).lens
    param = draw(st.sampled_from(PARAMS)) if param is None else param
    g = draw(affine_maps(dom * param, cod))
    fn = g.fn
    return Layer(dom, cod, param, lambda a, p: fn((a, p)), name=f"lens({g.name})")


@st.composite
def lenses(draw, dom: Space | None = None, cod: Space | None = None, maps=None):
    """A plain lens lens_of(f) = (f, R[f]) for a smooth map f : dom → cod drawn by `maps`
    (default `affine_maps`; `categories.strategies.smooth_maps` gives richer, slower ones)."""
    dom = draw(spaces()) if dom is None else dom
    cod = draw(spaces()) if cod is None else cod
    return lens_of(draw((maps or affine_maps)(dom, cod)))


__all__ = [
    "ACTIVATIONS", "SMOOTH_ACTIVATIONS", "RELU", "WIDTHS", "BLOCKS", "Architecture",
    "architectures", "parameter_points", "points", "covectors", "batches", "losses",
    "SPACES", "PARAMS", "MAP_ACTIVATIONS", "spaces", "affine_maps", "para_lenses", "lenses",
]
