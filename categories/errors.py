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
DimensionError         a dimension, layer size, count of copies or number of segments
                       is not an integer in range (the constructor, the argument, the
                       value given)
SlotError              a parameter slot index (`tie`) is not an integer slot of the
                       parameter object, or fewer than two distinct slots are given
                       (the offending index, the number of slots)
SpaceMismatch          two spaces that must agree do not: composition, tying slots of
                       different parameter objects, parameters not of the model's
                       parameter object (both sides)
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
HyperparameterError    a hyperparameter of an optimiser or of the training loop
                       (learning rate, decay, eps, batch size, epochs, ...) is out of range
                       or not a number (the name, the value given)
KindError              an object of the wrong kind where another belongs: a loss where a
                       loss family belongs, parameters where a state belongs, something
                       that is not a lens or not an optimiser (what was given, what is
                       needed)
NonFiniteError         a training step produced NaN or infinity in a covector or in the
                       new point, and was refused (the step, the slot)
CheckpointError        a saved file cannot be read: truncated, damaged (checksum), not a
                       paralens file (the path, what is wrong)
CheckpointMismatch     a saved file is intact but belongs to another model or optimiser
                       (the path, the first mismatched slot, expected against saved)
MetricError            an inner product that is not one: a matrix not symmetric or not
                       positive definite, weights not positive finite reals, a metric not
                       positive definite at the point (the metric, the offending entry)
UnsupportedError       an operation the object does not provide: an abstract method a
                       subclass must implement, a strategy asked for a space it cannot
                       build (the object, the operation)
=====================  ===============================================================
"""

from __future__ import annotations


class ParalensError(Exception):
    """The base of every error the libraries raise on purpose (a refusal, never a bug)."""


class DomainError(ParalensError, ValueError):
    """A point lies outside the open set, has the wrong shape, or is not real (NaN, infinite,
    complex, non-numeric) where a point of a space was required."""


class DimensionError(ParalensError, ValueError):
    """A dimension, layer size, number of copies or of segments is not an integer in range."""


class SlotError(ParalensError, ValueError):
    """A parameter slot index is not an integer slot of the parameter object (or fewer than
    two distinct slots were given to `tie`)."""


class SpaceMismatch(ParalensError, TypeError):
    """Two spaces that must agree do not (composition, tying, parameters of another object)."""


class ShapeError(ParalensError, ValueError):
    """A batch or data set that does not fit the model's domain (rank, width, element type,
    empty, unequal lengths)."""


class TargetError(ParalensError, ValueError):
    """Targets that a loss family (or `accuracy`) does not accept: shape or value."""


class TargetTypeError(TargetError, TypeError):
    """Targets of the wrong kind for a loss family (dtype, missing configuration)."""


class CovectorError(ParalensError, TypeError):
    """Not a covector on the parameter object where one belongs (a Vector, a raw array, or
    leaves of the wrong shapes)."""


class HyperparameterError(ParalensError, ValueError):
    """A hyperparameter of an optimiser or of the training loop out of range or not a number."""


class KindError(ParalensError, TypeError):
    """An object of the wrong kind where another belongs (a loss for a loss family, parameters
    for a state, not a lens, not an optimiser)."""


class NonFiniteError(ParalensError, FloatingPointError):
    """A step produced NaN or infinity (in a covector or in the new point)."""


class CheckpointError(ParalensError, ValueError):
    """A saved file that cannot be read: truncated, damaged, or not a paralens file."""


class CheckpointMismatch(CheckpointError):
    """An intact saved file that belongs to another model or optimiser."""


class MetricError(ParalensError, ValueError):
    """An inner product that is not one (not symmetric, not positive definite, weights not
    positive finite reals), or a metric not positive definite at the point."""


class UnsupportedError(ParalensError, NotImplementedError):
    """An operation the object does not provide (an abstract method a subclass must
    implement, a strategy asked for a space it cannot build)."""


#: every class of the catalogue, in the order of the module docstring's table
CATALOGUE = (DomainError, DimensionError, SlotError, SpaceMismatch, ShapeError, TargetError,
             TargetTypeError, CovectorError, HyperparameterError, KindError, NonFiniteError,
             CheckpointError, CheckpointMismatch, MetricError, UnsupportedError)

__all__ = ["ParalensError"] + [c.__name__ for c in CATALOGUE] + ["CATALOGUE"]
