"""Models written elsewhere as parameterised lenses: a plain function, an Equinox module, a Flax NNX module.

`from_function(f, params, dom)` is the general case: for f(params, x) and example parameters
(any pytree of real arrays), the lens (P, f, f') : A → B whose parameter object P is the
product of the arrays' spaces R^{shape} (a point is the tuple of the leaves, in the pytree's
order), whose forward part is f and whose backward part JAX derives (`jax.vjp`).
`from_equinox` and `from_flax` are built on it: the parameter object is the module's inexact
array leaves (Equinox: `eqx.partition(module, eqx.is_inexact_array)`) or its `nnx.Param`
state (Flax: `nnx.split(module, nnx.Param, ...)`); everything else stays fixed, as the
module holds it. Each `eqx.nn.Linear` or `nnx.Linear` inside becomes one slot (W, b) (W
alone without a bias) that declares its affine structure (`Affine`, Flax's kernel stored
transposed), so that `KFAC` finds and factors it, wherever it sits in the module. The
trained point goes back into a copy of the module with `to_equinox` / `to_flax`.

The frameworks are optional: each is imported only when its function is called.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from categories import Product, R, Space
from categories.points import describe
from categories.errors import KindError, MissingExtraError, SpaceMismatch, UnsupportedError

from ..composable import Composable
from ..inputs import need_callable, need_name
from ..layer import Layer
from ..para_lens import ParaLens
from ..sites import Affine, Site
from .. import picture


def _space(x, who: str, what: str = "domain") -> Space:
    if isinstance(x, Space):
        return x
    if isinstance(x, int) or (isinstance(x, tuple) and all(isinstance(n, int) for n in x)):
        return R(*((x,) if isinstance(x, int) else x))
    raise KindError(f"{who} needs its {what} as a Space (e.g. R(3)) or a shape, got {x!r}")


def _unit_space(shapes) -> Space:
    return R(*shapes[0]) if len(shapes) == 1 else Product(*(R(*s) for s in shapes))


class Wrapped(ParaLens):
    """f : A × P → B for a function f(tree, a) of a parameter pytree, P the product of its
    slots (a slot: one array, or the (W, b) of an affine layer), backward part by `jax.vjp`.

    `units`: per slot, the indices of its leaves in the pytree's order; `declared`: slot ↦
    (Affine, n_in, n_out, name) for slots that are affine layers; `tap(tree, a, hooks)`: the
    forward part with `hooks[slot](input, output) ↦ output` applied at each declared layer (how
    KFAC reads a layer's input and perturbs its output inside the foreign call).

    Examples:
        What `from_function`, `from_equinox` and `from_flax` return; `tree` and `point` go
        between the lens's point and the framework's pytree.

        >>> lens = from_function(lambda t, x: t["w"] @ x, {"w": jnp.ones((1, 2))}, R(2))
        >>> isinstance(lens, Wrapped), lens.units, lens.tree((jnp.zeros((1, 2)),))["w"].tolist()
        (True, ((0,),), [[0.0, 0.0]])
    """

    def __init__(self, call: Callable, leaves, treedef, units, dom: Space, cod: Space | None,
                 name: str, declared: dict | None = None, tap: Callable | None = None,
                 assemble: Callable | None = None, framework: str = "function"):
        self._call, self._treedef, self.units = call, treedef, tuple(tuple(u) for u in units)
        self._example = tuple(self._unit(leaves, u) for u in self.units)
        self._declared, self._tap = dict(declared or {}), tap
        self._assemble, self.framework = assemble, framework
        self.dom, self.name = dom, need_name(name, f"from_{framework}", optional=False)
        self.param = Product(*(_unit_space([jnp.shape(leaves[i]) for i in u]) for u in self.units))
        out = self._out_shape(leaves, dom)
        self.cod = R(*out.shape) if cod is None else _space(cod, f"from_{framework}", "codomain")
        if tuple(self.cod.shape) != tuple(out.shape):
            raise SpaceMismatch(f"{name} maps {dom!r} to arrays of shape {tuple(out.shape)}, "
                                f"not to its codomain {self.cod!r}")
        self._views = {u: Layer(R(n_in), R(n_out), self.param.factors[u], _affine_view(aff),
                                name=f"{name}.{where}", structure=aff, check=False)
                       for u, (aff, n_in, n_out, where) in self._declared.items()}

    @staticmethod
    def _unit(leaves, unit):
        return leaves[unit[0]] if len(unit) == 1 else tuple(leaves[i] for i in unit)

    def _out_shape(self, leaves, dom):
        try:
            out = jax.eval_shape(lambda a: self._call(self._tree_of(leaves), a),
                                 jax.ShapeDtypeStruct(dom.shape, jnp.zeros(()).dtype))
        except Exception as e:  # noqa: BLE001 - re-raised naming the model and the domain
            raise SpaceMismatch(f"{self.name} fails on a point of its domain {dom!r}: {e}") from e
        if not hasattr(out, "shape"):
            raise KindError(f"{self.name} must return one array, got {type(out).__name__}")
        if not jnp.issubdtype(out.dtype, jnp.floating):
            # an integer or boolean output (an argmax, a comparison) has no derivative
            raise KindError(f"{self.name} returns an array of dtype {out.dtype}, not a point of a "
                            "real space R^n: its output has no derivative to learn by. Return "
                            "real numbers (e.g. the scores or probabilities before an argmax; "
                            "a cast with .astype(float) has derivative 0)")
        return out

    def _tree_of(self, leaves):
        return jax.tree_util.tree_unflatten(self._treedef, list(leaves))

    # -- the framework's parameters and the lens's point ----------------------------------
    def tree(self, p):
        """The framework's parameter pytree holding the point p."""
        leaves = [None] * sum(len(u) for u in self.units)
        for unit, q in zip(self.units, p):
            for i, v in zip(unit, (q,) if len(unit) == 1 else q):
                leaves[i] = v
        return self._tree_of(leaves)

    def point(self, tree):
        """The point of P held by the framework's parameter pytree (the inverse of `tree`)."""
        leaves = jax.tree_util.tree_leaves(tree)
        return tuple(self._unit(leaves, u) for u in self.units)

    def module(self, p):
        """The framework's model (a copy) with the point p as its parameters."""
        return self._assemble(self.tree(p)) if self._assemble else self.tree(p)

    # -- the protocol ---------------------------------------------------------------------
    def apply(self, a, p, batched):
        f = lambda a: self._call(self.tree(p), a)  # noqa: E731 - per example
        return jax.vmap(f)(a) if batched else f(a)

    def rebuild(self, children):
        return self

    def init(self, key):
        """The module's own parameters (the example point): the framework initialised them."""
        return self._example

    def sites(self):
        return tuple(Site(self._views[u], (u,), self._views[u].structure) if u in self._views
                     else Site(self, (u,)) for u in range(len(self.units)))

    def probe(self, a, p, deltas, inputs):
        if not self._declared:
            return self.apply(a, p, False)
        order = sorted(self._declared)
        shift, seen = {u: next(deltas) for u in order}, {}

        def hook(u):
            def at(x, out):
                if u in seen:
                    raise KindError(f"{self._views[u].name} is called more than once by "
                                    f"{self.name}: KFAC factors a layer used once")
                seen[u] = x
                return out + shift[u]
            return at

        out = self._tap(self.tree(p), a, {u: hook(u) for u in order})
        inputs.extend(seen[u] for u in order)
        return out

    def picture(self):
        return picture.Boxed(self.name, self.dom, self.cod, self.param)

    def atoms(self):
        return [self]


def _affine_view(aff: Affine):
    def fwd(x, p):
        W = p[0] if aff.bias else p
        y = x @ W if aff.transposed else W @ x
        return y + p[1] if aff.bias else y
    return fwd


# -- a plain function ------------------------------------------------------------------------

def from_function(f: Callable, params, dom, cod: Space | None = None, name: str | None = None):
    """The lens (P, f, f') : A → B of f(params, a), P = ∏ R^{shape} over the leaves of the
    example `params` (a pytree of real arrays; a point is the tuple of its leaves), f' derived.
    `dom` and `cod` are Spaces or shapes (`cod` read off f when None); f must return real
    numbers (an integer or boolean output has no derivative: `KindError`).

    Examples:
        The leaves in the pytree's order (a dict's keys sorted: b, then w); the example
        parameters are the lens's `init`.

        >>> f = lambda t, x: jnp.tanh(t["w"] @ x + t["b"])
        >>> lens = from_function(f, {"w": jnp.ones((1, 2)), "b": jnp.zeros(1)}, R(2))
        >>> lens
        <lambda> : R^2 → R^1, params R^1×R^{1×2}
        >>> lens(jnp.array([1.0, -1.0]), lens.init(None)).tolist()
        [0.0]
    """
    need_callable(f, "from_function: f (a function f(params, a))")
    leaves, treedef = jax.tree_util.tree_flatten(params)
    for i, leaf in enumerate(leaves):
        if not (hasattr(leaf, "shape") and jnp.issubdtype(jnp.result_type(leaf), jnp.inexact)):
            raise KindError(f"from_function: the parameters must be a pytree of real arrays; "
                            f"leaf {i} is {type(leaf).__name__} {leaf!r}")
    name = name if name else str(getattr(f, "__name__", "f"))
    return Wrapped(f, [jnp.asarray(v) for v in leaves], treedef, [(i,) for i in range(len(leaves))],
                   _space(dom, "from_function"), cod, name)


def _keys(path) -> tuple:
    """A JAX key path as a tuple of plain keys."""
    out = []
    for k in path:
        out.append(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))))
    return tuple(out)


def _affine_slots(paths: list, layers: dict) -> tuple:
    """Slots of the leaves at `paths`: one per affine layer (its weight, then its bias, leaf
    indices in the pytree's order) at the place of its first leaf, one per other leaf.
    `layers`: layer path ↦ (weight key, bias key or None, declaration)."""
    index = {p: i for i, p in enumerate(paths)}
    owner = {}
    for where, (w, b, decl) in layers.items():
        unit = (index[where + (w,)],) + ((index[where + (b,)],) if b is not None else ())
        for i in unit:
            owner[i] = (unit, decl)
    units: list = []
    declared: dict = {}
    done: set = set()
    for i in range(len(paths)):
        if i in done:
            continue
        unit, decl = owner.get(i, ((i,), None))
        done.update(unit)
        if decl is not None:
            declared[len(units)] = decl
        units.append(unit)
    return units, declared


# -- Equinox ---------------------------------------------------------------------------------

def _need(module: str, extra: str):
    """The optional framework `module`, or an ImportError saying which extra installs it."""
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtraError(f"from_{extra} needs {module}: pip install 'paralens[{extra}]'") from e


def _declared_dom(module, who: str) -> Space:
    """The domain a module declares by its input size (Equinox's `in_size` or `in_features`,
    Flax's `in_features`; "scalar" is R), or a KindError asking for `dom`."""
    for attr in ("in_size", "in_features"):
        n = getattr(module, attr, None)
        if n == "scalar":
            return R()
        if isinstance(n, int) and not isinstance(n, bool):
            return R(n)
    raise KindError(f"{who}: {type(module).__name__} does not declare its input size "
                    f"(in_size, in_features): give its domain, e.g. {who}(module, R(3))")


def from_equinox(module, dom=None, cod: Space | None = None, name: str | None = None) -> Wrapped:
    """An Equinox module a ↦ module(a) as the lens (P, f, f') : A → B, P its inexact array
    leaves (each `eqx.nn.Linear` one slot (W, b) declaring `Affine`), the rest fixed; A is
    `dom`, or R^in_size when the module declares it (`eqx.nn.MLP`, `eqx.nn.Linear`).

    A module that draws random numbers (`eqx.nn.Dropout` not in inference mode) or carries
    state (`eqx.nn.BatchNorm`, anything holding an `eqx.nn.StateIndex`) is refused
    (`UnsupportedError`): a lens's forward part is a function of the input and the parameters.

    Examples:
        >>> import equinox as eqx
        >>> lens = from_equinox(eqx.nn.Linear(2, 1, key=jax.random.PRNGKey(0)))  # dom: R^in_features
        >>> lens, [site.structure for site in lens.sites()]
        (Linear : R^2 → R^1, params R^{1×2}×R^1, [Affine(bias=True, transposed=False)])
    """
    eqx = _need("equinox", "equinox")
    if not isinstance(module, eqx.Module):
        raise KindError(f"from_equinox needs an equinox.Module, got {type(module).__name__}")
    _refuse_equinox_state(eqx, module)
    dom = _declared_dom(module, "from_equinox") if dom is None else dom
    params, static = eqx.partition(module, eqx.is_inexact_array)
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    paths, leaves = [_keys(p) for p, _ in flat], [v for _, v in flat]
    is_linear = lambda x: isinstance(x, eqx.nn.Linear)  # noqa: E731
    found = jax.tree_util.tree_flatten_with_path(module, is_leaf=is_linear)[0]
    layers = {}
    for path, node in found:
        # a layer of the shape it says (not "scalar" features, not a stack of layers)
        if is_linear(node) and jnp.shape(node.weight) == (node.out_features, node.in_features):
            where = _keys(path)
            decl = (Affine(bias=node.use_bias), node.in_features, node.out_features,
                    ".".join(map(str, where)) or "linear")
            layers[where] = ("weight", "bias" if node.use_bias else None, decl)
    units, declared = _affine_slots(paths, layers)
    combine = lambda tree: eqx.combine(tree, static)  # noqa: E731

    def tap(tree, a, hooks):
        model = combine(tree)
        nodes, outer = jax.tree_util.tree_flatten(model, is_leaf=is_linear)
        linears = [i for i, n in enumerate(nodes) if is_linear(n)]
        by_path = [_keys(p) for p, n in jax.tree_util.tree_flatten_with_path(model, is_leaf=is_linear)[0]]
        for u, hook in hooks.items():
            target = _layer_path(units[u], paths)
            i = next(i for i in linears if by_path[i] == target)
            nodes[i] = _equinox_tap()(nodes[i], hook)
        return jax.tree_util.tree_unflatten(outer, nodes)(a)

    return Wrapped(lambda tree, a: combine(tree)(a), leaves, treedef, units,
                   _space(dom, "from_equinox"), cod, name or type(module).__name__,
                   declared, tap, combine, "equinox")


def _refuse_equinox_state(eqx, module) -> None:
    stateful = (eqx.nn.Dropout, eqx.nn.StateIndex)
    for node in jax.tree_util.tree_leaves(module, is_leaf=lambda x: isinstance(x, stateful)):
        if isinstance(node, eqx.nn.Dropout) and not node.inference and node.p > 0:
            raise UnsupportedError(
                "from_equinox: the module holds an eqx.nn.Dropout that draws random numbers "
                "(not in inference mode); a lens's forward part is a function of the input and "
                "the parameters: pass eqx.nn.inference_mode(module), or a module without dropout")
        if isinstance(node, eqx.nn.StateIndex):
            raise UnsupportedError(
                "from_equinox: the module carries state (an eqx.nn.StateIndex: eqx.nn.BatchNorm, "
                "SpectralNorm, ...), so its call takes and returns an eqx.nn.State; a lens's "
                "forward part is a function of the input and the parameters: make the state "
                "fixed with from_function(lambda params, x: eqx.combine(params, static)(x, state)[0], "
                "params, dom), where params, static = eqx.partition(eqx.nn.inference_mode(module), "
                "eqx.is_inexact_array)")


def _layer_path(unit, paths):
    return paths[unit[0]][:-1]  # the weight's path less its last key: the layer's


_TAPS: dict = {}


def _equinox_tap():
    """An Equinox module wrapping a layer: a ↦ hook(a, layer(a))."""
    if "equinox" not in _TAPS:
        import equinox as eqx

        class Tap(eqx.Module):
            layer: Any
            hook: Callable = eqx.field(static=True)

            def __call__(self, x, *, key=None):
                return self.hook(x, self.layer(x))

        _TAPS["equinox"] = Tap
    return _TAPS["equinox"]


def to_equinox(lens: Wrapped, p):
    """A copy of the Equinox module `lens` was made from, with the point p as its parameters.

    Examples:
        >>> import equinox as eqx
        >>> lens = from_equinox(eqx.nn.Linear(2, 1, key=jax.random.PRNGKey(0)), R(2))
        >>> layer = to_equinox(lens, ((jnp.ones((1, 2)), jnp.zeros(1)),))  # one slot: (W, b)
        >>> type(layer).__name__, layer(jnp.array([1.0, 2.0])).tolist()
        ('Linear', [3.0])
    """
    return _back(lens, p, "equinox", "to_equinox")


def _back(lens, p, framework: str, who: str):
    # a lens made by a bridge says which framework made it; every other lens says none
    if getattr(lens, "framework", None) != framework:
        raise KindError(f"{who} needs a lens made by from_{framework}, got "
                        f"{lens.name if isinstance(lens, Composable) else describe(lens)}")
    lens.param.check(p, f"the parameter of {lens.name}")
    return lens.module(p)


# -- Flax NNX --------------------------------------------------------------------------------

def from_flax(module, dom=None, cod: Space | None = None, name: str | None = None) -> Wrapped:
    """A Flax NNX module a ↦ module(a) as the lens (P, f, f') : A → B, P its `nnx.Param` state
    (each `nnx.Linear` one slot (kernel, bias) declaring `Affine(transposed=True)`); the rest
    of its state fixed as it is now; A is `dom`, or R^in_features when the module declares it.

    A module in training mode that draws random numbers (`nnx.Dropout`) or updates its state
    (`nnx.BatchNorm` with batch statistics) is refused (`UnsupportedError`): call
    `module.eval()` first; its running statistics are then part of the fixed state.

    Examples:
        Flax stores the kernel transposed (in × out), and the slot declares it:

        >>> from flax import nnx
        >>> lens = from_flax(nnx.Linear(2, 1, rngs=nnx.Rngs(0)))  # dom: R^in_features
        >>> lens, [site.structure for site in lens.sites()]
        (Linear : R^2 → R^1, params R^{2×1}×R^1, [Affine(bias=True, transposed=True)])
    """
    nnx = _need("flax.nnx", "flax")
    if not isinstance(module, nnx.Module):
        raise KindError(f"from_flax needs a flax.nnx.Module, got {type(module).__name__}")
    for _, node in nnx.iter_graph(module):
        drawing = isinstance(node, nnx.Dropout) and not node.deterministic and node.rate > 0
        updating = isinstance(node, nnx.BatchNorm) and not node.use_running_average
        if drawing or updating:
            raise UnsupportedError(
                f"from_flax: the module holds an nnx.{type(node).__name__} in training mode "
                f"({'it draws random numbers' if drawing else 'it updates its batch statistics'}); "
                "a lens's forward part is a function of the input and the parameters: call "
                "module.eval() first (its running statistics then stay fixed)")
    dom = _declared_dom(module, "from_flax") if dom is None else dom
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    # a leaf's path ends with the Variable's `value`: the parameter's own path is the rest
    paths, leaves = [_keys(p)[:-1] for p, _ in flat], [v for _, v in flat]
    layers = {}
    for where, node in nnx.iter_graph(module):
        if isinstance(node, nnx.Linear) and \
                jnp.shape(node.kernel[...]) == (node.in_features, node.out_features):
            where = tuple(where)
            decl = (Affine(bias=node.use_bias, transposed=True), node.in_features,
                    node.out_features, ".".join(map(str, where)) or "linear")
            layers[where] = ("kernel", "bias" if node.use_bias else None, decl)
    units, declared = _affine_slots(paths, layers)
    merge = lambda tree: nnx.merge(graphdef, tree, rest)  # noqa: E731

    def tap(tree, a, hooks):
        model = merge(tree)
        for u, hook in hooks.items():
            node = model
            for k in _layer_path(units[u], paths):
                node = node[k] if isinstance(k, int) else getattr(node, k)
            node.__class__ = _flax_tap(type(node), hook)  # this copy's layer only
        return model(a)

    return Wrapped(lambda tree, a: merge(tree)(a), leaves, treedef, units, _space(dom, "from_flax"),
                   cod, name or type(module).__name__, declared, tap, merge, "flax")


def _flax_tap(cls, hook):
    class Tapped(cls):
        def __call__(self, x, *args, **kw):
            return hook(x, super().__call__(x, *args, **kw))
    return Tapped


def to_flax(lens: Wrapped, p):
    """A copy of the Flax NNX module `lens` was made from, with the point p as its parameters.

    Examples:
        >>> from flax import nnx
        >>> lens = from_flax(nnx.Linear(2, 1, rngs=nnx.Rngs(0)), R(2))
        >>> layer = to_flax(lens, ((jnp.ones((2, 1)), jnp.zeros(1)),))  # one slot: (kernel, bias)
        >>> type(layer).__name__, layer(jnp.array([1.0, 2.0])).tolist()
        ('Linear', [3.0])
    """
    return _back(lens, p, "flax", "to_flax")


__all__ = ["Wrapped", "from_function", "from_equinox", "to_equinox", "from_flax", "to_flax"]
