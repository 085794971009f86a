"""The ambient category: open subsets of Euclidean spaces and smooth maps, with finite products.

Knows nothing of learning. `lenses` builds on it.
"""

from ._compose import check_composable, need_operand
from ._version import __version__
from .errors import (CATALOGUE, CheckpointError, CheckpointMismatch, CovectorError, DimensionError,
                     DomainError, HyperparameterError, KindError, LayoutError, MetricError, MissingExtraError, NonFiniteError,
                     ParalensError, ShapeError, SlotError, SpaceMismatch, TargetError,
                     TargetTypeError, UnsupportedError)
from .functors import D, dual, linear_smooth, pullback, reverse_derivative
from .linear import Covector, Linear, Vector, flatten_value, linear_identity, pairing, unflatten_value, unwrap
from .para import Para, ParaChain, para_identity, para_of, slot_uses, para_tie, tying_map
from .smooth import (Smooth, constant, diagonal, fst, pair, projection, scale,
                     smooth_discard, smooth_identity, snd, swap)
from .spaces import OpenBall, OpenBox, Positive, Product, R, Space, euclidean

# Grouped as the sections of the API reference (docs/reference/).
__all__ = [
    # spaces and maps: open subsets of R^n and their products
    "Space", "R", "OpenBox", "OpenBall", "Positive", "Product", "euclidean",
    # spaces and maps: smooth maps and the cartesian structure
    "Smooth", "smooth_identity", "pair", "fst", "snd", "projection", "diagonal", "smooth_discard",
    "swap", "constant", "scale", "check_composable", "need_operand",
    # spaces and maps: vectors, covectors, linear maps and the functors D and dual
    "Vector", "Covector", "Linear", "pairing", "linear_identity", "flatten_value",
    "unflatten_value", "unwrap", "D", "dual", "pullback", "reverse_derivative", "linear_smooth",
    # spaces and maps: parameterised maps (Para) and weight tying
    "Para", "ParaChain", "para_identity", "para_of", "para_tie", "tying_map", "slot_uses",
    # errors: the catalogue of every error raised on purpose (`categories.errors`; `lenses`
    # re-exports these classes without listing them again)
    "ParalensError", "DomainError", "DimensionError", "SlotError", "SpaceMismatch", "ShapeError",
    "TargetError", "TargetTypeError", "CovectorError", "HyperparameterError", "KindError",
    "NonFiniteError", "CheckpointError", "CheckpointMismatch", "MetricError", "LayoutError", "UnsupportedError",
    "MissingExtraError",
    "CATALOGUE",
]


def __getattr__(name):
    # `categories.laws` and `categories.strategies` load on first use: the strategies need
    # hypothesis, a test extra, which importing `categories` must not require.
    if name in ("laws", "strategies"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
