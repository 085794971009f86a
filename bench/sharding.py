"""Bytes per device and step time of Adam on a large MLP: the state replicated on every device
(data parallelism, `mesh=` alone) against the state laid out over the mesh (`layout=Layout()`).

An MLP of tanh layers (default widths 2048-4096-4096-4096-2048: 50.3 M parameters, 201 MB in
float32; with Adam's two moments 604 MB of state) trained by Adam on 8 simulated CPU devices
(`XLA_FLAGS=--xla_force_host_platform_device_count=8`, one fresh process per configuration):

  replicated      mesh (8,) over "data", no layout: every device holds the whole state
  sharded 2x4     mesh (2, 4) over ("data", "model"), Layout(): the batch over 2, the state over 4
  sharded 8       mesh (8,) over "model", Layout(): the whole batch, the state over 8

Bytes per device: the largest sum over a device of the parameters' and the optimiser state's
addressable shards (`per_device_bytes`), after the steps. Step time: seconds per `train_step`
call, blocked on, on the benchmark's clock (CPU time of the process by default: the 8
simulated devices share the machine's cores, so this is the work of all eight); compile:
the first call's time.

    .venv/bin/python bench/sharding.py
    .venv/bin/python bench/sharding.py --widths 256 512 512 256 --batch 32
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

KINDS = ("replicated", "sharded 2x4", "sharded 8")
DEVICES = 8
LR = 1e-3


def mesh_for(kind):
    """(mesh, layout) of a configuration, over this process's 8 devices."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from lenses import Layout

    devices = np.array(jax.devices()[:DEVICES])
    if kind == "replicated":
        return Mesh(devices, ("data",)), None
    if kind == "sharded 2x4":
        return Mesh(devices.reshape(2, 4), ("data", "model")), Layout()
    if kind == "sharded 8":
        return Mesh(devices, ("model",)), Layout()
    if kind == "one device":
        return None, None
    raise ValueError(kind)


def problem(widths, batch, dtype="float32"):
    """(model, p0, X, Y): the MLP and one batch of data."""
    import jax
    import numpy as np

    from lenses import dense, tanh

    layers = [dense(a, b) for a, b in zip(widths[:-1], widths[1:])]
    model = layers[0]
    for layer in layers[1:]:
        model = model >> tanh >> layer
    p0 = jax.tree_util.tree_map(lambda a: np.asarray(a, dtype), model.init(jax.random.PRNGKey(0)))
    rng = np.random.default_rng(1)
    X = rng.standard_normal((batch, widths[0])).astype(dtype)
    Y = rng.standard_normal((batch, widths[-1])).astype(dtype)
    return model, p0, X, Y


def step_for(kind, model):
    from lenses import adam, half_squared_error, train_step

    mesh, layout = mesh_for(kind)
    return train_step(model, half_squared_error, adam(LR), mesh=mesh, layout=layout)


def agreement(widths, batch, steps, dtype="float32") -> dict:
    """Max |difference| of the losses and final parameters of `steps` Adam steps of each
    configuration from the one-device run, relative to the largest |parameter| (loss: to the
    loss); and how far the one-device run moved (so the comparison is of a real run)."""
    import jax
    import numpy as np

    model, p0, X, Y = problem(widths, batch, dtype)

    def run(kind):
        step = step_for(kind, model)
        state, losses = step.init(p0), []
        for _ in range(steps):
            state, report = step(state, X, Y)
            losses.append(float(report.loss))
        return [np.asarray(a) for a in jax.tree_util.tree_leaves(state.params)], losses

    ref, ref_losses = run("one device")
    scale = max(float(np.max(np.abs(a))) for a in ref)
    out = {}
    for kind in KINDS:
        got, losses = run(kind)
        out[kind] = max(max(float(np.max(np.abs(a - b))) for a, b in zip(got, ref)) / scale,
                        max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)))
    out["moved"] = max(float(np.max(np.abs(a - np.asarray(b))))
                       for a, b in zip(ref, jax.tree_util.tree_leaves(p0))) / scale
    return out


def worker(cfg):
    import jax

    from lenses import per_device_bytes

    model, p0, X, Y = problem(cfg["widths"], cfg["batch"])
    step = step_for(cfg["kind"], model)
    state = step.init(p0)
    t = C.clock()
    state, report = step(state, X, Y)
    jax.block_until_ready(state)
    compile_s = C.clock() - t
    times = []
    for _ in range(cfg["repeats"]):
        t = C.clock()
        for _ in range(cfg["steps"]):
            state, report = step(state, X, Y)
        jax.block_until_ready(state)
        times.append((C.clock() - t) / cfg["steps"])
    float(report.loss)  # the fault check: a refused step raises here
    held = per_device_bytes((state.params, state.opt_state))
    total = sum(a.nbytes for a in jax.tree_util.tree_leaves((state.params, state.opt_state)))
    n = sum(a.size for a in jax.tree_util.tree_leaves(state.params))
    C.emit({"kind": cfg["kind"], "params": n, "total": total, "max_bytes": max(held.values()),
            "devices": len(held), "compile_s": compile_s, "step_s": times,
            "rss_mib": C.peak_rss_mib()})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", type=int, nargs="+", default=[2048, 4096, 4096, 4096, 2048])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2, help="steps per timed repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    ap.add_argument("--worker")
    args = ap.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={DEVICES}").strip()
    os.environ["JAX_PLATFORMS"] = "cpu"
    rows, started = [], time.perf_counter()
    for kind in args.kinds:
        cfg = dict(kind=kind, widths=args.widths, batch=args.batch, steps=args.steps,
                   repeats=args.repeats)
        r = C.run_worker(os.path.abspath(__file__), cfg, timeout=3600, threads=args.threads,
                         clock=args.clock)
        rows.append(r)
    base = rows[0]
    mib = 1 / 2 ** 20
    print(f"MLP {'-'.join(map(str, args.widths))} ({base['params'] / 1e6:.1f} M parameters), "
          f"Adam, batch {args.batch}, {DEVICES} simulated CPU devices; state (parameters + "
          f"Adam's moments) {base['total'] * mib:.0f} MiB in all; clock {args.clock}; "
          f"{time.perf_counter() - started:.0f} s")
    print(C.table(
        ["configuration", "MiB per device (largest)", "÷ whole state", "step s", "compile s",
         "peak RSS MiB"],
        [[r["kind"], f"{r['max_bytes'] * mib:.1f}", f"{r['max_bytes'] / r['total']:.3f}",
          C.summary(r["step_s"], fmt="{:.2f}"), f"{r['compile_s']:.1f}", f"{r['rss_mib']:.0f}"]
         for r in rows]))


if __name__ == "__main__":
    main()
