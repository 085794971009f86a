"""One full training step (forward, loss, backward, SGD update) of one MLP, five ways.

  lens        the network as a lens expression, the step written with the public lens API
              (batched(model).vjp, dL of the batch loss, p − η·sharp(p')), jax.jit-compiled
  train_step  lenses.train_step(model, loss, gd(η)), its report read after every step: the
              same step, verified (finite slopes and point, targets) before the next call
  jax         hand-written jax.value_and_grad + jax.jit
  torch       PyTorch CPU eager (nn.Linear, torch.optim.SGD)
  numpy       backpropagation written by hand in numpy

All five start from the same seeded float32 parameters; before timing, the script checks
that one step gives the same new parameters everywhere (relative 1e-5). Each configuration
runs in fresh processes, the contestants interleaved within each; compile time (trace +
XLA compile) is reported apart from step time.

A second table times the loops a user runs, over 64 batches, in wall-clock time with each
library's default threads: the `train_step` loop reading its loss at the end and reading it
every step, and given numpy batches (as a data loader yields them) read at the end, each
against the hand-written jitted JAX loop doing the same reads on the same arrays; the
multi-step call `step.run` over the epoch's stacked batches; `fit` (per step, from 6 epochs
minus 1 with a fresh but equal optimiser in each call, so that compilation cancels; the
median of 3 such pairs per repeat); the hand-written JAX step as one `lax.scan` over the
epoch; PyTorch eager looped (where torch is installed); and how many compilations of the step
a sweep of five learning rates through `fit` costs, counted by JAX's compile events.

A third table (`--tables cost`) shows where a `train_step` call's time goes, one difference
at a time, each a loop over the same 64 batches read at the end (wall clock): the
hand-written JAX step; the lens step; the lens step carrying the state a call carries (the
step count and the fault record); the checked step compiled straight (`jax.jit(step.step_fn)`:
the verdict, the selection of the old state, the slope); and the call, which runs the
checked step as the one-step case of the loop every chunk runs (the price of a chunk having
the calls' bits). Each is first checked to take the hand-written step's step.

    .venv/bin/python bench/step.py                 # all configurations, the first two tables
    .venv/bin/python bench/step.py --sizes 4-16-3 --losses se --repeats 9 --tables loop
    .venv/bin/python bench/step.py --tables cost --repeats 5 --processes 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

CONFIGS = [("4-16-3", 32), ("64-128-10", 256), ("784-512-512-10", 256)]
LOSSES = {"se": "squared error", "ce": "softmax cross-entropy"}
LR = 0.05


# -- the contestants ---------------------------------------------------------------------------

def data(sizes, batch, loss, seed=0):
    import numpy as np
    rng = np.random.default_rng(seed)
    params = [(rng.standard_normal((o, i)).astype(np.float32) / np.sqrt(i),
               (0.1 * rng.standard_normal(o)).astype(np.float32)) for i, o in zip(sizes, sizes[1:])]
    X = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    if loss == "se":
        Y = rng.standard_normal((batch, sizes[-1])).astype(np.float32)
    else:
        Y = rng.integers(0, sizes[-1], batch).astype(np.int32)
    return params, X, Y


def lens_model(sizes):
    from lenses import dense, tanh
    model = dense(sizes[0], sizes[1])
    for n_in, n_out in zip(sizes[1:], sizes[2:]):
        model = model >> tanh >> dense(n_in, n_out)
    return model


def lens_params(params):
    """((W, b), None, (W, b), ...): one slot per component, None for tanh's R^0."""
    import jax.numpy as jnp
    slots = []
    for k, (W, b) in enumerate(params):
        if k:
            slots.append(None)
        slots.append((jnp.asarray(W), jnp.asarray(b)))
    return tuple(slots)


def loss_family(loss, classes):
    import functools

    from lenses import half_squared_error, softmax_cross_entropy
    return half_squared_error if loss == "se" else functools.partial(softmax_cross_entropy, classes=classes)


def lens_step(sizes, loss):
    import jax

    from lenses import Euclidean, batch_loss, batched, dL
    model, family, metric = lens_model(sizes), loss_family(loss, sizes[-1]), Euclidean()

    def step(p, X, Y):
        out, pull = batched(model).vjp(X, p)
        L = batch_loss(family, Y, reduction="mean")
        _, p_cov = pull(dL(L, out))
        return p - LR * metric.sharp(p, p_cov), L.fn(out)

    return jax.jit(step)


def jax_step(sizes, loss):
    import jax
    import jax.numpy as jnp

    def forward(p, X):
        h = X
        for k, (W, b) in enumerate(p):
            h = h @ W.T + b
            if k < len(p) - 1:
                h = jnp.tanh(h)
        return h

    def objective(p, X, Y):
        z = forward(p, X)
        if loss == "se":
            return jnp.mean(0.5 * jnp.sum((z - Y) ** 2, axis=-1))
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(z), Y[:, None], axis=-1))

    def step(p, X, Y):
        value, g = jax.value_and_grad(objective)(p, X, Y)
        return jax.tree_util.tree_map(lambda w, d: w - LR * d, p, g), value

    return jax.jit(step)


def torch_step(params, loss):
    import torch
    layers = []
    for k, (W, b) in enumerate(params):
        lin = torch.nn.Linear(W.shape[1], W.shape[0])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(W))
            lin.bias.copy_(torch.from_numpy(b))
        layers.append(lin)
        if k < len(params) - 1:
            layers.append(torch.nn.Tanh())
    net = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(net.parameters(), lr=LR)

    def step(X, Y):
        opt.zero_grad(set_to_none=True)
        z = net(X)
        value = (0.5 * ((z - Y) ** 2).sum(dim=1).mean() if loss == "se"
                 else torch.nn.functional.cross_entropy(z, Y))
        value.backward()
        opt.step()
        return value

    return net, step


def numpy_step(loss):
    import numpy as np

    def step(p, X, Y):
        hs = [X]  # forward: keep every layer's output
        for k, (W, b) in enumerate(p):
            z = hs[-1] @ W.T + b
            hs.append(np.tanh(z) if k < len(p) - 1 else z)
        z, n = hs[-1], X.shape[0]
        if loss == "se":
            value = 0.5 * np.sum((z - Y) ** 2) / n
            dz = (z - Y) / n
        else:
            e = np.exp(z - z.max(axis=1, keepdims=True))
            s = e / e.sum(axis=1, keepdims=True)
            value = -np.mean(np.log(s[np.arange(n), Y]))
            s[np.arange(n), Y] -= 1.0
            dz = s / n
        new = [None] * len(p)
        for k in range(len(p) - 1, -1, -1):  # backward: reverse order, at the kept values
            W, b = p[k]
            new[k] = (W - LR * (dz.T @ hs[k]), b - LR * dz.sum(axis=0))
            if k:
                dz = (dz @ W) * (1.0 - hs[k] ** 2)
        return new, value

    return step


# -- the agreement check (run by the suite at a small size: tests/test_bench_agreement.py) ------

def relative_error(ps, ref) -> float:
    import numpy as np
    return max(float(np.max(np.abs(np.asarray(a) - r)) / np.max(np.abs(r)))
               for wb, rwb in zip(ps, ref) for a, r in zip(wb, rwb))


def agreement(sizes, batch, loss, params=None, X=None, Y=None) -> dict:
    """The relative difference from numpy's hand-written step of one step of each JAX
    contestant (the lens step, `train_step`, `train_step(...).run` over two batches) from the
    same float32 point."""
    import jax
    import numpy as np

    from lenses import gd, train_step

    if params is None:
        params, X, Y = data(sizes, batch, loss)
    nstep = numpy_step(loss)
    ref, _ = nstep(params, X, Y)
    ref2, _ = nstep(ref, X, Y)
    Xj, Yj = jax.numpy.asarray(X), jax.numpy.asarray(Y)
    p_lens = lens_params(params)
    ts = train_step(lens_model(sizes), loss_family(loss, sizes[-1]), gd(LR))
    state, _ = ts(ts.init(p_lens), Xj, Yj)
    ran, _ = ts.run(ts.init(p_lens), np.stack([X, X]), np.stack([Y, Y]))
    got = {"lens": [w for w in lens_step(sizes, loss)(p_lens, Xj, Yj)[0] if w is not None],
           "train_step": [w for w in state.params if w is not None],
           "jax": jax_step(sizes, loss)([tuple(map(jax.numpy.asarray, wb)) for wb in params],
                                        Xj, Yj)[0]}
    errors = {name: relative_error(ps, ref) for name, ps in got.items()}
    errors["run (2 steps)"] = relative_error([w for w in ran.params if w is not None], ref2)
    return errors


# -- the worker ----------------------------------------------------------------------------------

def worker(cfg):
    import jax
    import numpy as np
    import torch

    from lenses import gd, train_step

    if os.environ.get("BENCH_THREADS"):
        torch.set_num_threads(int(os.environ["BENCH_THREADS"]))

    sizes, batch, loss = [int(s) for s in cfg["sizes"].split("-")], cfg["batch"], cfg["loss"]
    params, X, Y = data(sizes, batch, loss)
    compile_s = {}

    # lens and jax: trace + compile measured apart from stepping (after a warm-up compile, so
    # that the backend's one-time start-up is charged to neither)
    jax.jit(lambda x: x + 1).lower(1.0).compile()
    Xj, Yj = jax.numpy.asarray(X), jax.numpy.asarray(Y)
    p_lens, p_jax = lens_params(params), [tuple(jax.numpy.asarray(a) for a in wb) for wb in params]
    t = C.clock()
    lens = lens_step(sizes, loss).lower(p_lens, Xj, Yj).compile()
    compile_s["lens"] = C.clock() - t
    t = C.clock()
    jx = jax_step(sizes, loss).lower(p_jax, Xj, Yj).compile()
    compile_s["jax"] = C.clock() - t
    t = C.clock()
    ts = train_step(lens_model(sizes), loss_family(loss, sizes[-1]), gd(LR))
    state0 = ts.init(p_lens)
    ts(state0, Xj, Yj)[1].check()
    compile_s["train_step"] = C.clock() - t

    net, tstep = torch_step(params, loss)
    Xt = torch.from_numpy(X)
    Yt = torch.from_numpy(Y) if loss == "se" else torch.from_numpy(Y.astype(np.int64))
    nstep = numpy_step(loss)

    # one step everywhere from the same point: the same new parameters
    errors = agreement(sizes, batch, loss, params, X, Y)
    tstep(Xt, Yt)
    ref, _ = nstep(params, X, Y)
    mods = [m for m in net if isinstance(m, torch.nn.Linear)]
    errors["torch"] = relative_error([(m.weight.detach().numpy(), m.bias.detach().numpy())
                                      for m in mods], ref)

    # time: each contestant carries its own parameters forward step after step
    box = {"lens": p_lens, "jax": p_jax, "train_step": state0, "numpy": params}

    def run_lens():
        box["lens"], v = lens(box["lens"], Xj, Yj)
        v.block_until_ready()

    def run_jax():
        box["jax"], v = jx(box["jax"], Xj, Yj)
        v.block_until_ready()

    def run_train_step():  # the step is asynchronous now: wait for it, as for the others
        box["train_step"], report = ts(box["train_step"], Xj, Yj)
        report.check()

    def run_torch():
        tstep(Xt, Yt)

    def run_numpy():
        box["numpy"], _ = nstep(box["numpy"], X, Y)

    fns = {"lens": run_lens, "jax": run_jax, "train_step": run_train_step, "torch": run_torch,
           "numpy": run_numpy}
    times = C.interleaved(fns, cfg["repeats"], cfg["target_s"])
    C.emit({"config": cfg, "times": times, "compile_s": compile_s, "errors": errors,
            "torch_threads": torch.get_num_threads()})


# -- the loops a user runs -----------------------------------------------------------------------

STEPS = 64  # batches per epoch in the loop table
FIT_PAIRS = 3  # (1 epoch, 6 epochs) pairs per timed repeat of fit, their median kept


def jax_scan_epoch(sizes, loss):
    """The hand-written JAX step as one `lax.scan` over the epoch's batches (one dispatch)."""
    import jax
    step = jax_step(sizes, loss)

    def epoch(p, XS, YS):
        return jax.lax.scan(lambda p, xy: step(p, *xy), p, (XS, YS))

    return jax.jit(epoch)


def epoch_data(sizes, batch, loss):
    """The STEPS batches the loops run over: (X, Y) whole, stacked (a leading axis of steps)
    on the device, and as lists of the device batches."""
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(1)
    n = STEPS * batch
    Xall = rng.standard_normal((n, sizes[0])).astype(np.float32)
    Yall = (rng.standard_normal((n, sizes[-1])).astype(np.float32) if loss == "se"
            else rng.integers(0, sizes[-1], n).astype(np.int32))
    XS, YS = jnp.asarray(Xall.reshape(STEPS, batch, -1)), jnp.asarray(Yall.reshape(STEPS, batch, *Yall.shape[1:]))
    return Xall, Yall, XS, YS, [XS[i] for i in range(STEPS)], [YS[i] for i in range(STEPS)]


def loop_worker(cfg):
    """Wall clock, each library's default threads: loops over STEPS batches, per step."""
    import importlib.util

    import jax.numpy as jnp
    import numpy as np

    from lenses import fit, gd, train_step
    has_torch = importlib.util.find_spec("torch") is not None  # its column is left out without it

    sizes, batch, loss = [int(s) for s in cfg["sizes"].split("-")], cfg["batch"], cfg["loss"]
    params, _, _ = data(sizes, batch, loss)
    Xall, Yall, XS, YS, Xb, Yb = epoch_data(sizes, batch, loss)
    p_jax = [tuple(jnp.asarray(a) for a in wb) for wb in params]
    model, family = lens_model(sizes), loss_family(loss, sizes[-1])
    jx, scan = jax_step(sizes, loss), jax_scan_epoch(sizes, loss)
    ts = train_step(model, family, gd(LR))
    box = {"jax": p_jax, "scan": p_jax, "ts": ts.init(lens_params(params))}
    box["run"] = box["ts"]
    if has_torch:
        import torch
        net, tstep = torch_step(params, loss)
        Xt = [torch.from_numpy(np.asarray(x)) for x in Xb]
        Yt = [torch.from_numpy(np.asarray(y)) if loss == "se" else torch.from_numpy(np.asarray(y).astype(np.int64))
              for y in Yb]

    # the same batches as numpy arrays, as a data loader yields them (each call transfers them)
    Xh, Yh = [np.asarray(x) for x in Xb], [np.asarray(y) for y in Yb]

    def hand_loop(read, Xs=Xb, Ys=Yb):
        def loop():
            p = box["jax"]
            for x, y in zip(Xs, Ys):
                p, v = jx(p, x, y)
                if read:
                    float(v)  # what a logger or a progress bar does
            float(v)
            box["jax"] = p
        return loop

    def hand_scan():
        box["scan"], v = scan(box["scan"], XS, YS)
        np.asarray(v)

    def ts_loop(read, Xs=Xb, Ys=Yb):
        def loop():
            state = box["ts"]
            for x, y in zip(Xs, Ys):
                state, report = ts(state, x, y)
                if read:
                    float(report.loss)
            float(report.loss)  # one synchronisation, where a fault would surface
            box["ts"] = state
        return loop

    def ts_run():  # the multi-step call: the epoch's batches in one dispatch
        box["run"], report = ts.run(box["run"], XS, YS)

    def torch_loop():
        for x, y in zip(Xt, Yt):
            tstep(x, y)

    fns = {"jax loop, read at end": hand_loop(False), "train_step, read at end": ts_loop(False),
           "jax loop, read every step": hand_loop(True),
           "train_step, read every step": ts_loop(True),
           "train_step, numpy batches": ts_loop(False, Xh, Yh),
           "jax loop, numpy batches": hand_loop(False, Xh, Yh),
           "jax scan": hand_scan, "run": ts_run}
    if has_torch:
        fns["torch loop"] = torch_loop
    for f in fns.values():
        f()  # compile and warm up
    times = C.interleaved(fns, cfg["repeats"], cfg["target_s"])
    times = {k: [t / STEPS for t in v] for k, v in times.items()}  # per step

    def fit_epochs(k, lr=LR):
        def run():  # a fresh optimiser each call, as users write it
            fit(model, family, gd(lr), lens_params(params), (Xall, Yall), epochs=k,
                batch_size=batch, key=0, progress=False)
        return run

    one, six = fit_epochs(1), fit_epochs(6)
    one()  # compile the chunks once; later calls with equal optimisers reuse them
    fit_times = []
    for _ in range(cfg["repeats"]):  # compilation cancels out of the difference
        pairs = []
        for _ in range(FIT_PAIRS):  # one pair is at the mercy of a single pause
            t1 = C.timed(one, 1)
            t6 = C.timed(six, 1)
            pairs.append((t6 - t1) / (5 * STEPS))
        fit_times.append(C.med(pairs))
    times["fit"] = fit_times
    # a sweep of five learning rates through fit, from a fresh step: how many compilations of
    # the step JAX makes (its backend-compile events, which name the step's loops)
    import jax

    names = []

    def listen(event, duration, fun_name="", **kw):
        if event == "/jax/core/compile/backend_compile_duration" and "paralens_step" in str(fun_name):
            names.append(fun_name)

    jax.monitoring.register_event_duration_secs_listener(listen)
    sweep_model = lens_model(sizes[:1] + [sizes[1] + 1] + sizes[2:])  # widths not yet compiled
    sweep_params = sweep_model.init(jax.random.PRNGKey(0))
    for lr in (0.01, 0.02, 0.05, 0.1, 0.2):
        fit(sweep_model, family, gd(lr), sweep_params, (Xall, Yall), epochs=1,
            batch_size=batch, key=0, progress=False)
    jax.monitoring.unregister_event_duration_listener(listen)
    compiles = len(names)
    C.emit({"config": cfg, "times": times, "sweep_compiles": compiles})


LOOP_COLUMNS = ["train_step, read at end", "jax loop, read at end", "train_step, read every step",
                "jax loop, read every step", "train_step, numpy batches", "jax loop, numpy batches",
                "run", "fit", "jax scan", "torch loop"]


def wall_clock_runs(args, mode: str):
    """([network, loss], the workers' results) for each configuration, timed in `mode` by
    fresh processes with each library's default threads, in wall-clock time."""
    batches = dict(CONFIGS)
    for sizes in args.sizes:
        batch = args.batch or batches.get(sizes, 256)
        for loss in args.losses:
            cfg = {"sizes": sizes, "batch": batch, "loss": loss, "repeats": args.repeats,
                   "target_s": args.target, "mode": mode}
            yield ([f"{sizes} b{batch}", LOSSES[loss]],
                   [C.run_worker(__file__, cfg, threads=0, clock="wall")
                    for _ in range(args.processes)])


def loop_table(args):
    print(f"\n# loops over {STEPS} batches, µs of wall-clock time per step, each library's default "
          f"threads: median [min–max] over {args.repeats} repeats × {args.processes} processes; "
          "ratios: medians of side-by-side pairs\n")
    rows, ratios = [], []
    for name, results in wall_clock_runs(args, "loop"):
        t = {k: sum((r["times"][k] for r in results), []) for k in results[0]["times"]}
        pair = lambda a, b: f"{C.med(C.paired_ratio(t[a], t[b])):.2f}"  # noqa: E731
        fit_ratio = lambda b: f"{C.med(t['fit']) / C.med(t[b]):.2f}"  # noqa: E731
        # what a host batch adds to a step over a device batch, per repeat (side by side)
        added = lambda a, b: C.med([x - y for x, y in zip(t[a], t[b])]) * 1e6  # noqa: E731
        host = (f"{added('train_step, numpy batches', 'train_step, read at end'):.0f} / "
                f"{added('jax loop, numpy batches', 'jax loop, read at end'):.0f}")
        rows.append(name + [C.summary(t[k], 1e6) if k in t else "—" for k in LOOP_COLUMNS])
        ratios.append(name + [pair("train_step, read at end", "jax loop, read at end"),
                              pair("train_step, read every step", "jax loop, read every step"),
                              pair("train_step, numpy batches", "jax loop, numpy batches"), host,
                              pair("run", "jax loop, read at end"),
                              fit_ratio("jax loop, read at end"), pair("run", "jax scan"),
                              fit_ratio("jax scan"),
                              str(max(r["sweep_compiles"] for r in results))])
    print(C.table(["network", "loss"] + [f"{k} µs" for k in LOOP_COLUMNS], rows))
    print()
    print(C.table(["network", "loss", "calls/JAX (read at end)", "calls/JAX (read every step)",
                   "calls/JAX (numpy batches, read at end)",
                   "µs a numpy batch adds: train_step / JAX", "run/JAX loop", "fit/JAX loop", "run/JAX scan", "fit/JAX scan",
                   "compilations, sweep of 5 rates"], ratios))


# -- where a call's time goes -------------------------------------------------------------------

COST_COLUMNS = ["jax", "lens", "lens + state", "step_fn", "call"]


def cost_contestants(sizes, loss, params):
    """(steps, starts): from the hand-written step to a `train_step` call, one difference at
    a time (the lens step; it carrying the state a call carries; the checked step, straight
    line; the call), each with the point it starts from (the same numbers)."""
    import jax
    import jax.numpy as jnp

    from lenses import gd, train_step
    from lenses.training import TrainState

    ts = train_step(lens_model(sizes), loss_family(loss, sizes[-1]), gd(LR))
    lens = lens_step(sizes, loss)

    @jax.jit
    def with_state(state, X, Y):
        p, v = lens(state.params, X, Y)
        count_one = jnp.asarray([1, 0, 0, 0], jnp.int32)  # what a passing step adds to the ledger
        return TrainState(p, state.opt_state, state.ledger + count_one), v

    state0 = ts.init(lens_params(params))
    steps = {"jax": jax_step(sizes, loss), "lens": lens, "lens + state": with_state,
             "step_fn": jax.jit(ts.step_fn), "call": ts}
    starts = {name: state0 for name in steps}
    starts["jax"] = [tuple(jnp.asarray(a) for a in wb) for wb in params]
    starts["lens"] = state0.params
    return steps, starts


def cost_agreement(steps, starts, X, Y) -> dict:
    """The relative difference of one step of each contestant from the hand-written step's."""
    import numpy as np

    def layers(name, x):  # the (W, b) pairs of what a step returned
        p = x if name in ("jax", "lens") else x.params
        return [tuple(np.asarray(a) for a in wb) for wb in p if wb is not None]

    ref = layers("jax", steps["jax"](starts["jax"], X, Y)[0])
    return {name: relative_error(layers(name, fn(starts[name], X, Y)[0]), ref)
            for name, fn in steps.items()}


def cost_worker(cfg):
    """Wall clock per call of loops over STEPS batches read at the end, for each of
    `cost_contestants` (over the loop table's batches)."""
    import jax
    import jax.numpy as jnp

    sizes, batch, loss = [int(s) for s in cfg["sizes"].split("-")], cfg["batch"], cfg["loss"]
    params, X, Y = data(sizes, batch, loss)
    Xb, Yb = epoch_data(sizes, batch, loss)[4:]
    steps, starts = cost_contestants(sizes, loss, params)
    errors = cost_agreement(steps, starts, jnp.asarray(X), jnp.asarray(Y))
    box = dict(starts)

    def loop(name):
        def run():
            x, fn = box[name], steps[name]
            for X1, Y1 in zip(Xb, Yb):
                x, _ = fn(x, X1, Y1)
            jax.block_until_ready(x)
            box[name] = x
        return run

    fns = {name: loop(name) for name in steps}
    for f in fns.values():
        f()  # compile and warm up
    times = C.interleaved(fns, cfg["repeats"], cfg["target_s"])
    C.emit({"config": cfg, "times": {k: [t / STEPS for t in v] for k, v in times.items()},
            "errors": errors})


def cost_table(args):
    print(f"\n# where a call's time goes: loops over {STEPS} batches read at the end, µs of "
          f"wall-clock time per call, each library's default threads: median [min–max] over "
          f"{args.repeats} repeats × {args.processes} processes; ratios to the hand-written "
          "JAX step: medians of side-by-side pairs\n")
    rows, failures = [], []
    for name, results in wall_clock_runs(args, "cost"):
        t = {k: sum((r["times"][k] for r in results), []) for k in COST_COLUMNS}
        err = max(max(r["errors"].values()) for r in results)
        if err > 1e-5:
            failures.append(f"{' '.join(name)}: parameters differ by {err:.2g} (relative)")
        rows.append(name + [C.summary(t[k], 1e6) for k in COST_COLUMNS]
                    + [f"{C.med(C.paired_ratio(t[k], t['jax'])):.2f}" for k in COST_COLUMNS[1:]]
                    + [f"{err:.1e}"])
    print(C.table(["network", "loss"] + [f"{k} µs" for k in COST_COLUMNS]
                  + [f"{k}/JAX" for k in COST_COLUMNS[1:]] + ["max rel. diff after 1 step"], rows))
    if failures:
        print("\nPARAMETERS DISAGREE:\n" + "\n".join(failures))
        sys.exit(1)


# -- the driver ----------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--sizes", nargs="*", default=[s for s, _ in CONFIGS],
                    help="layer widths, e.g. 4-16-3 (batch sizes: 32, 256, 256 for the defaults)")
    ap.add_argument("--batch", type=int, default=None, help="batch size for every --sizes given")
    ap.add_argument("--losses", nargs="*", default=list(LOSSES), choices=list(LOSSES))
    ap.add_argument("--target", type=float, default=0.15, help="seconds per timed repeat (default 0.15)")
    ap.add_argument("--tables", nargs="*", default=["step", "loop"], choices=["step", "loop", "cost"],
                    help="step: one step, CPU time (by default); loop: the loops users run "
                         "(train_step, fit), wall clock, default threads; cost: where a "
                         "train_step call's time goes, wall clock")
    C.add_common_args(ap, processes=2, repeats=5)
    args = ap.parse_args()
    if args.worker:
        cfg = json.loads(args.worker)
        return {"loop": loop_worker, "cost": cost_worker}.get(cfg.get("mode"), worker)(cfg)
    C.setup(args)

    print(f"# bench/step.py — {C.machine(args)}")
    if "step" in args.tables:
        step_table(args)
    if "loop" in args.tables:
        loop_table(args)
    if "cost" in args.tables:
        cost_table(args)


def step_table(args):
    batches = dict(CONFIGS)
    print(f"# µs ({args.clock} time) per step: median [min–max] over {args.repeats} repeats × {args.processes} processes; "
          "ratios: median of side-by-side pairs\n")
    rows, failures = [], []
    for sizes in args.sizes:
        batch = args.batch or batches.get(sizes, 256)
        for loss in args.losses:
            cfg = {"sizes": sizes, "batch": batch, "loss": loss, "repeats": args.repeats,
                   "target_s": args.target}
            results = [C.run_worker(__file__, cfg, threads=args.threads) for _ in range(args.processes)]
            times = {k: sum((r["times"][k] for r in results), []) for k in results[0]["times"]}
            comp = {k: [r["compile_s"][k] for r in results] for k in results[0]["compile_s"]}
            err = max(max(r["errors"].values()) for r in results)
            if err > 1e-5:
                failures.append(f"{sizes} {loss}: parameters differ by {err:.2g} (relative)")
            lj = C.med(C.paired_ratio(times["lens"], times["jax"]))
            tj = C.med(C.paired_ratio(times["train_step"], times["jax"]))
            lt = C.med(C.paired_ratio(times["lens"], times["torch"]))
            rows.append([f"{sizes} b{batch}", LOSSES[loss]]
                        + [C.summary(times[k], 1e6) for k in ("lens", "train_step", "jax", "torch", "numpy")]
                        + [f"{lj:.3f}", f"{tj:.3f}", f"{lt:.2f}",
                           f"{C.med(comp['lens']):.2f} / {C.med(comp['jax']):.2f}", f"{err:.1e}"])
    print(C.table(["network", "loss", "lens µs", "train_step µs", "JAX µs", "torch µs", "numpy µs",
                   "lens/JAX", "train_step/JAX", "lens/torch", "compile s lens / JAX",
                   "max rel. diff after 1 step"], rows))
    if failures:
        print("\nPARAMETERS DISAGREE:\n" + "\n".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
