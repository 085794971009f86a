"""Discrete inputs: token sequences (for `embedding`) and random keys (for `dropout`).

**Tokens.** The theory's objects are open subsets of R^n, and the integers are not one. A
sequence of T tokens from a vocabulary of V is typed as a point of the open set

    Tokens(T, V) = {x ∈ R^T : every x_t lies within 1/2 of an integer in 0..V−1} ⊆ R^T,

a disjoint union of open cubes around the integer points. `embedding` reads x_t through
round(x_t), so it is smooth on Tokens(T, V) and *locally constant* in x: its input covector
is exactly zero (it is derived by JAX, which gives zero through `round`). Tokens may be given
as floats of integer value (the covector is then an array of zeros) or as an integer array
(JAX then gives its float0 "no covector" for the input). The parameter covector is dense in
form but sparse in effect: only the columns of the tokens that occur are non-zero.

**Keys.** `dropout`'s randomness is an explicit input, a PRNG key on a wire of its own:
`dropout(rate)` at A is a lens A × Keys → A. Keys are raw key data (uint32, the shape of
`jax.random.PRNGKey(0)`), a discrete set read only through the random bits it determines,
so nothing is differentiated in them either (their covector is float0). Each example carries
its own key (a batch has one per row), and a new key per step gives new masks.
`evaluation(model)` is the same expression with every dropout replaced by (x, k) ↦ x: the
same spaces and parameter point, dropout inactive.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from categories import Product, R, Space, draws
from categories.points import is_concrete
from categories.dimensions import dimension

from ..families import LensFamily, family
from .basic import layer_sizes
from ..inputs import need_lens
from ..layer import Layer
from categories.errors import DomainError, HyperparameterError, SpaceMismatch

KEY_SHAPE = tuple(jax.eval_shape(jax.random.PRNGKey, 0).shape)
"""The shape of the raw data of a PRNG key (`Keys()` is the space of such keys)."""


@dataclass(frozen=True, repr=False)
class Tokens(Space):
    """Tokens(T, V) ⊆ R^T: sequences of T tokens from 0..V−1, each coordinate within 1/2 of
    its token (open: a disjoint union of open cubes).

    Examples:
        >>> T = Tokens(4, 10)
        >>> T.contains(jnp.array([0.0, 3.0, 9.0, 2.0])), T.contains(jnp.array([0.0, 3.0, 10.0, 2.0]))
        (True, False)
    """

    shape: tuple
    vocab: int = 0
    discrete = True  # integer points keep their dtype (`as_real`)

    def __init__(self, T: int, vocab: int):
        T = dimension(T, "Tokens: T", 1)
        vocab = dimension(vocab, "Tokens: vocab", 1)
        object.__setattr__(self, "shape", (int(T),))
        object.__setattr__(self, "vocab", int(vocab))

    def interior_margin(self, x):
        x = jnp.asarray(x, dtype=jnp.result_type(float))
        nearest = jnp.clip(jnp.round(x), 0, self.vocab - 1)
        return 0.5 - jnp.abs(x - nearest)

    def check(self, x, what: str = "point"):
        # said in tokens, not as an open-set margin: which position holds no token id, and why
        if self.mismatch(x, what) is None and is_concrete(x):
            v = np.asarray(x, dtype=float)
            # NaN and infinities are left to the finite check below, which names them
            bad = np.isfinite(v) & ~(np.abs(v - np.clip(np.round(v), 0, self.vocab - 1)) < 0.5)
            if bad.any():
                t = int(np.argmax(bad))
                raise DomainError(
                    f"{what} is not a point of {self!r}: token ids must be integers in "
                    f"[0, {self.vocab}) (or within 1/2 of one), got {v[t]:g} at position {t}")
        return super().check(x, what)

    def sample_interior(self, key):
        return jax.random.randint(key, self.shape, 0, self.vocab).astype(jnp.result_type(float))

    def __repr__(self):
        return f"Tokens({self.shape[0]}, V={self.vocab})"


@dataclass(frozen=True, repr=False)
class Keys(Space):
    """Raw PRNG key data (uint32 of shape KEY_SHAPE), a discrete input read only through the
    random bits it determines: no map is differentiated in it (its covector is float0). A
    typed key (`jax.random.key(0)`) is not key data: `jax.random.key_data(key)` gives it.

    Examples:
        >>> Keys().shape == KEY_SHAPE, Keys().contains(jax.random.PRNGKey(0))
        (True, True)
    """

    shape: tuple
    discrete = True  # a key is never rounded to a float (`as_real`)

    def __init__(self):
        object.__setattr__(self, "shape", KEY_SHAPE)

    def mismatch(self, x, where: str = "the point", lead: tuple = ()) -> str | None:
        why = super().mismatch(x, where, lead)
        if why and jnp.issubdtype(getattr(x, "dtype", np.float32), jax.dtypes.prng_key):
            return why + ": a typed key is not key data, pass jax.random.key_data(key)"
        return why

    def check(self, x, what: str = "point"):
        # raw uint32 data only: a float or signed array has the shape of key data but is not
        # one (dropout reads the bits as uint32). Checked here, not in `mismatch`, since shape
        # inference stands for every point, keys too, by a float array
        x = super().check(x, what)
        if getattr(x, "dtype", None) != np.uint32:
            raise DomainError(self.not_a_point(
                what, (), f"expected raw key data (uint32), got dtype "
                          f"{getattr(x, 'dtype', type(x).__name__)}: pass "
                          "jax.random.PRNGKey(seed), or jax.random.key_data(key) for a typed key"))
        return x

    def sample_interior(self, key):
        k = jax.random.split(key)[0]
        return jax.random.key_data(k) if jnp.issubdtype(k.dtype, jax.dtypes.prng_key) else k

    def __repr__(self):
        return "Keys"


def embedding(vocab: int, d: int) -> LensFamily:
    """x ↦ (E[:, x_1], ..., E[:, x_T])ᵀ : Tokens(T, V) → R^{T×d}, parameters E ∈ R^{d×V} (column
    convention: column k is the image of the one-hot vector e_k); zero input covector.

    Examples:
        >>> emb = embedding(10, 3).at(Tokens(4, 10))
        >>> emb
        embedding(10→3) : Tokens(4, V=10) → R^{4×3}, params R^{3×10}
        >>> emb(jnp.array([1, 2, 3, 4]), emb.init(jax.random.PRNGKey(0))).shape
        (4, 3)
    """
    vocab, d = layer_sizes("embedding", vocab=vocab, d=d)
    name = f"embedding({vocab}→{d})"

    def fwd(x, E):
        # round, then index: locally constant in x, so JAX's derivative in x is exactly 0
        idx = jnp.round(x).astype(jnp.int32)
        return jnp.take(E, idx, axis=1).T

    def make(A: Space) -> Layer:
        if not isinstance(A, Tokens) or A.vocab != vocab:
            raise SpaceMismatch(f"{name} needs token sequences Tokens(T, {vocab}), got {A!r}: "
                            f"fix it with {name}.at(Tokens(T, {vocab}))")
        return Layer(A, R(A.shape[0], d), R(d, vocab), fwd, name=name,
                     init=lambda k: draws.normal(k, (d, vocab)))

    return family(make, name)


def dropout(rate: float) -> LensFamily:
    """(x, k) ↦ m_k ⊙ x / (1 − rate) : A × Keys → A, no parameters (R^0), m_k ∈ {0, 1}^A drawn
    from the key k with P(m = 1) = 1 − rate; `evaluation` replaces it by (x, k) ↦ x.

    Examples:
        >>> drop = dropout(0.5).at(R(4) * Keys())
        >>> y = drop((jnp.ones(4), jax.random.PRNGKey(1)), None)
        >>> set(np.asarray(y).tolist()) <= {0.0, 2.0}
        True
    """
    if isinstance(rate, (bool, np.bool_)) or not isinstance(rate, (int, float, np.integer,
                                                                   np.floating)):
        raise HyperparameterError(f"dropout needs a rate, a number in [0, 1), got {rate!r}")
    rate = float(rate)
    if not 0.0 <= rate < 1.0:
        raise HyperparameterError(f"dropout needs 0 ≤ rate < 1, got {rate}")
    name = f"dropout({rate:g})"

    def fwd(xk, p):
        x, k = xk
        if rate == 0.0:
            return x
        keep = jax.random.bernoulli(k.astype(jnp.uint32), 1.0 - rate, x.shape)
        return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))

    def make(AK: Space) -> Layer:
        if not isinstance(AK, Product) or len(AK.factors) != 2 or AK.factors[1] != Keys():
            raise SpaceMismatch(f"{name} needs a domain A × Keys (the key on a wire of its own), got {AK!r}")
        A = AK.factors[0]
        # its evaluation form, read by `evaluation` (a dropout is the identity there)
        identity = Layer(AK, A, R(0), lambda xk, p: xk[0], name=f"{name}, evaluation")
        return Layer(AK, A, R(0), fwd, name=name, at_evaluation=identity)

    return family(make, name)


def _evaluation(lens):
    if lens.at_evaluation is not None:  # what a layer declares it is at evaluation
        return lens.at_evaluation
    if not lens.children:
        return lens
    return lens.rebuild(tuple(_evaluation(c) for c in lens.children))


def evaluation(lens):
    """The lens at evaluation: every layer that declares an evaluation form (dropout) replaced
    by it, through `children`/`rebuild`; the same spaces and parameter point.

    Examples:
        >>> model = dropout(0.5).at(R(4) * Keys()) >> dense(4, 1)
        >>> p = model.init(jax.random.PRNGKey(0))
        >>> x = (jnp.ones(4), jax.random.PRNGKey(1))
        >>> np.allclose(evaluation(model)(x, p), dense(4, 1)(jnp.ones(4), p[1]))
        True
    """
    need_lens(lens, "evaluation")
    return lens.lift(_evaluation, name=f"evaluation({lens.name})")


__all__ = ["Tokens", "Keys", "KEY_SHAPE", "embedding", "dropout", "evaluation"]
