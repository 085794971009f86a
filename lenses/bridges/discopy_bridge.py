"""String diagrams for papers through DisCoPy: a lens expression as a DisCoPy diagram, and TikZ.

`to_discopy(lens)` is a functor from lens expressions to diagrams of `discopy.markov` (the
Markov categories: monoidal, with copy, merge and discard): it reads the lens's picture term
(`lens.picture()`, the protocol's description of its piece of the string diagram) and sends

- a chain to DisCoPy's composition `>>`, a parallel product to its tensor `@`: so
  `to_discopy(f >> g) == to_discopy(f) >> to_discopy(g)` and `to_discopy(f @ g) ==
  to_discopy(f) @ to_discopy(g)`;
- a layer A → B with parameter object P to the box `Box(name, P ⊗ A, B)` fed by the state
  `θ : I → P` (the parameter wire from above), so that the diagram has type A → B and
  composes as the lens does; without parameters (P = R^0) to `Box(name, A, B)`;
- `copy`, `add`, `discard` to DisCoPy's own `Diagram.copy`, `Diagram.merge`, `Diagram.discard`;
- a framed piece (`checkpoint`, `repeat`, a reparameterisation, `batched`) to a bubble around
  its inside, titled as the frame, fed by the frame's parameter wire if it has one.

A space is one wire per factor of a product (none for R^0), labelled by the space, as in
`lenses.drawing.diagrams`. `to_tikz(lens)` writes the diagram with DisCoPy's TikZ backend. DisCoPy
is optional (`pip install 'paralens[diagrams]'`): it is imported when these are called.
"""

from __future__ import annotations

import os
import re
import tempfile
from functools import reduce

from categories import Product, Space
from categories.errors import CheckpointError, KindError, MissingExtraError

from .. import picture

#: the `data` of the state that feeds a parameter wire (tells it apart from a layer's box)
PARAMETER = "parameter"


_BUBBLE: dict = {}


def _markov():
    try:
        from discopy import markov, monoidal
    except ImportError as e:
        raise MissingExtraError("to_discopy needs DisCoPy: pip install 'paralens[diagrams]'") from e
    if "markov" not in _BUBBLE:
        # DisCoPy's bubble of a Markov diagram is a plain monoidal one, which no longer
        # composes with Markov diagrams; a bubble that is a Markov box, as DisCoPy writes its
        # Frobenius bubble, does.
        class Bubble(monoidal.Bubble, markov.Box):
            """A frame in a Markov diagram (a monoidal bubble that is a Markov box)."""
            __ambiguous_inheritance__ = (monoidal.Bubble,)

        _BUBBLE["markov"] = Bubble
    return markov


def _bubble(inner, title, dom=None, cod=None):
    return _BUBBLE["markov"](inner, dom=dom, cod=cod, name=title, drawing_name=title)


def _wires(space) -> list:
    if space is None:
        return ["?"]
    if isinstance(space, Product):
        return [w for f in space.factors for w in _wires(f)]
    return [] if space.size == 0 else [repr(space)]


def _ty(m, space):
    return m.Ty(*_wires(space))


def _fed(m, body, param, dom):
    """`body : P ⊗ A → B` fed by the parameter state θ : I → P: a diagram A → B."""
    P = m.Ty(repr(param))
    return (m.Box("θ", m.Ty(), P, data=PARAMETER) @ dom) >> body


def _translate(pic, m):
    if isinstance(pic, picture.Then):
        return reduce(lambda d, p: d >> _translate(p, m), pic.parts[1:], _translate(pic.parts[0], m))
    if isinstance(pic, picture.Beside):
        return reduce(lambda d, p: d @ _translate(p, m), pic.parts[1:], _translate(pic.parts[0], m))
    if isinstance(pic, picture.Framed):
        inner = _translate(pic.inner, m)
        if pic.param is None or pic.param.size == 0:
            return _bubble(inner, pic.title)
        return _fed(m, _bubble(inner, pic.title, m.Ty(repr(pic.param)) @ inner.dom, inner.cod),
                    pic.param, inner.dom)
    dom, cod = _ty(m, pic.dom), _ty(m, pic.cod)
    if isinstance(pic, picture.Dot) and pic.kind == "copy":
        return m.Diagram.copy(dom, 2)
    if isinstance(pic, picture.Dot) and pic.kind == "add":
        return m.Diagram.merge(cod, 2)
    if isinstance(pic, picture.Dot) and pic.kind == "discard":
        return m.Diagram.discard(dom)
    param = pic.param
    if param is None or param.size == 0:
        return m.Box(pic.name, dom, cod)
    return _fed(m, m.Box(pic.name, m.Ty(repr(param)) @ dom, cod), param, dom)


def to_discopy(lens):
    """The lens expression as a `discopy.markov.Diagram` A → B (a functor: preserves `>>`
    and `@`; layers are boxes fed by their parameter wires, copies DisCoPy's copies).

    Examples:
        >>> d = to_discopy(dense(2, 3) >> tanh)
        >>> str(d.dom), str(d.cod)
        ('R^2', 'R^3')
        >>> d == to_discopy(dense(2, 3)) >> to_discopy(tanh.at(R(3)))
        True
    """
    picture.need_drawable(lens, "to_discopy")
    if not lens.is_fixed():
        lens.fixed("to_discopy")  # a family says how to fix it
    return _translate(lens.picture(), _markov())


# the characters of lens and space names, as LaTeX's math mode writes them
_MACROS = {"→": r"\to ", "×": r"\times ", "θ": r"\theta ", "≫": r"\gg ", "⊗": r"\otimes ",
           "·": r"\cdot ", "∘": r"\circ ", "η": r"\eta ", "λ": r"\lambda ", "♯": r"\sharp ",
           "′": "'", "−": "-", " ": r"\ ", "{": r"\{", "}": r"\}", "_": r"\_", "%": r"\%",
           "#": r"\#", "&": r"\&", "$": r"\$", "\\": r"\backslash "}
_WORD = re.compile(r"[A-Za-z]{2,}")
_LABEL = re.compile(r"^(\\node \[[^]]*\] \(\d+\) at \([^)]*\) \{)(.+)(\};)$", re.M)


def _math(name: str) -> str:
    """A name in math mode: words upright (`\\mathrm`), each symbol its macro."""
    out, words = [], _WORD.findall(name)
    for i, part in enumerate(_WORD.split(name)):
        if i:
            out.append(r"\mathrm{" + words[i - 1] + "}")
        for c in part:
            if c in _MACROS:
                out.append(_MACROS[c])
            elif c.isascii():
                out.append(c)
            else:
                raise KindError(f"to_tikz cannot write {c!r} (in the name {name!r}) in LaTeX")
    return "".join(out).strip()


def _spaces(pic, found: dict) -> dict:
    """Every space a picture's wires are labelled with (as `to_discopy` labels them: `repr`),
    with its LaTeX (`Space.latex`)."""
    for space in (pic.dom, pic.cod, pic.param):
        if isinstance(space, Space):
            found[repr(space)] = space.latex()
            for factor in space.factors if isinstance(space, Product) else ():
                _spaces(picture.Boxed("", factor, None), found)
    for inner in (pic.inner, *pic.parts):
        if inner is not None:
            _spaces(inner, found)
    return found


def to_tikz(lens, path=None, **params) -> str:
    """The string diagram of `lens` as TikZ (DisCoPy's own output: `diagram.draw(to_tikz=True)`)
    with every label in math mode (a space as `Space.latex` writes it, a name with LaTeX's
    macros), returned as text and, if `path` is given, written there; `params` go to DisCoPy's
    `draw`. It compiles with pdflatex after `\\usepackage{amsmath, amssymb, tikz}` and
    DisCoPy's layers and style (`\\pgfdeclarelayer{edgelayer}`, `{nodelayer}`,
    `\\pgfsetlayers{edgelayer,nodelayer,main}`, `\\tikzset{none/.style={}}`).

    Examples:
        >>> text = to_tikz(dense(2, 3))
        >>> r"\\begin{tikzpicture}" in text, r"{$\\mathrm{dense}(2\\to 3)$}" in text
        (True, True)
        >>> r"{$\\mathbb{R}^{3 \\times 2} \\times \\mathbb{R}^{3}$}" in text, r"{$\\theta$}" in text
        (True, True)
    """
    diagram = to_discopy(lens)
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise KindError(f"to_tikz: path must be a file name (a str or os.PathLike), got {path!r}")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "diagram.tikz")
        diagram.draw(path=out, to_tikz=True, **params)
        with open(out, encoding="utf-8") as f:
            text = f.read()
    spaces = _spaces(lens.picture(), {})
    text = _LABEL.sub(lambda m: m.group(1) + "$" + (spaces.get(m.group(2)) or _math(m.group(2)))
                      + "$" + m.group(3), text)
    if path is not None:
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:  # as `save` refuses a file it cannot write
            raise CheckpointError(f"to_tikz cannot write the file {os.fspath(path)!r}: {e}") \
                from None
    return text


__all__ = ["to_discopy", "to_tikz", "PARAMETER"]
