"""Trace and compile time, and step time, against depth.

A chain of n dense layers of width 64 with tanh (squared error, SGD step), built
  lens     as the lens expression dense ≫ tanh ≫ … (n components of each), the step written
           with the public lens API and jax.jit-compiled
  repeat   as repeat(dense ≫ tanh, n): one lens with stacked parameters, a scan
  jax      hand-written: a Python loop over the layers, jax.value_and_grad + jax.jit
  jax-scan hand-written with lax.scan over stacked parameters (the reference for repeat)

Each (depth, contestant) runs in its own fresh processes. Reported apart: building the
expression (Python objects), tracing (jit(...).lower) and XLA compilation (.compile()), and
the step time of the compiled program.

    .venv/bin/python bench/depth.py
    .venv/bin/python bench/depth.py --depths 8 128 --kinds lens jax --processes 5
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

KINDS = ("lens", "repeat", "jax", "jax-scan")
LR = 0.01


def weights(n, width):
    """n seeded float32 (W, b) pairs, the same for every contestant."""
    import jax.numpy as jnp
    import numpy as np
    rng = np.random.default_rng(0)
    W = rng.standard_normal((n, width, width)).astype(np.float32) / np.sqrt(width)
    b = (0.1 * rng.standard_normal((n, width))).astype(np.float32)
    return jnp.asarray(W), jnp.asarray(b), [jnp.asarray(w) for w in W], [jnp.asarray(c) for c in b]


def build(kind, n, width, stacked_W, stacked_b, Ws, bs):
    """(step function, parameters) for one contestant."""
    import jax
    import jax.numpy as jnp

    if kind in ("lens", "repeat"):
        from lenses import dense, repeat, tanh
        if kind == "lens":
            model = dense(width, width) >> tanh
            for _ in range(n - 1):
                model = model >> dense(width, width) >> tanh
            p = tuple(x for W, b in zip(Ws, bs) for x in ((W, b), None))
        else:
            model = repeat(dense(width, width) >> tanh, n)
            p = ((stacked_W, stacked_b), None)
        return C.lens_sgd_step(model, LR), p

    def sgd(objective):
        def step(p, X, Y):
            value, g = jax.value_and_grad(objective)(p, X, Y)
            return jax.tree_util.tree_map(lambda w, d: w - LR * d, p, g), value
        return step

    if kind == "jax":
        def objective(p, X, Y):
            h = X
            for W, b in p:
                h = jnp.tanh(h @ W.T + b)
            return jnp.mean(0.5 * jnp.sum((h - Y) ** 2, axis=-1))

        return sgd(objective), list(zip(Ws, bs))

    def objective(p, X, Y):  # jax-scan
        h, _ = jax.lax.scan(lambda h, Wb: (jnp.tanh(h @ Wb[0].T + Wb[1]), None), X, p)
        return jnp.mean(0.5 * jnp.sum((h - Y) ** 2, axis=-1))

    return sgd(objective), (stacked_W, stacked_b)


def worker(cfg):
    import jax

    jax.jit(lambda x: x + 1).lower(1.0).compile()  # the backend's start-up, charged to no one
    import lenses  # noqa: F401  (importing is not building)
    n, width, batch = cfg["depth"], cfg["width"], cfg["batch"]
    X = jax.random.normal(jax.random.PRNGKey(1), (batch, width))
    Y = jax.random.normal(jax.random.PRNGKey(2), (batch, width))
    params = weights(n, width)
    t0 = C.clock()
    step, p = build(cfg["kind"], n, width, *params)
    t1 = C.clock()
    lowered = jax.jit(step).lower(p, X, Y)
    t2 = C.clock()
    compiled = lowered.compile()
    t3 = C.clock()
    box = [p]

    def run():
        box[0], v = compiled(box[0], X, Y)
        v.block_until_ready()

    steps = C.calibrate(run, cfg["target_s"])
    times = [C.timed(run, steps) for _ in range(cfg["repeats"])]
    C.emit({"config": cfg, "build_s": t1 - t0, "trace_s": t2 - t1, "compile_s": t3 - t2,
            "times": times, "peak_rss_mib": C.peak_rss_mib()})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--depths", type=int, nargs="*", default=[8, 32, 128, 512])
    ap.add_argument("--kinds", nargs="*", default=list(KINDS), choices=KINDS)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--target", type=float, default=0.05, help="seconds per timed repeat (default 0.05)")
    C.add_common_args(ap, processes=3, repeats=5)
    args = ap.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    C.setup(args)

    print(f"# bench/depth.py — {C.machine(args)}")
    print(f"# dense({args.width}→{args.width}) ≫ tanh, n times; batch {args.batch}; seconds are "
          f"{args.clock} time; median [min–max] over {args.processes} fresh processes "
          f"(step time: over {args.repeats} repeats in each)\n")
    res = {}
    for n in args.depths:
        for _ in range(args.processes):  # interleave the contestants process by process
            for kind in args.kinds:
                cfg = {"depth": n, "kind": kind, "width": args.width, "batch": args.batch,
                       "repeats": args.repeats, "target_s": args.target}
                res.setdefault((n, kind), []).append(C.run_worker(__file__, cfg, threads=args.threads))
    rows = []
    for (n, kind), rs in res.items():
        tc = [r["trace_s"] + r["compile_s"] for r in rs]
        row = [n, kind, C.summary([r["build_s"] for r in rs], fmt="{:.2f}"),
               C.summary([r["trace_s"] for r in rs], fmt="{:.2f}"),
               C.summary([r["compile_s"] for r in rs], fmt="{:.2f}"), C.summary(tc, fmt="{:.2f}"),
               C.summary(sum((r["times"] for r in rs), []), 1e6)]
        ref = res.get((n, "jax"))
        if ref and kind != "jax":
            row.append(f"{C.med(tc) / C.med([r['trace_s'] + r['compile_s'] for r in ref]):.2f}")
        else:
            row.append("")
        base = res.get((min(args.depths), kind))
        row.append(f"{C.med(tc) / C.med([r['trace_s'] + r['compile_s'] for r in base]):.2f}" if base else "")
        rows.append(row)
    print(C.table(["depth", "kind", "build s", "trace s", "compile s", "trace+compile s", "step µs",
                   "trace+compile / jax", f"trace+compile / depth {min(args.depths)}"], rows))


if __name__ == "__main__":
    main()
