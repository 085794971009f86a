"""The covector that reaches the first layer of a deep chain, with and without skip connections.

Run:  python examples/residual.py [--depths 1 2 4 8 16 32] [--width 16] [--activation sigmoid]
                                  [--seed 0] [--out examples/figures]

A plain chain (dense(w,w) ≫ σ)^L and a residual one, residual(dense(w,w) ≫ σ)^L, each closed
by dense(w,1), at their initial points. The backward pass runs the components' backward
parts in reverse, so the covector on the first block's weights is what is left of the one on
the last block's after L − 1 backward parts. In the plain chain each multiplies by
Wᵀ diag(σ') (σ' ≤ 1/4 for the sigmoid) and the covector shrinks geometrically with depth; a
residual block's backward part is 1 + (the block's), so the identity path carries it back
undiminished. The script prints ‖p'_1‖ / ‖p'_L‖ (first block's W against the last block's)
against depth for both, and writes residual.png.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)  # the plain chain's covector falls below float32's range

import jax.numpy as jnp  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")  # figures go to files, never to a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from lenses import (batch_loss, batched, dL, dense, half_squared_error, residual, sigmoid,  # noqa: E402
                    tanh)

ACTIVATIONS = {"sigmoid": sigmoid, "tanh": tanh}


def chain(depth, width, skip, act=sigmoid):
    block = (lambda: residual(dense(width, width) >> act)) if skip else (lambda: dense(width, width) >> act)
    model = block()
    for _ in range(depth - 1):
        model = model >> block()
    return model >> dense(width, 1)


def reach(model, key, X, Y):
    """‖p'_1‖ / ‖p'_L‖: the covectors on the first and the last block's weights W, for the
    batch loss at model.init(key)."""
    p = model.init(key)
    out, pull = batched(model).vjp(X, p)
    cov = pull(dL(batch_loss(half_squared_error, Y, "mean"), out))[1].value
    sites = model.sites()  # the parameterised slots in order: the blocks' dense, then the head
    (W1, _), (WL, _) = sites[0].get(cov), sites[-2].get(cov)
    return float(jnp.linalg.norm(W1) / jnp.linalg.norm(WL))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--activation", choices=sorted(ACTIVATIONS), default="sigmoid")
    ap.add_argument("--seeds", type=int, default=3, help="initial points averaged over")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "figures")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    rng = np.random.default_rng(args.seed)
    X = rng.normal(size=(32, args.width))
    Y = rng.normal(size=(32, 1))
    keys = jax.random.split(jax.random.PRNGKey(args.seed), args.seeds)
    rows = []
    act = ACTIVATIONS[args.activation]
    print(f"{'depth':>5}  {'plain ‖p′_1‖/‖p′_L‖':>20}  {'residual ‖p′_1‖/‖p′_L‖':>23}")
    for L in args.depths:
        # the geometric mean over initial points (the ratios span decades)
        plain = np.exp(np.mean([np.log(reach(chain(L, args.width, False, act), k, X, Y)) for k in keys]))
        skip = np.exp(np.mean([np.log(reach(chain(L, args.width, True, act), k, X, Y)) for k in keys]))
        rows.append((L, plain, skip))
        print(f"{L:5d}  {plain:20.3e}  {skip:23.3e}")
    L, plain, skip = map(np.array, zip(*rows))
    print(f"at depth {L[-1]}: plain {plain[-1]:.2e}, residual {skip[-1]:.2e} of the last "
          "block's covector reaches the first")

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.loglog(L, plain, "o-", label=f"plain: (dense ≫ {args.activation})^L")
    ax.loglog(L, skip, "s-", label=f"residual(dense ≫ {args.activation})^L")
    ax.set_xlabel("depth L"), ax.set_ylabel("‖p′_1‖ / ‖p′_L‖")
    ax.set_title(f"how much covector reaches block 1 (width {args.width}, at init)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out / "residual.png", dpi=90)
    print("wrote", args.out / "residual.png")


if __name__ == "__main__":
    main()
