"""Each benchmark's own agreement check, at a small size: the contestants the suite can run
(JAX and this library; PyTorch is a bench extra) take the step numpy's hand-written
backpropagation takes, in float32."""

import importlib.util
from pathlib import Path

import jax
import pytest

ROOT = Path(__file__).resolve().parents[1]


def bench(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("loss", ["se", "ce"])
def test_step_bench_contestants_agree_with_numpy(loss):
    with jax.numpy_rank_promotion("allow"):  # the hand-written JAX step broadcasts its bias
        errors = bench("step").agreement([4, 6, 3], 8, loss)
    assert set(errors) == {"lens", "train_step", "jax", "run (2 steps)"}
    for name, err in errors.items():
        assert err < 1e-5, (name, err)
