"""Layers written by hand, directly in JAX: the second implementations the layer tests
compare the library's layers against (in float64 and in float32)."""

import jax.numpy as jnp


def conv_by_hand(x, K, b):
    """VALID, stride 1: y[o, i, j] = Σ_{c,u,v} K[o, c, u, v] x[c, i + u, j + v] + b[o]."""
    kh, kw = K.shape[2:]
    H, W_ = x.shape[1] - kh + 1, x.shape[2] - kw + 1
    y = sum(jnp.einsum("oc,cij->oij", K[:, :, u, v], x[:, u:u + H, v:v + W_])
            for u in range(kh) for v in range(kw))
    return y + b[:, None, None]


def pool_by_hand(x, reduce):
    """2×2 windows, stride 2, of C × H × W, reduced by `reduce` (jnp.max, jnp.mean)."""
    C, H, W_ = x.shape
    return reduce(x.reshape(C, H // 2, 2, W_ // 2, 2), axis=(2, 4))


def elman(x, h, p):
    W, U, b = p
    return jnp.tanh(W @ x + U @ h + b)


def gru(x, h, p):
    """PyTorch's GRU equations, gate by gate (W, U stack the r, z, n rows)."""
    W, U, b, c = p
    m = h.shape[0]
    Wr, Wz, Wn = W[:m], W[m:2 * m], W[2 * m:]
    Ur, Uz, Un = U[:m], U[m:2 * m], U[2 * m:]
    r = 1.0 / (1.0 + jnp.exp(-(Wr @ x + b[:m] + Ur @ h + c[:m])))
    z = 1.0 / (1.0 + jnp.exp(-(Wz @ x + b[m:2 * m] + Uz @ h + c[m:2 * m])))
    n = jnp.tanh(Wn @ x + b[2 * m:] + r * (Un @ h + c[2 * m:]))
    return (1.0 - z) * n + z * h
