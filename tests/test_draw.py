"""lenses.drawing.diagrams: expressions, text string diagrams and matplotlib figures.

Expected strings are written out by hand from the definitions (names, ≫, ⊗, spaces);
the figure is inspected through the artists it contains.
"""

import subprocess
import sys

import matplotlib

matplotlib.use("Agg")  # no display in tests

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from categories import R  # noqa: E402
from lenses import (checkpoint, conv2d, copy, dense, diagram, discard, draw, expression,  # noqa: E402
                    flatten, max_pool, relu, repeat, residual, sigmoid, tanh, tie)

MLP = lambda: dense(4, 16) >> tanh >> dense(16, 3)  # noqa: E731


def _figure_artists(fig, prefix):
    ax = fig.axes[0]
    found = [a.get_gid() for a in list(ax.patches) + list(ax.lines) + list(ax.texts)]
    return [g for g in found if g and g.startswith(prefix)]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# -- expressions ------------------------------------------------------------------------------

def test_expression_of_a_chain_is_its_names_joined_by_then():
    assert expression(dense(2, 3) >> relu >> dense(3, 1), types=False) == "dense(2→3) ≫ relu ≫ dense(3→1)"


def test_expression_does_not_depend_on_bracketing():
    f, g, h = dense(2, 3), tanh, dense(3, 1)
    assert expression((f >> g) >> h) == expression(f >> (g >> h))


def test_expression_brackets_chains_inside_a_parallel_product():
    lens = (dense(2, 2) >> tanh) @ dense(3, 1)
    assert expression(lens, types=False) == "((dense(2→2) ≫ tanh) ⊗ dense(3→1))"


def test_expression_types_list_the_type_and_every_component():
    text = expression(MLP())
    first, *rest = text.splitlines()
    assert first == "dense(4→16) ≫ tanh ≫ dense(16→3) : R^4 → R^3"
    assert "parameters P = (R^{16×4} × R^16) × R^0 × (R^{3×16} × R^3)" in text
    assert any("dense(4→16) : R^4 → R^16, params R^{16×4} × R^16" in line for line in rest)
    assert any("tanh : R^16 → R^16" in line for line in rest)
    assert any("dense(16→3) : R^16 → R^3, params R^{3×16} × R^3" in line for line in rest)


def test_expression_of_reparameterised_and_checkpointed_lenses_keeps_the_structure():
    tied = tie(dense(3, 3) >> tanh >> dense(3, 3), [0, 2])
    assert expression(tied, types=False) == "tie(dense(3→3) ≫ tanh ≫ dense(3→3), [0, 2])"
    assert expression(checkpoint(dense(2, 2) >> tanh), types=False) == "checkpoint(dense(2→2) ≫ tanh)"


# -- text diagrams ----------------------------------------------------------------------------

def test_text_diagram_mentions_every_component_space_and_parameter_object():
    text = diagram(MLP())
    for name in ("dense(4→16)", "tanh", "dense(16→3)"):
        assert name in text
    for space in ("R^4", "R^16", "R^3"):
        assert space in text
    # each parameterised layer has its parameter object on a wire from above; tanh has none
    assert "R^{16×4} × R^16" in text and "R^{3×16} × R^3" in text
    assert "R^0" not in text


def test_text_diagram_of_a_chain_reads_left_to_right_on_one_row():
    text = diagram(MLP())
    row = next(line for line in text.splitlines() if "dense(4→16)" in line)
    positions = [row.index(n) for n in ("R^4", "dense(4→16)", "tanh", "dense(16→3)", "R^3")]
    assert positions == sorted(positions)
    # the intermediate space labels a wire between the boxes it connects
    assert row.index("dense(4→16)") < row.index("R^16") < row.index("tanh")


def test_parameter_wires_come_from_above_their_box():
    lines = diagram(MLP()).splitlines()
    label_row = next(i for i, line in enumerate(lines) if "R^{16×4} × R^16" in line)
    box_row = next(i for i, line in enumerate(lines) if "dense(4→16)" in line)
    assert label_row < box_row
    assert "┴" in lines[box_row - 1]  # the parameter wire meets the top of the box


def test_parallel_components_are_stacked():
    lens = dense(2, 2) @ dense(3, 1)
    lines = diagram(lens).splitlines()
    top = next(i for i, line in enumerate(lines) if "dense(2→2)" in line)
    bottom = next(i for i, line in enumerate(lines) if "dense(3→1)" in line)
    assert top < bottom
    assert "dense(3→1)" not in lines[top]


def test_copy_and_add_are_explicit_nodes():
    text = diagram(residual(dense(3, 3)))
    assert "copy" in text and "add" in text
    assert text.count("●") == 2  # one node for the copy, one for the add
    assert "dense(3→3)" in text and "id" in text


def test_discard_is_a_node_with_no_outgoing_wire():
    lines = diagram(copy(R(2)) >> (dense(2, 1) @ discard(R(2)))).splitlines()
    text = "\n".join(lines)
    assert text.count("●") == 2  # the copy and the discard
    row = next(i for i, line in enumerate(lines) if "discard" in line)
    assert lines[row + 1].rstrip().endswith("●")  # the wire ends at the discard: R^0 is no wire
    assert sum(line.rstrip().endswith("─ R^1") for line in lines) == 1  # one output wire in all


def test_checkpoint_and_tie_are_drawn_as_frames_around_the_lens():
    tied = diagram(tie(dense(3, 3) >> tanh >> dense(3, 3), [0, 2]))
    assert "reparam Δ" in tied and "╭" in tied and "╯" in tied
    assert tied.count("dense(3→3)") == 2
    conv = conv2d(1, 4, 3, padding=1).at(R(1, 8, 8)) >> relu >> max_pool(2) >> flatten >> dense(64, 10)
    text = diagram(checkpoint(conv))
    assert "checkpoint: recompute" in text
    for space in ("R^{1×8×8}", "R^{4×8×8}", "R^{4×4×4}", "R^64", "R^10"):
        assert space in text


def test_repeat_is_drawn_once_in_a_frame_with_its_stacked_parameters():
    lens = dense(3, 8) >> repeat(dense(8, 8) >> tanh, 4, remat=True) >> dense(8, 1)
    assert expression(lens, types=False) == "dense(3→8) ≫ repeat(dense(8→8) ≫ tanh, 4, remat) ≫ dense(8→1)"
    text = diagram(lens)
    assert "repeat ×4: recompute" in text
    assert text.count("dense(8→8)") == 1  # one copy drawn, not four
    assert repr(lens.parts[1].param) in text  # the stacked parameter object on the frame's wire


def test_wires_are_continuous_between_boxes():
    row = next(line for line in diagram(dense(2, 2) >> sigmoid >> dense(2, 1)).splitlines()
               if "sigmoid" in line)
    between = row[row.index("dense(2→2)") + len("dense(2→2)"):row.index("sigmoid")]
    # box edge, wire, label, wire, box edge: no gap in the line
    assert between.strip().startswith("├─") and between.rstrip().endswith("─┤")


# -- figures ----------------------------------------------------------------------------------

def test_figure_has_one_box_per_component():
    fig = draw(MLP())
    assert sorted(_figure_artists(fig, "box:")) == sorted(["box:dense(4→16)", "box:tanh", "box:dense(16→3)"])


def test_figure_of_a_residual_block_draws_copy_and_add_as_nodes():
    lens = residual(dense(3, 3)) >> relu >> dense(3, 1)
    fig = draw(lens)
    assert sorted(_figure_artists(fig, "box:")) == sorted(["box:dense(3→3)", "box:id", "box:relu", "box:dense(3→1)"])
    assert sorted(_figure_artists(fig, "node:")) == ["node:add", "node:copy"]


def test_figure_parameter_wires_and_backward_arrows():
    fig = draw(MLP())
    assert len(_figure_artists(fig, "wire:param")) == 2  # tanh has parameter object R^0
    assert _figure_artists(fig, "backward") == []
    fig = draw(MLP(), backward=True)
    arrows = _figure_artists(fig, "backward")
    assert len(arrows) >= 2 + 2  # at least the two parameter wires and two inner data wires


def test_figure_draws_into_a_given_axes():
    fig, ax = plt.subplots()
    out = draw(dense(2, 1), ax=ax)
    assert out is fig
    assert _figure_artists(fig, "box:") == ["box:dense(2→1)"]


def test_importing_lenses_does_not_import_matplotlib():
    code = "import sys, lenses; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
