"""The recompute rule (gradient checkpointing) beside the default store rule.

The composition rule evaluates g's backward part at the forward value f(a, p), which must be
kept or computed again. `checkpoint(lens)` keeps only (a, p) and recomputes the forward values
when the covector arrives: same values and covectors, less memory, one more forward pass.
With `segments=k` a chain is cut into k consecutive runs recomputed one at a time (k ≈ √n
gives memory ∝ √n for n components).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from categories.dimensions import dimension

from . import picture

from categories.errors import KindError

from .inputs import need_fixed, need_lens
from .para_lens import Chain, ParaLens, sequence_vjp

tree_map = jax.tree_util.tree_map


def _always_true():
    """A true predicate that XLA cannot evaluate at compile time (a draw u ∈ [0, 1) and u < 2).

    XLA's CPU pipeline drops optimisation barriers before common-subexpression elimination, so
    a recomputation in the same computation as the forward pass is merged back into it and
    nothing is saved (`jax.checkpoint` itself saves nothing there). A branch of a conditional
    is a computation of its own, out of CSE's reach; this predicate keeps the branch taken.
    """
    return lax.rng_uniform(jnp.float32(0), jnp.float32(1), ()) < 2


def recomputing_vjp(inner: ParaLens, a, p, batched: bool, policy=None):
    """The recompute rule for one lens: keep (a, p) only; run inner's own forward and backward
    parts again (hand-written ones included) when the covector arrives."""
    if policy is not None:  # JAX's remat decides what is kept (its derivation of the forward)
        return jax.vjp(jax.checkpoint(lambda a, p: inner.apply(a, p, batched), policy=policy), a, p)

    @jax.custom_vjp
    def f(a, p):
        return inner.apply(a, p, batched)

    def f_fwd(a, p):
        return inner.apply(a, p, batched), (a, p)

    def f_bwd(res, bc):
        def again(args):
            a, p, bc = args
            return inner.apply_vjp(a, p, batched)[1](bc)

        # Integer inputs (tokens, keys) have no covector: JAX's float0, which a conditional
        # cannot carry, so only the real covectors go through it and float0 is put back here.
        # The covectors have the structure and shapes of (a, p), float0 where a leaf is
        # integer: read off the values, not by tracing the forward part once more.
        leaves, tree = jax.tree_util.tree_flatten(res)
        real = [jnp.issubdtype(jnp.result_type(leaf), jnp.inexact) for leaf in leaves]
        leaves = [jax.ShapeDtypeStruct(jnp.shape(leaf), jnp.result_type(leaf)) for leaf in leaves]

        def taken(args):
            return [c for c, r in zip(jax.tree_util.tree_leaves(again(args)), real) if r]

        def never(args):  # not taken; it only gives the conditional its second branch
            return [jnp.zeros(leaf.shape, leaf.dtype) for leaf, r in zip(leaves, real) if r]

        out = iter(lax.cond(_always_true(), taken, never, (*res, bc)))
        return jax.tree_util.tree_unflatten(
            tree, [next(out) if r else np.zeros(leaf.shape, jax.dtypes.float0)
                   for leaf, r in zip(leaves, real)])

    f.defvjp(f_fwd, f_bwd)
    return jax.vjp(f, a, p)


def _segments(n: int, segments) -> int:
    if segments is None:
        return 1
    if segments == "sqrt":
        return max(1, round(math.sqrt(n)))
    return min(dimension(segments, "segments (a positive integer or 'sqrt')", 1), n)


class Checkpointed(ParaLens):
    """The recompute rule for `lens`: same values and covectors; the backward pass recomputes
    the forward values from (a, p) instead of keeping them. The parameter point is the lens's
    own (a chain's: one slot per component, whatever the segments).

    Examples:
        >>> model = checkpoint(dense(2, 2) >> tanh >> dense(2, 1))
        >>> type(model).__name__, model.param == (dense(2, 2) >> tanh >> dense(2, 1)).param
        ('Checkpointed', True)
    """

    def __init__(self, lens: ParaLens, policy=None, segments=None):
        lens = need_fixed(lens, "Checkpointed")
        self.children, self.policy, self._segments_arg = (lens,), policy, segments
        n = len(lens.parts)
        k = _segments(n, segments)
        self.segments = tuple((n * i // k, n * (i + 1) // k) for i in range(k))
        self._pieces = (lens,) if k == 1 else tuple(
            Chain(lens.parts[lo:hi]) if hi - lo > 1 else lens.parts[lo] for lo, hi in self.segments)
        self.dom, self.cod, self.param, self.smooth = lens.dom, lens.cod, lens.param, lens.smooth
        self.name = f"checkpoint({lens.name})" if segments is None else \
            f"checkpoint({lens.name}, segments={k})"

    @property
    def lens(self):
        return self.children[0]

    @property
    def derives(self):
        return False  # a rule of its own: recompute

    def rebuild(self, children):
        return Checkpointed(children[0], self.policy, self._segments_arg)

    def apply(self, a, p, batched):
        return self.lens.apply(a, p, batched)

    def apply_vjp(self, a, p, batched):
        if len(self._pieces) == 1:
            return recomputing_vjp(self.lens, a, p, batched, self.policy)
        steps = [(lambda a, q, piece=piece: recomputing_vjp(piece, a, q, batched, self.policy),
                  tuple(p[lo:hi]) if hi - lo > 1 else p[lo])
                 for (lo, hi), piece in zip(self.segments, self._pieces)]
        b, pull = sequence_vjp(steps, a)

        def pullback(c):
            c, dps = pull(c)
            flat = []
            for (lo, hi), dp in zip(self.segments, dps):
                flat.extend(dp if hi - lo > 1 else [dp])
            return c, tuple(flat)

        return b, pullback

    def uses(self):
        return self.lens.uses()

    def sites(self):
        return self.lens.sites()

    def probe(self, a, p, deltas, inputs):
        return self.lens.probe(a, p, deltas, inputs)

    def init(self, key):
        return self.lens.init(key)

    def term(self, inside=False):
        return f"checkpoint({self.lens.term()})"

    def picture(self):
        return picture.Framed("checkpoint: recompute", self.lens.picture(), None)

    def param_repr(self):
        return self.lens.param_repr()


def checkpoint(lens, policy=None, segments=None):
    """The recompute rule (gradient checkpointing) for `lens` (or for every member of a
    family); `segments=k` (or "sqrt") cuts a chain into k runs recomputed one at a time.

    Examples:
        >>> plain = dense(2, 2) >> tanh >> dense(2, 1)
        >>> kept = checkpoint(plain, segments=2)
        >>> p, x = plain.init(jax.random.PRNGKey(0)), jnp.array([0.5, -1.0])
        >>> a1, p1 = plain.backward(x, p, jnp.ones(1))
        >>> a2, p2 = kept.backward(x, p, jnp.ones(1))
        >>> np.allclose(unwrap(a1), unwrap(a2)), all(np.allclose(u, v) for u, v in zip(jax.tree_util.tree_leaves(unwrap(p1)), jax.tree_util.tree_leaves(unwrap(p2))))
        (True, True)
    """
    need_lens(lens, "checkpoint")
    if policy is not None and not callable(policy):
        raise KindError(f"checkpoint: policy must be one of jax.checkpoint_policies (a callable), "
                        f"got {policy!r}")
    if segments is not None:
        _segments(1, segments)  # refuse a bad argument now, not when a family is fixed
    return lens.lift(lambda member: Checkpointed(member, policy, segments),
                     name=f"checkpoint({lens.name})")


__all__ = ["Checkpointed", "checkpoint", "recomputing_vjp"]
