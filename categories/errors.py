"""The catalogue of the errors that `categories` and `lenses` raise on purpose.

Every error the libraries raise deliberately is one of the classes below. Each is also a
subclass of the builtin exception users already catch (`ValueError`, `TypeError`,
`FloatingPointError`), so `except ValueError` keeps working, and of `ParalensError`, so that
`except ParalensError` catches everything the libraries refuse. Anything else escaping a
public entry point (an `AttributeError`, `IndexError`, `KeyError`, a raw JAX or numpy error)
is a bug of the library, not a refusal.

Every message names the user's own objects: the layer or model, the space, the expected
against the given shape, the offending index or value.

=====================  ===============================================================
class                  raised when (and what the message names)
=====================  ===============================================================
DomainError            a point is not a point of a space: wrong shape, outside the open
                       set, NaN or infinite, complex or non-numeric (the space, the
                       coordinate, how far outside; the shape expected and given)
DimensionError         a dimension, layer size, count of copies, heads or examples, or
                       number of segments is not an integer in range (the constructor,
                       the argument, the value given)
SlotError              a parameter slot index (`tie`) is not an integer slot of the
                       parameter object, or fewer than two distinct slots are given
                       (the offending index, the number of slots)
SpaceMismatch          two spaces that must agree do not: composition, tying slots of
                       different parameter objects, parameters not of the model's
                       parameter object, an optimiser state not of the optimiser given
                       (both sides)
ShapeError             a batch or data set does not fit the model's domain: rank, width,
                       element type, empty, unequal numbers of inputs and targets (the
                       model, expected against given shape)
TargetError            targets a loss family (or `accuracy`) does not accept: shape,
                       labels out of range, probabilities outside [0, 1], NaN (the family,
                       the index, the value); `TargetTypeError` for targets of the wrong
                       kind (dtype, missing configuration)
CovectorError          something other than a covector on the parameter object is given
                       where one belongs: a Vector, a raw array, leaves of the wrong shapes
                       (what was given, the slot, expected against given shape)
HyperparameterError    a hyperparameter of an optimiser, a layer or the training loop
                       (learning rate, decay, eps, batch size, epochs, an initial scale,
                       a drawing's font size, ...) is out of range or not a number (the
                       name, the value given)
KindError              an object of the wrong kind where another belongs: a loss where a
                       loss family belongs, parameters where a state belongs, something
                       that is not a lens or not an optimiser, an optimiser with a state
                       called without it, what a saved file cannot hold (what was given,
                       what is needed)
NonFiniteError         a training step produced NaN or infinity in a covector or in the
                       new point, and was refused (the step, the slot)
CheckpointError        a saved file cannot be read: truncated, damaged (checksum), not a
                       paralens file; or a file cannot be written (`save`, `to_tikz`: a
                       missing directory) (the path, what is wrong)
CheckpointMismatch     a saved file is intact but belongs to another model or optimiser
                       (the path, the first mismatched slot, expected against saved)
MetricError            an inner product that is not one: a matrix not symmetric or not
                       positive definite, weights not positive finite reals, a metric not
                       positive definite at the point (the metric, the offending entry)
LayoutError            a layout that cannot partition a model's parameters over a mesh:
                       an axis not of the mesh, a dimension not divisible by the devices
                       along its axis, a rule for no slot (the slot, the shape, the axis)
UnsupportedError       an operation the object does not provide: an abstract method a
                       subclass must implement, a strategy asked for a space it cannot
                       build, `global_batch` of a step without a mesh (the object, the
                       operation)
MissingExtraError      a bridge to another library (Equinox, Flax, DisCoPy) called without
                       it installed (the extra of this distribution that installs it)
=====================  ===============================================================
"""

from __future__ import annotations


class ParalensError(Exception):
    """The base of every error the libraries raise on purpose (a refusal, never a bug).

    Examples:
        >>> issubclass(SpaceMismatch, ParalensError) and issubclass(SpaceMismatch, TypeError)
        True
    """


class DomainError(ParalensError, ValueError):
    """A point lies outside the open set, has the wrong shape, or is not real (NaN, infinite,
    complex, non-numeric) where a point of a space was required.

    Examples:
        >>> Positive(2).check(jnp.array([1.0, -1.0]))
        Traceback (most recent call last):
            ...
        categories.errors.DomainError: point lies outside Positive(R^2): coordinate (1,) = -1...
    """


class DimensionError(ParalensError, ValueError):
    """A dimension, layer size, number of copies or of segments is not an integer in range.

    Examples:
        >>> R(2.5)
        Traceback (most recent call last):
            ...
        categories.errors.DimensionError: dimension 0 of R(2.5,) must be an integer ≥ 0, got 2.5
    """


class SlotError(ParalensError, ValueError):
    """A parameter slot index is not an integer slot of the parameter object (or fewer than
    two distinct slots were given to `tie`).

    Examples:
        >>> tie(dense(2, 2) >> dense(2, 2), [0, 5])
        Traceback (most recent call last):
            ...
        categories.errors.SlotError: slot index 5 is not a slot of (R^{2×2} × R^2) × (R^{2×2}...
    """


class SpaceMismatch(ParalensError, TypeError):
    """Two spaces that must agree do not (composition, tying, parameters of another object).

    Examples:
        >>> dense(2, 3) >> dense(4, 1)
        Traceback (most recent call last):
            ...
        categories.errors.SpaceMismatch: cannot compose dense(2→3) : R^2 → R^3 with dense(4→1...
    """


class ShapeError(ParalensError, ValueError):
    """A batch or data set that does not fit the model's domain (rank, width, element type,
    empty, unequal lengths).

    Examples:
        >>> model = dense(2, 1)
        >>> predict(model, model.init(jax.random.PRNGKey(0)), np.ones((4, 3)))
        Traceback (most recent call last):
            ...
        categories.errors.ShapeError: ...
    """


class TargetError(ParalensError, ValueError):
    """Targets that a loss family (or `accuracy`) does not accept: shape or value.

    Examples:
        >>> batch_loss(softmax_cross_entropy(classes=3), np.array([0, 5]))
        Traceback (most recent call last):
            ...
        categories.errors.TargetError: softmax_cross_entropy(classes=3): class labels must be...
    """


class TargetTypeError(TargetError, TypeError):
    """Targets of the wrong kind for a loss family (dtype, missing configuration).

    Examples:
        >>> batch_loss(softmax_cross_entropy(classes=3), np.array([0.5, 1.5]))
        Traceback (most recent call last):
            ...
        categories.errors.TargetTypeError: softmax_cross_entropy(classes=3): a scalar target...
    """


class CovectorError(ParalensError, TypeError):
    """Not a covector on the parameter object where one belongs (a Vector, a raw array, or
    leaves of the wrong shapes).

    Examples:
        >>> p = jnp.ones(2)
        >>> gd(0.1)(p, Vector(p))
        Traceback (most recent call last):
            ...
        categories.errors.CovectorError: ...
    """


class HyperparameterError(ParalensError, ValueError):
    """A hyperparameter of an optimiser or of the training loop out of range or not a number.

    Examples:
        >>> adam(-1e-3)
        Traceback (most recent call last):
            ...
        categories.errors.HyperparameterError: the learning rate lr must be a finite number > 0 (or a schedule), got -0.001
    """


class KindError(ParalensError, TypeError):
    """An object of the wrong kind where another belongs (a loss for a loss family, parameters
    for a state, not a lens, not an optimiser).

    Examples:
        >>> Layer("R^2", R(1), R(0), lambda a, p: a)
        Traceback (most recent call last):
            ...
        categories.errors.KindError: the domain of a lens must be a Space (e.g. R(3)), got 'R^2'
    """


class NonFiniteError(ParalensError, FloatingPointError):
    """A step produced NaN or infinity (in a covector or in the new point).

    Examples:
        >>> model = dense(1, 1)
        >>> step = train_step(model, half_squared_error, gd(0.1))
        >>> state, report = step(step.init(model.init(jax.random.PRNGKey(0))), np.array([[np.nan]]), np.zeros((1, 1)))
        >>> report.loss
        Traceback (most recent call last):
            ...
        categories.errors.NonFiniteError: ...
    """


class CheckpointError(ParalensError, ValueError):
    """A saved file that cannot be read (truncated, damaged, or not a paralens file), or a
    file that cannot be written.

    Examples:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "junk.st")
        >>> _ = open(path, "wb").write(b"not a saved file")
        >>> load(path, dense(2, 1))
        Traceback (most recent call last):
            ...
        categories.errors.CheckpointError: ...
    """


class CheckpointMismatch(CheckpointError):
    """An intact saved file that belongs to another model or optimiser.

    Examples:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "run.st")
        >>> model, opt = dense(2, 1), gd(0.1)
        >>> _ = save(path, train_step(model, half_squared_error, opt).init(model.init(jax.random.PRNGKey(0))), model, opt)
        >>> load(path, dense(3, 1), opt)
        Traceback (most recent call last):
            ...
        categories.errors.CheckpointMismatch: ...
    """


class MetricError(ParalensError, ValueError):
    """An inner product that is not one (not symmetric, not positive definite, weights not
    positive finite reals), or a metric not positive definite at the point.

    Examples:
        >>> Diagonal(jnp.array([1.0, -2.0]))
        Traceback (most recent call last):
            ...
        categories.errors.MetricError: ...
    """


class LayoutError(ParalensError, ValueError):
    """A layout that cannot partition a model's parameters over a mesh as asked (an axis not
    of the mesh, a dimension not divisible by the devices along its axis, a rule for a slot
    the model does not have).

    Examples:
        >>> Layout(slots={0: jax.sharding.PartitionSpec("model")}).specs(dense(3, 6), {"model": 4})
        Traceback (most recent call last):
            ...
        categories.errors.LayoutError: slot 0 (dense(3→6)): a leaf of shape (6, 3) cannot be split along dimension 0 (6) over mesh axis 'model' of 4 devices: ...
    """


class UnsupportedError(ParalensError, NotImplementedError):
    """An operation the object does not provide (an abstract method a subclass must
    implement, a strategy asked for a space it cannot build).

    Examples:
        >>> half_squared_error.sample(jax.random.PRNGKey(0), jnp.zeros(2)) is not None
        True
        >>> issubclass(UnsupportedError, NotImplementedError)
        True
    """


class MissingExtraError(ParalensError, ImportError):
    """A bridge to another library was called without that library installed (the message
    names the extra of this distribution that installs it).

    Examples:
        >>> issubclass(MissingExtraError, ImportError) and issubclass(MissingExtraError, ParalensError)
        True
    """


#: every class of the catalogue, in the order of the module docstring's table
CATALOGUE = (DomainError, DimensionError, SlotError, SpaceMismatch, ShapeError, TargetError,
             TargetTypeError, CovectorError, HyperparameterError, KindError, NonFiniteError,
             CheckpointError, CheckpointMismatch, MetricError, LayoutError, UnsupportedError, MissingExtraError)
"""Every error class the library raises on purpose (each a subclass of `ParalensError`)."""

__all__ = ["ParalensError"] + [c.__name__ for c in CATALOGUE] + ["CATALOGUE"]
