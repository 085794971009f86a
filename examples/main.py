"""The main example: a parameterised lens dense(4,16) ≫ tanh ≫ dense(16,3) learns Iris.

Run:  python examples/main.py [--epochs 60] [--optimiser adam] [--lr 0.01]

It prints the lens expression and its string diagram, shows three facts of the theory on one
example (the backward part runs in reverse; a covector is not a point; the sharp map depends
on the inner product, and the update is a reparameterisation), then trains and reports the
loss per epoch and the final accuracy on held-out flowers.
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.datasets import load_iris
from sklearn.model_selection import train_test_split

from lenses import (Diagonal, Euclidean, Layer, accuracy, adam, dense, diagram, dL, expression, fit,
                    gd, momentum, softmax_cross_entropy, tanh)

OPTIMISERS = {"gd": lambda lr: gd(lr), "momentum": lambda lr: momentum(lr), "adam": lambda lr: adam(lr)}


def iris(seed: int):
    """Iris, standardised with the training split's mean and deviation (float32, int labels)."""
    X, y = load_iris(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.2, random_state=seed, stratify=y)
    mu, sd = Xtr.mean(0), Xtr.std(0)
    f = lambda A: ((A - mu) / sd).astype(np.float32)  # noqa: E731
    return f(Xtr), ytr.astype(np.int32), f(Xte), yte.astype(np.int32)


def traced(model, log):
    """The same chain, each component logging when its forward and backward parts run."""
    def wrap(part):
        def forward(a, p):
            log.append(("forward", part.name))
            return part.forward(a, p)

        def backward(a, p, b):
            log.append(("backward", part.name))
            da, dp = part.backward(a, p, b)
            return da.value, dp.value

        return Layer(part.dom, part.cod, part.param, forward, backward, name=part.name, check=False)

    chain = wrap(model.parts[0])
    for part in model.parts[1:]:
        chain = chain >> wrap(part)
    return chain


def theory(model, params, x, label):
    print("\n== the theory, on one flower ==")
    loss = softmax_cross_entropy(label, classes=3)  # a plain map L : R^3 → R, not a lens
    log = []
    out, pullback = traced(model, log).vjp(x, params)
    c = dL(loss, out)  # dL_c, the covector that starts the backward pass
    _, p_cov = pullback(c)
    print("order of the forward parts :", " → ".join(n for d, n in log if d == "forward"))
    print("order of the backward parts:", " → ".join(n for d, n in log if d == "backward"),
          "(reversed: the dual is contravariant)")
    slots = ", ".join("None (R^0: no parameters)" if v is None else "covector" for v in p_cov.value)
    print("parameter covectors per slot:", slots)

    try:
        params - p_cov
    except TypeError as e:
        print("p - p' raises TypeError:", e)

    b_cov = p_cov.value[2][1]  # the covector on the last layer's bias
    euclid = Euclidean().sharp(params, p_cov)
    weighted = Diagonal(4.0).sharp(params, p_cov)
    np.set_printoptions(precision=4, suppress=True)
    print("covector on the last bias       :", np.asarray(b_cov))
    print("its sharp, Euclidean inner prod.:", np.asarray(euclid.value[2][1]))
    print("its sharp, Diagonal(4) inner pr.:", np.asarray(weighted.value[2][1]))

    u = gd(0.1, metric=Euclidean())
    moved_model, p_new = u.reparameterise(model, params, p_cov)
    same = np.allclose(moved_model.forward(x, params), model.forward(x, p_new), atol=1e-6)
    print(f"update as reparameterisation: (P, f∘(1×u)) at p equals f at u(p): {same}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--optimiser", choices=sorted(OPTIMISERS), default="adam")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    Xtr, ytr, Xte, yte = iris(args.seed)
    model = dense(4, 16) >> tanh >> dense(16, 3)
    params = model.init(jax.random.PRNGKey(args.seed))

    print("== the lens expression ==")
    print(expression(model))
    print("\n== its string diagram ==")
    print(diagram(model))

    theory(model, params, jnp.asarray(Xtr[0]), int(ytr[0]))

    print(f"\n== training on {len(Xtr)} flowers, {args.optimiser}(lr={args.lr}), "
          f"batches of {args.batch_size} ==")
    opt = OPTIMISERS[args.optimiser](args.lr)
    t0 = time.perf_counter()
    state, history = fit(model, partial(softmax_cross_entropy, classes=3), opt, params, (Xtr, ytr),
                         epochs=args.epochs, batch_size=args.batch_size,
                         key=jax.random.PRNGKey(args.seed), eval_data=(Xte, yte), progress=False)
    for h in history:
        print(f"epoch {h['epoch']:3d}  loss {h['loss']:.4f}  held-out accuracy {h['accuracy']:.3f}")
    print(f"trained in {time.perf_counter() - t0:.1f} s")
    print(f"final accuracy: train {accuracy(model, state.params, Xtr, ytr):.3f}, "
          f"held-out {accuracy(model, state.params, Xte, yte):.3f}")


if __name__ == "__main__":
    main()
