"""K-FAC (Martens & Grosse 2015): the Kronecker-factored Fisher as a metric, with its state.

The formulas of the metric and of each option are in the docstring of `KFAC`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from categories import Vector
from categories.errors import HyperparameterError, KindError, SpaceMismatch
from categories.numbers import integer

from ..inputs import flag, need_lens
from ..losses import loss_family
from ..sites import at_path
from ..values import assign, static
from .kfac_blocks import eigen, from_theta, site_kind, theta_to_ravel, to_theta
from .kfac_model import adapted, kfac_numbers, rescaled
from .metrics import covector_value, ravel
from .natural import DataMetric, data_scale, loss_hvp, output_fisher, output_matrix, space_of

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

        >>> s = gd(0.1, metric=KFAC(0.1, decay=0.95, model=linear(2, 1))).init(jnp.ones((1, 2)))[0]
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


def _choice(x, options, name):
    if x not in options:
        raise HyperparameterError(f"KFAC: {name} must be one of {options}, got {x!r}")


def _function(f, name, form):
    """f if it is None or callable, else `KindError` naming the argument and its form."""
    if f is not None and not callable(f):
        raise KindError(f"KFAC: {name} must be a function {form} (or None for the loss "
                        f"family's own), got {type(f).__name__} {f!r}")
    return f


class KFAC(DataMetric):
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
    "exact" or "factored"; `rescale`; `seed` the first key (an integer ≥ 0); `model` the model
    whose factors the state holds (needed by every option but `tikhonov`; the model trained:
    one with another parameter object is refused, `SpaceMismatch`, when the step is built);
    `output_fisher` and `sampler` functions or None. `rescale` and `adapt_damping`
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

    curvature: str = static()
    fallback: str = static()
    output_fisher: Any = static()  # (z, v) ↦ F(z) v, or None for the loss family's own
    decay: Any
    factor_period: int = static()
    inverse_period: int = static()
    damping_period: int = static()
    samples: int = static()
    adapt_damping: bool = static()
    omega: Any
    min_damping: Any
    max_damping: Any
    sampler: Any = static()
    seed: int = static()
    model: Any = static()
    tikhonov: str = static()
    rescale: bool = static()

    def __init__(self, damping: float = 0.1, curvature: str = "fisher", fallback: str = "raise",
                 output_fisher=None, *, decay: float = 0.0, factor_period: int = 1,
                 inverse_period: int = 1, adapt_damping: bool = False, damping_period: int = 5,
                 omega: float | None = None, min_damping: float = 1e-8,
                 max_damping: float = 1e8, samples: int = 1, sampler=None, seed: int = 0,
                 model=None, tikhonov: str = "exact", rescale: bool = False):
        adapt_damping = flag(adapt_damping, "KFAC: adapt_damping")
        rescale = flag(rescale, "KFAC: rescale")
        _choice(curvature, CURVATURES, "curvature")
        _choice(fallback, ("raise", "euclidean"), "fallback")
        _choice(tikhonov, ("exact", "factored"), "tikhonov")
        damping_period = integer(damping_period, "KFAC: damping_period", 1)
        omega = (19 / 20) ** damping_period if omega is None else omega
        damping, decay, omega, low, high = kfac_numbers(damping, decay, omega, min_damping,
                                                        max_damping, adapt_damping)
        if model is not None:
            need_lens(model, "KFAC(model=...)")
        output_fisher = _function(output_fisher, "output_fisher", "(z, v) ↦ F(z) v")
        sampler = _function(sampler, "sampler", "(key, z) ↦ target")
        assign(self, damping=damping, curvature=curvature, fallback=fallback,
               output_fisher=output_fisher, decay=decay,
               factor_period=integer(factor_period, "KFAC: factor_period", 1),
               inverse_period=integer(inverse_period, "KFAC: inverse_period", 1),
               damping_period=damping_period, samples=integer(samples, "KFAC: samples", 1),
               adapt_damping=adapt_damping, omega=omega, min_damping=low,
               max_damping=high, sampler=sampler, seed=integer(seed, "KFAC: seed"), model=model,
               tikhonov=tikhonov, rescale=rescale)
        options = [name for name, on in (
            ("decay", decay > 0), ("factor_period", self.factor_period > 1),
            ("inverse_period", self.inverse_period > 1), ("adapt_damping", self.adapt_damping),
            ("rescale", self.rescale), ("curvature='sampled'", curvature == "sampled")) if on]
        if options and model is None:
            raise KindError(f"KFAC with {', '.join(options)} keeps its factors in the optimiser's "
                            "state, whose shapes are the model's: pass model=your_model")

    def check_numbers(self):
        kfac_numbers(self.damping, self.decay, self.omega, self.min_damping, self.max_damping,
                     self.adapt_damping, traced=True)
        return self

    # -- the layout and the curvature ----------------------------------------------------------
    @property
    def stateful(self) -> bool:
        """Whether KFAC keeps a state in its optimiser (`init_state`, `sharp_state`): with a
        model given. Without one, KFAC holds nothing (`sharp` recomputes the batch's factors)."""
        return self.model is not None

    def check_model(self, model, who: str) -> None:
        """Refuse (`SpaceMismatch`) to be trained on `model` when the model KFAC keeps the
        factors of (`model=`) has another parameter object: the state's shapes are its own."""
        if self.model is not None and self.model.param != model.param:
            raise SpaceMismatch(f"{who}: {self!r} keeps the factors of model={self.model.name} "
                                f"(parameters {self.model.param!r}), but the model trained is "
                                f"{model.name} (parameters {model.param!r}): pass the trained "
                                "model as KFAC(..., model=...)")

    def _layout(self, model):
        """The model's parameterised slots (`model.sites()`) and how each is read."""
        sites = model.sites()
        for site in sites:
            if site_kind(site) is None and self.fallback == "raise":
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
            hvp = loss_hvp(ctx.loss)
            return lambda z, y, key: output_matrix(hvp, z, y)
        if self.curvature == "fisher":
            F = self._fisher(ctx)
            return lambda z, y, key: output_matrix(lambda z_, y_, v: F(z_, v), z, y)
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
        n, s = data_scale(ctx, "KFAC")
        model, sites = ctx.model, self._layout(ctx.model)
        idx = [i for i, site in enumerate(sites) if site_kind(site)]
        curv, dtype = self._out_curvature(ctx), ravel(p).dtype
        key = jax.random.PRNGKey(self.seed) if key is None else key

        def one(x, y, k):
            # Perturb each factored layer's output by δ_l (`probe`); the Jacobian in δ_l at 0
            # is B_l, so one reverse sweep per output coordinate gives every layer's B at once.
            def perturbed(deltas):
                inputs = []
                z = model.probe(x, p, iter(deltas), inputs)
                return ravel(z), (z, inputs)

            zeros = [jnp.zeros(sites[i].lens.cod.shape, dtype) for i in idx]
            Bs, (z, inputs) = jax.jacrev(perturbed, has_aux=True)(zeros)  # B_l : (m, n_out_l)
            H = curv(z, y, k)
            abar = [jnp.concatenate([a, jnp.ones((1,), a.dtype)])
                    if site_kind(sites[i]) == "dense" else a for i, a in zip(idx, inputs)]
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
            C = UG.T @ to_theta(site, site.get(t)) @ UA
            X = UG @ (C / ev if sharp else C * ev) @ UA.T
            out = at_path(out, site.path, from_theta(site, X))
        return out

    def _map(self, p, t, ctx, sharp):
        eig = eigen(self._factors(p, None, ctx))
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
            perm = theta_to_ravel(site, site.lens.cod.shape[0], site.lens.dom.shape[0])
            blocks.append(M if perm is None else M[perm][:, perm])
        return jax.scipy.linalg.block_diag(*blocks)

    # -- the state ---------------------------------------------------------------------------------
    def init_state(self, p) -> KFACState:
        """The state before the first step: zero factors (replaced whole by the first estimate,
        ε_1 = 0), identity decompositions, λ = `damping`, the key of `seed`."""
        if self.model is None:
            raise KindError("KFAC keeps a state only with its model: KFAC(..., model=your_model)")
        why = self.model.param.mismatch(p, "the parameters")
        if why:
            raise SpaceMismatch(f"{self!r} keeps the factors of model={self.model.name} "
                                f"(parameters {self.model.param!r}), but the optimiser is started "
                                f"on other parameters: {why}; pass the trained model as "
                                "KFAC(..., model=...)")
        leaves = jax.tree_util.tree_leaves(p)
        dtype = np.dtype(jnp.result_type(leaves[0]) if leaves else jnp.result_type(float))
        # Built with numpy (no compilation per shape; also under `eval_shape`).
        zeros = lambda *shape: jnp.asarray(np.zeros(shape, dtype))  # noqa: E731
        eye = lambda n: jnp.asarray(np.eye(n, dtype=dtype))  # noqa: E731
        factors: list = []
        eig: list = []
        for site in self._layout(self.model):
            kind = site_kind(site)
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
        if [(s.path, site_kind(s)) for s in ctx.model.sites()] != \
                [(s.path, site_kind(s)) for s in self.model.sites()]:
            raise KindError(f"{self!r} keeps the factors of {self.model.name}, but the step is "
                            f"taken on {ctx.model.name}, whose layers differ")
        x, new = self._run("_sharp_state", p, (g, state), ctx)
        return Vector(x, space_of(cov, ctx)), new

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
        eig = lax.cond(count % self.inverse_period == 0, lambda: eigen(factors), lambda: st.eig)
        x = self._apply(sites, eig, g, lam, True)
        if not (self.rescale or self.adapt_damping):
            return x, KFACState(count + 1, updates, factors, eig, lam, key, None)
        direction = tree_map(jnp.negative, x)  # Δ = −K⁻¹∇h
        if self.rescale:
            # δ₀ = θ − the previous step's point: the move actually taken (0 at the first step).
            d0 = tree_map(lambda a, b: jnp.where(count > 0, a - b, jnp.zeros_like(a)), p, st.last)
            step, change = rescaled(self, p, g, direction, d0, lam, ctx)
        else:
            step, change = direction, None
        if self.adapt_damping:
            due = (count + 1) % self.damping_period == 0
            lam = lax.cond(due, lambda: adapted(self, p, g, step, change, lam, ctx)[0],
                           lambda: lam)
        last = p if self.rescale else None
        return tree_map(jnp.negative, step), KFACState(count + 1, updates, factors, eig, lam,
                                                       key, last)

    def __repr__(self):
        extra = "".join(f", {k}={v!r}" for k, v, default in (
            ("decay", self.decay, 0.0), ("factor_period", self.factor_period, 1),
            ("inverse_period", self.inverse_period, 1),
            ("adapt_damping", self.adapt_damping, False), ("tikhonov", self.tikhonov, "exact"),
            ("rescale", self.rescale, False))
            if isinstance(v, jax.core.Tracer) or v != default)  # (traced inside a step: shown)
        return f"KFAC(damping={self.damping}, curvature={self.curvature!r}{extra})"


__all__ = ["KFAC", "KFACState", "CURVATURES"]
