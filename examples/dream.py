"""Dreaming: the update attached to the input instead of the parameters. A 3 becomes an 8.

Run:  python examples/dream.py [--source 3] [--target 8] [--metric box|euclidean]
                               [--epochs 30] [--steps 300] [--seed 0] [--out examples/figures]

A lens's backward part returns two covectors: p' on the parameters and a' on the input. A
training step moves p along (p')♯; here the network is trained, then frozen, and the input
moves instead, along (a')♯ for the loss L = cross-entropy against the target class, so the
input drifts toward what the network calls the target. The input lives in the open box
(0, 1)^64 of pixel intensities; with `--metric box` the move follows the box's own geometry
(`BoxBarrier`: the image never leaves the box, by construction), with `euclidean` it is the
straight move, shortened by backtracking where it would leave: one pixel at a wall then
shortens the move of all of them, and the dream stalls. The script prints the
network's probabilities along the way and writes dream.png (the digit, the dream, and their
difference).
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)  # pixels may come within float32's spacing of a wall

import jax.numpy as jnp  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")  # figures go to files, never to a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

from categories import Covector, OpenBox  # noqa: E402
from lenses import (BoxBarrier, accuracy, adam, dense, dL, fit, gd, predict,  # noqa: E402
                    softmax_cross_entropy, tanh)

#: pixels squeezed from [0, 1] into the open box (0, 1), a margin from its walls
LOW, HIGH = 0.02, 0.98
METRICS = {"box": lambda lr: gd(lr, metric=BoxBarrier()),
           "euclidean": lambda lr: gd(lr, on_domain_error="backtrack")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=int, default=3)
    ap.add_argument("--target", type=int, default=8)
    ap.add_argument("--metric", choices=sorted(METRICS), default="box")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--steps", type=int, default=300, help="at most this many moves of the input")
    ap.add_argument("--lr", type=float, default=None, help="default: 0.05 (box), 0.05 (euclidean)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "figures")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    X, y = load_digits(return_X_y=True)
    X = LOW + (HIGH - LOW) * X / 16.0
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=args.seed, stratify=y)
    model = dense(64, 32) >> tanh >> dense(32, 10)
    family = partial(softmax_cross_entropy, classes=10)
    state, _ = fit(model, family, adam(1e-2), model.init(jax.random.PRNGKey(args.seed)),
                   (Xtr, ytr), epochs=args.epochs, batch_size=64, key=jax.random.PRNGKey(args.seed),
                   progress=False)
    p = state.params
    print(f"trained {model.name}: held-out accuracy {accuracy(model, p, Xte, yte):.3f}")

    # the first held-out `source` that the network also calls `source`
    pred = np.argmax(np.asarray(predict(model, p, Xte)), -1)
    x0 = jnp.asarray(Xte[np.flatnonzero((yte == args.source) & (pred == args.source))[0]])
    box = OpenBox(0.0, 1.0, (64,))
    lr = args.lr if args.lr is not None else 0.05
    opt = METRICS[args.metric](lr)
    loss = softmax_cross_entropy(args.target, classes=10)

    @jax.jit
    def move(x):
        out, pull = model.vjp(x, p)  # the network frozen at p: only the input moves
        a_cov, _ = pull(dL(loss, out))
        _, x_new, inside = opt.propose(opt.init(x), x, Covector(a_cov.value, box), None, box)
        straight = box.indicator(x - lr * a_cov.value)  # would the straight move stay inside?
        return x_new, inside, straight

    x, steps, shortened = x0, 0, 0
    probs = jax.nn.softmax(model.forward(x0, p))
    print(f"step   0: P({args.source}) = {float(probs[args.source]):.3f}  "
          f"P({args.target}) = {float(probs[args.target]):.3f}")
    while steps < args.steps and float(probs[args.target]) < 0.9:
        x_new, inside, straight = move(x)
        if not bool(inside):  # still outside after every halving: the step is refused
            print(f"step {steps + 1} refused: the straight move leaves the box even when halved "
                  f"{opt.max_halvings} times (pixels pinned at a wall shorten every coordinate's move)")
            break
        x = x_new
        shortened += args.metric == "euclidean" and not bool(straight)
        probs = jax.nn.softmax(model.forward(x, p))
        steps += 1
        if steps % 25 == 0:
            print(f"step {steps:3d}: P({args.source}) = {float(probs[args.source]):.3f}  "
                  f"P({args.target}) = {float(probs[args.target]):.3f}")
    label = int(jnp.argmax(probs))
    if args.metric == "euclidean":
        print(f"moves that would have left the box and were shortened by backtracking: {shortened}")
    print(f"after {steps} moves of the input the network calls it a {label} "
          f"(P({args.target}) = {float(probs[args.target]):.3f}); every pixel in (0, 1): "
          f"{bool(box.contains(x))}; largest pixel change {float(jnp.max(jnp.abs(x - x0))):.3f}")

    fig, axes = plt.subplots(1, 3, figsize=(6.3, 2.4))
    for ax, img, title, cmap, lim in (
            (axes[0], x0, f"a {args.source}", "gray_r", (0, 1)),
            (axes[1], x, f"the network's {label}", "gray_r", (0, 1)),
            (axes[2], x - x0, "dream − digit", "coolwarm", (-1, 1))):
        ax.imshow(np.asarray(img).reshape(8, 8), cmap=cmap, vmin=lim[0], vmax=lim[1])
        ax.set_title(title, fontsize=9)
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(args.out / "dream.png", dpi=80)
    print("wrote", args.out / "dream.png")


if __name__ == "__main__":
    main()
