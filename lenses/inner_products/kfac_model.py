"""K-FAC's quadratic model of a step on its own batch, M(δ) = ½ δᵀ (C + λ I) δ + ∇hᵀ δ: the
rescaled step δ = αΔ + μδ₀ and the Levenberg–Marquardt rule for λ (`KFAC`'s docstring,
`rescale` and `adapt_damping`), C the exact curvature matching K-FAC's `curvature`; and the
one check of K-FAC's numbers (`kfac_numbers`), λ and the rule's bounds among them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..losses import loss_family
from ..batched import batched
from .metrics import ravel
from categories.errors import HyperparameterError
from categories.numbers import real_number

from .natural import Fisher, GaussNewton, check_damping, data_scale

tree_map = jax.tree_util.tree_map


def kfac_numbers(damping, decay, omega, low, high, adapt: bool, traced: bool = False) -> tuple:
    """KFAC's numbers (damping, decay, omega, min_damping, max_damping) as floats, if
    λ ≥ 0 (> 0 where `adapt_damping` multiplies it), ε ∈ [0, 1), ω ∈ (0, 1] and
    0 ≤ min ≤ max, else `HyperparameterError` naming the number; `traced`: a traced one
    passes (and what it bounds is not compared)."""
    numbers = (check_damping(damping, "KFAC", traced),
               real_number(decay, "KFAC: decay", least=0, below=1, traced=traced),
               real_number(omega, "KFAC: omega", above=0, traced=traced, hint=" and ≤ 1"),
               real_number(low, "KFAC: min_damping", least=0, traced=traced),
               real_number(high, "KFAC: max_damping", least=0, traced=traced))
    damping, _, omega, low, high = (x if isinstance(x, float) else None for x in numbers)
    if omega is not None and omega > 1:
        raise HyperparameterError(f"KFAC: omega must be in (0, 1], got {omega!r}")
    if low is not None and high is not None and low > high:
        raise HyperparameterError(f"KFAC: need 0 ≤ min_damping ≤ max_damping, got {low!r}, "
                                  f"{high!r}")
    if adapt and damping == 0:
        raise HyperparameterError("KFAC: adapt_damping multiplies λ, which must start > 0")
    return numbers


def curvature_metric(kfac, ctx):
    """The exact curvature C of the quadratic model (undamped), matching `curvature`."""
    if kfac.curvature == "gauss-newton":
        return GaussNewton(0.0)
    if kfac.curvature == "empirical":
        return Fisher(0.0, empirical=True)
    if kfac.output_fisher is None and not loss_family(ctx.loss).has_output_fisher:
        return GaussNewton(0.0)  # "sampled" for a family with a sampler only
    return Fisher(0.0, output_fisher=kfac.output_fisher)


def damped_product(kfac, p, lam, ctx):
    """v ↦ (C + λ I) v, flattened, C the exact curvature of the batch (matrix-free)."""
    Cv = curvature_metric(kfac, ctx).gram_matvec(p, ctx)
    return lambda v: ravel(Cv(v)) + lam * ravel(v)


def rescaled(kfac, p, g, direction, d0, lam, ctx):
    """(δ, M(δ)): δ = αΔ + μδ₀ with (α, μ) minimising the quadratic model M of the batch
    (`KFAC`'s docstring, `rescale`), and the model's value there."""
    Cv = damped_product(kfac, p, lam, ctx)
    D, d, grad = ravel(direction), ravel(d0), ravel(g)
    CD, Cd = Cv(direction), Cv(d0)
    a11, a12, a22 = D @ CD, D @ Cd, d @ Cd
    b1, b2 = grad @ D, grad @ d
    det = a11 * a22 - a12 * a12
    # δ₀ = 0 or δ₀ ∥ Δ makes the system singular (to rounding): then α alone.
    both = det > 1e3 * jnp.finfo(D.dtype).eps * a11 * a22
    safe = jnp.where(both, det, 1.0)
    alpha2, mu2 = (a12 * b2 - a22 * b1) / safe, (a12 * b1 - a11 * b2) / safe
    alpha1 = jnp.where(a11 > 0, -b1 / jnp.where(a11 > 0, a11, 1.0), 0.0)
    alpha, mu = jnp.where(both, alpha2, alpha1), jnp.where(both, mu2, 0.0)
    step = tree_map(lambda u, v: alpha * u + mu * v, direction, d0)
    change = (0.5 * (alpha * alpha * a11 + 2 * alpha * mu * a12 + mu * mu * a22)
              + alpha * b1 + mu * b2)
    return step, change


def adapted(kfac, p, g, step, change, lam, ctx):
    """(λ after the Levenberg–Marquardt rule for the step δ = `step` from p, ρ), on the
    batch of `ctx` (`KFAC`'s docstring). `change` is M(δ), or None to compute it."""
    _, s = data_scale(ctx, "KFAC")
    value, model = loss_family(ctx.loss).value, batched(ctx.model)

    def h(q):
        return s * jnp.sum(jax.vmap(value)(model.forward(ctx.x, q), ctx.y))

    d = ravel(step)
    if change is None:
        change = ravel(g) @ d + 0.5 * d @ damped_product(kfac, p, lam, ctx)(step)
    actual = h(tree_map(jnp.add, p, step)) - h(p)
    rho = jnp.where(change < 0, actual / jnp.where(change < 0, change, 1.0), -jnp.inf)
    rho = jnp.where(jnp.isnan(rho), -jnp.inf, rho)  # a loss that overflowed: raise λ
    new = jnp.where(rho > 0.75, lam * kfac.omega, jnp.where(rho < 0.25, lam / kfac.omega, lam))
    new = jnp.where(jnp.all(d == 0), lam, new)
    return jnp.clip(new, kfac.min_damping, kfac.max_damping).astype(lam.dtype), rho


__all__ = ["kfac_numbers", "curvature_metric", "damped_product", "rescaled", "adapted"]
