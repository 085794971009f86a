"""Layouts: the partition of each parameter slot over a mesh, resolved and checked at set-up
(against partitions written out by hand), and training with the state laid out over 8
simulated devices (against the single-device run).

JAX fixes its device count when it starts and this test process has one CPU device, so the
runs over meshes are subprocesses started with XLA_FLAGS=--xla_force_host_platform_device_count=8.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from categories import KindError, LayoutError
from lenses import Layout, adam, dense, gd, half_squared_error, momentum, tanh, train_step
from lenses.training.layout import largest_divisible, mirror

ROOT = Path(__file__).resolve().parents[1]
MLP = dense(3, 8) >> tanh >> dense(8, 2)  # leaves (8, 3), (8,); none; (2, 8), (2,)


def test_the_default_rule_splits_each_leafs_largest_divisible_dimension():
    assert Layout().specs(MLP, {"model": 4}) == ((P("model", None), P("model")), None,
                                                 (P(None, "model"), P()))
    assert Layout().specs(MLP, {"model": 2}) == ((P("model", None), P("model")), None,
                                                 (P(None, "model"), P("model")))
    # a mesh without the model axis, or of one device along it: everything replicated
    assert Layout().specs(MLP, {"data": 8}) == ((P(), P()), None, (P(), P()))
    assert largest_divisible((4, 4), "model", {"model": 2}) == P("model", None)  # first on a tie
    assert largest_divisible((3, 5), "model", {"model": 2}) == P()
    assert largest_divisible((2,), "model", {"model": 4}) == P()  # smaller than the axis


def test_slots_are_named_by_index_name_or_kind_and_the_rest_take_the_default():
    sizes = {"model": 2, "data": 2}
    by_index = Layout(slots={0: "replicate"}).specs(MLP, sizes)
    assert by_index == ((P(), P()), None, (P(None, "model"), P("model")))
    by_name = Layout("replicate", slots={"dense(8→2)": (P("model"), P("data"))}).specs(MLP, sizes)
    assert by_name == ((P(), P()), None, (P("model"), P("data")))
    by_kind = Layout("replicate", slots={"dense": P("data")}).specs(MLP, sizes)
    assert by_kind == ((P("data"), P("data")), None, (P("data"), P("data")))
    by_function = Layout(slots={2: lambda shape: P(*([None] * (len(shape) - 1)), "data")})
    assert by_function.specs(MLP, sizes)[2] == (P(None, "data"), P("data"))
    assert Layout().specs(dense(4, 2), {"model": 2}) == (P(None, "model"), P("model"))


@pytest.mark.parametrize("layout, sizes, words", [
    (Layout(slots={0: P(None, "model")}), {"model": 4},
     ["slot 0 (dense(3→8))", "(8, 3)", "dimension 1 (3)", "'model'", "4 devices"]),
    (Layout(slots={2: P("tensor")}), {"model": 2},
     ["slot 2 (dense(8→2))", "(2, 8)", "'tensor'", "('model',)"]),
    (Layout(slots={"dense": P(None, None, "model")}), {"model": 2},
     ["slot 0 (dense(3→8))", "(8, 3)", "names 3 dimensions", "has 2"]),
    (Layout(slots={"conv2d": "shard"}), {"model": 2}, ["no slot", "'conv2d'", "slot 1 (tanh)"]),
    (Layout(slots={0: (P("model"),)}), {"model": 2}, ["slot 0 (dense(3→8))", "1 PartitionSpecs",
                                                       "2 arrays", "(8, 3)"]),
])
def test_a_layout_that_cannot_split_a_slot_is_refused_naming_slot_shape_and_axis(layout, sizes,
                                                                                  words):
    with pytest.raises(LayoutError) as e:
        layout.specs(MLP, sizes)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_a_layout_is_refused_at_set_up_of_the_step():
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
    with pytest.raises(LayoutError, match=r"slot 0 \(dense\(3→8\)\).*'tensor'"):
        train_step(MLP, half_squared_error, adam(0.1), mesh=mesh, layout=Layout(slots={0: P("tensor")}))
    with pytest.raises(KindError, match="mesh="):
        train_step(MLP, half_squared_error, adam(0.1), layout=Layout())
    with pytest.raises(KindError, match="must be a Layout"):
        train_step(MLP, half_squared_error, adam(0.1), mesh=mesh, layout={0: P("model")})
    with pytest.raises(KindError, match="rule of slot 0"):
        Layout(slots={0: "split"})


def test_the_batch_is_split_over_the_axis_asked_for_else_the_default_of_the_set_up():
    device = np.array(jax.devices()[:1])
    with_data = Mesh(device.reshape(1, 1), ("data", "model"))
    without = Mesh(device.reshape(1, 1), ("batch", "model"))

    def axis(**kw):
        return train_step(MLP, half_squared_error, gd(0.1), **kw).axis

    assert axis() is None  # no mesh: the batch is whole
    assert axis(mesh=without) == "batch"  # a mesh alone: its first axis
    assert axis(mesh=with_data, layout=Layout()) == "data"
    assert axis(mesh=without, layout=Layout()) is None  # laid out, no data axis: whole
    assert axis(mesh=with_data, axis="model") == "model"
    assert axis(mesh=without, layout=Layout(), axis="batch") == "batch"
    # an axis the mesh lacks: a layout error naming the mesh's axes
    with pytest.raises(LayoutError, match=r"'tensor' is not an axis of the mesh, whose axes "
                                          r"are \('data', 'model'\)"):
        axis(mesh=with_data, axis="tensor")


def test_optimiser_state_shaped_like_the_parameters_mirrors_their_partition():
    p = MLP.init(jax.random.PRNGKey(0))
    names = ((1, 2), None, (3, 4))  # stand-ins for the parameters' shardings
    s = mirror(adam(0.1).init(p), p, names, "rep")[1]  # Adam's part, the second of the chain
    assert (s.mu, s.nu, s.count) == (names, names, "rep")
    s = mirror(momentum(0.1, 0.9).init(p), p, names, "rep")
    assert jax.tree_util.tree_leaves(s) == [1, 2, 3, 4]
    assert mirror(gd(0.1).init(p), p, names, "rep") == gd(0.1).init(p)  # nothing to lay out


def test_a_laid_out_step_on_one_device_is_the_plain_step():
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
    p0 = MLP.init(jax.random.PRNGKey(0))
    X, Y = np.linspace(-1, 1, 24).reshape(8, 3), np.linspace(0, 1, 16).reshape(8, 2)
    a, b = train_step(MLP, half_squared_error, adam(0.05)), \
        train_step(MLP, half_squared_error, adam(0.05), mesh=mesh, layout=Layout())
    s, t = a.init(p0), b.init(p0)
    for _ in range(3):
        s, _ = a(s, X, Y)
        t, _ = b(t, X, Y)
    for u, v in zip(jax.tree_util.tree_leaves(s), jax.tree_util.tree_leaves(t)):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-6, atol=1e-7)
    assert not np.allclose(np.asarray(s.params[0][0]), np.asarray(p0[0][0]))


def run_eight(script: str, timeout: int = 120) -> dict:
    """Run `script` in a subprocess with 8 simulated CPU devices; its RESULT line, parsed."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                          " --xla_force_host_platform_device_count=8").strip(),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")][-1]
    return json.loads(line[len("RESULT"):])


MESHES = r'''
import json, sys
import jax
jax.config.update("jax_enable_x64", True)
import numpy as np
from jax.sharding import Mesh
from categories import draws
from lenses import Layout, adam, dense, fit, half_squared_error, per_device_bytes, tanh, train_step

devices = np.array(jax.devices())
model = dense(4, 32) >> tanh >> dense(32, 16)
out = {"devices": len(devices)}
for dtype in ("float64", "float32"):
    cast = lambda t: jax.tree_util.tree_map(lambda a: np.asarray(a, dtype), t)
    p0 = cast(model.init(jax.random.PRNGKey(0)))
    X = cast(draws.normal(jax.random.PRNGKey(1), (16, 4)))
    Y = cast(draws.normal(jax.random.PRNGKey(2), (16, 16)))
    one = train_step(model, half_squared_error, adam(0.01))
    ref, losses = one.init(p0), []
    for _ in range(20):
        ref, r = one(ref, X, Y)
        losses.append(float(r.loss))
    leaves = lambda s: [np.asarray(a).tolist() for a in jax.tree_util.tree_leaves(s.params)]
    out[dtype] = {"ref": {"losses": losses, "params": leaves(ref)}}
    for shape, names in [((8,), ("model",)), ((2, 4), ("data", "model")), ((8,), ("data",))]:
        mesh = Mesh(devices.reshape(shape), names)
        step = train_step(model, half_squared_error, adam(0.01), mesh=mesh, layout=Layout())
        state, losses = step.init(p0), []
        for _ in range(20):
            state, r = step(state, X, Y)
            losses.append(float(r.loss))
        held = (state.params, state.opt_state)
        per = per_device_bytes(held)
        total = sum(a.nbytes for a in jax.tree_util.tree_leaves(held))
        # fit over the same mesh: batches of the whole data, so its steps are the calls'
        fitted, _ = fit(model, half_squared_error, adam(0.01), p0, (X, Y), epochs=20,
                        batch_size=16, key=0, mesh=mesh, layout=Layout())
        out[dtype][f"{shape}/{names}"] = {
            "losses": losses, "params": leaves(state), "fit": leaves(fitted),
            "max_bytes": max(per.values()), "total": total, "devices": len(per),
            "model_axis": dict(mesh.shape).get("model", 1),
            "specs": [str(a.sharding.spec) for a in jax.tree_util.tree_leaves(fitted)],
            "kept": all(a.sharding == b.sharding for a, b in zip(
                jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(step.init(p0))))}
# a fault met over the mesh: the same step, kind and slot as on one device, the state before it
bad = np.array(X)
bad[5, 0] = np.nan
faults = []
for kw in ({}, {"mesh": Mesh(devices.reshape(2, 4), ("data", "model")), "layout": Layout()}):
    try:
        fit(model, half_squared_error, adam(0.01), p0, (bad, Y), epochs=3, batch_size=8, key=0,
            **kw)
        faults.append(None)
    except FloatingPointError as e:
        faults.append([type(e).__name__, int(e.kind), e.step, e.slot, int(e.state.count),
                       leaves(e.state)])
out["faults"] = faults
print("RESULT" + json.dumps(out))
'''


@pytest.mark.slow  # a subprocess with 8 simulated devices
def test_adam_over_three_meshes_keeps_the_state_split_and_equals_one_device():
    out = run_eight(MESHES)
    assert out["devices"] == 8
    one, laid_out = out.pop("faults")
    assert one is not None and one[:5] == laid_out[:5], (one[:5], laid_out[:5])
    assert one[0] == "NonFiniteError" and one[4] == one[2] - 1  # the state before the fault
    for got, want in zip(laid_out[5], one[5]):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    for dtype, tol in (("float64", dict(rtol=1e-12, atol=1e-12)),
                       ("float32", dict(rtol=1e-5, atol=1e-6))):
        ref = out[dtype].pop("ref")
        assert len(out[dtype]) == 3
        for mesh, run in out[dtype].items():
            np.testing.assert_allclose(run["losses"], ref["losses"], **tol, err_msg=mesh)
            for key in ("params", "fit"):
                for got, want in zip(run[key], ref["params"]):
                    np.testing.assert_allclose(got, want, **tol, err_msg=f"{mesh} {key}")
            assert run["devices"] == 8
            # every device holds at most 1.25 × its share of the whole state
            assert run["max_bytes"] <= 1.25 * run["total"] / run["model_axis"], (mesh, run)
            assert run["kept"], mesh  # the state leaves each step laid out as it came in
        assert ref["losses"][-1] < 0.9 * ref["losses"][0]  # the runs compared did learn
        split = out[dtype]["(2, 4)/('data', 'model')"]
        assert "'model'" in " ".join(split["specs"])
        assert all("model" not in s for s in out[dtype]["(8,)/('data',)"]["specs"])


METRICS = r'''
NAMES = __NAMES__
import json
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from categories import OpenBall, OpenBox, Positive, R, draws
from lenses import (KFAC, BoxBarrier, Diagonal, Fisher, GaussNewton, InteriorMetric, Layout,
                    LogBarrier, Layer, Poincare, adam, dense, gd, half_squared_error, tanh,
                    train_step)

mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
mlp = dense(4, 8) >> tanh >> dense(8, 4)
# a slot of each open set a geometry metric knows, each of 8 coordinates (split over 4)
scale = Layer(R(8), R(8), Positive(8), lambda x, s: s * x, name="scale",
                 init=lambda k: jnp.ones(8))
ball = Layer(R(8), R(8), OpenBall(np.zeros(8), 1.0), lambda x, c: x + c, name="ball",
                init=lambda k: jnp.full(8, 0.1))
box = Layer(R(8), R(8), OpenBox(-np.ones(8), np.ones(8)), lambda x, b: x * b, name="box",
               init=lambda k: jnp.full(8, 0.5))
geo = dense(4, 8) >> scale >> tanh >> ball >> box >> dense(8, 4)
X = np.asarray(draws.normal(jax.random.PRNGKey(1), (16, 4)))
Y = np.asarray(draws.normal(jax.random.PRNGKey(2), (16, 4)))
weights = jax.tree_util.tree_map(lambda a: jnp.full(a.shape, 2.0), mlp.init(jax.random.PRNGKey(0)))
cases = {"KFAC": (mlp, gd(0.05, metric=KFAC(0.1))),
         "KFAC with state": (mlp, gd(0.05, metric=KFAC(0.1, model=mlp, decay=0.9))),
         "GaussNewton": (mlp, gd(0.05, metric=GaussNewton(0.1))),
         "Fisher": (mlp, gd(0.05, metric=Fisher(0.1))),
         "Diagonal": (mlp, adam(0.05, metric=Diagonal(weights))),
         "LogBarrier": (geo, gd(0.05, metric=LogBarrier())),
         "Poincare": (geo, gd(0.05, metric=Poincare())),
         "BoxBarrier": (geo, gd(0.05, metric=BoxBarrier())),
         "InteriorMetric": (geo, adam(0.05, metric=InteriorMetric()))}
out = {}
for name in NAMES:
    model, opt = cases[name]
    p0 = model.init(jax.random.PRNGKey(0))
    a = train_step(model, half_squared_error, opt)
    b = train_step(model, half_squared_error, opt, mesh=mesh, layout=Layout())
    s, t = a.init(p0), b.init(p0)
    for _ in range(4):
        s, _ = a(s, X, Y)
        t, _ = b(t, X, Y)
    leaves = lambda u: jax.tree_util.tree_leaves(u)
    out[name] = {
        "diff": max(float(np.max(np.abs(np.asarray(u) - np.asarray(v))))
                    for u, v in zip(leaves(s), leaves(t))),
        "moved": max(float(np.max(np.abs(np.asarray(u) - np.asarray(v))))
                     for u, v in zip(leaves(s.params), leaves(p0))),
        "split": sum("model" in str(u.sharding.spec) for u in leaves(t.params))}
print("RESULT" + json.dumps(out))
'''


@pytest.mark.slow  # a subprocess with 8 simulated devices
@pytest.mark.parametrize("names", [
    ["KFAC", "KFAC with state", "GaussNewton", "Fisher"],  # the data-dependent metrics
    ["Diagonal", "LogBarrier", "Poincare", "BoxBarrier", "InteriorMetric"],  # point-dependent
])
def test_every_inner_product_trains_laid_out_as_it_does_replicated(names):
    """K-FAC's factors and the data metrics' matrices are not shaped like the parameters: they
    are replicated, the point and its covectors split; each metric trains as it does on one
    device (GSPMD gathers what a metric reads whole)."""
    out = run_eight(METRICS.replace("__NAMES__", repr(names)))
    assert list(out) == names
    for name, r in out.items():
        assert r["diff"] < 1e-11, (name, r)
        assert r["moved"] > 1e-2, (name, r)  # the runs compared did move
        assert r["split"] >= 3, (name, r)  # and their parameters were split over the mesh


SAVED = r'''
import json, os, sys, tempfile
import jax
jax.config.update("jax_enable_x64", True)
import numpy as np
from jax.sharding import Mesh
from categories import CheckpointMismatch, draws
from lenses import Checkpoints, Layout, adam, dense, fit, half_squared_error, load, tanh

devices = np.array(jax.devices())
on_24 = Mesh(devices.reshape(2, 4), ("data", "model"))
on_4 = Mesh(devices[:4], ("model",))
model = dense(4, 16) >> tanh >> dense(16, 8)
p0 = model.init(jax.random.PRNGKey(0))
X = np.asarray(draws.normal(jax.random.PRNGKey(1), (32, 4)))
Y = np.asarray(draws.normal(jax.random.PRNGKey(2), (32, 8)))
path = os.path.join(tempfile.mkdtemp(), "run.st")
run = dict(epochs=4, batch_size=8, key=0)
leaves = lambda s: [np.asarray(a).tolist() for a in jax.tree_util.tree_leaves(s.params)]
# a run on (2, 4) stopped at its checkpoint of step 6 (mid-epoch 2)
stopped, _ = fit(model, half_squared_error, adam(0.02), p0, (X, Y), mesh=on_24, layout=Layout(),
                 checkpoints=Checkpoints(path, every=6), callbacks=[lambda e: e.step == 6], **run)
out = {"stopped": int(stopped.count)}
for name, kw in (("(4,)", dict(mesh=on_4, layout=Layout())), ("one", {})):
    whole, history = fit(model, half_squared_error, adam(0.02), p0, (X, Y), **kw, **run)
    resumed, rhistory = fit(model, half_squared_error, adam(0.02), p0, (X, Y),
                            checkpoints=Checkpoints(path, resume=True), **kw, **run)
    out[name] = {"whole": leaves(whole), "resumed": leaves(resumed), "count": int(resumed.count),
                 "history": [h["loss"] for h in history], "rhistory": [h["loss"] for h in rhistory],
                 "specs": [str(getattr(a.sharding, "spec", "one device"))
                           for a in jax.tree_util.tree_leaves(resumed)]}
saved = load(path, model, adam(0.02), mesh=on_4, layout=Layout())
out["loaded_specs"] = [str(a.sharding.spec) for a in jax.tree_util.tree_leaves(saved.state.params)]
out["loaded_devices"] = sorted({d.id for a in jax.tree_util.tree_leaves(saved.state)
                                for d in a.sharding.device_set})
out["layout"] = saved.info.get("layout")
refusals = {}
for name, call in (
        ("layout", lambda: load(path, model, adam(0.02), mesh=on_4,
                                layout=Layout(slots={0: "replicate"}))),
        ("model", lambda: load(path, dense(4, 16) >> tanh >> dense(16, 4), adam(0.02), mesh=on_4,
                               layout=Layout()))):
    try:
        call()
        refusals[name] = None
    except CheckpointMismatch as e:
        refusals[name] = str(e)
out["refusals"] = refusals
print("RESULT" + json.dumps(out))
'''


@pytest.mark.slow  # a subprocess with 8 simulated devices
def test_a_run_saved_on_2x4_resumes_on_4_devices_and_on_one_as_their_uninterrupted_runs():
    out = run_eight(SAVED)
    assert out["stopped"] == 6
    for name in ("(4,)", "one"):
        r = out[name]
        assert r["count"] == 16
        for got, want in zip(r["resumed"], r["whole"]):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(r["rhistory"], r["history"], rtol=1e-12, err_msg=name)
    assert any("model" in s for s in out["(4,)"]["specs"])  # resumed laid out on the new mesh
    assert all("model" not in s for s in out["one"]["specs"])
    assert out["loaded_specs"] == ["P('model', None)", "P('model',)", "P(None, 'model')",
                                   "P('model',)"]
    assert out["loaded_devices"] == [0, 1, 2, 3]
    assert out["layout"] == Layout().describe()
    assert "saved under the layout" in out["refusals"]["layout"] and \
        "'replicate'" in out["refusals"]["layout"]
    assert "dense(16→8)" in out["refusals"]["model"] or "16→4" in out["refusals"]["model"]


BENCH = r'''
import json, sys
sys.path.insert(0, "bench")
import sharding
print("RESULT" + json.dumps(sharding.agreement([8, 16, 16, 8], 16, 5)))
'''


@pytest.mark.slow  # a subprocess with 8 simulated devices
def test_the_sharding_bench_contestants_agree_with_one_device_in_float32():
    """bench/sharding.py's configurations at a small size: 5 Adam steps of each equal the
    one-device run to 1e-5 relative."""
    out = run_eight(BENCH)
    moved = out.pop("moved")
    assert set(out) == {"replicated", "sharded 2x4", "sharded 8"}
    for kind, err in out.items():
        assert err < 1e-5, (kind, err)
    assert moved > 1e-3  # the runs compared moved their parameters


PAGE = r'''
import os, pathlib, re, sys, tempfile
docs = pathlib.Path("docs/training")
blocks = lambda page: re.findall(r"```python\n(.*?)```", (docs / page).read_text(), re.S)
source = "\n".join(blocks("index.md") + blocks("layouts.md"))
os.chdir(tempfile.mkdtemp())  # the page saves a file
exec(compile(source, "docs/training/layouts.md", "exec"), {"__name__": "page"})
print("RESULT{}")
'''


@pytest.mark.slow  # a subprocess with 8 simulated devices
def test_the_layouts_page_runs_on_eight_devices():
    """docs/training/layouts.md's blocks after the training setup, as one program, over 8
    simulated devices (a 2 × 4 mesh): the page asserts what it claims (the same steps as on one
    device, at most 1.25 × each device's share of the state, the refusal, the reload)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=8",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", PAGE], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "{'data': 2, 'model': 4}" in proc.stdout
    assert "P('model', None)" in proc.stdout  # the first weight split along its 64 outputs
