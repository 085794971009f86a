"""K-FAC on digits: this library's `KFAC` against kfac-jax, with Euclidean gd and Adam beside.

The same MLP 64-32-10 (tanh) on sklearn's bundled digits (pixels / 16), full-batch on a
training split of 1200 images, mean softmax cross-entropy, from the same float32 point:

  kfac       train_step(net, CE, gd(lr, metric=KFAC(λ, decay=ε, factor_period=T_f,
             inverse_period=T_i, model=net))): the library's public API, one call a step
  kfac-jax   kfac_jax.Optimizer with the same λ (fixed), curvature_ema = ε,
             curvature_update_period = T_f, inverse_update_period = T_i, the exact Fisher
             ("fisher_exact"), exact inverses (eigen-decompositions, λ added to the
             eigenvalues, as `KFAC` does), the same learning rate, no momentum
  gd, adam   train_step with gd(lr) and adam(lr) (Euclidean), as references

Before timing, the script checks that the first step of kfac and kfac-jax lands on the same
point (both use the batch's own factors at the first step). Then each method runs `--repeats`
times from the same start until the training loss reaches `--target` (or `--max-steps`),
reading the loss after every step (which waits for the step), after one untimed warm-up run
that compiles everything. Reported, in wall-clock time: the median milliseconds per step (over
every step of every run but the first of each), the steps to the target (the loss before step
k + 1 is at most the target) and the median seconds to reach it. Needs the `bench` extra (kfac-jax).

    .venv/bin/python bench/natural.py
    .venv/bin/python bench/natural.py --repeats 5 --target 0.05
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout

import jax  # noqa: E402
import jax.extend  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from lenses import KFAC, adam, dense, gd, softmax_cross_entropy, tanh, train_step  # noqa: E402

SIZES = (64, 32, 10)
CE = softmax_cross_entropy(classes=10)


def digits(n_train: int = 1200):
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(X))[:n_train]
    return jnp.asarray(X[order] / 16.0, jnp.float32), jnp.asarray(y[order], jnp.int32)


def network():
    return dense(SIZES[0], SIZES[1]) >> tanh >> dense(SIZES[1], SIZES[2])


# -- the two sides -----------------------------------------------------------------------------

def library_runner(net, opt, p0, X, Y):
    """(start, step): a fresh TrainState, and one step returning (state, loss before it)."""
    step = train_step(net, CE, opt)

    def one(state):
        state, report = step(state, X, Y)
        return state, float(report.loss)

    return (lambda: step.init(p0)), one


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


def kfac_jax_runner(p0, X, Y, lr, damping, decay, factor_period, inverse_period):
    kfac_jax = _kfac_jax()

    def loss(params, batch):
        x, y = batch
        (W1, b1), (W2, b2) = params
        logits = jnp.tanh(x @ W1 + b1) @ W2 + b2
        kfac_jax.register_softmax_cross_entropy_loss(logits, y)
        return jnp.mean(jax.nn.logsumexp(logits, axis=1) - jnp.take_along_axis(
            logits, y[:, None], axis=1)[:, 0])

    opt = kfac_jax.Optimizer(
        value_and_grad_func=jax.value_and_grad(loss), l2_reg=0.0,
        use_adaptive_learning_rate=False, use_adaptive_momentum=False,
        use_adaptive_damping=False, estimation_mode="fisher_exact", curvature_ema=decay,
        curvature_update_period=factor_period, inverse_update_period=inverse_period,
        use_exact_inverses=True, num_burnin_steps=0, multi_device=False)
    batch, rng = (X, Y), jax.random.PRNGKey(0)
    q0 = to_kfac_jax(p0)
    lr, damping, zero = (jnp.asarray(v, jnp.float32) for v in (lr, damping, 0.0))

    def start():
        # Copies: kfac-jax donates the parameters' buffers to its step, and the biases of q0
        # are the very arrays of p0, which the other methods start from.
        q = jax.tree_util.tree_map(jnp.copy, q0)
        return [q, opt.init(q, rng, batch), 0]

    def one(s):
        q, state, k = s
        q, state, stats = opt.step(q, state, rng, batch=batch, learning_rate=lr, momentum=zero,
                                   damping=damping, global_step_int=k)
        return [q, state, k + 1], float(stats["loss"])

    return start, one


# -- measuring ---------------------------------------------------------------------------------

def run(start, one, target, max_steps):
    """(seconds of each step after the first, steps to target or None, seconds to target or
    None, the first step included). Run once untimed first, so that nothing compiles here."""
    s = start()
    t0 = time.perf_counter()
    s, loss = one(s)
    first = time.perf_counter() - t0
    times, elapsed, reached = [], first, None
    if loss <= target:
        return times, 0, 0.0
    for k in range(1, max_steps):
        t = time.perf_counter()
        s, loss = one(s)
        dt = time.perf_counter() - t
        times.append(dt)
        elapsed += dt
        if loss <= target:  # the loss before step k + 1: reached after k steps
            reached = k
            break
    return times, reached, (elapsed if reached is not None else None)


def first_step_agreement(args, net, p0, X, Y) -> float:
    """Max relative difference of the parameters after one step, kfac against kfac-jax."""
    opt = gd(args.lr_kfac, metric=KFAC(args.damping, decay=args.decay, model=net,
                                       factor_period=args.factor_period,
                                       inverse_period=args.inverse_period))
    start, one = library_runner(net, opt, p0, X, Y)
    state, _ = one(start())
    kstart, kone = kfac_jax_runner(p0, X, Y, args.lr_kfac, args.damping, args.decay,
                                   args.factor_period, args.inverse_period)
    (q, _, _), _ = kone(kstart())
    a = jax.tree_util.tree_leaves(state.params)
    b = jax.tree_util.tree_leaves(from_kfac_jax(q))
    return max(float(jnp.max(jnp.abs(u - v)) / jnp.max(jnp.abs(u))) for u, v in zip(a, b))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--target", type=float, default=0.1, help="training loss to reach")
    ap.add_argument("--max-steps", type=int, default=1000)
    ap.add_argument("--damping", type=float, default=0.1)
    ap.add_argument("--decay", type=float, default=0.95)
    ap.add_argument("--factor-period", type=int, default=1)
    ap.add_argument("--inverse-period", type=int, default=5)
    ap.add_argument("--lr-kfac", type=float, default=0.3)
    ap.add_argument("--lr-gd", type=float, default=1.0)
    ap.add_argument("--lr-adam", type=float, default=0.1)
    ap.add_argument("--methods", default="kfac,kfac-jax,gd,adam")
    args = ap.parse_args(argv)

    X, Y = digits()
    net = network()
    p0 = net.init(jax.random.PRNGKey(0))
    methods = args.methods.split(",")
    if "kfac-jax" in methods and "kfac" in methods:
        print(f"first step, kfac against kfac-jax: max relative difference "
              f"{first_step_agreement(args, net, p0, X, Y):.1e}")
    runners = {}
    for m in methods:
        if m == "kfac":
            opt = gd(args.lr_kfac, metric=KFAC(args.damping, decay=args.decay, model=net,
                                               factor_period=args.factor_period,
                                               inverse_period=args.inverse_period))
            runners[m] = (args.lr_kfac, *library_runner(net, opt, p0, X, Y))
        elif m == "kfac-jax":
            runners[m] = (args.lr_kfac, *kfac_jax_runner(
                p0, X, Y, args.lr_kfac, args.damping, args.decay, args.factor_period,
                args.inverse_period))
        elif m == "gd":
            runners[m] = (args.lr_gd, *library_runner(net, gd(args.lr_gd), p0, X, Y))
        elif m == "adam":
            runners[m] = (args.lr_adam, *library_runner(net, adam(args.lr_adam), p0, X, Y))
        else:
            raise SystemExit(f"unknown method {m!r}")
    for _, start, one in runners.values():  # compile every step function before timing
        run(start, one, -1.0, 3)
    results = {m: ([], [], []) for m in methods}
    for _ in range(args.repeats):  # interleaved: each round runs every method once
        for m, (_, start, one) in runners.items():
            times, steps, secs = run(start, one, args.target, args.max_steps)
            results[m][0].extend(times)
            results[m][1].append(steps)
            results[m][2].append(secs)

    print(f"\nMLP {'-'.join(map(str, SIZES))} tanh, digits (1200 training images, full batch), "
          f"target training loss {args.target}; damping {args.damping}, decay {args.decay}, "
          f"factor period {args.factor_period}, inverse period {args.inverse_period}; "
          f"{args.repeats} runs each, wall clock\n")
    head = ("| method | lr | ms / step, median [min–max] | steps to target | "
            "s to target, median [min–max] |")
    print(head)
    print("|" + "---|" * 5)
    for m in methods:
        times, steps, secs = results[m]
        ms = [1e3 * t for t in times]
        step_s = (f"{statistics.median(ms):.2f} [{min(ms):.2f}–{max(ms):.2f}]" if ms else "—")
        reached = [s for s in secs if s is not None]
        st = sorted(set(s for s in steps if s is not None))
        steps_s = "never" if not st else "–".join(map(str, sorted({st[0], st[-1]})))
        secs_s = ("never" if len(reached) < len(secs) else
                  f"{statistics.median(reached):.3f} [{min(reached):.3f}–{max(reached):.3f}]")
        print(f"| {m} | {runners[m][0]} | {step_s} | {steps_s} | {secs_s} |")


if __name__ == "__main__":
    main()
