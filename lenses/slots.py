"""The parameter slots of a lens: how many times each is used, tying them, how many numbers.

A lens's parameter point has one slot per parameterised component (a chain's are its
components'); `tie` shares slots (the reparameterisation along the diagonal, written once in
`categories.para`), `uses` counts the uses of each slot, `n_params` the coordinates of all.
"""

from __future__ import annotations

from typing import Any

from categories import para_tie
from categories.para import check_slots

from .inputs import need_lens
from .para_lens import ParaLens


def tie(lens, slots):
    """Weight tying, `categories.para_tie` (the reparameterisation along the diagonal: the shared
    slot receives the sum of the covectors of its uses), for lenses and families of lenses.
    The slots are checked now, also for a family (whose members share one parameter object
    structure only once fixed: then again).

    Examples:
        >>> layer = linear(2, 2)
        >>> model = tie(layer >> layer, [0, 1])
        >>> model.param, uses(model)
        (R^{2×2}, 2)
    """
    need_lens(lens, "tie")
    if lens.is_fixed():
        check_slots(lens.param, slots)
    return lens.lift(lambda member: para_tie(member, slots))


def uses(lens) -> Any:
    """How many times each parameter slot of `lens` is used (nested like the point).

    Examples:
        >>> uses(dense(2, 2) >> dense(2, 2)), uses(tie(linear(2, 2) >> linear(2, 2), [0, 1]))
        ((1, 1), 2)
    """
    need_lens(lens, "uses")
    return lens.fixed("uses").uses()


def n_params(lens: ParaLens) -> int:
    """The dimension of the parameter object.

    Examples:
        >>> n_params(dense(2, 3) >> tanh >> dense(3, 1))
        13
    """
    need_lens(lens, "n_params")
    return lens.fixed("n_params").param.size


__all__ = ["tie", "uses", "n_params"]
