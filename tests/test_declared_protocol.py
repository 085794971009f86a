"""A declared protocol: what a lens, a family, a space or a smooth map may be asked is declared
on its base class with a default, so that nothing probes for it, and nothing is attached to an
object after it is built."""

import ast
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from categories import Product, R, Smooth, tying_map
from lenses import Keys, Layer, ParaLens, dense, dropout, evaluation, tanh

ROOT = Path(__file__).resolve().parents[1]
#: the optional capabilities declared on the base classes (Composable, ParaLens, Space, Smooth,
#: Picture, Parameterised): asked directly, never by name
DECLARED = {"after", "lift", "is_fixed", "fixed", "endo", "discrete", "at_evaluation", "section",
            "one_slot", "slots", "picture", "reparam", "inner"}


def _probes(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("getattr", "hasattr") and len(node.args) >= 2 and \
                isinstance(node.args[1], ast.Constant) and node.args[1].value in DECLARED:
            yield f"{path.relative_to(ROOT)}:{node.lineno}: {node.func.id}(..., {node.args[1].value!r})"


def test_no_module_probes_for_a_declared_capability():
    found = [p for pkg in ("categories", "lenses") for path in sorted((ROOT / pkg).rglob("*.py"))
             for p in _probes(path)]
    assert not found, "probes for declared capabilities:\n" + "\n".join(found)


def test_the_protocol_is_abstract_and_a_layer_is_built_by_layer():
    with pytest.raises(TypeError, match="abstract"):
        ParaLens()
    with pytest.raises(TypeError):  # no longer a way to build a Layer
        ParaLens(R(2), R(2), R(0), lambda a, p: a)
    layer = Layer(R(2), R(2), R(0), lambda a, p: 2 * a, name="double")
    assert isinstance(layer, ParaLens) and layer(jnp.ones(2), None).tolist() == [2.0, 2.0]


def test_an_inner_product_is_abstract_until_it_gives_sharp_and_flat():
    from lenses import Metric

    class OnlySharp(Metric):
        def sharp(self, p, cov, ctx=None):
            return cov

    for cls in (Metric, OnlySharp):
        with pytest.raises(TypeError, match="abstract.*flat"):
            cls()


def test_a_tying_map_declares_what_it_ties_and_a_smooth_map_has_the_defaults():
    r = tying_map(Product(R(2), R(3), R(2)), [0, 2])
    assert (r.slots, r.one_slot) == ((0, 2), False)
    p = (jnp.ones(2), 2 * jnp.ones(3), 3 * jnp.ones(2))
    q = r.section(p)  # the left inverse keeps the first of the tied slots and the others
    assert [v.tolist() for v in q] == [[1.0, 1.0], [2.0, 2.0, 2.0]]
    back = r(q)
    assert [v.tolist() for v in back] == [[1.0, 1.0], [2.0, 2.0, 2.0], [1.0, 1.0]]
    plain = Smooth(R(2), R(2), lambda x: x)
    assert plain.section is None and plain.one_slot
    assert not Smooth(R(2) * R(2), R(2), lambda x: x[0]).one_slot


def test_a_lens_declares_its_evaluation_form_and_a_family_its_shape():
    drop = dropout(0.5).at(R(3) * Keys())
    assert drop.at_evaluation is not None and dense(2, 3).at_evaluation is None
    x = (jnp.arange(3.0), jax.random.PRNGKey(0))
    assert evaluation(drop)(x, None).tolist() == [0.0, 1.0, 2.0]  # dropout inactive: x itself
    assert tanh.endo and not dense(2, 3).endo and not tanh.is_fixed() and dense(2, 3).is_fixed()
    assert not R(3).discrete and Keys().discrete
