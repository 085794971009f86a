"""Parameterised lenses (P, f, f') : A → B, and the one protocol every kind of lens implements.

A parameterised lens A → B with parameter object P has a forward part f : A × P → B and a
backward part f' : A × P × B* → A* × P*, the pair of dual maps of f's two partial
differentials. `ParaLens(dom, cod, param, forward)` builds the primitive kind, a `Layer`, whose
backward part JAX derives (`jax.vjp`); a hand-written one may be supplied (`check_backward`
compares it with the derived one and with central finite differences).

Every kind of lens (layer, chain, parallel product, reparameterisation, recompute rule,
repetition, ...) is a subclass of `ParaLens` and implements the protocol stated in its
docstring; code outside the lens classes asks a lens through the protocol and never asks
which class it is. Composition f ≫ g is defined once (`Chain`): each component's forward part
runs once, then the pullbacks run in reverse order (g' first, f' second) at the kept values,
by `sequence_vjp`, the one reverse-order loop of the library (`repeat` runs the same rule as a
reverse `lax.scan`). The protocol and the three kinds its operators build (`>>`: `Chain`,
`@`: `Parallel`, `reparam`: `Reparam`) live together here, which is why this module is
longer than the others: apart they would import each other. A family of lenses whose spaces
a neighbour fixes (`tanh`, `flatten`, `conv2d(...)`) is not a lens: see `lenses.families`.
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from categories import Covector, Product, R, Smooth, Space, Vector, check_composable, draws
from categories.errors import CovectorError, DomainError, KindError, ShapeError, SpaceMismatch
from categories import para_tie as _tie_para
from categories.linear import unwrap
from categories.para import one_slot, slot_uses

from .drawing import picture

tree_map = jax.tree_util.tree_map


# -- what structured metrics may read ----------------------------------------------------------

@dataclass(frozen=True)
class Affine:
    """Declared by a layer R^n → R^m whose forward part is a ↦ W a + b (`bias=True`, parameter
    (W, b)) or a ↦ W a (parameter W), W of shape (m, n): its Kronecker factors are built from
    its input a and from the covector at its output W a (+ b). `transposed=True`: the slot
    holds Wᵀ, of shape (n, m), in W's place (a ↦ a Wᵀ, as Flax keeps its kernel).

    Examples:
        >>> [site.structure for site in (dense(2, 3) >> tanh >> linear(3, 1)).sites()]
        [Affine(bias=True, transposed=False), Affine(bias=False, transposed=False)]
    """

    bias: bool
    transposed: bool = False


@dataclass(frozen=True)
class Site:
    """A parameterised slot of a model: the lens that owns it, the path of indices to its point
    inside the model's parameter point, and the structure the lens declares (None: nothing).

    Examples:
        >>> [site.path for site in (dense(2, 3) >> tanh >> dense(3, 1)).sites()]
        [(0,), (2,)]
    """

    lens: "ParaLens"
    path: tuple
    structure: Any = None

    def get(self, p):
        for i in self.path:
            p = p[i]
        return p


def at_path(p, path: tuple, value):
    """The point p with the entry at `path` replaced by `value` (tuples rebuilt, not mutated)."""
    if not path:
        return value
    parts = list(p)
    parts[path[0]] = at_path(parts[path[0]], path[1:], value)
    return tuple(parts)


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

class _Builds(ABCMeta):
    # `ParaLens(dom, cod, param, forward)` is the theory's (P, f, f'), derived f': it builds the
    # primitive kind, `Layer`. Every other kind is built by its combinator.
    def __call__(cls, *args, **kw):
        return super().__call__(*args, **kw) if cls is not ParaLens else Layer(*args, **kw)


class ParaLens(metaclass=_Builds):
    """A parameterised lens (P, f, f') : A → B (abstract; `ParaLens(A, B, P, f)` builds a `Layer`).

    Every kind of lens implements:

    - spaces: attributes `dom` (A), `cod` (B), `param` (P), `name`, and `smooth` (whether f is
      smooth, the theory's setting; `relu` is not);
    - evaluation: `_apply(a, p, batched)`, the forward part, and `_vjp(a, p, batched)`, the
      forward part with the pullback b' ↦ (a', p') at the kept values (raw pytrees); with
      `batched` both run over a leading batch axis and parameter covectors are added over it;
      `derives`: True when the backward part is JAX's derivation of `_apply` (no hand-written
      backward part or rule of its own anywhere inside), so that runs of such lenses may be
      handed to `jax.vjp` whole;
    - structure: `children` (the lenses it is built from), `rebuild(children)` (the same kind
      over other children), `parts` (its components in sequence: a chain's, else itself),
      `uses()` (how many times each parameter slot is used, nested like the point),
      `sites()` and `_probe(...)` (its parameterised slots and the structure they declare, read
      by structured metrics such as KFAC);
    - initial parameters: `init(key)`;
    - description: `term(inside)` (its term in the lens expression), `picture()` (its piece of
      the string diagram, a `lenses.drawing.picture` term), `atoms()` (its primitive lenses).

    Examples:
        >>> scale = ParaLens(R(2), R(2), R(), lambda a, p: p * a, name="scale")
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

    # -- evaluation (per kind) ---------------------------------------------------------------
    @abstractmethod
    def _apply(self, a, p, batched: bool):
        """The forward part f(a, p)."""

    def _vjp(self, a, p, batched: bool):
        """(f(a, p), pullback); by default JAX's derivation of the per-example `_apply`, over
        the batch by one `vmap` of the whole (one trace, one vmap, one linearisation)."""
        def f(a, p):
            return self._apply(a, p, False)

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

    def _probe(self, a, p, deltas, inputs: list):
        """The per-example forward part with the output of each site declaring `Affine`
        perturbed by the next of `deltas`, and its input appended to `inputs` (left to right)."""
        return self._apply(a, p, False)

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
        matplotlib)."""
        try:
            from .drawing.diagrams import svg
            return svg(self)
        except ImportError:
            return None

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
        return self._apply(a, p, False)

    __call__ = forward

    def vjp(self, a, p):
        """(f(a, p), pullback) with pullback(b') = (a', p') as Covectors, at the kept values."""
        self._check_point(a, p)
        b, pull = self._vjp(as_real(self.dom, a), p, False)
        return b, self._wrap(pull, out=b)

    def backward(self, a, p, b_cov):
        """f'(a, p, b') = (a', p'): Covectors on A and on P."""
        return self.vjp(a, p)[1](b_cov)

    def _wrap(self, pull, dom: Space | None = None, lead: tuple = (), out=None):
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
            _check_finite(c, what)
            if out is not None:  # a covector of integers (or of another float width) is one of
                c = tree_map(lambda v, o: jnp.asarray(v, o.dtype), c, out)  # the output's dtype
            da, dp = pull(c)
            return Covector(da, dom), Covector(dp, param)

        return pullback

    # -- composition -------------------------------------------------------------------------
    def __rshift__(self, other):
        if not hasattr(other, "after"):
            return NotImplemented
        other = other.after(self.cod)
        check_composable(self, other)
        return Chain(self.parts + other.parts)

    def __matmul__(self, other):
        if not hasattr(other, "after"):
            return NotImplemented
        if not other.is_fixed():
            return NotImplemented  # the family puts itself beside this lens (`__rmatmul__`)
        return Parallel(self, other)

    def reparam(self, r: Smooth, init: Callable | None = None, name: str | None = None):
        """The 2-cell along r : Q → P: the lens (Q, f ∘ (1 × r)); `q' = R[r](q, p')`."""
        return self.lift(lambda lens: Reparam(lens, r, init, name))


def as_real(space: Space, a):
    """a with its integer leaves as floats (the default float type) where they are points of
    R^n, whose covectors must be real too (JAX would give integers a `float0` one); leaves on
    a discrete space (`discrete`: token ids, PRNG keys) keep their integer dtype, since
    rounding them changes the point (a key in float32 is another key), and their covector is
    JAX's float0 zero."""
    if isinstance(space, Product):
        if not isinstance(a, tuple):
            return a
        return tuple(as_real(f, x) for f, x in zip(space.factors, a))
    if getattr(space, "discrete", False) or a is None:
        return a
    return tree_map(lambda v: jnp.asarray(v, jnp.result_type(float))
                    if jnp.issubdtype(jnp.result_type(v), jnp.integer) else v, a)


def need_lens(x, who: str) -> None:
    """Refuse (`KindError`) what is neither a lens nor a family of lenses."""
    if not (callable(getattr(x, "lift", None)) and callable(getattr(x, "is_fixed", None))):
        raise KindError(f"{who} needs a lens (e.g. dense(2, 3)) or a family of lenses "
                        f"(e.g. tanh), got {type(x).__name__} {x!r}")


def _leaf_shapes(space: Space, lead: tuple):
    """The shapes of the leaves of a point of `space` (None for R^0), nested like the point."""
    if isinstance(space, Product):
        return tuple(_leaf_shapes(f, lead) for f in space.factors)
    return None if space.is_terminal else lead + tuple(space.shape)


def _tree_mismatch(want, x, where: str) -> str | None:
    """None if x has the structure and leaf shapes `want` (from `_leaf_shapes`), else where not."""
    if isinstance(want, tuple) and (not want or not isinstance(want[0], int)) and want != ():
        if not isinstance(x, tuple) or len(x) != len(want):
            return (f"{where} should be a tuple of {len(want)}, got "
                    f"{type(x).__name__ if not isinstance(x, tuple) else f'a tuple of {len(x)}'}")
        return next((m for i, (w, y) in enumerate(zip(want, x))
                     if (m := _tree_mismatch(w, y, f"{where}[{i}]"))), None)
    if want is None:
        return None if x is None else f"{where} should be None (an R^0 slot), got {_what(x)}"
    shape = getattr(x, "shape", None)
    if shape is None or tuple(shape) != tuple(want):
        return f"{where} should have shape {tuple(want)}, got {_what(x)}"
    dtype = getattr(x, "dtype", None)
    if dtype is not None and not (jnp.issubdtype(dtype, jnp.floating)
                                  or jnp.issubdtype(dtype, jnp.integer)):
        return f"{where} should hold real numbers, got dtype {dtype}"
    return None


def _what(x) -> str:
    shape = getattr(x, "shape", None)
    if shape is not None:
        return f"an array of shape {tuple(shape)}"
    return "None" if x is None else type(x).__name__


def check_cotangent(space: Space, c, what: str, lead: tuple = ()) -> None:
    """Refuse (`CovectorError`) a Vector, or a value whose leaves are not shaped like a
    cotangent vector on `space` (with the leading axes `lead`, e.g. a batch): a covector is
    a `Covector` or, where documented, its raw value. Static: shapes and dtypes only."""
    if isinstance(c, Vector):
        raise CovectorError(f"{what} is a Vector, but a covector belongs here: a vector is not "
                            "a covector (the flat map of an inner product turns one into the other)")
    why = _tree_mismatch(_leaf_shapes(space, tuple(lead)), unwrap(c), "its value")
    if why:
        raise CovectorError(f"{what} is not a covector on {space!r}"
                            f"{f' (with leading axes {tuple(lead)})' if lead else ''}: {why}")


def _check_finite(c, what: str) -> None:
    """Refuse (`CovectorError`) a concrete covector holding NaN or infinity (under a trace
    there are no values: a training step records a non-finite covector as a fault)."""
    for i, leaf in enumerate(jax.tree_util.tree_leaves(c)):
        if isinstance(leaf, jax.core.Tracer) or not jnp.issubdtype(jnp.result_type(leaf),
                                                                     jnp.inexact):
            continue
        a = np.asarray(leaf)
        if not np.isfinite(a).all():
            j = tuple(int(k) for k in np.argwhere(~np.isfinite(a))[0])
            raise CovectorError(f"{what} holds {a[j]} at index {j} (leaf {i}), not a real number")


def check_batch(dom: Space, X, who: str, concrete_values: bool = False) -> int:
    """The number of examples n ≥ 1 if X is a batch of points of `dom` (shape (n, *dom.shape),
    real numbers; a tuple of such batches, of one n, for a product domain), else `ShapeError`
    naming `who`, the shape expected and the shape given. With `concrete_values`, NaN and
    infinity are refused too (host data only; a training step records them as a fault)."""
    found = []

    def walk(S, x, where):
        if isinstance(S, Product):
            if not isinstance(x, tuple) or len(x) != len(S.factors):
                raise ShapeError(f"{who}: the batch{where} for the domain {S!r} must be a tuple "
                                 f"of {len(S.factors)} batches, got {_what(x)}")
            for i, (F, y) in enumerate(zip(S.factors, x)):
                walk(F, y, f"{where}[{i}]")
            return
        if S.is_terminal:
            if x is not None:
                raise ShapeError(f"{who}: the batch{where} for R^0 must be None, got {_what(x)}")
            return
        shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
        want = f"(n, *{tuple(S.shape)})"
        if shape is None or dtype is None:
            raise ShapeError(f"{who}: the batch{where} must be an array of shape {want} "
                             f"for the domain {S!r}, got {_what(x)}")
        shape = tuple(shape)
        try:
            real = bool(jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer))
        except TypeError:
            real = False
        if not real:
            raise ShapeError(f"{who}: the batch{where} must hold real numbers, got dtype {dtype}")
        if len(shape) != 1 + len(S.shape) or shape[1:] != tuple(S.shape):
            raise ShapeError(f"{who}: the batch{where} must have shape {want} for the domain "
                             f"{S!r} (one row per example), got shape {shape}")
        if shape[0] < 1:
            raise ShapeError(f"{who}: the batch{where} is empty (shape {shape}); a batch needs "
                             "at least one example")
        found.append((where, shape[0]))
        if concrete_values and not isinstance(x, jax.core.Tracer) and \
                jnp.issubdtype(dtype, jnp.floating):
            finite = np.isfinite(np.asarray(x))
            if not finite.all():
                i = tuple(int(k) for k in np.argwhere(~finite)[0])
                raise ShapeError(f"{who}: the batch{where} holds {np.asarray(x)[i]} at index "
                                 f"{i}, not a real number")
        if concrete_values and not isinstance(x, jax.core.Tracer) and \
                type(S).interior_margin is not Space.interior_margin:
            # an open subset (tokens, a box, ...): each row a point of it, as `S.check` asks
            # of one example on the per-example path
            inside = np.asarray(jax.vmap(S.interior_margin)(jnp.asarray(x))) > 0
            if not inside.all():
                i = tuple(int(k) for k in np.argwhere(~inside)[0])
                raise DomainError(f"{who}: example {i[0]} of the batch{where} is not a point of "
                                  f"{S!r}: coordinate {i[1:]} is {np.asarray(x)[i]}")

    walk(dom, X, "")
    sizes = {n for _, n in found}
    if len(sizes) > 1:
        raise ShapeError(f"{who}: the batches of the factors of {dom!r} have different numbers "
                         f"of examples: " + ", ".join(f"X{w}: {n}" for w, n in found))
    return found[0][1] if found else 0


def _param_str(space: Space) -> str:
    if isinstance(space, Product):
        return "×".join(_param_str(f) for f in space.factors) or "R^0"
    return repr(space)


# -- the primitive kind ------------------------------------------------------------------------

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
        return next((w for w in map(_shape_mismatch, space.factors, x) if w), None)
    if space.is_terminal:
        return None if x is None else f"expected None for R^0, got shape {getattr(x, 'shape', x)}"
    shape = getattr(x, "shape", None)
    if shape is None or tuple(shape) != tuple(space.shape):
        return f"expected shape {tuple(space.shape)} for {space!r}, got {shape if shape is not None else x!r}"
    return None


class Layer(ParaLens):
    """A primitive lens (P, f, f') : A → B from its forward part f (and optionally f').

    `structure` declares what structured metrics may use (`Affine(bias=...)` for x ↦ W x + b);
    `node=True` draws it as a dot, as copy, add and discard are drawn (they say which:
    `node="copy"`, `"add"`, `"discard"`, so that a drawing may use its own copy boxes).

    Examples:
        >>> layer = ParaLens(R(), R(), R(), lambda a, p: p * a, name="scale")
        >>> type(layer).__name__, layer.param
        ('Layer', R)
    """

    def __init__(self, dom: Space, cod: Space, param: Space, forward: Callable,
                 backward: Callable | None = None, name: str | None = None,
                 init: Callable | None = None, smooth: bool = True, check: bool = True,
                 structure: Any = None, node: bool | str = False):
        for what, space in (("domain", dom), ("codomain", cod), ("parameter object", param)):
            if not isinstance(space, Space):
                raise KindError(f"the {what} of a lens must be a Space (e.g. R(3)), got {space!r}")
        self.dom, self.cod, self.param = dom, cod, param
        self._forward, self._backward, self._init = forward, backward, init
        self.name = name if name else str(getattr(forward, "__name__", "f"))
        self.smooth, self.structure, self.node = bool(smooth), structure, node
        if check:
            self._check_forward_shape()

    def _check_forward_shape(self):
        try:
            out = jax.eval_shape(self._forward, _abstract(self.dom), _abstract(self.param))
        except Exception as e:  # noqa: BLE001 - re-raised with the lens's name
            raise SpaceMismatch(f"the forward part of {self.name} : {self.dom!r} → {self.cod!r} "
                            f"(params {self.param!r}) fails on a point of its domain: {e}") from e
        why = _shape_mismatch(self.cod, out)
        if why:
            raise SpaceMismatch(f"the forward part of {self.name} does not land in its codomain "
                            f"{self.cod!r}: {why}")

    @property
    def derives(self) -> bool:
        return self._backward is None

    def _apply(self, a, p, batched):
        return (jax.vmap(self._forward, (0, None)) if batched else self._forward)(a, p)

    def _vjp(self, a, p, batched):
        if self._backward is None:
            return ParaLens._vjp(self, a, p, batched)
        b, back = self._apply(a, p, batched), self._backward
        if not batched:
            return b, lambda bc: back(a, p, bc)

        def pull(bc):  # per example, then the parameter covectors added over the batch
            da, dp = jax.vmap(back, (0, None, 0))(a, p, bc)
            return da, tree_map(lambda x: jnp.sum(x, axis=0), dp)

        return b, pull

    def rebuild(self, children):
        return self

    def sites(self):
        return (Site(self, (), self.structure),) if self.param.size else ()

    def _probe(self, a, p, deltas, inputs):
        if not isinstance(self.structure, Affine):
            return self._apply(a, p, False)
        inputs.append(a)
        return self._apply(a, p, False) + next(deltas)

    def init(self, key):
        return self._init(key) if self._init is not None else self.param.sample_interior(key)

    def picture(self):
        if self.node and self.param.size == 0:
            return picture.Dot(self.name, self.dom, self.cod,
                               self.node if isinstance(self.node, str) else "node")
        return picture.Boxed(self.name, self.dom, self.cod, self.param)

    def atoms(self):
        return [self]


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

    def __init__(self, parts):
        self.children = tuple(parts)
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

    def _apply(self, a, ps, batched):
        for part, p in zip(self.children, ps):
            a = part._apply(a, p, batched)
        return a

    def _vjp(self, a, ps, batched):
        # A run of derived components goes to JAX as one composite: its reverse mode applies
        # this same rule (pullbacks in reverse at the kept values), and the run is traced once,
        # not once per component (one trace, one vmap, one linearisation). Every other
        # component runs its own backward part, in reverse, through `sequence_vjp`.
        steps = [(lambda a, p, piece=piece: piece._vjp(a, p, batched),
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

    def _probe(self, a, ps, deltas, inputs):
        for part, p in zip(self.children, ps):
            a = part._probe(a, p, deltas, inputs)
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

    def _apply(self, a, ps, batched):
        for part, p in zip(self.parts, ps):
            a = part._apply(a, p, batched)
        return a

    _vjp = ParaLens._vjp


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
        self.children = (f, g)
        self.dom, self.cod, self.param = f.dom * g.dom, f.cod * g.cod, f.param * g.param
        self.name = f"({f.name} ⊗ {g.name})"
        self.smooth = f.smooth and g.smooth

    def rebuild(self, children):
        return Parallel(*children)

    def _apply(self, ac, pq, batched):
        return tuple(h._apply(x, p, batched) for h, x, p in zip(self.children, ac, pq))

    def _vjp(self, ac, pq, batched):
        (b, pf), (d, pg) = (h._vjp(x, p, batched) for h, x, p in zip(self.children, ac, pq))

        def pullback(bd):
            (da, dp), (dc, dq) = pf(bd[0]), pg(bd[1])
            return (da, dc), (dp, dq)

        return (b, d), pullback

    def uses(self):
        return tuple(h.uses() for h in self.children)

    def sites(self):
        return _nested_sites(self.children)

    def _probe(self, ac, pq, deltas, inputs):
        return tuple(h._probe(x, p, deltas, inputs) for h, x, p in zip(self.children, ac, pq))

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
        if r.cod != lens.param:
            raise SpaceMismatch(f"cannot reparameterise {lens.name} (parameters {lens.param!r}) along "
                            f"{r.name} : {r.dom!r} → {r.cod!r}")
        self.children, self.r, self._init = (lens,), r, init
        self.dom, self.cod, self.param = lens.dom, lens.cod, r.dom
        self.name = name or f"{lens.name}[{r.name}]"
        self.smooth = lens.smooth

    @property
    def lens(self):
        return self.children[0]

    def rebuild(self, children):
        return Reparam(children[0], self.r, self._init, self.name)

    def _apply(self, a, q, batched):
        return self.lens._apply(a, self.r.fn(q), batched)

    def _vjp(self, a, q, batched):
        p, r_pull = jax.vjp(self.r.fn, q)
        b, pull = self.lens._vjp(a, p, batched)

        def pullback(bc):
            da, dp = pull(bc)
            return da, r_pull(dp)[0]

        return b, pullback

    def uses(self):
        inner = self.lens.uses()
        inner = inner if isinstance(self.r.cod, Product) else (inner,)
        total = lambda u: max(jax.tree_util.tree_leaves(u), default=0)  # noqa: E731
        counts = slot_uses(self.r, [total(u) for u in inner])
        return counts[0] if one_slot(self.r) else counts

    def init(self, key):
        if self._init is not None:
            return self._init(key)
        section = getattr(self.r, "section", None)  # a tying map's left inverse: keep slots
        return section(self.lens.init(key)) if section else self.param.sample_interior(key)

    def term(self, inside=False):
        inner = self.lens
        if self.name != f"{inner.name}[{self.r.name}]" and inner.name in self.name:
            # a named reparameterisation (e.g. `tie`) that quotes its lens: keep the user's name
            return self.name.replace(inner.name, inner.term(), 1)
        return f"{inner.term(True)}[{self.r.name}]"

    def picture(self):
        return picture.Framed(f"reparam {self.r.name}", self.lens.picture(), self.param)


# -- views and helpers -------------------------------------------------------------------------

class Batched:
    """The per-example traversal of `lens` over a leading batch axis of the input: the
    parameter covectors of the examples are **added** (the batch score is a sum of
    per-example scores).

    Examples:
        >>> b = batched(dense(2, 1))
        >>> type(b).__name__
        'Batched'
        >>> b.forward(jnp.ones((5, 2)), dense(2, 1).init(jax.random.PRNGKey(0))).shape
        (5, 1)
    """

    def __init__(self, lens: ParaLens):
        self.lens = lens
        self.name = f"batched({lens.name})"
        self.param = lens.param

    def is_fixed(self) -> bool:
        return True

    def _check(self, X, p) -> int:
        n = check_batch(self.lens.dom, X, f"batched({self.lens.name})", concrete_values=True)
        self.lens.param.check(p, f"the parameter of {self.lens.name}")
        return n

    def forward(self, X, p):
        """f(x_i, p) for every example x_i of the batch X, shape (n, *cod)."""
        self._check(X, p)
        return self.lens._apply(X, p, True)

    __call__ = forward

    def vjp(self, X, p):
        """(the batch of outputs, pullback); the pullback takes a batch of covectors on the
        codomain (a `Covector` or its raw value, leading axis n) and gives the batch of input
        covectors and the parameter covector added over the batch."""
        n = self._check(X, p)
        b, pull = self.lens._vjp(as_real(self.lens.dom, X), p, True)
        return b, self.lens._wrap(pull, lead=(n,), out=b)

    def backward(self, X, p, B_cov):
        return self.vjp(X, p)[1](B_cov)

    def term(self, inside=False):
        return f"batched({self.lens.term()})"

    def picture(self):
        return picture.Framed("batched: covectors added over the batch", self.lens.picture(), None)

    def atoms(self):
        return self.lens.atoms()

    def type_str(self):
        return self.lens.type_str()

    def __repr__(self):
        return f"batched({self.lens!r})"

    _repr_svg_ = ParaLens._repr_svg_


def batched(lens):
    """The batch traversal of `lens` (a family gives the family of its members' traversals).

    Examples:
        >>> model = batched(dense(2, 3) >> tanh)
        >>> model.forward(jnp.ones((4, 2)), (dense(2, 3).init(jax.random.PRNGKey(0)), None)).shape
        (4, 3)
    """
    need_lens(lens, "batched")
    return lens.lift(Batched, name=f"batched({lens.name})")


def tie(lens, slots):
    """Weight tying, `categories.para_tie` (the reparameterisation along the diagonal: the shared
    slot receives the sum of the covectors of its uses), for lenses and families of lenses.
    The slots are checked now, also for a family (whose members share one parameter object
    structure only once fixed: then again).

    Examples:
        >>> layer = linear(2, 2)
        >>> model = tie(layer >> layer, [0, 1])
        >>> model.param, uses(model)
        (R^{2×2}, 2)
    """
    need_lens(lens, "tie")
    if lens.is_fixed():
        from categories.para import check_slots
        check_slots(lens.param, slots)
    return lens.lift(lambda member: _tie_para(member, slots))


def derived(lens: ParaLens) -> ParaLens:
    """The same forward part with the backward part derived by JAX (for comparisons).

    Examples:
        >>> model = checkpoint(dense(2, 2) >> tanh)
        >>> d = derived(model)
        >>> p, x = model.init(jax.random.PRNGKey(0)), jnp.ones(2)
        >>> np.allclose(unwrap(model.backward(x, p, jnp.ones(2))[0]), unwrap(d.backward(x, p, jnp.ones(2))[0]))
        True
    """
    return Layer(lens.dom, lens.cod, lens.param, lens.forward, name=lens.name, check=False)


def uses(lens) -> Any:
    """How many times each parameter slot of `lens` is used (nested like the point).

    Examples:
        >>> uses(dense(2, 2) >> dense(2, 2)), uses(tie(linear(2, 2) >> linear(2, 2), [0, 1]))
        ((1, 1), 2)
    """
    return lens.fixed("uses").uses()


def n_params(lens: ParaLens) -> int:
    """The dimension of the parameter object.

    Examples:
        >>> n_params(dense(2, 3) >> tanh >> dense(3, 1))
        13
    """
    return lens.param.size


__all__ = ["ParaLens", "Layer", "Chain", "Parallel", "Reparam", "Batched", "Affine", "Site",
           "batched", "derived", "uses", "n_params", "tie", "sequence_vjp", "at_path", "check_batch",
           "check_cotangent", "need_lens"]
