"""Tangent vectors, cotangent vectors, and linear maps between tangent spaces.

`Vector` (an element of T_pA = R^shape) and `Covector` (an element of T*_pA = (R^shape)*) are
distinct pytree types. Both are vector spaces. A vector moves a point (`p - v`), a covector
does not: it is a measurement on vectors (`cov(v)` is the pairing ⟨cov, v⟩), and turning it
into a vector needs an inner product's sharp map. Keeping the two apart is what puts the
choice of inner product in view (paper_notes/05-sharp-and-update.md).

`Linear(dom, cod, apply)`: a linear map between tangent spaces (or, for a dual, between
cotangent spaces); `.dual()` is its transpose, `>>` composes diagrammatically.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ._compose import check_composable, check_landed, check_map_parts, need_operand
from .points import describe, is_concrete, shape_of
from .spaces import Product, Space, need_space
from .errors import CovectorError, DomainError, KindError, ShapeError, SpaceMismatch

tree_map = jax.tree_util.tree_map

COVECTOR_IS_NOT_A_POINT = (
    "a covector is not a point (nor a vector): it measures vectors, it cannot move a point. "
    "Turn it into a Vector with a sharp map of an inner product first, e.g. "
    "metric.sharp(p, covector), and subtract that."
)


def _leaves_add(x, y):
    return tree_map(lambda a, b: a + b, x, y)


def _scale(c, x):
    return tree_map(lambda a: c * a, x)


def pairing(covector_value, vector_value):
    """⟨y', v⟩ = Σ y'_i v_i over all leaves (raw pytrees of the same structure).

    Examples:
        >>> float(pairing(jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0])))
        11.0
    """
    leaves_c = jax.tree_util.tree_leaves(covector_value)
    leaves_v = jax.tree_util.tree_leaves(vector_value)
    if len(leaves_c) != len(leaves_v):
        raise CovectorError("pairing a covector and a vector of different structure")
    shapes = [(shape_of(c), shape_of(v)) for c, v in zip(leaves_c, leaves_v)]  # static
    if any(c != v for c, v in shapes):
        i = next(i for i, (c, v) in enumerate(shapes) if c != v)
        raise CovectorError(f"pairing a covector and a vector of different shapes: leaf {i} of "
                            f"the covector has shape {shapes[i][0]}, of the vector {shapes[i][1]}")
    return sum((jnp.sum(c * v) for c, v in zip(leaves_c, leaves_v)), jnp.asarray(0.0))


class _Tangent:
    """Shared vector-space structure of `Vector` and `Covector` (same kind only)."""

    __slots__ = ("value", "space")
    __array_ufunc__ = None  # numpy must defer to our reflected operators
    __array_priority__ = 1000

    def __init__(self, value, space: Space | None = None):
        if space is not None:  # checked where a user builds one; JAX's rebuilds are not (`_made`)
            _check_value(type(self).__name__, value, space)
        self.value = value
        self.space = space

    @classmethod
    def _made(cls, value, space):
        """One built from a value known to fit (an operation's result, or JAX rebuilding the
        pytree with tracers or placeholders under `jit`/`vmap`/`tree_map`): not checked."""
        made = object.__new__(cls)
        made.value, made.space = value, space
        return made

    @classmethod
    def zero(cls, space: Space):
        return cls(space.tangent.zeros(), space)

    def _same_kind(self, other, op):
        if type(other) is not type(self):
            raise CovectorError(self._mix_message(other, op))
        kind = type(self).__name__
        if self.space is not None and other.space is not None and \
                self.space.tangent != other.space.tangent:  # Positive(2) and R(2): one R^2
            raise SpaceMismatch(f"cannot {op} a {kind} on {self.space!r} and a {kind} on "
                                f"{other.space!r}: both must be on one tangent space")
        shapes = [tree_map(jnp.shape, t.value) for t in (self, other)]  # static under a trace
        if jax.tree_util.tree_structure(self.value) != jax.tree_util.tree_structure(other.value) \
                or shapes[0] != shapes[1]:
            raise CovectorError(f"cannot {op} {kind}s of different shapes: {shapes[0]} and "
                                f"{shapes[1]}")
        return other

    def _mix_message(self, other, op):
        return f"cannot {op} {type(self).__name__} and {type(other).__name__}"

    def __add__(self, other):
        other = self._same_kind(other, "add")
        return type(self)._made(_leaves_add(self.value, other.value), self.space or other.space)

    def __sub__(self, other):
        other = self._same_kind(other, "subtract")
        return self + (-other)

    def __neg__(self):
        return type(self)._made(_scale(-1.0, self.value), self.space)

    def __mul__(self, c):
        if isinstance(c, _Tangent):
            return NotImplemented
        if not hasattr(c, "dtype") and not isinstance(c, (int, float, np.number)):
            raise KindError(f"cannot scale a {type(self).__name__} by {type(c).__name__} "
                            f"{c!r:.40}: a tangent is scaled by a real number")
        return type(self)(_scale(c, self.value), self.space)

    __rmul__ = __mul__

    def __truediv__(self, c):
        return self * (1.0 / c)

    def __eq__(self, other):  # structural, for tests; use `allclose` for numbers
        return type(other) is type(self) and all(
            np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(self.value),
                                                  jax.tree_util.tree_leaves(other.value))
        )

    __hash__ = None  # type: ignore[assignment]  # unhashable: equality compares arrays

    def __repr__(self):
        where = f" on {self.space!r}" if self.space is not None else ""
        return f"{type(self).__name__}{where}({self.value!r})"


class Vector(_Tangent):
    """A tangent vector v ∈ T_pA ≅ R^shape. `p - v` and `p + v` move the point p.

    Examples:
        >>> (jnp.array([1.0, 2.0]) - Vector(jnp.array([0.5, 0.5]))).tolist()
        [0.5, 1.5]
    """

    __slots__ = ()

    def __rsub__(self, point):
        if isinstance(point, Covector):
            raise CovectorError(COVECTOR_IS_NOT_A_POINT)
        return _leaves_add(point, _scale(-1.0, self.value))

    def __radd__(self, point):
        if isinstance(point, Covector):
            raise CovectorError(COVECTOR_IS_NOT_A_POINT)
        return _leaves_add(point, self.value)

    def _mix_message(self, other, op):
        if isinstance(other, Covector):
            return f"cannot {op} a Vector and a Covector: {COVECTOR_IS_NOT_A_POINT}"
        return super()._mix_message(other, op)


class Covector(_Tangent):
    """A cotangent vector y' ∈ T*_pA ≅ (R^shape)*; `y'(v)` is the pairing ⟨y', v⟩.

    Examples:
        >>> c = Covector(jnp.array([1.0, 2.0]))
        >>> float(c(Vector(jnp.array([3.0, 4.0]))))
        11.0
        >>> jnp.ones(2) - c
        Traceback (most recent call last):
            ...
        categories.errors.CovectorError: a covector is not a point (nor a vector): it measures ve...
    """

    __slots__ = ()

    def _mix_message(self, other, op):
        return f"cannot {op} a Covector and {type(other).__name__}: {COVECTOR_IS_NOT_A_POINT}"

    def __radd__(self, other):
        raise CovectorError(COVECTOR_IS_NOT_A_POINT)

    def __rsub__(self, other):
        raise CovectorError(COVECTOR_IS_NOT_A_POINT)

    def __call__(self, v):
        return pairing(self.value, v.value if isinstance(v, Vector) else v)


def _flatten(t):
    return (t.value,), t.space


def _unflatten_as(cls):
    return lambda space, children: cls._made(children[0], space)


def _point_shapes(space: Space) -> list:
    """The array shapes of a point of `space`, leaf by leaf (none for R^0)."""
    if isinstance(space, Product):
        return [s for f in space.factors for s in _point_shapes(f)]
    return [] if space.is_terminal else [tuple(space.shape)]


def _as_real_zero(leaf):
    """float0 (JAX's covector of a discrete point: none) read as the zero it stands for."""
    dtype = getattr(leaf, "dtype", None)
    return jax.ShapeDtypeStruct(leaf.shape, jnp.float32) if dtype == jax.dtypes.float0 else leaf


def _check_value(kind: str, value, space) -> None:
    """Refuse a value that is not shaped as a tangent (cotangent) vector on `space`, with any
    leading axes (a batch of them): `Space.mismatch`, the one check, with the axes the first
    leaf has before a point's shape. `DomainError` for a Vector, `CovectorError` for a Covector."""
    T = need_space(space, f"{kind}(value, space)").tangent
    value = tree_map(_as_real_zero, value)
    shapes, leaves = _point_shapes(T), jax.tree_util.tree_leaves(value)
    lead: tuple = ()
    first = shape_of(leaves[0]) if shapes and leaves else None
    if first is not None and len(first) > len(shapes[0]) and \
            first[len(first) - len(shapes[0]):] == shapes[0]:
        lead = first[:len(first) - len(shapes[0])]
    why = T.mismatch(value, f"the value of the {kind}", lead)
    if why and kind == "Covector":
        raise CovectorError(f"Covector on {space!r}: {why}")
    if why:
        raise DomainError(f"{kind} on {space!r}: {why}")


for _cls in (Vector, Covector):
    jax.tree_util.register_pytree_node(_cls, _flatten, _unflatten_as(_cls))


def unwrap(x):
    """The raw pytree inside a Vector/Covector (or x itself).

    Examples:
        >>> unwrap(Vector(jnp.ones(2))).tolist(), unwrap(3)
        ([1.0, 1.0], 3)
    """
    return x.value if isinstance(x, _Tangent) else x


#: what a linear map's operators take
_TAKES = "a linear map combines with a linear map (a Linear, e.g. D(f, x))"


class Linear:
    """A linear map dom → cod between tangent spaces (`on="covectors"`: between cotangent spaces).

    `apply` acts on raw pytrees; calling the map on a `Vector` (`Covector` for a map on
    covectors) returns the same kind. `transpose`, when known, is the dual map's `apply`.

    Examples:
        >>> L = Linear(R(2), R(2), lambda v: 2 * v)
        >>> unwrap(L(Vector(jnp.ones(2)))).tolist()
        [2.0, 2.0]
    """

    def __init__(self, dom: Space, cod: Space, apply, transpose=None, on="vectors", name=None):
        check_map_parts("Linear", dom, cod, apply, "apply", name=name)
        if transpose is not None and not callable(transpose):
            raise KindError(f"Linear: transpose must be a function (the dual map's apply) or "
                            f"None, got {type(transpose).__name__} {transpose!r}")
        if on not in ("vectors", "covectors"):
            raise KindError(f"Linear: on must be \"vectors\" or \"covectors\", got {on!r}")
        self.dom, self.cod = dom.tangent, cod.tangent
        self.apply = apply
        self._transpose = transpose
        self.on = on
        self.name = name or "L"

    @property
    def kind(self):
        return Vector if self.on == "vectors" else Covector

    def __call__(self, v):
        tangent = isinstance(v, _Tangent)
        if tangent and not isinstance(v, self.kind):
            raise CovectorError(f"{self.name} : {self.dom!r} → {self.cod!r} acts on {self.on}, "
                                f"got a {type(v).__name__}")
        value = v.value if tangent else v  # a Vector (Covector), or its raw value
        # shapes only (static: once per trace under jit), as a Smooth map checks its point
        why = self.dom.mismatch(value, f"the argument of {self.name}")
        if why:
            raise DomainError(why)
        w = self.apply(value)
        check_landed(self, w)
        return self.kind(w, self.cod) if tangent else w

    def dual(self) -> "Linear":
        """The transpose A* : cod* → dom*, ⟨A* y', v⟩ = ⟨y', A v⟩ (computed by `jax.linear_transpose`)."""
        if self._transpose is not None:
            transpose = self._transpose
        else:
            apply, dom = self.apply, self.dom
            # transposed once, when first applied: `matrix` applies it to every basis vector
            transposed = once(lambda: jax.linear_transpose(apply, dom.zeros()))

            def transpose(y):
                if dom.is_terminal:
                    return None
                (out,) = transposed()(y)
                return out

        on = "covectors" if self.on == "vectors" else "vectors"
        name = self.name[:-1] if self.name.endswith("*") else self.name + "*"
        return Linear(self.cod, self.dom, transpose, transpose=self.apply, on=on, name=name)

    def __rshift__(self, other: "Linear") -> "Linear":
        """Diagrammatic composite: first self, then other."""
        need_operand(self, ">>", other, Linear, _TAKES)
        check_composable(self, other, None if self.on == other.on else
                         f"{self.name} acts on {self.on}, {other.name} on {other.on}")
        f, g = self.apply, other.apply
        ft, gt = self._transpose, other._transpose
        transpose = (lambda y: ft(gt(y))) if ft is not None and gt is not None else None
        return Linear(self.dom, other.cod, lambda v: g(f(v)), transpose, self.on,
                      f"{other.name}∘{self.name}")

    def compose(self, first: "Linear") -> "Linear":
        """self ∘ first (applicative order)."""
        need_operand(self, "∘", first, Linear, _TAKES)
        return first >> self

    def __mul__(self, other: "Linear") -> "Linear":
        """The product map A × C → B × D, (u, w) ↦ (self u, other w)."""
        need_operand(self, "*", other, Linear, _TAKES)
        f, g = self.apply, other.apply
        return Linear(self.dom * other.dom, self.cod * other.cod,
                      lambda uw: (f(uw[0]), g(uw[1])), on=self.on,
                      name=f"{self.name}×{other.name}")

    def matrix(self) -> jnp.ndarray:
        """The matrix in the standard bases, shape (cod.size, dom.size), for tests."""
        dom_leaves = _basis_columns(self.dom)
        cols = [flatten_value(self(e), self.cod) for e in dom_leaves]
        if not cols:
            return jnp.zeros((self.cod.size, 0))
        return jnp.stack(cols, axis=1)

    def __repr__(self):
        return f"{self.name} : {self.dom!r} → {self.cod!r} (linear on {self.on})"


def need_linear(L, who: str) -> None:
    """Refuse (`KindError`) an argument of `who` that is not a `Linear` map."""
    if not isinstance(L, Linear):
        raise KindError(f"{who} needs a linear map (a Linear, e.g. D(f, x)), got "
                        f"{type(L).__name__} {L!r:.40}")


def once(make):
    """A function returning make(), made on the first call and kept while what it holds is
    concrete: made under a trace (`jax.jit`, `vmap`, `grad`) it holds that trace's tracers,
    which must not outlive it, so it is made afresh on each call until it is made outside one."""
    kept = []

    def get():
        if kept:
            return kept[0]
        made = make()
        if is_concrete(made):
            kept.append(made)
        return made

    return get


def linear_identity(space: Space, on="vectors") -> Linear:
    """1 : T_A → T_A, the identity of the tangent space of `space` (`on="covectors"`: of T*_A).

    Examples:
        >>> unwrap(linear_identity(R(2))(Vector(jnp.array([1.0, 2.0])))).tolist()
        [1.0, 2.0]
    """
    return Linear(space, space, lambda v: v, transpose=lambda v: v, on=on, name="id")


def flatten_value(x, space: Space) -> jnp.ndarray:
    """A point/tangent value of `space` as one flat vector of length space.size.

    Examples:
        >>> flatten_value((jnp.ones((2, 2)), jnp.zeros(3)), R(2, 2) * R(3)).shape
        (7,)
    """
    need_space(space, "flatten_value")
    why = space.mismatch(x, "x")
    if why:
        raise DomainError(f"flatten_value: {why}")
    leaves = jax.tree_util.tree_leaves(x)
    if not leaves:
        return jnp.zeros((space.size,))
    return jnp.concatenate([jnp.ravel(leaf) for leaf in leaves])


def unflatten_value(flat, space: Space):
    """Inverse of `flatten_value`.

    Examples:
        >>> [a.shape for a in unflatten_value(jnp.arange(7.0), R(2, 2) * R(3))]
        [(2, 2), (3,)]
    """
    need_space(space, "unflatten_value")
    if shape_of(flat) != (space.size,):
        raise ShapeError(f"unflatten_value: {space!r} has {space.size} coordinates, so flat "
                         f"must be a vector of shape ({space.size},), got {describe(flat)}")
    template = space.tangent.zeros()  # its structure and shapes (flat keeps its dtype)
    leaves, treedef = jax.tree_util.tree_flatten(template)
    out, i = [], 0
    for leaf in leaves:
        out.append(jnp.reshape(flat[i:i + leaf.size], leaf.shape))
        i += leaf.size
    return jax.tree_util.tree_unflatten(treedef, out)


def _basis_columns(space: Space):
    eye = jnp.eye(space.size)
    return [unflatten_value(eye[i], space) for i in range(space.size)]
