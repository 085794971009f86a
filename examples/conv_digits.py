"""A small convolutional lens on the 8×8 digits, each image a point of R^{1×8×8}.

Run:  python examples/conv_digits.py [--epochs 5] [--channels 8]

conv2d(1, c, 3, padding=1) ≫ relu ≫ max_pool(2) ≫ flatten ≫ dense(16c, 10): the convolution
fixes its domain with `.at(R(1, 8, 8))`; relu, pooling and flatten take theirs from it.
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import jax
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from categories import R
from lenses import accuracy, adam, conv2d, dense, diagram, fit, flatten, max_pool, relu, softmax_cross_entropy


def digits(seed: int):
    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)  # one channel, channels first
    return train_test_split(X, y.astype(np.int32), test_size=0.25, random_state=seed, stratify=y)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--channels", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    c = args.channels
    model = (conv2d(1, c, 3, padding=1).at(R(1, 8, 8)) >> relu >> max_pool(2) >> flatten
             >> dense(c * 4 * 4, 10))
    print(diagram(model))
    Xtr, Xte, ytr, yte = digits(args.seed)
    params = model.init(jax.random.PRNGKey(args.seed))

    t0 = time.perf_counter()
    state, history = fit(model, partial(softmax_cross_entropy, classes=10), adam(args.lr), params,
                         (Xtr, ytr), epochs=args.epochs, batch_size=args.batch_size,
                         key=jax.random.PRNGKey(args.seed), eval_data=(Xte, yte), progress=False)
    for h in history:
        print(f"epoch {h['epoch']:3d}  loss {h['loss']:.4f}  held-out accuracy {h['accuracy']:.3f}")
    print(f"trained in {time.perf_counter() - t0:.1f} s")
    print(f"held-out accuracy: {accuracy(model, state.params, Xte, yte):.3f}")


if __name__ == "__main__":
    main()
