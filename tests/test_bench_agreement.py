"""The benches' own agreement checks, run at a small size in the suite: bench/modern.py's
tiny language model (embedding, dropout keyed per example, a transformer block, layer_norm,
the head), one SGD step as a lens expression against the same network written in JAX, in
float32, what users run (a float32-rounded dropout key gave another mask: 1.3 apart)."""

import importlib.util
import pathlib

import jax
import numpy as np

BENCH = pathlib.Path(__file__).resolve().parent.parent / "bench"


def _modern():
    import sys
    sys.path.insert(0, str(BENCH))  # bench/modern.py imports its neighbour _common
    try:
        spec = importlib.util.spec_from_file_location("bench_modern", BENCH / "modern.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def test_modern_lm_step_agrees_with_jax_in_float32():
    modern = _modern()
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
