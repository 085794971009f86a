"""The Para construction over the ambient category (which has finite products).

A parameterised map is (P, f : A × P → B). Two compose into (P × Q, (a, (p, q)) ↦ g(f(a, p), q)).
Chains flatten: the parameter point of f ≫ g ≫ h is (p, q, r) however it was bracketed, each
component keeping its own slot. The identity carries the terminal parameter object R^0.
A reparameterisation (2-cell) along a smooth r : Q → P turns (P, f) into (Q, f ∘ (1_A × r));
weight tying is the reparameterisation along the diagonal Δ : P → P × P.

`tying_map`, `para_tie` and `slot_uses` are shared with `lenses`, so that the rules (how slots are
tied, how uses are counted) are written once.
"""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from typing import Sequence, cast

import jax
import jax.numpy as jnp
import numpy as np

from ._compose import check_composable, check_landed, check_map_parts, need_operand
from .errors import KindError, SlotError, SpaceMismatch
from .smooth import Smooth, need_smooth
from .spaces import Product, R, Space, euclidean, need_space


def chain_parts(f, g) -> tuple:
    """The flattened components of f ≫ g (a chain contributes its parts, anything else itself)."""
    return tuple(f.parts) + tuple(g.parts)


class Parameterised(ABC):
    """Anything with a parameter object P that may be reparameterised along r : Q → P (a `Para`,
    a parameterised lens): what weight tying asks of it (abstract).

    Examples:
        >>> from categories.para import Parameterised
        >>> isinstance(Para(R(), R(), R(), lambda a, p: p * a), Parameterised)
        True
    """

    name: str
    param: Space

    @property
    def parts(self) -> tuple:
        """Its components in sequence (a chain's; else itself)."""
        return (self,)

    @abstractmethod
    def reparam(self, r: Smooth, *args, **kwargs) -> "Parameterised":
        """The 2-cell along r : Q → P."""


class Para(Parameterised):
    """A parameterised smooth map (P, f : A × P → B); call it as `f(a, p)`.

    Examples:
        >>> f = Para(R(), R(), R(), lambda a, p: p * a, "scale")
        >>> float(f(2.0, 3.0))
        6.0
    """

    def __init__(self, dom: Space, cod: Space, param: Space, fn, name: str | None = None):
        check_map_parts("Para", dom, cod, fn, name=name)
        need_space(param, "Para: the parameter object")
        self.dom, self.cod, self.param, self.fn = dom, cod, param, fn
        self.name: str = name if name else str(getattr(fn, "__name__", "f"))

    def __call__(self, a, p):
        # The one check of a point (`Space.check`: shapes always, values when concrete), once
        # per call: a chain runs its parts' `fn`, unchecked, between its own ends.
        self.dom.check(a, f"the argument of {self.name}")
        self.param.check(p, f"the parameters of {self.name}")
        b = self.fn(a, p)
        check_landed(self, b)  # shapes only: static, once per trace under jit
        return b

    def __rshift__(self, other: "Para") -> "Para":
        need_operand(self, ">>", other, Para, "a parameterised map composes with a "
                     "parameterised map (a Para, e.g. Para(R(2), R(2), R(), lambda a, p: p * a))")
        return ParaChain(chain_parts(self, other))  # the chain checks that its parts compose

    def reparam(self, r: Smooth, name: str | None = None) -> "Para":
        """The 2-cell along r : Q → P: the map (Q, (a, q) ↦ f(a, r q))."""
        need_smooth(r, f"{self.name}.reparam")
        if r.cod != self.param:
            raise SpaceMismatch(
                f"cannot reparameterise {self.name} (parameters {self.param!r}) along "
                f"{r.name} : {r.dom!r} → {r.cod!r}"
            )
        fn, rf = self.fn, r.fn  # the reparameterised map's call checks q; r q lands in P
        return Para(self.dom, self.cod, r.dom, lambda a, q: fn(a, rf(q)),
                    name or f"{self.name}[{r.name}]")

    def as_smooth(self) -> Smooth:
        """The underlying morphism A × P → B of the ambient category."""
        return Smooth(self.dom * self.param, self.cod, lambda ap: self(ap[0], ap[1]), self.name)

    def __repr__(self) -> str:
        return f"{self.name} : {self.dom!r} → {self.cod!r}, params {self.param!r}"


class ParaChain(Para):
    """f_1 ≫ ... ≫ f_n with parameter object P_1 × ... × P_n (one slot per component).

    Examples:
        >>> f = Para(R(), R(), R(), lambda a, p: p * a, "scale")
        >>> g = ParaChain([f, f])
        >>> float(g(2.0, (3.0, 4.0))), g.param
        (24.0, R × R)
    """

    def __init__(self, parts: Sequence[Para]):
        parts = tuple(parts) if isinstance(parts, (list, tuple)) else parts
        if not isinstance(parts, tuple) or not parts or \
                not all(isinstance(p, Para) for p in parts):
            raise KindError(f"ParaChain needs a non-empty list of Para maps, got {parts!r}")
        for f, g in zip(parts, parts[1:]):  # the one check of ≫: each codomain the next domain
            check_composable(f, g)
        self._parts = parts
        super().__init__(parts[0].dom, parts[-1].cod, Product(*(p.param for p in parts)), self._run,
                         " ≫ ".join(p.name for p in parts))

    @property
    def parts(self) -> tuple:
        return self._parts

    def _run(self, a, ps):
        for part, p in zip(self._parts, ps):
            a = part.fn(a, p)  # checked once at the chain's ends (`Para.__call__`)
        return a


def para_identity(A: Space) -> Para:
    """The identity (R^0, (a, None) ↦ a).

    Examples:
        >>> i = para_identity(R(2))
        >>> i(jnp.array([1.0, 2.0]), None).tolist(), i.param
        ([1.0, 2.0], R^0)
    """
    need_space(A, "para_identity")
    return Para(A, A, R(0), lambda a, p: a, "id")


def para_of(f: Smooth) -> Para:
    """A plain map as a parameterised one with no parameters (R^0).

    Examples:
        >>> f = para_of(Smooth(R(), R(), jnp.sin, "sin"))
        >>> round(float(f(0.5, None)), 4), f.param
        (0.4794, R^0)
    """
    need_smooth(f, "para_of")
    fn = f.fn
    return Para(f.dom, f.cod, R(0), lambda a, p: fn(a), f.name)


# -- weight tying ----------------------------------------------------------------------------

def check_slots(P: Space, slots) -> list:
    """The distinct slots `slots` of the product P, sorted, if each is an integer slot of P
    (numpy integers welcome; bools, floats, negative or too large indices refused, naming
    the index) and there are at least two; else `SlotError` (or `SpaceMismatch` when P is
    not a product)."""
    if not isinstance(P, Product):
        raise SpaceMismatch(f"weight tying needs a product parameter object, got {P!r}")
    # a mapping or a set iterates (its keys) but is not the documented list of slots
    if isinstance(slots, (str, bytes, dict, set, frozenset)) or not hasattr(slots, "__iter__") \
            or hasattr(slots, "keys"):
        raise SlotError(f"tie needs a list of slot indices (e.g. [0, 2]), got "
                        f"{type(slots).__name__} {slots!r}: pass the slots to share as a list")
    n, out = len(P.factors), []
    for s in slots:
        if isinstance(s, (bool, np.bool_)):
            raise SlotError(f"slot index {s!r} is not an integer (the parameter object {P!r} has "
                            f"slots 0 to {n - 1})")
        try:
            i = operator.index(s)
        except TypeError:
            raise SlotError(f"slot index {s!r} is not an integer (the parameter object {P!r} has "
                            f"slots 0 to {n - 1})") from None
        if not 0 <= i < n:
            raise SlotError(f"slot index {i} is not a slot of {P!r}: it has slots 0 to {n - 1}")
        out.append(int(i))
    out = sorted(set(out))
    if len(out) < 2:
        raise SlotError(f"tying needs at least two distinct slots, got {list(slots)!r}")
    return out


class TyingMap(Smooth):
    """r : Q → P sharing the slots `slots` of the product P: Q is P with the tied slots after
    the first removed (`keep`: the slots of P that Q keeps), and r copies the shared slot into
    each of its places (for two slots, the diagonal Δ : P_i → P_i × P_i placed in P).

    Examples:
        >>> from categories.para import TyingMap
        >>> r = TyingMap(Product(R(), R(), R(2)), [0, 1])
        >>> r.dom, r.slots, r.keep, r.one_slot
        (R × R^2, (0, 1), (0, 2), False)
    """

    slots: tuple  # the checked slots of P, sorted
    keep: tuple  # the slots of P that Q keeps (the first tied one among them)

    def __init__(self, P: Space, slots: Sequence[int]):
        checked = check_slots(P, slots)
        assert isinstance(P, Product)  # check_slots refuses any other parameter object
        shared = P.factors[checked[0]]
        for s in checked[1:]:
            if P.factors[s] != shared:
                raise SpaceMismatch(
                    f"cannot tie slot {checked[0]} ({shared!r}) with slot {s} ({P.factors[s]!r}): "
                    "tied slots must have the same parameter object")
        self.slots = tuple(checked)
        self.keep = tuple(i for i in range(len(P.factors)) if i not in checked[1:])
        # every slot tied: Q is the shared object itself (even a product (W, b)), r the diagonal
        Q = shared if self.one_slot else Product(*(P.factors[i] for i in self.keep))
        where = {i: k for k, i in enumerate(self.keep)}
        first, n = checked[0], len(P.factors)

        def r(q):
            if self.one_slot:
                return tuple(q for _ in range(n))
            return tuple(q[where[first]] if i in checked else q[where[i]] for i in range(n))

        super().__init__(Q, P, r, "Δ" if len(checked) == 2 else f"Δ{len(checked)}")
        self.section = self.keep_slots  # how a point of P, such as an initial point, gives one of Q

    @property
    def one_slot(self) -> bool:
        return len(self.keep) == 1

    def keep_slots(self, p):
        """The left inverse P → Q: the kept slots of p (the first of the tied ones)."""
        return p[self.keep[0]] if self.one_slot else tuple(p[i] for i in self.keep)


def tying_map(P: Space, slots: Sequence[int]) -> TyingMap:
    """r : Q → P sharing the slots `slots` of the product P (they must be the same space): the
    `TyingMap`.

    Examples:
        >>> r = tying_map(R() * R(), [0, 1])
        >>> r.dom, r.cod
        (R, R × R)
        >>> [float(v) for v in r(jnp.asarray(3.0))]
        [3.0, 3.0]
    """
    return TyingMap(P, slots)


def para_tie(f, slots: Sequence[int]):
    """Weight tying, `f.reparam(tying_map(f.param, slots))`, for anything parameterised (a
    `Para`, a parameterised lens): the shared slot receives the sum of its uses' covectors.

    Examples:
        >>> f = Para(R(), R(), R(), lambda a, p: p * a, "scale")
        >>> tied = para_tie(f >> f, [0, 1])
        >>> float(tied(2.0, 3.0)), tied.param
        (18.0, R)
    """
    if not isinstance(f, Parameterised):
        raise KindError(f"tie needs a parameterised map or lens (with a parameter object), got "
                        f"{type(f).__name__} {f!r} (for a family of lenses use lenses.tie)")
    r = tying_map(f.param, slots)
    return f.reparam(r, name=f"tie({f.name}, {list(r.slots)})")


def slot_uses(r: Smooth, inner_uses: Sequence[int], seed: int = 0) -> tuple:
    """How many times each slot of Q is used by (Q, f ∘ (1 × r)) when f uses P's slots `inner_uses` times.

    A slot of Q reaches the slots of P that move when it moves (read off a JVP of r in a
    random tangent direction, so that it holds for any smooth r, not only for tying maps).

    Examples:
        >>> slot_uses(tying_map(R() * R(), [0, 1]), [1, 1])
        (2,)
    """
    need_smooth(r, "slot_uses")
    Q, P = r.dom, r.cod
    key = jax.random.PRNGKey(seed)
    # Any point and any direction with no zero coordinate will do; zeros and ones need no
    # random-number compilation for each new shape.
    q0 = Q.zeros() if euclidean(Q) else Q.sample_interior(key)
    single = r.one_slot
    q_factors = (Q,) if single else cast(Product, Q).factors  # not one slot: a product
    counts = []
    for i, F in enumerate(q_factors):
        if F.size == 0:
            counts.append(0)
            continue
        direction = jax.tree_util.tree_map(jnp.ones_like, F.tangent.zeros())
        if single:
            tangent = direction
        else:
            tangent = list(Q.tangent.zeros())
            tangent[i] = direction
            tangent = tuple(tangent)
        out = jax.jvp(r.fn, (q0,), (tangent,))[1]
        outs = out if isinstance(P, Product) else (out,)
        counts.append(sum(inner_uses[j] for j, o in enumerate(outs)
                          if any(bool(jnp.any(leaf != 0)) for leaf in jax.tree_util.tree_leaves(o))))
    return tuple(counts)


__all__ = [
    "Para", "ParaChain", "para_identity", "para_of", "tying_map", "para_tie", "slot_uses",
    "chain_parts", "check_slots", "TyingMap", "Parameterised",
]
