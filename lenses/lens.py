"""Lenses in the ambient category: (get : A → B, put : A × B* → A*).

Composition (f, f') ≫ (g, g') = (f ≫ g, (a, c') ↦ f'(a, g'(f(a), c'))): the second backward
part runs first, at the forward value f(a). `lens_of(f) = (f, R[f])` is the functor from
smooth maps to lenses given by the reverse derivative. Values here are raw pytrees (the
ambient category's points); `ParaLens` wraps its results as `Covector`s.

A lens checks what it is given and what its parts give, as a smooth map does: `get(a)` takes a
point of the domain and its value must be shaped as a point of the codomain (`SpaceMismatch`),
`put(a, b')` takes a point and a covector on the codomain and its value must be a covector on
the domain (`CovectorError`). Shapes are static (checked once per trace under `jax.jit`); a
point's values (finite, inside the open set) are checked only where they are concrete.
"""

from __future__ import annotations

from categories import Smooth, Space, check_composable, need_operand, reverse_derivative
from categories.errors import KindError, SpaceMismatch

from .inputs import check_cotangent, need_callable, need_lens, need_name, need_space

#: what a lens's operators take
_TAKES = "a lens composes with a lens (a Lens, e.g. lens_identity(R(2)))"


class Lens:
    """A lens A → B: get : A → B and put : A × B* → A*, with put(a, b') = a'.

    Examples:
        >>> double = Lens(R(), R(), lambda a: 2 * a, lambda a, b: 2 * b, "double")
        >>> (double >> double).get(1.0), (double >> double).put(1.0, 1.0)
        (4.0, 4.0)
    """

    def __init__(self, dom: Space, cod: Space, get, put, name: str | None = None):
        need_space(dom, "Lens: the domain")
        need_space(cod, "Lens: the codomain")
        for what, fn in (("get", get), ("put", put)):
            need_callable(fn, f"Lens: {what}")
        self.dom, self.cod, self._get, self._put = dom, cod, get, put
        self.name = need_name(name, "Lens") or "lens"

    def get(self, a):
        """get(a), a point of the codomain, for a point a of the domain (`DomainError` for
        another a; `SpaceMismatch` where get's value is not shaped as a point of the codomain)."""
        self.dom.check(a, f"the argument of get {self.name}")
        b = self._get(a)
        why = self.cod.mismatch(b, "its value")
        if why:
            raise SpaceMismatch(f"get {self.name} : {self.dom!r} → {self.cod!r} does not land in "
                                f"its codomain: {why}")
        return b

    def put(self, a, b_cov):
        """put(a, b') = a', a covector on the domain, for a point a of the domain and a covector
        b' on the codomain (`DomainError`, `CovectorError` for others; `CovectorError` where
        put's value is not a covector on the domain)."""
        self.dom.check(a, f"the point given to put {self.name}")
        check_cotangent(self.cod, b_cov, f"the covector given to put {self.name}")
        a_cov = self._put(a, b_cov)
        check_cotangent(self.dom, a_cov, f"the value of put {self.name}")
        return a_cov

    def __rshift__(self, other: "Lens") -> "Lens":
        need_operand(self, ">>", other, Lens, _TAKES)
        check_composable(self, other)
        f, fp, g, gp = self.get, self.put, other.get, other.put
        return Lens(self.dom, other.cod, lambda a: g(f(a)),
                    lambda a, c: fp(a, gp(f(a), c)), f"{self.name} ≫ {other.name}")

    def __matmul__(self, other: "Lens") -> "Lens":
        """The product lens A × C → B × D."""
        need_operand(self, "@", other, Lens, _TAKES)
        f, fp, g, gp = self.get, self.put, other.get, other.put
        return Lens(self.dom * other.dom, self.cod * other.cod,
                    lambda ac: (f(ac[0]), g(ac[1])),
                    lambda ac, bd: (fp(ac[0], bd[0]), gp(ac[1], bd[1])),
                    f"({self.name} ⊗ {other.name})")

    def get_map(self) -> Smooth:
        return Smooth(self.dom, self.cod, self.get, f"get {self.name}", check=False)

    def put_map(self) -> Smooth:
        return Smooth(self.dom * self.cod.tangent, self.dom.tangent,
                      lambda ab: self.put(ab[0], ab[1]), f"put {self.name}", check=False)

    def __repr__(self) -> str:
        return f"{self.name} : {self.dom!r} ⇄ {self.cod!r}"


def lens_identity(A: Space) -> Lens:
    """1_A : A ⇄ A, the identity lens: get(a) = a and put(a, a') = a'.

    Examples:
        >>> i = lens_identity(R())
        >>> i.get(2.0), i.put(2.0, 5.0)
        (2.0, 5.0)
    """
    need_space(A, "lens_identity")
    return Lens(A, A, lambda a: a, lambda a, b: b, "id")


def lens_of(f: Smooth) -> Lens:
    """The lens (f, R[f]) of a smooth map: the functor Smooth → Lens.

    Examples:
        >>> sq = lens_of(Smooth(R(), R(), lambda x: x * x, "sq"))
        >>> float(sq.get(jnp.asarray(3.0))), float(sq.put(jnp.asarray(3.0), jnp.asarray(1.0)))
        (9.0, 6.0)
    """
    if not isinstance(f, Smooth):
        raise KindError(f"lens_of needs a smooth map (a Smooth, e.g. Smooth(R(), R(), jnp.sin)), "
                        f"got {type(f).__name__} {f!r}")
    rf = reverse_derivative(f).fn
    return Lens(f.dom, f.cod, f.fn, lambda a, b: rf((a, b)), f.name)


def as_lens(para_lens) -> Lens:
    """A parameterised lens (P, f, f') as a plain lens A × P ⇄ B (the parameters become input).

    Examples:
        >>> L = as_lens(linear(1, 1))
        >>> L
        linear(1→1) : R^1 × R^{1×1} ⇄ R^1
        >>> x, W = jnp.array([2.0]), jnp.array([[3.0]])
        >>> L.get((x, W)).tolist(), [v.tolist() for v in L.put((x, W), jnp.array([1.0]))]
        ([6.0], [[3.0], [[2.0]]])
    """
    need_lens(para_lens, "as_lens")
    para_lens = para_lens.fixed("as_lens")
    fwd, back = para_lens.forward, para_lens.backward

    def put(ap, b):
        da, dp = back(ap[0], ap[1], b)
        return (da.value, dp.value)

    return Lens(para_lens.dom * para_lens.param, para_lens.cod,
                lambda ap: fwd(ap[0], ap[1]), put, para_lens.name)


__all__ = ["Lens", "lens_identity", "lens_of", "as_lens"]
