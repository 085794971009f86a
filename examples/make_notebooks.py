"""Write the research notebooks of examples/ (without outputs).

Run:  python examples/make_notebooks.py

Each notebook is a list of cells below; `tests/test_examples.py` executes them.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent


def md(text: str):
    return new_markdown_cell(text.strip("\n"))


def code(text: str):
    return new_code_cell(text.strip("\n"))


# -- inner products ---------------------------------------------------------------------------

INNER_PRODUCTS = [
    md("""
# Inner products: which vector does a covector become?

The backward pass leaves a **covector** $p' \\in T^*_pP$ on every parameter object: the
differential of the loss in that layer's parameters. A covector is not a point, so
$p - \\eta\\, p'$ is not defined. An inner product $g_p$ on $T_pP$ gives the *sharp* map,
$g_p\\bigl((p')^\\sharp, v\\bigr) = p'(v)$ for all $v$, and the update is
$u(p) = p - \\eta\\,(p')^\\sharp$. With the Euclidean inner product the choice is invisible;
here we make it visible by training the same network from the same point with several
inner products (`lenses.metrics`):

* `Euclidean()`: $g(u, v) = \\sum_i u_i v_i$, plain gradient descent;
* `Diagonal(w)`: $g(u, v) = \\sum_i w_i u_i v_i$, a fixed diagonal (here the mean squared
  per-example covector at the starting point, damped);
* `GaussNewton`, `Fisher`: the Gauss–Newton matrix and the Fisher information of the
  predictive distribution (for softmax cross-entropy they coincide);
* `KFAC`: the Kronecker-factored block-diagonal approximation of the Fisher.
"""),
    code("""
from functools import partial

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import load_iris

import lenses
from lenses import (Context, Diagonal, Euclidean, batch_loss, batched, dL, dense, gd,
                    softmax_cross_entropy, tanh, train_step)

X, y = load_iris(return_X_y=True)
X = ((X - X.mean(0)) / X.std(0)).astype(np.float32)
y = y.astype(np.int32)
model = dense(4, 8) >> tanh >> dense(8, 3)
family = partial(softmax_cross_entropy, classes=3)
p0 = model.init(jax.random.PRNGKey(0))
print(model)
"""),
    md("""
## One covector, several vectors

The covector of the whole batch (mean loss) at $p_0$, and its sharp under each inner product.
Whatever the inner product, $p'\\bigl((p')^\\sharp\\bigr) = g\\bigl((p')^\\sharp, (p')^\\sharp\\bigr) > 0$:
every sharp is a descent direction. The directions themselves differ.
"""),
    code("""
out, pull = batched(model).vjp(X, p0)
_, p_cov = pull(dL(batch_loss(family, y, "mean"), out))


def per_example(x, t):
    o, pb = model.vjp(x, p0)
    return pb(dL(family(t), o))[1].value


squares = jax.tree_util.tree_map(lambda g: jnp.mean(g ** 2, axis=0) + 1e-2, jax.vmap(per_example)(X, y))

# name → (inner product, step size). Step sizes differ because the sharps have different
# lengths: each is a reasonable value for its inner product, not a tuned optimum.
metrics = {"Euclidean": (Euclidean(), 1.0), "Diagonal": (Diagonal(squares), 0.02)}
for name in ("GaussNewton", "Fisher", "KFAC"):
    if hasattr(lenses, name):  # data-dependent inner products (lenses/natural.py)
        metrics[name] = (getattr(lenses, name)(damping=1e-2), 0.5)

ctx = Context(model, family, X, y, "mean")
flat = lambda t: jnp.concatenate([jnp.ravel(a) for a in jax.tree_util.tree_leaves(t)])
g = flat(p_cov.value)
for name, (metric, _) in metrics.items():
    v = metric.sharp(p0, p_cov, ctx)
    cos = float(flat(v.value) @ g / (jnp.linalg.norm(flat(v.value)) * jnp.linalg.norm(g)))
    print(f"{name:12s} p'(p'♯) = {float(p_cov(v)):9.4f}   cos(p'♯, Euclidean p'♯) = {cos:6.3f}")
    assert float(p_cov(v)) > 0
"""),
    md("""
## Training curves

Full-batch steps $u(p) = p - \\eta\\,(p')^\\sharp$, 40 of them, from the same $p_0$.
"""),
    code("""
steps = 40
curves = {}
for name, (metric, lr) in metrics.items():
    if name == "GaussNewton" and "Fisher" in metrics:
        continue  # for softmax cross-entropy it is the Fisher (the sharps above agree)
    step = train_step(model, family, gd(lr, metric=metric))
    state, losses = step.init(p0), []
    for _ in range(steps):
        state, report = step(state, X, y)
        losses.append(float(report.loss))
    curves[name] = losses
    print(f"{name:12s} lr {lr:<5} loss {losses[0]:.4f} → {losses[-1]:.4f}")

fig, ax = plt.subplots(figsize=(6, 3.5))
for name, losses in curves.items():
    ax.semilogy(losses, label=name)
ax.set_xlabel("step")
ax.set_ylabel("mean cross-entropy")
ax.set_title("dense(4,8) ≫ tanh ≫ dense(8,3) on Iris, one update rule, several inner products")
ax.legend()
plt.show()
"""),
    md("""
The curvature-aware inner products (Gauss–Newton / Fisher, KFAC) take steps that are
measured in the geometry of the model's predictions rather than in raw coordinates, and
reach a low loss in far fewer steps. The Euclidean and the fixed diagonal inner products
treat every coordinate alike (up to fixed weights). The update rule is the same in every
run; only the sharp map changed.
"""),
]


# -- laws -------------------------------------------------------------------------------------

LAWS = [
    md("""
# The laws, stated and property-tested

The theory's structure is a set of equations. `categories.laws` (for the ambient
category) and `lenses.laws` (for lenses) state each one once as a reusable check that raises `AssertionError` with the
disagreeing numbers; `categories.strategies` and `lenses.strategies` draw random spaces,
points, smooth maps and whole networks with Hypothesis. Here a few laws run on a handful
of examples each (the test suite runs them on many more).
"""),
    code("""
import jax

jax.config.update("jax_enable_x64", True)  # the laws are compared at ~1e-9

import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings, strategies as st

from categories import laws, strategies as cs
from lenses import strategies as ls

few = settings(max_examples=5, deadline=None, database=None)
"""),
    md("""
## The differential is a covariant functor: the chain rule

$D(f \\gg g)_x = Dg_{f(x)} \\circ Df_x$ and $D(1_A)_x = 1$.
"""),
    code("""
@few
@given(st.data())
def chain_rule(data):
    A, B, C = (data.draw(cs.euclidean_spaces(terminal=False, products=False)) for _ in range(3))
    f, g = data.draw(cs.smooth_maps(A, B, depth=1)), data.draw(cs.smooth_maps(B, C, depth=1))
    x, v = data.draw(cs.points(A)), data.draw(cs.tangents(A))
    laws.check_D_composition(f, g, x, v)
    laws.check_D_identity(A, x, v)


chain_rule()
print("D(f ≫ g) = Dg ∘ Df: held on every drawn example")
"""),
    md("""
## The dual is a contravariant functor

$(B \\circ A)^* = A^* \\circ B^*$: dualising reverses the order. Composed with $D$, this is why
the backward pass runs in reverse.
"""),
    code("""
@few
@given(st.data())
def dual_reverses(data):
    U, V, W = (data.draw(cs.euclidean_spaces(terminal=False, products=False)) for _ in range(3))
    A, B = data.draw(cs.linear_maps(U, V)), data.draw(cs.linear_maps(V, W))
    laws.check_dual_composition(A, B, data.draw(cs.tangents(W)))


dual_reverses()
print("(B ∘ A)* = A* ∘ B*: held on every drawn example")
"""),
    md("""
## Parameterised maps compose, associatively

$(f \\gg g)(a, (p, q)) = g(f(a, p), q)$, and the bracketing does not matter.
"""),
    code("""
@few
@given(st.data())
def para_associative(data):
    A, B, C, E = (data.draw(cs.euclidean_spaces(terminal=False, products=False)) for _ in range(4))
    f, g, h = data.draw(cs.para_maps(A, B)), data.draw(cs.para_maps(B, C)), data.draw(cs.para_maps(C, E))
    a = data.draw(cs.points(A))
    p, q, r = (data.draw(cs.points(m.param)) for m in (f, g, h))
    laws.check_para_composition(f, g, a, p, q)
    laws.check_para_associativity(f, g, h, a, p, q, r)


para_associative()
print("Para composition and associativity: held on every drawn example")
"""),
    md("""
## A whole network's backward part is the gradient

`lenses.strategies.architectures()` draws a network of dense, residual and parallel blocks
(possibly with tied weights) **and** a second implementation written directly in JAX. The
lens's backward part, built only by composing the components' backward parts in reverse,
must equal `jax.vjp` of that independent implementation.
"""),
    code("""
@few
@given(ls.architectures(depth=(1, 3)), st.data())
def backward_is_the_gradient(arch, data):
    lens = arch.lens
    x = data.draw(ls.points(lens.dom))
    p = data.draw(ls.parameter_points(lens.param))
    c = data.draw(cs.tangents(lens.cod))
    x_cov, p_cov = lens.backward(x, p, c)
    _, ref = jax.vjp(arch.reference, x, p)
    want_x, want_p = ref(c)
    laws.assert_close(x_cov.value, want_x, atol=1e-8, rtol=1e-8, what=f"input covector of {arch}")
    laws.assert_close(p_cov.value, want_p, atol=1e-8, rtol=1e-8, what=f"parameter covector of {arch}")


backward_is_the_gradient()
print("backward part of the lens = vjp of an independent implementation, on every drawn network")
"""),
    md("""
## Copies add: tied weights, and the batch

Sharing a parameter is a reparameterisation along the diagonal $P \\to P \\times P$, and the
backward part of a copy adds: the shared slot receives the **sum** of the two covectors.
A batch is the per-example traversal with the parameter copied to every example, so its
parameter covector is the sum of the per-example ones. Both laws are in `lenses.laws`.
"""),
    code("""
from categories import R
from lenses import laws as lens_laws


@few
@given(st.data())
def copies_add(data):
    A, B, C = (data.draw(ls.spaces()) for _ in range(3))
    P = R(3)
    f, g = data.draw(ls.para_lenses(A, B, param=P)), data.draw(ls.para_lenses(B, C, param=P))
    p = data.draw(ls.parameter_points(P))
    lens_laws.check_tie_sums(f, g, data.draw(cs.points(A)), p, data.draw(cs.covectors(C)))
    X = jnp.stack([data.draw(cs.points(R(3))) for _ in range(3)])
    Bc = jnp.stack([data.draw(cs.covectors(R(3))) for _ in range(3)])
    h = data.draw(ls.para_lenses(R(3), R(3), param=P))
    lens_laws.check_batched_is_sum(h, X, p, Bc)


copies_add()
print("tied slot: p'_f + p'_g; batch: the sum of the per-example covectors")
"""),
    md("""
## Store or recompute: the same numbers

The composite's backward part needs the forward value $f(a, p)$. Keeping it (the default) and
recomputing it (`checkpoint`) must give the same values and covectors.
"""),
    code("""
@few
@given(ls.architectures(depth=(1, 3), widths=(1, 3)), st.data())
def store_equals_recompute(arch, data):
    f = arch.lens
    lens_laws.check_store_equals_recompute(f, data.draw(ls.points(f.dom)),
                                           data.draw(ls.parameter_points(f.param)),
                                           data.draw(cs.covectors(f.cod)))


store_equals_recompute()
print("checkpoint(f) = f, forward and backward")
"""),
    md("""
## The checks can fail

A law check is only worth something if it can fail. Feed `check_composition` a "composition"
that applies the maps in the wrong order (on maps where the order matters):
"""),
    code("""
from categories import R, Smooth

f = Smooth(R(2), R(2), lambda x: 2.0 * x, "double")
g = Smooth(R(2), R(2), lambda x: x + 1.0, "shift")
wrong = lambda f, g: Smooth(f.dom, g.cod, lambda x: f(g(x)), "wrong order")
try:
    laws.check_composition(f, g, jnp.array([1.0, -1.0]), compose=wrong)
except AssertionError as e:
    print("caught:", str(e).splitlines()[0])
else:
    raise RuntimeError("the wrong composition was not caught")
"""),
]


# -- backprop by hand -------------------------------------------------------------------------

BACKPROP = [
    md("""
# One backward pass of a 2-2-1 network, layer by layer

The network is `dense(2,2) ≫ sigmoid ≫ dense(2,1)` with the loss $L(\\hat y) = \\tfrac12(\\hat y - y)^2$.
Column convention: `dense(n_in, n_out)` has $W$ of shape `(n_out, n_in)` and computes $Wx + b$.

The forward pass runs the components left to right and **keeps** each intermediate. The
loss supplies $dL_{\\hat y}$, the covector that starts the backward pass. Then each component's
backward part (`vjp`) runs, right to left, at the value its forward part saw; it returns a
covector on its input (passed back) and one on its parameters (kept).
"""),
    code("""
import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp
import numpy as np

from lenses import dL, dense, diagram, half_squared_error, sigmoid

net = dense(2, 2) >> sigmoid >> dense(2, 1)
print(diagram(net))

W1 = jnp.array([[0.15, 0.20], [0.25, 0.30]]); b1 = jnp.array([0.35, 0.35])
W2 = jnp.array([[0.40, 0.45]]);               b2 = jnp.array([0.60])
params = ((W1, b1), None, (W2, b2))  # sigmoid has no parameters: its slot is None (R^0)
x, y = jnp.array([0.05, 0.10]), jnp.array([0.01])
loss = half_squared_error(y)
"""),
    md("""
The same diagram as a figure; with `backward=True` the red arrows show where covectors
travel: right to left along the data wires, and up each parameter wire, where they stay.
"""),
    code("""
import matplotlib.pyplot as plt

from lenses import draw

draw(net, backward=True)
plt.show()
"""),
    md("## Forward, keeping the intermediates"),
    code("""
values, pullbacks = [x], []
for part, p in zip(net.parts, params):
    out, pull = part.vjp(values[-1], p)
    values.append(out)
    pullbacks.append(pull)
    print(f"{part.name:12s} → {np.asarray(out)}")
z1, h, yhat = values[1], values[2], values[3]
print("loss", float(loss(yhat)))
"""),
    md("## Backward, right to left"),
    code("""
c = dL(loss, yhat)  # the covector on R^1 that starts the backward pass: ŷ − y
print("dL at ŷ:", np.asarray(c.value))
param_covectors = [None] * len(net.parts)
for i in reversed(range(len(net.parts))):
    c, param_covectors[i] = pullbacks[i](c)
    print(f"{net.parts[i].name:12s} input covector {np.asarray(c.value)}")
    if param_covectors[i].value is not None:
        dW, db = param_covectors[i].value
        print(f"{'':12s} dW =\\n{np.asarray(dW)}\\n{'':12s} db = {np.asarray(db)}")
    else:
        print(f"{'':12s} no parameters: covector None (R^0), not a zero array")
"""),
    md("""
## The layer recurrence, by hand

With $\\delta^{(2)} = \\hat y - y$ at the output:
$\\partial L/\\partial W_2 = \\delta^{(2)} h^{\\mathsf T}$ (an outer product),
$\\delta^{(1)} = (W_2^{\\mathsf T} \\delta^{(2)}) \\odot \\sigma'(z_1)$ with $\\sigma' = \\sigma(1-\\sigma)$,
$\\partial L/\\partial W_1 = \\delta^{(1)} x^{\\mathsf T}$, and the biases receive the $\\delta$s.
"""),
    code("""
d2 = yhat - y
dW2, db2 = jnp.outer(d2, h), d2
d1 = (W2.T @ d2) * h * (1 - h)
dW1, db1 = jnp.outer(d1, x), d1
by_hand = ((dW1, db1), None, (dW2, db2))
print("δ2 =", np.asarray(d2), " δ1 =", np.asarray(d1))
"""),
    md("## Compared with `jax.grad` of the whole composite"),
    code("""
def whole(ps):
    (A, a), _, (B, b) = ps
    return 0.5 * jnp.sum((B @ jax.nn.sigmoid(A @ x + a) + b - y) ** 2)


grads = jax.grad(whole)(params)
lens_covectors = tuple(pc.value for pc in param_covectors)
for name, got in (("lens backward pass", lens_covectors), ("hand recurrence", by_hand)):
    for want_leaf, got_leaf in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(got)):
        np.testing.assert_allclose(got_leaf, want_leaf, rtol=1e-12, atol=1e-14)
    print(f"{name}: agrees with jax.grad")
"""),
]


NOTEBOOKS = {
    "inner_products.ipynb": INNER_PRODUCTS,
    "laws.ipynb": LAWS,
    "backprop_by_hand.ipynb": BACKPROP,
}


def build(name: str):
    nb = new_notebook(cells=NOTEBOOKS[name])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def main():
    for name in NOTEBOOKS:
        path = HERE / name
        nbformat.write(build(name), path)
        print("wrote", path.relative_to(HERE.parent))


if __name__ == "__main__":
    main()
