"""The catalogue of the errors the library raises on purpose (defined in `categories.errors`,
where `DomainError` and the other errors of the ambient category live; re-exported here).

See `categories.errors` for the table: each class, when it is raised, what its message names.
"""

from categories.errors import (CATALOGUE, CheckpointError, CheckpointMismatch, CovectorError,
                               DimensionError, DomainError, HyperparameterError, KindError,
                               NonFiniteError, ParalensError, ShapeError, SlotError,
                               SpaceMismatch, TargetError, TargetTypeError,
                               MetricError, UnsupportedError)

__all__ = ["ParalensError", "DomainError", "DimensionError", "SlotError", "SpaceMismatch",
           "ShapeError", "TargetError", "TargetTypeError", "CovectorError", "HyperparameterError",
           "KindError", "NonFiniteError", "CheckpointError", "CheckpointMismatch", "MetricError",
           "UnsupportedError", "CATALOGUE"]
