"""Parameterised lenses (P, f, f') : A → B: the one protocol every kind of lens implements.

A parameterised lens A → B with parameter object P has a forward part f : A × P → B and a
backward part f' : A × P × B* → A* × P*, the pair of dual maps of f's two partial
differentials. `ParaLens` is the protocol (abstract); `Layer(dom, cod, param, forward)`
(`lenses.layer`) builds the primitive kind, whose backward part JAX derives (`jax.vjp`) or
is supplied (`check_backward` compares it with the derived one and with central finite
differences).

Every kind of lens (layer, chain, parallel product, reparameterisation, recompute rule,
repetition, ...) is a subclass of `ParaLens` and implements the protocol stated in its
docstring; code outside the lens classes asks a lens through the protocol and never asks
which class it is. Composition f ≫ g is defined once (`Chain`): each component's forward part
runs once, then the pullbacks run in reverse order (g' first, f' second) at the kept values,
by `sequence_vjp`, the one reverse-order loop of the library (`repeat` runs the same rule as a
reverse `lax.scan`). The protocol and the three kinds its operators build (`>>`: `Chain`,
`@`: `Parallel`, `reparam`: `Reparam`) live together here: apart they would import each
other. What a lens is given is checked in `lenses.inputs`; its slots' structure in
`lenses.sites`. A family of lenses whose spaces a neighbour fixes (`tanh`, `flatten`,
`conv2d(...)`) is not a lens: see `lenses.families`.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Callable

import jax
import jax.numpy as jnp

from categories import Covector, Product, R, Smooth, Space, check_composable, draws
from categories.errors import CovectorError
from categories.linear import unwrap
from categories.para import Parameterised, slot_uses

from . import picture
from .composable import Composable, refuse_operand
from .inputs import (as_real, check_cotangent, check_finite_covector, check_init, need_chain,
                     need_fixed, need_name, need_reparam)
from .sites import Site


# -- the one reverse-order loop ----------------------------------------------------------------

def sequence_vjp(steps, a):
    """Run `steps` = [(vjp, p), ...] in sequence, each forward part once, values kept; return
    (output, pullback) where the pullback runs the steps' pullbacks in reverse order and gives
    (input covector, tuple of the steps' parameter covectors in step order)."""
    pulls = []
    for vjp, p in steps:
        a, pull = vjp(a, p)
        pulls.append(pull)

    def pullback(c):
        dps = []
        for pull in reversed(pulls):  # g' first, f' second, at the kept values
            c, dp = pull(c)
            dps.append(dp)
        return c, tuple(reversed(dps))

    return a, pullback


# -- the protocol ------------------------------------------------------------------------------

class ParaLens(Composable, Parameterised):
    """A parameterised lens (P, f, f') : A → B (abstract; `Layer(A, B, P, f)` builds the primitive kind).

    Every kind of lens implements:

    - spaces: attributes `dom` (A), `cod` (B), `param` (P), `name`, and `smooth` (whether f is
      smooth, the theory's setting; `relu` is not);
    - evaluation: `apply(a, p, batched)`, the forward part, and `apply_vjp(a, p, batched)`, the
      forward part with the pullback b' ↦ (a', p') at the kept values (raw pytrees); with
      `batched` both run over a leading batch axis and parameter covectors are added over it;
      `derives`: True when the backward part is JAX's derivation of `apply` (no hand-written
      backward part or rule of its own anywhere inside), so that runs of such lenses may be
      handed to `jax.vjp` whole;
    - structure: `children` (the lenses it is built from), `rebuild(children)` (the same kind
      over other children), `parts` (its components in sequence: a chain's, else itself),
      `uses()` (how many times each parameter slot is used, nested like the point),
      `sites()` and `probe(...)` (its parameterised slots and the structure they declare, read
      by structured metrics such as KFAC);
    - initial parameters: `init(key)`;
    - description: `term(inside)` (its term in the lens expression), `picture()` (its piece of
      the string diagram, a `lenses.picture` term), `atoms()` (its primitive lenses).

    Examples:
        >>> scale = Layer(R(2), R(2), R(), lambda a, p: p * a, name="scale")
        >>> scale
        scale : R^2 → R^2, params R
        >>> y, pullback = scale.vjp(jnp.array([1.0, 2.0]), jnp.asarray(3.0))
        >>> a_cov, p_cov = pullback(jnp.array([1.0, 1.0]))
        >>> y.tolist(), unwrap(a_cov).tolist(), float(unwrap(p_cov))
        ([3.0, 6.0], [3.0, 3.0], 3.0)
    """

    dom: Space
    cod: Space
    param: Space
    name: str
    smooth: bool = True
    children: tuple = ()
    #: the lens it is at evaluation (a dropout: the identity), read by `evaluation`; None: itself
    at_evaluation: "ParaLens | None" = None

    # -- evaluation (per kind) ---------------------------------------------------------------
    @abstractmethod
    def apply(self, a, p, batched: bool):
        """The forward part f(a, p)."""

    def apply_vjp(self, a, p, batched: bool):
        """(f(a, p), pullback); by default JAX's derivation of the per-example `apply`, over
        the batch by one `vmap` of the whole (one trace, one vmap, one linearisation)."""
        def f(a, p):
            return self.apply(a, p, False)

        return jax.vjp(jax.vmap(f, (0, None)) if batched else f, a, p)

    @property
    def derives(self) -> bool:
        return all(c.derives for c in self.children)

    # -- structure (per kind) ----------------------------------------------------------------
    @abstractmethod
    def rebuild(self, children: tuple) -> "ParaLens":
        """The same kind of lens built over `children` instead of `self.children`."""

    @property
    def parts(self) -> tuple:
        return (self,)

    def uses(self):
        """How many times each parameter slot is used: 1 for an ordinary slot, 0 for R^0, n for
        a slot shared by n uses; nested like the parameter point."""
        return 0 if self.param.size == 0 else 1

    def sites(self) -> tuple:
        """The parameterised slots, left to right, as `Site`s; a kind whose parameters are not
        its children's points (a reparameterisation, a repetition) is one opaque site."""
        return (Site(self, ()),) if self.param.size else ()

    def probe(self, a, p, deltas, inputs: list):
        """The per-example forward part with the output of each site declaring `Affine`
        perturbed by the next of `deltas`, and its input appended to `inputs` (left to right)."""
        return self.apply(a, p, False)

    def init(self, key):
        """A random initial parameter point."""
        return self.param.sample_interior(key)

    # -- description (per kind) --------------------------------------------------------------
    def term(self, inside: bool = False) -> str:
        """The lens as a term in ≫ and ⊗; `inside` asks for brackets around a chain."""
        return self.name

    @abstractmethod
    def picture(self) -> picture.Picture:
        """Its piece of the string diagram."""

    def atoms(self) -> list:
        return [a for c in self.children for a in c.atoms()]

    def type_str(self) -> str:
        return f"{self.dom!r} → {self.cod!r}"

    def param_repr(self) -> str:
        return _param_str(self.param)

    def __repr__(self) -> str:
        return f"{self.name} : {self.dom!r} → {self.cod!r}, params {self.param_repr()}"

    def _repr_svg_(self):
        """Its string diagram as SVG, for notebooks (None, so the text is shown, without
        matplotlib): drawn by the renderer the drawing module registers (`lenses.picture`)."""
        return picture.svg_of(self)

    # -- families and fixing -----------------------------------------------------------------
    def is_fixed(self) -> bool:
        """A lens has fixed spaces; a family (`lenses.families`) does not."""
        return True

    def fixed(self, who: str = "this") -> "ParaLens":
        """The lens itself (a family raises, saying how to fix it)."""
        return self

    def lift(self, build: Callable, name: str | None = None, endo: bool | None = None):
        """`build(self)`: how a combinator maps lenses to lenses (a family maps its members)."""
        return build(self)

    def after(self, A: Space) -> "ParaLens":
        """What follows a lens with codomain A: a lens as it is (a family fixes itself at A)."""
        return self

    # -- public evaluation -------------------------------------------------------------------
    def _check_point(self, a, p):
        self.dom.check(a, f"the input of {self.name}")
        self.param.check(p, f"the parameter of {self.name}")

    def forward(self, a, p):
        """f(a, p) for one example."""
        self._check_point(a, p)
        return self.apply(a, p, False)

    __call__ = forward

    def vjp(self, a, p):
        """(f(a, p), pullback) with pullback(b') = (a', p') as Covectors, at the kept values."""
        self._check_point(a, p)
        b, pull = self.apply_vjp(as_real(self.dom, a), p, False)
        return b, self.wrap_pullback(pull, out=b)

    def backward(self, a, p, b_cov):
        """f'(a, p, b') = (a', p'): Covectors on A and on P."""
        return self.vjp(a, p)[1](b_cov)

    def wrap_pullback(self, pull, dom: Space | None = None, lead: tuple = (), out=None):
        dom, param, cod, name = dom or self.dom, self.param, self.cod, self.name
        # a batch's covector may be labelled with the codomain or with R^{n × cod}
        labels = (cod.tangent,) + ((R(*lead, *cod.shape),) if lead and not isinstance(
            cod, Product) and not cod.is_terminal else ())

        def pullback(b_cov):
            """(a', p') for the covector b' on the codomain (a `Covector`, or its raw value)."""
            what = f"the covector given to the backward part of {name}"
            check_cotangent(cod, b_cov, what, lead)
            if isinstance(b_cov, Covector) and b_cov.space is not None and \
                    b_cov.space.tangent not in labels:  # the cotangent spaces must agree
                raise CovectorError(f"{what} is a covector on {b_cov.space!r}, but the "
                                    f"codomain of {name} is {cod!r}")
            c = unwrap(b_cov)
            check_finite_covector(c, what)
            if out is not None:  # a covector of ints (or another float width): the output's dtype
                c = jax.tree_util.tree_map(lambda v, o: jnp.asarray(v, o.dtype), c, out)
            da, dp = pull(c)
            return Covector(da, dom), Covector(dp, param)

        return pullback

    # -- composition -------------------------------------------------------------------------
    def __rshift__(self, other):
        if not isinstance(other, Composable):
            refuse_operand(self, ">>", other)
        other = other.after(self.cod)
        check_composable(self, other)
        return Chain(self.parts + other.parts, composed=True)

    def __matmul__(self, other):
        if not isinstance(other, Composable):
            refuse_operand(self, "@", other)
        if not other.is_fixed():
            return NotImplemented  # the family puts itself beside this lens (`__rmatmul__`)
        return Parallel(self, other)

    def reparam(self, r: Smooth, init: Callable | None = None, name: str | None = None):
        """The 2-cell along r : Q → P: the lens (Q, f ∘ (1 × r)); `q' = R[r](q, p')`."""
        return self.lift(lambda lens: Reparam(lens, r, init, name))


def _param_str(space: Space) -> str:
    if isinstance(space, Product):
        return "×".join(_param_str(f) for f in space.factors) or "R^0"
    return repr(space)


# -- composition and the parallel product ------------------------------------------------------

class Chain(ParaLens):
    """f_1 ≫ ... ≫ f_n, parameters P_1 × ... × P_n (one slot per component, however bracketed):
    the composition rule of the theory.

    Examples:
        >>> model = dense(2, 3) >> tanh >> dense(3, 1)
        >>> type(model).__name__, len(model.parts)
        ('Chain', 3)
        >>> [leaf.shape for leaf in jax.tree_util.tree_leaves(model.init(jax.random.PRNGKey(0)))]
        [(3, 2), (3,), (1, 3), (1,)]
    """

    def __init__(self, parts, composed: bool = False):
        # fixed lenses that compose; `composed`: `>>` has checked its junction and each side's
        # parts compose already, so that a fold of n `>>` checks n junctions, not n² pairs
        self.children = parts = tuple(parts) if composed else need_chain(parts, "Chain")
        self.dom, self.cod = parts[0].dom, parts[-1].cod
        self.param = Product(*(p.param for p in parts))
        self.name = " ≫ ".join(p.name for p in parts)
        self.smooth = all(p.smooth for p in parts)
        self._runs = _runs(self.children)
        self._pieces = tuple(self.children[lo] if hi - lo == 1 else _Run(self.children[lo:hi])
                             for lo, hi in self._runs)

    @property
    def parts(self):
        return self.children

    def rebuild(self, children):
        return Chain(children)

    def apply(self, a, ps, batched):
        for part, p in zip(self.children, ps):
            a = part.apply(a, p, batched)
        return a

    def apply_vjp(self, a, ps, batched):
        # A run of derived components goes to JAX as one composite: its reverse mode applies
        # this same rule (pullbacks in reverse at the kept values), and the run is traced once,
        # not once per component (one trace, one vmap, one linearisation). Every other
        # component runs its own backward part, in reverse, through `sequence_vjp`.
        steps = [(lambda a, p, piece=piece: piece.apply_vjp(a, p, batched),
                  ps[lo] if hi - lo == 1 else tuple(ps[lo:hi]))
                 for (lo, hi), piece in zip(self._runs, self._pieces)]
        b, pull = sequence_vjp(steps, a)

        def pullback(c):
            c, dps = pull(c)
            flat = []
            for (lo, hi), dp in zip(self._runs, dps):
                flat.extend([dp] if hi - lo == 1 else dp)
            return c, tuple(flat)

        return b, pullback

    def uses(self):
        return tuple(p.uses() for p in self.children)

    def sites(self):
        return _nested_sites(self.children)

    def probe(self, a, ps, deltas, inputs):
        for part, p in zip(self.children, ps):
            a = part.probe(a, p, deltas, inputs)
        return a

    def init(self, key):
        keys = draws.split(key, len(self.children))
        return tuple(part.init(k) for part, k in zip(self.children, keys))

    def term(self, inside=False):
        body = " ≫ ".join(p.term(True) for p in self.children)
        return f"({body})" if inside else body

    def picture(self):
        return picture.Then(tuple(p.picture() for p in self.children))

    def param_repr(self):
        return " × ".join(_param_str(p.param) for p in self.children)


def _runs(parts) -> tuple:
    """The components cut into maximal runs [lo, hi) of lenses whose backward parts JAX
    derives (a lens with its own backward part is a run of one)."""
    runs, lo = [], 0
    for i, part in enumerate(parts):
        if not part.derives:
            runs += [(lo, i)] if lo < i else []
            runs.append((i, i + 1))
            lo = i + 1
    return tuple(runs + ([(lo, len(parts))] if lo < len(parts) else []))


class _Run:
    """A run of derived components, differentiated by JAX as one composite."""

    def __init__(self, parts):
        self.parts = parts

    def apply(self, a, ps, batched):
        for part, p in zip(self.parts, ps):
            a = part.apply(a, p, batched)
        return a

    apply_vjp = ParaLens.apply_vjp


def _nested_sites(children) -> tuple:
    return tuple(Site(s.lens, (i,) + s.path, s.structure)
                 for i, c in enumerate(children) for s in c.sites())


class Parallel(ParaLens):
    """f ⊗ g : A × C → B × D with parameters P × Q (the monoidal product, written `f @ g`).

    Examples:
        >>> both = dense(2, 1) @ dense(3, 1)
        >>> type(both).__name__, both.dom, both.cod
        ('Parallel', R^2 × R^3, R^1 × R^1)
    """

    def __init__(self, f: ParaLens, g: ParaLens):
        self.children = f, g = need_fixed(f, "Parallel"), need_fixed(g, "Parallel")
        self.dom, self.cod, self.param = f.dom * g.dom, f.cod * g.cod, f.param * g.param
        self.name = f"({f.name} ⊗ {g.name})"
        self.smooth = f.smooth and g.smooth

    def rebuild(self, children):
        return Parallel(*children)

    def apply(self, ac, pq, batched):
        return tuple(h.apply(x, p, batched) for h, x, p in zip(self.children, ac, pq))

    def apply_vjp(self, ac, pq, batched):
        (b, pf), (d, pg) = (h.apply_vjp(x, p, batched) for h, x, p in zip(self.children, ac, pq))

        def pullback(bd):
            (da, dp), (dc, dq) = pf(bd[0]), pg(bd[1])
            return (da, dc), (dp, dq)

        return (b, d), pullback

    def uses(self):
        return tuple(h.uses() for h in self.children)

    def sites(self):
        return _nested_sites(self.children)

    def probe(self, ac, pq, deltas, inputs):
        return tuple(h.probe(x, p, deltas, inputs) for h, x, p in zip(self.children, ac, pq))

    def init(self, key):
        return tuple(h.init(k) for h, k in zip(self.children, draws.split(key, 2)))

    def term(self, inside=False):
        f, g = self.children
        return f"({f.term(True)} ⊗ {g.term(True)})"

    def picture(self):
        return picture.Beside(tuple(h.picture() for h in self.children))

    def param_repr(self):
        f, g = self.children
        return f"({f.param_repr()}) × ({g.param_repr()})"


# -- reparameterisation (2-cells) --------------------------------------------------------------

class Reparam(ParaLens):
    """(Q, f ∘ (1_A × r)) for r : Q → P; the parameter covector is pulled back through R[r].

    Examples:
        >>> r = Smooth(R(), R(1, 1), lambda q: jnp.reshape(q, (1, 1)), "w")
        >>> tied = linear(1, 1).reparam(r)
        >>> type(tied).__name__, tied.param
        ('Reparam', R)
        >>> float(tied(jnp.array([2.0]), jnp.asarray(3.0))[0])
        6.0
    """

    def __init__(self, lens: ParaLens, r: Smooth, init=None, name=None):
        need_reparam(r, init, (lens := need_fixed(lens, "reparam")).name, lens.param)
        self.children, self.r, self._init = (lens,), r, init
        self.dom, self.cod, self.param = lens.dom, lens.cod, r.dom
        self.name = need_name(name, f"{lens.name}.reparam") or f"{lens.name}[{r.name}]"
        self.smooth = lens.smooth

    @property
    def lens(self):
        return self.children[0]

    def rebuild(self, children):
        return Reparam(children[0], self.r, self._init, self.name)

    def apply(self, a, q, batched):
        return self.lens.apply(a, self.r.fn(q), batched)

    def apply_vjp(self, a, q, batched):
        p, r_pull = jax.vjp(self.r.fn, q)
        b, pull = self.lens.apply_vjp(a, p, batched)

        def pullback(bc):
            da, dp = pull(bc)
            return da, r_pull(dp)[0]

        return b, pullback

    def uses(self):
        inner = self.lens.uses()
        inner = inner if isinstance(self.r.cod, Product) else (inner,)
        total = lambda u: max(jax.tree_util.tree_leaves(u), default=0)  # noqa: E731
        counts = slot_uses(self.r, [total(u) for u in inner])
        return counts[0] if self.r.one_slot else counts

    def init(self, key):
        if self._init is not None:
            return check_init(self._init(key), self.param, self.name)
        section = self.r.section  # a left inverse of r (a tying map's): keep the lens's slots
        return section(self.lens.init(key)) if section else self.param.sample_interior(key)

    def term(self, inside=False):
        inner = self.lens
        if self.name != f"{inner.name}[{self.r.name}]" and inner.name in self.name:
            # a named reparameterisation (e.g. `tie`) that quotes its lens: keep the user's name
            return self.name.replace(inner.name, inner.term(), 1)
        return f"{inner.term(True)}[{self.r.name}]"

    def picture(self):
        return picture.Framed(f"reparam {self.r.name}", self.lens.picture(), self.param)


__all__ = ["ParaLens", "Chain", "Parallel", "Reparam", "sequence_vjp"]
