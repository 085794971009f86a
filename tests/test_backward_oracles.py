"""Blind spots of the law and oracle suites (backward parts against outside oracles), each closed by a test that can fail.

Every expected value here comes from an oracle outside the code under test: `jax.vjp` /
`jax.jacfwd` of the function written out in the test, `jax.grad` of the whole composite
written directly in JAX, `np.linalg.solve`, numpy's own generator, a hand-written loop.

1. Duals of linear maps that carry their own transpose (`D(f, x)` and composites of them).
2. Chains mixing hand-written and derived backward parts (batched and not, with `@`), so that
   the library's own reverse-order loop, batch sum and `Parallel` pullback are exercised.
3. `repeat`'s stacking and unstacking of the copies' parameters.
4. `Constant(G, slot=i)` for slot 0 and a later slot.
5. A finite covector whose step overflows is refused, naming the new point.
6. `fit` shuffles afresh each epoch, from one generator.
7. Constructors that must refuse: `Diagonal` with a zero weight, `Constant` of a singular or
   indefinite matrix.

Only public names of `categories` and `lenses` are used (the core's internals move).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax.flatten_util import ravel_pytree

from categories import D, Covector, Linear, R, Smooth, Vector, pullback, unwrap
from categories import laws as claws
from categories import strategies as cs
from lenses import (Constant, Diagonal, Metric, NonFiniteError, Layer, batched, dense,
                    epoch_order, fit, gd, half_squared_error, repeat, tanh, train_step)

tree_map = jax.tree_util.tree_map
leaves = jax.tree_util.tree_leaves


def examples(n):
    """At most n examples (fewer under a quicker Hypothesis profile)."""
    return settings(max_examples=min(n, settings.default.max_examples))


def close(x, y, what="values", atol=1e-10, rtol=1e-10):
    claws.assert_close(x, y, atol, rtol, what)


def identical(x, y, what):
    """Same tree structure, and every leaf equal bit for bit (shape and dtype included)."""
    tx, ty = jax.tree_util.tree_structure(x), jax.tree_util.tree_structure(y)
    assert tx == ty, f"{what}: structures differ: {tx} vs {ty}"
    for a, b in zip(leaves(x), leaves(y)):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype, f"{what}: {a.shape} vs {b.shape}"
        assert np.array_equal(a, b), f"{what}: {a} vs {b}"


def randomize(tree, seed):
    """A point of the same structure with normal entries (None stays None)."""
    rng = np.random.default_rng(seed)
    return tree_map(lambda a: jnp.asarray(rng.normal(size=np.shape(a))), tree)


def jacobian(fn, x):
    """The flat Jacobian matrix (cod.size × dom.size) of fn at x, by jax.jacfwd."""
    flat_x, unravel = ravel_pytree(x)
    return jax.jacfwd(lambda z: ravel_pytree(fn(unravel(z)))[0])(flat_x)


# == 1. Duals of linear maps that know their transpose ============================================

# Square with a non-symmetric Jacobian, and non-square both ways.
M3 = jnp.array([[1.0, 2.0, -0.5], [0.0, 1.5, 0.7], [-1.2, 0.3, 0.9]])
M23 = jnp.array([[0.4, -1.0, 0.8], [1.1, 0.2, -0.6]])
SQUARE = Smooth(R(3), R(3), lambda x: jnp.tanh(M3 @ x) + 0.3 * x ** 2, "sq")
WIDE = Smooth(R(3), R(2), lambda x: jnp.sin(M23 @ x) * (1.0 + x[:2]), "wide")
TALL = Smooth(R(2), R(3), lambda x: jnp.tanh(M23.T @ x) + x[0] * x[1], "tall")
SQUARE2 = Smooth(R(3), R(3), lambda x: jnp.sin(M3.T @ x + 0.2) * x[::-1], "sq2")
X3 = jnp.array([0.3, -0.7, 1.1])
Y3 = jnp.array([1.0, -2.0, 0.5])


def check_pullback(f, x, y):
    _, vjp = jax.vjp(f.fn, x)
    (expected,) = vjp(y)
    got = pullback(f, x)(Covector(y, f.cod))
    assert isinstance(got, Covector), f"pullback(f, x)(y) is a {type(got).__name__}"
    close(got, expected, "pullback(f, x)(y) vs jax.vjp")
    J = jacobian(f.fn, x)
    close(D(f, x).matrix(), J, "D(f, x) vs jax.jacfwd")
    close(pullback(f, x).matrix(), J.T, "pullback(f, x) vs the transpose of jax.jacfwd")
    close(D(f, x).dual().dual().matrix(), J, "D(f, x)** vs D(f, x)")


@pytest.mark.parametrize("f, x, y", [(SQUARE, X3, Y3), (WIDE, X3, Y3[:2]), (TALL, X3[:2], Y3)],
                         ids=["square", "wide", "tall"])
def test_pullback_of_a_map_with_known_transpose_is_its_vjp(f, x, y):
    J = jacobian(f.fn, x)
    if J.shape[0] == J.shape[1]:  # the square case must tell a map from its transpose
        assert float(jnp.max(jnp.abs(J - J.T))) > 0.1
    check_pullback(f, x, y)


@examples(50)
@given(st.data())
def test_pullback_of_a_drawn_map_is_its_vjp(data):
    A = data.draw(cs.euclidean_spaces(terminal=False), "A")
    B = data.draw(cs.euclidean_spaces(terminal=False), "B")
    f = data.draw(cs.smooth_maps(A, B, depth=1), "f")
    check_pullback(f, data.draw(cs.points(A), "x"), data.draw(cs.covectors(B), "y"))


def test_a_differential_first_applied_under_jit_is_still_right_applied_eagerly():
    """D(f, x) and its dual keep their linearisation at x only when it was made outside a
    trace: applied first under `jax.jit` (the linearisation then holds that trace's tracers)
    and eagerly afterwards, every application agrees with jax.jvp and jax.vjp (a kept tracer
    would raise an UnexpectedTracerError); the eager one is then kept and reused."""
    df, pb = D(SQUARE, X3), pullback(SQUARE, X3)
    want_v = jax.jvp(SQUARE.fn, (X3,), (Y3,))[1]
    want_c = jax.vjp(SQUARE.fn, X3)[1](Y3)[0]
    for _ in range(2):  # under jit, then eagerly, twice each
        close(jax.jit(lambda v: unwrap(df(Vector(v))))(Y3), want_v, "D(f, x)(v) under jit")
        close(df(Vector(Y3)), want_v, "D(f, x)(v)")
        close(jax.jit(lambda c: unwrap(pb(Covector(c, SQUARE.cod))))(Y3), want_c, "pullback under jit")
        close(pb(Covector(Y3, SQUARE.cod)), want_c, "pullback(f, x)(y)")
    # a linear map without a known transpose: its dual, applied under jit and then eagerly
    A = Linear(R(3), R(2), lambda v: M23 @ v, name="A")
    for _ in range(2):
        close(jax.jit(lambda y: unwrap(A.dual()(Covector(y, R(2)))))(Y3[:2]), M23.T @ Y3[:2], "A* under jit")
    At = A.dual()
    close(jax.jit(lambda y: unwrap(At(Covector(y, R(2)))))(Y3[:2]), M23.T @ Y3[:2], "A* under jit")
    close(At(Covector(Y3[:2], R(2))), M23.T @ Y3[:2], "A* eagerly after jit")
    close(At.matrix(), M23.T, "A* as a matrix")


def check_dual_of_composite(f, g, x, z):
    Df, Dg = D(f, x), D(g, f(x))
    claws.check_dual_composition(Df, Dg)  # as matrices
    claws.check_dual_composition(Df, Dg, Covector(z, g.cod))
    # ... and against the oracle: the VJP of the composite written here
    _, vjp = jax.vjp(lambda x_: g.fn(f.fn(x_)), x)
    (expected,) = vjp(z)
    close((Df >> Dg).dual()(Covector(z, g.cod)), expected, "(Df ≫ Dg)*(z) vs jax.vjp of g∘f")
    close((Df >> Dg).dual().matrix(), jacobian(lambda x_: g.fn(f.fn(x_)), x).T,
          "(Df ≫ Dg)* vs the transpose of the Jacobian of g∘f")


@pytest.mark.parametrize("f, g", [(SQUARE, SQUARE2), (SQUARE2, SQUARE), (WIDE, TALL), (TALL, WIDE),
                                  (SQUARE, WIDE)], ids=["sq-sq2", "sq2-sq", "wide-tall",
                                                        "tall-wide", "sq-wide"])
def test_dual_of_a_composite_of_differentials_reverses_the_order(f, g):
    x = X3 if f.dom == R(3) else X3[:2]
    z = Y3 if g.cod == R(3) else Y3[:2]
    check_dual_of_composite(f, g, x, z)


@examples(40)
@given(st.data())
def test_dual_composition_law_on_drawn_differentials(data):
    A, B, C = (data.draw(cs.euclidean_spaces(terminal=False), f"space {i}") for i in range(3))
    f = data.draw(cs.smooth_maps(A, B, depth=1), "f")
    g = data.draw(cs.smooth_maps(B, C, depth=1), "g")
    check_dual_of_composite(f, g, data.draw(cs.points(A), "x"), data.draw(cs.covectors(C), "z"))


def test_a_known_transpose_is_used_and_dualises_back():
    """A Linear given with its transpose: A* applies the transpose, A** is A (matrices)."""
    A = Linear(R(3), R(2), lambda v: M23 @ v, transpose=lambda y: M23.T @ y, name="A")
    close(A.dual()(Covector(Y3[:2], R(2))), M23.T @ Y3[:2], "A*(y) vs Mᵀ y")
    close(A.dual().matrix(), M23.T, "A* vs Mᵀ")
    close(A.dual().dual().matrix(), M23, "A** vs M")
    B = Linear(R(2), R(3), lambda v: M23.T @ v, transpose=lambda y: M23 @ y, name="B")
    close((A >> B).dual().matrix(), (M23.T @ M23).T, "(A ≫ B)* vs (B A)ᵀ")
    close((B >> A).dual().matrix(), (M23 @ M23.T).T, "(B ≫ A)* vs (A B)ᵀ")


# == 2. Chains of hand-written and derived backward parts, against jax.grad =========================

def hand_dense(n_in, n_out):
    """x ↦ W x + b with a hand-written backward part."""
    return Layer(R(n_in), R(n_out), R(n_out, n_in) * R(n_out), lambda x, Wb: Wb[0] @ x + Wb[1],
                    backward=lambda x, Wb, c: (Wb[0].T @ c, (jnp.outer(c, x), c)),
                    name=f"hand_dense({n_in}→{n_out})")


def hand_tanh(n):
    return Layer(R(n), R(n), R(0), lambda x, p: jnp.tanh(x),
                    backward=lambda x, p, c: (c * (1.0 - jnp.tanh(x) ** 2), None), name="hand_tanh")


def hand_sin_scale(n):
    """x ↦ s ⊙ sin x, parameters s ∈ R^n, hand-written backward part."""
    return Layer(R(n), R(n), R(n), lambda x, s: s * jnp.sin(x),
                    backward=lambda x, s, c: (c * s * jnp.cos(x), c * jnp.sin(x)), name="hand_sin")


# Slots: hand | derived, derived (one run for JAX) | hand | derived | hand | hand
CHAIN = (hand_dense(3, 4) >> tanh >> dense(4, 4) >> hand_sin_scale(4) >> dense(4, 4)
         >> hand_tanh(4) >> hand_dense(4, 2))


def chain_direct(x, ps):
    (W0, b0), _, (W2, b2), s3, (W4, b4), _, (W6, b6) = ps
    h = jnp.tanh(W0 @ x + b0)
    h = s3 * jnp.sin(W2 @ h + b2)
    h = jnp.tanh(W4 @ h + b4)
    return W6 @ h + b6


# f ⊗ g with the same spaces and parameter structure on both sides (a swap gives wrong numbers)
PAR = (hand_dense(3, 3) >> tanh) @ (dense(3, 3) >> hand_tanh(3))


def par_direct(uv, ps):
    ((Wl, bl), _), ((Wr, br), _) = ps
    return jnp.tanh(Wl @ uv[0] + bl), jnp.tanh(Wr @ uv[1] + br)


PRE = Layer(R(3) * R(3), R(3) * R(3), R(3) * R(3),
               lambda uv, q: (jnp.sin(uv[0] + q[0]), uv[1] * q[1]), name="pre")
MIX = Layer(R(3) * R(3), R(2), R(2, 3) * R(2, 3), lambda uv, M: M[0] @ uv[0] + M[1] @ uv[1],
               name="mix")
PAR_CHAIN = PRE >> PAR >> MIX
# both sides derived: the parallel product's own pullback, inside a chain with a hand-written part
PAR_DERIVED = (dense(3, 3) >> tanh) @ (dense(3, 3) >> tanh)
PAR_DERIVED_CHAIN = PAR_DERIVED >> MIX >> hand_tanh(2)


def par_chain_direct(uv, ps):
    q, pp, (M0, M1) = ps
    u, v = par_direct((jnp.sin(uv[0] + q[0]), uv[1] * q[1]), pp)
    return M0 @ u + M1 @ v


def par_derived_chain_direct(uv, ps):
    pp, (M0, M1), _ = ps
    u, v = par_direct(uv, pp)
    return jnp.tanh(M0 @ u + M1 @ v)


def pairing(c, y):
    return sum(jnp.vdot(a, b) for a, b in zip(leaves(c), leaves(y)))


MODELS = {
    "chain": (CHAIN, chain_direct, R(3)),
    "parallel": (PAR, par_direct, R(3) * R(3)),
    "pre-parallel-mix": (PAR_CHAIN, par_chain_direct, R(3) * R(3)),
    "derived_parallel-mix-hand": (PAR_DERIVED_CHAIN, par_derived_chain_direct, R(3) * R(3)),
}


@pytest.mark.parametrize("is_batched", [False, True], ids=["example", "batch"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_mixed_backward_parts_match_jax_grad_of_the_composite(name, is_batched):
    model, direct, dom = MODELS[name]
    p = randomize(model.param.zeros(), 1)
    n = 5
    x = randomize(dom.zeros(), 2)
    if is_batched:
        x = tree_map(lambda a: jnp.stack([a * (1.0 + 0.3 * i) - 0.2 * i for i in range(n)]), x)
        f = jax.vmap(direct, (0, None))
        out, pull = batched(model).vjp(x, p)
    else:
        f = direct
        out, pull = model.vjp(x, p)
    expected_out = f(x, p)
    c = randomize(expected_out, 3)
    dx, dp = pull(c)
    gx, gp = jax.grad(lambda x_, p_: pairing(c, f(x_, p_)), argnums=(0, 1))(x, p)
    close(out, expected_out, "forward value vs the composite written in JAX")
    assert isinstance(dx, Covector) and isinstance(dp, Covector)
    close(dx, gx, "input covector vs jax.grad of the composite")
    close(dp, gp, "parameter covector vs jax.grad of the composite"
          + (" (added over the batch)" if is_batched else ""))


def test_hand_written_backward_parts_are_right():
    """The hand-written backward parts used above agree with jax.vjp of their forward parts."""
    x, c = jnp.array([0.3, -0.8, 1.2]), jnp.array([1.0, 0.5, -2.0])
    for lens in (hand_dense(3, 3), hand_tanh(3), hand_sin_scale(3)):
        p = randomize(lens.param.zeros(), 4)
        _, vjp = jax.vjp(lens.forward, x, p)
        gx, gp = vjp(c)
        dx, dp = lens.backward(x, p, c)
        close(dx, gx, f"{lens.name}: input covector")
        close(dp, gp, f"{lens.name}: parameter covector")


# == 3. repeat's stacking =========================================================================

N_COPIES = 4
LAYERS = {"derived": dense(3, 3) >> tanh, "hand-written": hand_dense(3, 3) >> hand_tanh(3)}


def copies(layer, n=N_COPIES):
    """n distinct points of the layer's parameter object."""
    return tuple(randomize(layer.param.zeros(), 10 + i) for i in range(n))


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_repeat_stack_puts_copy_i_in_slice_i_and_unstack_inverts_it(kind):
    layer = LAYERS[kind]
    r = repeat(layer, N_COPIES)
    ps = copies(layer)
    P = r.stack(ps)
    assert jax.tree_util.tree_structure(P) == jax.tree_util.tree_structure(ps[0])
    for i in range(N_COPIES):
        identical(tree_map(lambda leaf: leaf[i], P), ps[i], f"slice {i} of the stack vs copy {i}")
    back = r.unstack(P)
    assert len(back) == N_COPIES
    for i in range(N_COPIES):
        identical(back[i], ps[i], f"unstack(stack(ps))[{i}] vs ps[{i}]")
    P0 = r.init(jax.random.PRNGKey(0))
    identical(r.stack(r.unstack(P0)), P0, "stack(unstack(P)) vs P")
    for i, q in enumerate(r.unstack(P0)):
        identical(q, tree_map(lambda leaf: leaf[i], P0), f"unstack(P)[{i}] vs slice {i} of P")


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_repeat_is_the_chain_of_its_copies_in_order(kind):
    layer = LAYERS[kind]
    r = repeat(layer, N_COPIES)
    ps = copies(layer)
    P = r.stack(ps)
    x, c = jnp.array([0.5, -1.0, 0.8]), jnp.array([1.0, -0.5, 2.0])

    def direct(x, ps):  # copy 0 first
        for (W, b), _ in ps:
            x = jnp.tanh(W @ x + b)
        return x

    y0, vjp = jax.vjp(direct, x, ps)
    dx0, dps0 = vjp(c)
    y, (dx, dP) = r.forward(x, P), r.backward(x, P, c)
    close(y, y0, "repeat forward vs the copies applied in order")
    close(dx, dx0, "repeat input covector vs jax.vjp")
    for i in range(N_COPIES):
        close(tree_map(lambda leaf: leaf[i], dP.value), dps0[i], f"slice {i} of the covector vs copy {i}'s")
    chain = layer
    for _ in range(N_COPIES - 1):
        chain = chain >> layer
    slots = tuple(q for copy in r.unstack(P) for q in copy)
    close(chain.forward(x, slots), y, "explicit chain vs repeat")
    dxc, dslots = chain.backward(x, slots, c)
    close(dxc, dx, "explicit chain vs repeat: input covector")
    close(tuple(dslots.value[2 * i: 2 * i + 2] for i in range(N_COPIES)), dps0,
          "explicit chain's covectors vs jax.vjp")


# == 4. Constant(G, slot=i) =========================================================================

SLOTTED = dense(2, 2) >> tanh >> dense(2, 3)  # slots: (W 2×2, b 2), None, (W 3×2, b 3)


def spd(n, seed):
    A = np.random.default_rng(seed).normal(size=(n, n))
    return A @ A.T + n * np.eye(n)


def flat(slot_value):
    W, b = slot_value
    return np.concatenate([np.ravel(np.asarray(W)), np.asarray(b)])  # W row by row, then b


def unflat(v, like):
    W, b = like
    return v[:np.size(W)].reshape(np.shape(W)), v[np.size(W):]


@pytest.mark.parametrize("slot", [0, 2])
def test_constant_metric_on_one_slot(slot):
    space = SLOTTED.param
    value = randomize(space.zeros(), 5)
    G = spd(flat(value[slot]).size, 6)
    assert not np.allclose(G, np.diag(np.diag(G)))  # a full matrix: position matters
    metric = Constant(G, slot=slot)
    p = randomize(space.zeros(), 7)
    sharp = metric.sharp(p, Covector(value, space))
    flatv = metric.flat(p, Vector(value, space))
    assert isinstance(sharp, Vector) and isinstance(flatv, Covector)
    expected_sharp = list(value)
    expected_sharp[slot] = unflat(np.linalg.solve(G, flat(value[slot])), value[slot])
    expected_flat = list(value)
    expected_flat[slot] = unflat(G @ flat(value[slot]), value[slot])
    close(sharp.value[slot], expected_sharp[slot], f"sharp on slot {slot} vs np.linalg.solve(G, ·)")
    close(flatv.value[slot], expected_flat[slot], f"flat on slot {slot} vs G @ ·")
    for i in range(len(value)):
        if i != slot:  # the other slots: unchanged, bit for bit
            identical(sharp.value[i], value[i], f"sharp: slot {i} (not the metric's)")
            identical(flatv.value[i], value[i], f"flat: slot {i} (not the metric's)")
    assert len(sharp.value) == len(flatv.value) == len(value)


# == 5. A finite covector with an overflowing step ================================================

SCALAR = dense(2, 1)
P_ONES = (jnp.ones((1, 2)), jnp.zeros((1,)))
X_ONES, Y_LOW = np.ones((4, 2)), np.full((4, 1), -8.0)  # residual 2 − (−8) = 10


def snapshot(state):
    return jax.tree_util.tree_structure(state), [
        (np.asarray(a).dtype, np.asarray(a).shape, np.asarray(a).tobytes()) for a in leaves(state)]


def test_an_overflowing_step_of_a_finite_covector_is_refused_eagerly():
    cov = Covector((jnp.full((1, 2), 10.0), jnp.full((1,), 10.0)), SCALAR.param)
    opt = gd(1e308)
    s = opt.init(P_ONES)
    assert all(np.all(np.isfinite(np.asarray(a))) for a in leaves(cov.value))
    assert not np.all(np.isfinite(np.asarray(P_ONES[0]) - 1e308 * 10.0))  # the new point overflows
    with pytest.raises(NonFiniteError, match="new point"):
        opt.step(s, P_ONES, cov)
    with pytest.raises(NonFiniteError, match="new point"):
        opt.step(s, P_ONES, cov, space=SCALAR.param)


def test_an_overflowing_step_of_a_finite_covector_is_refused_by_train_step():
    # the covector, by hand: mean over the batch of (W x + b − y) x = 10 · (1, 1), and 10 for b
    def hand_loss(p):
        W, b = p
        return jnp.mean(0.5 * jnp.sum((X_ONES @ W.T + b[None, :] - Y_LOW) ** 2, axis=1))

    g = jax.grad(hand_loss)(P_ONES)
    close(g, (jnp.full((1, 2), 10.0), jnp.full((1,), 10.0)), "the hand covector")
    step = train_step(SCALAR, half_squared_error, gd(1e308))
    state = step.init(P_ONES)
    before = snapshot(state)
    refused, report = step(state, X_ONES, Y_LOW)
    with pytest.raises(NonFiniteError, match="step 1: the new point") as e:
        report.check()  # raised at the synchronisation point, the state kept on the device
    assert snapshot(e.value.state) == before
    assert snapshot((refused.params, refused.opt_state)) == snapshot((state.params, state.opt_state))
    new, _ = train_step(SCALAR, half_squared_error, gd(0.1))(state, X_ONES, Y_LOW)  # sane step: fine
    close(new.params, tree_map(lambda a, b: a - 0.1 * b, P_ONES, g), "a finite step")


# == 6. Shuffling across epochs =====================================================================

FIT_MODEL = dense(3, 2)
FIT_N, FIT_BATCH, FIT_EPOCHS, FIT_LR, FIT_KEY = 12, 5, 3, 0.1, 7  # 2 steps an epoch, 2 dropped
FIT_X = np.random.default_rng(20).normal(size=(FIT_N, 3))
FIT_Y = np.random.default_rng(21).normal(size=(FIT_N, 2))
FIT_P0 = randomize(FIT_MODEL.param.zeros(), 22)


def hand_loop(batches):
    """Plain gradient descent over the given batches (index arrays), written without lenses."""
    def loss(p, X, Y):
        W, b = p
        return jnp.mean(0.5 * jnp.sum((X @ W.T + b[None, :] - Y) ** 2, axis=1))

    grad = jax.jit(jax.grad(loss))
    p = FIT_P0
    for idx in batches:
        p = tree_map(lambda a, g: a - FIT_LR * g, p, grad(p, FIT_X[idx], FIT_Y[idx]))
    return p


def todays_orders():
    """`fit`'s documented rule: the order of epoch e is `epoch_order(key, e, n, batch_size)`,
    a permutation drawn from the one key folded with the epoch, the remainder dropped. The
    next test holds for any correct rule."""
    return [np.asarray(epoch_order(FIT_KEY, e, FIT_N, FIT_BATCH)) for e in range(1, FIT_EPOCHS + 1)]


class Recording(Metric):
    """The Euclidean inner product, recording the batch each step sees (through the context)."""

    def __init__(self):
        self.batches = []

    def _record(self, x):
        self.batches.append(np.asarray(x).copy())

    def sharp(self, p, cov, ctx=None):
        jax.debug.callback(self._record, ctx.x, ordered=True)
        return Vector(unwrap(cov), getattr(cov, "space", None))

    def flat(self, p, vec, ctx=None):
        return Covector(unwrap(vec), getattr(vec, "space", None))


def indices(batch):
    """The dataset rows of a batch (the rows of FIT_X are distinct)."""
    out = []
    for row in batch:
        (hit,) = np.flatnonzero(np.all(FIT_X == row, axis=1))
        out.append(int(hit))
    return out


def test_fit_draws_a_fresh_order_each_epoch_from_one_generator():
    orders = todays_orders()
    state, history = fit(FIT_MODEL, half_squared_error, gd(FIT_LR), FIT_P0, (FIT_X, FIT_Y),
                         epochs=FIT_EPOCHS, batch_size=FIT_BATCH, key=FIT_KEY)
    assert len(history) == FIT_EPOCHS
    assert not np.array_equal(orders[0], orders[1])  # the reference itself tells epochs apart
    close(state.params, hand_loop([idx for order in orders for idx in order]),
          "fit's parameters vs plain GD over one generator's per-epoch permutations")
    reseeded = [idx for _ in range(FIT_EPOCHS) for idx in todays_orders()[0]]
    with pytest.raises(AssertionError):  # ... which a shuffle re-seeded every epoch would not give
        close(state.params, hand_loop(reseeded), "re-seeded")


def test_fit_orders_differ_between_epochs_and_match_a_hand_loop_over_its_batches():
    """Whatever the shuffling rule: each epoch visits distinct examples, the epochs' orders
    differ, and the parameters are plain GD over exactly the batches the steps saw."""
    metric = Recording()
    state, _ = fit(FIT_MODEL, half_squared_error, gd(FIT_LR, metric=metric), FIT_P0,
                   (FIT_X, FIT_Y), epochs=FIT_EPOCHS, batch_size=FIT_BATCH, key=FIT_KEY)
    jax.effects_barrier()
    steps = FIT_N // FIT_BATCH
    assert len(metric.batches) == FIT_EPOCHS * steps
    seen = [indices(b) for b in metric.batches]
    assert all(len(idx) == FIT_BATCH for idx in seen)
    epochs = [sum(seen[e * steps:(e + 1) * steps], []) for e in range(FIT_EPOCHS)]
    for e, order in enumerate(epochs):
        assert len(set(order)) == len(order), f"epoch {e + 1} visits an example twice: {order}"
    for e in range(1, FIT_EPOCHS):
        assert epochs[e] != epochs[e - 1], f"epochs {e} and {e + 1} have the same order {epochs[e]}"
    close(state.params, hand_loop([np.asarray(idx) for idx in seen]),
          "fit's parameters vs plain GD over the batches its steps saw")


# == 7. Constructors that must refuse ===============================================================

@pytest.mark.parametrize("weights", [0.0, -1.0, (1.0, 0.0), (np.ones((2, 2)), np.array([1.0, 0.0, 2.0])),
                                     (np.ones(3), None, np.array([0.5, -0.0]))],
                         ids=["zero", "negative", "pair_with_a_zero", "array_with_a_zero",
                              "with_None_and_minus_zero"])
def test_diagonal_refuses_a_weight_that_is_not_positive(weights):
    with pytest.raises(ValueError):
        Diagonal(weights)


def _rank_deficient(n, rank, seed):
    B = np.random.default_rng(seed).normal(size=(n, rank))
    return B @ B.T


SINGULAR = {"zero_row": np.array([[1.0, 0.0], [0.0, 0.0]]), "ones": np.ones((2, 2)),
            "rank_2_of_3": _rank_deficient(3, 2, 0), "rank_3_of_5": _rank_deficient(5, 3, 1),
            "zero": np.zeros((3, 3))}
INDEFINITE = {"eigenvalues_3_and_-1": np.array([[1.0, 2.0], [2.0, 1.0]]),
              "diag_1_-1": np.diag([1.0, -1.0]), "negative_definite": -spd(3, 2)}


@pytest.mark.parametrize("name", sorted(SINGULAR) + sorted(INDEFINITE))
def test_constant_refuses_a_singular_or_indefinite_matrix(name):
    G = SINGULAR.get(name, INDEFINITE.get(name))
    eig = np.linalg.eigvalsh(G)
    n = G.shape[0]
    assert np.linalg.matrix_rank(G) < n or eig[0] < 0  # the oracle: not positive definite
    with pytest.raises(ValueError):
        Constant(G)
    with pytest.raises(ValueError):
        Constant(G, slot=0)


def test_constant_and_diagonal_accept_what_they_should():
    Constant(spd(4, 3))
    Constant(np.diag([1e-3, 1.0, 1e3]), slot=1)
    Diagonal(0.5)
    Diagonal((np.full((2, 2), 2.0), None, np.array([1e-6, 3.0])))
