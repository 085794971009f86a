"""One protocol for every kind of lens: a combinator written here, in the test file alone,
works with everything the library does with lenses; families are their own type and every
combinator maps them to families; structured metrics read what layers declare.

Oracles: `jax.grad` of the composite written directly in JAX, and hand formulas.
"""

import ast
import pathlib

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from categories import R, draws  # noqa: E402
from lenses import (KFAC, Affine, Context, Euclidean, Layer, ParaLens, batched, check_backward,  # noqa: E402
                    checkpoint, dense, diagram, draw, expression, family, gd, half_squared_error,
                    picture, relu, repeat, residual, tanh, tie, train_step, uses)
from lenses.laws import assert_close  # noqa: E402


# -- a new combinator, defined here alone ------------------------------------------------------

class Scaled(ParaLens):
    """scaled(f, c) : A → B, a ↦ c · f(a, p), parameters those of f (with a backward part of
    its own, so that the library must run it rather than hand it to JAX)."""

    def __init__(self, lens, c):
        self.children, self.c = (lens,), float(c)
        self.dom, self.cod, self.param = lens.dom, lens.cod, lens.param
        self.name, self.smooth = f"scaled({lens.name}, {self.c})", lens.smooth

    @property
    def derives(self):
        return False

    def rebuild(self, children):
        return Scaled(children[0], self.c)

    def apply(self, a, p, batched):
        return self.c * self.children[0].apply(a, p, batched)

    def apply_vjp(self, a, p, batched):
        b, pull = self.children[0].apply_vjp(a, p, batched)
        return self.c * b, lambda bc: pull(self.c * bc)

    def uses(self):
        return self.children[0].uses()

    def init(self, key):
        return self.children[0].init(key)

    def term(self, inside=False):
        return f"scaled({self.children[0].term()}, {self.c})"

    def picture(self):
        return picture.Framed(f"× {self.c}", self.children[0].picture(), None)


def scaled(lens, c):
    return lens.lift(lambda member: Scaled(member, c), name=f"scaled({lens.name}, {float(c)})")


def _mlp(x, p):  # dense(2,3) ≫ tanh ≫ ×2 ≫ dense(3,1), written directly
    (W, b), _, (V, c) = p
    return V @ (2.0 * jnp.tanh(W @ x + b)) + c


def _point(key=0):
    return (dense(2, 3) >> tanh >> dense(3, 1)).init(jax.random.PRNGKey(key))


MODEL = lambda: scaled(dense(2, 3) >> tanh, 2.0) >> dense(3, 1)  # noqa: E731


def test_the_new_combinator_composes_and_its_backward_part_is_the_gradient():
    model, p = MODEL(), _point()
    q = ((p[0], None), p[2])  # the scaled chain is one slot holding its own chain's point
    x, y = jnp.array([0.3, -0.7]), jnp.array([0.5])
    out, pull = model.vjp(x, q)
    dx, dq = pull(out - y)
    loss = lambda x, p: 0.5 * jnp.sum((_mlp(x, p) - y) ** 2)  # noqa: E731
    gx, gp = jax.grad(loss, argnums=(0, 1))(x, p)
    assert_close(out, _mlp(x, p), what="forward")
    assert_close(dx.value, gx, what="input covector")
    assert_close(dq.value[0][0], gp[0], what="first layer's covector")
    assert_close(dq.value[1], gp[2], what="last layer's covector")
    assert uses(model) == ((1, 0), 1)


def test_the_new_combinator_in_parallel_batched_and_checkpointed():
    f = scaled(dense(2, 2), 3.0) @ dense(1, 1)
    kf, kg = jax.random.split(jax.random.PRNGKey(1))
    p = (dense(2, 2).init(kf), dense(1, 1).init(kg))
    X = (draws.normal(kf, (5, 2)), draws.normal(kg, (5, 1)))
    C = (draws.normal(kg, (5, 2)), draws.normal(kf, (5, 1)))

    def total(X, p):  # ⟨C, f(X)⟩ summed over the batch, written directly
        (W, b), (V, c) = p
        return (jnp.sum(C[0] * (3.0 * (X[0] @ W.T + b[None, :])))
                + jnp.sum(C[1] * (X[1] @ V.T + c[None, :])))

    gX, gp = jax.grad(total, argnums=(0, 1))(X, p)
    for lens in (f, checkpoint(f)):
        dX, dp = batched(lens).backward(X, p, C)
        assert_close(dX.value, gX, what=f"batched input covector of {lens.name}")
        assert_close(dp.value, gp, what=f"parameter covector added over the batch, {lens.name}")


def test_the_new_combinator_is_described_drawn_and_checked():
    model = MODEL()
    assert expression(model, types=False) == "scaled(dense(2→3) ≫ tanh, 2.0) ≫ dense(3→1)"
    text = diagram(model)
    assert "× 2.0" in text and "dense(2→3)" in text and "╭" in text
    fig = draw(model)
    gids = [a.get_gid() for a in fig.axes[0].patches]
    assert "frame:× 2.0" in gids and "box:dense(2→3)" in gids
    p = _point()
    report = check_backward(model, jnp.array([0.3, -0.7]), ((p[0], None), p[2]), jnp.array([1.5]))
    assert report.ok(1e-6), report


def test_the_new_combinator_trains_with_train_step():
    model, p = MODEL(), _point(2)
    q = ((p[0], None), p[2])
    X = draws.normal(jax.random.PRNGKey(3), (8, 2))
    Y = jnp.sin(X[:, :1])
    step = train_step(model, half_squared_error, gd(0.1))
    state, report = step(step.init(q), X, Y)

    def mean_loss(p):
        return jnp.mean(jax.vmap(lambda x, y: 0.5 * jnp.sum((_mlp(x, p) - y) ** 2))(X, Y))

    g = jax.grad(mean_loss)(p)
    assert_close(report.loss, mean_loss(p), what="loss")
    assert_close(state.params[0][0], jax.tree_util.tree_map(lambda a, d: a - 0.1 * d, p[0], g[0]),
                 what="first layer after one step")
    assert_close(state.params[1], jax.tree_util.tree_map(lambda a, d: a - 0.1 * d, p[2], g[2]),
                 what="last layer after one step")


def test_the_new_combinator_maps_families_to_families():
    twice = scaled(tanh, 2.0)
    assert not twice.is_fixed()
    model = dense(2, 2) >> twice
    x, p = jnp.array([0.1, 0.2]), dense(2, 2).init(jax.random.PRNGKey(0))
    assert_close(model.forward(x, (p, None)), 2.0 * jnp.tanh(p[0] @ x + p[1]), what="forward")


# -- families ----------------------------------------------------------------------------------

GAIN = family(lambda A: Layer(A, A, A, lambda x, s: s * x, name="gain",
                              init=lambda k: jnp.ones(A.shape)), "gain", endo=True)


def test_evaluating_an_unfixed_family_says_how_to_fix_it():
    for fam in (tanh, relu >> tanh, checkpoint(tanh), residual(relu), repeat(tanh, 2), relu @ tanh,
                tie(GAIN >> tanh >> GAIN, [0, 2]), batched(tanh)):
        with pytest.raises(TypeError, match=r"\.at\(R\("):
            fam.forward(jnp.ones(3), None)
    with pytest.raises(TypeError, match=r"train_step.*\.at\(R\("):
        train_step(relu >> tanh, half_squared_error, gd(0.1))


def test_smoothness_of_families_follows_their_members():
    assert residual(relu).smooth is False and relu.smooth is False
    assert residual(tanh).smooth is True
    assert checkpoint(relu).smooth is False and (tanh >> relu).smooth is False


def test_combinators_of_families_compose_and_train():
    model = (dense(3, 3) >> checkpoint(tanh) >> residual(relu) >> repeat(tanh, 2)
             >> tie(GAIN >> tanh >> GAIN, [0, 2]) >> dense(3, 2))
    assert model.is_fixed()
    key = jax.random.PRNGKey(0)
    p = model.init(key)
    X = draws.normal(key, (16, 3))
    Y = jnp.stack([jnp.sin(X[:, 0]), jnp.cos(X[:, 1])], axis=1)
    step = train_step(model, half_squared_error, gd(0.05))
    state = step.init(p)
    losses = []
    for _ in range(30):
        state, report = step(state, X, Y)
        losses.append(float(report.loss))
    assert losses[-1] < losses[0]
    # the tied gain's slot is used twice (its covector is the sum of the two uses')
    assert uses(model)[-2] == (2, 0)


def test_parallel_families_fix_on_a_product_domain_and_train():
    from lenses import copy
    model = dense(2, 2) >> copy(R(2)) >> (tanh @ GAIN) >> (dense(2, 1) @ dense(2, 1))
    p = model.init(jax.random.PRNGKey(4))
    x = jnp.array([0.4, -0.2])
    (W, b) = p[0]
    h = W @ x + b
    (V1, c1), (V2, c2) = p[3]
    expected = (V1 @ jnp.tanh(h) + c1, V2 @ (p[2][1] * h) + c2)
    assert_close(model.forward(x, p), expected, what="forward of the fixed parallel family")


# -- structured metrics read what layers declare -----------------------------------------------

def _kfac_data(model, n=12):
    key = jax.random.PRNGKey(7)
    X = draws.normal(key, (n, model.dom.shape[0]))
    Y = draws.normal(jax.random.PRNGKey(8), (n, model.cod.shape[0]))
    return X, Y


def test_kfac_refuses_a_layer_that_declares_no_affine_structure():
    weird = Layer(R(3), R(2), R(2, 3) * R(2), lambda x, Wb: jnp.sin(Wb[0]) @ x + Wb[1] ** 2,
                     name="sin(W)x+b²")
    model = dense(4, 3) >> tanh >> weird
    p = model.init(jax.random.PRNGKey(0))
    X, Y = _kfac_data(model)
    ctx = Context(model, half_squared_error, X, Y)
    g = jax.tree_util.tree_map(jnp.ones_like, p)
    with pytest.raises(TypeError, match=r"sin\(W\)x\+b².*declares no|declares none"):
        KFAC().sharp(p, g, ctx)
    # with the fallback it gets the identity block: its covector is left as it is
    v = KFAC(fallback="euclidean").sharp(p, g, ctx).value
    assert_close(v[2], g[2], what="the undeclared layer's block is the identity")
    assert not np.allclose(np.asarray(v[0][0]), np.asarray(g[0][0]))


def test_kfac_uses_the_block_a_layer_declares_and_finds_it_inside_combinators():
    mine = Layer(R(3), R(2), R(2, 3) * R(2), lambda x, Wb: Wb[0] @ x + Wb[1], name="mine",
                    structure=Affine(bias=True))
    plain = dense(4, 3) >> tanh >> dense(3, 2)
    declared = dense(4, 3) >> tanh >> mine
    nested = checkpoint(dense(4, 3) >> tanh) >> dense(3, 2)
    p = plain.init(jax.random.PRNGKey(1))
    X, Y = _kfac_data(plain)
    g = jax.tree_util.tree_map(lambda a: jnp.cos(a) + 0.5, p)
    ref = KFAC(damping=0.1).sharp(p, g, Context(plain, half_squared_error, X, Y)).value
    got = KFAC(damping=0.1).sharp(p, g, Context(declared, half_squared_error, X, Y)).value
    assert_close(got, ref, what="a declared affine layer gets dense's block")
    q = ((p[0], None), p[2])
    gq = ((g[0], None), g[2])
    got = KFAC(damping=0.1).sharp(q, gq, Context(nested, half_squared_error, X, Y)).value
    assert_close((got[0][0], got[1]), (ref[0], ref[2]), what="KFAC through a checkpointed chain")
    assert Euclidean().sharp(p, g).value is not None


# -- nothing outside a lens class asks which class a lens is -----------------------------------

def _lens_classes() -> set:
    """The names of every lens class: ParaLens and its subclasses, batched lenses, families."""
    from lenses.batched import Batched
    from lenses.families import LensFamily
    seen, todo = set(), [ParaLens, Batched, LensFamily]
    while todo:
        c = todo.pop()
        if c.__name__ not in seen:
            seen.add(c.__name__)
            todo.extend(c.__subclasses__())
    return seen


def _asks(node: ast.AST) -> bool:
    """Is `node` a question about a class: isinstance/issubclass, a comparison with type(x), a
    class pattern of a match?"""
    if isinstance(node, ast.Call):
        return getattr(node.func, "id", None) in ("isinstance", "issubclass")
    if isinstance(node, ast.Compare):
        return any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "type"
                   for n in [node.left, *node.comparators])
    return isinstance(node, ast.MatchClass)


def class_questions(root: pathlib.Path, classes: set) -> list:
    """Every question about a class under `root` (recursively) that names one of `classes`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if _asks(node) and {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} & classes:
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


def test_no_module_branches_on_the_class_of_a_lens():
    import lenses.bridges.external  # noqa: F401 - Wrapped is a lens class too
    classes = _lens_classes()
    assert {"Chain", "Wrapped", "Checkpointed", "Repeat", "Batched", "LensFamily"} <= classes
    root = pathlib.Path(__file__).resolve().parents[1]
    found = class_questions(root / "lenses", classes) + class_questions(root / "categories", classes)
    assert not found, f"code asks which class a lens is: {found}"


def test_the_class_question_check_reads_every_package_and_its_subpackages(tmp_path):
    """The walk must reach a subpackage (drawing/, inner_products/ ...): a question planted
    two folders down is found."""
    deep = tmp_path / "lenses" / "inner_products"
    deep.mkdir(parents=True)
    (deep / "kfac.py").write_text("def f(lens):\n    return type(lens) is Chain\n\n\n"
                                  "def g(lens):\n    return isinstance(lens, (Layer, Chain))\n\n\n"
                                  "def h(lens):\n    match lens:\n        case Chain(): return 1\n\n\n"
                                  "def k(lens):\n    return type(lens).__name__, isinstance(lens, int)\n")
    assert class_questions(tmp_path / "lenses", {"Chain"}) == [
        f"lenses/inner_products/kfac.py:{n}" for n in (2, 6, 11)]
