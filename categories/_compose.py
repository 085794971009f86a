"""The one "cannot compose" error of every category in both packages.

Each category defines its composition once (`Smooth`, `Linear`, `Para`, `Lens`, `ParaLens`);
each of those definitions checks its two morphisms here, so that a mismatch is reported in
one wording, naming both morphisms and both spaces.
"""

from __future__ import annotations

from .errors import KindError, SpaceMismatch
from .numbers import need_name
from .spaces import Space


def check_composable(f, g, why: str | None = None) -> None:
    """Raise a `SpaceMismatch` (a `TypeError`) naming f, g and their spaces unless f.cod == g.dom (and `why` is None:
    a further reason the category has for refusing, e.g. vectors against covectors).

    Examples:
        >>> f = Smooth(R(2), R(3), lambda x: jnp.concatenate([x, x[:1]]), "f")
        >>> check_composable(f, Smooth(R(3), R(), jnp.sum, "sum"))  # f.cod == dom: nothing raised
        >>> check_composable(f, f)
        Traceback (most recent call last):
            ...
        categories.errors.SpaceMismatch: cannot compose f : R^2 → R^3 with f : R^2 → R^3: the...
        >>> check_composable(None, f)
        Traceback (most recent call last):
            ...
        categories.errors.KindError: check_composable needs two morphisms (maps or lenses, ...
    """
    spaces: tuple
    try:
        spaces = (f.dom, f.cod, g.dom, g.cod)
    except AttributeError:  # not a morphism of any category: None, a string, a function
        spaces = ()
    if not spaces or not all(isinstance(s, Space) for s in spaces):
        raise KindError(f"check_composable needs two morphisms (maps or lenses, each with spaces "
                        f"dom and cod, e.g. Smooth(R(2), R(3), fn)), got {type(f).__name__} "
                        f"{f!r:.40} and {type(g).__name__} {g!r:.40}")
    if f.cod == g.dom and why is None:
        return
    reason = why or f"the codomain {f.cod!r} of {f.name} is not the domain {g.dom!r} of {g.name}"
    raise SpaceMismatch(f"cannot compose {f.name} : {f.dom!r} → {f.cod!r} with "
                    f"{g.name} : {g.dom!r} → {g.cod!r}: {reason}")


def check_map_parts(kind: str, dom, cod, fn, arg: str = "fn", name=None) -> None:
    """Raise a `KindError` naming `kind` unless dom and cod are Spaces, fn is callable and the
    name is None or a string: the one constructor check of a map given by a function (`Smooth`,
    `Linear`, `Para`).

    Examples:
        >>> from categories._compose import check_map_parts
        >>> check_map_parts("Smooth", R(2), R(2), lambda x: x)  # nothing raised
        >>> check_map_parts("Linear", 2, R(2), lambda v: v)
        Traceback (most recent call last):
            ...
        categories.errors.KindError: Linear(2, R^2, ...): domain and codomain must be Spaces...
    """
    if not isinstance(dom, Space) or not isinstance(cod, Space):
        raise KindError(f"{kind}({dom!r}, {cod!r}, ...): domain and codomain must be Spaces "
                        "(e.g. R(3))")
    if not callable(fn):
        takes = {"Smooth": "one point", "Linear": "one vector"}.get(kind, "a point and parameters")
        example = "lambda a, p: ..." if kind == "Para" else "lambda x: ..."
        raise KindError(f"{kind}({dom!r}, {cod!r}, {arg}): {arg} must be a function of {takes}, "
                        f"got {type(fn).__name__} {fn!r}: pass e.g. {example}")
    need_name(name, kind)


def need_operand(f, op: str, other, kind: type, takes: str) -> None:
    """Refuse (`KindError`) `f op other` where other is not a `kind`, naming both sides and
    what the operator takes (`takes`): the one refusal of an operand of a map's operator
    (`>>`, `*`, `+`, `@`), instead of Python's AttributeError or "unsupported operand".

    Examples:
        >>> from categories import need_operand
        >>> f = Smooth(R(2), R(2), lambda x: x, "f")
        >>> need_operand(f, "+", None, Smooth, "the pointwise sum adds two smooth maps")
        Traceback (most recent call last):
            ...
        categories.errors.KindError: cannot form f + NoneType None: the pointwise sum adds two smooth maps
    """
    if not isinstance(other, kind):
        raise KindError(f"cannot form {f.name} {op} {type(other).__name__} {other!r:.40}: {takes}")


def check_landed(m, y) -> None:
    """Raise a `SpaceMismatch` unless y, the value of the map m at a point, is shaped as a
    point of m.cod (static: once per trace under jit)."""
    why = m.cod.mismatch(y, "its value")
    if why:
        raise SpaceMismatch(f"{m.name} : {m.dom!r} → {m.cod!r} does not land in its codomain: "
                            f"{why}")
