"""The optimiser lens (S × P, S × P) ⇄ (P, P*), chained from parts.

Forward part `lookahead(s, p)`: the point where the network is evaluated and the covector
taken: p itself, or, with `lookahead=True`, the inertial point p + Δ(0), where Δ(0) is what
the rule and learning-rate parts would add to p if the next (sharpened) covector were zero,
computed with the current state and discarded. For momentum, Δ(0) = −η β m, so the inertial
point is Nesterov's φ = p − η β m; nothing is declared by the momentum part: the same holds
for optax's `trace` or `sgd(lr, momentum=β)`.

Backward part `step(s, p, p')`: the covector p' goes through the parts in order, the first
being `sharp(metric)` (evaluated at the lookahead point, where p' lives), and the point
moves along the chain's output v to `metric.retract(p, v)`: p + v for the flat metrics, the
exponential map or a retraction for those that know their open set (`lenses.inner_products.geometry`),
which stays inside it by construction; each part's state advances. The move is the one
place the point changes, so every rule composes with every geometry.

An optimiser is a value (`lenses.values.Value`): an immutable pytree whose leaves are its
parts' numbers (learning rate, momentum, its inner product's damping, ...) and whose structure
is the rest (the parts' kinds, the lookahead, the fault policy). Its state is a tuple of its
parts' states in chain order, as `optax.chain` keeps it.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from categories import Covector, Smooth, Space, Vector
from categories.errors import CovectorError, HyperparameterError, KindError, SpaceMismatch
from categories.linear import unwrap
from categories.numbers import integer
from categories.slots import euclidean_space_of, slot_mismatch, slots
from categories.spaces import euclidean

from ..values import Value, assign, static
from .faults import (backtrack, check_floating, check_params, finite_flags, is_concrete,
                     raise_non_finite, raise_outside)
from .parts import Part, Sharp, as_part, check_learning_rate, is_part, scale_by_learning_rate, sharp

tree_map = jax.tree_util.tree_map


def _check_parts(parts) -> tuple:
    parts = tuple(parts)
    if not parts:
        raise KindError("an optimiser needs at least its first part, sharp(metric)")
    for i, part in enumerate(parts):
        if not is_part(part):
            raise KindError(f"part {i} ({part!r}) is not a part of an optimiser: a part has "
                            "init(params) -> state and update(updates, state, params) -> "
                            "(updates, state), as every optax.GradientTransformation does")
    if not isinstance(parts[0], Sharp):
        raise KindError(f"the first part must be sharp(metric), got {parts[0]!r}: the covector p' "
                        "is not a vector, the inner product turns it into one "
                        "(sharp() for the Euclidean one)")
    for i, part in enumerate(parts[1:], 1):
        if isinstance(part, Sharp):
            raise KindError(f"part {i} is {part!r}, but only the first part sharpens: after it "
                            "the parts act on vectors")
    return tuple(as_part(part) for part in parts)


class Optimiser(Value):
    """A lens (S × P) ⇄ (P, P*): get = `lookahead`, put = `step` (the parts in order).

    `parts`: `sharp(metric)`, then any parts (the library's or optax transformations).
    `lookahead`: False (the covector is taken at p), True (at the inertial point
    p + Δ(0), Nesterov for momentum) or a callable (s, p) ↦ point.
    `on_domain_error`: "raise" (DomainError) or "backtrack" (halve the move, at most
    `max_halvings` times) when the new point leaves the open parameter object.

    The state is the tuple of the parts' states; the lookahead with `lookahead=True` calls
    the parts after sharp without `ctx`.

    An optimiser is an immutable pytree: its leaves are its numbers, its structure the rest.
    Optimisers are equal by value; those of one structure (their numbers aside) share a
    compiled training step, which takes the optimiser as an argument.

    Examples:
        Adam's first step moves each coordinate by the learning rate against the sign of
        its covector:

        >>> opt = adam(0.1)
        >>> p = jnp.zeros(2)
        >>> s, p = opt.step(opt.init(p), p, Covector(jnp.array([3.0, -0.5])))
        >>> p.round(4).tolist()
        [-0.1, 0.1]
        >>> same = jax.tree_util.tree_structure(adam(0.1)) == jax.tree_util.tree_structure(adam(0.2))
        >>> adam(0.1) == adam(0.1), adam(0.1) == adam(0.2), same, jax.tree_util.tree_leaves(adam(0.1))
        (True, False, True, [0.9, 0.999, 1e-08, 0.1])
    """

    parts: tuple
    lookahead_at: bool | Callable = static()
    on_domain_error: str = static()
    max_halvings: int = static()
    name: str = static()

    def __init__(self, parts: Sequence, lookahead: bool | Callable = False,
                 on_domain_error: str = "raise", max_halvings: int = 30,
                 name: str | None = None):
        if on_domain_error not in ("raise", "backtrack"):
            raise HyperparameterError(f"on_domain_error must be 'raise' or 'backtrack', got {on_domain_error!r}")
        max_halvings = integer(max_halvings, "max_halvings")
        # an optimiser is callable (to refuse the call) but is no lookahead (s, p) -> point
        if isinstance(lookahead, Optimiser) or not (isinstance(lookahead, bool)
                                                    or callable(lookahead)):
            raise KindError(f"lookahead must be True, False or a callable (s, p) -> point, "
                            f"got {lookahead!r}")
        assign(self, parts=_check_parts(parts), lookahead_at=lookahead,
               on_domain_error=on_domain_error, max_halvings=max_halvings,
               name=name if name is not None else "chain")
        self.check_numbers()

    def check_numbers(self) -> "Optimiser":
        """The optimiser itself, if every part's numbers are in range (`Part.check_numbers`),
        else `HyperparameterError` naming the number: asked where it is built, where a
        `train_step` is built and at an eager `step`, since `dataclasses.replace` and
        `jax.tree_util.tree_map` make optimisers without asking. Traced numbers pass."""
        for part in self.parts:
            if isinstance(part, Part):  # an optax transformation keeps its numbers to itself
                part.check_numbers()
        return self

    @property
    def metric(self):
        """The inner product of the first part, `sharp(metric)`."""
        return self.parts[0].metric

    def init(self, p):
        """The initial state s₀ for the point p: the tuple of the parts' initial states. A
        point with a leaf of integer dtype, which no step can move, is refused (`DomainError`)."""
        check_floating(None, p, ["the point"], f"{self.name}.init")
        return tuple(part.init(p) for part in self.parts)

    def _states(self, s) -> tuple:
        if not isinstance(s, tuple) or len(s) != len(self.parts):
            raise KindError(f"the state of {self!r} is a tuple of its {len(self.parts)} parts' "
                            f"states (from opt.init(params)), got {type(s).__name__}"
                            + (f" of {len(s)}" if isinstance(s, tuple) else ""))
        return s

    def check_state(self, s, p, what: str = "the optimiser state") -> None:
        """Refuse (`SpaceMismatch`) a state that is not one of this optimiser's for the point
        p: its pytree structure must be that of `init(p)` (a state of another optimiser, or
        parameters where the state belongs, is not). Static: read off shapes, nothing computed."""
        template = jax.eval_shape(self.init, p)
        expected: Any = jax.tree_util.tree_structure(template)  # a PyTreeDef
        got = jax.tree_util.tree_structure(s)
        if got != expected:
            # alike when printed: a node of another class of the same name (a hand-made state)
            alike = " (the same layout, but a node of another class)" if str(got) == str(expected) else ""
            raise SpaceMismatch(f"{what} is not one of {self!r} (a state of another optimiser?): "
                                f"expected the structure {expected}, got {got}{alike}: pass the "
                                "state this optimiser's init(params) made, or the optimiser "
                                "that made it")
        self._check_leaves(template, s, what)

    def _check_leaves(self, template, s, what: str) -> None:
        """Refuse (`SpaceMismatch`) a state of the right structure with a leaf whose shape or
        dtype is not the one `init` gives for its slot of the point, naming the entry."""
        for (path, want), leaf in zip(jax.tree_util.tree_leaves_with_path(template),
                                      jax.tree_util.tree_leaves(s)):
            shape, dtype = tuple(np.shape(leaf)), jnp.result_type(leaf)
            if shape != tuple(want.shape) or dtype != want.dtype:
                part = self.parts[path[0].idx] if hasattr(path[0], "idx") else None
                raise SpaceMismatch(
                    f"{what}: the entry {jax.tree_util.keystr(path)} (of the part {part!r}) is "
                    f"an array of shape {shape} and dtype {dtype}, but {self!r}.init(params) "
                    f"makes it of shape {tuple(want.shape)} and dtype {want.dtype} for these "
                    "parameters: pass the state made for them")

    def __call__(self, *args, **kwargs):
        """Refused (`KindError`): an optimiser with a state moves the point only together with
        its state (`step`); only the stateless update `gd(lr)` is a map p ↦ u(p)."""
        raise KindError(f"{self!r} keeps a state (momenta, counts), so it is not a map p ↦ p'' "
                        "to call: step it with its state, s, p = opt.step(opt.init(p), p, p_cov) "
                        "(and carry s to the next step), or train with train_step(model, loss, "
                        "opt); gd(lr) alone is stateless and callable as gd(lr)(p, p_cov)")

    # -- the forward part ------------------------------------------------------------------
    def lookahead(self, s, p, space: Space | None = None):
        """The forward part: where the covector is taken (p, unless a lookahead was asked for).

        `space`, the parameter object, is what a metric's `retract` reads its slots from."""
        if self.lookahead_at is False:
            return p
        if self.lookahead_at is not True:
            return self.lookahead_at(s, p)
        states = self._states(s)
        v = tree_map(jnp.zeros_like, p)  # the sharp part, linear, sends 0 to 0
        for part, st in zip(self.parts[1:], states[1:]):
            v, _ = part.update(v, st, p)
        return self.retract(p, v, space)

    get = lookahead

    # -- the backward part -----------------------------------------------------------------
    def _run(self, s, p, p_cov, ctx, space=None):
        """(s', the chain's output vector) for the covector p' taken at the lookahead point."""
        states = self._states(s)
        at = self.lookahead(s, p, space)
        v, new = p_cov, []
        for part, st in zip(self.parts, states):
            # sharp at the point where the covector was taken; the rules at p
            v, st = part.update(v, st, at if isinstance(part, Sharp) else p, ctx=ctx)
            new.append(st)
        return tuple(new), v

    def move(self, s, p, p_cov, ctx=None, space: Space | None = None):
        """Traceable: (s', v), the new state and the move v; the new point is
        `retract(p, v, space)` (p + v on a Euclidean parameter object)."""
        return self._run(s, p, p_cov, ctx, space)

    def retract(self, p, v, space: Space | None = None):
        """The point reached from p along the move v (the metric's retraction)."""
        return self.metric.retract(p, v, space)

    def propose(self, s, p, p_cov, ctx=None, space: Space | None = None):
        """Traceable step: (s', p'', inside) with inside a boolean (True where nothing is known)."""
        space = space if space is not None else getattr(p_cov, "space", None)
        s_new, v = self._run(s, p, p_cov, ctx, space)
        p_new = self.retract(p, v, space)
        if space is None or euclidean(space):
            return s_new, p_new, jnp.asarray(True)
        inside = space.indicator(p_new)
        if self.on_domain_error == "backtrack":
            p_new, inside = backtrack(space, p, p_new, inside, self.max_halvings)
        return s_new, p_new, inside

    def step(self, s, p, p_cov, ctx=None, space: Space | None = None):
        """The backward part: (s, p, p') ↦ (s', p''). With concrete values, faults raise.

        p' must be a `Covector` whose leaves are shaped like p's (a `Vector` or a raw array is
        refused, `CovectorError`, naming the slot), of the parameter object `space` when one is
        named (a covector of no space, or of another, is refused); the checks are static."""
        space = space if space is not None else getattr(p_cov, "space", None)
        if space is not None:
            check_params(space, p)
        check_floating(space, p, None if space is not None else ["the point"], f"{self.name}.step")
        check_covector(p, p_cov, space)
        self.check_numbers()
        self.check_state(s, p)
        s_new, p_new, inside = self.propose(s, p, p_cov, ctx, space)
        if is_concrete((unwrap(p_cov), p_new, inside)):  # inside jit there is nothing to look at
            cov_ok, new_ok = finite_flags(unwrap(p_cov), space), finite_flags(p_new, space)
            if not (bool(jnp.all(cov_ok)) and bool(jnp.all(new_ok))):
                raise_non_finite(list(cov_ok), list(new_ok), None)
            if not bool(inside) and space is not None:  # without a space every point is inside
                raise_outside(space, p_new, note=self.outside_note())
        return s_new, p_new

    put = step

    def outside_note(self):
        """The end of the error for a point the step leaves outside: what this optimiser did."""
        return (f" (still outside after {self.max_halvings} halvings of the step)"
                if self.on_domain_error == "backtrack" else
                " (pass on_domain_error='backtrack' to shorten the step instead)")

    def __repr__(self):
        look = "" if self.lookahead_at is False else f", lookahead={self.lookahead_at!r}"
        name = "" if self.name == "chain" else f", name={self.name!r}"
        return f"chain({', '.join(map(repr, self.parts))}{look}{name})"


def check_covector(p, p_cov, space: Space | None = None) -> None:
    """Refuse (`CovectorError`) anything but a `Covector` whose value has the structure and
    leaf shapes of the point p, naming the first slot that differs."""
    if isinstance(p_cov, Vector):
        raise CovectorError("the optimiser steps on a covector p', got a Vector: a vector is not "
                            "a covector (the sharp map is the optimiser's first part; pass the "
                            "covector the backward pass gave)")
    if not isinstance(p_cov, Covector):
        raise CovectorError(f"the optimiser steps on a Covector (from the backward pass), got "
                            f"{type(p_cov).__name__}: wrap a raw value as Covector(value, space) "
                            "only if it is the differential of a loss")
    if space is not None and p_cov.space != space:
        # a covector of no space is accepted only where no parameter object is named either
        # (plain arrays: the Euclidean default); named, the two must be one space
        raise CovectorError(f"the covector lives on {p_cov.space!r}, but the parameter object "
                            f"is {space!r}: pass the covector of this parameter object, "
                            f"Covector(value, {space!r})")
    cov, named = p_cov.value, space if space is not None else euclidean_space_of(p)
    if named is None:  # a point that is not a tuple of arrays: its structure is all there is
        if jax.tree_util.tree_structure(p) != jax.tree_util.tree_structure(cov):  # type: ignore[operator]  # jaxlib's stubs lack PyTreeDef's comparisons
            raise CovectorError(f"the covector does not have the structure of the point: "
                                f"expected {jax.tree_util.tree_structure(p)}, got "
                                f"{jax.tree_util.tree_structure(cov)}")
        return
    one = len(slots(named.tangent, cov)) == 1
    why = slot_mismatch(named.tangent, cov, "the covector on {}", ["the parameters"] if one else None)
    if why:
        raise CovectorError(why)


def chain(*parts, lookahead: bool | Callable = False, on_domain_error: str = "raise",
          max_halvings: int = 30, name: str | None = None) -> Optimiser:
    """The optimiser lens of `parts`, a `sharp(metric)` first and then the library's or optax's parts.

    `chain(sharp(m), scale_by_adam(), scale_by_learning_rate(lr), name="adam")` is
    `adam(lr, metric=m)` (the name is part of the structure: without it the two compute the
    same, but are not equal and do not share a compilation); `lookahead=True` takes the
    covector at the inertial point (see `Optimiser`).

    Examples:
        >>> opt = chain(sharp(), scale_by_learning_rate(0.5))
        >>> opt == chain(sharp(), scale_by_learning_rate(0.5)), jax.tree_util.tree_leaves(opt)
        (True, [0.5])
    """
    return Optimiser(parts, lookahead, on_domain_error, max_halvings, name)


class Update(Optimiser):
    """The plain update u(p) = p − η (p')♯ (S = R^0): chain(sharp(metric), scale_by_learning_rate(lr)).

    `gd(lr, metric)` builds it; it steps as an optimiser and, called
    as u(p, p'), returns the new point.
    """

    def __init__(self, metric=None, lr=1e-2, on_domain_error: str = "raise",
                 max_halvings: int = 30):
        first = sharp(metric)
        if callable(lr):
            raise KindError("gd takes a fixed learning rate (u has no state); for a "
                            "schedule use chain(sharp(metric), scale_by_learning_rate(schedule))")
        check_learning_rate(lr)
        super().__init__([first, scale_by_learning_rate(lr)], False, on_domain_error,
                         max_halvings, "gd")

    @property
    def lr(self):
        """The learning rate η (a leaf of the last part)."""
        return self.parts[1].lr

    def __call__(self, p, p_cov, ctx=None, space: Space | None = None):
        """u(p) for the covector p' taken at p (a `Covector` shaped like p; a `Vector` or a
        raw array is refused, `CovectorError`): the new point."""
        return self.step(self.init(p), p, p_cov, ctx, space)[1]

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
        return f"gd(lr={self.lr!r}, metric={self.metric!r})"


__all__ = ["Optimiser", "chain", "Update", "check_covector"]
