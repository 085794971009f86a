"""Inner products that vary with the parameter point and the data (natural-gradient metrics).

Each reads its data from `ctx = Context(model, loss, x, y, reduction)`: `model` a per-example
ParaLens, `loss` a loss family (a `LossFamily`, target ↦ Smooth C → R), `x`, `y` a batch.
With n examples the scale is s = 1/n (`reduction="mean"`) or s = 1 (`"sum"`), matching the
batch loss.

- `GaussNewton`: G = s Σ_i J_iᵀ H_i J_i + λ I, J_i = ∂model(x_i, p)/∂p, H_i = ∂²L_{y_i}/∂z²,
  the Hessian of the family's `value` by JAX: any loss family serves.
- `Fisher`: the Fisher information of the predictive distribution p(y | x, θ) the loss defines
  (Gaussian with unit variance for `half_squared_error`, categorical softmax(z) for
  `softmax_cross_entropy`, Bernoulli σ(z) for `binary_cross_entropy`, or whatever a user's
  family declares): F = s Σ_i J_iᵀ F_out(z_i) J_i + λ I, with F_out the family's
  `output_fisher` (a closed form: an exact expectation, no sampling) or the `output_fisher=`
  given to the metric. `empirical=True`: s Σ_i g_i g_iᵀ + λ I from the per-example
  parameter covectors g_i.
- `KFAC` (`lenses.inner_products.kfac`, built on this module, which does not import it):
  block diagonal over the layers that declare an affine structure (`Affine`: dense, linear),
  each block (G_l ⊗ A_l) + λ I; found by the model's `sites()`, wherever they sit; with
  the moving averages, update periods and adaptive damping of Martens & Grosse (2015).

Sharp maps solve G x = p' and never invert G: by Cholesky on the dense matrix for parameter
objects of dimension ≤ `dense_max` (`solver="auto"`), else by conjugate gradients with the
matrix-free product v ↦ Jᵀ(H(J v)) (one `jax.linearize`, its transpose, and an output-space
Hessian-vector product). Flat maps apply G matrix-free. Damping λ keeps G positive definite
when the data do not: with λ = 0, G must have full rank (more outputs × examples than
parameters) or the solve returns NaN (and, outside `jit`, raises). The softmax Fisher is never
of full rank when the last layer has a bias: adding one number to every logit leaves the
categorical distribution unchanged.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from categories import Covector, Vector
from categories.linear import unwrap
from categories.numbers import integer, real_number

from categories.errors import HyperparameterError, KindError, MetricError

from ..losses import dL, loss_family
from ..batched import batched
from ..values import assign, static
from .metrics import Context, Metric, covector_value, ravel, unflatten_like

tree_map = jax.tree_util.tree_map


# -- the data: scale and output-space curvature --------------------------------------------------

def data_scale(ctx, who):
    """(n, s): the batch's number of examples and the scale of the sum (1/n for "mean")."""
    if ctx is None or ctx.model is None or ctx.loss is None or ctx.x is None or ctx.y is None:
        raise KindError(f"{who} depends on the model and the data: pass "
                        "ctx=Context(model, loss_family, x, y, reduction)")
    if ctx.reduction not in ("mean", "sum"):
        raise HyperparameterError(f"reduction must be 'mean' or 'sum', got {ctx.reduction!r}")
    n = jax.tree_util.tree_leaves(ctx.x)[0].shape[0]
    return n, (1.0 / n if ctx.reduction == "mean" else 1.0)


def output_fisher(family):
    """(z, v) ↦ F(z) v, the Fisher information in the output z of the distribution p(y | z)
    that the loss family is the negative log-likelihood of (the family's `output_fisher`).

    Examples:
        >>> F = output_fisher(softmax_cross_entropy)
        >>> print(np.round(F(jnp.zeros(2), jnp.array([1.0, 0.0])), 4))
        [ 0.25 -0.25]
    """
    fam = loss_family(family)
    if not fam.has_output_fisher:
        raise KindError(f"no predictive distribution is known for the loss family {fam!r}: "
                        "Fisher needs its output-space Fisher F(z) v. Give the family an "
                        "output_fisher(z, v) method (subclass LossFamily), or pass "
                        "output_fisher=(z, v) ↦ F(z) v to the metric; GaussNewton needs only "
                        "the loss's value")
    return fam.output_fisher


def loss_hvp(family):
    """(z, y, v) ↦ H v, the Hessian of the loss L_y in the output z applied to v."""
    value = loss_family(family).value

    def hvp(z, y, v):
        return jax.jvp(jax.grad(lambda c: value(c, y)), (z,), (v,))[1]
    return hvp


def output_matrix(hvp, z, y):
    """The output-space curvature as an (m, m) matrix on the flattened output (m = z.size)."""
    m = jnp.size(z)
    cols = jax.vmap(lambda e: ravel(hvp(z, y, unflatten_like(e, z))))(jnp.eye(m, dtype=z.dtype))
    return cols.T


def _finite(tree):
    """Whether every entry is finite; None for traced values."""
    leaves = jax.tree_util.tree_leaves(tree)
    if any(isinstance(a, jax.core.Tracer) for a in leaves):
        return None
    return all(bool(jnp.all(jnp.isfinite(a))) for a in leaves)


def space_of(cov, ctx):
    """The parameter object a (co)vector lives on: its own, else the model's."""
    return getattr(cov, "space", None) or (ctx.model.param if ctx is not None else None)


def _hashable(family):
    """The family as a cache key: itself when hashable (by value), else its identity (the
    cached function holds the family, so the identity is not reused while it is cached)."""
    try:
        hash(family)
    except TypeError:
        return ("id", id(family))
    return family


def check_damping(x, who: str, traced: bool = False):
    """The damping λ of a data-dependent metric (`who`), a finite number ≥ 0 (`real_number`):
    as its constructor stores it, or, `traced`, as `check_numbers` asks it (a traced λ
    passes)."""
    return real_number(x, f"{who}: damping", least=0, traced=traced)


class DataMetric(Metric):
    """A metric read off the model and the batch, damped by λ = `damping` (a leaf). `sharp`,
    `flat` and `matrix` run through one compiled function per (method, model, loss family,
    reduction), with the metric itself, the parameter point, the (co)vector and the batch as
    traced arguments: called eagerly they cost one compilation (shared by metrics of other
    numbers), not the op-by-op evaluation of per-example Jacobians; inside a `jit` they inline.
    """

    _MAX_COMPILED = 16
    damping: Any

    def check_numbers(self):
        check_damping(self.damping, type(self).__name__, traced=True)
        return self

    def _run(self, method, p, t, ctx):
        data_scale(ctx, type(self).__name__)
        loss = loss_family(ctx.loss)
        loss.check_targets(ctx.y, None if ctx.model is None else ctx.model.cod)
        cache = self.__dict__.setdefault("_compiled", {})  # a cache, not a field of the value
        # Keyed by the family's value (type and configuration): equal families, however often
        # made afresh, share one compiled function.
        key = (method, ctx.model, _hashable(loss), ctx.reduction)
        if key not in cache:
            model, reduction = ctx.model, ctx.reduction
            if len(cache) >= self._MAX_COMPILED:
                cache.pop(next(iter(cache)))
            cache[key] = jax.jit(lambda metric, p, t, x, y: getattr(metric, method)(
                p, t, Context(model, loss, x, y, reduction)))
        return cache[key](self, p, t, ctx.x, ctx.y)

    def sharp(self, p, cov, ctx=None):
        g = covector_value(cov, f"{self!r}.sharp")
        x = self._run("_sharp", p, g, ctx)
        if _finite(g) is True and _finite(x) is False:  # concrete values only, not under jit
            raise MetricError(f"{self!r} is not positive definite here (the solve failed): "
                             "add damping, or use more examples than parameters")
        return Vector(x, space_of(cov, ctx))

    def flat(self, p, vec, ctx=None):
        return Covector(self._run("_flat", p, unwrap(vec), ctx), space_of(vec, ctx))

    def matrix(self, p, ctx):
        """The metric's matrix in the coordinates of `ravel(p)`."""
        return self._run("_matrix", p, None, ctx)


# -- Gauss–Newton and Fisher ---------------------------------------------------------------------

class GaussNewton(DataMetric):
    """g_p(u, v) = uᵀ (s Σ_i J_iᵀ H_i J_i + λ I) v: the Gauss–Newton matrix of the loss.

    Examples:
        >>> model = linear(2, 1)
        >>> W = jnp.array([[1.0, 1.0]])
        >>> X, Y = jnp.array([[1.0, 0.0], [0.0, 2.0]]), jnp.zeros((2, 1))
        >>> ctx = Context(model, half_squared_error, X, Y, reduction="sum")
        >>> v = GaussNewton(damping=0.0).sharp(W, Covector(jnp.array([[1.0, 4.0]]), model.param), ctx)
        >>> print(np.round(unwrap(v), 4))
        [[1. 1.]]
    """

    solver: str = static()
    cg_iters: int = static()
    cg_tol: float = static()
    dense_max: int = static()

    def __init__(self, damping: float = 1e-3, solver: str = "auto", cg_iters: int = 500,
                 cg_tol: float = 1e-10, dense_max: int = 2000):
        name = type(self).__name__
        damping = check_damping(damping, name)
        cg_tol = real_number(cg_tol, f"{name}: cg_tol (the conjugate gradients' tolerance)",
                             least=0)
        if solver not in ("auto", "dense", "cg"):
            raise HyperparameterError(f"{name}: solver must be 'auto', 'dense' or 'cg', got {solver!r}")
        # no CG iteration leaves the covector unsolved: the step would be 0, silently
        cg_iters = integer(cg_iters, f"{name}: cg_iters", 1)
        dense_max = integer(dense_max, f"{name}: dense_max (the largest dimension solved "
                            "densely)", 0)
        assign(self, damping=damping, solver=solver, cg_iters=cg_iters, cg_tol=cg_tol,
               dense_max=dense_max)

    # The curvature of the loss in the output: (z, y, v) ↦ H_y(z) v.
    def _curvature(self, ctx):
        return loss_hvp(ctx.loss)

    def gram_matvec(self, p, ctx):
        """v ↦ s Σ_i J_iᵀ H_i J_i v (undamped), matrix-free (`KFAC`'s quadratic model uses it)."""
        _, s = data_scale(ctx, type(self).__name__)
        hvp = jax.vmap(self._curvature(ctx))
        model, X, Y = batched(ctx.model), ctx.x, ctx.y
        Z, jvp = jax.linearize(lambda q: model.forward(X, q), p)  # forward once, reused by CG
        vjp = jax.linear_transpose(jvp, p)

        def mv(v):
            (out,) = vjp(hvp(Z, Y, jvp(v)))
            return tree_map(lambda a: s * a, out)

        return mv

    def _gram(self, p, ctx):
        """s Σ_i J_iᵀ H_i J_i as a (d, d) matrix in `ravel(p)` coordinates (undamped)."""
        _, s = data_scale(ctx, type(self).__name__)
        curv = self._curvature(ctx)
        model, theta = ctx.model, ravel(p)
        out = lambda th, x: ravel(model.forward(x, unflatten_like(th, p)))  # noqa: E731
        J = jax.vmap(jax.jacrev(out), (None, 0))(theta, ctx.x)  # (n, m, d)
        Z = jax.vmap(lambda x: model.forward(x, p))(ctx.x)
        H = jax.vmap(lambda z, y: output_matrix(curv, z, y))(Z, ctx.y)  # (n, m, m)
        return s * jnp.einsum("imd,imk,ike->de", J, H, J)

    def _matrix(self, p, _, ctx):
        G = self._gram(p, ctx)
        return G + self.damping * jnp.eye(G.shape[0], dtype=G.dtype)

    def _dense(self, p) -> bool:
        return self.solver == "dense" or (self.solver == "auto" and ravel(p).size <= self.dense_max)

    def _sharp(self, p, g, ctx):
        if self._dense(p):
            L = jnp.linalg.cholesky(self._matrix(p, None, ctx))
            x = jax.scipy.linalg.cho_solve((L, True), ravel(g))
        else:
            mv, lam = self.gram_matvec(p, ctx), self.damping
            A = lambda u: ravel(mv(unflatten_like(u, g))) + lam * u  # noqa: E731
            x, _ = jax.scipy.sparse.linalg.cg(A, ravel(g), tol=self.cg_tol, maxiter=self.cg_iters)
        return unflatten_like(x, g)

    def _flat(self, p, v, ctx):
        return tree_map(lambda a, b: a + self.damping * b, self.gram_matvec(p, ctx)(v), v)

    def __repr__(self):
        return f"{type(self).__name__}(damping={self.damping}, solver={self.solver!r})"


class Fisher(GaussNewton):
    """g_p(u, v) = uᵀ (s Σ_i E_{y~p(·|x_i,p)}[∇log p ∇log pᵀ] + λ I) v: the Fisher information
    of the model's predictive distribution (`empirical=True`: s Σ_i g_i g_iᵀ + λ I).

    Examples:
        >>> model = linear(2, 1)
        >>> W = jnp.array([[1.0, 1.0]])
        >>> X, Y = jnp.array([[1.0, 0.0], [0.0, 2.0]]), jnp.zeros((2, 1))
        >>> ctx = Context(model, half_squared_error, X, Y, reduction="sum")
        >>> v = Fisher(damping=0.0).sharp(W, Covector(jnp.array([[1.0, 4.0]]), model.param), ctx)
        >>> print(np.round(unwrap(v), 4))
        [[1. 1.]]
    """

    empirical: bool = static()
    output_fisher: Any = static()  # (z, v) ↦ F(z) v, or None for the loss family's own

    def __init__(self, damping: float = 1e-3, empirical: bool = False, output_fisher=None, *,
                 solver: str = "auto", cg_iters: int = 500, cg_tol: float = 1e-10,
                 dense_max: int = 2000):
        # GaussNewton's keywords spelt out, so that a misspelt one names Fisher
        super().__init__(damping, solver, cg_iters, cg_tol, dense_max)
        assign(self, empirical=empirical, output_fisher=output_fisher)

    # E_y[∇_z log p ∇_z log pᵀ] = F_out(z) for the families' exponential-family distributions,
    # so the exact Fisher is the Gauss–Newton form with F_out in place of the loss Hessian.
    def _curvature(self, ctx):
        F = self.output_fisher or output_fisher(ctx.loss)
        return lambda z, y, v: F(z, v)

    def _covectors(self, p, ctx):
        """The per-example parameter covectors g_i, stacked as an (n, d) matrix."""
        model, loss = ctx.model, loss_family(ctx.loss)

        def one(x, y):
            z, pull = model.vjp(x, p)
            return ravel(unwrap(pull(dL(loss.at(y), z))[1]))

        return jax.vmap(one)(ctx.x, ctx.y)

    def gram_matvec(self, p, ctx):
        if not self.empirical:
            return super().gram_matvec(p, ctx)
        _, s = data_scale(ctx, "Fisher")
        Gs = self._covectors(p, ctx)
        return lambda v: unflatten_like(s * (Gs.T @ (Gs @ ravel(v))), v)

    def _gram(self, p, ctx):
        if not self.empirical:
            return super()._gram(p, ctx)
        _, s = data_scale(ctx, "Fisher")
        Gs = self._covectors(p, ctx)
        return s * (Gs.T @ Gs)

    def __repr__(self):
        return f"Fisher(damping={self.damping}, empirical={self.empirical}, solver={self.solver!r})"


__all__ = ["DataMetric", "GaussNewton", "Fisher", "output_fisher", "data_scale", "loss_hvp",
           "output_matrix", "space_of"]
