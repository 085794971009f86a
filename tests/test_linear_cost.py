"""The backward pass costs what the forward pass costs: linear in depth, never quadratic.

Not timed. The program of one training step (forward, loss, backward) is counted in jaxpr
equations (sub-programs of conditionals, scans and custom rules included): for a chain of depth
n it must grow by the same amount for every added layer, which a nested closure re-running
earlier forwards would break (its growth is quadratic). The forward part of every layer is
counted directly too: once per step under the store rule, twice under the recompute rule.
`repeat` compiles to a scan, so its program does not grow with n at all.
"""

import jax
import jax.numpy as jnp
import pytest
from jax.extend.core import jaxprs_in_params

from categories import Product, R, draws
from lenses import (Layer, batch_loss, batched, checkpoint, dense, dL, half_squared_error,
                    repeat, tanh)

WIDTH, BATCH = 4, 3


def size(jaxpr) -> int:
    """Number of equations, counting those of every sub-program (branches, loop bodies, rules)."""
    return sum(1 + sum(size(sub) for sub in jaxprs_in_params(e.params)) for e in jaxpr.eqns)


def step(model):
    """(p, X, Y) ↦ (loss, parameter covector): one training step, before the update."""
    def run(p, X, Y):
        out, pull = batched(model).vjp(X, p)
        L = batch_loss(half_squared_error, Y)
        return L.fn(out), pull(dL(L, out))[1].value
    return run


def program_size(model) -> int:
    p = jax.eval_shape(model.init, jax.random.PRNGKey(0))  # shapes suffice: nothing is run
    X, Y = jnp.ones((BATCH, WIDTH)), jnp.ones((BATCH, WIDTH))
    return size(jax.make_jaxpr(step(model))(p, X, Y).jaxpr)


def counted(calls):
    """dense ≫ (x ↦ tanh(x)·b) whose forward part counts its own evaluations (at trace time)."""
    def fwd(x, b):
        calls.append(1)
        return jnp.tanh(x) * b

    return dense(WIDTH, WIDTH) >> Layer(R(WIDTH), R(WIDTH), R(WIDTH), fwd, name="counted",
                                           init=lambda k: jnp.ones((WIDTH,)), check=False)


def hand_written():
    """A layer with a backward part of its own: chains of these take the per-component path."""
    return dense(WIDTH, WIDTH) >> Layer(
        R(WIDTH), R(WIDTH), R(0), lambda x, p: jnp.sin(x), name="sin",
        backward=lambda x, p, c: (c * jnp.cos(x), None))


def chain(make, n):
    m = make()
    for _ in range(n - 1):
        m = m >> make()
    return m


KINDS = {
    "derived": lambda n: chain(lambda: dense(WIDTH, WIDTH) >> tanh, n),
    "hand-written": lambda n: chain(hand_written, n),
    "checkpointed per layer": lambda n: chain(lambda: checkpoint(dense(WIDTH, WIDTH) >> tanh), n),
    "checkpointed in segments": lambda n: checkpoint(chain(lambda: dense(WIDTH, WIDTH) >> tanh, n),
                                                     segments=4),
}


@pytest.mark.parametrize("kind", KINDS)
def test_program_of_a_training_step_grows_linearly_with_depth(kind):
    depths = (4, 8, 16, 32)
    sizes = [program_size(KINDS[kind](n)) for n in depths]
    per_layer = per_layer_growth(sizes, depths)
    # Every added layer adds the same number of equations (exactly, up to a handful for the
    # loss and the bookkeeping): a quadratic program would double its increment each time.
    assert max(per_layer) - min(per_layer) <= 0.5, (sizes, per_layer)
    assert sizes[-1] <= 8.5 * sizes[0], sizes


@pytest.mark.parametrize("rule, expected", [("store", 1), ("recompute", 2)])
def test_each_layer_forward_runs_once_per_step_under_the_store_rule(rule, expected):
    for n in (3, 6):
        calls = []
        model = chain(lambda: counted(calls), n)
        if rule == "recompute":
            model = checkpoint(model, segments=n)
        calls.clear()  # building the lens checks shapes once; count only the step
        program_size(model)
        assert len(calls) == expected * n


def per_layer_growth(sizes, depths):
    return [(b - a) / (m - n) for (n, a), (m, b) in zip(zip(depths, sizes), zip(depths[1:], sizes[1:]))]


def test_the_check_catches_a_program_that_reruns_every_prefix():
    """The check can fail: a forward part that re-runs the whole prefix for each layer (what a
    nested closure does) gives a program whose growth per layer increases with depth."""
    def prefixes(n):
        def fwd(x, Ws):
            total = jnp.zeros_like(x)
            for i in range(n):  # Σ_i (layer_i ∘ … ∘ layer_1)(x): prefix i costs i layers
                h = x
                for Wj in Ws[:i + 1]:
                    h = jnp.tanh(Wj @ h)
                total = total + h
            return total
        P = tuple(R(WIDTH, WIDTH) for _ in range(n))
        return Layer(R(WIDTH), R(WIDTH), Product(*P), fwd, name="prefixes", check=False)

    depths = (4, 8, 16)
    growth = per_layer_growth([program_size(prefixes(n)) for n in depths], depths)
    assert growth[1] > 1.5 * growth[0]


def test_repeat_program_does_not_grow_with_the_number_of_copies():
    sizes = {n: program_size(dense(WIDTH, WIDTH) >> repeat(dense(WIDTH, WIDTH) >> tanh, n)) for n in (2, 8, 64)}
    assert len(set(sizes.values())) == 1, sizes
    remat = {n: program_size(repeat(hand_written(), n, remat=True)) for n in (2, 64)}
    assert len(set(remat.values())) == 1, remat
    own = {n: program_size(repeat(hand_written(), n)) for n in (2, 64)}
    assert len(set(own.values())) == 1, own


# -- the recompute rule in segments -----------------------------------------------------------------

def plain_chain(x, Ws, bs, c):
    """The oracle: n rounds of sin(tanh(W x + b)) ⊙ c, written without the library."""
    for W, b in zip(Ws, bs):
        x = jnp.sin(jnp.tanh(W @ x + b)) * c
    return x


def sine_scaled(c):
    """x ↦ sin(x)·c with a hand-written backward part (so recomputation must re-run it)."""
    return Layer(R(WIDTH), R(WIDTH), R(0), lambda x, p: jnp.sin(x) * c, name="sin·c",
                    backward=lambda x, p, g: (g * jnp.cos(x) * c, None))


@pytest.mark.parametrize("segments", [None, 1, 3, "sqrt", 100])
def test_recompute_in_segments_gives_the_values_and_covectors_of_the_store_rule(segments):
    n, c = 6, jnp.linspace(0.5, 1.5, WIDTH)
    store = chain(lambda: dense(WIDTH, WIDTH) >> tanh >> sine_scaled(c), n)
    model = checkpoint(store, segments=segments)
    assert model.param == store.param and model.dom == store.dom  # the same lens, other rule
    p = store.init(jax.random.PRNGKey(0))
    X = draws.normal(jax.random.PRNGKey(1), (BATCH, WIDTH))
    G = draws.normal(jax.random.PRNGKey(2), (BATCH, WIDTH))
    Ws, bs = [p[3 * i][0] for i in range(n)], [p[3 * i][1] for i in range(n)]
    Y0, pull0 = jax.vjp(jax.vmap(plain_chain, (0, None, None, None)), X, Ws, bs, c)
    dX0, dW0, db0, _ = pull0(G)
    run = lambda X, p, G: batched(model).vjp(X, p)[1](G) + (batched(model).forward(X, p),)  # noqa: E731
    for run in ([run, jax.jit(run)] if segments == 3 else [jax.jit(run)]):  # eager once, compiled always
        dX, dp, Y = run(X, p, G)
        assert jnp.allclose(Y, Y0, rtol=1e-10, atol=1e-12)
        assert jnp.allclose(dX.value, dX0, rtol=1e-10, atol=1e-12)
        for i in range(n):
            assert jnp.allclose(dp.value[3 * i][0], dW0[i], rtol=1e-10, atol=1e-12)
            assert jnp.allclose(dp.value[3 * i][1], db0[i], rtol=1e-10, atol=1e-12)
            assert dp.value[3 * i + 1] is None and dp.value[3 * i + 2] is None


def test_segments_are_refused_unless_a_positive_count():
    with pytest.raises(ValueError, match="segments"):
        checkpoint(dense(2, 2) >> tanh, segments=0)


def test_recompute_in_segments_keeps_less_in_the_compiled_step():
    """XLA's own account of the compiled step (not a timing): the scratch memory of the
    recompute rule in √n segments is at most half that of the store rule. (XLA's CPU pipeline
    would merge a plain recomputation back into the forward pass and keep everything.)"""
    n, width, batch = 32, 8, 1024

    def temp(model):
        p = model.init(jax.random.PRNGKey(0))
        X, Y = jnp.ones((batch, width), jnp.float32), jnp.ones((batch, width), jnp.float32)
        p = jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), p)
        compiled = jax.jit(step(model)).lower(p, X, Y).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    store = chain(lambda: dense(width, width) >> tanh, n)
    assert temp(checkpoint(store, segments="sqrt")) <= 0.5 * temp(store)
