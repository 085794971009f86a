"""Layer normalisation, position-wise dense, embeddings, dropout, attention and the transformer
block against independent JAX implementations written here, in float64 at 1e-9.

Oracles: each layer's map written directly (per head loops for attention, one-hot products
for the embedding, explicit masks), differentiated by `jax.grad` of ⟨c, oracle⟩ for a random
covector c; nothing is compared with values the library produced. Both sides are compared
compiled whole, over a few shapes: JAX compiles once per shape, where op by op each of a
block's hundreds of operations would compile.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from categories import R
from lenses import (KFAC, Context, Diagonal, Keys, Tokens, attention_core, batched, checkpoint,
                    dense, diagram, dropout, embedding, evaluation, expression, flatten, gd,
                    identity, layer_norm, multi_head_attention, position_embedding,
                    positionwise_dense, repeat, sequence_cross_entropy, softmax_cross_entropy,
                    tie, train_step, transformer_block, uses)
from lenses.laws import assert_close

TOL = dict(atol=1e-9, rtol=1e-9)
FEW = settings(max_examples=6, deadline=None)
SHAPES = st.sampled_from([(1, 4), (3, 4), (4, 6)])  # (T, d): few shapes, few compilations


def rng(seed):
    return np.random.default_rng(seed)


def normal(seed, shape):
    return jnp.asarray(rng(seed).standard_normal(shape))


def compare(lens, oracle, x, p, seed, input_covector=True, c=None):
    """forward vs oracle; backward (a', p') vs jax.grad of ⟨c, oracle⟩ for c (random, if not
    given); returns the values (a', p'). Each side is compiled whole (`jax.jit`)."""
    out = jax.jit(oracle)(x, p)
    assert_close(jax.jit(lens.forward)(x, p), out, what=f"{lens.name}: forward", **TOL)
    if c is None:
        c = jax.tree_util.tree_map(lambda o: jnp.asarray(rng(seed).standard_normal(o.shape)), out)
    # c an argument, not a constant of the program: the examples of a shape share one compilation
    ga, gp = jax.jit(jax.grad(lambda x, p, c: sum(jnp.sum(ci * oi) for ci, oi in
                                                  zip(jax.tree_util.tree_leaves(c),
                                                      jax.tree_util.tree_leaves(oracle(x, p)))),
                              argnums=(0, 1)))(x, p, c)
    da, dp = jax.jit(lambda x, p, c: tuple(v.value for v in lens.backward(x, p, c)))(x, p, c)
    if input_covector:
        assert_close(da, ga, what=f"{lens.name}: input covector", **TOL)
    assert_close(dp, gp, what=f"{lens.name}: parameter covector", **TOL)
    return da, dp


# -- the oracles -----------------------------------------------------------------------------

def ln_oracle(x, gb):
    g, b = gb
    n = x.shape[-1]
    centred = x - jnp.sum(x, axis=-1, keepdims=True) / n
    sd = jnp.sqrt(jnp.sum(centred * centred, axis=-1, keepdims=True) / n + 1e-5)
    return jnp.broadcast_to(g, x.shape) * (centred / sd) + jnp.broadcast_to(b, x.shape)


def dense_rows(X, Wb):  # row by row (mapped by jax.vmap): the dense layer at each position
    W, b = Wb
    return jax.vmap(lambda x: W @ x + b)(X)


def attention_oracle(Q, K, V, heads, causal):
    """Head by head and row by row (the rows mapped by `jax.vmap`), with an explicit −∞ mask
    (row t sees columns s ≤ t)."""
    T, d = Q.shape
    dh = d // heads
    outs = []
    for h in range(heads):
        q, k, v = (Z[:, h * dh:(h + 1) * dh] for Z in (Q, K, V))

        def row(qt, t, k=k, v=v):
            s = (k @ qt) / np.sqrt(dh)
            if causal:
                s = jnp.where(jnp.arange(T) <= t, s, -jnp.inf)
            w = jnp.exp(s - jnp.max(s))
            return (w / jnp.sum(w)) @ v
        outs.append(jax.vmap(row)(q, jnp.arange(T)))
    return jnp.concatenate(outs, axis=1)


def mha_split(xq, xk, xv, ps, heads, causal):
    """Multi-head attention with its three inputs apart (the uses of the copied input)."""
    (pq, pk), pv, po = ps
    return dense_rows(attention_oracle(dense_rows(xq, pq), dense_rows(xk, pk), dense_rows(xv, pv),
                                       heads, causal), po)


def mha_params(p):
    """The lens's point (None, (None, None), ((q, k), v), None, o) as ((q, k), v, o)."""
    return (p[2][0], p[2][1], p[4])


def block_oracle(x, ps, heads, causal=True):
    ln1, att, ln2, (W1, b1), (W2, b2) = ps
    h = ln_oracle(x, ln1)
    x = x + mha_split(h, h, h, att, heads, causal)
    h = ln_oracle(x, ln2)
    u = dense_rows(h, (W1, b1))
    return x + dense_rows(0.5 * u * (1.0 + jax.scipy.special.erf(u / np.sqrt(2.0))), (W2, b2))


def block_params(p):
    """The block's point, read off its structure: residual ≫ residual, each copy ≫ (chain ⊗ id) ≫ add."""
    att, mlp = p[1][0], p[4][0]
    return (att[0], mha_params(att[1:]), mlp[0], mlp[1], mlp[3])


# -- layer normalisation, position-wise dense, positions ---------------------------------------

@FEW
@given(SHAPES, st.integers(0, 2 ** 16))
def test_layer_norm_against_its_formula(shape, seed):
    layer = layer_norm(shape[1]).at(R(*shape))
    p = (normal(seed, shape[1:]), normal(seed + 1, shape[1:]))
    compare(layer, ln_oracle, normal(seed + 2, shape), p, seed + 3)


def test_layer_norm_starts_at_the_identity_scale_and_works_on_vectors():
    layer = layer_norm(5).at(R(5))
    g, b = layer.init(jax.random.PRNGKey(0))
    assert_close((g, b), (jnp.ones(5), jnp.zeros(5)), what="γ = 1, β = 0", atol=0, rtol=0)
    x = normal(0, (5,))
    y = layer.forward(x, (g, b))
    assert abs(float(jnp.mean(y))) < 1e-12 and abs(float(jnp.mean(y ** 2)) - 1.0) < 1e-4


@FEW
@given(SHAPES, st.sampled_from([2, 3]), st.integers(0, 2 ** 16))
def test_positionwise_dense_is_dense_at_every_position(shape, n_out, seed):
    T, d = shape
    layer = positionwise_dense(d, n_out).at(R(T, d))
    assert layer.cod == R(T, n_out)
    p = (normal(seed, (n_out, d)), normal(seed + 1, (n_out,)))
    compare(layer, dense_rows, normal(seed + 2, shape), p, seed + 3)


def test_position_embedding_adds_one_vector_per_position():
    layer = position_embedding().at(R(3, 4))
    E = normal(1, (3, 4))
    compare(layer, lambda x, E: x + E, normal(2, (3, 4)), E, 3)


# -- embedding -------------------------------------------------------------------------------

@FEW
@given(st.sampled_from([(1, 3), (4, 5)]), st.integers(0, 2 ** 16))
def test_embedding_is_the_one_hot_product_and_its_input_covector_is_zero(Tv, seed):
    T, V = Tv
    d = 3
    layer = embedding(V, d).at(Tokens(T, V))
    toks = rng(seed).integers(0, V, T)
    E = normal(seed, (d, V))

    def oracle(x, E):  # one-hot rows times Eᵀ: the linear map R^V → R^d at each e_{x_t}
        onehot = (jnp.asarray(toks)[:, None] == jnp.arange(V)[None, :]).astype(E.dtype)
        return onehot @ E.T

    da, dp = compare(layer, oracle, jnp.asarray(toks, dtype=float), E, seed + 1, input_covector=False)
    assert_close(da, jnp.zeros(T), what="input covector of the embedding", atol=0, rtol=0)
    unused = np.setdiff1d(np.arange(V), toks)
    assert np.all(np.asarray(dp)[:, unused] == 0)  # sparse in effect
    # integer tokens: the same values, and JAX's float0 "no covector" for the input
    assert_close(layer.forward(jnp.asarray(toks), E), oracle(None, E), what="integer tokens", **TOL)


def test_tokens_are_an_open_set_around_the_integers():
    S = Tokens(3, 5)
    assert S.contains(jnp.array([0.0, 4.0, 2.3]))
    assert not S.contains(jnp.array([0.0, 5.0, 2.0]))  # outside the vocabulary
    assert not S.contains(jnp.array([0.0, 1.5, 2.0]))  # half-way: on no cube
    with pytest.raises(TypeError, match=r"Tokens\(T, 7\)"):
        embedding(7, 2).at(R(3))


# -- dropout ---------------------------------------------------------------------------------

def test_dropout_draws_its_mask_from_the_key_wire_and_is_inactive_at_evaluation():
    A, rate = R(40, 50), 0.3
    layer = dropout(rate).at(A * Keys())
    x, c = normal(0, (40, 50)) + 3.0, normal(1, (40, 50))
    key = jax.random.PRNGKey(7)
    y = layer.forward((x, key), None)
    kept = np.asarray(y) != 0
    assert abs(kept.mean() - (1 - rate)) < 0.03  # 2000 Bernoulli(0.7) draws
    assert_close(y[kept], x[kept] / (1 - rate), what="kept values scaled by 1/(1 − rate)", **TOL)
    dx = layer.backward((x, key), None, c)[0].value[0]
    assert_close(dx, jnp.where(jnp.asarray(kept), c / (1 - rate), 0.0), what="dropout's backward", **TOL)
    # another key, another mask; the same key, the same mask
    assert not np.array_equal(kept, np.asarray(layer.forward((x, jax.random.PRNGKey(8)), None)) != 0)
    assert np.array_equal(np.asarray(layer.forward((x, key), None)), np.asarray(y))
    off = evaluation(layer)
    assert_close(off.forward((x, key), None), x, what="dropout at evaluation", atol=0, rtol=0)


def test_dropout_in_a_batch_uses_one_key_per_example_and_evaluation_keeps_the_point():
    A = R(2, 6)
    drop = dropout(0.5).at(A * Keys())
    model = drop >> layer_norm(6)
    p = model.init(jax.random.PRNGKey(0))
    X = jnp.broadcast_to(normal(3, (2, 6)), (4, 2, 6))
    keys = jax.random.split(jax.random.PRNGKey(1), 4)
    masks = np.asarray(batched(drop).forward((X, keys), None)) != 0
    assert len({m.tobytes() for m in masks}) > 1  # examples draw different masks
    off = evaluation(model)
    assert off.param == model.param and expression(off, types=False).startswith("dropout(0.5), evaluation")
    assert_close(batched(off).forward((X, keys), p), batched(layer_norm(6).at(A)).forward(X, p[1]),
                 what="evaluation: dropout is the identity", **TOL)


# -- attention -------------------------------------------------------------------------------

@FEW
@given(st.sampled_from([(3, 4, 1), (4, 4, 2), (3, 6, 3)]), st.booleans(), st.integers(0, 2 ** 16))
def test_attention_core_against_head_by_head_attention(shape, causal, seed):
    T, d, heads = shape
    A = R(T, d)
    core = attention_core(A, heads, causal)
    qkv = ((normal(seed, (T, d)), normal(seed + 1, (T, d))), normal(seed + 2, (T, d)))
    compare(core, lambda a, p: attention_oracle(a[0][0], a[0][1], a[1], heads, causal), qkv, None, seed + 3)


def _mha(T, d, heads, causal, seed):
    lens = multi_head_attention(d, heads, causal).at(R(T, d))
    p = lens.init(jax.random.PRNGKey(seed))
    p = jax.tree_util.tree_map(lambda a: a + 0.1 * normal(seed + 9, a.shape), p)  # biases ≠ 0
    return lens, p


@FEW
@given(st.sampled_from([(3, 4, 2), (4, 6, 3)]), st.booleans(), st.integers(0, 2 ** 10))
def test_multi_head_attention_against_jax_and_its_input_covector_is_the_sum_of_three_uses(shape, causal, seed):
    T, d, heads = shape
    lens, p = _mha(T, d, heads, causal, seed)
    x, c = normal(seed, (T, d)), normal(seed + 1, (T, d))
    ps = mha_params(p)
    dx, _ = compare(lens, lambda x, p: mha_split(x, x, x, mha_params(p), heads, causal), x, p, seed,
                    c=c)
    # the three uses of the copied input, apart: queries, keys and values
    uses3 = jax.jit(jax.grad(lambda a, b, v, ps, c: jnp.sum(c * mha_split(a, b, v, ps, heads,
                                                                          causal)),
                             argnums=(0, 1, 2)))(x, x, x, ps, c)
    assert_close(dx, uses3[0] + uses3[1] + uses3[2], what="input covector = Σ of the three uses", **TOL)
    for i, j in ((0, 1), (0, 2), (1, 2)):  # three different covectors: none of them is redundant
        assert not np.allclose(uses3[i], uses3[j])
    if T > 1:
        assert float(jnp.max(jnp.abs(uses3[1]))) > 1e-6  # keys matter once there are two positions


def test_the_attention_expression_shows_its_copies():
    lens = multi_head_attention(4, 2).at(R(3, 4))
    assert expression(lens, types=False) == (
        "copy ≫ (copy ⊗ id) ≫ ((query ⊗ key) ⊗ value) ≫ attention(2 heads, causal) ≫ output")
    assert uses(lens) == (0, (0, 0), ((1, 1), 1), 0, 1)
    text = diagram(lens)
    assert text.count("●") >= 2 and "┤ attention(2 heads, causal) ├" in text


def test_causal_attention_does_not_look_ahead():
    lens, p = _mha(5, 4, 2, True, 0)
    x = normal(1, (5, 4))
    later = x.at[3:].set(normal(2, (2, 4)))
    assert_close(lens.forward(later, p)[:3], lens.forward(x, p)[:3], what="rows 0..2", **TOL)
    open_, q = _mha(5, 4, 2, False, 0)
    assert not np.allclose(open_.forward(later, q)[:3], open_.forward(x, q)[:3])


# -- the transformer block -------------------------------------------------------------------

@settings(max_examples=2, deadline=None)  # each example: a whole block, two shapes
@given(st.sampled_from([(3, 4, 2, 8), (2, 6, 3, 5)]), st.integers(0, 2 ** 10))
def test_transformer_block_against_jax(shape, seed):
    T, d, heads, hidden = shape
    block = transformer_block(d, heads, hidden).at(R(T, d))
    p = block.init(jax.random.PRNGKey(seed))
    p = jax.tree_util.tree_map(lambda a: a + 0.1 * normal(seed + 5, a.shape), p)
    compare(block, lambda x, p: block_oracle(x, block_params(p), heads), normal(seed, (T, d)), p,
            seed + 1)


def test_sequence_cross_entropy_is_the_mean_over_positions():
    Z, y = normal(0, (4, 5)), np.array([0, 4, 2, 2])
    want = np.mean([-(Z[t, y[t]] - np.log(np.sum(np.exp(Z[t])))) for t in range(4)])
    assert float(sequence_cross_entropy(y, classes=5).fn(Z)) == pytest.approx(float(want), rel=1e-12)


# -- with every combinator, the metrics and the descriptions -----------------------------------

def test_the_new_layers_batched_checkpointed_repeated_and_trained():
    T, d, V = 3, 4, 6
    model = (embedding(V, d).at(Tokens(T, V)) >> position_embedding()
             >> checkpoint(transformer_block(d, 2, 8)) >> repeat(layer_norm(d) >> positionwise_dense(d, d), 2)
             >> layer_norm(d) >> positionwise_dense(d, V))
    p = model.init(jax.random.PRNGKey(0))
    X = jnp.asarray(rng(1).integers(0, V, (5, T)), dtype=float)
    C = normal(2, (5, T, V))

    def direct(x, p):  # the same network, written directly
        E, P, blk, ((g, b), Wb), ln, head = p
        h = E.T[jnp.round(x).astype(int)] + P
        h = block_oracle(h, block_params(blk), 2)
        for i in range(2):
            h = dense_rows(ln_oracle(h, (g[i], b[i])), (Wb[0][i], Wb[1][i]))
        return dense_rows(ln_oracle(h, ln), head)

    # compiled, both sides: this test is about the combinators, not about one more shape
    Y0, gp = jax.jit(lambda p: (jax.vmap(direct, (0, None))(X, p),
                                jax.grad(lambda p: jnp.sum(C * jax.vmap(direct, (0, None))(X, p)))(p)))(p)
    Y, (dX, dp) = jax.jit(lambda X, p, C: (batched(model).forward(X, p),
                                           batched(model).backward(X, p, C)))(X, p, C)
    assert_close(Y, Y0, what="batched forward", **TOL)
    assert_close(dp.value, gp, what="batched parameter covectors added over the batch", **TOL)
    assert_close(dX.value, jnp.zeros_like(X), what="token covector", atol=0, rtol=0)
    step = train_step(model, sequence_cross_entropy(classes=V), gd(0.5))
    state = step.init(p)
    Yl = jnp.asarray(rng(3).integers(0, V, (5, T)))
    first = None
    for _ in range(15):
        state, report = step(state, X, Yl)
        first = float(report.loss) if first is None else first
    assert float(report.loss) < first
    assert "repeat ×2" in diagram(model) and "checkpoint: recompute" in diagram(model)


def test_kfac_reads_only_declared_structure_and_the_new_layers_declare_none():
    T, d = 3, 4
    model = layer_norm(d).at(R(T, d)) >> multi_head_attention(d, 2) >> flatten >> dense(T * d, 3)
    p = model.init(jax.random.PRNGKey(0))
    X, Y = normal(0, (6, T, d)), jnp.asarray(rng(1).integers(0, 3, 6))
    loss = functools.partial(softmax_cross_entropy, classes=3)  # a family Fisher knows
    ctx = Context(model, loss, X, Y)
    g = jax.tree_util.tree_map(jnp.ones_like, p)
    with pytest.raises(TypeError, match="layer_norm.*declares none"):
        KFAC().sharp(p, g, ctx)
    v = KFAC(fallback="euclidean").sharp(p, g, ctx).value
    assert [s.structure is not None for s in model.sites()] == [False] * 5 + [True]
    assert_close(v[:-1], g[:-1], what="identity blocks for the undeclared layers", atol=0, rtol=0)
    assert not np.allclose(np.asarray(v[-1][0]), np.asarray(g[-1][0]))  # dense gets its KFAC block
    w = Diagonal(2.0).sharp(p, g).value
    assert_close(w[0][0], g[0][0] / 2.0, what="a diagonal metric on layer_norm's slot", **TOL)


def test_integer_tokens_and_keys_pass_through_checkpoint_and_tie():
    T, V, d = 3, 5, 4
    model = ((embedding(V, d).at(Tokens(T, V)) @ identity.at(Keys())) >> dropout(0.3)
             >> tie(layer_norm(d) >> positionwise_dense(d, d) >> layer_norm(d), [0, 2]))
    p = model.init(jax.random.PRNGKey(0))
    X = (jnp.asarray(rng(0).integers(0, V, (2, T))), jax.random.split(jax.random.PRNGKey(1), 2))
    C = normal(1, (2, T, d))
    plain = batched(model).backward(X, p, C)
    again = batched(checkpoint(model)).backward(X, p, C)  # the recompute rule, integer inputs
    assert_close(again[1].value, plain[1].value, what="checkpointed covectors", **TOL)
    # tokens given as integers are points of the discrete Tokens and stay integers: their
    # covector is JAX's float0 zero (no covector), through the recompute rule as without it
    for covs in (again, plain):
        assert covs[0].value[0].dtype == jax.dtypes.float0
        assert covs[0].value[1].dtype == jax.dtypes.float0

    def direct(x, k, p):  # the same network, written directly; the tied slot used twice
        (E, _), _, ((g, b), Wb, _) = p
        keep = jax.random.bernoulli(k, 0.7, (T, d))
        h = jnp.where(keep, E.T[x] / 0.7, 0.0)
        return ln_oracle(dense_rows(ln_oracle(h, (g, b)), Wb), (g, b))

    q = (p[0], p[1], (p[2][0], p[2][1], None))
    g = jax.jit(jax.grad(lambda q, X, C: jnp.sum(C * jax.vmap(direct, (0, 0, None))(X[0], X[1], q))))(
        q, X, C)
    assert_close(plain[1].value[2], (g[2][0], g[2][1]), what="tied slot = sum of its two uses", **TOL)
    assert uses(model)[2] == (2, 1)
