"""The laws of the ambient category, written once as reusable checks.

Each `check_*` takes the objects of the law (maps, linear maps, parameterised maps) and the
points/tangents at which to compare the two sides; it returns `None` when the law holds
there and raises `AssertionError` naming the law, its statement and the disagreeing numbers
when it does not. They are meant to be called from property tests (Hypothesis draws the
maps and points, see `categories.strategies`), on the library's constructions or on your own:
the construction under test is an argument with the library's as default (`compose=`,
`D=`, `dual=`, `R=`, `reparam=`, ...), so a different implementation can be fed in.

Two sides are compared by `assert_close` on pytrees (float64 tolerances, configurable per
call). A law that cannot even be evaluated (the construction raises) is reported as failed.

The reverse-derivative axioms RD.1–RD.7 are those of Cockett et al., "Reverse derivative
categories" (2020), as restated in Cruttwell, Gavranović, Ghani, Wilson and Zanasi,
"Categorical Foundations of Gradient-Based Learning" (2022), appendix A; here they are
stated pointwise for smooth maps between Euclidean spaces, `R[f](x, y') = (df_x)*(y')`.
"""

from __future__ import annotations

import functools
import inspect

import jax
import numpy as np

from .functors import D as _D
from .functors import dual as _dual
from .functors import linear_smooth as _linear_smooth
from .functors import reverse_derivative
from .linear import Covector, Vector, linear_identity as _linear_identity, pairing, unwrap
from .para import para_identity as _para_identity
from .para import slot_uses as _slot_uses
from .para import para_tie as _tie
from .para import tying_map as _tying_map
from .smooth import Smooth, diagonal as _diagonal, smooth_discard as _discard, fst as _fst
from .smooth import smooth_identity as _identity, pair as _pair, snd as _snd
from .spaces import Product, R

ATOL = 1e-9
RTOL = 1e-9

#: name of every law check → its statement (the first line of its docstring)
LAWS: dict[str, str] = {}


# -- comparison -------------------------------------------------------------------------------

def _structure(x) -> str:
    if x is None:
        return "None"
    if isinstance(x, tuple):
        return "(" + ", ".join(_structure(xi) for xi in x) + ("," if len(x) == 1 else "") + ")"
    shape = np.shape(x)
    return f"array{tuple(shape)}" if shape else "scalar"


def assert_close(x, y, atol: float = ATOL, rtol: float = RTOL, what: str = "values") -> None:
    """Assert that two pytrees (tuples, `None`, arrays, `Vector`/`Covector`) agree.

    Same tree structure, same shapes, and |x − y| ≤ atol + rtol·max(|x|, |y|) leafwise.
    A `Vector` never equals a `Covector`; otherwise the wrapped values are compared.
    The message names `what`, the first disagreeing leaf and index, and both values.
    """
    kinds = (Vector, Covector)
    if isinstance(x, kinds) and isinstance(y, kinds) and type(x) is not type(y):
        raise AssertionError(f"{what}: a {type(x).__name__} is compared with a {type(y).__name__}")
    x, y = unwrap(x), unwrap(y)
    (lx, tx), (ly, ty) = (jax.tree_util.tree_flatten_with_path(t) for t in (x, y))
    if tx != ty:  # type: ignore[operator]  # jaxlib's stubs give PyTreeDef == but not !=
        raise AssertionError(
            f"{what}: different structures: {_structure(x)} vs {_structure(y)}")
    for (path, a), (_, b) in zip(lx, ly):
        where = jax.tree_util.keystr(path) or "value"
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if a.shape != b.shape:
            raise AssertionError(f"{what}: at {where} shapes differ: {a.shape} vs {b.shape}")
        err = np.abs(a - b)
        bad = ~(err <= atol + rtol * np.maximum(np.abs(a), np.abs(b)))  # NaN counts as bad
        if np.any(bad):
            i = np.unravel_index(int(np.argmax(np.where(bad, np.nan_to_num(err, nan=np.inf), -1.0))),
                                 a.shape)
            raise AssertionError(
                f"{what}: at {where}{[int(k) for k in i] if a.shape else ''}: "
                f"{float(a[i])!r} vs {float(b[i])!r} "
                f"(|difference| {float(err[i]):.3g}; {int(bad.sum())} of {a.size} entries "
                f"outside atol={atol:g}, rtol={rtol:g})")


def same(a, b, what: str) -> None:
    """Assert a == b (spaces, types), naming `what` is compared."""
    if a != b:
        raise AssertionError(f"{what}: {a!r} vs {b!r}")


def law_registry(registry: dict):
    """A decorator that registers a check in `registry` (name → statement, the first line of
    its docstring) and reports any failure, or failure to evaluate, with the law's statement."""

    def register(fn):
        statement = inspect.getdoc(fn).splitlines()[0]
        registry[fn.__name__] = statement
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def check(*args, **kwargs):
            signature.bind(*args, **kwargs)  # a wrong call is the caller's TypeError, not a failed law
            try:
                fn(*args, **kwargs)
            except AssertionError as e:
                raise AssertionError(f"{fn.__name__} failed: {statement}\n  {e}") from None
            except Exception as e:  # noqa: BLE001 — a construction that crashes breaks the law
                raise AssertionError(
                    f"{fn.__name__} failed: {statement}\n  evaluating it raised "
                    f"{type(e).__name__}: {e}") from e
            return None

        return check

    return register


_law = law_registry(LAWS)


def _add(x, y):
    return jax.tree_util.tree_map(lambda a, b: a + b, unwrap(x), unwrap(y))


def _scale(s, x):
    return jax.tree_util.tree_map(lambda a: s * a, unwrap(x))


def _zeros_like(space):
    return space.tangent.zeros()


def then(f, g):
    """f ≫ g, the library's composition (the default `compose=` of every law)."""
    return f >> g


def _linear_agree(L1, L2, v, what, atol, rtol):
    """Two linear maps agree: on v, or (v None) as matrices in the standard bases."""
    if v is None:
        assert_close(L1.matrix(), L2.matrix(), atol, rtol, what + " (matrices)")
    else:
        assert_close(L1(v), L2(v), atol, rtol, what)


# -- the category of smooth maps ------------------------------------------------------------------

@_law
def check_composition(f, g, x, *, compose=then, atol=ATOL, rtol=RTOL):
    """(f ≫ g)(x) = g(f(x)): f ≫ g runs f first, from dom f to cod g."""
    fg = compose(f, g)
    same(fg.dom, f.dom, "domain of f ≫ g vs domain of f")
    same(fg.cod, g.cod, "codomain of f ≫ g vs codomain of g")
    assert_close(fg(x), g(f(x)), atol, rtol, "(f ≫ g)(x) vs g(f(x))")


@_law
def check_associativity(f, g, h, x, *, compose=then, atol=ATOL, rtol=RTOL):
    """(f ≫ g) ≫ h = f ≫ (g ≫ h)."""
    left, right = compose(compose(f, g), h), compose(f, compose(g, h))
    same((left.dom, left.cod), (right.dom, right.cod), "types of (f ≫ g) ≫ h and f ≫ (g ≫ h)")
    assert_close(left(x), right(x), atol, rtol, "((f ≫ g) ≫ h)(x) vs (f ≫ (g ≫ h))(x)")


@_law
def check_identity_laws(f, x, *, identity=_identity, compose=then, atol=ATOL, rtol=RTOL):
    """1_A ≫ f = f = f ≫ 1_B for f : A → B."""
    assert_close(compose(identity(f.dom), f)(x), f(x), atol, rtol, "(1 ≫ f)(x) vs f(x)")
    assert_close(compose(f, identity(f.cod))(x), f(x), atol, rtol, "(f ≫ 1)(x) vs f(x)")


# -- finite products ------------------------------------------------------------------------------

@_law
def check_pair_projections(f, g, x, *, pair=_pair, fst=_fst, snd=_snd, compose=then,
                           atol=ATOL, rtol=RTOL):
    """⟨f, g⟩ ≫ π₀ = f and ⟨f, g⟩ ≫ π₁ = g for f : A → B, g : A → C."""
    fg = pair(f, g)
    same(fg.cod, Product(f.cod, g.cod), "codomain of ⟨f, g⟩ vs B × C")
    assert_close(compose(fg, fst(f.cod, g.cod))(x), f(x), atol, rtol, "(⟨f, g⟩ ≫ π₀)(x) vs f(x)")
    assert_close(compose(fg, snd(f.cod, g.cod))(x), g(x), atol, rtol, "(⟨f, g⟩ ≫ π₁)(x) vs g(x)")


@_law
def check_pairing_uniqueness(h, x, *, pair=_pair, fst=_fst, snd=_snd, compose=then,
                             atol=ATOL, rtol=RTOL):
    """⟨h ≫ π₀, h ≫ π₁⟩ = h for every h : A → B × C (the pairing is unique)."""
    if not (isinstance(h.cod, Product) and len(h.cod.factors) == 2):
        raise AssertionError(f"h must map into a binary product, its codomain is {h.cod!r}")
    B, C = h.cod.factors
    k = pair(compose(h, fst(B, C)), compose(h, snd(B, C)))
    assert_close(k(x), h(x), atol, rtol, "⟨h ≫ π₀, h ≫ π₁⟩(x) vs h(x)")


@_law
def check_product_map(f, g, x, y, *, product=lambda f, g: f * g, pair=_pair, fst=_fst, snd=_snd,
                      compose=then, atol=ATOL, rtol=RTOL):
    """f × g = ⟨π₀ ≫ f, π₁ ≫ g⟩, i.e. (f × g)(x, y) = (f x, g y)."""
    fg = product(f, g)
    same(fg.dom, Product(f.dom, g.dom), "domain of f × g")
    same(fg.cod, Product(f.cod, g.cod), "codomain of f × g")
    AC = (f.dom, g.dom)
    via_pair = pair(compose(fst(*AC), f), compose(snd(*AC), g))
    assert_close(fg((x, y)), via_pair((x, y)), atol, rtol, "(f × g)(x, y) vs ⟨π₀ ≫ f, π₁ ≫ g⟩(x, y)")
    assert_close(fg((x, y)), (f(x), g(y)), atol, rtol, "(f × g)(x, y) vs (f x, g y)")


@_law
def check_diagonal(f, x, *, diagonal=_diagonal, pair=_pair, fst=_fst, snd=_snd, compose=then,
                   product=lambda f, g: f * g, atol=ATOL, rtol=RTOL):
    """Δ ≫ π₀ = 1 = Δ ≫ π₁, and the copy is natural: f ≫ Δ = ⟨f, f⟩ = Δ ≫ (f × f)."""
    A, B = f.dom, f.cod
    assert_close(compose(diagonal(A), fst(A, A))(x), x, atol, rtol, "(Δ ≫ π₀)(x) vs x")
    assert_close(compose(diagonal(A), snd(A, A))(x), x, atol, rtol, "(Δ ≫ π₁)(x) vs x")
    copied = compose(f, diagonal(B))(x)
    assert_close(copied, pair(f, f)(x), atol, rtol, "(f ≫ Δ)(x) vs ⟨f, f⟩(x)")
    assert_close(copied, compose(diagonal(A), product(f, f))(x), atol, rtol,
                 "(f ≫ Δ)(x) vs (Δ ≫ (f × f))(x)")


@_law
def check_discard(f, x, *, discard=_discard):
    """Every f : A → R^0 equals the discard !_A: both send every x to None, R^0's one point."""
    if not f.cod.is_terminal:
        raise AssertionError(f"f must map into the terminal object R^0, its codomain is {f.cod!r}")
    d = discard(f.dom)
    same((d.dom, d.cod), (f.dom, f.cod), "type of !_A vs type of f")
    for name, value in (("f(x)", f(x)), ("!(x)", d(x))):
        if value is not None:
            raise AssertionError(f"{name} is {value!r}, but R^0 has the single point None")


# -- the differential D (covariant) ---------------------------------------------------------------

@_law
def check_D_composition(f, g, x, v=None, *, D=_D, compose=then, atol=ATOL, rtol=RTOL):
    """D(f ≫ g)_x = D g_{f(x)} ∘ D f_x (the chain rule; compared on v, or as matrices)."""
    chained = D(f, x) >> D(g, f(x))
    _linear_agree(D(compose(f, g), x), chained, v, "D(f ≫ g)_x vs Dg_{f x} ∘ Df_x", atol, rtol)


@_law
def check_D_identity(A, x, v=None, *, D=_D, identity=_identity, atol=ATOL, rtol=RTOL):
    """D(1_A)_x = 1 on the tangent space T_xA."""
    _linear_agree(D(identity(A), x), _linear_identity(A), v, "D(1)_x vs 1", atol, rtol)


@_law
def check_D_product(f, g, x, y, v=None, w=None, *, D=_D, product=lambda f, g: f * g,
                    atol=ATOL, rtol=RTOL):
    """D(f × g)_{(x, y)} = Df_x × Dg_y (compared on (v, w), or as matrices)."""
    vw = None if v is None and w is None else (v, w)
    _linear_agree(D(product(f, g), (x, y)), D(f, x) * D(g, y), vw,
                  "D(f × g)_(x,y) vs Df_x × Dg_y", atol, rtol)


@_law
def check_D_linear(L, x, v=None, *, D=_D, linear_smooth=_linear_smooth, atol=ATOL, rtol=RTOL):
    """D(L)_x = L for a linear map L regarded as a smooth map, at every x."""
    _linear_agree(D(linear_smooth(L), x), L, v, "D(L)_x vs L", atol, rtol)


# -- the dual (contravariant) ---------------------------------------------------------------------

@_law
def check_dual_composition(A, B, y=None, *, dual=_dual, compose=then, atol=ATOL, rtol=RTOL):
    """(A ≫ B)* = B* ≫ A*, i.e. (B ∘ A)* = A* ∘ B*: the dual reverses the order."""
    AB = dual(compose(A, B))
    same((AB.dom, AB.cod), (B.cod, A.dom), "type of (A ≫ B)* vs cod(B)* → dom(A)*")
    _linear_agree(AB, compose(dual(B), dual(A)), y, "(A ≫ B)* vs B* ≫ A*", atol, rtol)


@_law
def check_dual_identity(V, y=None, *, dual=_dual, linear_identity=_linear_identity,
                        atol=ATOL, rtol=RTOL):
    """(1_V)* = 1 on V*."""
    _linear_agree(dual(linear_identity(V)), _linear_identity(V, on="covectors"), y,
                  "(1_V)* vs 1", atol, rtol)


@_law
def check_dual_pairing(A, y, v, *, dual=_dual, atol=ATOL, rtol=RTOL):
    """⟨A* y', v⟩ = ⟨y', A v⟩ for A : V → W, y' ∈ W*, v ∈ V (the defining property of A*)."""
    As = dual(A)
    same((As.dom, As.cod), (A.cod, A.dom), "type of A* vs W* → V*")
    assert_close(pairing(unwrap(As(y)), unwrap(v)), pairing(unwrap(y), unwrap(A(v))), atol, rtol,
                 "⟨A* y', v⟩ vs ⟨y', A v⟩")


# -- the reverse derivative: axioms RD.1–RD.7 ---------------------------------------------------

def _rev(R, f, x, y):
    """`R[f](x, y')`, unwrapped (R[f] is a map A × B* → A*, called on the pair)."""
    return unwrap(R(f)((x, y)))


@_law
def check_rd1(f, g, x, c, *, R=reverse_derivative, atol=ATOL, rtol=RTOL):
    """RD.1: R[f + g] = R[f] + R[g] and R[0] = 0 (additive in the map)."""
    assert_close(_rev(R, f + g, x, c), _add(_rev(R, f, x, c), _rev(R, g, x, c)), atol, rtol,
                 "R[f + g](x, c) vs R[f](x, c) + R[g](x, c)")
    cod = f.cod
    zero = Smooth(f.dom, cod, lambda x_: cod.zeros(), "0")
    assert_close(_rev(R, zero, x, c), _zeros_like(f.dom), atol, rtol, "R[0](x, c) vs 0")


@_law
def check_rd2(f, x, a, b, s=2.0, *, R=reverse_derivative, atol=ATOL, rtol=RTOL):
    """RD.2: R[f](x, a + b) = R[f](x, a) + R[f](x, b), R[f](x, 0) = 0, R[f](x, s·a) = s·R[f](x, a)."""
    ra = _rev(R, f, x, a)
    assert_close(_rev(R, f, x, _add(a, b)), _add(ra, _rev(R, f, x, b)), atol, rtol,
                 "R[f](x, a + b) vs R[f](x, a) + R[f](x, b)")
    assert_close(_rev(R, f, x, _zeros_like(f.cod)), _zeros_like(f.dom), atol, rtol,
                 "R[f](x, 0) vs 0")
    assert_close(_rev(R, f, x, _scale(s, a)), _scale(s, ra), atol, rtol,
                 "R[f](x, s·a) vs s·R[f](x, a)")


@_law
def check_rd3(A, B, x, y, a, b, *, R=reverse_derivative, identity=_identity, fst=_fst, snd=_snd,
              atol=ATOL, rtol=RTOL):
    """RD.3: R[1](x, a) = a, R[π₀]((x, y), a) = (a, 0), R[π₁]((x, y), b) = (0, b)."""
    assert_close(_rev(R, identity(A), x, a), a, atol, rtol, "R[1](x, a) vs a")
    assert_close(_rev(R, fst(A, B), (x, y), a), (unwrap(a), _zeros_like(B)), atol, rtol,
                 "R[π₀]((x, y), a) vs (a, 0)")
    assert_close(_rev(R, snd(A, B), (x, y), b), (_zeros_like(A), unwrap(b)), atol, rtol,
                 "R[π₁]((x, y), b) vs (0, b)")


@_law
def check_rd4(f, g, x, v, w, *, R=reverse_derivative, pair=_pair, discard=_discard,
              atol=ATOL, rtol=RTOL):
    """RD.4: R[⟨f, g⟩](x, (v, w)) = R[f](x, v) + R[g](x, w), and R[!](x, ·) = 0."""
    assert_close(_rev(R, pair(f, g), x, (unwrap(v), unwrap(w))),
                 _add(_rev(R, f, x, v), _rev(R, g, x, w)), atol, rtol,
                 "R[⟨f, g⟩](x, (v, w)) vs R[f](x, v) + R[g](x, w)")
    assert_close(_rev(R, discard(f.dom), x, None), _zeros_like(f.dom), atol, rtol,
                 "R[!](x, None) vs 0")


@_law
def check_rd5(f, g, x, c, *, R=reverse_derivative, compose=then, atol=ATOL, rtol=RTOL):
    """RD.5 (reverse chain rule): R[f ≫ g](x, c) = R[f](x, R[g](f(x), c))."""
    assert_close(_rev(R, compose(f, g), x, c), _rev(R, f, x, _rev(R, g, f(x), c)), atol, rtol,
                 "R[f ≫ g](x, c) vs R[f](x, R[g](f x, c))")


@_law
def check_rd6(f, x, y, v, *, R=reverse_derivative, D=_D, atol=ATOL, rtol=RTOL):
    """RD.6: the covector part of R[R[f]]((x, y), v) is df_x(v) (R[f](x, ·) is linear, with transpose df_x)."""
    out = unwrap(R(R(f))(((x, y), v)))
    if not (isinstance(out, tuple) and len(out) == 2):
        raise AssertionError(f"R[R[f]]((x, y), v) should be a pair (x', y'), got {_structure(out)}")
    assert_close(out[1], D(f, x)(v), atol, rtol, "second component of R[R[f]]((x, y), v) vs df_x(v)")


@_law
def check_rd7(f, x, c, u, v, *, R=reverse_derivative, D=_D, atol=ATOL, rtol=RTOL):
    """RD.7 (symmetry of mixed partials): for h = R[f](·, c), R[h](x, v) = dh_x(v) and ⟨dh_x u, v⟩ = ⟨dh_x v, u⟩."""
    Rf = R(f)
    h = Smooth(f.dom, f.dom.tangent, lambda x_: unwrap(Rf((x_, c))), "R[f](·, c)")
    dh = D(h, x)
    dh_v = dh(v)
    assert_close(_rev(R, h, x, v), dh_v, atol, rtol, "R[h](x, v) vs dh_x(v)")
    assert_close(pairing(unwrap(dh(u)), unwrap(v)), pairing(unwrap(dh_v), unwrap(u)), atol, rtol,
                 "⟨dh_x u, v⟩ vs ⟨dh_x v, u⟩")


# -- Para -------------------------------------------------------------------------------------------

def flat_slots(m, p) -> tuple:
    """The slots m occupies in a composite's flat parameter point: a chain brings its parts' points."""
    return tuple(p) if len(m.parts) > 1 else (p,)


def flat_slot_spaces(m) -> tuple:
    """The parameter objects of those slots."""
    return tuple(m.param.factors) if len(m.parts) > 1 else (m.param,)


def reparam_along(f, r):
    """f.reparam(r), the library's reparameterisation (the default `reparam=` of the laws)."""
    return f.reparam(r)


def associated(f, g, h, p, q, r, compose=then) -> tuple:
    """(f ≫ g) ≫ h, f ≫ (g ≫ h) and their flat point (p, q, r), once both parameter objects
    are checked to be P × Q × R up to the flattening of chains."""
    left, right = compose(compose(f, g), h), compose(f, compose(g, h))
    flat = Product(*flat_slot_spaces(f), *flat_slot_spaces(g), *flat_slot_spaces(h))
    same(left.param, flat, "parameter object of (f ≫ g) ≫ h vs P × Q × R")
    same(right.param, flat, "parameter object of f ≫ (g ≫ h) vs P × Q × R")
    return left, right, flat_slots(f, p) + flat_slots(g, q) + flat_slots(h, r)


@_law
def check_para_composition(f, g, a, p, q, *, compose=then, atol=ATOL, rtol=RTOL):
    """(P, f) ≫ (Q, g) = (P × Q, (a, (p, q)) ↦ g(f(a, p), q)) (parameters flattened)."""
    fg = compose(f, g)
    same(fg.param, Product(*flat_slot_spaces(f), *flat_slot_spaces(g)), "parameter object of f ≫ g vs P × Q")
    assert_close(fg(a, flat_slots(f, p) + flat_slots(g, q)), g(f(a, p), q), atol, rtol,
                 "(f ≫ g)(a, (p, q)) vs g(f(a, p), q)")


@_law
def check_para_associativity(f, g, h, a, p, q, r, *, compose=then, atol=ATOL, rtol=RTOL):
    """(f ≫ g) ≫ h = f ≫ (g ≫ h) up to flattening: both have parameters P × Q × R, point (p, q, r),
    and both are (a, (p, q, r)) ↦ h(g(f(a, p), q), r)."""
    left, right, pqr = associated(f, g, h, p, q, r, compose)
    # where composition flattens, both sides are one chain: the sequence is what they must equal
    expected = h(g(f(a, p), q), r)
    for side, m in (("(f ≫ g) ≫ h", left), ("f ≫ (g ≫ h)", right)):
        assert_close(m(a, pqr), expected, atol, rtol, f"({side})(a, (p, q, r)) vs h(g(f(a, p), q), r)")


@_law
def check_para_units(f, a, p, *, identity=_para_identity, compose=then, atol=ATOL, rtol=RTOL):
    """(R^0, id) is a unit: (id ≫ f)(a, (None, p)) = f(a, p) = (f ≫ id)(a, (p, None))."""
    left, right = compose(identity(f.dom), f), compose(f, identity(f.cod))
    for side, m, slots, expected in (
            ("id ≫ f", left, (None,) + flat_slots(f, p), (R(0),) + flat_slot_spaces(f)),
            ("f ≫ id", right, flat_slots(f, p) + (None,), flat_slot_spaces(f) + (R(0),))):
        same(m.param, Product(*expected), f"parameter object of {side}")
        assert_close(m(a, slots), f(a, p), atol, rtol, f"({side})(a, ...) vs f(a, p)")


@_law
def check_reparam_identity(f, a, p, *, identity=_identity, reparam=reparam_along, atol=ATOL, rtol=RTOL):
    """Reparameterising along 1_P changes nothing: f.reparam(1_P) = f."""
    g = reparam(f, identity(f.param))
    same(g.param, f.param, "parameter object of f.reparam(1)")
    assert_close(g(a, p), f(a, p), atol, rtol, "f.reparam(1)(a, p) vs f(a, p)")


@_law
def check_reparam_composition(f, r1, r2, a, q, *, reparam=reparam_along, compose=then,
                              atol=ATOL, rtol=RTOL):
    """f.reparam(r1).reparam(r2) = f.reparam(r2 ≫ r1), and both send (a, q) to f(a, r1(r2(q)))."""
    twice, once = reparam(reparam(f, r1), r2), reparam(f, compose(r2, r1))
    same(twice.param, r2.dom, "parameter object of f.reparam(r1).reparam(r2)")
    same(once.param, r2.dom, "parameter object of f.reparam(r2 ≫ r1)")
    direct = f(a, r1(r2(q)))
    assert_close(twice(a, q), direct, atol, rtol, "f.reparam(r1).reparam(r2)(a, q) vs f(a, r1(r2 q))")
    assert_close(once(a, q), direct, atol, rtol, "f.reparam(r2 ≫ r1)(a, q) vs f(a, r1(r2 q))")


@_law
def check_weight_tying(f, g, a, p, *, tie=_tie, tying_map=_tying_map, slot_uses=_slot_uses,
                       compose=then, atol=ATOL, rtol=RTOL):
    """Tying along Δ: tie(f ≫ g, [0, 1])(a, p) = (f ≫ g)(a, (p, p)), and the shared slot is used twice."""
    if f.param != g.param:
        raise AssertionError(f"tied layers need one parameter object, got {f.param!r} and {g.param!r}")
    fg = compose(f, g)
    tied = tie(fg, [0, 1])
    if tied.param != f.param:
        raise AssertionError(f"parameter object of the tied map is {tied.param!r}, expected {f.param!r}")
    assert_close(tied(a, p), fg(a, (p, p)), atol, rtol, "tie(f ≫ g, [0, 1])(a, p) vs (f ≫ g)(a, (p, p))")
    # The shared slot (the whole of P, even when P is a product) is used twice; a slot
    # without parameters (R^0) has nothing to use.
    uses = tuple(slot_uses(tying_map(fg.param, [0, 1]), (1, 1)))
    if uses != ((2,) if f.param.size > 0 else (0,)):
        raise AssertionError(f"slot_uses reports {uses} for the tied slot, expected "
                             f"{(2,) if f.param.size > 0 else (0,)}")


__all__ = ["ATOL", "RTOL", "LAWS", "assert_close", "law_registry"] + sorted(LAWS)
