"""Instruments for inner products: a check of a metric's laws, and diagnostics along a run.

`check_metric(metric, space, ctx)` tests, at points, vectors and covectors drawn by
Hypothesis (`lenses.strategies`), the laws every inner product g of the library obeys:

- sharp and flat are inverse: (u♭)♯ = u and (c♯)♭ = c;
- g_p is symmetric, g(u, v) = g(v, u), and positive definite, g(u, u) > 0 (at every drawn
  point); at the first three points also its matrix on the coordinates of p, built from
  flat, is symmetric with smallest eigenvalue > 0 (for dimensions ≤ `dense_max`);
- the sharp map represents the covector: g(c♯, v) = c(v);
- its move R_p(v) = `retract(p, v, space)` is a retraction: R_p(0) = p, dR_p(0) = id
  (central differences), and every move stays inside the space (small, unit and huge
  steps), as `space.indicator` says.

A law that fails raises `AssertionError` naming the metric, the law, the point and the size
of the violation (Hypothesis reports the falsifying example). Hypothesis is needed (the
`test` extra); nothing here is imported by `lenses` until called.

Diagnostics, each at one point (functions, for use along a run): `natural_angle` (the angle
between the natural direction c♯ and the Euclidean one c), `condition_number` (of g_p), and
`kfac_error` (the relative error of K-FAC's preconditioned direction against the Fisher's).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from categories import Covector, Space, Vector
from categories.dimensions import dimension
from categories.errors import KindError
from categories.linear import unwrap

from .metrics import Context, Metric, ravel, unflatten_like

__all__ = ["check_metric", "metric_matrix", "natural_angle", "condition_number", "kfac_error"]


def _space_of(space, ctx, who):
    if space is None and ctx is not None and getattr(ctx, "model", None) is not None:
        space = ctx.model.param
    if space is None:
        raise KindError(f"{who} needs the parameter object: pass space= (or a ctx with a model)")
    if not isinstance(space, Space):
        raise KindError(f"{who}: space must be a Space (the parameter object, e.g. R(2)), "
                        f"got {space!r}")
    return space


def _instrument(metric, p, space, ctx, who):
    """The space of the diagnostic `who`, once its metric is a `Metric` and p a point of it
    (the one check of a point: shape, finite, inside the open set), else a catalogued error."""
    if not isinstance(metric, Metric):
        raise KindError(f"{who}: metric must be an inner product (a Metric, e.g. Euclidean()), "
                        f"got {metric!r}")
    space = _space_of(space, ctx, who)
    space.check(p, f"the point p given to {who}")
    return space


def _covector_of(cov, space, who):
    """The raw value of the covector `cov` on `space`, refused (`DomainError`) unless shaped as
    one with real finite entries: a NaN covector has no direction to measure."""
    c = unwrap(cov)
    space.tangent.check(c, f"the covector given to {who}")
    return c


def _dot(a, b):
    leaves = [jnp.vdot(ravel(x), ravel(y)) for x, y in
              zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True)]
    return float(sum(leaves)) if leaves else 0.0


def _scaled(a):
    """a divided by its largest entry in absolute value (None if a is zero)."""
    big = max((float(jnp.max(jnp.abs(x))) for x in jax.tree_util.tree_leaves(a) if jnp.size(x)),
              default=0.0)
    return None if big == 0.0 else jax.tree_util.tree_map(lambda x: x / big, a)


def _norm(a):
    return math.sqrt(max(_dot(a, a), 0.0))


def metric_matrix(metric, p, space, ctx: Context | None = None):
    """The matrix of g_p in the coordinates of `ravel(p)`: column j is (e_j)♭ (numpy, float64).

    Examples:
        >>> metric_matrix(Diagonal(jnp.array([1.0, 3.0])), jnp.zeros(2), R(2)).tolist()
        [[1.0, 0.0], [0.0, 3.0]]
    """
    space = _instrument(metric, p, space, ctx, "metric_matrix")
    theta = ravel(p)
    # One call of flat per coordinate: the same shapes as every other call (nothing new to
    # compile), where a vmap over the basis would compile a batched copy of the metric.
    cols = [ravel(unwrap(metric.flat(p, Vector(unflatten_like(e, p), space), ctx)))
            for e in jnp.eye(theta.size, dtype=theta.dtype)]
    return np.asarray(jnp.stack(cols, axis=1), np.float64) if cols else np.zeros((0, 0))


def natural_angle(metric, p, cov, ctx: Context | None = None, space=None) -> float:
    """The angle, in radians, between the natural direction c♯ and the Euclidean direction c
    (both read as vectors in the coordinates of p): arccos(⟨c♯, c⟩ / (‖c♯‖ ‖c‖)).

    At a zero covector (a stationary point) neither direction exists and the angle is
    undefined: the value is nan, not an error, so that a diagnostic along a run survives a
    minimum. A covector with NaN or infinite entries is refused (`DomainError`).

    Examples:
        The Gauss–Newton matrix is diag(1, 4) here, so c = (1, 4) sharpens to (1, 1): the angle
        between them is arccos(5 / √34) ≈ 0.5404.

        >>> model = linear(2, 1)
        >>> W = jnp.array([[1.0, 1.0]])
        >>> X, Y = jnp.array([[1.0, 0.0], [0.0, 2.0]]), jnp.zeros((2, 1))
        >>> ctx = Context(model, half_squared_error, X, Y, reduction="sum")
        >>> c = Covector(jnp.array([[1.0, 4.0]]), model.param)
        >>> round(natural_angle(GaussNewton(0.0), W, c, ctx), 4)
        0.5404
        >>> natural_angle(Euclidean(), jnp.zeros(2), Covector(jnp.zeros(2), R(2)))
        nan
    """
    space = _instrument(metric, p, getattr(cov, "space", None) or space, ctx, "natural_angle")
    c = _scaled(_covector_of(cov, space, "natural_angle"))
    if c is None:  # c = 0 (so c♯ = 0): no direction, the angle is undefined
        return math.nan
    # The angle does not change with the length of c or of c♯: each is divided by its largest
    # entry first, so that a covector of tiny entries (1e-200) has no square underflowing to 0.
    nat = _scaled(unwrap(metric.sharp(p, Covector(c, space), ctx)))
    if nat is None:
        return math.nan
    cos = _dot(nat, c) / (_norm(nat) * _norm(c))
    return float(np.arccos(np.clip(cos, -1.0, 1.0)))


def condition_number(metric, p, ctx: Context | None = None, space=None) -> float:
    """κ(g_p) = λ_max / λ_min of the (symmetrised) matrix of g_p on the coordinates of p.

    Examples:
        >>> condition_number(Diagonal(jnp.array([1.0, 3.0])), jnp.zeros(2), space=R(2))
        3.0
    """
    space = _instrument(metric, p, space, ctx, "condition_number")
    G = metric_matrix(metric, p, space, ctx)
    ev = np.linalg.eigvalsh(0.5 * (G + G.T))
    return float(ev[-1] / ev[0]) if ev[0] > 0 else math.inf


def kfac_error(kfac, p, cov, ctx: Context, reference=None) -> float:
    """‖K♯c − F♯c‖ / ‖F♯c‖: how far K-FAC's preconditioned direction K♯c (its batch factors)
    is from the exact one F♯c, F the matrix K-FAC approximates (the Fisher, the Gauss–Newton
    matrix or the empirical Fisher, matching its `curvature`, with the same damping), or
    `reference` (any metric) when given.

    Examples:
        On a linear model K-FAC's blocks are exact (see `KFAC`), so the error is 0:

        >>> model = linear(2, 1)
        >>> W = jnp.array([[1.0, 1.0]])
        >>> X, Y = jnp.array([[1.0, 0.0], [0.0, 2.0]]), jnp.zeros((2, 1))
        >>> ctx = Context(model, half_squared_error, X, Y, reduction="sum")
        >>> c = Covector(jnp.array([[1.0, 4.0]]), model.param)
        >>> round(kfac_error(KFAC(0.0), W, c, ctx), 6)
        0.0
    """
    from .kfac import KFAC
    from .natural import Fisher, GaussNewton

    if reference is None and not isinstance(kfac, KFAC):
        raise KindError(f"kfac_error: kfac must be a KFAC (its curvature names the matrix it "
                        f"approximates), got {kfac!r}; to compare another metric, pass "
                        f"reference= (the metric to compare it with)")
    if reference is None:
        if kfac.curvature == "gauss-newton":
            reference = GaussNewton(kfac.damping)
        else:
            reference = Fisher(kfac.damping, empirical=kfac.curvature == "empirical",
                               output_fisher=kfac.output_fisher)
    space = _instrument(kfac, p, getattr(cov, "space", None), ctx, "kfac_error")
    _instrument(reference, p, space, ctx, "kfac_error (its reference)")
    c = Covector(_covector_of(cov, space, "kfac_error"), space)
    k, f = unwrap(kfac.sharp(p, c, ctx)), unwrap(reference.sharp(p, c, ctx))
    diff = jax.tree_util.tree_map(lambda a, b: a - b, k, f)
    return _norm(diff) / _norm(f)


# -- the laws ----------------------------------------------------------------------------------

def _fail(metric, law, p, detail):
    raise AssertionError(f"check_metric: {metric!r} breaks the law {law} at p = {p!r}: {detail}")


def _rel(a, b):
    """‖a − b‖ / max(‖b‖, tiny)."""
    diff = jax.tree_util.tree_map(lambda x, y: x - y, a, b)
    return _norm(diff) / max(_norm(b), 1e-300)


def _laws_at(metric, space, ctx, p, u, v, c, rtol, dense_max, check_retract, matrix=True):
    """Every law at one point p, with vectors u, v and the covector c (raw pytrees)."""
    vec = lambda t: Vector(t, space)  # noqa: E731
    cov = lambda t: Covector(t, space)  # noqa: E731
    flat = lambda t: unwrap(metric.flat(p, vec(t), ctx))  # noqa: E731
    sharp = lambda t: unwrap(metric.sharp(p, cov(t), ctx))  # noqa: E731
    if _norm(u) > 0:
        err = _rel(sharp(flat(u)), u)
        if not err <= rtol:
            _fail(metric, "sharp(flat(u)) = u", p, f"relative error {err:.3g} > {rtol:.3g}")
    if _norm(c) > 0:
        err = _rel(flat(sharp(c)), c)
        if not err <= rtol:
            _fail(metric, "flat(sharp(c)) = c", p, f"relative error {err:.3g} > {rtol:.3g}")
    guv, gvu = _dot(flat(u), v), _dot(flat(v), u)
    scale = max(_norm(flat(u)) * _norm(v), _norm(flat(v)) * _norm(u), 1e-300)
    if not abs(guv - gvu) <= rtol * scale:
        _fail(metric, "g(u, v) = g(v, u) (symmetry)", p,
              f"g(u, v) = {guv:.6g}, g(v, u) = {gvu:.6g}")
    guu = _dot(flat(u), u)
    if _norm(u) > 0 and not guu > 0:
        _fail(metric, "g(u, u) > 0 (positive definite)", p, f"g(u, u) = {guu:.6g} for u ≠ 0")
    d = ravel(p).size
    if matrix and 0 < d <= dense_max:
        G = metric_matrix(metric, p, space, ctx)
        asym = np.max(np.abs(G - G.T)) / max(np.max(np.abs(G)), 1e-300)
        if not asym <= rtol:
            _fail(metric, "g = gᵀ (symmetry)", p,
                  f"its matrix is not symmetric (relative {asym:.3g})")
        low = np.linalg.eigvalsh(0.5 * (G + G.T))[0]
        if not low > 0:
            _fail(metric, "g positive definite", p, f"its smallest eigenvalue is {low:.6g}")
    if _norm(c) > 0:
        lhs, rhs = _dot(flat(sharp(c)), v), _dot(c, v)
        if not abs(lhs - rhs) <= rtol * max(_norm(c) * _norm(v), 1e-300):
            _fail(metric, "g(c♯, v) = c(v)", p, f"g(c♯, v) = {lhs:.6g}, c(v) = {rhs:.6g}")
    if check_retract:
        _retract_laws(metric, space, p, u, v, rtol)


def _retract_laws(metric, space, p, u, v, rtol):
    """The laws of the metric's retraction R_p at p: R_p(0) = p, dR_p(0) = id (along u), and
    every move R_p(s v) inside the space."""
    d = ravel(p).size
    R = lambda t: metric.retract(p, t, space)  # noqa: E731
    zero = jax.tree_util.tree_map(jnp.zeros_like, u)
    err = _rel(R(zero), p) if _norm(p) > 0 else _norm(R(zero))
    if not err <= rtol:
        _fail(metric, "R_p(0) = p", p, f"R_p(0) is {R(zero)!r} (relative error {err:.3g})")
    if _norm(u) > 0:
        # dR_p(0) u by central differences along the unit vector w = u / ‖u‖ (the moves of the
        # open sets are exact at v = 0, where a jvp would see the `where` that keeps p).
        w = jax.tree_util.tree_map(lambda a: a / _norm(u), u)
        eps = float(jnp.finfo(ravel(p).dtype).eps)
        h = eps ** (1 / 3) * (1.0 + _norm(p) / max(d, 1) ** 0.5)
        plus = R(jax.tree_util.tree_map(lambda a: h * a, w))
        minus = R(jax.tree_util.tree_map(lambda a: -h * a, w))
        dR = jax.tree_util.tree_map(lambda a, b: (a - b) / (2 * h), plus, minus)
        tol = max(rtol, 1e3 * eps ** (2 / 3))
        err = _rel(dR, w)
        if not err <= tol:
            _fail(metric, "dR_p(0) = id", p, f"dR_p(0) w differs from w by {err:.3g} (relative), "
                                             f"tolerance {tol:.3g}")
    for s in (1e-3, 1.0, 1e3, 1e8):
        q = R(jax.tree_util.tree_map(lambda a: s * a, v))
        finite = all(bool(jnp.all(jnp.isfinite(a))) for a in jax.tree_util.tree_leaves(q))
        if not (finite and bool(space.indicator(q))):
            _fail(metric, "R_p(v) inside the space", p,
                  f"the move along {s:g} · v reaches {q!r}, outside {space!r}")


def check_metric(metric, space=None, ctx: Context | None = None, *, examples: int = 20,
                 rtol: float | None = None, dense_max: int = 64, retract: bool = True,
                 points=None, derandomize: bool = True) -> None:
    """Check the laws of an inner product g at `examples` points of `space` drawn by
    Hypothesis, with drawn vectors u, v and covectors c: (u♭)♯ = u and (c♯)♭ = c; g(u, v) =
    g(v, u) and g(u, u) > 0 (and its matrix symmetric positive definite at the first points);
    g(c♯, v) = c(v); and for its move R_p = `retract(p, ·, space)`: R_p(0) = p, dR_p(0) = id,
    R_p(s v) inside `space` for s ∈ {1e-3, 1, 1e3, 1e8}. Raise `AssertionError` naming the
    first law that fails, the point and the size of the violation.

    `space`: the parameter object (default: `ctx.model.param`); `ctx`: the `Context` a
    data-dependent metric reads (model, loss family, batch); `rtol`: the relative tolerance
    (default 1e-6 in float64, 1e-3 in float32); `dense_max`: the largest dimension whose
    metric matrix is built for the symmetry and definiteness checks; `retract=False` skips the
    laws of the move; `points`: a Hypothesis strategy of points (default
    `lenses.strategies.parameter_points(space)`); `derandomize`: the same draws on every run
    (Hypothesis's derandomised mode; False for fresh ones).

    Examples:
        A constant diagonal inner product obeys every law: nothing is raised.

        >>> check_metric(Diagonal(jnp.array([1.0, 3.0])), R(2), examples=3)
    """
    from hypothesis import HealthCheck, given, settings

    from categories import strategies as cs

    from .. import strategies as ls

    space = _space_of(space, ctx, "check_metric")
    examples = dimension(examples, "check_metric: examples (the number of points drawn)", 1)
    points = ls.parameter_points(space) if points is None else points

    matrices: list = []  # the points where the dense matrix was checked (the first few suffice)

    @settings(max_examples=examples, deadline=None, database=None, derandomize=derandomize,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
    @given(points, cs.tangents(space), cs.tangents(space), cs.covectors(space))
    def laws(p, u, v, c):
        dtype = ravel(p).dtype if ravel(p).size else jnp.result_type(float)
        cast = lambda t: jax.tree_util.tree_map(lambda a: jnp.asarray(a, dtype), t)  # noqa: E731
        u, v, c = cast(u), cast(v), cast(c)
        tol = rtol if rtol is not None else (1e-6 if jnp.finfo(dtype).bits == 64 else 1e-3)
        _laws_at(metric, space, ctx, p, u, v, c, tol, dense_max,
                 retract and type(metric).retract is not Metric.retract, len(matrices) < 3)
        matrices.append(p)

    laws()
