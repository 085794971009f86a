"""Each benchmark's own agreement check, at a small size, in float32 (what users run): the
contestants the suite can run (JAX and this library; PyTorch is a bench extra).

- bench/step.py: one step of each contestant is the step numpy's hand-written
  backpropagation takes; the contestants of its cost table (from the hand-written JAX step
  to a `train_step` call, one difference at a time) take the hand-written step's;
- bench/modern.py: the tiny language model (embedding, dropout keyed per example, a
  transformer block, layer_norm, the head), one SGD step as a lens expression against the
  same network written in JAX (a float32-rounded dropout key gave another mask: 1.3 apart).
"""

import importlib.util
import sys
from pathlib import Path

import jax
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
