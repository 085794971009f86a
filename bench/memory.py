"""Memory and time of the store rule against the recompute rule, on a deep chain.

A chain of n dense layers of width 64 with tanh, at a batch large enough that the kept
activations dominate memory (batch × width floats per layer). Contestants:
  store            the lens chain (the default rule: every forward value kept)
  recompute-sqrt   checkpoint(chain, segments="sqrt"): k ≈ √(2n) runs, each recomputed alone
  recompute-whole  checkpoint(chain): the chain recomputed as one piece (keeps only its input,
                   but the recomputation then holds every value again: no saving expected)
  repeat           repeat(dense ≫ tanh, n) (a scan; store rule)
  repeat-remat     repeat(dense ≫ tanh, n, remat=True): each copy recomputed in the reverse scan
  jax              hand-written value_and_grad, for reference
  jax-checkpoint   hand-written with jax.checkpoint around each of √(2n) runs: XLA's CPU
                   pipeline removes the optimisation barriers before CSE, merging the
                   recomputation back into the forward pass

Memory is XLA's own account of the compiled step (`compile().memory_analysis()`:
temp_size_in_bytes, the scratch the step needs beyond its arguments and outputs) and the
resident set size of the fresh process (getrusage): its peak up to the end of compiling, and
the peak while stepping above the RSS before the first step (the high-water mark is reset
after compiling through /proc/self/clear_refs).

    .venv/bin/python bench/memory.py
    .venv/bin/python bench/memory.py --depths 128 --batch 4096
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

KINDS = ("store", "recompute-sqrt", "recompute-whole", "repeat", "repeat-remat", "jax", "jax-checkpoint")
LR = 0.01


def build(kind, n, width):
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    W = jnp.asarray(rng.standard_normal((n, width, width)).astype(np.float32) / np.sqrt(width))
    b = jnp.asarray((0.1 * rng.standard_normal((n, width))).astype(np.float32))

    if kind.startswith("jax"):
        runs = max(1, round(math.sqrt(2 * n))) if kind == "jax-checkpoint" else 1
        bounds = [(n * i // runs, n * (i + 1) // runs) for i in range(runs)]

        def segment(h, p):
            for Wi, bi in p:
                h = jnp.tanh(h @ Wi.T + bi)
            return h

        seg = jax.checkpoint(segment) if runs > 1 else segment

        def objective(p, X, Y):
            h = X
            for lo, hi in bounds:
                h = seg(h, p[lo:hi])
            return jnp.mean(0.5 * jnp.sum((h - Y) ** 2, axis=-1))

        def step(p, X, Y):
            value, g = jax.value_and_grad(objective)(p, X, Y)
            return jax.tree_util.tree_map(lambda w, d: w - LR * d, p, g), value

        return step, [(W[i], b[i]) for i in range(n)]

    from lenses import checkpoint, dense, repeat, tanh
    if kind.startswith("repeat"):
        model = repeat(dense(width, width) >> tanh, n, remat=kind == "repeat-remat")
        p = ((W, b), None)
    else:
        model = dense(width, width) >> tanh
        for _ in range(n - 1):
            model = model >> dense(width, width) >> tanh
        if kind == "recompute-sqrt":
            model = checkpoint(model, segments="sqrt")
        elif kind == "recompute-whole":
            model = checkpoint(model)
        p = tuple(x for i in range(n) for x in ((W[i], b[i]), None))
    return C.lens_sgd_step(model, LR), p


def worker(cfg):
    import jax

    n, width, batch = cfg["depth"], cfg["width"], cfg["batch"]
    X = jax.random.normal(jax.random.PRNGKey(1), (batch, width))
    Y = jax.random.normal(jax.random.PRNGKey(2), (batch, width))
    step, p = build(cfg["kind"], n, width)
    compiled = jax.jit(step).lower(p, X, Y).compile()
    mem = compiled.memory_analysis()
    rss_compiled = C.peak_rss_mib()
    # The peak RSS while stepping, above the RSS the process had before its first step (the
    # high-water mark of compiling is reset away first, where Linux allows it).
    reset = C.reset_peak_rss()
    rss_before = C.current_rss_mib()
    box = [p]

    def run():
        box[0], v = compiled(box[0], X, Y)
        v.block_until_ready()

    steps = C.calibrate(run, cfg["target_s"], max_steps=1000)
    times = [C.timed(run, steps) for _ in range(cfg["repeats"])]
    C.emit({"config": cfg, "temp_mib": mem.temp_size_in_bytes / 2**20,
            "args_mib": mem.argument_size_in_bytes / 2**20, "times": times,
            "rss_compiled_mib": rss_compiled, "rss_peak_mib": C.peak_rss_mib(),
            "rss_stepping_mib": C.peak_rss_mib() - rss_before if reset else float("nan")})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--depths", type=int, nargs="*", default=[64, 128])
    ap.add_argument("--kinds", nargs="*", default=list(KINDS), choices=KINDS)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--target", type=float, default=0.3, help="seconds per timed repeat (default 0.3)")
    C.add_common_args(ap, processes=1, repeats=5)
    args = ap.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    C.setup(args)

    act = args.batch * args.width * 4 / 2**20
    print(f"# bench/memory.py — {C.machine(args)}")
    print(f"# dense({args.width}→{args.width}) ≫ tanh, n times; batch {args.batch} (one activation = "
          f"{act:.2f} MiB); step time: {args.clock} ms, median [min–max] over {args.repeats} repeats × "
          f"{args.processes} process(es)\n")
    rows = []
    for n in args.depths:
        res = {}
        for _ in range(args.processes):
            for kind in args.kinds:
                cfg = {"depth": n, "kind": kind, "width": args.width, "batch": args.batch,
                       "repeats": args.repeats, "target_s": args.target}
                res.setdefault(kind, []).append(C.run_worker(__file__, cfg, threads=args.threads))
        store = res.get("store")
        for kind, rs in res.items():
            temp = C.med([r["temp_mib"] for r in rs])
            t = sum((r["times"] for r in rs), [])
            row = [n, kind, f"{temp:.1f}", f"{C.med([r['rss_compiled_mib'] for r in rs]):.0f}",
                   f"{C.med([r['rss_stepping_mib'] for r in rs]):.0f}", C.summary(t, 1e3)]
            if store:
                st = sum((r["times"] for r in store), [])
                row += [f"{temp / C.med([r['temp_mib'] for r in store]):.2f}", f"{C.med(t) / C.med(st):.2f}"]
            rows.append(row)
    print(C.table(["depth", "rule", "XLA temp MiB", "peak RSS compiling MiB",
                   "peak RSS stepping − RSS before MiB", "step ms", "temp / store", "time / store"], rows))


if __name__ == "__main__":
    main()
