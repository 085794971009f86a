"""A tied autoencoder on digits: encoder weight W, decoder Wᵀ, by reparameterisation.

Run:  python examples/tied_autoencoder.py [--hidden 16] [--epochs 20] [--seed 0] [--out examples/figures]

The untied network linear(64,k) ≫ tanh ≫ linear(k,64) has parameter object
P = R^{k×64} × R^0 × R^{64×k}. Tying is the reparameterisation along
r : R^{k×64} → P, W ↦ (W, None, Wᵀ): the lens (Q, f ∘ (1 × r)), built by
`model.reparam(Smooth(Q, P, r))`. Its parameter covector is r's backward part applied to the
untied covector, W' = p'_enc + (p'_dec)ᵀ: the covector of a parameter used twice is the sum
of the covectors of its two uses. The script prints that sum against the tied covector,
trains the tied model with Adam, and writes tied_autoencoder.png (digits and their
reconstructions).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")  # figures go to files, never to a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

from categories import R, Smooth  # noqa: E402
from lenses import (adam, batch_loss, batched, dL, expression, fit, half_squared_error,  # noqa: E402
                    linear, n_params, predict, tanh)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "figures")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    k = args.hidden

    X = (load_digits().data / 16.0).astype(np.float64)  # pixels in [0, 1]
    untied = linear(64, k) >> tanh >> linear(k, 64)
    tie = Smooth(R(k, 64), untied.param, lambda W: (W, None, W.T), name="W ↦ (W, Wᵀ)")
    tied = untied.reparam(tie, init=lambda key: jax.random.normal(key, (k, 64)) / 8.0,
                          name="tied autoencoder")
    print(expression(untied, types=False))
    print(f"untied parameters {n_params(untied)}, tied parameters {n_params(tied)}")

    # One backward pass of each, at W and at r(W), on a batch.
    W = tied.init(jax.random.PRNGKey(args.seed))
    xb = X[:64]
    loss = batch_loss(half_squared_error, xb, "mean")
    out, pull = batched(tied).vjp(xb, W)
    tied_cov = pull(dL(loss, out))[1].value
    out_u, pull_u = batched(untied).vjp(xb, tie.fn(W))
    enc, _, dec = pull_u(dL(loss, out_u))[1].value
    gap = float(jnp.max(jnp.abs(tied_cov - (enc + dec.T))))
    scale = float(jnp.max(jnp.abs(tied_cov)))
    print(f"the tied covector W' and p'_enc + (p'_dec)ᵀ differ by at most {gap:.2e} "
          f"(entries up to {scale:.2e}): W' is the sum of its two uses")
    print(f"neither use alone: ‖W' − p'_enc‖∞ = {float(jnp.max(jnp.abs(tied_cov - enc))):.2e}, "
          f"‖W' − (p'_dec)ᵀ‖∞ = {float(jnp.max(jnp.abs(tied_cov - dec.T))):.2e}")

    state, history = fit(tied, half_squared_error, adam(args.lr), W, (X, X), epochs=args.epochs,
                         batch_size=64, key=jax.random.PRNGKey(args.seed), progress=False)
    for h in history:
        print(f"epoch {h['epoch']:3d}  loss {h['loss']:.4f}")

    shown = X[::180][:8]
    recon = np.asarray(predict(tied, state.params, shown))
    fig, axes = plt.subplots(2, len(shown), figsize=(1.2 * len(shown), 2.7))
    for i in range(len(shown)):
        for row, img in ((0, shown[i]), (1, recon[i])):
            axes[row, i].imshow(img.reshape(8, 8), cmap="gray_r", vmin=0, vmax=1)
            axes[row, i].axis("off")
    axes[0, 0].set_title("digits", fontsize=8, loc="left")
    axes[1, 0].set_title(f"tied, k={k}", fontsize=8, loc="left")
    fig.tight_layout()
    fig.savefig(args.out / "tied_autoencoder.png", dpi=80)
    print("wrote", args.out / "tied_autoencoder.png")


if __name__ == "__main__":
    main()
