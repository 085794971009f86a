"""The batch traversal of a lens: the per-example lens over a leading batch axis.

`batched(lens)` evaluates the lens on every example of a batch (one `vmap`) and adds the
parameter covectors of the examples: the batch score is the sum of per-example scores.
"""

from __future__ import annotations

from categories.errors import KindError

from . import picture
from .composable import Composable
from .inputs import as_real, check_batch, need_fixed, need_lens
from .para_lens import ParaLens


class Batched(picture.Drawable):
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
        self.lens = lens = need_fixed(lens, "Batched")
        self.name = f"batched({lens.name})"
        self.param = lens.param

    def is_fixed(self) -> bool:
        return True

    def _not_composed(self, other, op: str = ">>"):
        """`KindError`: a batch traversal is applied to a composite, not composed itself."""
        raise KindError(f"cannot form {self.name} {op} {other.name if isinstance(other, Composable) else repr(other)}: "
                        f"{self.name} is the batch traversal of a lens, not a lens; compose "
                        f"first, then batch: batched(f {op} g)")

    __rshift__ = __rrshift__ = _not_composed

    def __matmul__(self, other):
        self._not_composed(other, "@")

    __rmatmul__ = __matmul__

    def _check(self, X, p) -> int:
        n = check_batch(self.lens.dom, X, f"batched({self.lens.name})", concrete_values=True)
        self.lens.param.check(p, f"the parameter of {self.lens.name}")
        return n

    def forward(self, X, p):
        """f(x_i, p) for every example x_i of the batch X, shape (n, *cod)."""
        self._check(X, p)
        return self.lens.apply(X, p, True)

    __call__ = forward

    def vjp(self, X, p):
        """(the batch of outputs, pullback); the pullback takes a batch of covectors on the
        codomain (a `Covector` or its raw value, leading axis n) and gives the batch of input
        covectors and the parameter covector added over the batch."""
        n = self._check(X, p)
        b, pull = self.lens.apply_vjp(as_real(self.lens.dom, X), p, True)
        return b, self.lens.wrap_pullback(pull, lead=(n,), out=b)

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

    def _repr_svg_(self):
        return picture.svg_of(self)


def batched(lens):
    """The batch traversal of `lens` (a family gives the family of its members' traversals).

    Examples:
        >>> model = batched(dense(2, 3) >> tanh)
        >>> model.forward(jnp.ones((4, 2)), (dense(2, 3).init(jax.random.PRNGKey(0)), None)).shape
        (4, 3)
    """
    need_lens(lens, "batched")
    return lens.lift(Batched, name=f"batched({lens.name})")


__all__ = ["Batched", "batched"]
