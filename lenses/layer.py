"""The primitive kind of lens: a `Layer` (P, f, f') built from its forward part.

`Layer(dom, cod, param, forward)` is the theory's (P, f, f') with f' derived by JAX
(`jax.vjp`), or given (`backward=`); at construction its forward part is traced once on an
abstract point of its domain, and a value that does not land in its codomain is refused.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from categories import Product, Space
from categories.draws import need_key
from categories.errors import CovectorError, KindError, SpaceMismatch
from categories.points import describe

from . import picture
from .inputs import check_init, flag, need_callable, need_lens, need_name
from .para_lens import ParaLens
from .sites import Affine, Site, need_structure

tree_map = jax.tree_util.tree_map


def _abstract(space: Space):
    """A ShapeDtypeStruct pytree standing for a point of `space` (for shape inference)."""
    if isinstance(space, Product):
        return tuple(_abstract(f) for f in space.factors)
    if space.is_terminal:
        return None
    return jax.ShapeDtypeStruct(space.shape, jnp.zeros(()).dtype)


class Layer(ParaLens):
    """A primitive lens (P, f, f') : A → B from its forward part f (and optionally f').

    `init`, if given, must give a point of `param` (checked when called: `SpaceMismatch` for
    another shape, `DomainError` for NaN or a point outside the open set where concrete).
    `name` is a string; `check` and `smooth` are True or False.
    `structure` declares what structured metrics may use (`Affine(bias=...)` for x ↦ W x + b);
    `node=True` draws it as a dot, as copy, add and discard are drawn (they say which:
    `node="copy"`, `"add"`, `"discard"`, so that a drawing may use its own copy boxes).

    Examples:
        >>> layer = Layer(R(), R(), R(), lambda a, p: p * a, name="scale")
        >>> type(layer).__name__, layer.param
        ('Layer', R)
    """

    def __init__(self, dom: Space, cod: Space, param: Space, forward: Callable,
                 backward: Callable | None = None, name: str | None = None,
                 init: Callable | None = None, smooth: bool = True, check: bool = True,
                 structure: Any = None, node: bool | str = False,
                 at_evaluation: ParaLens | None = None):
        for what, space in (("domain", dom), ("codomain", cod), ("parameter object", param)):
            if not isinstance(space, Space):
                raise KindError(f"the {what} of a lens must be a Space (e.g. R(3)), got {space!r}")
        self.dom, self.cod, self.param = dom, cod, param
        self.name = need_name(name, "Layer") or str(getattr(forward, "__name__", "f"))
        for what, fn in (("forward", forward), ("backward", backward), ("init", init)):
            need_callable(fn, f"the {what} part of {self.name}", optional=what != "forward")
        need_structure(structure, self.name)
        if structure is not None:
            why = structure.mismatch(dom, cod, param)
            if why:
                raise KindError(f"the structure {structure!r:.40} declared by {self.name} does "
                                f"not fit it: {why}")
        if at_evaluation is not None:
            need_lens(at_evaluation, f"the at_evaluation of {self.name}")
        self._forward, self._backward, self._init = forward, backward, init
        self.smooth = flag(smooth, f"the smooth flag of {self.name}")
        self.structure, self.node = structure, _node(node, self.name)
        self.at_evaluation = at_evaluation
        if flag(check, f"the check flag of {self.name}"):
            self._check_forward_shape()

    def _check_forward_shape(self):
        try:
            out = jax.eval_shape(self._forward, _abstract(self.dom), _abstract(self.param))
        except Exception as e:  # noqa: BLE001 - re-raised with the lens's name
            raise SpaceMismatch(f"the forward part of {self.name} : {self.dom!r} → {self.cod!r} "
                            f"(params {self.param!r}) fails on a point of its domain: {e}") from e
        why = self.cod.mismatch(out, "its value")
        if why:
            raise SpaceMismatch(f"the forward part of {self.name} does not land in its codomain "
                            f"{self.cod!r}: {why}")

    @property
    def derives(self) -> bool:
        return self._backward is None

    def apply(self, a, p, batched):
        return (jax.vmap(self._forward, (0, None)) if batched else self._forward)(a, p)

    def apply_vjp(self, a, p, batched):
        if self._backward is None:
            return ParaLens.apply_vjp(self, a, p, batched)
        b, given = self.apply(a, p, batched), self._backward

        def back(a, p, bc):  # its result's shapes are static: checked once a trace
            return self._checked_backward(given(a, p, bc))

        if not batched:
            return b, lambda bc: back(a, p, bc)

        def pull(bc):  # per example, then the parameter covectors added over the batch
            da, dp = jax.vmap(back, (0, None, 0))(a, p, bc)
            return da, tree_map(lambda x: jnp.sum(x, axis=0), dp)

        return b, pull

    def _checked_backward(self, out):
        """The hand-written backward part's (a', p'), if shaped as covectors on the domain and
        on the parameter object, else `CovectorError` naming the layer and which is wrong."""
        if not isinstance(out, tuple) or len(out) != 2:
            raise CovectorError(f"the backward part of {self.name} must return a pair (a', p') "
                                f"of covectors on {self.dom!r} and on {self.param!r}, got "
                                f"{describe(out)}")
        for what, space, c in (("a'", self.dom, out[0]), ("p'", self.param, out[1])):
            why = space.tangent.mismatch(c, what)
            if why:
                raise CovectorError(f"the backward part of {self.name} gives {what} that is not "
                                    f"a covector on {space!r}: {why}")
        return out

    def rebuild(self, children):
        return self

    def sites(self):
        return (Site(self, (), self.structure),) if self.param.size else ()

    def probe(self, a, p, deltas, inputs):
        if not isinstance(self.structure, Affine):
            return self.apply(a, p, False)
        inputs.append(a)
        return self.apply(a, p, False) + next(deltas)

    def init(self, key):
        need_key(key)
        if self._init is None:
            return self.param.sample_interior(key)
        return check_init(self._init(key), self.param, self.name)

    def picture(self):
        if self.node and self.param.size == 0:
            return picture.Dot(self.name, self.dom, self.cod,
                               self.node if isinstance(self.node, str) else "node")
        return picture.Boxed(self.name, self.dom, self.cod, self.param)

    def atoms(self):
        return [self]


#: how a node is drawn: a dot of one of these kinds (True: "node")
NODES = ("copy", "add", "discard")


def _node(node, name: str):
    """node if it is True, False or one of `NODES`, else `KindError` naming the layer."""
    if isinstance(node, str) and node in NODES:
        return node
    if isinstance(node, str):
        raise KindError(f"the node of {name} must be True, False or one of {NODES}, got {node!r}")
    return flag(node, f"the node of {name}", f"True, False or one of {NODES}")


def derived(lens: ParaLens) -> ParaLens:
    """The same forward part with the backward part derived by JAX (for comparisons).

    Examples:
        >>> model = checkpoint(dense(2, 2) >> tanh)
        >>> d = derived(model)
        >>> p, x = model.init(jax.random.PRNGKey(0)), jnp.ones(2)
        >>> np.allclose(unwrap(model.backward(x, p, jnp.ones(2))[0]), unwrap(d.backward(x, p, jnp.ones(2))[0]))
        True
    """
    need_lens(lens, "derived")
    lens = lens.fixed("derived")
    return Layer(lens.dom, lens.cod, lens.param, lens.forward, name=lens.name, check=False)


__all__ = ["Layer", "derived"]
