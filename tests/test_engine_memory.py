"""The engine keeps nothing of a user's alive: a model trained (a call, `run`, `fit`,
`predict`) and dropped is freed with everything compiled for it, and models that compute
alike share one compilation while any of them is alive (`lenses/training/shared.py`).

The sweep runs in a subprocess (memory maps and resident memory are the process's own):
300 models built, trained and dropped the way a loop over seeds drops them (rebinding the
name), then the last one deleted. The oracles are weak references (dead or not) and the
kernel's own counts (/proc/self/maps, resident pages).
"""

import gc
import json
import os
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from categories import R
from lenses import Layer, dense, fit, gd, half_squared_error, predict, sigmoid, train_step
from lenses.training.shared import shared

ROOT = Path(__file__).resolve().parents[1]
X, Y = np.ones((8, 2), np.float32), np.zeros((8, 1), np.float32)

SWEEP = textwrap.dedent("""
    import gc, json, os, sys, weakref
    import jax, numpy as np
    from lenses import dense, fit, gd, half_squared_error, predict, sigmoid, train_step

    def maps():
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    X, Y = np.ones((8, 2), np.float32), np.zeros((8, 1), np.float32)
    n, refs, rows = int(sys.argv[1]), [], []
    for i in range(n):
        model = dense(2, 3) >> sigmoid >> dense(3, 1)  # the previous model is dropped here
        loss, opt = half_squared_error, gd(0.1)
        step = train_step(model, loss, opt)
        p = model.init(jax.random.PRNGKey(i))
        s, _ = step(step.init(p), X, Y)
        s, _ = step.run(s, X[None].repeat(2, 0), Y[None].repeat(2, 0))
        s, _ = fit(model, loss, opt, s, (X, Y), epochs=1, batch_size=4, progress=False)
        jax.block_until_ready(predict(model, s.params, X))
        refs += [weakref.ref(x) for x in (model, step, opt)]
        gc.collect()
        rows.append((maps(), rss()))
    last = sum(r() is not None for r in refs[-3:])
    alive_before = sum(r() is not None for r in refs[:-3])
    del model, step, loss, opt, s, p
    gc.collect()
    print(json.dumps({"rows": rows, "alive_before_last": alive_before, "last": last,
                      "alive": sum(r() is not None for r in refs)}))
""")


def run_sweep(tmp_path, n):
    script = tmp_path / "sweep.py"
    script.write_text(SWEEP)
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, str(script), str(n)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # a subprocess of 300 models: run first, so no worker waits on it at the end
def test_three_hundred_models_trained_and_dropped_are_freed_and_memory_stays_flat(tmp_path):
    result = run_sweep(tmp_path, 300)
    # each model, step and optimiser freed once the next model took its name, the last
    # ones once deleted
    assert result["alive_before_last"] == 0 and result["last"] == 3
    assert result["alive"] == 0
    maps, rss = np.array(result["rows"]).T
    # flat after the first few: later models add no memory maps and (within allocator
    # noise) no resident memory; before, each added 100-440 maps and about 30 MB
    assert maps[10:].max() - maps[10] <= 20, maps[::25]
    assert rss[10:].max() - rss[10] <= 64 << 20, rss[::25]


def train_and_drop(build):
    model = build()
    step = train_step(model, half_squared_error, gd(0.1))
    p = model.init(jax.random.PRNGKey(0))
    s, _ = step(step.init(p), X, Y)
    fit(model, half_squared_error, gd(0.1), p, (X, Y), epochs=1, batch_size=4, progress=False)
    predict(model, p, X)
    refs = [weakref.ref(model), weakref.ref(step), weakref.ref(shared(model))]
    del model, step, s, p
    gc.collect()
    return refs


def test_a_trained_model_is_freed_with_its_step_and_compiled_code():
    refs = train_and_drop(lambda: dense(2, 3) >> sigmoid >> dense(3, 1))
    assert [r() for r in refs] == [None, None, None]


def scaled(c):
    return Layer(R(2), R(1), R(1, 2), lambda a, p: c * (p @ a), name="scaled")


def test_models_that_compute_alike_share_a_compilation_and_others_do_not():
    a, b = dense(2, 3) >> sigmoid >> dense(3, 1), dense(2, 3) >> sigmoid >> dense(3, 1)
    assert shared(a) is shared(b)
    assert shared(a) is not shared(dense(2, 3) >> sigmoid >> dense(3, 2) >> dense(2, 1))
    # the same code closing over different numbers, or over different arrays, computes
    # differently: each its own compilation, and each its own result
    assert shared(scaled(2.0)) is not shared(scaled(3.0))
    assert shared(scaled(jnp.ones(()))) is not shared(scaled(jnp.ones(())))
    assert shared(scaled(-0.0)) is not shared(scaled(0.0))
    p = jnp.ones((1, 2))
    got = [float(train_step(scaled(c), half_squared_error, gd(0.1))(
        train_step(scaled(c), half_squared_error, gd(0.1)).init(p), X, Y)[0].params[0, 0])
        for c in (2.0, 3.0)]
    # ½ (c·(1+1))², its gradient in each weight c·2c: one step of 0.1 from 1
    np.testing.assert_allclose(got, [1 - 0.1 * 2 * 2.0 * 2.0, 1 - 0.1 * 2 * 3.0 * 3.0], rtol=1e-6)
