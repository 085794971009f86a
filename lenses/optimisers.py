"""The update u(p) = p − η (p')♯ and stateful optimisers as lenses on S × P.

An optimiser is a lens (S × P, S × P) ⇄ (P, P*) in the sense of Cruttwell–Gavranović–Ghani–
Wilson–Zanasi (section 3): its forward part `lookahead(s, p)` is the point where the network is
evaluated and the covector taken (p itself, except for Nesterov), and its backward part
`step(s, p, p')` turns the covector p' delivered there into a new state and a new point. The
covector is first sharpened by the optimiser's inner product (`metric.sharp`, a `Vector`);
the rule (plain, momentum, Nesterov, Adagrad, Adam, or any optax transformation) then acts on
that vector. Every rule therefore composes with every metric.

States are pytrees (NamedTuples) with parameter-shaped leaves and None at R^0 slots.

Faults: a step whose covector or new point is not finite raises `NonFiniteError` (a
`FloatingPointError`); a new point outside the open parameter object raises `DomainError`,
or, with `on_domain_error="backtrack"`, the move is halved (inside `jit`, by
`lax.while_loop`) until the point lies in the set, at most `max_halvings` times. Backtracking
shortens only the move: the optimiser's state advances as computed.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from categories import Covector, DomainError, Product, Smooth, Space
from categories.linear import unwrap
from categories.spaces import euclidean

from .metrics import Euclidean, Metric

tree_map = jax.tree_util.tree_map


class NonFiniteError(FloatingPointError):
    """A step produced NaN or infinity (in a covector or in the new point)."""


# -- states ----------------------------------------------------------------------------------

class EmptyState(NamedTuple):
    """The state of a stateless rule: S = R^0."""


class MomentumState(NamedTuple):
    """m = Σ_k β^k v_{t−k}: the decayed sum of past sharpened covectors (optax's `trace`)."""

    m: Any


class AdagradState(NamedTuple):
    """G = G₀ + Σ v²: the running sum of squares of the sharpened covectors."""

    sum_of_squares: Any


class AdamState(NamedTuple):
    """count t, first moment μ and second moment ν of the sharpened covectors."""

    count: Any
    mu: Any
    nu: Any


# -- faults ----------------------------------------------------------------------------------

def slot_names(model) -> list[str]:
    """Human names of the parameter slots of a model: its components for a chain."""
    parts = getattr(model, "parts", None)
    if parts is not None and len(parts) > 1:
        return [f"slot {i} ({part.name})" for i, part in enumerate(parts)]
    return [f"slot 0 ({getattr(model, 'name', 'parameters')})"]


def _slots(space: Space, x):
    """(slot space, slot value) pairs: the factors of a product parameter object, else one."""
    if isinstance(space, Product) and isinstance(x, tuple) and len(x) == len(space.factors):
        return list(zip(space.factors, x))
    return [(space, x)]


def find_missing(space: Space, p, where: str = "parameters") -> str | None:
    """Where a parameterised part of `space` was given None (or the wrong structure), else None."""
    if isinstance(space, Product):
        if not isinstance(p, tuple) or len(p) != len(space.factors):
            if p is None:
                return f"{where} is None, but {space!r} has parameters"
            return f"{where} should be a tuple of {len(space.factors)} for {space!r}"
        for i, (f, q) in enumerate(zip(space.factors, p)):
            why = find_missing(f, q, f"{where}[{i}]")
            if why:
                return why
        return None
    if space.size > 0 and p is None:
        return f"{where} is None, but it is a parameterised slot ({space!r})"
    return None


def check_params(space: Space, p, names=None) -> None:
    """Refuse (TypeError) a parameter point with None in a parameterised slot, naming the slot."""
    slots = _slots(space, p)
    names = names if names is not None and len(names) == len(slots) else [
        f"slot {i}" for i in range(len(slots))]
    for name, (s, q) in zip(names, slots):
        why = find_missing(s, q, f"the point of {name}")
        if why:
            raise TypeError(f"{why}: a parameterised layer cannot step without its parameters "
                            "(only parameterless R^0 slots take None)")


def finite_flags(x, space: Space | None):
    """Per slot, a traceable boolean: every coordinate is finite."""
    def ok(v):
        leaves = jax.tree_util.tree_leaves(v)
        return jnp.all(jnp.stack([jnp.asarray(True)] + [jnp.all(jnp.isfinite(a)) for a in leaves]))

    if space is None:
        return jnp.stack([ok(x)])
    return jnp.stack([ok(v) for _, v in _slots(space, x)])


def raise_outside(space: Space, p_new, names=None, note: str = "") -> None:
    """Raise the DomainError that names the slot (and coordinate) of p_new outside `space`."""
    slots = _slots(space, p_new)
    names = names if names is not None and len(names) == len(slots) else [
        f"slot {i}" for i in range(len(slots))]
    for name, (s, q) in zip(names, slots):
        try:
            s.check(q, f"the updated point of {name}")
        except DomainError as e:
            raise DomainError(f"the update leaves the parameter object: {e}{note}") from None
    raise DomainError(f"the update leaves the parameter object {space!r}{note}")


def raise_non_finite(cov_ok, new_ok, names) -> None:
    bad = [("covector", i) for i, ok in enumerate(cov_ok) if not ok] + \
          [("new point", i) for i, ok in enumerate(new_ok) if not ok]
    what, i = bad[0]
    name = names[i] if names is not None and i < len(names) else f"slot {i}"
    raise NonFiniteError(f"the {what} of {name} contains NaN or infinity; the step is refused "
                         "and the parameters are left as they were")


def _is_concrete(x) -> bool:
    """Every leaf has a value now (not a tracer inside jit/vmap/grad)."""
    return not any(isinstance(a, jax.core.Tracer) for a in jax.tree_util.tree_leaves(x))


# -- the optimiser lens ----------------------------------------------------------------------

class Optimiser:
    """A lens (S × P) ⇄ (P, P*): get = `lookahead`, put = `step` (sharpen, then the rule)."""

    def __init__(self, init: Callable, move: Callable, metric: Metric | None = None,
                 lookahead: Callable | None = None, on_domain_error: str = "raise",
                 max_halvings: int = 30, name: str = "optimiser"):
        if on_domain_error not in ("raise", "backtrack"):
            raise ValueError(f"on_domain_error must be 'raise' or 'backtrack', got {on_domain_error!r}")
        self._init, self._move, self._look = init, move, lookahead
        self.metric = metric if metric is not None else Euclidean()
        self.on_domain_error, self.max_halvings, self.name = on_domain_error, max_halvings, name

    def init(self, p):
        """The initial state s₀ for the point p."""
        return self._init(p)

    def lookahead(self, s, p):
        """The forward part: where the covector is taken (p, except for Nesterov)."""
        return p if self._look is None else self._look(s, p)

    get = lookahead

    def propose(self, s, p, p_cov, ctx=None, space: Space | None = None):
        """Traceable step: (s', p'', inside) with inside a boolean (True where nothing is known)."""
        space = space if space is not None else getattr(p_cov, "space", None)
        v = unwrap(self.metric.sharp(self.lookahead(s, p), p_cov, ctx))
        s_new, p_new = self._move(s, p, v)
        if space is None or euclidean(space):
            return s_new, p_new, jnp.asarray(True)
        inside = space.indicator(p_new)
        if self.on_domain_error == "backtrack":
            p_new, inside = _backtrack(space, p, p_new, inside, self.max_halvings)
        return s_new, p_new, inside

    def step(self, s, p, p_cov, ctx=None, space: Space | None = None):
        """The backward part: (s, p, p') ↦ (s', p''). With concrete values, faults raise."""
        space = space if space is not None else getattr(p_cov, "space", None)
        if space is not None:
            check_params(space, p)
        s_new, p_new, inside = self.propose(s, p, p_cov, ctx, space)
        if _is_concrete((unwrap(p_cov), p_new, inside)):  # inside jit there is nothing to look at
            cov_ok, new_ok = finite_flags(unwrap(p_cov), space), finite_flags(p_new, space)
            if not (bool(jnp.all(cov_ok)) and bool(jnp.all(new_ok))):
                raise_non_finite(list(cov_ok), list(new_ok), None)
            if not bool(inside):
                raise_outside(space, p_new, note=self._note())
        return s_new, p_new

    put = step

    def _note(self):
        return (f" (still outside after {self.max_halvings} halvings of the step)"
                if self.on_domain_error == "backtrack" else
                " (pass on_domain_error='backtrack' to shorten the step instead)")

    def __repr__(self):
        return f"{self.name}(metric={self.metric!r})"


def _backtrack(space, p, p_new, inside, max_halvings):
    """Halve the move p'' − p until p + t (p'' − p) lies in `space` (at most max_halvings)."""
    move = tree_map(lambda a, b: b - a, p, p_new)

    def cond(c):
        k, _, ok = c
        return jnp.logical_and(jnp.logical_not(ok), k < max_halvings)

    def body(c):
        k, t, _ = c
        t = t * 0.5
        return k + 1, t, space.indicator(tree_map(lambda a, d: a + t * d, p, move))

    leaves = jax.tree_util.tree_leaves(p)
    dtype = leaves[0].dtype if leaves else jnp.float32
    k, t, ok = lax.while_loop(cond, body, (jnp.asarray(0), jnp.asarray(1.0, dtype), inside))
    # At t = 1 keep p'' itself (bit for bit); otherwise the shortened move.
    p_out = tree_map(lambda a, b, d: jnp.where(k == 0, b, a + t * d), p, p_new, move)
    return p_out, ok


class Update(Optimiser):
    """The plain update u(p) = p − η (p')♯ (S = R^0)."""

    def __init__(self, metric: Metric | None, lr: float, on_domain_error="raise", max_halvings=30):
        self.lr = lr
        super().__init__(lambda p: EmptyState(),
                         lambda s, p, v: (s, tree_map(lambda a, b: a - lr * b, p, v)),
                         metric, None, on_domain_error, max_halvings, "update")

    def __call__(self, p, p_cov, ctx=None, space: Space | None = None):
        """u(p) for the covector p' taken at p: the new point."""
        return self.step(EmptyState(), p, p_cov, ctx, space)[1]

    def reparameterise(self, model, p, p_cov, ctx=None):
        """((P, f ∘ (1 × u)), u(p)) with u the move q ↦ q + (u(p) − p) = q − η (p')♯ taken at p.

        The returned model at the old point p computes what `model` computes at the new point.
        """
        p_new = self(p, p_cov, ctx, space=model.param)
        move = tree_map(lambda a, b: b - a, p, p_new)
        u = Smooth(model.param, model.param, lambda q: tree_map(lambda a, d: a + d, q, move),
                   name="u", check=False)
        return model.reparam(u, name=f"{model.name}∘(1×u)"), p_new

    def __repr__(self):
        return f"update(metric={self.metric!r}, lr={self.lr})"


def update(metric: Metric | None = None, lr: float = 1e-2, on_domain_error: str = "raise",
           max_halvings: int = 30) -> Update:
    """u(p) = p − η (p')♯ for the inner product `metric` and step size η = `lr`."""
    return Update(metric, lr, on_domain_error, max_halvings)


def gd(lr: float, metric: Metric | None = None, on_domain_error: str = "raise",
       max_halvings: int = 30) -> Update:
    """Gradient descent p ← p − η (p')♯ (the plain update)."""
    return Update(metric, lr, on_domain_error, max_halvings)


def _zeros(p):
    return tree_map(jnp.zeros_like, p)


def momentum(lr: float, beta: float = 0.9, metric: Metric | None = None, **kw) -> Optimiser:
    """Heavy ball: m ← v + β m, p ← p − η m with v = (p')♯ (optax.sgd(lr, momentum=β))."""
    def move(s, p, v):
        m = tree_map(lambda g, t: g + beta * t, v, s.m)
        return MomentumState(m), tree_map(lambda a, b: a - lr * b, p, m)

    return Optimiser(lambda p: MomentumState(_zeros(p)), move, metric, None, name="momentum", **kw)


def nesterov(lr: float, beta: float = 0.9, metric: Metric | None = None, **kw) -> Optimiser:
    """Nesterov: the covector is taken at the lookahead φ = p − η β m; then m ← v + β m, p ← p − η m.

    The lookahead points φ_t are exactly the iterates of optax.sgd(lr, momentum=β,
    nesterov=True), which writes the same method without a lookahead evaluation: with
    φ = p − ηβm, the update reads φ ← φ − η (v + β m_new) (the standard change of variables).
    """
    def look(s, p):
        return tree_map(lambda a, t: a - lr * beta * t, p, s.m)

    def move(s, p, v):
        m = tree_map(lambda g, t: g + beta * t, v, s.m)
        return MomentumState(m), tree_map(lambda a, b: a - lr * b, p, m)

    return Optimiser(lambda p: MomentumState(_zeros(p)), move, metric, look, name="nesterov", **kw)


def adagrad(lr: float, initial_accumulator_value: float = 0.1, eps: float = 1e-7,
            metric: Metric | None = None, **kw) -> Optimiser:
    """Adagrad: G ← G + v², p ← p − η v / √(G + ε), G₀ = `initial_accumulator_value` (optax's)."""
    def move(s, p, v):
        G = tree_map(lambda g, a: g * g + a, v, s.sum_of_squares)
        scale = tree_map(lambda a: jnp.where(a > 0, lax.rsqrt(a + eps), 0.0), G)
        return AdagradState(G), tree_map(lambda a, g, c: a - lr * (c * g), p, v, scale)

    def init(p):
        return AdagradState(tree_map(lambda a: jnp.full_like(a, initial_accumulator_value), p))

    return Optimiser(init, move, metric, None, name="adagrad", **kw)


def adam(lr: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
         metric: Metric | None = None, **kw) -> Optimiser:
    """Adam: μ ← b1 μ + (1−b1) v, ν ← b2 ν + (1−b2) v², p ← p − η μ̂ / (√ν̂ + ε) (bias-corrected)."""
    def move(s, p, v):
        count = s.count + 1
        mu = tree_map(lambda g, m: (1 - b1) * g + b1 * m, v, s.mu)
        nu = tree_map(lambda g, n: (1 - b2) * (g * g) + b2 * n, v, s.nu)

        def corrected(m, n):
            m_hat = m / (1 - b1 ** count.astype(m.dtype))
            n_hat = n / (1 - b2 ** count.astype(n.dtype))
            return m_hat / (jnp.sqrt(n_hat) + eps)

        step = tree_map(corrected, mu, nu)
        return AdamState(count, mu, nu), tree_map(lambda a, d: a - lr * d, p, step)

    def init(p):
        return AdamState(jnp.zeros((), jnp.int32), _zeros(p), _zeros(p))

    return Optimiser(init, move, metric, None, name="adam", **kw)


def from_optax(tx: optax.GradientTransformation, metric: Metric | None = None, **kw) -> Optimiser:
    """Any optax transformation as the rule: updates = tx((p')♯), p ← p + updates."""
    def move(s, p, v):
        updates, s_new = tx.update(v, s, p)
        return s_new, optax.apply_updates(p, updates)

    return Optimiser(tx.init, move, metric, None, name="from_optax", **kw)


def sharp_transform(metric: Metric) -> optax.GradientTransformationExtraArgs:
    """The sharp map of `metric` as an optax transformation: updates ↦ (updates)♯ at `params`
    (extra argument `ctx`: a `Context` for data-dependent metrics)."""
    def init(params):
        return EmptyState()

    def update_fn(updates, state, params=None, ctx=None, **extra):
        return unwrap(metric.sharp(params, Covector(updates), ctx)), state

    return optax.GradientTransformationExtraArgs(init, update_fn)


__all__ = ["Optimiser", "Update", "update", "gd", "momentum", "nesterov", "adagrad", "adam",
           "from_optax", "sharp_transform", "NonFiniteError", "EmptyState", "MomentumState",
           "AdagradState", "AdamState"]
