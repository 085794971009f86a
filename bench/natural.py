"""K-FAC on digits: this library's `KFAC` against kfac-jax, fixed and adaptive, with Adam.

The same MLP 64-32-10 (tanh) on sklearn's bundled digits (pixels / 16), full-batch on a
training split of 1200 images, mean softmax cross-entropy, float32, from the initial points
of `--seeds` seeds (init keys 0, 1, ...):

  kfac            train_step(net, CE, gd(lr, metric=KFAC(λ, decay=ε, inverse_period=T_i,
                  model=net))): the library's public API, one call a step
  kfac-jax        kfac_jax.Optimizer with the same fixed λ, curvature_ema = ε,
                  inverse_update_period = T_i, the exact Fisher ("fisher_exact"), exact
                  inverses (λ added to the eigenvalues, as `KFAC` solves), the same learning
                  rate, no momentum
  kfac adaptive   gd(1.0, metric=KFAC(λ₀, decay=ε, inverse_period=T_i, rescale=True,
                  adapt_damping=True, damping_period=5, omega=0.9**5, model=net)): the
                  paper's rescaled step δ = αΔ + μδ₀ and Levenberg–Marquardt damping
  kfac-jax adaptive  kfac_jax.Optimizer with use_adaptive_learning_rate,
                  use_adaptive_momentum and use_adaptive_damping (initial damping λ₀, interval
                  5, decay 0.9 a step, the damping included in ρ's quadratic model as
                  `KFAC`'s ρ includes it)
  adam            train_step with adam(lr)

Tuning, on seed 0: both fixed K-FACs over the same grid (learning rate × damping × inverse
period), Adam over its learning rates, the adaptive ones over their initial damping; the
setting with the fewest steps to `--target` is chosen (ties: the smaller learning rate, the
larger damping). Then every method at its chosen setting runs from each seed: steps to the
target (the loss before step k + 1 is at most the target), median and [min–max]. CPU time
per step (`time.process_time`, one thread for XLA): `--repeats` rounds, each running every
method for `--timed-steps` steps in turn (interleaved), the median per round; reported as the
median and [min–max] over rounds, with the load average before and after.

Checks (the script stops on failure): the first step of kfac and kfac-jax lands on the same
point to 1e-5 relative, fixed and adaptive; at every learning rate of the grid at which both
fixed K-FACs reach the target from every seed (at the chosen damping and period), their
step counts' [min–max] ranges overlap.

    .venv-bench/bin/python bench/natural.py            # a few minutes
    .venv-bench/bin/python bench/natural.py --seeds 5 --repeats 5
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time

if __name__ == "__main__":  # one XLA thread for the timing (not when the suite imports this)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen"
                               "=false intra_op_parallelism_threads=1").strip()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout

import jax  # noqa: E402
import jax.extend  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from lenses import KFAC, adam, dense, gd, softmax_cross_entropy, tanh, train_step  # noqa: E402

SIZES = (64, 32, 10)
CE = softmax_cross_entropy(classes=10)
LRS = (0.1, 0.2, 0.3, 0.5, 1.0)
DAMPINGS = (0.001, 0.003, 0.01, 0.03, 0.1)
PERIODS = (1, 5)
ADAM_LRS = (0.01, 0.03, 0.1, 0.3)
INTERVAL, DECAY_STEP = 5, 0.9  # kfac-jax's damping adaptation: every 5 steps, by 0.9 a step


def digits(n_train: int = 1200):
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(X))[:n_train]
    return jnp.asarray(X[order] / 16.0, jnp.float32), jnp.asarray(y[order], jnp.int32)


def network(sizes=SIZES):
    return dense(sizes[0], sizes[1]) >> tanh >> dense(sizes[1], sizes[2])


# -- the two sides -----------------------------------------------------------------------------

def library_runner(net, opt, p0, X, Y):
    """(start, step): a fresh TrainState, and one step returning (state, loss before it)."""
    step = train_step(net, CE, opt)

    def one(state):
        state, report = step(state, X, Y)
        return state, float(report.loss)

    return (lambda: step.init(p0)), one


def kfac_fixed(net, lr, damping, decay, period):
    return gd(lr, metric=KFAC(damping, decay=decay, inverse_period=period, model=net))


def kfac_adaptive(net, damping, decay, period):
    return gd(1.0, metric=KFAC(damping, decay=decay, inverse_period=period, rescale=True,
                               adapt_damping=True, damping_period=INTERVAL,
                               omega=DECAY_STEP ** INTERVAL, model=net))


def to_kfac_jax(p):
    (W1, b1), _, (W2, b2) = p
    return ((W1.T, b1), (W2.T, b2))


def from_kfac_jax(q):
    (W1, b1), (W2, b2) = q
    return ((W1.T, b1), None, (W2.T, b2))


def _kfac_jax():
    """kfac_jax, made to run on this jax: kfac-jax 0.0.8 evaluates traced equations with
    `primitive.get_bind_params` returning (subfunctions, params), which newer jax (0.10)
    returns as params alone (subfunctions inside); its one evaluator is replaced by one that
    reads either form. Nothing else of kfac-jax is touched."""
    import kfac_jax
    from kfac_jax._src import tag_graph_matcher as tgm

    def eval_jaxpr_eqn(eqn, in_values):
        params = eqn.primitive.get_bind_params(eqn.params)
        args = list(in_values)
        if isinstance(params, tuple):  # the older jax
            subfuns, params = params
            args = [*subfuns, *args]
        with jax.extend.source_info_util.user_context(eqn.source_info.traceback):
            out = eqn.primitive.bind(*args, **params)
        return out if isinstance(out, list) else [out]

    try:
        eqn_api_new = not isinstance(jax.core.Primitive("probe").get_bind_params({}), tuple)
    except Exception:  # noqa: BLE001
        eqn_api_new = True
    if eqn_api_new:
        tgm.eval_jaxpr_eqn = eval_jaxpr_eqn
    return kfac_jax


_OPTIMIZERS = {}


def _kfac_jax_optimizer(loss, decay, period, adaptive_damping):
    """One kfac_jax.Optimizer per structure (its learning rate and damping are arguments of
    its step), so that a sweep compiles once; adaptive ones per initial damping."""
    key = (decay, period, adaptive_damping)
    if key not in _OPTIMIZERS:
        kfac_jax, adaptive = _kfac_jax(), adaptive_damping is not None
        extra = dict(initial_damping=adaptive_damping, include_damping_in_quad_change=True,
                     damping_adaptation_interval=INTERVAL,
                     damping_adaptation_decay=DECAY_STEP) if adaptive else {}
        _OPTIMIZERS[key] = kfac_jax.Optimizer(
            value_and_grad_func=jax.value_and_grad(loss), l2_reg=0.0,
            use_adaptive_learning_rate=adaptive, use_adaptive_momentum=adaptive,
            use_adaptive_damping=adaptive, estimation_mode="fisher_exact",
            curvature_ema=decay, curvature_update_period=1, inverse_update_period=period,
            use_exact_inverses=True, num_burnin_steps=0, multi_device=False, **extra)
    return _OPTIMIZERS[key]


def _loss(params, batch):
    """The network as kfac-jax sees it, its loss registered."""
    x, y = batch
    (W1, b1), (W2, b2) = params
    logits = jnp.tanh(x @ W1 + b1) @ W2 + b2
    _kfac_jax().register_softmax_cross_entropy_loss(logits, y)
    return jnp.mean(jax.nn.logsumexp(logits, axis=1) - jnp.take_along_axis(
        logits, y[:, None], axis=1)[:, 0])


def kfac_jax_runner(p0, X, Y, lr, damping, decay, period, adaptive=False):
    """(start, step) of kfac_jax.Optimizer: fixed (lr, damping, no momentum), or adaptive
    (learning rate, momentum and damping from its quadratic model; `damping` the first)."""
    opt = _kfac_jax_optimizer(_loss, decay, period, damping if adaptive else None)
    batch, rng = (X, Y), jax.random.PRNGKey(0)
    q0 = to_kfac_jax(p0)
    fixed = {} if adaptive else dict(
        learning_rate=jnp.asarray(lr, jnp.float32), momentum=jnp.asarray(0.0, jnp.float32),
        damping=jnp.asarray(damping, jnp.float32))

    def start():
        # Copies: kfac-jax donates the parameters' buffers to its step, and the biases of q0
        # are the very arrays of p0, which the other methods start from.
        q = jax.tree_util.tree_map(jnp.copy, q0)
        return [q, opt.init(q, rng, batch), 0]

    def one(s):
        q, state, k = s
        q, state, stats = opt.step(q, state, rng, batch=batch, global_step_int=k, **fixed)
        return [q, state, k + 1], float(stats["loss"])

    return start, one


# -- measuring ---------------------------------------------------------------------------------

def steps_to(start, one, target, max_steps):
    """Steps until the loss before the next step is at most `target`; None if it never is
    (or the loss stops being finite)."""
    s = start()
    for k in range(max_steps + 1):
        s, loss = one(s)
        if not np.isfinite(loss):
            return None
        if loss <= target:
            return k
    return None


def cpu_per_step(start, one, n):
    """The median CPU time (`time.process_time`) of steps 2..n+1 of a run (the first is not
    timed: it may compile)."""
    s, _ = one(start())
    times = []
    for _ in range(n):
        t = time.process_time()
        s, _ = one(s)
        times.append(time.process_time() - t)
    return statistics.median(times)


def relative(a, b):
    return max(float(jnp.max(jnp.abs(u - v)) / jnp.max(jnp.abs(u)))
               for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def first_step_agreement(net, p0, X, Y, lr, damping, decay, period):
    """Max relative difference of the parameters after one step, kfac against kfac-jax:
    {"fixed": .., "adaptive": ..}."""
    out = {}
    for mode, opt in (("fixed", kfac_fixed(net, lr, damping, decay, period)),
                      ("adaptive", kfac_adaptive(net, damping, decay, period))):
        start, one = library_runner(net, opt, p0, X, Y)
        state, _ = one(start())
        kstart, kone = kfac_jax_runner(p0, X, Y, lr, damping, decay, period, mode == "adaptive")
        (q, _, _), _ = kone(kstart())
        out[mode] = relative(state.params, from_kfac_jax(q))
    return out


def span(values):
    got = [v for v in values if v is not None]
    if not got:
        return "never"
    text = f"{statistics.median(got):g} [{min(got)}–{max(got)}]"
    return text if len(got) == len(values) else f"{text}, {len(values) - len(got)} never"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--timed-steps", type=int, default=10)
    ap.add_argument("--target", type=float, default=0.1, help="training loss to reach")
    ap.add_argument("--max-steps", type=int, default=300)
    ap.add_argument("--decay", type=float, default=0.95)
    args = ap.parse_args(argv)
    began = time.perf_counter()

    X, Y = digits()
    net = network()
    starts = [net.init(jax.random.PRNGKey(s)) for s in range(args.seeds)]
    load = [round(v, 2) for v in os.getloadavg()]
    first = first_step_agreement(net, starts[0], X, Y, 0.3, 0.1, args.decay, 1)
    print("first step, kfac against kfac-jax, max relative difference: "
          + ", ".join(f"{k} {v:.1e}" for k, v in first.items()))
    assert max(first.values()) < 1e-5, first

    def count(kind, p0, lr=None, damping=None, period=None):
        if kind == "kfac":
            start, one = library_runner(net, kfac_fixed(net, lr, damping, args.decay, period),
                                        p0, X, Y)
        elif kind == "kfac-jax":
            start, one = kfac_jax_runner(p0, X, Y, lr, damping, args.decay, period)
        elif kind == "kfac adaptive":
            start, one = library_runner(net, kfac_adaptive(net, damping, args.decay, period),
                                        p0, X, Y)
        elif kind == "kfac-jax adaptive":
            start, one = kfac_jax_runner(p0, X, Y, None, damping, args.decay, period, True)
        else:
            start, one = library_runner(net, adam(lr), p0, X, Y)
        return start, one

    grids = {"kfac": list(itertools.product(LRS, DAMPINGS, PERIODS)),
             "kfac-jax": list(itertools.product(LRS, DAMPINGS, PERIODS)),
             "kfac adaptive": [(None, d, 1) for d in DAMPINGS],
             "kfac-jax adaptive": [(None, d, 1) for d in DAMPINGS],
             "adam": [(lr, None, None) for lr in ADAM_LRS]}
    chosen, tables = {}, {}
    for kind, grid in grids.items():
        table = {}
        for lr, damping, period in grid:
            table[(lr, damping, period)] = steps_to(*count(kind, starts[0], lr, damping, period),
                                                    args.target, args.max_steps)
        tables[kind] = table
        # fewest steps; ties: the smaller learning rate, then the larger damping
        chosen[kind] = min((k for k in table if table[k] is not None),
                           key=lambda k: (table[k], k[0] or 0, -(k[1] or 0)))
    print(f"\ntuning on seed 0, steps to training loss {args.target} (— never within "
          f"{args.max_steps}):")
    for kind in ("kfac", "kfac-jax"):
        for period in PERIODS:
            print(f"\n{kind}, inverse period {period}: rows lr {LRS}, columns damping {DAMPINGS}")
            for lr in LRS:
                row = [tables[kind][(lr, d, period)] for d in DAMPINGS]
                print(f"  {lr:<4} " + " ".join(f"{'—' if v is None else v:>5}" for v in row))
    for kind in ("kfac adaptive", "kfac-jax adaptive", "adam"):
        print(f"\n{kind}: " + ", ".join(f"{k[0] if k[0] is not None else k[1]}: "
                                        f"{'—' if v is None else v}"
                                        for k, v in tables[kind].items()))
    axes = {"kfac": (LRS, DAMPINGS), "kfac-jax": (LRS, DAMPINGS),
            "kfac adaptive": (None, DAMPINGS), "kfac-jax adaptive": (None, DAMPINGS),
            "adam": (ADAM_LRS, None)}
    for kind, (lrs, dampings) in axes.items():
        lr, d, period = chosen[kind]
        edge = [name for name, v, axis in (("lr", lr, lrs), ("damping", d, dampings))
                if axis is not None and v in (axis[0], axis[-1])]
        print(f"{kind} chosen: lr {lr}, damping {d}, inverse period {period}; "
              + (f"on the grid's edge in {', '.join(edge)}" if edge else "interior"))

    # every seed, each method at its chosen setting
    per_seed = {kind: [steps_to(*count(kind, p0, *chosen[kind]), args.target, args.max_steps)
                       for p0 in starts] for kind in grids}
    # agreement: at the chosen damping and period of kfac, every lr at which both converge
    lr0, d0, period0 = chosen["kfac"]
    agree = []
    for lr in LRS:
        a = [steps_to(*count("kfac", p0, lr, d0, period0), args.target, args.max_steps)
             for p0 in starts]
        b = [steps_to(*count("kfac-jax", p0, lr, d0, period0), args.target, args.max_steps)
             for p0 in starts]
        both = None not in a and None not in b
        overlap = both and min(a) <= max(b) and min(b) <= max(a)
        agree.append((lr, span(a), span(b), "both converge" if both else "not both",
                      overlap if both else None))
    print(f"\nkfac against kfac-jax at damping {d0}, inverse period {period0}, every lr, "
          f"steps over {args.seeds} seeds:")
    for row in agree:
        print("  lr {}: kfac {}, kfac-jax {} ({}{})".format(
            *row[:4], "" if row[4] is None else ", ranges overlap" if row[4] else ", DISAGREE"))
    assert all(row[4] in (None, True) for row in agree), agree

    # CPU time per step, interleaved
    runners = {kind: count(kind, starts[0], *chosen[kind]) for kind in grids}
    times = {kind: [] for kind in grids}
    for _ in range(args.repeats):
        for kind, (start, one) in runners.items():
            times[kind].append(cpu_per_step(start, one, args.timed_steps))
    load_after = [round(v, 2) for v in os.getloadavg()]

    print(f"\nMLP {'-'.join(map(str, SIZES))} tanh, digits (1200 training images, full batch), "
          f"float32, target training loss {args.target}, decay {args.decay}; {args.seeds} seeds; "
          f"CPU time per step over {args.repeats} interleaved rounds of {args.timed_steps} steps, "
          f"one XLA thread; load average (1, 5, 15 min) {load} before, {load_after} after\n")
    print("| method | setting (lr, damping, inverse period) | steps to target, median [min–max] "
          "| CPU ms / step, median [min–max] | CPU ms to target (median steps × median ms) |")
    print("|---|---|---|---|---|")
    for kind in grids:
        lr, d, period = chosen[kind]
        setting = ", ".join(str(v) for v in (lr if lr is not None else "adaptive", d, period)
                            if v is not None)
        ms = [1e3 * t for t in times[kind]]
        steps = [v for v in per_seed[kind] if v is not None]
        total = f"{statistics.median(steps) * statistics.median(ms):.0f}" if steps else "—"
        print(f"| {kind} | {setting} | {span(per_seed[kind])} | "
              f"{statistics.median(ms):.2f} [{min(ms):.2f}–{max(ms):.2f}] | {total} |")
    print(f"\n(the whole run: {time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
