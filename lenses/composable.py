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


__all__ = ["Composable"]
