"""`categories.draws`: the initial points' random draws are JAX's own numbers, bit for bit.

The oracle is `jax.random.normal` and `jax.random.split` called directly at the same key and
shape; the draws pad the count to a power of 16, so the shapes straddle each padded count and
the fallbacks (a typed key, the non-partitionable threefry, a key under a trace, a draw past
the largest padded count) are each taken.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from categories import R, draws
from lenses import dense, lstm_cell, multi_head_attention, repeat, tanh

SHAPES = [(), (3, 5), (16,), (17,), (4097,), (0, 3)]  # each count drawn, and the empty draw


def identical(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)


@pytest.mark.parametrize("x64", [True, False], ids=["float64", "float32"])
def test_normal_and_split_are_jax_s_own_numbers(x64):
    with jax.enable_x64(x64):
        for seed in (0, 7):
            key = jax.random.PRNGKey(seed)
            for shape in SHAPES:
                assert identical(draws.normal(key, shape), jax.random.normal(key, shape)), shape
            for n in (1, 3, 17):
                got, want = draws.split(key, n), jax.random.split(key, n)
                assert len(got) == n and all(identical(g, w) for g, w in zip(got, want)), n


def test_the_counts_drawn_are_four_powers_of_16():
    counts = {draws.padded(n) for n in range(1, draws.LARGEST_PADDED + 1)}
    assert counts == {16, 256, 4096, 65536}
    assert draws.padded(0) is None and draws.padded(draws.LARGEST_PADDED + 1) is None
    assert all(draws.padded(n) >= n for n in (1, 15, 16, 17, 255, 256, 257, 65536))


def test_where_the_prefix_property_fails_the_draw_is_jax_s_call():
    typed = jax.random.key(3)
    assert identical(jax.random.key_data(draws.split(typed, 3)[1]),
                     jax.random.key_data(jax.random.split(typed, 3)[1]))
    assert identical(draws.normal(typed, (3, 5)), jax.random.normal(typed, (3, 5)))
    key = jax.random.PRNGKey(3)
    large = (draws.LARGEST_PADDED + 1,)
    assert identical(draws.normal(key, large), jax.random.normal(key, large))
    with jax.threefry_partitionable(False):  # draws of different counts then differ
        assert not identical(jax.random.normal(key, (16,))[:5], jax.random.normal(key, (5,)))
        assert identical(draws.normal(key, (5,)), jax.random.normal(key, (5,)))
        assert all(identical(a, b) for a, b in zip(draws.split(key, 3), jax.random.split(key, 3)))
    traced = jax.jit(lambda k: draws.normal(k, (3, 5)))(key)
    assert identical(traced, jax.jit(lambda k: jax.random.normal(k, (3, 5)))(key))
    vmapped = jax.vmap(lambda k: draws.normal(k, (3,)))(jax.random.split(key, 2))
    assert identical(vmapped, jax.vmap(lambda k: jax.random.normal(k, (3,)))(jax.random.split(key, 2)))


def test_an_initial_point_is_the_one_jax_s_calls_draw():
    """A model's init, eagerly, against the same initialisers under `jax.vmap` over one key,
    where every draw is JAX's own call (a key under a trace is not padded): chains, `repeat`
    (its copies drawn one by one), a recurrent cell and attention. In float32, where XLA's
    division rounds vector lanes and the rest differently: the scaling must be computed on
    the drawn shape, as JAX's own call computes it."""
    model = ((dense(4, 3) >> tanh >> dense(3, 5)) @ repeat(dense(3, 3) >> tanh, 2)
             @ lstm_cell(2, 3) @ multi_head_attention(6, 2).at(R(2, 6)))
    key = jax.random.PRNGKey(11)
    with jax.enable_x64(False):
        got = model.init(key)
        want = jax.tree_util.tree_map(lambda a: a[0], jax.vmap(model.init)(key[None]))
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    assert all(identical(a, b) for a, b in zip(jax.tree_util.tree_leaves(got),
                                               jax.tree_util.tree_leaves(want)))
    assert sum(np.asarray(a).size > 1 and float(jnp.std(a)) > 0
               for a in jax.tree_util.tree_leaves(got)) >= 8  # drawn, not constants
