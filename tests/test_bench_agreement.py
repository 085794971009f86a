"""Each benchmark's own agreement check, at a small size, in float32 (what users run): the
contestants the suite can run (JAX and this library; PyTorch is a bench extra).

- bench/step.py: one step of each contestant is the step numpy's hand-written
  backpropagation takes; the contestants of its cost table (from the hand-written JAX step
  to a `train_step` call, one difference at a time) take the hand-written step's;
- bench/natural.py: the library's K-FAC (fixed and adaptive) takes the first step written out
  densely in numpy; against kfac-jax (a bench extra) where it is installed;
- bench/modern.py: the tiny language model (embedding, dropout keyed per example, a
  transformer block, layer_norm, the head), one SGD step as a lens expression against the
  same network written in JAX (a float32-rounded dropout key gave another mask: 1.3 apart).
"""

import importlib.util
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def bench(name):
    sys.path.insert(0, str(BENCH))  # a bench imports its neighbour _common
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


@pytest.mark.parametrize("loss", ["se", "ce"])
def test_step_bench_contestants_agree_with_numpy(loss):
    with jax.numpy_rank_promotion("allow"):  # the hand-written JAX step broadcasts its bias
        errors = bench("step").agreement([4, 6, 3], 8, loss)
    assert set(errors) == {"lens", "train_step", "jax", "run (2 steps)"}
    for name, err in errors.items():
        assert err < 1e-5, (name, err)


@pytest.mark.parametrize("loss", ["se", "ce"])
def test_step_bench_cost_table_contestants_agree_with_the_hand_written_step(loss):
    step = bench("step")
    params, X, Y = step.data([4, 6, 3], 8, loss)
    with jax.numpy_rank_promotion("allow"):  # the hand-written JAX step broadcasts its bias
        steps, starts = step.cost_contestants([4, 6, 3], loss, params)
        errors = step.cost_agreement(steps, starts, jax.numpy.asarray(X), jax.numpy.asarray(Y))
        moved = steps["jax"](starts["jax"], X, Y)[0]
    assert set(errors) == {"jax", "lens", "lens + state", "step_fn", "call"}
    assert errors["jax"] == 0.0
    for name, err in errors.items():
        assert err < 1e-5, (name, err)
    # the step moved the parameters (a real comparison)
    assert max(float(np.max(np.abs(np.asarray(a) - b))) for wb, pwb in zip(moved, params)
               for a, b in zip(wb, pwb)) > 0


def test_modern_lm_step_agrees_with_jax_in_float32():
    modern = bench("modern")
    cfg = dict(T=8, d=16, heads=2, layers=1, batch=4, rate=0.3)
    with jax.enable_x64(False):
        _, p, X, Y, lens, jx = modern.setup("lm", cfg)
        assert np.asarray(X[1]).dtype == np.uint32  # the keys, as the bench passes them
        (p_lens, loss_lens), (p_jax, loss_jax) = lens(p, X, Y), jx(p, X, Y)
        pairs = list(zip(jax.tree_util.tree_leaves(p_lens), jax.tree_util.tree_leaves(p_jax)))
        assert len(pairs) == len(jax.tree_util.tree_leaves(p)) > 10
        for (a, b), a0 in zip(pairs, jax.tree_util.tree_leaves(p)):
            assert np.asarray(a).dtype == np.float32
            # relative 1e-4 (the bench's bound), measured against the step size where a
            # leaf's covector vanishes (the key bias: attention ignores it) and is all noise
            scale = max(float(np.max(np.abs(np.asarray(b)))), modern.LR * 1e-2)
            assert float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) / scale < 1e-4
        assert abs(float(loss_lens) - float(loss_jax)) < 1e-4 * abs(float(loss_jax))
        # the step moved the parameters (a real comparison)
        assert max(float(np.max(np.abs(np.asarray(b) - np.asarray(a0))))
                   for (_, b), a0 in zip(pairs, jax.tree_util.tree_leaves(p))) > 0


# -- bench/natural.py: K-FAC -------------------------------------------------------------------

def _kfac_oracle_step(p, X, Y, lr, lam, rescale):
    """One K-FAC step of the bench's tanh MLP written out in numpy (float64): the factors
    A_l = mean ā āᵀ, G_l = mean Bᵀ(diag π − π πᵀ)B (B = I for the last layer, W2 diag(1 − a²)
    for the first), the damped blocks solved densely on vec([W b]); with `rescale`, the step
    α Δ with α = −∇hᵀΔ / Δᵀ(F + λI)Δ, F the explicit Fisher by jax.jacobian."""
    (W1, b1), _, (W2, b2) = [None if q is None else [np.asarray(a, np.float64) for a in q]
                             for q in p]
    x, y = np.asarray(X, np.float64), np.asarray(Y)
    n, k = len(x), W2.shape[0]
    a1 = np.tanh(x @ W1.T + b1)
    z = a1 @ W2.T + b2
    pi = np.exp(z - z.max(1, keepdims=True))
    pi /= pi.sum(1, keepdims=True)
    F = np.stack([np.diag(q) - np.outer(q, q) for q in pi])
    B1 = np.einsum("ab,ib->iab", W2, 1 - a1 ** 2)
    xb, ab = np.concatenate([x, np.ones((n, 1))], 1), np.concatenate([a1, np.ones((n, 1))], 1)
    factors = [(xb.T @ xb / n, np.einsum("ima,imk,ikb->ab", B1, F, B1) / n),
               (ab.T @ ab / n, F.mean(0))]
    e = pi - np.eye(k)[y]  # ∂h/∂z_i · n
    gz1 = (e @ W2) * (1 - a1 ** 2)
    grads = [np.concatenate([gz1.T @ x, gz1.sum(0)[:, None]], 1) / n,
             np.concatenate([e.T @ a1, e.sum(0)[:, None]], 1) / n]
    Delta = [-np.linalg.solve(np.kron(G, A) + lam * np.eye(len(A) * len(G)),
                              g.ravel()).reshape(g.shape) for (A, G), g in zip(factors, grads)]
    scale = lr
    if rescale:
        def net(th):
            V1 = th[:W1.size + b1.size].reshape(len(W1), -1)
            V2 = th[W1.size + b1.size:].reshape(len(W2), -1)
            h1 = jnp.tanh(jnp.asarray(x) @ V1[:, :-1].T + V1[None, :, -1])
            return h1 @ V2[:, :-1].T + V2[None, :, -1]
        theta = np.concatenate([np.concatenate([W1, b1[:, None]], 1).ravel(),
                                np.concatenate([W2, b2[:, None]], 1).ravel()])
        with jax.enable_x64(True):
            J = np.asarray(jax.jacobian(net)(jnp.asarray(theta)))  # (n, k, d)
        Fd = np.einsum("imd,imk,ike->de", J, F, J) / n + lam * np.eye(theta.size)
        d, g = np.concatenate([D.ravel() for D in Delta]), np.concatenate(
            [G.ravel() for G in grads])
        scale = -(g @ d) / (d @ Fd @ d)
    new = [np.concatenate([W, b[:, None]], 1) + scale * D
           for (W, b), D in zip(((W1, b1), (W2, b2)), Delta)]
    return ((new[0][:, :-1], new[0][:, -1]), None, (new[1][:, :-1], new[1][:, -1]))


@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
def test_natural_bench_library_kfac_first_step_agrees_with_a_dense_computation(mode):
    """The bench's library K-FAC (fixed: gd(lr, KFAC(λ)); adaptive: the rescaled step) takes,
    at its first step, the step written out densely in numpy, in float32 to 1e-4."""
    natural = bench("natural")
    with jax.enable_x64(False):
        X, Y = natural.digits(48)
        net = natural.network((64, 8, 10))
        p0 = net.init(jax.random.PRNGKey(0))
        lr, lam = 0.3, 0.1
        opt = (natural.kfac_fixed(net, lr, lam, 0.95, 1) if mode == "fixed"
               else natural.kfac_adaptive(net, lam, 0.95, 1))
        start, one = natural.library_runner(net, opt, p0, X, Y)
        state, _ = one(start())
        expected = _kfac_oracle_step(p0, X, Y, lr, lam, mode == "adaptive")
        got = jax.tree_util.tree_leaves(state.params)
        for a, b, a0 in zip(got, jax.tree_util.tree_leaves(expected),
                            jax.tree_util.tree_leaves(p0), strict=True):
            assert np.asarray(a).dtype == np.float32
            move = np.max(np.abs(b - np.asarray(a0, np.float64)))
            assert move > 1e-3  # the step moved the parameters
            assert np.max(np.abs(np.asarray(a, np.float64) - b)) < 1e-4 * max(move, 1.0)


def test_natural_bench_kfac_and_kfac_jax_agree_on_their_first_step():
    """The bench's own check at a small size: kfac and kfac-jax land on the same point after
    one step, fixed and adaptive, to 1e-5 relative (needs kfac-jax: the bench extra)."""
    pytest.importorskip("kfac_jax", reason="kfac-jax is not installed (the bench extra, "
                                           "bench/README.md): the library side runs above")
    natural = bench("natural")
    # kfac-jax's network (the bench's) broadcasts its bias
    with jax.enable_x64(False), jax.numpy_rank_promotion("allow"):
        X, Y = natural.digits(48)
        net = natural.network((64, 8, 10))
        p0 = net.init(jax.random.PRNGKey(0))
        errors = natural.first_step_agreement(net, p0, X, Y, 0.3, 0.1, 0.95, 1)
    assert set(errors) == {"fixed", "adaptive"}
    for mode, err in errors.items():
        assert err < 1e-5, (mode, err)
