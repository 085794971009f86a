"""K-FAC (Martens & Grosse 2015): the Kronecker-factored Fisher as a metric, with its state.

The formulas of the metric and of each option are in the docstring of `KFAC`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from categories import Vector
from categories.errors import HyperparameterError, KindError

from ..losses import loss_family
from .metrics import covector_value, ravel
from .natural import (Fisher, GaussNewton, _DataMetric, _data, _loss_hvp, _out_matrix, _space,
                      output_fisher)
from ..batched import batched
from ..sites import Affine, at_path

tree_map = jax.tree_util.tree_map

CURVATURES = ("fisher", "gauss-newton", "empirical", "sampled")


class KFACState(NamedTuple):
    """K-FAC's memory: `count` steps taken, `updates` factor estimates made, per site the
    running `factors` (A, G) and their eigen-decompositions `eig` (α, U_A, γ, U_G) (None for
    a site without affine structure), the `damping` λ, a random `key` for sampled labels, and
    the `last` point (with `rescale`, whose previous move δ₀ = θ − last it is; None otherwise).

    Examples:
        The state of `sharp(KFAC(...))`, the first part of `gd`, before any step: one (A, G)
        per affine layer, A on the input with a 1 appended for the bias (none here).

        >>> s = gd(0.1, metric=KFAC(0.1, decay=0.95, model=linear(2, 1))).init(jnp.ones((1, 2)))
        >>> int(s.count), round(float(s.damping), 4), [f.shape for f in s.factors[0]]
        (0, 0.1, [(2, 2), (1, 1)])
    """

    count: Any
    updates: Any
    factors: Any
    eig: Any
    damping: Any
    key: Any
    last: Any


def _kind(site):
    """How KFAC reads a parameterised slot, from what its lens declares: 'dense' (Affine with a
    bias: x ↦ W x + b), 'linear' (Affine without: x ↦ W x) or None (nothing declared)."""
    if isinstance(site.structure, Affine):
        return "dense" if site.structure.bias else "linear"
    return None


def _to_theta(site, t):
    """A dense slot's (W, b) as the matrix Θ = [W b] acting on ā = (a, 1); a linear slot's W
    (a slot holding Wᵀ, `Affine(transposed=True)`, is transposed back)."""
    W = t[0] if _kind(site) == "dense" else t
    W = W.T if site.structure.transposed else W
    return jnp.concatenate([W, t[1][:, None]], axis=1) if _kind(site) == "dense" else W


def _from_theta(site, theta):
    dense = _kind(site) == "dense"
    W = theta[:, :-1] if dense else theta
    W = W.T if site.structure.transposed else W
    return (W, theta[:, -1]) if dense else W


def _theta_to_ravel(site, m, n_in):
    """Indices taking the row-major vec of Θ to `ravel` order of the slot (W, or Wᵀ when
    transposed, row-major, then b); None when the two orders agree."""
    dense, transposed = _kind(site) == "dense", site.structure.transposed
    if not (dense or transposed):
        return None
    cols = n_in + 1 if dense else n_in
    rows = jnp.arange(m)[:, None] * cols
    W = rows + jnp.arange(n_in)[None, :]  # W[i, j]'s place in vec(Θ)
    W = jnp.ravel(W.T if transposed else W)
    return jnp.concatenate([W, rows[:, 0] + n_in]) if dense else W


def _eig(factors):
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


def _number(x, name):
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise HyperparameterError(f"KFAC: {name} must be a finite number, got {x!r}")
    return float(x)


def _period(x, name):
    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
        raise HyperparameterError(f"KFAC: {name} must be an integer ≥ 1, got {x!r}")
    return x


class KFAC(_DataMetric):
    """The Kronecker-factored Fisher of Martens & Grosse (2015), with their moving averages,
    update periods and adaptive damping.

    g_p = ⊕_l (G_l ⊗ A_l + λ I) over the layers l that declare an affine structure (`Affine`:
    dense, linear), found by the model's `sites()` wherever they sit. With n examples and the
    scale s = 1/n (`reduction="mean"`) or 1 (`"sum"`):

        A_l = (1/n) Σ_i ā_i ā_iᵀ            ā_i the layer's input, with a 1 appended for a bias
        G_l = s Σ_i B_iᵀ F_i B_i            B_i = ∂(network output)/∂(layer output s_l = W a + b)

    and F_i, the output-space curvature, is chosen by `curvature`:

    - "fisher" (default): F_i = F_out(z_i) = E_{y~p(·|z_i)}[∇_z log p ∇_z log pᵀ], the family's
      `output_fisher` in closed form (the true Fisher, exact in expectation, nothing sampled);
    - "gauss-newton": F_i = ∂²L_{y_i}/∂z² (the loss Hessian in the output; JAX's Hessian);
    - "empirical": F_i = d_i d_iᵀ, d_i = ∇_z L_{y_i}(z_i) at the data's own labels (the
      empirical Fisher, which is not the Fisher: Kunstner et al. 2019);
    - "sampled": `F_i = (1/S) Σ_{k≤S} d̂_ik d̂_ikᵀ`, `d̂_ik = ∇_z L_{ŷ_ik}(z_i)`, `ŷ_ik ~ p(·|z_i)`
      drawn by the family's `sample` (`samples` = S): the true Fisher by Monte Carlo, as the
      paper computes it; E[d̂ d̂ᵀ] = F_out(z_i), so these factors are unbiased for "fisher"'s.
      The draws advance with the state's key at every factor update.

    The options of the paper (its section 5 and 6), each off by default:

    - `decay` ε: moving averages of the factors, Â_k = ε_k Â_{k−1} + (1 − ε_k) A_k (and Ĝ
      alike), ε_k = min(1 − 1/k, ε), k the number of factor updates made (so Â_1 = A_1: no bias
      towards the zero start); the paper's ε = 0.95. ε = 0: the batch's own factors.
    - `factor_period` T_f: the factors are re-estimated at the steps t (counted from 0) with
      t mod T_f = 0 and kept in between.
    - `inverse_period` T_i: the eigen-decompositions A = U_A diag(α) U_Aᵀ, G = U_G diag(γ) U_Gᵀ
      are recomputed at the steps with t mod T_i = 0 and kept in between (the damping enters at
      the solve, so a new λ needs no new decomposition).
    - `tikhonov`: how λ enters a block. "exact" (default): G ⊗ A + λ I, solved exactly (its
      eigenvalues are γ_i α_j + λ). "factored": the factored Tikhonov damping of section 6.3,
      (A + π√λ I) ⊗ (G + (1/π)√λ I) with π = √[(tr A / dim A) / (tr G / dim G)] (π = 1 where
      a trace vanishes), whose eigenvalues are (γ_i + √λ/π)(α_j + π√λ).
    - `rescale`: the step of sections 6.4 and 7. With Δ = −K⁻¹∇h the K-FAC direction and δ₀
      the previous move (θ − the point of the previous step; 0 at the first), the step is
      δ = αΔ + μδ₀ with (α, μ) minimising the quadratic model of the step's batch
          M(δ) = ½ δᵀ (C + λ I) δ + ∇hᵀ δ,
      C the exact curvature matching `curvature` (the Fisher, the Gauss–Newton matrix or the
      empirical Fisher; "sampled" uses the Fisher), applied matrix-free by one linearisation
      of the network: the 2×2 system
          `((ΔᵀCΔ+λΔᵀΔ, ΔᵀCδ₀+λΔᵀδ₀), (δ₀ᵀCΔ+λδ₀ᵀΔ, δ₀ᵀCδ₀+λδ₀ᵀδ₀)) (α, μ)ᵀ = −(∇hᵀΔ, ∇hᵀδ₀)ᵀ`,
      or α = −∇hᵀΔ / (Δᵀ(C + λI)Δ), μ = 0 when the matrix is singular (δ₀ = 0, or δ₀ ∥ Δ).
      The sharp part returns −δ, so `gd(1.0, ...)` takes the paper's step δ (another learning
      rate scales it). ∇h is the covector being sharpened (the batch gradient, as the
      optimiser passes it). The library's losses carry no ℓ2 term: the paper's η is 0.
    - `adapt_damping`: the Levenberg–Marquardt rule of section 6.5, on the step's own batch:
      at the steps t with (t + 1) mod T_λ = 0 (T_λ = `damping_period`), with δ the step this
      call proposes (−the vector it returns: the move of `gd(1.0, ...)`) and h the batch loss,
          ρ = [h(θ + δ) − h(θ)] / M(δ),     M the quadratic model above (λ included);
      then, for the next steps,
          λ ← ω λ if ρ > 3/4,   λ ← λ / ω if ρ < 1/4,   ω = `omega` (the paper's (19/20)^T_λ),
      clipped to [`min_damping`, `max_damping`]. A step the model predicts to go uphill, or
      whose loss is not finite, counts as ρ < 1/4; a zero step leaves λ as it is. Under
      another learning rate than 1 the step taken is lr·δ, and ρ still judges δ.
    - γ (section 6.6) is folded into λ: the paper keeps a second damping γ for the factors
      (√(λ + η) before its own adaptation) and re-tunes it by a three-point search every T₂
      steps, three extra evaluations of M; here the one λ enters both the factors (√λ in
      "factored") and the model M, as kfac-jax's one `damping` does, and the
      Levenberg–Marquardt rule adapts it.

    State. The options need memory between steps: the running factors, their decompositions,
    λ, a random key and the last point. The metric keeps them in the state of its optimiser's
    first part, `sharp(KFAC(...))` (`init_state`, `sharp_state`); the state's shapes are the
    model's, so a KFAC with any option is given the model: `KFAC(decay=0.95, model=net)` (a
    model alone, with no option, keeps the state too: the batch's factors at every step).
    Without a model KFAC holds nothing and recomputes the batch's factors at every call, as the
    stateless maps `sharp`, `flat`, `matrix` and `factors` always do (sampled labels drawn from
    `seed` there).

    Arguments: `damping` λ (the initial one with `adapt_damping`; 0.1 by default: with 1e-3 or
    1e-2, `gd(0.1, metric=KFAC(λ))` on a small 3-class problem, the README's, stops on a
    non-finite step within 100 steps on some of 10 seeds, as the softmax Fisher shrinks where
    the predictions saturate and the step grows as 1/λ; `tests/test_kfac.py`); `curvature` "fisher",
    "gauss-newton", "empirical" or "sampled" (`samples` labels per example, from the family's
    `sample` or `sampler(key, z)`); `decay` ε ∈ [0, 1); `factor_period`, `inverse_period`,
    `damping_period` ≥ 1; `omega` ∈ (0, 1]; `min_damping`, `max_damping`; `tikhonov`
    "exact" or "factored"; `rescale`; `seed` the first key; `model` the model whose factors
    the state holds (needed by every option but `tikhonov`). `rescale` and `adapt_damping`
    act in the optimiser's step (`sharp_state`); `sharp`, `flat` and `matrix` are the damped
    K-FAC matrix itself, a metric.
    Parameterised slots whose lens declares no affine structure raise, or with
    `fallback="euclidean"` get the identity block. For example,
    `gd(0.3, metric=KFAC(0.1, decay=0.95, inverse_period=5, model=net))`.

    Examples:
        A linear model, so K-FAC is exact: A = ½ diag(1, 4) over the two inputs, G = 2 (the sum
        of two examples' squared-error curvature 1), G ⊗ A = diag(1, 4), and c = (1, 4) sharpens
        to (1, 1), as `Fisher` and `GaussNewton` give.

        >>> model = linear(2, 1)
        >>> W = jnp.array([[1.0, 1.0]])
        >>> X, Y = jnp.array([[1.0, 0.0], [0.0, 2.0]]), jnp.zeros((2, 1))
        >>> ctx = Context(model, half_squared_error, X, Y, reduction="sum")
        >>> c = Covector(jnp.array([[1.0, 4.0]]), model.param)
        >>> print(np.round(unwrap(KFAC(damping=0.0).sharp(W, c, ctx)), 4))
        [[1. 1.]]
    """

    def __init__(self, damping: float = 0.1, curvature: str = "fisher", fallback: str = "raise",
                 output_fisher=None, *, decay: float = 0.0, factor_period: int = 1,
                 inverse_period: int = 1, adapt_damping: bool = False, damping_period: int = 5,
                 omega: float | None = None, min_damping: float = 1e-8,
                 max_damping: float = 1e8, samples: int = 1, sampler=None, seed: int = 0,
                 model=None, tikhonov: str = "exact", rescale: bool = False):
        damping = _number(damping, "damping")
        if damping < 0:
            raise HyperparameterError(f"KFAC: damping must be ≥ 0, got {damping}")
        if curvature not in CURVATURES:
            raise HyperparameterError(f"KFAC: curvature must be one of {CURVATURES}, "
                                      f"got {curvature!r}")
        if fallback not in ("raise", "euclidean"):
            raise HyperparameterError(f"KFAC: fallback must be 'raise' or 'euclidean', "
                                      f"got {fallback!r}")
        if tikhonov not in ("exact", "factored"):
            raise HyperparameterError(f"KFAC: tikhonov must be 'exact' or 'factored', "
                                      f"got {tikhonov!r}")
        self.tikhonov, self.rescale = tikhonov, bool(rescale)
        decay = _number(decay, "decay")
        if not 0 <= decay < 1:
            raise HyperparameterError(f"KFAC: decay must be in [0, 1), got {decay!r}")
        self.damping, self.curvature, self.fallback = damping, curvature, fallback
        self.output_fisher, self.decay = output_fisher, decay
        self.factor_period = _period(factor_period, "factor_period")
        self.inverse_period = _period(inverse_period, "inverse_period")
        self.damping_period = _period(damping_period, "damping_period")
        self.samples = _period(samples, "samples")
        self.adapt_damping = bool(adapt_damping)
        omega = (19 / 20) ** self.damping_period if omega is None else _number(omega, "omega")
        if not 0 < omega <= 1:
            raise HyperparameterError(f"KFAC: omega must be in (0, 1], got {omega!r}")
        self.omega = omega
        self.min_damping, self.max_damping = _number(min_damping, "min_damping"), \
            _number(max_damping, "max_damping")
        if not 0 <= self.min_damping <= self.max_damping:
            raise HyperparameterError(f"KFAC: need 0 ≤ min_damping ≤ max_damping, got "
                                      f"{min_damping!r}, {max_damping!r}")
        if self.adapt_damping and damping == 0:
            raise HyperparameterError("KFAC: adapt_damping multiplies λ, which must start > 0")
        self.sampler, self.seed, self.model = sampler, int(seed), model
        options = [name for name, on in (
            ("decay", decay > 0), ("factor_period", self.factor_period > 1),
            ("inverse_period", self.inverse_period > 1), ("adapt_damping", self.adapt_damping),
            ("rescale", self.rescale), ("curvature='sampled'", curvature == "sampled")) if on]
        if options and model is None:
            raise KindError(f"KFAC with {', '.join(options)} keeps its factors in the optimiser's "
                            "state, whose shapes are the model's: pass model=your_model")

    # -- the layout and the curvature ----------------------------------------------------------
    @property
    def stateful(self) -> bool:
        """Whether KFAC keeps a state in its optimiser (`init_state`, `sharp_state`): with a
        model given. Without one, KFAC holds nothing (`sharp` recomputes the batch's factors)."""
        return self.model is not None

    def _layout(self, model):
        """The model's parameterised slots (`model.sites()`) and how each is read."""
        sites = model.sites()
        for site in sites:
            if _kind(site) is None and self.fallback == "raise":
                raise KindError(f"KFAC factors layers that declare an affine structure (such as "
                                f"dense and linear); {site.lens.name} (parameters "
                                f"{site.lens.param!r}) declares none: use "
                                "KFAC(fallback='euclidean') to give it the identity block, or "
                                "another metric")
        return sites

    def _fisher(self, ctx):
        return self.output_fisher or output_fisher(ctx.loss)

    def _sample(self, ctx):
        if self.sampler is not None:
            return self.sampler
        fam = loss_family(ctx.loss)
        if not fam.has_sampler:
            raise KindError(f"KFAC(curvature='sampled') draws labels from the predictive "
                            f"distribution of the loss family, and none is known for {fam!r}: "
                            "give the family a sample(key, z) method, or pass "
                            "sampler=(key, z) ↦ target to KFAC")
        return fam.sample

    def _out_curvature(self, ctx):
        """(z, y, key) ↦ the (m, m) output-space matrix F_i of the chosen `curvature`."""
        if self.curvature == "gauss-newton":
            hvp = _loss_hvp(ctx.loss)
            return lambda z, y, key: _out_matrix(hvp, z, y)
        if self.curvature == "fisher":
            F = self._fisher(ctx)
            return lambda z, y, key: _out_matrix(lambda z_, y_, v: F(z_, v), z, y)
        value = loss_family(ctx.loss).value
        score = lambda z, y: ravel(jax.grad(value)(z, y))  # noqa: E731  ∇_z L_y(z)
        if self.curvature == "empirical":
            return lambda z, y, key: jnp.outer(score(z, y), score(z, y))
        sample, S = self._sample(ctx), self.samples

        def sampled(z, y, key):
            d = jax.vmap(lambda k: score(z, sample(k, z)))(jax.random.split(key, S))
            return d.T @ d / S
        return sampled

    # -- the factors of one batch ----------------------------------------------------------------
    def factors(self, p, ctx, key=None):
        """Per parameterised slot (`model.sites()`), the batch's (A_l, G_l) for an affine layer,
        else None (`key`: the draw of sampled labels; `seed` when None)."""
        return self._run("_factors", p, key, ctx)

    def _factors(self, p, key, ctx):
        n, s = _data(ctx, "KFAC")
        model, sites = ctx.model, self._layout(ctx.model)
        idx = [i for i, site in enumerate(sites) if _kind(site)]
        curv, dtype = self._out_curvature(ctx), ravel(p).dtype
        key = jax.random.PRNGKey(self.seed) if key is None else key

        def one(x, y, k):
            # Perturb each factored layer's output by δ_l (`probe`); the Jacobian in δ_l at 0
            # is B_l, so one reverse sweep per output coordinate gives every layer's B at once.
            def run(deltas):
                inputs = []
                z = model.probe(x, p, iter(deltas), inputs)
                return ravel(z), (z, inputs)

            zeros = [jnp.zeros(sites[i].lens.cod.shape, dtype) for i in idx]
            Bs, (z, inputs) = jax.jacrev(run, has_aux=True)(zeros)  # B_l : (m, n_out_l)
            H = curv(z, y, k)
            abar = [jnp.concatenate([a, jnp.ones((1,), a.dtype)])
                    if _kind(sites[i]) == "dense" else a for i, a in zip(idx, inputs)]
            return abar, Bs, [H @ B for B in Bs]

        abar, Bs, HBs = jax.vmap(one)(ctx.x, ctx.y, jax.random.split(key, n))
        out = [None] * len(sites)
        for j, i in enumerate(idx):
            out[i] = (jnp.einsum("ia,ib->ab", abar[j], abar[j]) / n,
                      s * jnp.einsum("ima,imb->ab", Bs[j], HBs[j]))
        return tuple(out)

    # -- the damped blocks, solved and applied -----------------------------------------------------
    def _shifts(self, a, g, lam):
        """(c_A, c_G) added to A's and G's eigenvalues by the factored Tikhonov damping:
        (π√λ, √λ/π), π = √[(tr A / dim A) / (tr G / dim G)] (1 where a trace vanishes)."""
        ta, tg = jnp.mean(a), jnp.mean(g)
        pi = jnp.sqrt(jnp.where((ta > 0) & (tg > 0), ta / jnp.where(tg > 0, tg, 1.0), 1.0))
        root = jnp.sqrt(lam)
        return pi * root, root / pi

    def _eigenvalues(self, a, g, lam):
        """The damped block's eigenvalues on the grid (γ_i, α_j): γ_i α_j + λ ("exact") or
        (γ_i + √λ/π)(α_j + π√λ) ("factored")."""
        # Clamp rounding below 0: A and G are Gram matrices, positive semi-definite.
        a, g = jnp.maximum(a, 0.0), jnp.maximum(g, 0.0)
        if self.tikhonov == "factored":
            ca, cg = self._shifts(a, g, lam)
            return (g + cg)[:, None] * (a + ca)[None, :]
        return g[:, None] * a[None, :] + lam

    def _apply(self, sites, eig, t, lam, sharp):
        """Each affine block of t mapped by the damped block's inverse (sharp) or by it."""
        out = t
        for site, e in zip(sites, eig):
            if e is None:  # the identity block of the fallback
                continue
            a, UA, g, UG = e
            ev = self._eigenvalues(a, g, lam)
            C = UG.T @ _to_theta(site, site.get(t)) @ UA
            X = UG @ (C / ev if sharp else C * ev) @ UA.T
            out = at_path(out, site.path, _from_theta(site, X))
        return out

    def _map(self, p, t, ctx, sharp):
        eig = _eig(self._factors(p, None, ctx))
        return self._apply(self._layout(ctx.model), eig, t, self.damping, sharp)

    def _sharp(self, p, g, ctx):
        return self._map(p, g, ctx, True)

    def _flat(self, p, v, ctx):
        return self._map(p, v, ctx, False)

    def _matrix(self, p, _, ctx):
        # ⊕_l (G_l ⊗ A_l + λ I), each block reordered from vec(Θ) to ravel((W, b)); the sites
        # are the parameterised slots in the order of `ravel(p)`.
        blocks = []
        for site, f in zip(self._layout(ctx.model), self._factors(p, None, ctx)):
            d = ravel(site.get(p)).size
            if f is None:
                blocks.append(jnp.eye(d))
                continue
            A, G = f
            if self.tikhonov == "factored":
                ca, cg = self._shifts(jnp.diagonal(A), jnp.diagonal(G), self.damping)
                M = jnp.kron(G + cg * jnp.eye(len(G), dtype=G.dtype),
                             A + ca * jnp.eye(len(A), dtype=A.dtype))
            else:
                M = jnp.kron(G, A) + self.damping * jnp.eye(d, dtype=A.dtype)
            perm = _theta_to_ravel(site, site.lens.cod.shape[0], site.lens.dom.shape[0])
            blocks.append(M if perm is None else M[perm][:, perm])
        return jax.scipy.linalg.block_diag(*blocks)

    # -- the state ---------------------------------------------------------------------------------
    def init_state(self, p) -> KFACState:
        """The state before the first step: zero factors (replaced whole by the first estimate,
        ε_1 = 0), identity decompositions, λ = `damping`, the key of `seed`."""
        if self.model is None:
            raise KindError("KFAC keeps a state only with its model: KFAC(..., model=your_model)")
        leaves = jax.tree_util.tree_leaves(p)
        dtype = np.dtype(jnp.result_type(leaves[0]) if leaves else jnp.result_type(float))
        # Built with numpy (no compilation per shape; also under `eval_shape`).
        zeros = lambda *shape: jnp.asarray(np.zeros(shape, dtype))  # noqa: E731
        eye = lambda n: jnp.asarray(np.eye(n, dtype=dtype))  # noqa: E731
        factors: list = []
        eig: list = []
        for site in self._layout(self.model):
            kind = _kind(site)
            if kind is None:
                factors.append(None)
                eig.append(None)
                continue
            na = site.lens.dom.shape[0] + (kind == "dense")
            ng = site.lens.cod.shape[0]
            factors.append((zeros(na, na), zeros(ng, ng)))
            eig.append((zeros(na), eye(na), zeros(ng), eye(ng)))
        last = tree_map(lambda a: zeros(*jnp.shape(a)), p) if self.rescale else None
        return KFACState(jnp.asarray(np.int32(0)), jnp.asarray(np.int32(0)), tuple(factors),
                         tuple(eig), jnp.asarray(self.damping, dtype),
                         jax.random.PRNGKey(self.seed), last)

    def sharp_state(self, p, cov, ctx, state: KFACState):
        """(p')♯ with the running factors, and the state after this step (the optimiser's
        `sharp(KFAC(...))` part calls it; traceable)."""
        g = covector_value(cov, f"{self!r}.sharp")
        if ctx is None or ctx.model is None:
            raise KindError("KFAC depends on the model and the data: pass "
                            "ctx=Context(model, loss_family, x, y, reduction)")
        if not isinstance(state, KFACState):
            raise KindError(f"{self!r} keeps its factors in the state of its optimiser's sharp "
                            f"part, got {type(state).__name__}: step with train_step, or with "
                            "opt.step(state, ...) from state = opt.init(params)")
        if [(s.path, _kind(s)) for s in ctx.model.sites()] != \
                [(s.path, _kind(s)) for s in self.model.sites()]:
            raise KindError(f"{self!r} keeps the factors of {self.model.name}, but the step is "
                            f"taken on {ctx.model.name}, whose layers differ")
        x, new = self._run("_sharp_state", p, (g, state), ctx)
        return Vector(x, _space(cov, ctx)), new

    def _sharp_state(self, p, t, ctx):
        g, st = t
        sites, count = self._layout(ctx.model), st.count
        lam = st.damping
        key, sub = jax.random.split(st.key)

        def fresh():
            k = st.updates + 1
            eps = jnp.minimum(1.0 - 1.0 / k.astype(lam.dtype), self.decay).astype(lam.dtype)
            new = self._factors(p, sub, ctx)
            return tree_map(lambda old, b: eps * old + (1 - eps) * b, st.factors, new), k

        factors, updates = lax.cond(count % self.factor_period == 0, fresh,
                                    lambda: (st.factors, st.updates))
        eig = lax.cond(count % self.inverse_period == 0, lambda: _eig(factors), lambda: st.eig)
        x = self._apply(sites, eig, g, lam, True)
        if not (self.rescale or self.adapt_damping):
            return x, KFACState(count + 1, updates, factors, eig, lam, key, None)
        direction = tree_map(jnp.negative, x)  # Δ = −K⁻¹∇h
        if self.rescale:
            # δ₀ = θ − the previous step's point: the move actually taken (0 at the first step).
            d0 = tree_map(lambda a, b: jnp.where(count > 0, a - b, jnp.zeros_like(a)), p, st.last)
            step, change = self._rescaled(p, g, direction, d0, lam, ctx)
        else:
            step, change = direction, None
        if self.adapt_damping:
            due = (count + 1) % self.damping_period == 0
            lam = lax.cond(due, lambda: self._adapted(p, g, step, change, lam, ctx)[0],
                           lambda: lam)
        last = p if self.rescale else None
        return tree_map(jnp.negative, step), KFACState(count + 1, updates, factors, eig, lam,
                                                       key, last)

    def _curvature_metric(self, ctx):
        """The exact curvature C of the quadratic model (undamped), matching `curvature`."""
        if self.curvature == "gauss-newton":
            return GaussNewton(0.0)
        if self.curvature == "empirical":
            return Fisher(0.0, empirical=True)
        if self.output_fisher is None and not loss_family(ctx.loss).has_output_fisher:
            return GaussNewton(0.0)  # "sampled" for a family with a sampler only
        return Fisher(0.0, output_fisher=self.output_fisher)

    def _damped_product(self, p, lam, ctx):
        """v ↦ (C + λ I) v, flattened, C the exact curvature of the batch (matrix-free)."""
        Cv = self._curvature_metric(ctx)._gram_matvec(p, ctx)
        return lambda v: ravel(Cv(v)) + lam * ravel(v)

    def _rescaled(self, p, g, direction, d0, lam, ctx):
        """(δ, M(δ)): δ = αΔ + μδ₀ with (α, μ) minimising the quadratic model M of the batch
        (`KFAC`'s docstring, `rescale`), and the model's value there."""
        Cv = self._damped_product(p, lam, ctx)
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

    def _adapted(self, p, g, step, change, lam, ctx):
        """(λ after the Levenberg–Marquardt rule for the step δ = `step` from p, ρ), on the
        batch of `ctx` (`KFAC`'s docstring). `change` is M(δ), or None to compute it."""
        _, s = _data(ctx, "KFAC")
        value, model = loss_family(ctx.loss).value, batched(ctx.model)

        def h(q):
            return s * jnp.sum(jax.vmap(value)(model.forward(ctx.x, q), ctx.y))

        d = ravel(step)
        if change is None:
            change = ravel(g) @ d + 0.5 * d @ self._damped_product(p, lam, ctx)(step)
        actual = h(tree_map(jnp.add, p, step)) - h(p)
        rho = jnp.where(change < 0, actual / jnp.where(change < 0, change, 1.0), -jnp.inf)
        rho = jnp.where(jnp.isnan(rho), -jnp.inf, rho)  # a loss that overflowed: raise λ
        new = jnp.where(rho > 0.75, lam * self.omega, jnp.where(rho < 0.25, lam / self.omega, lam))
        new = jnp.where(jnp.all(d == 0), lam, new)
        return jnp.clip(new, self.min_damping, self.max_damping).astype(lam.dtype), rho

    def __repr__(self):
        extra = "".join(f", {k}={v!r}" for k, v, default in (
            ("decay", self.decay, 0.0), ("factor_period", self.factor_period, 1),
            ("inverse_period", self.inverse_period, 1),
            ("adapt_damping", self.adapt_damping, False), ("tikhonov", self.tikhonov, "exact"),
            ("rescale", self.rescale, False)) if v != default)
        return f"KFAC(damping={self.damping}, curvature={self.curvature!r}{extra})"


__all__ = ["KFAC", "KFACState", "CURVATURES"]
