"""The usual optimisers as short-hands for chains of parts.

Each is `chain(sharp(metric), <rule parts>, scale_by_learning_rate(lr))`; `metric=None` is the
Euclidean inner product. Every short-hand takes the learning rate first; `update` alone takes
the metric first (it is the update map u of the inner product, u(p) = p − η (p')♯) and builds
the same object as `gd`:

    gd(0.1, metric=m)  ≡  gd(lr=0.1, metric=m)  ≡  update(m, lr=0.1)  ≡  update(metric=m, lr=0.1)

The keywords `on_domain_error` ("raise" | "backtrack") and `max_halvings` are the optimiser's
fault policy (see `faults`).
"""

from __future__ import annotations

from categories.errors import KindError

from .lens import Optimiser, Update, chain
from .parts import (check_learning_rate, is_part, scale_by_adagrad, scale_by_adam, scale_by_learning_rate,
                    scale_by_momentum, sharp)


def update(metric=None, lr: float = 1e-2, *, on_domain_error: str = "raise",
           max_halvings: int = 30) -> Update:
    """u(p) = p − η (p')♯ for the inner product `metric` and step size η = `lr` (= `gd(lr, metric)`)."""
    return Update(metric, lr, on_domain_error, max_halvings)


def gd(lr: float, metric=None, *, on_domain_error: str = "raise",
       max_halvings: int = 30) -> Update:
    """Gradient descent p ← p − η (p')♯: chain(sharp(metric), scale_by_learning_rate(lr))."""
    check_learning_rate(lr)  # the learning rate is checked first: gd(lr, metric) names it first
    return Update(metric, lr, on_domain_error, max_halvings)


def momentum(lr: float, beta: float = 0.9, metric=None, *, on_domain_error: str = "raise",
             max_halvings: int = 30) -> Optimiser:
    """Heavy ball: m ← v + β m, p ← p − η m with v = (p')♯ (optax.sgd(lr, momentum=β)):
    chain(sharp(metric), scale_by_momentum(beta), scale_by_learning_rate(lr))."""
    return chain(sharp(metric), scale_by_momentum(beta), scale_by_learning_rate(lr),
                 on_domain_error=on_domain_error, max_halvings=max_halvings, name="momentum")


def nesterov(lr: float, beta: float = 0.9, metric=None, *, on_domain_error: str = "raise",
             max_halvings: int = 30) -> Optimiser:
    """Nesterov: momentum whose covector is taken at the lookahead φ = p − η β m.

    chain(sharp(metric), scale_by_momentum(beta), scale_by_learning_rate(lr), lookahead=True):
    the inertial point p + Δ(0) of the momentum chain is φ. The lookahead points φ_t are
    exactly the iterates of optax.sgd(lr, momentum=β, nesterov=True), which writes the same
    method without a lookahead evaluation: with φ = p − ηβm, the update reads
    φ ← φ − η (v + β m_new) (the standard change of variables).
    """
    return chain(sharp(metric), scale_by_momentum(beta), scale_by_learning_rate(lr),
                 lookahead=True, on_domain_error=on_domain_error, max_halvings=max_halvings,
                 name="nesterov")


def adagrad(lr: float, initial_accumulator_value: float = 0.1, eps: float = 1e-7, metric=None,
            *, on_domain_error: str = "raise", max_halvings: int = 30) -> Optimiser:
    """Adagrad: G ← G + v², p ← p − η v / √(G + ε), G₀ = `initial_accumulator_value` (optax's):
    chain(sharp(metric), scale_by_adagrad(initial_accumulator_value, eps), scale_by_learning_rate(lr))."""
    return chain(sharp(metric), scale_by_adagrad(initial_accumulator_value, eps),
                 scale_by_learning_rate(lr), on_domain_error=on_domain_error,
                 max_halvings=max_halvings, name="adagrad")


def adam(lr: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, metric=None, *,
         on_domain_error: str = "raise", max_halvings: int = 30) -> Optimiser:
    """Adam: μ ← b1 μ + (1−b1) v, ν ← b2 ν + (1−b2) v², p ← p − η μ̂ / (√ν̂ + ε) (bias-corrected):
    chain(sharp(metric), scale_by_adam(b1, b2, eps), scale_by_learning_rate(lr))."""
    return chain(sharp(metric), scale_by_adam(b1, b2, eps), scale_by_learning_rate(lr),
                 on_domain_error=on_domain_error, max_halvings=max_halvings, name="adam")


def from_optax(tx, metric=None, *, lookahead=False, on_domain_error: str = "raise",
               max_halvings: int = 30) -> Optimiser:
    """Any optax transformation as the rule: chain(sharp(metric), tx); p ← p + tx((p')♯).

    `lookahead=True` takes the covector at the inertial point: from_optax(optax.sgd(lr,
    momentum=β), lookahead=True) is Nesterov's method.
    """
    if not is_part(tx):
        raise KindError(f"from_optax needs an optax.GradientTransformation (callable init and "
                        f"update), got {tx!r}")
    return chain(sharp(metric), tx, lookahead=lookahead, on_domain_error=on_domain_error,
                 max_halvings=max_halvings, name="from_optax")


__all__ = ["update", "gd", "momentum", "nesterov", "adagrad", "adam", "from_optax"]
