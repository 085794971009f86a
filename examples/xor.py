"""XOR: the smallest network that needs a hidden layer, dense(2,2) ≫ tanh ≫ dense(2,1).

Run:  python examples/xor.py [--steps 800] [--lr 0.05] [--seed 0] [--out examples/figures]

No affine map R^2 → R separates XOR's four points: the best one, fitted by least squares, is
the constant 1/2, of mean loss ½ · ¼ = 0.125. Two tanh units suffice. The script prints the
lens expression and its string diagram, trains both the affine map dense(2,1) and the 2-2-1
network from the same seed with Adam on the full batch, prints the losses, and writes
xor_diagram.png (the string diagram) and xor.png (the loss curves and what the network
computes on the square).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import matplotlib

matplotlib.use("Agg")  # figures go to files, never to a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from lenses import (adam, dense, diagram, draw, expression, half_squared_error, predict,  # noqa: E402
                    tanh, train_step)

X = np.array([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
Y = np.array([[0.0], [1.0], [1.0], [0.0]])


def train(model, lr, steps, seed):
    """Full-batch Adam from model.init(seed): (final parameters, loss per step)."""
    step = train_step(model, half_squared_error, adam(lr))
    state, reports = step.init(model.init(jax.random.PRNGKey(seed))), []
    for _ in range(steps):
        state, report = step(state, X, Y)
        reports.append(report)  # read at the end: the steps run as a few scanned chunks
    step.check(state)
    return state.params, np.array([r.loss for r in reports])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "figures")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    net, affine = dense(2, 2) >> tanh >> dense(2, 1), dense(2, 1)
    print(expression(net))
    print(diagram(net))

    p_net, l_net = train(net, args.lr, args.steps, args.seed)
    p_aff, l_aff = train(affine, args.lr, args.steps, args.seed)
    print(f"affine dense(2,1)         final loss {l_aff[-1]:.4f}  (the best affine map: 0.125)")
    print(f"dense(2,2) ≫ tanh ≫ dense(2,1) final loss {l_net[-1]:.6f}")
    out = np.asarray(predict(net, p_net, X))[:, 0]
    for x, y, o in zip(X, Y[:, 0], out):
        print(f"xor{tuple(int(v) for v in x)} = {int(y)}   network {o:+.3f}")

    fig = draw(net)
    fig.savefig(args.out / "xor_diagram.png", dpi=110, bbox_inches="tight")
    plt.close(fig)

    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3.2))
    a.semilogy(l_aff, label="dense(2,1): no hidden layer")
    a.semilogy(l_net, label="dense(2,2) ≫ tanh ≫ dense(2,1)")
    a.set_xlabel("step"), a.set_ylabel("mean ½(f(x) − y)²"), a.legend(fontsize=8)
    g = np.linspace(-0.25, 1.25, 61)
    grid = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
    z = np.asarray(predict(net, p_net, grid))[:, 0].reshape(len(g), len(g))
    im = b.contourf(g, g, z, levels=20, cmap="coolwarm")
    b.scatter(X[:, 0], X[:, 1], c=Y[:, 0], cmap="coolwarm", edgecolors="k", s=80)
    b.set_title("what the 2-2-1 network computes"), fig.colorbar(im, ax=b)
    fig.tight_layout()
    fig.savefig(args.out / "xor.png", dpi=90)
    print("wrote", args.out / "xor_diagram.png", "and", args.out / "xor.png")


if __name__ == "__main__":
    main()
