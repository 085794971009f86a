"""Sequence layers: per example a sequence is a point of R^{T×d} (T positions, d features).

Every layer here is a family (`lenses.families`): T comes from what it is composed with.
Attention is a lens expression, not one opaque layer: the input wire is copied explicitly
into queries, keys and values,

    copy ≫ (copy ⊗ id) ≫ ((query ⊗ key) ⊗ value) ≫ attention core ≫ output,

so its backward part adds the three covectors that come back along the copies (the rule of
`copy`). A transformer block is two `residual`s (copy ≫ (block ⊗ id) ≫ add), each with a
layer normalisation in front (pre-norm).

None of these layers declares `Affine`: the block KFAC builds for x ↦ W x + b reads one input
vector per example, and a position-wise layer has T of them, so structured metrics leave these
layers to their fallback.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from categories import R, Space, draws

from ..families import LensFamily, family
from ..losses import LossFamily
from ..losses.builtin import class_labels, classes_arg
from .basic import gelu, identity, layer_sizes, lecun_normal, residual
from ..inputs import flag
from ..layer import Layer
from ..structure import copy
from categories.numbers import real_number
from categories.errors import DimensionError, KindError, SpaceMismatch, TargetError, TargetTypeError


def _row(v, x):
    """The vector v (the last axis of x) shaped to broadcast over x's leading axes: the test
    configuration raises on implicit rank promotion, so broadcasting is written out."""
    return jnp.reshape(v, (1,) * (x.ndim - 1) + v.shape)


def _sequence(A: Space, who: str, d: int | None = None) -> tuple:
    if len(A.shape) != 2 or (d is not None and A.shape[1] != d):
        want = f"R^{{T×{d}}}" if d is not None else "R^{T×d}"
        raise SpaceMismatch(f"{who} needs sequences {want} (one row per position), got {A!r}")
    return A.shape


# -- position-wise layers ------------------------------------------------------------------------

def positionwise_dense(n_in: int, n_out: int, name: str | None = None) -> LensFamily:
    """X ↦ X Wᵀ + 1 bᵀ : R^{T×n_in} → R^{T×n_out}, parameters R^{n_out×n_in} × R^{n_out}
    (dense(n_in, n_out) at every position, one W shared by the T positions).

    Examples:
        >>> f = positionwise_dense(4, 2).at(R(5, 4))
        >>> f.cod, n_params(f)
        (R^{5×2}, 10)
    """
    n_in, n_out = layer_sizes("positionwise_dense", n_in=n_in, n_out=n_out)
    name = name or f"positionwise_dense({n_in}→{n_out})"

    def fwd(X, Wb):
        return X @ Wb[0].T + _row(Wb[1], X)

    def make(A: Space) -> Layer:
        T, _ = _sequence(A, name, n_in)
        return Layer(A, R(T, n_out), R(n_out, n_in) * R(n_out), fwd, name=name,
                     init=lambda k: (lecun_normal(k, (n_out, n_in), n_in), jnp.zeros((n_out,))))

    return family(make, name)


def layer_norm(d: int, eps: float = 1e-5) -> LensFamily:
    """x ↦ γ ⊙ (x − μ(x)) / √(σ²(x) + ε) + β over the last axis : A → A (A = R^d, R^{T×d}, ...),
    parameters (γ, β) ∈ R^d × R^d (initially γ = 1, β = 0).

    Examples:
        >>> ln = layer_norm(4).at(R(4))
        >>> y = ln(jnp.array([1.0, 2.0, 3.0, 4.0]), ln.init(jax.random.PRNGKey(0)))
        >>> round(float(y.mean()), 6), round(float(y.std()), 3)
        (0.0, 1.0)
    """
    (d,) = layer_sizes("layer_norm", d=d)
    eps = real_number(eps, "layer_norm: eps", above=0)
    name = f"layer_norm({d})"

    def fwd(x, gb):
        mu = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + eps) * _row(gb[0], x) + _row(gb[1], x)

    def make(A: Space) -> Layer:
        if not A.shape or A.shape[-1] != d:
            raise SpaceMismatch(f"{name} normalises a last axis of length {d}, got {A!r}")
        return Layer(A, A, R(d) * R(d), fwd, name=name,
                     init=lambda k: (jnp.ones((d,)), jnp.zeros((d,))))

    return family(make, name, endo=True)


def position_embedding(scale: float = 0.02) -> LensFamily:
    """X ↦ X + E : R^{T×d} → R^{T×d}, parameters E ∈ R^{T×d} (one learned vector per position,
    initially N(0, scale²)).

    Examples:
        >>> pe = position_embedding().at(R(5, 4))
        >>> pe.param, np.allclose(pe(jnp.zeros((5, 4)), jnp.ones((5, 4))), 1.0)
        (R^{5×4}, True)
    """
    scale = real_number(scale, "position_embedding: scale (the standard deviation of E at "
                        "initialisation)", above=0)

    def make(A: Space) -> Layer:
        _sequence(A, "position_embedding")
        return Layer(A, A, R(*A.shape), lambda X, E: X + E, name="position_embedding",
                     init=lambda k: scale * draws.normal(k, A.shape))

    return family(make, "position_embedding", endo=True)


# -- attention -----------------------------------------------------------------------------------

def attention_core(A: Space, heads: int, causal: bool = True) -> Layer:
    """((Q, K), V) ↦ concat_h softmax(Q_h K_hᵀ / √d_h + M) V_h : (A × A) × A → A, A = R^{T×d},
    no parameters (R^0); M = −∞ above the diagonal when `causal` (position t sees s ≤ t).

    Examples:
        >>> A = R(3, 4)
        >>> core = attention_core(A, heads=2)
        >>> core.dom
        (R^{3×4} × R^{3×4}) × R^{3×4}
        >>> Q = K = V = jnp.ones((3, 4))
        >>> np.allclose(core(((Q, K), V), None), V)
        True
    """
    if not isinstance(A, Space):
        raise KindError(f"attention_core: A must be a Space of sequences R^{{T×d}} (e.g. "
                        f"R(5, 8)), got {A!r}")
    (heads,) = layer_sizes("attention_core", heads=heads)
    causal = flag(causal, "attention_core: causal")
    T, d = _sequence(A, "attention_core")
    if d % heads:
        raise DimensionError(f"attention_core: {heads} heads do not divide the width {d}")
    dh = d // heads
    # numpy constants: built once here, not traced again at every call
    mask = np.tril(np.ones((T, T), dtype=bool))[None, :, :]
    scale = 1.0 / math.sqrt(dh)

    def fwd(qkv, p):
        (Q, K), V = qkv
        q, k, v = (jnp.reshape(Z, (T, heads, dh)) for Z in (Q, K, V))
        s = jnp.einsum("thc,shc->hts", q, k) * scale
        if causal:
            # the most negative finite number, not −∞: a masked score's weight is exactly 0
            # and no inf − inf appears in the derivative of softmax
            s = jnp.where(mask, s, jnp.finfo(s.dtype).min)
        w = jax.nn.softmax(s, axis=-1)
        return jnp.reshape(jnp.einsum("hts,shc->thc", w, v), (T, d))

    name = f"attention({heads} heads{', causal' if causal else ''})"
    return Layer((A * A) * A, A, R(0), fwd, name=name)


def multi_head_attention(d: int, heads: int, causal: bool = True) -> LensFamily:
    """Multi-head self-attention R^{T×d} → R^{T×d}, parameters four position-wise dense(d, d)
    (query, key, value, output): copy ≫ (copy ⊗ id) ≫ ((q ⊗ k) ⊗ v) ≫ core ≫ output.

    Examples:
        >>> att = multi_head_attention(8, heads=2).at(R(5, 8))
        >>> att.cod, n_params(att)
        (R^{5×8}, 288)
    """
    d, heads = layer_sizes("multi_head_attention", d=d, heads=heads)
    causal = flag(causal, "multi_head_attention: causal")
    if d % heads:
        raise DimensionError(f"multi_head_attention: {heads} heads do not divide the width {d}")
    name = f"multi_head_attention({d}, {heads} heads{', causal' if causal else ''})"

    def make(A: Space):
        _sequence(A, name, d)
        q, k, v, o = (positionwise_dense(d, d, name=n).at(A) for n in ("query", "key", "value", "output"))
        three = copy(A) >> (copy(A) @ identity.at(A))  # x ↦ ((x, x), x): the copies are explicit
        return three >> ((q @ k) @ v) >> attention_core(A, heads, causal) >> o

    return family(make, name, endo=True)


def transformer_block(d: int, heads: int, hidden: int, causal: bool = True) -> LensFamily:
    """residual(layer_norm ≫ attention) ≫ residual(layer_norm ≫ dense(d→hidden) ≫ gelu ≫
    dense(hidden→d)), position-wise dense : R^{T×d} → R^{T×d} (pre-norm transformer block).

    Examples:
        >>> block = transformer_block(8, heads=2, hidden=16).at(R(5, 8))
        >>> block.cod, n_params(block)
        (R^{5×8}, 600)
    """
    d, heads, hidden = layer_sizes("transformer_block", d=d, heads=heads, hidden=hidden)
    causal = flag(causal, "transformer_block: causal")
    if d % heads:
        raise DimensionError(f"transformer_block: {heads} heads do not divide the width {d}")
    name = f"transformer_block({d}, {heads} heads, {hidden})"

    def make(A: Space):
        _sequence(A, name, d)
        attend = residual(layer_norm(d).at(A) >> multi_head_attention(d, heads, causal).at(A))
        mlp = residual(layer_norm(d).at(A) >> positionwise_dense(d, hidden).at(A) >> gelu
                       >> positionwise_dense(hidden, d))
        return attend >> mlp

    return family(make, name, endo=True)


# -- the loss of a sequence ----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class SequenceCrossEntropy(LossFamily):
    """y ↦ (Z ↦ (1/T) Σ_t −log softmax(Z_t)_{y_t}) : R^{T×classes} → R, for integer labels
    y ∈ {0..classes−1}^T (the mean over positions: the loss per token, in nats).

    Examples:
        >>> L = SequenceCrossEntropy(classes=2)(jnp.array([0, 1, 1]))
        >>> round(float(L(jnp.zeros((3, 2)))), 4)
        0.6931
        >>> sequence_cross_entropy == SequenceCrossEntropy()
        True
    """

    classes: int | None = None
    name = "sequence_cross_entropy"
    symbol = "sequence CE"

    def __post_init__(self):
        object.__setattr__(self, "classes", classes_arg(self.classes, self.name))

    def value(self, Z, y):
        # labels may arrive as floats of integer value; one that is no class (1.5, −1,
        # `classes`) gives NaN, value and covector, as softmax_cross_entropy's does, where
        # JAX's indexing would round it, wrap it or clamp it to a class
        idx, inside = class_labels(y, Z.shape[-1])
        logp = jax.nn.log_softmax(Z, axis=-1)
        picked = jnp.take_along_axis(logp, idx[:, None], axis=-1)[:, 0]
        return -jnp.mean(picked * jnp.where(inside, 1.0, jnp.nan).astype(logp.dtype))

    def output_space(self, y):
        if self.classes is None:
            raise TargetTypeError("sequence_cross_entropy needs the number of classes: use "
                            "sequence_cross_entropy(classes=k)")
        if len(y.shape) != 1:
            raise TargetError(f"{self!r}: a target is a sequence of T labels, got shape {tuple(y.shape)}")
        if np.dtype(y.dtype) == np.bool_:
            raise TargetTypeError(f"{self!r}: labels are integers in [0, {self.classes}) (or "
                                  "floats of integer value), got dtype bool")
        return R(y.shape[0], self.classes)

    def check_values(self, Y, batched=True):
        bad = ~np.asarray(class_labels(np.asarray(Y), self.classes)[1])
        if np.any(bad):
            i = tuple(int(j) for j in np.argwhere(bad)[0])
            raise TargetError(f"{self!r}: labels must be integers in [0, {self.classes}), got "
                             f"{np.asarray(Y)[i]} at index {i}")

    def targets_ok(self, Y):
        inside = class_labels(Y, self.classes)[1]
        return jnp.all(inside, axis=tuple(range(1, jnp.ndim(Y))))


sequence_cross_entropy = SequenceCrossEntropy()
"""The family y ↦ (Z ↦ (1/T) Σ_t −log softmax(Z_t)_{y_t}) (see `SequenceCrossEntropy`)."""


__all__ = ["SequenceCrossEntropy", "positionwise_dense", "layer_norm", "position_embedding", "attention_core",
           "multi_head_attention", "transformer_block", "sequence_cross_entropy"]
