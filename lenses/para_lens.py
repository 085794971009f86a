"""Parameterised lenses: the triple (P, f, f') of the theory.

A `ParaLens` A → B with parameter object P has a forward part f : A × P → B and a backward part
f' : A × P × B* → A* × P*, the pair of dual maps of f's two partial differentials. By default f'
is derived from f with `jax.vjp`; a hand-written one may be supplied (`check_backward` compares
it with the derived one and with central finite differences).

Every lens is evaluated through one method, `_vjp(a, p, batched)`, which runs the forward part
and returns the output with a pullback b' ↦ (a', p') that closes over the values the forward
pass kept. Composition f ≫ g is defined once, in `ParaChain._vjp`: each component's forward
runs once, then the pullbacks run in reverse order (g' first, f' second) at the stored f(a, p).
With `batched=True` the same traversal runs over a leading batch axis: the forward parts are
`jax.vmap`ped, and the parameter covectors come out **added** over the batch (the pullback of
a vmapped map with respect to an unmapped argument sums, which is the theory's rule that
covectors landing on one parameter object are added).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from categories import Covector, Product, R, Smooth, Space
from categories.linear import unwrap
from categories.para import chain_param, check_composable, slot_uses, tying_map

tree_map = jax.tree_util.tree_map


def _abstract(space: Space):
    """A ShapeDtypeStruct pytree standing for a point of `space` (for shape inference)."""
    if isinstance(space, Product):
        return tuple(_abstract(f) for f in space.factors)
    if space.is_terminal:
        return None
    return jax.ShapeDtypeStruct(space.shape, jnp.zeros(()).dtype)


def _shape_mismatch(space: Space, x) -> str | None:
    """None if the (abstract) value x has the structure and shapes of `space`, else why not."""
    if isinstance(space, Product):
        if not isinstance(x, tuple) or len(x) != len(space.factors):
            return f"expected a tuple of {len(space.factors)} for {space!r}, got {type(x).__name__}"
        for f, xi in zip(space.factors, x):
            why = _shape_mismatch(f, xi)
            if why:
                return why
        return None
    if space.is_terminal:
        return None if x is None else f"expected None for R^0, got shape {getattr(x, 'shape', x)}"
    shape = getattr(x, "shape", None)
    if shape is None or tuple(shape) != tuple(space.shape):
        return f"expected shape {tuple(space.shape)} for {space!r}, got {shape if shape is not None else x!r}"
    return None


def _param_str(space: Space) -> str:
    if isinstance(space, Product):
        return "×".join(_param_str(f) for f in space.factors) or "R^0"
    return repr(space)


class ParaLens:
    """A parameterised lens (P, f, f') : A → B."""

    smooth = True

    def __init__(self, dom: Space, cod: Space, param: Space, forward: Callable,
                 backward: Callable | None = None, name: str | None = None,
                 init: Callable | None = None, smooth: bool = True, check: bool = True):
        self.dom, self.cod, self.param = dom, cod, param
        self._forward = forward
        self._backward = backward
        self.name = name or getattr(forward, "__name__", "f")
        self._init = init
        self.smooth = smooth
        if check:
            self._check_forward_shape()

    def _check_forward_shape(self):
        try:
            out = jax.eval_shape(self._forward, _abstract(self.dom), _abstract(self.param))
        except Exception as e:  # noqa: BLE001 - re-raised with the lens's name
            raise TypeError(f"the forward part of {self.name} : {self.dom!r} → {self.cod!r} "
                            f"(params {self.param!r}) fails on a point of its domain: {e}") from e
        why = _shape_mismatch(self.cod, out)
        if why:
            raise TypeError(f"the forward part of {self.name} does not land in its codomain "
                            f"{self.cod!r}: {why}")

    # -- the one evaluation method -----------------------------------------------------------
    @property
    def parts(self) -> tuple:
        return (self,)

    def _vjp(self, a, p, batched: bool):
        f = jax.vmap(self._forward, (0, None)) if batched else self._forward
        if self._backward is None:
            b, pull = jax.vjp(f, a, p)
            return b, pull
        b = f(a, p)
        back = self._backward
        if not batched:
            return b, lambda bc: back(a, p, bc)

        def pull(bc):
            da, dp = jax.vmap(back, (0, None, 0))(a, p, bc)
            return da, tree_map(lambda x: jnp.sum(x, axis=0), dp)

        return b, pull

    def _apply(self, a, p, batched: bool):
        return (jax.vmap(self._forward, (0, None)) if batched else self._forward)(a, p)

    # -- public evaluation -------------------------------------------------------------------
    def forward(self, a, p):
        """f(a, p) for one example."""
        return self._apply(a, p, False)

    __call__ = forward

    def vjp(self, a, p):
        """(f(a, p), pullback) with pullback(b') = (a', p') as Covectors, using the stored forward values."""
        b, pull = self._vjp(a, p, False)
        return b, self._wrap(pull)

    def backward(self, a, p, b_cov):
        """f'(a, p, b') = (a', p'): Covectors on A and on P."""
        return self.vjp(a, p)[1](b_cov)

    def _wrap(self, pull):
        dom, param = self.dom, self.param

        def pullback(b_cov):
            da, dp = pull(unwrap(b_cov))
            return Covector(da, dom), Covector(dp, param)

        return pullback

    # -- composition -------------------------------------------------------------------------
    def __rshift__(self, other: "ParaLens") -> "ParaLens":
        if not isinstance(other, ParaLens):
            return NotImplemented
        left, right = self, other
        if isinstance(right, Polymorphic) and not isinstance(left, Polymorphic):
            right = right.at(left.cod)
        elif isinstance(left, Polymorphic) and not isinstance(right, Polymorphic):
            left = left.at_cod(right.dom)
        elif isinstance(left, Polymorphic):
            return Polymorphic(lambda A: left.at(A) >> right, f"{left.name} ≫ {right.name}",
                               left.shape_preserving and right.shape_preserving)
        return _then(left, right)

    def __matmul__(self, other: "ParaLens") -> "ParaLens":
        return Parallel(self, other)

    def reparam(self, r: Smooth, init: Callable | None = None, name: str | None = None) -> "ParaLens":
        """The 2-cell along r : Q → P: the lens (Q, f ∘ (1 × r)); q' = R[r](q, p')."""
        return Reparam(self, r, init, name)

    # -- initial parameters, description -----------------------------------------------------
    def init(self, key):
        """A random initial parameter point (the layer's own initialiser)."""
        if self._init is not None:
            return self._init(key)
        return self.param.sample_interior(key)

    def __repr__(self) -> str:
        return f"{self.name} : {self.dom!r} → {self.cod!r}, params {self.param_repr()}"

    def param_repr(self) -> str:
        ps = self.param.factors if isinstance(self, ParaChain) else (self.param,)
        return " × ".join(_param_str(p) for p in ps)


def _then(f: ParaLens, g: ParaLens) -> "ParaChain":
    check_composable(f, g)
    return ParaChain(f.parts + g.parts)


class ParaChain(ParaLens):
    """f_1 ≫ ... ≫ f_n, parameters P_1 × ... × P_n: the composition rule of the theory."""

    def __init__(self, parts):
        self._parts = tuple(parts)
        ParaLens.__init__(self, parts[0].dom, parts[-1].cod, chain_param(parts), self._run,
                          name=" ≫ ".join(p.name for p in parts), check=False)
        self.smooth = all(p.smooth for p in parts)

    @property
    def parts(self):
        return self._parts

    def _run(self, a, ps):
        return self._apply(a, ps, False)

    def _apply(self, a, ps, batched):
        for part, p in zip(self._parts, ps):
            a = part._apply(a, p, batched)
        return a

    def _vjp(self, a, ps, batched):
        pulls = []
        for part, p in zip(self._parts, ps):  # forward: each component once, values kept
            a, pull = part._vjp(a, p, batched)
            pulls.append(pull)

        def pullback(c):  # backward: reverse order, at the kept values
            dps = [None] * len(pulls)
            for i in range(len(pulls) - 1, -1, -1):
                c, dps[i] = pulls[i](c)
            return c, tuple(dps)

        return a, pullback

    def init(self, key):
        keys = jax.random.split(key, len(self._parts))
        return tuple(part.init(k) for part, k in zip(self._parts, keys))


class Parallel(ParaLens):
    """f ⊗ g : A × C → B × D with parameters P × Q (the monoidal product, written `f @ g`)."""

    def __init__(self, f: ParaLens, g: ParaLens):
        for h in (f, g):
            if isinstance(h, Polymorphic):
                raise TypeError(f"{h.name} has no fixed space: give it one (e.g. {h.name}.at(R(3))) "
                                "before putting it in parallel")
        self.f, self.g = f, g
        ParaLens.__init__(self, f.dom * g.dom, f.cod * g.cod, f.param * g.param, self._run,
                          name=f"({f.name} ⊗ {g.name})", check=False)
        self.smooth = f.smooth and g.smooth

    def _run(self, a, p):
        return self._apply(a, p, False)

    def _apply(self, ac, pq, batched):
        return (self.f._apply(ac[0], pq[0], batched), self.g._apply(ac[1], pq[1], batched))

    def _vjp(self, ac, pq, batched):
        b, pf = self.f._vjp(ac[0], pq[0], batched)
        d, pg = self.g._vjp(ac[1], pq[1], batched)

        def pullback(bd):
            da, dp = pf(bd[0])
            dc, dq = pg(bd[1])
            return (da, dc), (dp, dq)

        return (b, d), pullback

    def init(self, key):
        k1, k2 = jax.random.split(key)
        return (self.f.init(k1), self.g.init(k2))

    def param_repr(self):
        return f"({self.f.param_repr()}) × ({self.g.param_repr()})"


class Reparam(ParaLens):
    """(Q, f ∘ (1_A × r)) for r : Q → P; the parameter covector is pulled back through R[r]."""

    def __init__(self, lens: ParaLens, r: Smooth, init=None, name=None):
        if r.cod != lens.param:
            raise TypeError(f"cannot reparameterise {lens.name} (parameters {lens.param!r}) along "
                            f"{r.name} : {r.dom!r} → {r.cod!r}")
        self.lens, self.r = lens, r
        ParaLens.__init__(self, lens.dom, lens.cod, r.dom, self._run,
                          name=name or f"{lens.name}[{r.name}]", init=init, check=False)
        self.smooth = lens.smooth

    def _run(self, a, q):
        return self._apply(a, q, False)

    def _apply(self, a, q, batched):
        return self.lens._apply(a, self.r.fn(q), batched)

    def _vjp(self, a, q, batched):
        p, r_pull = jax.vjp(self.r.fn, q)
        b, pull = self.lens._vjp(a, p, batched)

        def pullback(bc):
            da, dp = pull(bc)
            return da, r_pull(dp)[0]

        return b, pullback


def tie(lens: ParaLens, slots) -> ParaLens:
    """Share parameter slots along the diagonal; the shared slot receives the sum of the covectors."""
    r = tying_map(lens.param, slots)
    keep = sorted(set(range(len(lens.param.factors))) - set(sorted(slots)[1:]))

    def init(key):
        p = lens.init(key)
        return p[keep[0]] if len(keep) == 1 else tuple(p[i] for i in keep)

    return Reparam(lens, r, init=init, name=f"tie({lens.name}, {sorted(slots)})")


def uses(lens: ParaLens):
    """How many times each parameter slot is used: 1 for an ordinary slot, 0 for R^0,
    n for a slot shared by n uses; nested like the parameter point."""
    if isinstance(lens, Checkpointed):
        return uses(lens.lens)
    if isinstance(lens, ParaChain):
        return tuple(uses(p) for p in lens.parts)
    if isinstance(lens, Parallel):
        return (uses(lens.f), uses(lens.g))
    if isinstance(lens, Reparam):
        inner = uses(lens.lens)
        inner = inner if isinstance(lens.r.cod, Product) else (inner,)
        counts = slot_uses(lens.r, [_total(u) for u in inner])
        return counts if isinstance(lens.r.dom, Product) else counts[0]
    return 0 if lens.param.size == 0 else 1


def _total(u) -> int:
    return max(jax.tree_util.tree_leaves(u), default=0) if isinstance(u, tuple) else u


class Checkpointed(ParaLens):
    """The recompute rule: same values and covectors, but the backward pass recomputes the
    forward values from (a, p) instead of keeping them (`jax.checkpoint`)."""

    def __init__(self, lens: ParaLens, policy=None):
        self.lens, self.policy = lens, policy
        ParaLens.__init__(self, lens.dom, lens.cod, lens.param, self._run,
                          name=f"checkpoint({lens.name})", check=False)
        self.smooth = lens.smooth

    def _run(self, a, p):
        return self.lens._apply(a, p, False)

    def _apply(self, a, p, batched):
        return self.lens._apply(a, p, batched)

    def _vjp(self, a, p, batched):
        inner = self.lens

        def run(a, p):
            return inner._apply(a, p, batched)

        # The inner lens's own pullbacks (hand-written ones included) are reused: the whole
        # inner forward+backward is re-run inside a rematerialised region, keeping only (a, p).
        @jax.custom_vjp
        def f(a, p):
            return run(a, p)

        def f_fwd(a, p):
            return run(a, p), (a, p)

        def f_bwd(res, bc):
            a, p = res
            return jax.checkpoint(lambda a, p, bc: inner._vjp(a, p, batched)[1](bc),
                                  policy=self.policy)(a, p, bc)

        f.defvjp(f_fwd, f_bwd)
        return jax.vjp(f, a, p)

    def init(self, key):
        return self.lens.init(key)

    def param_repr(self):
        return self.lens.param_repr()


def checkpoint(lens: ParaLens, policy=None) -> ParaLens:
    """The recompute rule (gradient checkpointing) for `lens`."""
    return Checkpointed(lens, policy)


class Polymorphic(ParaLens):
    """A lens family whose spaces are fixed by what it is composed with (activations,
    `flatten`, pooling): `layer.at(A)` gives the lens with domain A."""

    def __init__(self, make: Callable[[Space], ParaLens], name: str, shape_preserving=False):
        self._make, self.name = make, name
        self.shape_preserving = shape_preserving
        self.dom = self.cod = self.param = None
        self.smooth = True
        self._cache = {}

    def at(self, A: Space) -> ParaLens:
        if A not in self._cache:
            self._cache[A] = self._make(A)
        return self._cache[A]

    def at_cod(self, B: Space) -> ParaLens:
        if not self.shape_preserving:
            raise TypeError(f"{self.name} cannot infer its domain from what follows it ({B!r}): "
                            f"give it one, e.g. {self.name}.at(R(...))")
        return self.at(B)

    def _vjp(self, a, p, batched):
        raise TypeError(f"{self.name} has no fixed domain yet: use {self.name}.at(space)")

    _apply = _vjp

    def __repr__(self):
        return f"{self.name} (any domain)"


class Batched:
    """The per-example traversal of `lens` over a leading batch axis of the input.

    The parameter covectors of the examples are **added** (the batch score is a sum of
    per-example scores; theory: "The Loss Closes the Loop").
    """

    def __init__(self, lens: ParaLens):
        self.lens = lens

    def forward(self, A, p):
        return self.lens._apply(A, p, True)

    __call__ = forward

    def vjp(self, A, p):
        b, pull = self.lens._vjp(A, p, True)
        return b, self.lens._wrap(pull)

    def backward(self, A, p, B_cov):
        return self.vjp(A, p)[1](B_cov)

    def __repr__(self):
        return f"batched({self.lens!r})"


def batched(lens: ParaLens) -> Batched:
    return Batched(lens)


def derived(lens: ParaLens) -> ParaLens:
    """The same forward part with the backward part derived by JAX (for comparisons)."""
    return ParaLens(lens.dom, lens.cod, lens.param, lens.forward, name=lens.name, check=False)


def n_params(lens: ParaLens) -> int:
    """The dimension of the parameter object."""
    return lens.param.size

