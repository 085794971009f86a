"""Loss families: the protocol `LossFamily` (y ↦ L_y : C → R), compared by value."""

from __future__ import annotations

import dataclasses
import weakref

import jax
import jax.numpy as jnp
import numpy as np

from categories import R, Smooth, Space
from categories.points import is_real_dtype
from categories.errors import ParalensError, KindError, TargetError, TargetTypeError, UnsupportedError

_MISSING = object()
# family ↦ {(target shape, dtype) ↦ output space}: held weakly, so a user's family is freed
_SPACES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _concrete(x) -> bool:
    return not any(isinstance(a, jax.core.Tracer) for a in jax.tree_util.tree_leaves(x))


def _as_array(Y, fam):
    """Y as an array (numpy for host data, kept as is for JAX arrays and tracers)."""
    if isinstance(Y, (jax.Array, np.ndarray)) or isinstance(Y, jax.core.Tracer):
        return Y
    try:
        return np.asarray(Y)
    except Exception as e:  # noqa: BLE001 — a ragged list, an object
        raise TargetTypeError(f"{fam!r}: targets must be an array, got {type(Y).__name__}") from e


def shape_text(shape) -> str:
    """A shape as the errors print it: a tuple of ints."""
    return str(tuple(int(s) for s in shape))


class LossFamily:
    """y ↦ L_y : C → R, a family of smooth losses indexed by the target (abstract).

    Subclasses implement `value(c, y)`, the loss of one output c for one target y (a scalar,
    written with jax.numpy so that it can be differentiated). They may override:

    - `output_space(y)`: the space C of outputs a target y (only its shape and dtype are
      read) belongs to; by default R^shape(y).
    - `check_values(Y, batched)`: raise `ValueError` (the library's own: `TargetError`) for targets outside the family's domain
      (concrete values only); by default every value is accepted.
    - `output_fisher(z, v)`: F(z) v, the Fisher information in the output of the predictive
      distribution p(y | z) whose negative log-likelihood the loss is. Needed by `Fisher` and
      by `KFAC` (curvature="fisher"); `GaussNewton` needs only `value`.
    - `sample(key, z)`: a target drawn from p(y | z), for `KFAC(curvature="sampled")`.
    - `configure(**config)`: the family with other configuration (default: `dataclasses.replace`
      for a dataclass family; a family without configuration refuses any).

    Equality and hashing are by value: the type and the configuration (the dataclass fields,
    or the instance attributes of a plain subclass). Give a family hashable configuration so
    that equal families share compiled functions; with unhashable configuration a family is
    only equal to itself.

    Examples:
        >>> class AbsoluteError(LossFamily):
        ...     def value(self, c, y): return jnp.sum(jnp.abs(c - y))
        >>> float(AbsoluteError()(jnp.zeros(2))(jnp.array([1.0, -2.0])))
        3.0
    """

    name: str | None = None
    symbol: str | None = None  # the name of the loss for one target, e.g. "½‖· − y‖²"
    predictive: str | None = None  # a description of p(y | z), where the loss has one

    # -- what subclasses give ---------------------------------------------------------------
    def value(self, c, y):
        """L_y(c), a scalar, for one output c and one target y."""
        raise UnsupportedError(f"{type(self).__name__} must implement value(c, y)")

    def output_space(self, y) -> Space:
        """The space of outputs that a target y belongs to (only y's shape and dtype are read)."""
        return R(*tuple(y.shape))

    def check_values(self, Y, batched: bool = True) -> None:
        """Raise `ValueError` if a concrete target lies outside the family's domain."""

    def targets_ok(self, Y):
        """Per example of the batch Y, whether its target lies in the family's domain: the
        traceable form of `check_values`, which a compiled training step records as a fault
        instead of reading its targets back to the host; None when there is nothing a
        covector would not show (a NaN target gives a NaN covector, refused as such)."""
        return None

    def output_fisher(self, z, v):
        """F(z) v, the output-space Fisher information of the predictive distribution."""
        raise UnsupportedError(f"{self!r} knows no output-space Fisher information")

    @property
    def has_output_fisher(self) -> bool:
        """Whether this family supplies `output_fisher` (so that `Fisher` can use it)."""
        return type(self).output_fisher is not LossFamily.output_fisher

    def sample(self, key, z):
        """A target ŷ ~ p(· | z) drawn from the predictive distribution with the JAX key `key`
        (for the sampled Fisher of `KFAC(curvature="sampled")`); ŷ need only be a target
        `value(z, ŷ)` accepts."""
        raise UnsupportedError(f"{self!r} has no predictive distribution to sample targets from: "
                               "give the family a `sample(key, z)` method")

    @property
    def has_sampler(self) -> bool:
        """Whether this family supplies `sample` (so that `KFAC` can draw labels)."""
        return type(self).sample is not LossFamily.sample

    def configure(self, **config) -> "LossFamily":
        """This family with the configuration `config` changed."""
        if not config:
            return self
        if dataclasses.is_dataclass(self):
            names = {f.name for f in dataclasses.fields(self)}
            unknown = sorted(set(config) - names)
            if unknown:
                raise KindError(f"{self!r} has no configuration {', '.join(unknown)} "
                                f"(it has {', '.join(sorted(names)) or 'none'})")
            return dataclasses.replace(self, **config)
        raise KindError(f"{self!r} takes no configuration, got {', '.join(sorted(config))}")

    # -- derived ---------------------------------------------------------------------------
    def __call__(self, y=_MISSING, **config):
        """`family(y)`: the loss L_y : C → R for the target y (a `Smooth`); `family(**config)`:
        the configured family; `family(y, **config)`: the configured family's loss at y."""
        fam = self.configure(**config)
        if y is _MISSING:
            return fam
        return fam.at(y)

    def at(self, y) -> Smooth:
        """The loss L_y : C → R for one target y."""
        y = self.check_targets(y, batched=False)
        y = jnp.asarray(y)
        value = self.value
        return Smooth(self.declared_space(y), R(), lambda c: value(c, y),
                      self.symbol or self.short_name())  # checks the output it is given

    def check_targets(self, Y, output_space: Space | None = None, batched: bool = True):
        """Y, if it is a batch of targets (or, `batched=False`, one target) of this family
        whose outputs lie in `output_space` (when given); else a `ValueError` or `TypeError`
        naming the family, what it expected and what it was given. Shapes are checked always,
        values (labels in range, probabilities in [0, 1], ...) only for concrete Y."""
        Y = _as_array(Y, self)
        if not is_real_dtype(Y.dtype, booleans=True):
            raise TargetTypeError(f"{self!r}: targets must be real numbers, got dtype {Y.dtype}")
        shape = tuple(np.shape(Y))
        if batched and not shape:
            raise TargetError(f"{self!r}: a batch of targets needs a leading batch axis, "
                             "got a scalar")
        example_shape = shape[1:] if batched else shape
        expected = self._output_space_of(example_shape, Y.dtype)
        if output_space is not None and tuple(expected.shape) != tuple(output_space.shape):
            raise TargetError(
                f"{self!r}: targets of shape {shape_text(example_shape)} (per example) belong to "
                f"outputs in {expected!r}, but the model's outputs lie in {output_space!r}")
        if _concrete(Y):
            self.check_values(np.asarray(Y), batched)
        return Y

    def _output_space_of(self, shape, dtype) -> Space:
        """`output_space` for a target of this shape and dtype, checked to be a `Space` and
        remembered (checking targets runs once per training step)."""
        key = (shape, np.dtype(dtype))
        try:
            known = _SPACES.setdefault(self, {})
        except TypeError:  # unhashable or not weakly referable: asked each time
            known = {}
        if key not in known:
            known[key] = self.declared_space(jax.ShapeDtypeStruct(shape, dtype))
        return known[key]

    def declared_space(self, y) -> Space:
        """`output_space(y)` if it is a `Space`, else `KindError` naming the family."""
        space = self.output_space(y)
        if not isinstance(space, Space):
            raise KindError(f"the loss family {self!r} declares the outputs of a target of shape "
                            f"{tuple(y.shape)} to lie in {space!r}, which is not a Space: its "
                            f"output_space(y) must return a Space, e.g. R(*y.shape)")
        # the declaration agrees with the value: L_y is defined on it and real-valued (shapes
        # only, traced once per target shape and dtype)
        try:
            out = jax.eval_shape(self.value, jax.ShapeDtypeStruct(space.shape,
                                                                  jnp.result_type(float)), y)
            why = None if getattr(out, "shape", None) == () else f"a value of shape {out.shape}"
        except ParalensError:
            raise
        except Exception as e:  # noqa: BLE001 - the user's value function, re-raised as ours
            why = f"{type(e).__name__}: {e}"
        if why:
            raise KindError(f"the loss family {self!r} declares outputs in {space!r} for a "
                            f"target of shape {tuple(y.shape)}, but its value(c, y) at such an "
                            f"output gives {why}: output_space(y) must be the space of the "
                            f"outputs value(c, y) takes, and the value a scalar")
        return space

    # -- value semantics -------------------------------------------------------------------
    def _config(self) -> dict:
        if dataclasses.is_dataclass(self):
            return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        try:
            return dict(vars(self))
        except TypeError:
            return {}

    def _key(self):
        cached = self.__dict__.get("_cached_key")
        if cached is not None:
            return cached
        items = tuple(sorted(self._config().items()))
        try:
            hash(items)
        except TypeError:
            return (type(self), id(self))
        key = (type(self), items)
        params = getattr(self, "__dataclass_params__", None)
        if params is not None and params.frozen:  # immutable: the key can be kept
            self.__dict__["_cached_key"] = key
        return key

    def __eq__(self, other):
        if not isinstance(other, LossFamily):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def short_name(self) -> str:
        return self.name or type(self).__name__

    def __repr__(self):
        fields = dataclasses.fields(self) if dataclasses.is_dataclass(self) else ()
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in fields
                 if getattr(self, f.name) != f.default]
        return f"{self.short_name()}({', '.join(shown)})" if shown else self.short_name()


__all__ = ["LossFamily", "shape_text"]
