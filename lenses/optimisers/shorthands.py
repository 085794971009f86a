"""The usual optimisers as short-hands for chains of parts.

Each is `chain(sharp(metric), <rule parts>, scale_by_learning_rate(lr))`; `metric=None` is the
Euclidean inner product. Every short-hand takes the learning rate first; `gd(lr, metric)` is
the update map u of the inner product, u(p) = p − η (p')♯.

The keywords `on_domain_error` ("raise" | "backtrack") and `max_halvings` are the optimiser's
fault policy (see `faults`).
"""

from __future__ import annotations

from categories.errors import HyperparameterError, KindError

from .lens import Optimiser, Update, chain
from .parts import (check_learning_rate, is_part, scale_by_adagrad, scale_by_adam, scale_by_learning_rate,
                    scale_by_momentum, sharp)


def gd(lr, metric=None, *, on_domain_error: str = "raise",
       max_halvings: int = 30) -> Update | Optimiser:
    """Gradient descent p ← p − η (p')♯: chain(sharp(metric), scale_by_learning_rate(lr)).

    A fixed rate gives the plain update u (no state); a schedule (a callable count ↦ rate, as
    in optax, and as `adam` takes) gives that chain, whose state is the step count.

    Examples:
        >>> u = gd(0.1)
        >>> p = jnp.array([1.0, 2.0])
        >>> print(np.round(u(p, Covector(jnp.array([1.0, -1.0]))), 4))
        [0.9 2.1]
        >>> print(np.round(gd(0.1, metric=Diagonal(2.0))(p, Covector(jnp.array([1.0, -1.0]))), 4))
        [0.95 2.05]
        >>> opt = gd(lambda count: 0.1 / (1 + count))                 # a schedule: 0.1, 0.05, ...
        >>> s, q = opt.step(opt.init(p), p, Covector(jnp.array([1.0, -1.0])))
        >>> s, q = opt.step(s, q, Covector(jnp.array([1.0, -1.0])))
        >>> print(np.round(q, 4))
        [0.85 2.15]
    """
    check_learning_rate(lr)  # the learning rate is checked first: gd(lr, metric) names it first
    if callable(lr):  # a schedule reads the step count: state, which u has not
        return chain(sharp(metric), scale_by_learning_rate(lr), on_domain_error=on_domain_error,
                     max_halvings=max_halvings, name="gd")
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
    momentum=β), lookahead=True) is Nesterov's method. A transformation that fails on the
    parameters' shapes (a learning rate that is not a number) is refused when `train_step`
    is built (`HyperparameterError`, `Foreign.check_on`).

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
    _probe_optax(tx)
    return chain(sharp(metric), tx, lookahead=lookahead, on_domain_error=on_domain_error,
                 max_halvings=max_halvings, name="from_optax")


def _probe_optax(tx) -> None:
    """Refuse (`HyperparameterError`) a transformation that climbs the slope or whose updates
    grow without a covector, read off a few updates of one coordinate (optax does not expose
    its hyperparameters). The covectors 1 then 0 give u₀, u₁; the covectors 0 then 1 give
    w₁, the update of a fresh covector at the same step (the same learning rate, whatever
    the schedule). A descent method has u₀ ≤ 0 (a negative learning rate gives u₀ > 0), and
    momentum β gives u₁ / w₁ = β (heavy ball; β²/(1+β) for Nesterov; < 1 for Adam): above 1
    the memory of a covector outweighs the covector itself, and the steps grow for ever."""
    import jax.numpy as jnp

    def vectors_out(covectors):
        p = jnp.zeros(())
        state, out = tx.init(p), []
        for g in covectors:
            u, state = tx.update(jnp.asarray(g, p.dtype), state, p)
            out.append(float(u))
        return out

    try:
        u0, u1 = vectors_out([1.0, 0.0])
        _, w1 = vectors_out([0.0, 1.0])
    except Exception:  # noqa: BLE001 - one needing extra arguments or shapes: not probed
        return
    if u0 > 0:
        raise HyperparameterError(f"from_optax: the transformation climbs the slope (its first "
                                  f"update along the covector 1 is {u0:+g}): a negative "
                                  "learning rate? optax's updates are added to the point")
    if w1 != 0 and abs(u1) > abs(w1) * (1 + 1e-6):
        raise HyperparameterError(f"from_optax: the transformation's updates grow without a "
                                  f"covector (a past covector weighs {abs(u1 / w1):g} times a "
                                  "fresh one): a momentum above 1?")


__all__ = ["gd", "momentum", "nesterov", "adagrad", "adam", "from_optax"]
