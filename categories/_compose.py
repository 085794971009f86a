"""The one "cannot compose" error of every category in both packages.

Each category defines its composition once (`Smooth`, `Linear`, `Para`, `Lens`, `ParaLens`);
each of those definitions checks its two morphisms here, so that a mismatch is reported in
one wording, naming both morphisms and both spaces.
"""

from __future__ import annotations

from .errors import SpaceMismatch


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
    """
    if f.cod == g.dom and why is None:
        return
    reason = why or f"the codomain {f.cod!r} of {f.name} is not the domain {g.dom!r} of {g.name}"
    raise SpaceMismatch(f"cannot compose {f.name} : {f.dom!r} → {f.cod!r} with "
                    f"{g.name} : {g.dom!r} → {g.cod!r}: {reason}")
