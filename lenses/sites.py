"""The parameterised slots of a model and what their layers declare, read by structured metrics.

A `Site` is a slot of a model's parameter point with the lens that owns it and what that
lens declares about its forward part (`Affine`: a ↦ W a + b), which is all a structured
metric such as KFAC reads (`ParaLens.sites`, `ParaLens.probe`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from categories import Product
from categories.numbers import flag, integer
from categories.errors import KindError, SlotError

if TYPE_CHECKING:  # the lens that owns a site (its module builds on this one)
    from .para_lens import ParaLens


@dataclass(frozen=True)
class Affine:
    """Declared by a layer R^n → R^m whose forward part is a ↦ W a + b (`bias=True`, parameter
    (W, b)) or a ↦ W a (parameter W), W of shape (m, n): its Kronecker factors are built from
    its input a and from the covector at its output W a (+ b). `transposed=True`: the slot
    holds Wᵀ, of shape (n, m), in W's place (a ↦ a Wᵀ, as Flax keeps its kernel).

    Examples:
        >>> [site.structure for site in (dense(2, 3) >> tanh >> linear(3, 1)).sites()]
        [Affine(bias=True, transposed=False), Affine(bias=False, transposed=False)]
    """

    bias: bool
    transposed: bool = False

    def __post_init__(self):
        flag(self.bias, "Affine's bias")
        flag(self.transposed, "Affine's transposed")

    def mismatch(self, dom, cod, param) -> str | None:
        """None if a layer dom → cod with parameter object `param` can be a ↦ W a (+ b) as
        declared, else why not (a structured metric reads W and b by these shapes)."""
        if any(isinstance(S, Product) or len(S.shape) != 1 for S in (dom, cod)):
            return f"its domain and codomain must be R^n and R^m, got {dom!r} → {cod!r}"
        (n,), (m,) = dom.shape, cod.shape
        w = f"R^{{{n}×{m}}}" if self.transposed else f"R^{{{m}×{n}}}"
        want = f"{w} × R^{m}" if self.bias else w
        shapes = tuple(tuple(getattr(f, "shape", ())) for f in param.factors) \
            if isinstance(param, Product) else (tuple(param.shape),)
        wshape = (n, m) if self.transposed else (m, n)
        if shapes != ((wshape, (m,)) if self.bias else (wshape,)):
            return f"its parameter object must be {want} (W{' and b' if self.bias else ''}), " \
                   f"got {param!r}"
        return None


@dataclass(frozen=True)
class Site:
    """A parameterised slot of a model: the lens that owns it, the path of indices to its point
    inside the model's parameter point, and the structure the lens declares (None: nothing).

    Examples:
        >>> [site.path for site in (dense(2, 3) >> tanh >> dense(3, 1)).sites()]
        [(0,), (2,)]
    """

    lens: "ParaLens"
    path: tuple
    structure: Any = None

    def __post_init__(self):
        from .inputs import need_fixed  # (inputs builds on the lens protocol, which builds on this)
        need_fixed(self.lens, "Site")
        if not isinstance(self.path, tuple):
            raise KindError(f"Site: path must be a tuple of slot indices, got "
                            f"{type(self.path).__name__} {self.path!r:.40}")
        for i in self.path:
            integer(i, f"Site: the index {i!r} of the path {self.path!r}", 0, error=SlotError)
        need_structure(self.structure, "Site")

    def get(self, p):
        for i in self.path:
            p = p[i]
        return p


def need_structure(structure, who: str) -> None:
    """Refuse (`KindError`, naming `who`) a declared structure that is neither None (nothing
    declared) nor `Affine`."""
    if structure is not None and not isinstance(structure, Affine):
        raise KindError(f"{who}: the structure must be None or Affine(bias=...), got "
                        f"{type(structure).__name__} {structure!r:.40}")


def at_path(p, path: tuple, value):
    """The point p with the entry at `path` replaced by `value` (tuples rebuilt, not mutated)."""
    if not path:
        return value
    parts = list(p)
    parts[path[0]] = at_path(parts[path[0]], path[1:], value)
    return tuple(parts)


__all__ = ["Affine", "Site", "need_structure", "at_path"]
