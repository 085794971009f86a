"""`repeat(layer, n)`: n copies of an endomorphism as one lens with stacked parameters.

The oracle is a plain JAX function written here (x ↦ tanh(W_n … tanh(W_1 x + b_1) … + b_n))
differentiated by `jax.vjp`, and the explicit chain layer ≫ … ≫ layer with the same (unstacked)
parameters; values and covectors are compared in float64, per example and batched.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from categories import DomainError, OpenBox, Positive, Product, R, draws
from lenses import (Layer, batched, checkpoint, dense, gd, repeat, stacked, tanh, train_step,
                    half_squared_error)
from lenses import Stacked

N, W = 5, 8


def plain(x, Ws, bs):
    """The oracle's forward: n rounds of tanh(W x + b), written without the library."""
    for Wi, bi in zip(Ws, bs):
        x = jnp.tanh(Wi @ x + bi)
    return x


def point(seed=0, n=N):
    r = repeat(dense(W, W) >> tanh, n)
    return r, r.init(jax.random.PRNGKey(seed))


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)


def oracle(x, P, c):
    """(value, input covector, W covectors, b covectors) from jax.vjp of the plain function."""
    (Ws, bs), _ = P
    y, pull = jax.vjp(plain, x, list(Ws), list(bs))
    dx, dWs, dbs = pull(c)
    return y, dx, jnp.stack(dWs), jnp.stack(dbs)


def test_repeat_equals_the_plain_composite_per_example():
    r, P = point()
    x, c = draws.normal(jax.random.PRNGKey(1), (W,)), draws.normal(jax.random.PRNGKey(2), (W,))
    y, (dx, dP) = jax.jit(lambda x, P, c: (r.forward(x, P), r.backward(x, P, c)))(x, P, c)
    y0, dx0, dW0, db0 = jax.jit(oracle)(x, P, c)
    close(y, y0)
    close(dx.value, dx0)
    (dW, db), none = dP.value
    close(dW, dW0)
    close(db, db0)
    assert none is None  # tanh has no parameters, so neither do its n copies


def test_repeat_equals_the_explicit_chain_with_the_same_parameters_batched():
    r, P = point()
    layer = dense(W, W) >> tanh
    chain = layer
    for _ in range(N - 1):
        chain = chain >> layer
    slots = tuple(q for copy_point in r.unstack(P) for q in copy_point)  # ((W,b), None) per copy
    X = draws.normal(jax.random.PRNGKey(3), (4, W))
    C = draws.normal(jax.random.PRNGKey(4), (4, W))
    both = jax.jit(lambda X, C, P, slots: (batched(r).forward(X, P), batched(r).backward(X, P, C),
                                           batched(chain).forward(X, slots),
                                           batched(chain).backward(X, slots, C)))
    Y, (dX, dP), Y2, (dX2, dslots) = both(X, C, P, slots)
    close(Y, Y2)
    close(dX.value, dX2.value)
    (dW, db), _ = dP.value
    for i in range(N):
        close(dW[i], dslots.value[2 * i][0])
        close(db[i], dslots.value[2 * i][1])
    # ... and the batch covectors are the per-example ones added
    per_example = jax.jit(jax.vmap(lambda x, c: r.backward(x, P, c)[1].value))(X, C)
    close(dW, jnp.sum(per_example[0][0], axis=0))


def test_forward_equals_the_plain_function_also_under_jit():
    r, P = point()
    X = draws.normal(jax.random.PRNGKey(5), (3, W))
    (Ws, bs), _ = P
    expected = jax.vmap(lambda x: plain(x, list(Ws), list(bs)))(X)
    close(batched(r).forward(X, P), expected)
    close(jax.jit(lambda X, P: batched(r).forward(X, P))(X, P), expected)


def hand_written(n):
    """x ↦ sin(x)·b with its backward part written by hand (so the reverse scan is ours)."""
    return Layer(R(n), R(n), R(n), lambda x, b: jnp.sin(x) * b, name="sinb",
                    backward=lambda x, b, c: (c * jnp.cos(x) * b, c * jnp.sin(x)),
                    init=lambda k: 1.0 + 0.1 * jax.random.normal(k, (n,)))


@pytest.mark.parametrize("remat", [False, True])
@pytest.mark.parametrize("make", ["derived", "hand-written", "checkpointed"])
def test_every_kind_of_layer_and_the_recompute_flag_give_the_oracle(make, remat):
    layer = {"derived": lambda: dense(W, W) >> tanh,
             "hand-written": lambda: dense(W, W) >> hand_written(W),
             "checkpointed": lambda: checkpoint(dense(W, W) >> tanh)}[make]()
    r = repeat(layer, 3, remat=remat)
    P = r.init(jax.random.PRNGKey(6))
    (Ws, bs), rest = P

    def f(x, Ws, bs, rest):  # the oracle: the same maps, written out, differentiated by JAX
        for i in range(3):
            x = Ws[i] @ x + bs[i]
            x = jnp.sin(x) * rest[i] if make == "hand-written" else jnp.tanh(x)
        return x

    X = draws.normal(jax.random.PRNGKey(7), (4, W))
    C = draws.normal(jax.random.PRNGKey(8), (4, W))
    # one compiled program per case: the lens's values and covectors beside the oracle's
    Y, (dX, dP) = jax.jit(lambda X, P, C: (batched(r).forward(X, P), batched(r).backward(X, P, C)))(X, P, C)
    Y0, vpull = jax.vjp(jax.vmap(f, (0, None, None, None)), X, Ws, bs, rest)
    dX0, dW0, db0, drest0 = vpull(C)
    close(Y, Y0)
    close(dX.value, dX0)
    (dW, db), drest = dP.value
    close(dW, dW0)
    close(db, db0)
    if make == "hand-written":
        close(drest, drest0)


def test_parameter_space_init_and_description():
    r = repeat(dense(W, W) >> tanh, N)
    assert r.dom == r.cod == R(W)
    assert r.param == Product(Product(R(N, W, W), R(N, W)), R(0))
    assert r.param.size == N * (W * W + W)
    P = r.init(jax.random.PRNGKey(0))
    r.param.check(P)
    (Ws, bs), none = P
    assert Ws.shape == (N, W, W) and none is None
    assert not np.allclose(Ws[0], Ws[1])  # each copy draws its own initial point
    close(bs, np.zeros((N, W)))  # ... with the layer's own initialiser (biases at 0)
    text = repr(r)
    assert "repeat(dense(8→8) ≫ tanh, 5)" in text and ")^5" in text
    assert r.stack(r.unstack(P))[0][0].shape == (N, W, W)


def test_stacked_spaces_keep_the_open_set_slice_by_slice():
    assert stacked(R(3), 4) == R(4, 3)
    assert stacked(R(0), 4) == R(0)
    assert stacked(Positive(2), 3) == Positive(3, 2)
    box = OpenBox(-1.0, 1.0, (2,))
    S = stacked(box, 3)
    assert isinstance(S, Stacked) and S.shape == (3, 2)
    assert S.contains(jnp.zeros((3, 2)))
    bad = jnp.zeros((3, 2)).at[1, 0].set(2.0)  # only copy 1 leaves its box
    assert not S.contains(bad)
    with pytest.raises(DomainError, match=r"coordinate \(1, 0\)"):
        S.check(bad)
    assert bool(S.indicator(jnp.zeros((3, 2)))) and not bool(S.indicator(bad))
    sample = S.sample_interior(jax.random.PRNGKey(0))
    assert sample.shape == (3, 2) and S.contains(sample)


def test_refusals():
    with pytest.raises(TypeError, match="A → A"):
        repeat(dense(3, 4), 2)
    with pytest.raises(ValueError, match="positive"):
        repeat(dense(3, 3), 0)


def test_a_parameterless_polymorphic_layer_takes_its_space_from_composition():
    model = dense(3, 3) >> repeat(tanh, 3)
    p = model.init(jax.random.PRNGKey(0))
    x = jnp.arange(3.0)
    W_, b_ = p[0]
    close(model.forward(x, p), jnp.tanh(jnp.tanh(jnp.tanh(W_ @ x + b_))))


def test_a_training_step_moves_the_stacked_parameters_by_the_gradient():
    model = dense(3, W) >> repeat(dense(W, W) >> tanh, 3) >> dense(W, 2)
    p = model.init(jax.random.PRNGKey(0))
    X = draws.normal(jax.random.PRNGKey(1), (6, 3))
    Y = draws.normal(jax.random.PRNGKey(2), (6, 2))
    step = train_step(model, half_squared_error, gd(0.1))
    state, _ = step(step.init(p), X, Y)

    def loss(p):  # the oracle: the mean loss of the plain network, differentiated by JAX
        (W0, b0), ((Ws, bs), _), (W2, b2) = p
        out = jax.vmap(lambda x: W2 @ plain(W0 @ x + b0, list(Ws), list(bs)) + b2)(X)
        return jnp.mean(0.5 * jnp.sum((out - Y) ** 2, axis=-1))

    expected = jax.tree_util.tree_map(lambda a, g: a - 0.1 * g, p, jax.jit(jax.grad(loss))(p))
    for a, b in zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(expected)):
        close(a, b)
