"""Repetition, `repeat(layer, n)`: n copies of one endomorphism A → A as one lens with stacked parameters.

The composite f ≫ f ≫ ... ≫ f (n times, each copy with its own parameters) has parameter
object P^n. `repeat` keeps exactly that lens but stores the point of P^n as one stacked point:
every leaf of the layer's parameter point gets a leading axis of length n (`stacked(P, n)`),
slice i being the i-th copy's parameters. The forward part is one `lax.scan` over the copies
and the backward part one reverse `lax.scan` over the kept values, so the program, and with it
the trace and compile time, has the size of one layer whatever n is.

Backward parts: a layer whose backward part JAX derives is differentiated through the scan
(JAX keeps each step's residuals and scans the pullback in reverse). A layer with a backward
part of its own (hand-written, or a recompute rule inside) is run by its own `apply_vjp` in the
forward scan; the values its pullback reads are emitted per step, and the reverse scan runs
that pullback on them. With `remat=True` only the value entering each copy is kept, and the
reverse scan recomputes the copy's forward part before running its backward part (the
recompute rule per copy: memory of n inputs, one more forward evaluation).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from categories import Positive, Product, R, Space, draws
from categories.errors import SpaceMismatch
from categories.dimensions import dimension

from . import picture

from .inputs import flag, need_fixed, need_lens, need_space
from .para_lens import ParaLens

tree_map = jax.tree_util.tree_map


@dataclass(frozen=True, repr=False)
class Stacked(Space):
    """U^n ⊆ R^{n×shape}: n points of the open set U stacked along a leading axis (open, as a
    finite product of open sets).

    Examples:
        >>> S = Stacked(Positive(2), 3)
        >>> S.shape, S.contains(jnp.ones((3, 2))), S.contains(-jnp.ones((3, 2)))
        ((3, 2), True, False)
    """

    base: Space
    n: int
    shape: tuple

    def __init__(self, base: Space, n: int):
        n = dimension(n, "Stacked: the number of copies (a positive integer)", 1)
        object.__setattr__(self, "base", need_space(base, "Stacked"))
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "shape", (n,) + tuple(base.shape))

    def interior_margin(self, x):
        return jax.vmap(self.base.interior_margin)(x)

    def indicator(self, x):
        return jnp.all(jax.vmap(self.base.indicator)(x))

    def sample_interior(self, key):
        return jax.vmap(self.base.sample_interior)(jax.random.split(key, self.n))

    def __repr__(self):
        return f"({self.base!r})^{self.n}"


def stacked(space: Space, n: int) -> Space:
    """The parameter object of n copies, as stacked points: R^s ↦ R^{n×s}, a product factor by
    factor, R^0 ↦ R^0 (n parameterless copies have no parameters), any other U ↦ U^n.

    Examples:
        >>> stacked(R(3), 4), stacked(R(0), 4), stacked(Positive(2), 3)
        (R^{4×3}, R^0, Positive(R^{3×2}))
    """
    need_space(space, "stacked")
    n = dimension(n, "stacked: the number of copies (a positive integer)", 1)
    if isinstance(space, Product):
        return Product(*(stacked(f, n) for f in space.factors))
    if space.is_terminal:
        return space
    if type(space) is R:
        return R(n, *space.shape)
    if type(space) is Positive:
        return Positive(n, *space.shape)
    return Stacked(space, n)


class Repeat(ParaLens):
    """f ≫ f ≫ ... ≫ f (n copies of f : A → A with parameters P), parameters stacked(P, n).

    Examples:
        >>> deep = repeat(dense(3, 3) >> tanh, 4)
        >>> type(deep).__name__, deep.param
        ('Repeat', (R^{4×3×3} × R^{4×3}) × R^0)
    """

    def __init__(self, layer: ParaLens, n: int, remat: bool = False):
        layer = need_fixed(layer, "Repeat")
        n = dimension(n, "Repeat's number of copies (a positive integer)", 1)
        if layer.dom != layer.cod:
            raise SpaceMismatch(f"repeat needs a layer A → A, got {layer.name} : {layer.dom!r} → {layer.cod!r}")
        self.children, self.n, self.remat = (layer,), n, flag(remat, "Repeat: remat")
        self.dom, self.cod, self.param = layer.dom, layer.cod, stacked(layer.param, n)
        self.name = f"repeat({layer.name}, {n}{', remat' if remat else ''})"
        self.smooth = layer.smooth

    @property
    def layer(self):
        return self.children[0]

    @property
    def derives(self):
        return self.layer.derives and not self.remat

    def rebuild(self, children):
        return Repeat(children[0], self.n, self.remat)

    def apply(self, a, p, batched):
        layer = self.layer

        def body(x, q):
            return layer.apply(x, q, batched), None

        return lax.scan(body, a, p, length=self.n)[0]

    def apply_vjp(self, a, p, batched):
        if self.derives:  # JAX keeps each step's residuals and scans the pullback in reverse
            return jax.vjp(lambda a, p: self.apply(a, p, batched), a, p)
        forward, backward = self._recompute(batched) if self.remat else self._keep(batched)
        b, residuals = lax.scan(forward, a, p, length=self.n)
        residuals = (residuals, p) if self.remat else residuals

        def pullback(c):  # the reverse-order rule, as a reverse scan over the copies
            return lax.scan(backward, c, residuals, length=self.n, reverse=True)

        return b, pullback

    def _keep(self, batched):
        """Forward steps running the layer's own `apply_vjp`, emitting what each pullback reads, and
        the backward step running that pullback on it."""
        layer, box = self.layer, {}

        def forward(x, q):
            y, pull = layer.apply_vjp(x, q, batched)
            # The pullback as a program plus the values it closes over: the traced values (this
            # step's residuals) leave the scan as per-step outputs; constants stay in the program.
            closed, out_shape = jax.make_jaxpr(pull, return_shape=True)(y)
            traced = [isinstance(c, jax.core.Tracer) for c in closed.consts]
            box.update(jaxpr=closed.jaxpr, traced=traced, out_tree=jax.tree_util.tree_structure(out_shape),
                       fixed=[c for c, t in zip(closed.consts, traced) if not t])
            return y, [c for c, t in zip(closed.consts, traced) if t]

        def backward(c, res):
            res, fixed = iter(res), iter(box["fixed"])
            consts = [next(res) if t else next(fixed) for t in box["traced"]]
            out = jax.core.eval_jaxpr(box["jaxpr"], consts, *jax.tree_util.tree_leaves(c))
            return jax.tree_util.tree_unflatten(box["out_tree"], out)

        return forward, backward

    def _recompute(self, batched):
        """Keep the value entering each copy; the backward step recomputes the copy's forward
        part (a loop body of its own, so XLA cannot merge it back into the forward pass)."""
        layer = self.layer

        def forward(x, q):  # the parameters are kept already: emit only the input
            return layer.apply(x, q, batched), x

        def backward(c, xq):
            return layer.apply_vjp(*xq, batched)[1](c)

        return forward, backward

    def init(self, key):
        """The layer's own initialiser, drawn independently for each copy: copy i's at key i
        of `jax.random.split(key, n)`."""
        if isinstance(key, jax.core.Tracer):  # under a trace: one program for the n copies
            return jax.vmap(self.layer.init)(jax.random.split(key, self.n))
        # Eagerly, copy by copy, stacked on the host: the same numbers, and nothing compiled
        # for the stacked shapes (`draws`)
        copies = [self.layer.init(k) for k in draws.split(key, self.n)]
        return jax.tree_util.tree_map(lambda *a: jnp.asarray(np.stack(a)), *copies)

    def term(self, inside=False):
        return f"repeat({self.layer.term()}, {self.n}{', remat' if self.remat else ''})"

    def picture(self):  # n copies with stacked parameters: one copy, framed
        title = f"repeat ×{self.n}" + (": recompute" if self.remat else "")
        return picture.Framed(title, self.layer.picture(), self.param)

    def param_repr(self):
        return f"({self.layer.param_repr()})^{self.n}"

    def unstack(self, p) -> tuple:
        """The stacked point as the tuple of the n copies' points (the parameters of the chain)."""
        return tuple(tree_map(lambda leaf: leaf[i], p) for i in range(self.n))

    def stack(self, ps) -> object:
        """The inverse of `unstack`: n points of P as one stacked point."""
        return tree_map(lambda *leaves: jnp.stack(leaves), *ps)


def repeat(layer, n: int, remat: bool = False):
    """n copies of the endomorphism `layer` in sequence, each with its own parameters, as one
    lens with stacked parameters, compiled as a scan (program size independent of n).

    Examples:
        >>> block = dense(3, 3) >> tanh
        >>> deep = repeat(block, 4)
        >>> p = deep.init(jax.random.PRNGKey(0))
        >>> x = jnp.ones(3)
        >>> y = x
        >>> for i in range(4): y = block(y, jax.tree_util.tree_map(lambda leaf: leaf[i], p))
        >>> np.allclose(deep(x, p), y)
        True
    """
    need_lens(layer, "repeat")
    n = dimension(n, "repeat's number of copies (a positive integer)", 1)
    remat = flag(remat, "repeat: remat")
    return layer.lift(lambda member: Repeat(member, n, remat),
                      name=f"repeat({layer.name}, {n}{', remat' if remat else ''})")


__all__ = ["repeat", "Repeat", "stacked", "Stacked"]
