"""The catalogue of the errors the library raises on purpose, re-exported from
`categories.errors`, where they are defined and listed once (`categories.__all__`), with the
table of each class, when it is raised and what its message names.

`lenses.DomainError is categories.DomainError`: the same classes, reachable from either
package; this module lists none of them again.
"""

from categories.errors import (CATALOGUE, CheckpointError, CheckpointMismatch,  # noqa: F401
                               CovectorError, DimensionError, DomainError, HyperparameterError,
                               KindError, LayoutError, MetricError, MissingExtraError, NonFiniteError, ParalensError, ShapeError,
                               SlotError, SpaceMismatch, TargetError, TargetTypeError,
                               UnsupportedError)
