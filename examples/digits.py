"""dense(64,128) ≫ relu ≫ dense(128,10) on scikit-learn's 8×8 digits, with a choice of inner product.

Run:  python examples/digits.py [--metric euclidean|diagonal|fisher|kfac] [--epochs 15]

The metric is the inner product whose sharp map turns each parameter covector into the
direction of the update u(p) = p − η (p')♯ (then the optimiser's rule acts on that vector).
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import jax
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import lenses
from lenses import Diagonal, Euclidean, accuracy, adam, dense, expression, fit, gd, momentum, relu, \
    softmax_cross_entropy

# name → (metric factory taking the model's initial parameters, default step size with momentum)
METRICS = {
    "euclidean": (lambda p: Euclidean(), 0.05),
    # A fixed diagonal inner product: the weight matrices' coordinates weighted by their fan-in,
    # so that (p')♯ is smaller on wide layers; the biases keep weight 1.
    "diagonal": (lambda p: Diagonal(tuple(None if s is None else (float(s[0].shape[1]) / 16.0, 1.0)
                                          for s in p)), 0.05),
}
if hasattr(lenses, "KFAC"):
    METRICS["kfac"] = (lambda p: lenses.KFAC(damping=1e-1), 0.02)
if hasattr(lenses, "Fisher"):
    # Truncated conjugate gradients (Hessian-free style) keep one step cheap.
    METRICS["fisher"] = (lambda p: lenses.Fisher(damping=1e-1, solver="cg", cg_iters=10), 0.05)

RULES = {"gd": gd, "momentum": momentum, "adam": adam}


def digits(seed: int):
    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)  # pixel intensities 0..16 → [0, 1]
    return train_test_split(X, y.astype(np.int32), test_size=0.25, random_state=seed, stratify=y)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--metric", choices=sorted(METRICS), default="euclidean")
    ap.add_argument("--optimiser", choices=sorted(RULES), default="momentum")
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=None, help="default: per metric")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    Xtr, Xte, ytr, yte = digits(args.seed)
    model = dense(64, 128) >> relu >> dense(128, 10)
    params = model.init(jax.random.PRNGKey(args.seed))
    make_metric, lr = METRICS[args.metric]
    lr = args.lr if args.lr is not None else lr
    metric = make_metric(params)
    opt = RULES[args.optimiser](lr, metric=metric)
    print(expression(model, types=False))
    print(f"metric {metric!r}, {args.optimiser}(lr={lr}), {len(Xtr)} training and {len(Xte)} held-out digits")

    t0 = time.perf_counter()
    state, history = fit(model, partial(softmax_cross_entropy, classes=10), opt, params, (Xtr, ytr),
                         epochs=args.epochs, batch_size=args.batch_size,
                         key=jax.random.PRNGKey(args.seed), eval_data=(Xte, yte), progress=False)
    for h in history:
        print(f"epoch {h['epoch']:3d}  loss {h['loss']:.4f}  held-out accuracy {h['accuracy']:.3f}")
    print(f"trained in {time.perf_counter() - t0:.1f} s")
    print(f"held-out accuracy: {accuracy(model, state.params, Xte, yte):.3f}")


if __name__ == "__main__":
    main()
