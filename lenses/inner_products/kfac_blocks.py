"""K-FAC's blocks: how an affine layer's slot is read as one matrix Θ = [W b] acting on
ā = (a, 1), the order of vec(Θ) against `ravel`, and the eigen-decompositions of the factors.
"""

from __future__ import annotations

import jax.numpy as jnp

from ..sites import Affine


def site_kind(site):
    """How KFAC reads a parameterised slot, from what its lens declares: 'dense' (Affine with a
    bias: x ↦ W x + b), 'linear' (Affine without: x ↦ W x) or None (nothing declared)."""
    if isinstance(site.structure, Affine):
        return "dense" if site.structure.bias else "linear"
    return None


def to_theta(site, t):
    """A dense slot's (W, b) as the matrix Θ = [W b] acting on ā = (a, 1); a linear slot's W
    (a slot holding Wᵀ, `Affine(transposed=True)`, is transposed back)."""
    W = t[0] if site_kind(site) == "dense" else t
    W = W.T if site.structure.transposed else W
    return jnp.concatenate([W, t[1][:, None]], axis=1) if site_kind(site) == "dense" else W


def from_theta(site, theta):
    """The slot's value ((W, b), or W) from the matrix Θ: the inverse of `to_theta`."""
    dense = site_kind(site) == "dense"
    W = theta[:, :-1] if dense else theta
    W = W.T if site.structure.transposed else W
    return (W, theta[:, -1]) if dense else W


def theta_to_ravel(site, m, n_in):
    """Indices taking the row-major vec of Θ to `ravel` order of the slot (W, or Wᵀ when
    transposed, row-major, then b); None when the two orders agree."""
    dense, transposed = site_kind(site) == "dense", site.structure.transposed
    if not (dense or transposed):
        return None
    cols = n_in + 1 if dense else n_in
    rows = jnp.arange(m)[:, None] * cols
    W = rows + jnp.arange(n_in)[None, :]  # W[i, j]'s place in vec(Θ)
    W = jnp.ravel(W.T if transposed else W)
    return jnp.concatenate([W, rows[:, 0] + n_in]) if dense else W


def eigen(factors):
    """Per site (α, U_A, γ, U_G), the eigen-decompositions of (A, G), or None."""
    out = []
    for f in factors:
        if f is None:
            out.append(None)
            continue
        a, UA = jnp.linalg.eigh(f[0])
        g, UG = jnp.linalg.eigh(f[1])
        out.append((a, UA, g, UG))
    return tuple(out)


__all__ = ["site_kind", "to_theta", "from_theta", "theta_to_ravel", "eigen"]
