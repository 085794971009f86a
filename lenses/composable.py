"""What every combinator takes: a lens or a family of lenses, and what each declares.

`>>`, `@` and every combinator (`batched`, `tie`, `checkpoint`, `repeat`, `residual`, ...)
accept a parameterised lens (`lenses.para_lens.ParaLens`) or a family of lenses
(`lenses.families.LensFamily`). Both are `Composable`: the capabilities a combinator asks of
them are declared here, with the lens's answer as the default, so that nothing asks
whether an object happens to have them.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Callable

from categories import Space
from categories.spaces import need_space
from categories.errors import KindError, SpaceMismatch

from .picture import Drawable


class Composable(Drawable):
    """A lens or a family of lenses (abstract): what a combinator may ask of either.

    Examples:
        >>> from lenses.composable import Composable
        >>> isinstance(dense(2, 3), Composable), isinstance(tanh, Composable)
        (True, True)
    """

    name: str
    smooth: bool = True
    #: every member is an endomorphism A → A, so that what follows may fix a family
    endo: bool = False

    @abstractmethod
    def is_fixed(self) -> bool:
        """Whether its spaces are fixed: a lens's are, a family's are not."""

    @abstractmethod
    def fixed(self, who: str = "this"):
        """The lens itself (a family raises, saying how to fix it)."""

    @abstractmethod
    def lift(self, build: Callable, name: str | None = None, endo: bool | None = None):
        """`build(self)`: how a combinator maps lenses to lenses (a family maps its members)."""

    @abstractmethod
    def after(self, A: Space):
        """What follows a lens with codomain A: a lens as it is (a family fixes itself at A)."""

    def at(self, A: Space):
        """The member with domain A: a lens is the one member of its family, at its domain
        (`SpaceMismatch` at another; a family builds the member, `lenses.families`)."""
        need_space(A, f"{self.name}.at")
        lens = self.fixed(f"{self.name}.at")
        if A != lens.dom:
            raise SpaceMismatch(f"{self.name} is already fixed at {lens.dom!r}, got {A!r}: "
                                f"a lens's .at takes only its own domain")
        return lens

    def __rrshift__(self, other):  # reached only when the left side is not a lens
        refuse_operand(other, ">>", self)

    def __rmatmul__(self, other):  # reached only when the left side is not a lens
        refuse_operand(other, "@", self)

    def __mul__(self, other):  # a lens has no `*`: refused, pointing to `@`
        refuse_operand(self, "*", other)

    def __rmul__(self, other):
        refuse_operand(other, "*", self)


def refuse_operand(left, op: str, right) -> None:
    """Refuse (`KindError`) `left op right` (op `>>` or `@`) where a side is not a lens or a
    family of lenses, naming both sides and how to make a function a lens; and `left * right`
    with a lens on either side (lenses have no `*`: their parallel product is `@`)."""
    def side(x):
        if isinstance(x, Composable):
            return x.name
        fn = getattr(x, "__name__", None)
        return f"the function {fn}" if fn and callable(x) else f"{type(x).__name__} {x!r:.40}"
    if op == "*":
        raise KindError(f"cannot form {side(left)} * {side(right)}: a lens has no *; put two "
                        "lenses side by side with @ (the parallel product f ⊗ g, e.g. "
                        "dense(2, 3) @ dense(1, 1)) and compose them with >>")
    bad = right if isinstance(left, Composable) else left
    hint = (f"a JAX function is made a lens by activation(name, fn) (e.g. "
            f"activation('tanh', jnp.tanh), or use lenses.tanh)" if getattr(bad, "__name__", None)
            and callable(bad) else
            "both sides must be lenses (e.g. dense(2, 3)) or families of lenses (e.g. tanh)")
    raise KindError(f"cannot form {side(left)} {op} {side(right)}: {side(bad)} is not a lens or "
                    f"a family of lenses; {hint}")


__all__ = ["Composable", "refuse_operand"]
