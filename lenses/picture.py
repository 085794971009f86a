"""Pictures: the terms each kind of lens gives for its piece of a string diagram.

A lens answers `picture()` with one of these; `lenses.drawing.diagrams` lays the term out on a grid
and renders it as text or with matplotlib. Spaces are kept as spaces: the layout decides
what a wire is called (one wire per factor of a product, none for R^0).

The terms are plain data, so the core of the library owns them and imports no drawing: the
drawing module registers how a lens is shown as SVG (`register_svg`), and a lens's
`_repr_svg_` asks `svg_of`, which is None (the text is shown) until then or without
matplotlib.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from categories.errors import KindError


class Picture:
    """A piece of string diagram (abstract). What a kind of piece lacks is None (no wires, no
    parameter, nothing inside) or empty (no parts)."""

    dom: Any = None
    cod: Any = None
    param: Any = None
    inner: "Picture | None" = None
    parts: tuple = ()


class Drawable(ABC):
    """What a string diagram may be drawn of: a lens, a family of lenses, a batch traversal
    (abstract): its piece of the diagram, and whether its spaces are fixed."""

    @abstractmethod
    def picture(self) -> Picture:
        """Its piece of the string diagram."""

    @abstractmethod
    def is_fixed(self) -> bool:
        """Whether its spaces are fixed (a family's are not)."""


def need_drawable(x, who: str) -> None:
    """Refuse (`KindError`) what no string diagram can be drawn of (not a lens or family)."""
    if not isinstance(x, Drawable):
        raise KindError(f"{who} needs a lens (e.g. dense(2, 3)) or a family of lenses (e.g. "
                        f"tanh), got {type(x).__name__} {x!r}")


@dataclass(frozen=True)
class Boxed(Picture):
    """A box named `name`, wires `dom` in and `cod` out, a parameter wire `param` from above."""

    name: str
    dom: Any
    cod: Any
    param: Any = None


@dataclass(frozen=True)
class Dot(Picture):
    """A node (copy, add, discard): the wires meet at a dot, no box. `kind`: "copy", "add",
    "discard" (the diagonal, the sum, the map to R^0), or "node" (any other)."""

    name: str
    dom: Any
    cod: Any
    kind: str = "node"


@dataclass(frozen=True)
class Framed(Picture):
    """A dashed frame titled `title` around `inner`, with a parameter wire `param` (or None)."""

    title: str
    inner: Picture
    param: Any = None


@dataclass(frozen=True)
class Then(Picture):
    """Pieces left to right, outputs of each wired to the inputs of the next."""

    parts: tuple


@dataclass(frozen=True)
class Beside(Picture):
    """Pieces stacked top to bottom (the parallel product)."""

    parts: tuple


_SVG: list = []  # the registered renderer (at most one): lens ↦ SVG text


def register_svg(render) -> None:
    """Make `render(lens) -> str` how lenses are shown as SVG (`lenses.drawing.diagrams.svg`)."""
    _SVG[:] = [render]


def svg_of(lens) -> str | None:
    """The lens as SVG by the registered renderer; None without one or without its optional
    dependency (matplotlib), so that a notebook shows the lens's text instead."""
    if not _SVG:
        return None
    try:
        return _SVG[0](lens)
    except ImportError:
        return None


__all__ = ["Picture", "Drawable", "need_drawable", "Boxed", "Dot", "Framed", "Then", "Beside", "register_svg", "svg_of"]
