"""One training step of a transformer block and of the tiny language model: lens expression
against the same network written directly in JAX.

  block  transformer_block(d, heads, 4d) on batches of R^{T×d}, mean half squared error
         against random targets, SGD
  lm     examples/tiny_lm.py's model (embedding, dropout keyed per example, positions,
         repeat(transformer_block, L), layer_norm, dense to the vocabulary), mean
         next-character cross-entropy, SGD

  lens   the model as a lens expression; the step written with the public API
         (batched(model).vjp, dL of the batch loss, p − η·sharp(p')), jax.jit-compiled
  jax    the same network written directly in JAX on batched arrays (einsums over the batch
         axis, lax.scan over the blocks of the LM), jax.value_and_grad + jax.jit

Both start from the same float32 point; before timing, the script checks that one step gives
the same new parameters (relative 1e-4). Each configuration runs in fresh processes, the two
contestants interleaved within each; compile time is reported apart from step time.

    .venv/bin/python bench/modern.py                  # both configurations
    .venv/bin/python bench/modern.py --configs block --repeats 9
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

CONFIGS = {"block": dict(T=32, d=64, heads=4, batch=32),
           "lm": dict(T=32, d=64, heads=4, layers=2, batch=32, rate=0.1)}
LR = 0.05


# -- the network written directly in JAX (batched arrays, batch axis first) ------------------------

def jax_block(x, p, heads):
    """The pre-norm block on x of shape (B, T, d), reading the lens's point for its arrays."""
    import jax
    import jax.numpy as jnp

    att, mlp = p[1][0], p[4][0]
    (g1, b1), ((wq, bq), (wk, bk)), (wv, bv), (wo, bo) = att[0], att[3][0], att[3][1], att[5]
    (g2, b2), (w1, c1), (w2, c2) = mlp[0], mlp[1], mlp[3]
    B, T, d = x.shape
    dh = d // heads

    def ln(x, g, b):
        mu = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + 1e-5) * g[None, None, :] + b[None, None, :]

    def lin(x, w, b):
        return jnp.einsum("btd,od->bto", x, w) + b[None, None, :]

    h = ln(x, g1, b1)
    q, k, v = (jnp.reshape(lin(h, w, b), (B, T, heads, dh)) for w, b in ((wq, bq), (wk, bk), (wv, bv)))
    s = jnp.einsum("bthc,bshc->bhts", q, k) * (1.0 / math.sqrt(dh))
    mask = jnp.tril(jnp.ones((T, T), bool))[None, None, :, :]
    s = jnp.where(mask, s, jnp.finfo(s.dtype).min)
    a = jnp.reshape(jnp.einsum("bhts,bshc->bthc", jax.nn.softmax(s, axis=-1), v), (B, T, d))
    x = x + lin(a, wo, bo)
    u = lin(ln(x, g2, b2), w1, c1)
    return x + lin(jax.nn.gelu(u, approximate=False), w2, c2)


def jax_lm(xk, p, cfg):
    import jax
    import jax.numpy as jnp

    tokens, keys = xk
    (E, _), _, P, blocks, (g, b), (W, c) = p  # ((embedding ⊗ id), dropout, positions, repeat, ln, head)
    T, d, rate = cfg["T"], cfg["d"], cfg["rate"]
    h = jnp.take(E.T, tokens, axis=0)  # (B, T, d)
    keep = jax.vmap(lambda k: jax.random.bernoulli(k, 1.0 - rate, (T, d)))(keys)
    h = jnp.where(keep, h / (1.0 - rate), 0.0) + P[None]
    h = jax.lax.scan(lambda h, q: (jax_block(h, q, cfg["heads"]), None), h, blocks)[0]
    mu = jnp.mean(h, axis=-1, keepdims=True)
    var = jnp.mean((h - mu) ** 2, axis=-1, keepdims=True)
    h = (h - mu) * jax.lax.rsqrt(var + 1e-5) * g[None, None, :] + b[None, None, :]
    return jnp.einsum("btd,od->bto", h, W) + c[None, None, :]


# -- the worker ------------------------------------------------------------------------------------

def setup(name, cfg):
    """(lens model, point, X, Y, lens step, jax step)."""
    import functools

    import jax
    import jax.numpy as jnp
    import numpy as np

    from categories import R
    from lenses import Euclidean, batch_loss, batched, dL, sequence_cross_entropy, transformer_block

    rng = np.random.default_rng(0)
    T, d, B = cfg["T"], cfg["d"], cfg["batch"]
    if name == "block":
        model = transformer_block(d, cfg["heads"], 4 * d).at(R(T, d))
        X = jnp.asarray(rng.standard_normal((B, T, d)), jnp.float32)
        Y = jnp.asarray(rng.standard_normal((B, T, d)), jnp.float32)
        lens = C.lens_sgd_step(model, LR)

        def objective(p, X, Y):
            return jnp.mean(0.5 * jnp.sum((jax_block(X, p, cfg["heads"]) - Y) ** 2, axis=(1, 2)))
    else:
        sys.path.insert(0, os.path.join(C.ROOT, "examples"))
        from tiny_lm import keys_for, language_model, windows, zen

        text = zen()
        chars = sorted(set(text))
        V = len(chars)
        codes = np.array([chars.index(ch) for ch in text], dtype=np.int32)
        model = language_model(V, T, d, cfg["heads"], cfg["layers"], cfg["rate"])
        x, y = windows(codes, T, rng.integers(0, len(codes) - T - 1, B))
        X, Y = (jnp.asarray(x), keys_for(jax.random.PRNGKey(1), B)), jnp.asarray(y)
        family, metric = functools.partial(sequence_cross_entropy, classes=V), Euclidean()

        def lens(p, X, Y):
            out, pull = batched(model).vjp(X, p)
            L = batch_loss(family, Y, reduction="mean")
            _, p_cov = pull(dL(L, out))
            return p - LR * metric.sharp(p, p_cov), L.fn(out)

        def objective(p, X, Y):
            logp = jax.nn.log_softmax(jax_lm(X, p, cfg), axis=-1)
            return -jnp.mean(jnp.take_along_axis(logp, Y[..., None], axis=-1))

    def jx(p, X, Y):
        value, g = jax.value_and_grad(objective)(p, X, Y)
        return jax.tree_util.tree_map(lambda w, dw: w - LR * dw, p, g), value

    p = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), model.init(jax.random.PRNGKey(0)))
    return model, p, X, Y, jax.jit(lens), jax.jit(jx)


def worker(name, cfg):
    import jax
    import numpy as np

    jax.jit(lambda x: x + 1).lower(1.0).compile()  # the backend's start-up, charged to neither
    model, p, X, Y, lens, jx = setup(name, cfg)
    compile_s, compiled = {}, {}
    for who, fn in (("lens", lens), ("jax", jx)):
        t = C.clock()
        compiled[who] = fn.lower(p, X, Y).compile()
        compile_s[who] = C.clock() - t

    new = {who: fn(p, X, Y) for who, fn in compiled.items()}
    pairs = list(zip(jax.tree_util.tree_leaves(new["lens"][0]), jax.tree_util.tree_leaves(new["jax"][0])))
    # a real comparison: one pair per parameter array, and the step moved every one of them
    assert len(pairs) == len(jax.tree_util.tree_leaves(p)) == len(jax.tree_util.tree_leaves(new["jax"][0]))
    moved = min(float(np.max(np.abs(np.asarray(b) - np.asarray(a0))))
                for (_, b), a0 in zip(pairs, jax.tree_util.tree_leaves(p)))
    assert moved > 0, "the JAX step left a parameter array where it was"
    error = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / max(np.max(np.abs(np.asarray(b))), 1e-30))
                for a, b in pairs)
    loss_gap = abs(float(new["lens"][1]) - float(new["jax"][1]))

    box = {"lens": p, "jax": p}

    def run(who):
        def go():
            box[who], v = compiled[who](box[who], X, Y)
            v.block_until_ready()
        return go

    times = C.interleaved({"lens": run("lens"), "jax": run("jax")}, cfg["repeats"], cfg["target_s"])
    C.emit({"times": times, "compile_s": compile_s, "error": error, "loss_gap": loss_gap,
            "n_params": int(model.param.size)})


# -- the driver ------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--target", type=float, default=0.3, help="seconds per timed repeat (default 0.3)")
    C.add_common_args(ap, processes=2, repeats=5)
    args = ap.parse_args()
    if args.worker:
        job = json.loads(args.worker)
        return worker(job.pop("name"), job)
    C.setup(args)

    print(f"# bench/modern.py — {C.machine(args)}")
    print(f"# µs ({args.clock} time) per step: median [min–max] over {args.repeats} repeats × "
          f"{args.processes} processes; lens/JAX: median of side-by-side pairs\n")
    rows, failures = [], []
    for name in args.configs:
        cfg = dict(CONFIGS[name], repeats=args.repeats, target_s=args.target)
        results = [C.run_worker(__file__, dict(cfg, name=name), threads=args.threads)
                   for _ in range(args.processes)]
        times = {k: sum((r["times"][k] for r in results), []) for k in ("lens", "jax")}
        comp = {k: [r["compile_s"][k] for r in results] for k in ("lens", "jax")}
        err = max(r["error"] for r in results)
        if err > 1e-4:
            failures.append(f"{name}: parameters differ by {err:.2g} (relative) after one step")
        shape = ", ".join(f"{k}={v}" for k, v in CONFIGS[name].items())
        rows.append([name, shape, results[0]["n_params"], C.summary(times["lens"], 1e6),
                     C.summary(times["jax"], 1e6),
                     f"{C.med(C.paired_ratio(times['lens'], times['jax'])):.3f}",
                     f"{C.med(comp['lens']):.2f} / {C.med(comp['jax']):.2f}", f"{err:.1e}"])
    print(C.table(["network", "sizes", "params", "lens µs", "JAX µs", "lens/JAX",
                   "compile s lens / JAX", "max rel. diff after 1 step"], rows))
    if failures:
        print("\nPARAMETERS DISAGREE:\n" + "\n".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
