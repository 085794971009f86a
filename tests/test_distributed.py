"""Past one machine, on JAX's own runtime: two processes on the loopback address, each with
one CPU device and its own shard of every batch (`jax.distributed.initialize`, gloo
collectives), train the same model as one process does with the whole batch.

The processes are started here, bounded in time, and killed if anything goes wrong. The
oracle is the single-process step in this test process (no mesh) over the same global
batches, the rows of process 0 followed by those of process 1.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from categories import draws
from lenses import epoch_order, gd, half_squared_error, momentum, train_step

ROOT = Path(__file__).resolve().parents[1]

# Runs of each kind of fault, met in row 9 (process 1's row 1) or in process 1's rows: the
# same source defines them in the workers and here, where the oracle runs them.
FAULT_CASES = r'''
def fault_cases(X, Y):
    import jax.numpy as jnp
    from categories import Positive, R
    from lenses import Layer, dense, gd, half_squared_error, softmax_cross_entropy, tanh
    mlp = dense(3, 8) >> tanh >> dense(8, 2)
    clf = dense(3, 8) >> tanh >> dense(8, 3)
    scale = Layer(R(3), R(1), Positive(1), lambda x, s: s * x[:1], name="scale",
                     init=lambda k: jnp.ones((1,)))
    p0, pc = mlp.init(jax.random.PRNGKey(0)), clf.init(jax.random.PRNGKey(0))
    nan_x = X.copy(); nan_x[9, 0] = np.nan
    huge_y = Y.copy(); huge_y[8:] *= 1e12
    labels = np.zeros(16, np.int32); labels[9] = 7
    away = np.full((16, 1), 0.9); away[9] = -30.0
    ones = np.ones((16, 3))
    return {"covector": (mlp, half_squared_error, gd(0.1), p0, nan_x, Y),
            "new_point": (mlp, half_squared_error, gd(1e298), p0, X, huge_y),
            "target": (clf, softmax_cross_entropy(classes=3), gd(0.1), pc, X, labels),
            "outside": (scale, half_squared_error, gd(0.5), jnp.ones(1), ones, away)}
'''
exec(FAULT_CASES)

SCRIPT = r'''
import json, sys
pid, port = int(sys.argv[1]), int(sys.argv[2])
import jax
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                           process_id=pid, initialization_timeout=60)
import numpy as np
from jax.sharding import Mesh
from categories import draws
from lenses import dense, fit, gd, half_squared_error, momentum, tanh, train_step
FAULT_CASES

mesh = Mesh(np.array(jax.devices()), ("batch",))
model = dense(3, 8) >> tanh >> dense(8, 2)
p0 = model.init(jax.random.PRNGKey(0))
X = np.asarray(draws.normal(jax.random.PRNGKey(1), (16, 3)))
Y = np.asarray(draws.normal(jax.random.PRNGKey(2), (16, 2)))
mine = slice(8 * pid, 8 * (pid + 1))  # this process's rows: it feeds its own shard

step = train_step(model, half_squared_error, momentum(0.1, 0.9), mesh=mesh)
state = step.init(p0)
for _ in range(5):
    state, report = step(state, *step.global_batch((X[mine], Y[mine])))
report.check()
fitted, history = fit(model, half_squared_error, gd(0.1), p0, (X[mine], Y[mine]), epochs=2,
                      batch_size=8, key=3, mesh=mesh)
faults = {}
for name, (m, family, opt, p, Xc, Yc) in fault_cases(X, Y).items():
    try:  # each fault is met in process 1's rows: both processes must stop at its step
        fit(m, family, opt, p, (Xc[mine], Yc[mine]), epochs=2, batch_size=8, key=3, mesh=mesh)
        faults[name] = None
    except Exception as e:
        faults[name] = [type(e).__name__, int(e.kind), e.step, int(e.state.count)]
local = lambda t: [np.asarray(a.addressable_data(0)).tolist() for a in jax.tree_util.tree_leaves(t)]
print("RESULT" + json.dumps({"processes": jax.process_count(), "step": local(state.params),
                             "fit": local(fitted.params), "count": int(fitted.count),
                             "history": [h["loss"] for h in history], "faults": faults}),
      flush=True)
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_processes(tmp_path, timeout=180, script=SCRIPT, devices=1):
    """Run `script` in two processes of `devices` simulated CPU devices each: their results."""
    source = script.replace("FAULT_CASES", FAULT_CASES)
    script = tmp_path / "worker.py"
    script.write_text(source)
    port = _free_port()
    flags = f"--xla_force_host_platform_device_count={devices}" if devices > 1 else ""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    procs = [subprocess.Popen([sys.executable, str(script), str(i), str(port), str(tmp_path)],
                              cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:  # cleaned up on failure: nothing is left running
            if p.poll() is None:
                p.kill()
                p.wait()
    results = []
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, f"a process failed:\n{err[-3000:]}"
        line = [x for x in out.splitlines() if x.startswith("RESULT")][-1]
        results.append(json.loads(line[len("RESULT"):]))
    return results


@pytest.mark.slow  # a subprocess: run first, so no worker waits on it at the end
def test_two_processes_train_as_one(tmp_path):
    from lenses import dense, tanh
    model = dense(3, 8) >> tanh >> dense(8, 2)
    p0 = model.init(jax.random.PRNGKey(0))
    X = np.asarray(draws.normal(jax.random.PRNGKey(1), (16, 3)))
    Y = np.asarray(draws.normal(jax.random.PRNGKey(2), (16, 2)))

    one = train_step(model, half_squared_error, momentum(0.1, 0.9))
    ref = one.init(p0)
    for _ in range(5):
        ref, _ = one(ref, X, Y)
    # fit: each process draws the same order over its own 8 rows, 4 rows a step each
    plain = train_step(model, half_squared_error, gd(0.1))
    fitted, losses = plain.init(p0), []
    for epoch in (1, 2):
        order, epoch_losses = np.asarray(epoch_order(3, epoch, 8, 4)), []
        for idx in order:
            rows = np.concatenate([idx, 8 + idx])
            fitted, report = plain(fitted, X[rows], Y[rows])
            epoch_losses.append(float(report.loss))
        losses.append(float(np.mean(epoch_losses)))

    # the runs that fault: the checked step over the same global batches, until its fault
    faults = {}
    for name, (m, family, opt, p, Xc, Yc) in fault_cases(X, Y).items():
        step, error = train_step(m, family, opt), None
        state = step.init(p)
        for epoch in (1, 2):
            for idx in np.asarray(epoch_order(3, epoch, 8, 4)):
                rows = np.concatenate([idx, 8 + idx])
                state, _ = step(state, Xc[rows], Yc[rows])
        try:
            state.check()
        except Exception as e:  # noqa: BLE001 - the oracle's error, to compare
            error = e
        assert error is not None, name
        faults[name] = [type(error).__name__, int(error.kind), error.step, int(error.state.count)]
    assert {f[1] for f in faults.values()} == {1, 2, 3, 4}  # every kind of fault

    results = run_two_processes(tmp_path)
    for r in results:
        assert r["processes"] == 2
        for got, want in zip(r["step"], jax.tree_util.tree_leaves(ref.params)):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-13)
        for got, want in zip(r["fit"], jax.tree_util.tree_leaves(fitted.params)):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-13)
        assert r["count"] == 4
        assert r["faults"] == faults  # every process raises each fault, at the same step
        np.testing.assert_allclose(r["history"], losses, rtol=1e-12)
    moved = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                for a, b in zip(results[0]["step"], jax.tree_util.tree_leaves(p0)))
    assert moved > 1e-3  # the comparison is not of two untouched points


LAID_OUT = r'''
import json, sys
pid, port = int(sys.argv[1]), int(sys.argv[2])
import jax
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                           process_id=pid, initialization_timeout=60)
import numpy as np
from jax.experimental.multihost_utils import process_allgather
from jax.sharding import Mesh
from categories import draws
from lenses import (Layout, adam, dense, fit, half_squared_error, per_device_bytes, save, tanh,
                    train_step)

# 2 processes × 2 devices: the data axis across the processes, the model axis within each
mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "model"))
model = dense(3, 8) >> tanh >> dense(8, 4)
p0 = model.init(jax.random.PRNGKey(0))
X = np.asarray(draws.normal(jax.random.PRNGKey(1), (16, 3)))
Y = np.asarray(draws.normal(jax.random.PRNGKey(2), (16, 4)))
mine = slice(8 * pid, 8 * (pid + 1))  # this process's rows of every batch

step = train_step(model, half_squared_error, adam(0.05), mesh=mesh, layout=Layout())
state = step.init(p0)
for _ in range(5):
    state, report = step(state, *step.global_batch((X[mine], Y[mine])))
report.check()
held = per_device_bytes((state.params, state.opt_state))
fitted, history = fit(model, half_squared_error, adam(0.05), p0, (X[mine], Y[mine]), epochs=2,
                      batch_size=8, key=3, mesh=mesh, layout=Layout())
# each process writes the laid-out state (its leaves span both processes: gathered one by one)
saved = save(f"{sys.argv[3]}/run{pid}.st", fitted, model, adam(0.05), layout=Layout())
bad = X.copy()
bad[9, 0] = np.nan  # in process 1's rows: both processes must stop at its step
try:
    fit(model, half_squared_error, adam(0.05), p0, (bad[mine], Y[mine]), epochs=2, batch_size=8,
        key=3, mesh=mesh, layout=Layout())
    fault = None
except FloatingPointError as e:
    fault = [type(e).__name__, int(e.kind), e.step, e.slot, int(e.state.count)]
whole = lambda t: [np.asarray(process_allgather(a, tiled=True)).tolist()
                   for a in jax.tree_util.tree_leaves(t)]
print("RESULT" + json.dumps({"processes": jax.process_count(), "devices": len(jax.devices()),
                             "step": whole(state.params), "fit": whole(fitted.params),
                             "history": [h["loss"] for h in history], "fault": fault,
                             "held": list(held.values()), "saved": saved,
                             "specs": [str(a.sharding.spec) for a in
                                       jax.tree_util.tree_leaves(fitted.params)]}), flush=True)
'''


@pytest.mark.slow  # two subprocesses
def test_two_processes_of_two_devices_train_a_laid_out_model_as_one_device(tmp_path):
    from lenses import adam, dense, load, tanh
    model = dense(3, 8) >> tanh >> dense(8, 4)
    p0 = model.init(jax.random.PRNGKey(0))
    X = np.asarray(draws.normal(jax.random.PRNGKey(1), (16, 3)))
    Y = np.asarray(draws.normal(jax.random.PRNGKey(2), (16, 4)))
    one = train_step(model, half_squared_error, adam(0.05))
    ref = one.init(p0)
    for _ in range(5):
        ref, _ = one(ref, X, Y)
    fitted, losses = one.init(p0), []
    for epoch in (1, 2):  # each process's own order over its 8 rows, 4 rows a step each
        order, epoch_losses = np.asarray(epoch_order(3, epoch, 8, 4)), []
        for idx in order:
            rows = np.concatenate([idx, 8 + idx])
            fitted, report = one(fitted, X[rows], Y[rows])
            epoch_losses.append(float(report.loss))
        losses.append(float(np.mean(epoch_losses)))
    bad = X.copy()
    bad[9, 0] = np.nan
    state = one.init(p0)
    for epoch in (1, 2):
        for idx in np.asarray(epoch_order(3, epoch, 8, 4)):
            rows = np.concatenate([idx, 8 + idx])
            state, _ = one(state, bad[rows], Y[rows])
    with pytest.raises(FloatingPointError) as e:
        state.check()
    fault = [type(e.value).__name__, int(e.value.kind), e.value.step, e.value.slot,
             int(e.value.state.count)]

    results = run_two_processes(tmp_path, script=LAID_OUT, devices=2)
    total = sum(np.asarray(a).nbytes for a in jax.tree_util.tree_leaves((ref.params,
                                                                         ref.opt_state)))
    for r in results:
        assert (r["processes"], r["devices"]) == (2, 4)
        for got, want in zip(r["step"], jax.tree_util.tree_leaves(ref.params)):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-13)
        for got, want in zip(r["fit"], jax.tree_util.tree_leaves(fitted.params)):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(r["history"], losses, rtol=1e-12)
        assert r["fault"] == fault  # both processes stop at the step the one device stops at
        assert "model" in " ".join(r["specs"])
        assert len(r["held"]) == 2 and max(r["held"]) <= 1.25 * total / 2  # its share, each
        back = load(r["saved"], model, adam(0.05)).state  # the file, read on one device
        for got, want in zip(jax.tree_util.tree_leaves(back.params),
                             jax.tree_util.tree_leaves(fitted.params)):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-13)
