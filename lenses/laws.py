"""The laws of lenses and parameterised lenses, written once as reusable checks.

Each `check_*` takes the lenses of the law and the points and covectors at which to compare
its two sides; it returns `None` when the law holds there and raises `AssertionError` naming
the law, its statement and the disagreeing numbers when it does not (a law whose sides cannot
even be evaluated is reported as failed). They are meant to be called from property tests
(Hypothesis draws the lenses and points, see `lenses.strategies`), on the library's
constructions or on your own: the construction under test is a keyword argument with the
library's as default (`compose=`, `parallel=`, `identity=`, `copy=`, `checkpoint=`, ...).

Both sides are compared by `categories.laws.assert_close` (float64 tolerances). For a
`ParaLens` a side is compared on its forward value and on both covectors of its backward
part; for a plain `Lens` on get and put. Parameterised composites are compared "up to the
flattening of chains": the point of f ≫ g is the tuple of the slots of f followed by those
of g, a chain bringing one slot per component.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp

from categories import R, smooth_identity as _smooth_identity
from categories.laws import (ATOL, RTOL, assert_close, associated, flat_slots,
                             law_registry, reparam_along, same, then)
from categories.linear import unwrap

from .layers import basic as layers
from .lens import lens_identity as _lens_identity
from .lens import lens_of as _lens_of
from .batched import batched as _batched
from .layer import Layer
from .recompute import checkpoint as _checkpoint
from .slots import tie as _tie, uses as _uses
from .structure import add as _add_lens, copy as _copy, discard as _discard

#: name of every law check → its statement (the first line of its docstring)
LAWS: dict[str, str] = {}


_law = law_registry(LAWS)


# -- helpers ---------------------------------------------------------------------------------



def _parallel(f, g):
    return f @ g


def _para_identity(A):
    return layers.identity.at(A)






def _run(lens, a, p, b):
    """(forward value, input covector, parameter covector), all as raw pytrees."""
    out = lens.forward(a, p)
    da, dp = lens.backward(a, p, b)
    return out, unwrap(da), unwrap(dp)




def _sum(*xs):
    return jax.tree_util.tree_map(lambda *ls: sum(ls[1:], ls[0]), *(unwrap(x) for x in xs))


def _agree(left, right, names, atol, rtol):
    """Compare (forward, a', p') triples, naming the two sides."""
    l, r = names
    for i, part in enumerate(("forward value", "input covector", "parameter covector")):
        assert_close(left[i], right[i], atol, rtol, f"{part}: {l} vs {r}")


# -- plain lenses ------------------------------------------------------------------------------

@_law
def check_lens_associativity(f, g, h, a, d, *, compose=then, atol=ATOL, rtol=RTOL):
    """(f ≫ g) ≫ h = f ≫ (g ≫ h) for lenses: the same get, and the same put at (a, d')."""
    left, right = compose(compose(f, g), h), compose(f, compose(g, h))
    same((left.dom, left.cod), (right.dom, right.cod), "types of (f ≫ g) ≫ h and f ≫ (g ≫ h)")
    assert_close(left.get(a), right.get(a), atol, rtol, "get: (f ≫ g) ≫ h vs f ≫ (g ≫ h)")
    assert_close(left.put(a, d), right.put(a, d), atol, rtol, "put: (f ≫ g) ≫ h vs f ≫ (g ≫ h)")


@_law
def check_lens_identities(f, a, b, *, identity=_lens_identity, compose=then, atol=ATOL, rtol=RTOL):
    """1_A ≫ f = f = f ≫ 1_B for a lens f : A → B, on get and on put."""
    for side, m in (("1 ≫ f", compose(identity(f.dom), f)), ("f ≫ 1", compose(f, identity(f.cod)))):
        assert_close(m.get(a), f.get(a), atol, rtol, f"get: {side} vs f")
        assert_close(m.put(a, b), f.put(a, b), atol, rtol, f"put: {side} vs f")


@_law
def check_lens_of_composition(f, g, a, c, *, lens_of=_lens_of, compose=then, atol=ATOL, rtol=RTOL):
    """lens_of(f ≫ g) = lens_of(f) ≫ lens_of(g): the reverse derivative is a functor into lenses."""
    left, right = lens_of(compose(f, g)), compose(lens_of(f), lens_of(g))
    assert_close(left.get(a), right.get(a), atol, rtol, "get: lens_of(f ≫ g) vs lens_of(f) ≫ lens_of(g)")
    assert_close(left.put(a, c), right.put(a, c), atol, rtol,
                 "put: lens_of(f ≫ g) vs lens_of(f) ≫ lens_of(g)")


@_law
def check_lens_of_identity(A, a, b, *, lens_of=_lens_of, identity=_lens_identity, atol=ATOL, rtol=RTOL):
    """lens_of(1_A) = 1_A: get is the identity and put(a, b') = b'."""
    left, right = lens_of(_smooth_identity(A)), identity(A)
    assert_close(left.get(a), right.get(a), atol, rtol, "get: lens_of(1) vs 1")
    assert_close(left.put(a, b), right.put(a, b), atol, rtol, "put: lens_of(1) vs 1")
    assert_close(left.put(a, b), b, atol, rtol, "put: lens_of(1)(a, b') vs b'")


# -- parameterised lenses ------------------------------------------------------------------------

@_law
def check_para_lens_associativity(f, g, h, a, p, q, r, d, *, compose=then, atol=ATOL, rtol=RTOL):
    """(f ≫ g) ≫ h = f ≫ (g ≫ h) up to flattening: parameters P × Q × R, point (p, q, r), and
    both the lens run part by part: forward f, g, h, then backward h, g, f."""
    left, right, pqr = associated(f, g, h, p, q, r, compose)
    # where composition flattens, both sides are one chain: the sequence is what they must equal
    b = f.forward(a, p)
    c = g.forward(b, q)
    dc, dr = h.backward(c, r, d)
    db, dq = g.backward(b, q, dc)
    da, dp = f.backward(a, p, db)
    slots = flat_slots(f, unwrap(dp)) + flat_slots(g, unwrap(dq)) + flat_slots(h, unwrap(dr))
    expected = (h.forward(c, r), unwrap(da), slots)
    for side, m in (("(f ≫ g) ≫ h", left), ("f ≫ (g ≫ h)", right)):
        _agree(_run(m, a, pqr, d), expected, (side, "h ∘ g ∘ f forward, f ∘ g ∘ h backward"), atol, rtol)


@_law
def check_para_lens_identities(f, a, p, b, *, identity=_para_identity, compose=then,
                               atol=ATOL, rtol=RTOL):
    """(R^0, id) is a unit: id ≫ f and f ≫ id act as f, with a None slot for the identity."""
    value, da, dp = _run(f, a, p, b)
    for side, m, point, before in (("id ≫ f", compose(identity(f.dom), f), (None,) + flat_slots(f, p), True),
                                   ("f ≫ id", compose(f, identity(f.cod)), flat_slots(f, p) + (None,), False)):
        got_v, got_a, got_p = _run(m, a, point, b)
        assert_close(got_v, value, atol, rtol, f"forward value: {side} vs f")
        assert_close(got_a, da, atol, rtol, f"input covector: {side} vs f")
        expected_p = (None,) + flat_slots(f, dp) if before else flat_slots(f, dp) + (None,)
        assert_close(got_p, expected_p, atol, rtol, f"parameter covector: {side} vs (None, f's)")


@_law
def check_parallel_interchange(f, g, h, k, a, c, p, q, r, s, b, d, *, compose=then,
                               parallel=_parallel, atol=ATOL, rtol=RTOL):
    """(f ⊗ g) ≫ (h ⊗ k) = (f ≫ h) ⊗ (g ≫ k), parameters ((p, q), (r, s)) ↔ ((p, r), (q, s))."""
    left = compose(parallel(f, g), parallel(h, k))
    right = parallel(compose(f, h), compose(g, k))
    lv, la, lp = _run(left, (a, c), ((p, q), (r, s)), (b, d))
    rv, ra, rp = _run(right, (a, c), (flat_slots(f, p) + flat_slots(h, r), flat_slots(g, q) + flat_slots(k, s)), (b, d))
    (dp, dq), (dr, ds) = lp
    rearranged = (flat_slots(f, dp) + flat_slots(h, dr), flat_slots(g, dq) + flat_slots(k, ds))
    _agree((lv, la, rearranged), (rv, ra, rp), ("(f ⊗ g) ≫ (h ⊗ k)", "(f ≫ h) ⊗ (g ≫ k)"), atol, rtol)


# -- copy, discard, add ---------------------------------------------------------------------------

def _swap(A):
    return Layer(A * A, A * A, R(0), lambda aa, p: (aa[1], aa[0]), name="σ")


@_law
def check_copy_counit(A, a, b, *, copy=_copy, discard=_discard, identity=_para_identity,
                      compose=then, parallel=_parallel, atol=ATOL, rtol=RTOL):
    """copy ≫ (discard ⊗ id) ≅ id ≅ copy ≫ (id ⊗ discard): a copy of which one half is discarded."""
    for side, m, unit in (
            ("copy ≫ (discard ⊗ id)", compose(copy(A), parallel(discard(A), identity(A))), 1),
            ("copy ≫ (id ⊗ discard)", compose(copy(A), parallel(identity(A), discard(A))), 0)):
        none = (None, (None, None))
        out = m.forward(a, none)
        if out[1 - unit] is not None:
            raise AssertionError(f"{side}: the discarded half should be R^0's point None, "
                                 f"got {out[1 - unit]!r}")
        assert_close(out[unit], a, atol, rtol, f"forward value: {side} vs id")
        cov = (None, b) if unit == 1 else (b, None)
        da, dp = m.backward(a, none, cov)
        assert_close(da, b, atol, rtol, f"input covector: {side} vs id (the covector b')")
        assert_close(dp, none, atol, rtol, f"parameter covector of {side}")


@_law
def check_copy_backward_adds(A, a, u, v, *, copy=_copy, atol=ATOL, rtol=RTOL):
    """copy' (a, (u', v')) = u' + v': the backward part of a copy adds the two covectors."""
    out = copy(A).forward(a, None)
    assert_close(out, (a, a), atol, rtol, "copy(a) vs (a, a)")
    da, dp = copy(A).backward(a, None, (u, v))
    assert_close(da, _sum(u, v), atol, rtol, "copy'(a, (u', v')) vs u' + v'")
    assert_close(dp, None, atol, rtol, "parameter covector of copy")


@_law
def check_add_backward_copies(A, a1, a2, w, *, add=_add_lens, atol=ATOL, rtol=RTOL):
    """add' ((a₁, a₂), w') = (w', w'): the backward part of an addition copies the covector."""
    assert_close(add(A).forward((a1, a2), None), _sum(a1, a2), atol, rtol, "add(a₁, a₂) vs a₁ + a₂")
    da, dp = add(A).backward((a1, a2), None, w)
    assert_close(da, (unwrap(w), unwrap(w)), atol, rtol, "add'((a₁, a₂), w') vs (w', w')")
    assert_close(dp, None, atol, rtol, "parameter covector of add")


@_law
def check_discard_backward_zero(A, a, *, discard=_discard, atol=ATOL, rtol=RTOL):
    """discard' (a, None) = 0: what is discarded sends nothing back."""
    if discard(A).forward(a, None) is not None:
        raise AssertionError("discard(a) should be R^0's point None")
    da, dp = discard(A).backward(a, None, None)
    assert_close(da, A.tangent.zeros(), atol, rtol, "discard'(a, None) vs 0")
    assert_close(dp, None, atol, rtol, "parameter covector of discard")


@_law
def check_copy_commutative(A, a, u, v, *, copy=_copy, compose=then, atol=ATOL, rtol=RTOL):
    """copy ≫ σ = copy: swapping the two copies changes nothing, forward or backward."""
    left, right = compose(copy(A), _swap(A)), copy(A)
    lv, la, _ = _run(left, a, (None, None), (u, v))
    rv, ra, _ = _run(right, a, None, (u, v))
    assert_close(lv, rv, atol, rtol, "forward value: copy ≫ σ vs copy")
    assert_close(la, ra, atol, rtol, "input covector: copy ≫ σ vs copy (v' + u' vs u' + v')")


@_law
def check_copy_coassociative(A, a, u, v, w, *, copy=_copy, identity=_para_identity, compose=then,
                             parallel=_parallel, atol=ATOL, rtol=RTOL):
    """copy ≫ (copy ⊗ id) = copy ≫ (id ⊗ copy) up to ((a, b), c) ≅ (a, (b, c)), forward and backward."""
    left = compose(copy(A), parallel(copy(A), identity(A)))
    right = compose(copy(A), parallel(identity(A), copy(A)))
    pl = pr = (None, (None, None))
    (x, y), z = left.forward(a, pl)
    assert_close((x, (y, z)), right.forward(a, pr), atol, rtol,
                 "forward value: copy ≫ (copy ⊗ id) vs copy ≫ (id ⊗ copy)")
    dl, _ = left.backward(a, pl, ((u, v), w))
    dr, _ = right.backward(a, pr, (u, (v, w)))
    assert_close(dl, dr, atol, rtol, "input covector: copy ≫ (copy ⊗ id) vs copy ≫ (id ⊗ copy)")
    assert_close(dl, _sum(u, v, w), atol, rtol, "input covector of the triple copy vs u' + v' + w'")


# -- reparameterisation, tying ---------------------------------------------------------------



@_law
def check_reparam_identity(f, a, p, b, *, reparam=reparam_along, atol=ATOL, rtol=RTOL):
    """Reparameterising along 1_P changes nothing: f.reparam(1_P) = f, forward and backward."""
    g = reparam(f, _smooth_identity(f.param))
    same(g.param, f.param, "parameter object of f.reparam(1)")
    _agree(_run(g, a, p, b), _run(f, a, p, b), ("f.reparam(1)", "f"), atol, rtol)


@_law
def check_reparam_composition(f, r1, r2, a, q, b, *, reparam=reparam_along, compose=then,
                              atol=ATOL, rtol=RTOL):
    """f.reparam(r1).reparam(r2) = f.reparam(r2 ≫ r1); q' is p' pulled back through R[r1] then R[r2]."""
    twice, once = reparam(reparam(f, r1), r2), reparam(f, compose(r2, r1))
    same(twice.param, r2.dom, "parameter object of f.reparam(r1).reparam(r2)")
    _agree(_run(twice, a, q, b), _run(once, a, q, b), ("twice", "once along r2 ≫ r1"), atol, rtol)
    # an independent derivation: the VJP of (a, q) ↦ f(a, r1(r2(q))) written out directly
    fwd, g1, g2 = f.forward, r1.fn, r2.fn
    value, pull = jax.vjp(lambda a_, q_: fwd(a_, g1(g2(q_))), a, q)
    da, dq = pull(unwrap(b))
    _agree(_run(twice, a, q, b), (value, da, dq), ("twice", "vjp of a, q ↦ f(a, r1(r2 q))"), atol, rtol)


@_law
def check_tie_sums(f, g, a, p, c, *, tie=_tie, uses=_uses, compose=then, atol=ATOL, rtol=RTOL):
    """tie(f ≫ g, [0, 1]) at p is f ≫ g at (p, p), and its covector is the SUM p'_f + p'_g."""
    if len(f.parts) != 1 or len(g.parts) != 1 or f.param != g.param:
        raise AssertionError("check_tie_sums needs two single-slot lenses with one parameter object")
    fg = compose(f, g)
    tied = tie(fg, [0, 1])
    value, da, (dp_f, dp_g) = _run(fg, a, (p, p), c)
    t_value, t_da, t_dp = _run(tied, a, p, c)
    assert_close(t_value, value, atol, rtol, "forward value: tie(f ≫ g)(a, p) vs (f ≫ g)(a, (p, p))")
    assert_close(t_da, da, atol, rtol, "input covector: tied vs untied")
    assert_close(t_dp, _sum(dp_f, dp_g), atol, rtol, "covector of the tied slot vs p'_f + p'_g")
    if not f.param.is_terminal and uses(tied) != 2:
        raise AssertionError(f"uses(tie(f ≫ g, [0, 1])) is {uses(tied)!r}, expected 2")


# -- the store rule and the recompute rule; the batch --------------------------------------------

@_law
def check_store_equals_recompute(f, a, p, b, A=None, B=None, *, checkpoint=_checkpoint,
                                 batched=_batched, atol=ATOL, rtol=RTOL):
    """checkpoint(f) = f: recomputing the forward values gives the same values and covectors.

    With a batch (A, B') the batched traversals of the two are compared as well."""
    g = checkpoint(f)
    same((g.dom, g.cod, g.param), (f.dom, f.cod, f.param), "spaces of checkpoint(f) vs f")
    _agree(_run(g, a, p, b), _run(f, a, p, b), ("checkpoint(f)", "f"), atol, rtol)
    if A is not None:
        _agree(_run(batched(g), A, p, B), _run(batched(f), A, p, B),
               ("batched(checkpoint(f))", "batched(f)"), atol, rtol)


@_law
def check_batched_is_sum(f, A, p, B, *, batched=_batched, atol=ATOL, rtol=RTOL):
    """batched(f) is f per example: outputs and input covectors row by row, parameter covectors ADDED."""
    value, da, dp = _run(batched(f), A, p, B)
    rows = [_run(f, A[i], p, B[i]) for i in range(A.shape[0])]
    assert_close(value, jnp.stack([r[0] for r in rows]), atol, rtol, "batched forward vs per example")
    assert_close(da, jnp.stack([r[1] for r in rows]), atol, rtol, "batched input covectors vs per example")
    assert_close(dp, _sum(*[r[2] for r in rows]), atol, rtol,
                 "batched parameter covector vs the sum of the per-example ones")


@_law
def check_backward_is_gradient(f, a, p, loss, *, atol=ATOL, rtol=RTOL):
    """f'(a, p, dL_{f(a,p)}) = (∇_a, ∇_p) of L(f(a, p)), the gradients taken by jax.grad of the composite."""
    from .losses import dL  # the covector that starts the backward pass

    out, pullback = f.vjp(a, p)
    da, dp = pullback(dL(loss, out))
    ga, gp = jax.grad(lambda a_, p_: loss.fn(f.forward(a_, p_)), argnums=(0, 1))(a, p)
    assert_close(dp, gp, atol, rtol, "parameter covector vs jax.grad in p")
    assert_close(da, ga, atol, rtol, "input covector vs jax.grad in a")


__all__ = ["ATOL", "RTOL", "LAWS", "assert_close"] + sorted(LAWS)
