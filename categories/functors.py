"""The differential D, the dual, their composite, and the reverse derivative R.

- `D(f, x)`: the differential df_x : T_xA → T_{f x}B, a `Linear` computed by `jax.linearize`.
  (x, f) ↦ df_x is a functor on pointed spaces: covariant, d(g∘f)_x = dg_{f x} ∘ df_x.
- `dual(L)`: the transpose L* between cotangent spaces; contravariant, (B∘A)* = A*∘B*.
- `pullback(f, x) = dual(D(f, x))`: the composite, contravariant; this is why the
  backward pass runs in reverse order (paper_notes/03-composition-reverses.md).
- `reverse_derivative(f)`: the smooth map R[f] : A × B* → A*, (x, y') ↦ (df_x)*(y'),
  by `jax.vjp` (a vector–Jacobian product; the Jacobian is never formed).
"""

from __future__ import annotations

import jax

from .linear import Linear, need_linear, once
from .smooth import Smooth, need_smooth


def D(f: Smooth, x) -> Linear:
    """The differential of f at x, df_x : R^dom → R^cod (a forward-mode JVP).

    Examples:
        >>> f = Smooth(R(2), R(), lambda x: x[0] * x[1], "mul")
        >>> df = D(f, jnp.array([2.0, 3.0]))
        >>> float(unwrap(df(Vector(jnp.array([1.0, 0.0])))))
        3.0
    """
    need_smooth(f, "D(f, x)")
    if f.checked:  # x is a point of f's domain (shapes, and membership when concrete)
        f.dom.check(x, f"the point x of D({f.name}, x)")
    fn = f.fn
    # Linearised at x once, when first applied (and its transpose likewise): a differential
    # is applied many times (`matrix` applies it to every basis vector), and a fresh
    # `jax.jvp` per application would evaluate and trace f again each time.
    tangent_map = once(lambda: jax.linearize(fn, x)[1])
    cotangent_map = once(lambda: jax.vjp(fn, x)[1])

    def apply(v):
        return tangent_map()(v)

    def transpose(y):
        return cotangent_map()(y)[0]

    return Linear(f.dom, f.cod, apply, transpose=transpose, name=f"d{f.name}")


def dual(L: Linear) -> Linear:
    """The dual (transpose) of a linear map.

    Examples:
        >>> f = Smooth(R(2), R(), lambda x: x[0] * x[1], "mul")
        >>> unwrap(dual(D(f, jnp.array([2.0, 3.0])))(Covector(jnp.asarray(1.0), R()))).tolist()
        [3.0, 2.0]
    """
    need_linear(L, "dual")
    return L.dual()


def pullback(f: Smooth, x) -> Linear:
    """(df_x)* : T*_{f x}B → T*_xA, the composite of D and the dual (a VJP).

    Examples:
        >>> f = Smooth(R(2), R(), lambda x: x[0] * x[1], "mul")
        >>> unwrap(pullback(f, jnp.array([2.0, 3.0]))(Covector(jnp.asarray(1.0), R()))).tolist()
        [3.0, 2.0]
    """
    return dual(D(f, x))


def reverse_derivative(f: Smooth) -> Smooth:
    """R[f] : A × B* → A*, `R[f](x, y') = (df_x)*(y')`, never forming the Jacobian.

    Examples:
        >>> f = Smooth(R(2), R(), lambda x: x[0] * x[1], "mul")
        >>> unwrap(reverse_derivative(f)((jnp.array([2.0, 3.0]), jnp.asarray(1.0)))).tolist()
        [3.0, 2.0]
    """
    need_smooth(f, "reverse_derivative")
    fn = f.fn

    def rf(xy):
        x, y = xy
        return jax.vjp(fn, x)[1](y)[0]

    return Smooth(f.dom * f.cod.tangent, f.dom.tangent, rf, f"R[{f.name}]")


def linear_smooth(L: Linear) -> Smooth:
    """A linear map regarded as a smooth map (a morphism of the ambient category).

    Examples:
        >>> g = linear_smooth(Linear(R(2), R(2), lambda v: 2 * v))
        >>> g(jnp.array([1.0, 2.0])).tolist()
        [2.0, 4.0]
    """
    need_linear(L, "linear_smooth")
    return Smooth(L.dom, L.cod, L.apply, L.name)


__all__ = ["D", "dual", "pullback", "reverse_derivative", "linear_smooth"]
