"""`to_discopy` and `to_tikz`: lens expressions as DisCoPy diagrams, for every combinator.

Oracles: DisCoPy's own composition and tensor (the translation must be a functor on `>>` and
`@`), the lens's atoms (each layer one box, fed by a parameter wire labelled with its
parameter object; copies DisCoPy's copies), and the text DisCoPy writes as TikZ.
"""

import re
import shutil
import subprocess

import jax.numpy as jnp
import pytest

from categories import R
from lenses import (KindError, Layer, add, batched, checkpoint, copy, dense, discard, from_function,
                    linear, repeat, residual, rnn_cell, tanh, tie, unroll)

markov = pytest.importorskip("discopy.markov")
from lenses.bridges.discopy_bridge import PARAMETER, to_discopy, to_tikz  # noqa: E402

A = R(3)
f = dense(3, 3)
NODES = ("copy", "add", "discard")

# every combinator of the library, each an endomorphism of R^3 so that any two compose
ENDOS = {
    "layer": f,
    "family member": tanh.at(A),
    "chain": f >> tanh >> linear(3, 3),
    "copy and add": copy(A) >> (f @ tanh.at(A)) >> add(A),
    "discard": copy(A) >> (f @ discard(A)) >> Layer(A * R(0), A, R(0), lambda a, p: a[0],
                                                    name="first", node=True),
    "residual": residual(f >> tanh),
    "repeat": repeat(f, 3),
    "checkpoint": checkpoint(f >> tanh),
    "tie": tie(f >> tanh >> f, [0, 2]),
    "function": from_function(lambda p, x: p * jnp.sin(x), jnp.ones(3), A, name="p·sin"),
}


@pytest.mark.parametrize("name", sorted(ENDOS))
def test_composition_and_product_are_preserved(name):
    lens = ENDOS[name]
    names = sorted(ENDOS)
    other = ENDOS[names[(names.index(name) + 1) % len(names)]]
    for a, b in ((lens, other), (other, lens), (lens, lens)):
        assert to_discopy(a >> b) == to_discopy(a) >> to_discopy(b), (a.name, b.name)
        assert to_discopy(a @ b) == to_discopy(a) @ to_discopy(b), (a.name, b.name)
    d = to_discopy(lens)
    assert d.dom == markov.Ty("R^3") and d.cod == markov.Ty("R^3")


def boxes(diagram):
    """The boxes of a DisCoPy diagram in order, frames opened (a bubble: its inside)."""
    out = []
    for box in diagram.boxes:
        out += boxes(box.arg) if hasattr(box, "arg") else [box]
    return out


def atom_boxes(lens):
    """What each atom of the lens must become, in order: (name, parameter label) for a layer
    (label None without parameters), its kind for copy, add and discard."""
    return [a.node if getattr(a, "node", None) in NODES else (a.name, repr(a.param) if a.param.size else None)
            for a in lens.atoms()]


def drawn_boxes(diagram):
    out, params = [], []
    for box in boxes(diagram):
        if box.data == PARAMETER:
            params.append(box.cod.inside[0].name)
        elif isinstance(box, markov.Discard):  # (DisCoPy's discard is a copy into 0 wires)
            out.append("discard")
        elif isinstance(box, markov.Merge):
            out.append("add")
        elif isinstance(box, markov.Copy):
            out.append("copy")
        elif not isinstance(box, markov.Swap):
            out.append((box.name, params.pop() if params and box.dom.inside
                        and box.dom.inside[0].name == params[-1] else None))
    return out


@pytest.mark.parametrize("name", ["chain", "copy and add", "discard", "residual", "tie",
                                  "function"])
def test_boxes_and_parameter_wires_correspond_to_the_atoms(name):
    lens = ENDOS[name]
    assert drawn_boxes(to_discopy(lens)) == atom_boxes(lens)


def test_frames_are_bubbles_around_their_inside_and_copies_are_discopys():
    d = to_discopy(repeat(f, 3))  # the frame's parameter wire (stacked) feeds the bubble
    state, frame = d.boxes
    assert state.data == PARAMETER and state.cod == markov.Ty("R^{3×3×3} × R^{3×3}")
    assert frame.name == "repeat ×3" and frame.arg == to_discopy(f)
    assert to_discopy(checkpoint(f)).boxes[0].arg == to_discopy(f)
    assert to_discopy(batched(f)).boxes[0].arg == to_discopy(f)
    assert to_discopy(copy(A * R(2))) == markov.Diagram.copy(markov.Ty("R^3", "R^2"), 2)
    seq = unroll(rnn_cell(2, 3)).at(R(4, 2))  # a tie around a repeat around copies
    assert sum(isinstance(b, markov.Copy) for b in boxes(to_discopy(seq))) == 2


TIKZ_LENS = (residual(f >> tanh) >> repeat(dense(3, 3), 2)
             >> checkpoint(copy(A) >> (linear(3, 2) @ tanh.at(A))))
LABEL = re.compile(r"^\\node \[[^]]*\] \(\d+\) at \([^)]*\) \{(.*)\};$", re.M)


def test_tikz_is_discopys_output_with_every_label_in_math_mode(tmp_path):
    path = tmp_path / "lens.tikz"
    text = to_tikz(TIKZ_LENS, path=path)
    assert path.read_text() == text
    assert "\\begin{pgfonlayer}{nodelayer}" in text and "\\draw" in text
    labels = [label for label in LABEL.findall(text) if label]
    assert len(labels) > 20
    for label in labels:  # math mode, ASCII only: what pdflatex reads
        assert re.fullmatch(r"\$[^$]+\$", label) and label.isascii(), label
    # each box and wire as LaTeX writes it (written out here by hand)
    for written in (r"$\mathrm{dense}(3\to 3)$", r"$\mathrm{tanh}$", r"$\mathrm{repeat}\ \times 2$",
                    r"$\theta$", r"$\mathbb{R}^{3}$", r"$\mathbb{R}^{3 \times 3} \times \mathbb{R}^{3}$",
                    r"$\mathrm{checkpoint}:\ \mathrm{recompute}$", r"$\mathrm{linear}(3\to 2)$"):
        assert "{" + written + "}" in text, written


PREAMBLE = r"""\documentclass{article}
\usepackage{amsmath, amssymb, tikz}
\pgfdeclarelayer{edgelayer}
\pgfdeclarelayer{nodelayer}
\pgfsetlayers{edgelayer,nodelayer,main}
\tikzset{none/.style={}}
\begin{document}
\input{lens.tikz}
\end{document}
"""


@pytest.mark.skipif(shutil.which("pdflatex") is None,
                    reason="pdflatex is not installed (apt-get install texlive-latex-base "
                           "texlive-pictures): to_tikz's output is not compiled here")
def test_tikz_compiles_with_pdflatex(tmp_path):
    to_tikz(TIKZ_LENS, path=tmp_path / "lens.tikz")
    (tmp_path / "figure.tex").write_text(PREAMBLE)
    run = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "figure.tex"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:]
    assert (tmp_path / "figure.pdf").stat().st_size > 0


def test_a_family_or_a_non_lens_is_refused():
    with pytest.raises(TypeError, match="at"):
        to_discopy(tanh)
    with pytest.raises(KindError, match="to_discopy needs a lens"):
        to_discopy(3)


def expressions():
    """Lens expressions R^3 → R^3 of any depth in `>>` and `@` (the product between a copy
    and an add), each with the DisCoPy diagram built from its leaves' diagrams alone."""
    from hypothesis import strategies as st

    leaves = st.sampled_from(sorted(ENDOS)).map(lambda k: (ENDOS[k], to_discopy(ENDOS[k])))

    def grow(children):
        then = st.tuples(children, children).map(lambda ab: (ab[0][0] >> ab[1][0],
                                                             ab[0][1] >> ab[1][1]))
        both = st.tuples(children, children).map(lambda ab: (
            copy(A) >> (ab[0][0] @ ab[1][0]) >> add(A),
            to_discopy(copy(A)) >> (ab[0][1] @ ab[1][1]) >> to_discopy(add(A))))
        return then | both

    return st.recursive(leaves, grow, max_leaves=6)


def test_to_discopy_is_a_functor_on_expressions_of_any_depth():
    from hypothesis import given, settings

    @settings(max_examples=25, deadline=None)
    @given(expressions())
    def check(pair):
        lens, built = pair
        assert to_discopy(lens) == built

    check()
