"""Data parallelism: the batch split over 4 (host-simulated) devices gives the same step.

JAX fixes its device count when it starts, and this test process has already started it with
one CPU device, so the check runs in a subprocess started with
XLA_FLAGS=--xla_force_host_platform_device_count=4. The oracle is the single-device step.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = r'''
import json
import jax
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")
import numpy as np
from jax.sharding import Mesh
from categories import draws
from lenses import adam, dense, fit, gd, half_squared_error, nesterov, tanh, train_step

out = {"devices": len(jax.devices())}
mesh = Mesh(np.array(jax.devices()), ("batch",))
model = dense(3, 8) >> tanh >> dense(8, 2)
p0 = model.init(jax.random.PRNGKey(0))
X = np.asarray(draws.normal(jax.random.PRNGKey(1), (16, 3)))
Y = np.asarray(draws.normal(jax.random.PRNGKey(2), (16, 2)))

diffs, moved = {}, {}
for name, make, reduction in [("gd", gd, "mean"), ("nesterov", nesterov, "sum"),
                              ("adam", adam, "mean")]:
    lr = 0.1 if reduction == "mean" else 0.1 / len(X)  # the same size of steps for a sum loss
    one = train_step(model, half_squared_error, make(lr), reduction=reduction)
    many = train_step(model, half_squared_error, make(lr), reduction=reduction, mesh=mesh)
    a, b = one.init(p0), many.init(p0)
    d = 0.0
    for _ in range(5):
        a, ra = one(a, X, Y)
        b, rb = many(b, X, Y)
        d = max([d, abs(float(ra.loss) - float(rb.loss)),
                 abs(float(ra.largest_slope) - float(rb.largest_slope))])
    for x, y in zip(jax.tree_util.tree_leaves((a.params, a.opt_state)),
                    jax.tree_util.tree_leaves((b.params, b.opt_state))):
        d = max(d, float(np.max(np.abs(np.asarray(x) - np.asarray(y)))))
    diffs[f"{name}/{reduction}"] = d
    moved[f"{name}/{reduction}"] = max(
        float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
        for x, y in zip(jax.tree_util.tree_leaves(a.params), jax.tree_util.tree_leaves(p0)))
out["diffs"], out["moved"] = diffs, moved

step = train_step(model, half_squared_error, gd(0.1), mesh=mesh)
state = step.init(p0)
hlo = jax.jit(step.step_fn).lower(state, X, Y).as_text()  # the psum over the batch axis
out["all_reduce"] = "all_reduce" in hlo
try:
    step(state, X[:6], Y[:6])
    out["uneven"] = "accepted"
except ValueError as e:
    out["uneven"] = str(e)

state, history = fit(model, half_squared_error, adam(0.05), p0, (X, Y), epochs=2, batch_size=8,
                     key=0, mesh=mesh)
out["fit_steps"] = int(state.count)
try:
    fit(model, half_squared_error, gd(0.1), p0, (X, Y), epochs=1, batch_size=6, key=0, mesh=mesh)
    out["fit_uneven"] = "accepted"
except ValueError as e:
    out["fit_uneven"] = str(e)
try:  # a diverging rate over the mesh raises as it does without one
    fit(model, half_squared_error, gd(1e300), p0, (X, Y), epochs=2, batch_size=8, key=0, mesh=mesh)
    out["diverged"] = "returned"
except FloatingPointError as e:
    out["diverged"] = [type(e).__name__, e.step, int(e.state.count)]
from lenses import softmax_cross_entropy
clf = dense(3, 8) >> tanh >> dense(8, 3)
labels = np.zeros(16, np.int32)
labels[9] = 7  # a label out of range on the second device's rows of step 2
try:  # found by the chunk's own verdict on its targets (a NaN does not survive every all-reduce)
    run_step = train_step(clf, softmax_cross_entropy(classes=3), gd(0.1), mesh=mesh)
    run_step.run(run_step.init(clf.init(jax.random.PRNGKey(0))), np.stack([X[:8], X[8:]]),
                 np.stack([labels[:8], labels[8:]]))
    out["bad_label"] = "accepted"
except ValueError as e:
    out["bad_label"] = [type(e).__name__, e.step, e.slot]
step = train_step(model, half_squared_error, gd(0.1), mesh=mesh)
s, r = step.run(step.init(p0), np.stack([X[:8], X[8:]]), np.stack([Y[:8], Y[8:]]))
one = train_step(model, half_squared_error, gd(0.1), mesh=mesh)
t = one.init(p0)
for i in (0, 8):
    t, _ = one(t, X[i:i + 8], Y[i:i + 8])
out["run_is_calls"] = all(np.array_equal(a, b) for a, b in zip(
    jax.tree_util.tree_leaves(s), jax.tree_util.tree_leaves(t)))
print("RESULT" + json.dumps(out))
'''


def run_four_devices():
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
    env["JAX_PLATFORMS"] = "cpu"
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")][-1]
    return json.loads(line[len("RESULT"):])


@pytest.mark.slow  # a subprocess: run first, so no worker waits on it at the end
def test_sharded_step_equals_single_device_step():
    out = run_four_devices()
    assert out["devices"] == 4
    assert out["all_reduce"], "the covectors should be added across devices (an all-reduce)"
    for key, d in out["diffs"].items():
        assert d < 1e-10, (key, d)
        assert out["moved"][key] > 1e-3, key  # the parameters did move
    assert "cannot be split evenly" in out["uneven"]
    assert out["fit_steps"] == 4  # fit runs on the mesh too
    assert "cannot be split evenly" in out["fit_uneven"]  # refused by fit as by the step
    assert out["diverged"][0] == "NonFiniteError" and out["diverged"][2] == out["diverged"][1] - 1
    assert out["bad_label"] == ["TargetError", 2, 1]
    assert out["run_is_calls"]  # many steps in one dispatch over the mesh: the calls' bits
