"""Checks on backward parts, and the composition rule spelled out in the ambient category.

- `check_backward(lens, a, p, b')`: compares a lens's backward part (hand-written or not) with
  the one JAX derives from its forward part and with central finite differences
  [S(w + ε) − S(w − ε)] / 2ε of the scalar S(w) = ⟨b', f(w)⟩, slot by slot.
- `composition_rule(f, g)`: the forward-and-backward map of f ≫ g built literally as a
  composite of smooth maps (pairings, projections, products) with the copies the rule makes —
  (a, p), read by f and by f'; (f(a, p), q), read by g and by g' — as explicit diagonals.
- `largest_slope(p')`: the largest |coordinate| of a parameter covector, skipping R^0 slots.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import jax
import jax.numpy as jnp
import numpy as np

from categories import Product, Smooth, Space, diagonal, pair, projection, smooth_identity
from categories.linear import flatten_value, pairing, unflatten_value, unwrap
from categories import check_composable
from categories.errors import CovectorError
from categories.numbers import real_number
from categories.points import real_dtype_mismatch, shape_of

from .inputs import need_lens
from .layer import derived
from .para_lens import ParaLens


@dataclass
class BackwardReport:
    """Largest absolute discrepancy per slot ("a" for the input, "p[i]" for parameter leaves).

    Examples:
        >>> report = check_backward(dense(2, 1), jnp.ones(2), dense(2, 1).init(jax.random.PRNGKey(0)), jnp.ones(1))
        >>> sorted(report.vs_derived)
        ['a', 'p[0]', 'p[1]']
    """

    vs_derived: dict = field(default_factory=dict)
    vs_finite_differences: dict = field(default_factory=dict)

    @property
    def max_error(self) -> float:
        return max(list(self.vs_derived.values()) + list(self.vs_finite_differences.values()) + [0.0])

    def ok(self, tol: float = 1e-6) -> bool:
        return self.max_error <= tol

    def __str__(self):
        rows = [f"  {k}: vs derived {self.vs_derived[k]:.3g}, vs finite differences "
                f"{self.vs_finite_differences[k]:.3g}" for k in self.vs_derived]
        return "backward part discrepancies (largest per slot):\n" + "\n".join(rows)


def _named_leaves(x, prefix):
    """Flatten a pytree to {slot name: array}, naming leaves by their path."""
    leaves = jax.tree_util.tree_flatten_with_path(x)[0]
    return {prefix + jax.tree_util.keystr(path): leaf for path, leaf in leaves}


def check_backward(lens: ParaLens, a, p, b_cov, eps: float = 1e-6, tol: float | None = None) -> BackwardReport:
    """Compare `lens.backward` with JAX's derivation and with central finite differences.

    With `tol`, raise AssertionError (with the report) when a discrepancy exceeds it.

    Examples:
        >>> model = dense(2, 1) >> tanh
        >>> p = model.init(jax.random.PRNGKey(0))
        >>> report = check_backward(model, jnp.array([0.5, -1.0]), p, jnp.ones(1))
        >>> max(report.vs_derived.values()) < 1e-12, max(report.vs_finite_differences.values()) < 1e-6
        (True, True)
    """
    need_lens(lens, "check_backward")
    lens = lens.fixed("check_backward")
    eps = real_number(eps, "check_backward: eps (the finite-difference step)", above=0)
    if tol is not None:
        tol = real_number(tol, "check_backward: tol", least=0)
    b_cov = unwrap(b_cov)
    da, dp = lens.backward(a, p, b_cov)
    ref_a, ref_p = derived(lens).backward(a, p, b_cov)
    got = {**_named_leaves(da.value, "a"), **_named_leaves(dp.value, "p")}
    ref = {**_named_leaves(ref_a.value, "a"), **_named_leaves(ref_p.value, "p")}

    space = lens.dom * lens.param

    def score(w):
        return pairing(b_cov, lens.forward(*w))

    w0 = (a, p)
    flat = flatten_value(w0, space.tangent)
    fd = []
    for i in range(flat.shape[0]):
        e = jnp.zeros_like(flat).at[i].set(eps)
        up = unflatten_value(flat + e, space.tangent)
        down = unflatten_value(flat - e, space.tangent)
        fd.append((score(up) - score(down)) / (2 * eps))
    fd = unflatten_value(jnp.asarray(fd, dtype=flat.dtype).reshape(-1), space.tangent)
    fdd = {**_named_leaves(fd[0], "a"), **_named_leaves(fd[1], "p")}

    report = BackwardReport()
    for k in ref:
        g = np.asarray(got.get(k, np.nan))
        report.vs_derived[k] = float(np.max(np.abs(g - np.asarray(ref[k])), initial=0.0)) if g.shape == np.shape(ref[k]) else float("inf")
        report.vs_finite_differences[k] = float(np.max(np.abs(g - np.asarray(fdd[k])), initial=0.0)) if g.shape == np.shape(fdd[k]) else float("inf")
    if tol is not None and not report.ok(tol):
        raise AssertionError(f"{lens.name}: {report}")
    return report


def largest_slope(p_cov):
    """max |p'_i| over the parameterised slots; None when no slot has parameters (no movement).

    p' is a parameter covector: a `Covector`, or its value, a pytree of real arrays. None is
    accepted as a value: it is the covector of a lens without parameters (on R^0, e.g.
    `tanh.at(R(2))`), whose largest slope is None. Anything else is refused (`CovectorError`).

    Examples:
        >>> float(largest_slope(Covector((jnp.array([1.0, -3.0]), None)))), largest_slope(Covector((None, None)))
        (3.0, None)
        >>> largest_slope(None) is None
        True
    """
    leaves = jax.tree_util.tree_leaves(unwrap(p_cov))
    for leaf in leaves:
        if shape_of(leaf) is None or real_dtype_mismatch(leaf):
            raise CovectorError(f"largest_slope needs a parameter covector (a Covector, or its "
                                f"value: a pytree of real arrays), got {type(p_cov).__name__} "
                                f"{p_cov!r:.60}")
    if not leaves:
        return None
    return jnp.max(jnp.stack([jnp.max(jnp.abs(leaf)) for leaf in leaves if leaf.size] or [jnp.asarray(0.0)]))


def describe_slope(p_cov) -> str:
    """`largest_slope` in words, for progress lines and error messages.

    Examples:
        >>> describe_slope(Covector((jnp.array([1.0, -3.0]), None)))
        'largest slope 3'
        >>> describe_slope(Covector(None))
        'no movement: no slot has parameters'
    """
    s = largest_slope(p_cov)
    return "no movement: no slot has parameters" if s is None else f"largest slope {float(s):.3g}"


# -- the composition rule as a composite of smooth maps ---------------------------------------

def _path(space: Space, path: str) -> Smooth:
    """The composite of projections picking the factor at `path` (a string of 0/1 digits)."""
    m = smooth_identity(space)
    for d in path:
        m = m >> projection(cast(Product, m.cod), int(d))  # a digit of the path: a product's factor
    return m


def shuffle(space: Space, pattern) -> Smooth:
    """A structural map built from pairings of projections: `pattern` is a path or a pair of patterns."""
    if isinstance(pattern, str):
        return _path(space, pattern)
    left, right = pattern
    return pair(shuffle(space, left), shuffle(space, right))


def _fwd(f: ParaLens) -> Smooth:
    return Smooth(f.dom * f.param, f.cod, lambda ap: f.forward(ap[0], ap[1]), f.name, check=False)


def _bwd(f: ParaLens) -> Smooth:
    def back(ap_b):
        (a, p), b = ap_b
        da, dp = f.backward(a, p, b)
        return (da.value, dp.value)

    return Smooth((f.dom * f.param) * f.cod.tangent, f.dom.tangent * f.param.tangent, back,
                  f"{f.name}'", check=False)


@dataclass
class CompositionRule:
    """K : (A × (P × Q)) × C* → C × (A* × (P* × Q*)), (x, c') ↦ (h(x), h'(x, c')) for h = f ≫ g.

    Examples:
        >>> rule = composition_rule(dense(2, 3), tanh.at(R(3)))
        >>> isinstance(rule, CompositionRule), rule.morphism.dom
        (True, (R^2 × ((R^{3×2} × R^3) × R^0)) × R^3)
    """

    morphism: Smooth
    copies: dict


def composition_rule(f: ParaLens, g: ParaLens) -> CompositionRule:
    """The composite f ≫ g written as one smooth map K (see `CompositionRule`), built from f's and
    g's forward and backward parts by the theory's rule, for comparison with `f >> g`.

    Examples:
        >>> f, g = dense(2, 3), dense(3, 1)
        >>> rule = composition_rule(f, g)
        >>> rule.morphism.cod
        R^1 × (R^2 × ((R^{3×2} × R^3) × (R^{1×3} × R^1)))
    """
    for h in (f, g):
        need_lens(h, "composition_rule")
    f = f.fixed("composition_rule")
    g = g.after(f.cod)  # a family follows f as `>>` would fix it
    check_composable(f, g)
    A, P, B, Q, C = f.dom, f.param, f.cod, g.param, g.cod
    F, F_, G, G_ = _fwd(f), _bwd(f), _fwd(g), _bwd(g)
    one = smooth_identity
    AP, BQ = A * P, B * Q
    x = (A * (P * Q)) * C.tangent
    k = shuffle(x, (("00", "010"), ("011", "1")))                      # ((a,p), (q, c'))
    k = k >> (diagonal(AP) * one(Q * C.tangent))                       # copy (a, p)
    k = k >> ((F * one(AP)) * one(Q * C.tangent))                      # (b, (a,p)), (q, c')
    k = k >> shuffle(k.cod, (("00", "10"), ("01", "11")))              # ((b,q), ((a,p), c'))
    k = k >> (diagonal(BQ) * one(AP * C.tangent))                      # copy (f(a,p), q)
    k = k >> shuffle(k.cod, ("00", ("10", ("01", "11"))))              # (b,q), ((a,p), ((b,q), c'))
    k = k >> (G * (one(AP) * G_))                                      # c, ((a,p), (b', q'))
    k = k >> shuffle(k.cod, ("0", (("10", "110"), "111")))             # c, (((a,p), b'), q')
    k = k >> (one(C) * (F_ * one(Q.tangent)))                          # c, ((a', p'), q')
    k = k >> shuffle(k.cod, ("0", ("100", ("101", "11"))))             # c, (a', (p', q'))
    k.name = f"composition rule of {f.name} ≫ {g.name}"
    return CompositionRule(k, {"(a, p)": 2, "(f(a, p), q)": 2})


__all__ = ["check_backward", "BackwardReport", "largest_slope", "describe_slope",
           "composition_rule", "CompositionRule", "shuffle"]
