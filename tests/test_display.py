"""Lenses and spaces in a notebook: what IPython's display formatter makes of them.

Oracles: the SVG parsed as XML (with a group per box, named by the drawing), LaTeX written
by hand for each kind of space.
"""

import xml.etree.ElementTree as ET

import pytest

from categories import R, Space
from categories.spaces import OpenBall, OpenBox, Positive
from lenses import batched, copy, dense, relu, residual, tanh

formatters = pytest.importorskip("IPython.core.formatters")
pytest.importorskip("matplotlib")


def shown(obj):
    data, _ = formatters.DisplayFormatter().format(obj)
    return data


def test_a_lens_shows_its_string_diagram_as_svg():
    import matplotlib.pyplot as plt

    lens = dense(3, 4) >> relu >> residual(dense(4, 4) >> tanh)
    before = plt.get_fignums()
    data = shown(lens)
    assert plt.get_fignums() == before  # no pyplot figure left open (nor shown a second time)
    assert data["text/plain"] == repr(lens)
    root = ET.fromstring(data["image/svg+xml"])
    assert root.tag.endswith("svg")
    ids = {el.get("id") for el in root.iter() if el.get("id")}
    for box in ("box:dense(3→4)", "box:relu", "box:dense(4→4)", "box:tanh", "node:copy", "node:add"):
        assert box in ids, box
    assert "image/svg+xml" in shown(copy(R(2)))  # a lens without parameters too
    root = ET.fromstring(shown(batched(dense(2, 2)))["image/svg+xml"])  # and a batch traversal
    assert "frame:batched: covectors added over the batch" in {el.get("id") for el in root.iter()}


@pytest.mark.parametrize("space, latex", [
    (R(), r"$\mathbb{R}$"),
    (R(0), r"$\mathbb{R}^{0}$"),
    (R(3, 4), r"$\mathbb{R}^{3 \times 4}$"),
    (R(3) * (R(2) * R()), r"$\mathbb{R}^{3} \times (\mathbb{R}^{2} \times \mathbb{R})$"),
    (Positive(2), r"$\mathbb{R}_{>0}^{2}$"),
    (OpenBox(-1, 1, (2, 3)), r"$(-1, 1)^{2 \times 3}$"),
    (OpenBox([0, 1], [2, 3]), r"$(0, 2) \times (1, 3)$"),
    (OpenBall([0.0, 0.0], 2.0), r"$B_{2}(0) \subseteq \mathbb{R}^{2}$"),
])
def test_a_space_shows_in_mathematical_notation(space, latex):
    data = shown(space)
    assert data["text/latex"] == latex and data["text/plain"] == repr(space)


class Lattice(Space):
    """A kind of space that does not say how to write itself in LaTeX."""

    shape = (2,)

    def __repr__(self):
        return "L_{2}^+ & 50%"


def test_a_space_of_a_kind_that_does_not_say_shows_its_name_as_text():
    assert shown(Lattice())["text/latex"] == r"$\text{L\_\{2\}\^{}+ \& 50\%}$"


def test_a_training_state_and_a_report_show_a_summary():
    import jax
    import numpy as np

    from lenses import gd, half_squared_error, train_step

    model = dense(2, 3) >> tanh >> dense(3, 1)
    step = train_step(model, half_squared_error, gd(0.1))
    state = step.init(model.init(jax.random.PRNGKey(0)))
    X, Y = np.ones((4, 2)), np.zeros((4, 1))
    state, report = step(state, X, Y)
    html = shown(state)["text/html"]
    assert "1 steps" in html and "13 parameters in 4 arrays" in html and "fault: none" in html
    assert f"loss {np.round(report.loss, 6)}" in shown(report)["text/html"]
    state, report = step(state, np.full((4, 2), np.nan), Y)  # a refused step shows its fault
    assert "fault: covector at step 2" in shown(state)["text/html"]
