"""The usual optimisers as short-hands for chains of parts.

Each is `chain(sharp(metric), <rule parts>, scale_by_learning_rate(lr))`; `metric=None` is the
Euclidean inner product. Every short-hand takes the learning rate first; `gd(lr, metric)` is
the update map u of the inner product, u(p) = p − η (p')♯.

The keywords `on_domain_error` ("raise" | "backtrack") and `max_halvings` are the optimiser's
fault policy (see `faults`).
"""

from __future__ import annotations

from categories.errors import KindError

from .lens import Optimiser, Update, chain
from .parts import (check_learning_rate, is_part, scale_by_adagrad, scale_by_adam, scale_by_learning_rate,
                    scale_by_momentum, sharp)


def gd(lr: float, metric=None, *, on_domain_error: str = "raise",
       max_halvings: int = 30) -> Update:
    """Gradient descent p ← p − η (p')♯: chain(sharp(metric), scale_by_learning_rate(lr)).

    Examples:
        >>> u = gd(0.1)
        >>> p = jnp.array([1.0, 2.0])
        >>> print(np.round(u(p, Covector(jnp.array([1.0, -1.0]))), 4))
        [0.9 2.1]
        >>> print(np.round(gd(0.1, metric=Diagonal(2.0))(p, Covector(jnp.array([1.0, -1.0]))), 4))
        [0.95 2.05]
    """
    check_learning_rate(lr)  # the learning rate is checked first: gd(lr, metric) names it first
    return Update(metric, lr, on_domain_error, max_halvings)


def momentum(lr: float, beta: float = 0.9, metric=None, *, on_domain_error: str = "raise",
             max_halvings: int = 30) -> Optimiser:
    """Heavy ball: m ← v + β m, p ← p − η m with v = (p')♯ (optax.sgd(lr, momentum=β)):
    chain(sharp(metric), scale_by_momentum(beta), scale_by_learning_rate(lr)).

    Examples:
        >>> opt = momentum(0.1, beta=0.5)
        >>> p, cov = jnp.array([1.0]), Covector(jnp.array([1.0]))
        >>> s, p = opt.step(opt.init(p), p, cov)
        >>> s, p = opt.step(s, p, cov)
        >>> print(np.round(p, 4))
        [0.75]
    """
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

    Examples:
        >>> opt = nesterov(0.1, beta=0.5)
        >>> p = jnp.array([1.0])
        >>> s, p = opt.step(opt.init(p), p, Covector(jnp.array([1.0])))
        >>> print(np.round(p, 4), np.round(opt.lookahead(s, p), 4))
        [0.9] [0.85]
    """
    return chain(sharp(metric), scale_by_momentum(beta), scale_by_learning_rate(lr),
                 lookahead=True, on_domain_error=on_domain_error, max_halvings=max_halvings,
                 name="nesterov")


def adagrad(lr: float, initial_accumulator_value: float = 0.1, eps: float = 1e-7, metric=None,
            *, on_domain_error: str = "raise", max_halvings: int = 30) -> Optimiser:
    """Adagrad: G ← G + v², p ← p − η v / √(G + ε), G₀ = `initial_accumulator_value` (optax's):
    chain(sharp(metric), scale_by_adagrad(initial_accumulator_value, eps), scale_by_learning_rate(lr)).

    Examples:
        >>> opt = adagrad(0.1, initial_accumulator_value=0.0)
        >>> p = jnp.array([1.0])
        >>> s, p = opt.step(opt.init(p), p, Covector(jnp.array([3.0])))
        >>> print(np.round(p, 4))
        [0.9]
    """
    return chain(sharp(metric), scale_by_adagrad(initial_accumulator_value, eps),
                 scale_by_learning_rate(lr), on_domain_error=on_domain_error,
                 max_halvings=max_halvings, name="adagrad")


def adam(lr: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, metric=None, *,
         on_domain_error: str = "raise", max_halvings: int = 30) -> Optimiser:
    """Adam: μ ← b1 μ + (1−b1) v, ν ← b2 ν + (1−b2) v², p ← p − η μ̂ / (√ν̂ + ε) (bias-corrected):
    chain(sharp(metric), scale_by_adam(b1, b2, eps), scale_by_learning_rate(lr)).

    Examples:
        >>> opt = adam(0.1)
        >>> p = jnp.array([1.0, 1.0])
        >>> s, p = opt.step(opt.init(p), p, Covector(jnp.array([0.5, -2.0])))
        >>> print(np.round(p, 4))
        [0.9 1.1]
    """
    return chain(sharp(metric), scale_by_adam(b1, b2, eps), scale_by_learning_rate(lr),
                 on_domain_error=on_domain_error, max_halvings=max_halvings, name="adam")


def from_optax(tx, metric=None, *, lookahead=False, on_domain_error: str = "raise",
               max_halvings: int = 30) -> Optimiser:
    """Any optax transformation as the rule: chain(sharp(metric), tx); p ← p + tx((p')♯).

    `lookahead=True` takes the covector at the inertial point: from_optax(optax.sgd(lr,
    momentum=β), lookahead=True) is Nesterov's method.

    Examples:
        >>> import optax
        >>> opt = from_optax(optax.sgd(0.1), metric=Diagonal(2.0))
        >>> p = jnp.array([1.0])
        >>> s, p = opt.step(opt.init(p), p, Covector(jnp.array([1.0])))
        >>> print(np.round(p, 4))
        [0.95]
    """
    if not is_part(tx):
        raise KindError(f"from_optax needs an optax.GradientTransformation (callable init and "
                        f"update), got {tx!r}")
    return chain(sharp(metric), tx, lookahead=lookahead, on_domain_error=on_domain_error,
                 max_halvings=max_halvings, name="from_optax")


__all__ = ["gd", "momentum", "nesterov", "adagrad", "adam", "from_optax"]
