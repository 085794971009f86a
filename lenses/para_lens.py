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

import math
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

from categories import Covector, Product, R, Smooth, Space
from categories.linear import unwrap
from categories.para import chain_param, check_composable, one_slot, slot_uses, tying_map

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

    @property
    def _derives(self) -> bool:
        """True when this lens's backward part is the one JAX derives from `_apply` (no
        hand-written backward part and no rule of its own, such as recomputation, anywhere
        inside), so that a run of such lenses may be handed to `jax.vjp` as one composite."""
        return self._backward is None and type(self)._vjp is ParaLens._vjp

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
    def _check_point(self, a, p):
        self.dom.check(a, f"the input of {self.name}")
        self.param.check(p, f"the parameter of {self.name}")

    def forward(self, a, p):
        """f(a, p) for one example."""
        self._check_point(a, p)
        return self._apply(a, p, False)

    __call__ = forward

    def vjp(self, a, p):
        """(f(a, p), pullback) with pullback(b') = (a', p') as Covectors, using the stored forward values."""
        self._check_point(a, p)
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
            family = Polymorphic(lambda A: left.at(A) >> right, f"{left.name} ≫ {right.name}",
                                 left.shape_preserving and right.shape_preserving)
            family.smooth = left.smooth and right.smooth
            return family
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

    @property
    def _derives(self):
        return all(part._derives for part in self._parts)

    @property
    def _runs(self):
        """The components cut into maximal runs [lo, hi) of lenses whose backward parts JAX
        derives (a lens with its own backward part is a run of one)."""
        if self.__dict__.get("_runs_cache") is None:
            runs, lo = [], 0
            for i, part in enumerate(self._parts):
                if not part._derives:
                    if lo < i:
                        runs.append((lo, i))
                    runs.append((i, i + 1))
                    lo = i + 1
            if lo < len(self._parts):
                runs.append((lo, len(self._parts)))
            self._runs_cache = tuple(runs)
        return self._runs_cache

    def _vjp(self, a, ps, batched):
        # A run of derived components goes to JAX as one composite: its reverse mode applies
        # this same rule (pullbacks in reverse order at the kept forward values), and the run
        # is traced once, not once per component (one trace, one vmap, one linearisation).
        pulls = []
        for lo, hi in self._runs:  # forward: each component once, values kept
            if hi - lo == 1:
                a, pull = self._parts[lo]._vjp(a, ps[lo], batched)
            else:
                run = _run_of(self._parts[lo:hi])
                a, pull = jax.vjp(jax.vmap(run, (0, None)) if batched else run, a, tuple(ps[lo:hi]))
            pulls.append(pull)

        def pullback(c):  # backward: reverse order, at the kept values
            dps = [None] * len(self._parts)
            for (lo, hi), pull in zip(reversed(self._runs), reversed(pulls)):
                if hi - lo == 1:
                    c, dps[lo] = pull(c)
                else:
                    c, dps[lo:hi] = pull(c)
            return c, tuple(dps)

        return a, pullback

    def init(self, key):
        keys = jax.random.split(key, len(self._parts))
        return tuple(part.init(k) for part, k in zip(self._parts, keys))


def _run_of(parts):
    """The per-example forward part of the composite of `parts`."""
    def run(a, ps):
        for part, p in zip(parts, ps):
            a = part._apply(a, p, False)
        return a

    return run


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

    @property
    def _derives(self):
        return self.f._derives and self.g._derives

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

    @property
    def _derives(self):
        return self.lens._derives

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
        return counts[0] if one_slot(lens.r) else counts
    return 0 if lens.param.size == 0 else 1


def _total(u) -> int:
    return max(jax.tree_util.tree_leaves(u), default=0) if isinstance(u, tuple) else u


def _always_true():
    """A true predicate that XLA cannot evaluate at compile time (a draw u ∈ [0, 1) and u < 2).

    XLA's CPU pipeline drops optimisation barriers before common-subexpression elimination, so
    a recomputation in the same computation as the forward pass is merged back into it and
    nothing is saved (`jax.checkpoint` itself saves nothing there). A branch of a conditional
    is a computation of its own, out of CSE's reach; this predicate keeps the branch taken.
    """
    return lax.rng_uniform(jnp.float32(0), jnp.float32(1), ()) < 2


def _recomputing_vjp(inner: ParaLens, a, p, batched: bool, policy=None):
    """The recompute rule for one lens: keep (a, p) only; run inner's own forward and backward
    parts again (hand-written ones included) when the covector arrives."""
    if policy is not None:  # JAX's remat decides what is kept (its derivation of the forward)
        return jax.vjp(jax.checkpoint(lambda a, p: inner._apply(a, p, batched), policy=policy), a, p)

    @jax.custom_vjp
    def f(a, p):
        return inner._apply(a, p, batched)

    def f_fwd(a, p):
        return inner._apply(a, p, batched), (a, p)

    def f_bwd(res, bc):
        def again(args):
            a, p, bc = args
            return inner._vjp(a, p, batched)[1](bc)

        def never(args):  # not taken; it only gives the conditional its second branch
            return tree_map(jnp.zeros_like, args[:2])

        return lax.cond(_always_true(), again, never, (*res, bc))

    f.defvjp(f_fwd, f_bwd)
    return jax.vjp(f, a, p)


class Checkpointed(ParaLens):
    """The recompute rule: same values and covectors, but the backward pass recomputes the
    forward values from (a, p) instead of keeping them.

    With `segments=k` a chain is cut into k consecutive runs of components, each recomputed
    on its own: the forward pass keeps only the k values entering the runs, and the backward
    pass holds the intermediates of one run at a time (k ≈ √n gives memory ∝ √n for n
    components, at the price of one more forward evaluation). The parameter point is the
    lens's own, one slot per component."""

    def __init__(self, lens: ParaLens, policy=None, segments=None):
        self.lens, self.policy = lens, policy
        n = len(lens.parts) if isinstance(lens, ParaChain) else 1
        if segments is None:
            k = 1
        elif segments == "sqrt":
            k = max(1, round(math.sqrt(n)))
        elif isinstance(segments, int) and segments >= 1:
            k = min(segments, n)
        else:
            raise ValueError(f"segments must be a positive integer or 'sqrt', got {segments!r}")
        self.segments = tuple((n * i // k, n * (i + 1) // k) for i in range(k))
        self._pieces = (lens,) if k == 1 else tuple(
            ParaChain(lens.parts[lo:hi]) if hi - lo > 1 else lens.parts[lo] for lo, hi in self.segments)
        name = f"checkpoint({lens.name})" if segments is None else f"checkpoint({lens.name}, segments={k})"
        ParaLens.__init__(self, lens.dom, lens.cod, lens.param, self._run, name=name, check=False)
        self.smooth = lens.smooth

    def _run(self, a, p):
        return self.lens._apply(a, p, False)

    def _apply(self, a, p, batched):
        return self.lens._apply(a, p, batched)

    def _vjp(self, a, p, batched):
        if len(self._pieces) == 1:
            return _recomputing_vjp(self.lens, a, p, batched, self.policy)
        pulls = []
        for (lo, hi), piece in zip(self.segments, self._pieces):
            a, pull = _recomputing_vjp(piece, a, tuple(p[lo:hi]) if hi - lo > 1 else p[lo],
                                       batched, self.policy)
            pulls.append(pull)

        def pullback(c):
            dps = [None] * len(self.lens.parts)
            for (lo, hi), pull in zip(reversed(self.segments), reversed(pulls)):
                c, dp = pull(c)
                if hi - lo > 1:
                    dps[lo:hi] = dp
                else:
                    dps[lo] = dp
            return c, tuple(dps)

        return a, pullback

    def init(self, key):
        return self.lens.init(key)

    def param_repr(self):
        return self.lens.param_repr()


def checkpoint(lens: ParaLens, policy=None, segments=None) -> ParaLens:
    """The recompute rule (gradient checkpointing) for `lens`; `segments=k` (or "sqrt") cuts a
    chain into k runs recomputed one at a time."""
    return Checkpointed(lens, policy, segments)


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
        self.lens.param.check(p, f"the parameter of {self.lens.name}")
        return self.lens._apply(A, p, True)

    __call__ = forward

    def vjp(self, A, p):
        self.lens.param.check(p, f"the parameter of {self.lens.name}")
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

