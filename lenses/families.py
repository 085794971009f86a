"""Families of lenses: layers whose spaces a neighbour fixes.

`tanh`, `flatten`, pooling and `conv2d(...)` are not lenses with unknown spaces: each is a
family A ↦ F_A of lenses, one for every domain A it accepts. `family.at(A)` is the lens with
domain A; composing a family after a lens fixes it at that lens's codomain, and a family that
maps every A to an endomorphism A → A (`endo`) can also be fixed by what follows it.

Every combinator maps families to families: it is written once, for lenses, and a family
applies it to its members (`lift`). Evaluating or training a family that has not been fixed
raises a `TypeError` that says how to fix it.
"""

from __future__ import annotations

from typing import Callable

from categories import Product, Space
from categories.errors import KindError, SpaceMismatch

from . import picture
from .composable import Composable, refuse_operand
from .inputs import flag, need_callable, need_name, need_reparam, need_space


class LensFamily(Composable):
    """A family A ↦ F_A of parameterised lenses (`make(A)` builds the member with domain A).

    Examples:
        >>> isinstance(tanh, LensFamily)
        True
        >>> tanh.at(R(3))
        tanh : R^3 → R^3, params R^0
        >>> dense(2, 3) >> tanh
        dense(2→3) ≫ tanh : R^2 → R^3, params R^{3×2}×R^3 × R^0
    """

    def __init__(self, make: Callable[[Space], object], name: str, smooth: bool = True,
                 endo: bool = False):
        need_callable(make, f"the make of the family {name!r}")
        self._make, self.name = make, need_name(name, "a family of lenses", optional=False)
        self.smooth, self.endo = flag(smooth, f"{name}: smooth"), flag(endo, f"{name}: endo")
        self._members: dict = {}

    def at(self, A: Space):
        """The member with domain A."""
        need_space(A, f"{self.name}.at")
        if A not in self._members:
            member = self._make(A)
            if not isinstance(member, Composable) or not member.is_fixed():
                raise KindError(f"the family {self.name} at {A!r} gives {type(member).__name__} "
                                f"{member!r:.40}, not a lens: its make(A) must build a lens")
            lens = member.fixed(f"the family {self.name}")
            if lens.dom != A:  # the member at A is a lens on A itself, not on a space like it
                raise SpaceMismatch(f"the family {self.name} at {A!r} gives {lens.name}, whose "
                                    f"domain is {lens.dom!r}: its make(A) must build a lens on A")
            self._members[A] = member
        return self._members[A]

    # -- what lenses ask ----------------------------------------------------------------------
    def is_fixed(self) -> bool:
        return False

    def _fix_hint(self) -> str:
        term = f"({self.name})" if " " in self.name else self.name
        return (f"{self.name} is a family of lenses with no fixed spaces: fix it with "
                f"{term}.at(R(...)), or compose it after a lens whose codomain fixes it")

    def fixed(self, who: str = "this"):
        raise KindError(f"{who} needs a lens with fixed spaces: {self._fix_hint()}")

    def after(self, A: Space):
        """The member that follows a lens with codomain A."""
        return self.at(A)

    def lift(self, build: Callable, name: str | None = None, endo: bool | None = None):
        """The family A ↦ build(F_A): a combinator applied to every member."""
        return LensFamily(lambda A: build(self.at(A)), name or self.name, self.smooth,
                          self.endo if endo is None else endo)

    # -- composition --------------------------------------------------------------------------
    def __rshift__(self, other):
        if not isinstance(other, Composable):
            refuse_operand(self, ">>", other)
        if other.is_fixed() and self.endo:  # an endomorphism family is fixed by what follows
            return self.at(other.dom) >> other
        return LensFamily(lambda A: self.at(A) >> other, f"{self.name} ≫ {other.name}",
                          self.smooth and other.smooth, self.endo and other.endo)

    def __matmul__(self, other):
        if not isinstance(other, Composable):
            refuse_operand(self, "@", other)
        return _beside(self, other)

    def __rmatmul__(self, other):
        if not isinstance(other, Composable):
            refuse_operand(other, "@", self)
        return _beside(other, self)

    def reparam(self, r, init=None, name=None):
        need_reparam(r, init, self.name, None)  # its codomain is checked member by member
        need_name(name, f"{self.name}.reparam")
        return self.lift(lambda member: member.reparam(r, init, name))

    # -- what only lenses can do ---------------------------------------------------------------
    def _refuse(self, *args, **kw):
        raise KindError(f"cannot evaluate {self._fix_hint()}")

    forward = vjp = backward = init = __call__ = _refuse

    def term(self, inside: bool = False) -> str:
        return self.name

    def picture(self):
        return picture.Boxed(self.name, None, None, None)

    def atoms(self) -> list:
        return [self]

    def type_str(self) -> str:
        return "A → A (any A)" if self.endo else "any domain"

    def __repr__(self):
        return f"{self.name} (a family: {self.type_str()})"


def _beside(f, g) -> LensFamily:
    """f ⊗ g where one side is a family: the family on A × C of the members' products."""
    def make(AC: Space):
        if not isinstance(AC, Product) or len(AC.factors) != 2:
            raise SpaceMismatch(f"({f.name} ⊗ {g.name}) needs a domain A × C, got {AC!r}")
        A, C = AC.factors
        left = f.at(A) if not f.is_fixed() else f
        right = g.at(C) if not g.is_fixed() else g
        for side, S in ((left, A), (right, C)):
            if side.dom != S:
                raise SpaceMismatch(f"({f.name} ⊗ {g.name}) at {AC!r}: {side.name} has domain "
                                f"{side.dom!r}, not {S!r}")
        return left @ right

    return LensFamily(make, f"({f.name} ⊗ {g.name})", f.smooth and g.smooth,
                      f.endo and g.endo)


def family(make: Callable[[Space], object], name: str, smooth: bool = True, endo: bool = False):
    """The family A ↦ make(A) (`endo`: every member is an endomorphism A → A).

    Examples:
        >>> double = family(lambda A: Layer(A, A, R(0), lambda a, p: 2 * a, name="double"), "double", endo=True)
        >>> double.at(R(2))(jnp.array([1.0, 2.0]), None).tolist()
        [2.0, 4.0]
    """
    return LensFamily(make, name, smooth, endo)


__all__ = ["LensFamily", "family"]
