"""Layers: parameterised lenses written per example (a batch is `batched(lens)`).

Column convention: `dense(n_in, n_out)` has parameter (W, b), W of shape (n_out, n_in), one
row per neuron, and computes W x + b (it declares so: `Affine`, which structured metrics
read). Activations, pooling, `flatten` and `conv2d` are families (`lenses.families`): their
spaces come from what they are composed with. Parameterless layers have parameter object R^0.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from categories import R, Space, draws
from categories.errors import DimensionError, SpaceMismatch
from categories.dimensions import dimension

from ..families import LensFamily, family
from ..inputs import need_callable, need_lens
from ..layer import Layer
from ..sites import Affine
from ..structure import add, copy


def lecun_normal(key, shape, fan_in):
    """A draw of N(0, 1/fan_in) (LeCun's normal): keeps the variance of W x near that of x
    for unit-variance inputs."""
    return draws.normal(key, shape) / math.sqrt(max(fan_in, 1))


def layer_sizes(layer: str, **sizes) -> list:
    """The sizes as Python ints if each is a positive integer (numpy's welcome), else a
    `DimensionError` naming the layer, the argument and the value."""
    return [dimension(v, f"{layer}: {k}", least=1) for k, v in sizes.items()]


def _tuple_of(layer: str, what: str, k, least: int) -> tuple:
    """An int or a pair of ints, each an integer ≥ least, as a pair (`DimensionError` else)."""
    if isinstance(k, (tuple, list)):
        if len(k) != 2:
            raise DimensionError(f"{layer}: {what} must be an integer or a pair of integers, got {k!r}")
        return tuple(dimension(v, f"{layer}: {what}", least) for v in k)
    return (dimension(k, f"{layer}: {what}", least),) * 2


def linear(n_in: int, n_out: int) -> Layer:
    """x ↦ W x : R^{n_in} → R^{n_out}, parameters R^{n_out×n_in}.

    Examples:
        >>> W = jnp.array([[1.0, 2.0], [3.0, 4.0]])
        >>> linear(2, 2)(jnp.array([1.0, 1.0]), W).tolist()
        [3.0, 7.0]
    """
    n_in, n_out = layer_sizes("linear", n_in=n_in, n_out=n_out)
    return Layer(R(n_in), R(n_out), R(n_out, n_in), lambda x, W: W @ x,
                 name=f"linear({n_in}→{n_out})", structure=Affine(bias=False),
                 init=lambda k: lecun_normal(k, (n_out, n_in), n_in))


def bias(n: int) -> Layer:
    """x ↦ x + b : R^n → R^n, parameters R^n (initialised at 0).

    Examples:
        >>> b = bias(2)
        >>> b.init(jax.random.PRNGKey(0)).tolist()
        [0.0, 0.0]
        >>> b(jnp.array([1.0, 2.0]), jnp.array([0.5, 0.5])).tolist()
        [1.5, 2.5]
    """
    (n,) = layer_sizes("bias", n=n)
    return Layer(R(n), R(n), R(n), lambda x, b: x + b, name=f"bias({n})",
                 init=lambda k: jnp.zeros((n,)))


def dense(n_in: int, n_out: int) -> Layer:
    """x ↦ W x + b : R^{n_in} → R^{n_out}, parameters R^{n_out×n_in} × R^{n_out}.

    Examples:
        >>> layer = dense(2, 3)
        >>> layer
        dense(2→3) : R^2 → R^3, params R^{3×2}×R^3
        >>> W, b = layer.init(jax.random.PRNGKey(0))
        >>> W.shape, b.shape
        ((3, 2), (3,))
        >>> np.allclose(layer(jnp.ones(2), (W, b)), W @ jnp.ones(2) + b)
        True
    """
    n_in, n_out = layer_sizes("dense", n_in=n_in, n_out=n_out)
    return Layer(R(n_in), R(n_out), R(n_out, n_in) * R(n_out),
                 lambda x, Wb: Wb[0] @ x + Wb[1], name=f"dense({n_in}→{n_out})",
                 structure=Affine(bias=True),
                 init=lambda k: (lecun_normal(k, (n_out, n_in), n_in), jnp.zeros((n_out,))))


def _elementwise(name: str, g, smooth=True) -> LensFamily:
    def make(A: Space) -> Layer:
        return Layer(A, A, R(0), lambda x, p: g(x), name=name, smooth=smooth)

    # the family is as smooth as its members (`relu.smooth` is False)
    return family(make, name, smooth=smooth, endo=True)


identity = _elementwise("id", lambda x: x)
"""1_A : A → A for every A, no parameters: the family of identity layers (`identity.at(R(3))`)."""
tanh = _elementwise("tanh", jnp.tanh)
"""x ↦ tanh(x) elementwise : A → A for every A, no parameters (a family fixed by its neighbour)."""
sigmoid = _elementwise("sigmoid", jax.nn.sigmoid)
"""x ↦ 1 / (1 + e^{−x}) elementwise : A → A for every A, no parameters."""
softplus = _elementwise("softplus", jax.nn.softplus)
"""x ↦ log(1 + e^x) elementwise : A → A for every A, no parameters."""
gelu = _elementwise("gelu", lambda x: jax.nn.gelu(x, approximate=False))
"""x ↦ x Φ(x) elementwise (Φ the standard normal CDF) : A → A for every A, no parameters."""
# relu is not smooth at 0, so it lies outside the theory's setting; JAX (and this library)
# uses the derivative 0 there, the one-sided choice that keeps a dead unit dead.
relu = _elementwise("relu", jax.nn.relu, smooth=False)
"""x ↦ max(x, 0) elementwise : A → A for every A, no parameters; not smooth at 0 (`relu.smooth`
is False), where its derivative is taken to be 0."""
softmax = _elementwise("softmax", lambda x: jax.nn.softmax(x, axis=-1))
"""x ↦ e^x / Σ e^x over the last axis : A → A for every A, no parameters."""


def activation(name: str, g, smooth: bool = True) -> LensFamily:
    """An elementwise (or shape-preserving) parameterless layer from a function g.

    Examples:
        >>> square = activation("square", lambda x: x * x)
        >>> square.at(R(2))(jnp.array([1.0, 3.0]), None).tolist()
        [1.0, 9.0]
    """
    need_callable(g, f"activation({name!r}): g")
    return _elementwise(name, g, smooth)


def _padding(padding, kernel, layer: str = "conv2d"):
    if isinstance(padding, str):
        if padding.upper() not in ("VALID", "SAME"):
            raise DimensionError(f"{layer}: padding must be 'VALID', 'SAME', an integer ≥ 0 or "
                                 f"pairs of them, got {padding!r}")
        return padding.upper()
    if isinstance(padding, (tuple, list)):
        if len(padding) != len(kernel):
            raise DimensionError(f"{layer}: padding needs one (low, high) pair per spatial axis, "
                                 f"got {padding!r}")
        pairs = [_tuple_of(layer, "padding", p, 0) for p in padding]
        return [tuple(p) for p in pairs]
    p = dimension(padding, f"{layer}: padding", 0)
    return [(p, p)] * len(kernel)


def conv2d(in_channels: int, out_channels: int, kernel, stride=1, padding="VALID") -> LensFamily:
    """2-D convolution R^{C×H×W} → R^{C'×H'×W'}, parameters (K, b) with K of shape
    (C', C, kh, kw); per example, channels first. H and W come from the input space.

    Examples:
        >>> conv = conv2d(1, 4, 3).at(R(1, 8, 8))
        >>> conv
        conv2d(1→4, 3×3) : R^{1×8×8} → R^{4×6×6}, params R^{4×1×3×3}×R^4
    """
    in_channels, out_channels = layer_sizes("conv2d", in_channels=in_channels,
                                       out_channels=out_channels)
    kernel = _tuple_of("conv2d", "kernel", kernel, 1)
    stride = _tuple_of("conv2d", "stride", stride, 1)
    pad = _padding(padding, kernel)
    fan_in = in_channels * kernel[0] * kernel[1]

    def fwd(x, Kb):
        K, b = Kb
        y = lax.conv_general_dilated(x[None], K, stride, pad,
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"))[0]
        return y + b[:, None, None]

    def make(A: Space) -> Layer:
        if len(A.shape) != 3 or A.shape[0] != in_channels:
            raise SpaceMismatch(f"conv2d({in_channels}→{out_channels}) needs inputs R^{{{in_channels}×H×W}}, got {A!r}")
        P = R(out_channels, in_channels, *kernel) * R(out_channels)
        margins = [(0, 0)] * 2 if pad == "VALID" else pad if isinstance(pad, list) else None
        if margins is not None and any(h + lo + hi < k for h, k, (lo, hi) in
                                       zip(A.shape[1:], kernel, margins)):
            raise SpaceMismatch(f"conv2d({in_channels}→{out_channels}): a {kernel[0]}×{kernel[1]} "
                                f"kernel does not fit inputs {A!r}")
        out = jax.eval_shape(fwd, jax.ShapeDtypeStruct(A.shape, jnp.float32),
                             (jax.ShapeDtypeStruct(P.factors[0].shape, jnp.float32),
                              jax.ShapeDtypeStruct((out_channels,), jnp.float32)))
        return Layer(A, R(*out.shape), P, fwd, name=f"conv2d({in_channels}→{out_channels}, {kernel[0]}×{kernel[1]})",
                     init=lambda k: (lecun_normal(k, P.factors[0].shape, fan_in), jnp.zeros((out_channels,))))

    return family(make, f"conv2d({in_channels}→{out_channels}, {kernel[0]}×{kernel[1]})")


def _pool(name, reducer, init_value, window, stride, padding, scale, smooth):
    window = _tuple_of(name, "window", window, 1)
    stride = _tuple_of(name, "stride", stride if stride is not None else window, 1)
    pad = _padding(padding, window, name)
    pad = pad if isinstance(pad, str) else [(0, 0)] + pad

    def fwd(x, p):
        # A concrete (numpy) initial value lets JAX recognise the max/add monoid and use its
        # differentiable reduce_window_max/sum; a jnp value is traced and has no derivative.
        y = lax.reduce_window(x, np.array(init_value, x.dtype), reducer, (1,) + window,
                              (1,) + stride, pad)
        return y * scale(window)

    def make(A: Space) -> Layer:
        if len(A.shape) != 3:
            raise SpaceMismatch(f"{name} needs inputs R^{{C×H×W}}, got {A!r}")
        if pad == "VALID" and any(h < w for h, w in zip(A.shape[1:], window)):
            raise SpaceMismatch(f"{name}({window[0]}×{window[1]}) does not fit inputs {A!r}")
        out = jax.eval_shape(lambda x: fwd(x, None), jax.ShapeDtypeStruct(A.shape, jnp.float32))
        return Layer(A, R(*out.shape), R(0), fwd, name=f"{name}({window[0]}×{window[1]})",
                     smooth=smooth)

    # max_pool's family is not smooth, like its members
    return family(make, f"{name}({window[0]}×{window[1]})", smooth=smooth)


def max_pool(window, stride=None, padding="VALID") -> LensFamily:
    """Max pooling over H and W of R^{C×H×W} (not smooth where two inputs tie).

    Examples:
        >>> pool = max_pool(2).at(R(1, 4, 4))
        >>> pool(jnp.arange(16.0).reshape(1, 4, 4), None).tolist()
        [[[5.0, 7.0], [13.0, 15.0]]]
    """
    return _pool("max_pool", lax.max, -jnp.inf, window, stride, padding, lambda w: 1.0, False)


def avg_pool(window, stride=None, padding="VALID") -> LensFamily:
    """Average pooling over H and W of R^{C×H×W} (linear, so smooth). Every window's sum is
    divided by the window's size, so with padding "SAME" the padded zeros count, as in flax's
    `avg_pool` (`count_include_pad=True`): an edge window of [[0, 1], [2, 3]] averages 1 and 3
    with two zeros.

    Examples:
        >>> pool = avg_pool(2).at(R(1, 4, 4))
        >>> pool(jnp.arange(16.0).reshape(1, 4, 4), None).tolist()
        [[[2.5, 4.5], [10.5, 12.5]]]
        >>> same = avg_pool(2, stride=1, padding="SAME").at(R(1, 2, 2))
        >>> same(jnp.arange(4.0).reshape(1, 2, 2), None).tolist()
        [[[1.5, 1.0], [1.25, 0.75]]]
    """
    return _pool("avg_pool", lax.add, 0.0, window, stride, padding,
                 lambda w: 1.0 / (w[0] * w[1]), True)


def _flatten_at(A: Space) -> Layer:
    return Layer(A, R(A.size), R(0), lambda x, p: jnp.reshape(x, (-1,)), name="flatten")


flatten = family(_flatten_at, "flatten")
"""x ↦ x as one flat vector : A → R^{size A} for every A, no parameters."""


def _residual(block):
    if block.dom != block.cod:
        raise SpaceMismatch(f"residual needs a block A → A, got {block.name} : {block.dom!r} → {block.cod!r}")
    A = block.dom
    return copy(A) >> (block @ identity.at(A)) >> add(A)


def residual(block):
    """x ↦ x + block(x), built as copy ≫ (block ⊗ id) ≫ add; the block must be an endomorphism
    A → A (a family gives the family of its members' residuals, every one A → A).

    Examples:
        >>> block = residual(dense(2, 2))
        >>> block
        copy ≫ (dense(2→2) ⊗ id) ≫ add : R^2 → R^2, params R^0 × R^{2×2}×R^2×R^0 × R^0
        >>> p = block.init(jax.random.PRNGKey(0))
        >>> x = jnp.array([1.0, 2.0])
        >>> np.allclose(block(x, p), x + dense(2, 2)(x, p[1][0]))
        True
    """
    need_lens(block, "residual")
    return block.lift(_residual, name=f"residual({block.name})", endo=True)


__all__ = [
    "linear", "bias", "dense", "identity", "tanh", "sigmoid", "softplus", "gelu", "relu", "softmax",
    "activation", "conv2d", "max_pool", "avg_pool", "flatten", "residual",
]
