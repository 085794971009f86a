"""Parameterised lenses (P, f, f'): layers with a derived backward part, and learning built on them.

The layers of the package, in the theory's order: lenses (`para_lens`, `layer`, `families`,
`batched`, `slots`, `structure`, `recompute`, `repetition`, `layers`), then losses and inner products (`losses`,
`metrics`, `natural`, `kfac`, `geometry`), then optimisers (`optimisers`), then training (`training`);
beside them checks, laws, strategies, instruments and pictures (`checks`, `laws`, `strategies`,
`instruments`, `diagrams`, `discopy_bridge`), and models written elsewhere as lenses (`external`:
Equinox, Flax, functions).
"""

from categories import __version__  # one version for the distribution

from .checks import (BackwardReport, CompositionRule, check_backward, composition_rule,
                     describe_slope, largest_slope)
from .drawing.diagrams import diagram, draw, expression
from .bridges.discopy_bridge import to_discopy, to_tikz
from .layers.discrete import KEY_SHAPE, Keys, Tokens, dropout, embedding, evaluation
# The error catalogue is defined and listed once, in `categories` (`categories.errors`); it is
# re-exported here so that `lenses.DomainError` is the same class, but not listed again below.
from .errors import (CATALOGUE, CheckpointError, CheckpointMismatch, CovectorError,  # noqa: F401
                     DimensionError, DomainError, HyperparameterError, KindError, LayoutError, MetricError, MissingExtraError,
                     NonFiniteError, ParalensError, ShapeError, SlotError, SpaceMismatch,
                     TargetError, TargetTypeError, UnsupportedError)
from .bridges.external import Wrapped, from_equinox, from_flax, from_function, to_equinox, to_flax
from .families import LensFamily, family
from .inner_products.geometry import BoxBarrier, InteriorMetric, LogBarrier, Poincare, SlotMetric
from .layers.basic import (activation, avg_pool, bias, conv2d, dense, flatten, gelu, identity, linear,
                     max_pool, relu, residual, sigmoid, softmax, softplus, tanh)
from .lens import Lens, as_lens, lens_identity, lens_of
from .losses import (BinaryCrossEntropy, CallableFamily, HalfSquaredError, LossFamily,
                     SoftmaxCrossEntropy, batch_loss, binary_cross_entropy, dL, half_squared_error,
                     loss_family, softmax_cross_entropy)
from .inner_products.metrics import Constant, Context, Diagonal, Euclidean, Metric
from .inner_products.natural import Fisher, GaussNewton, output_fisher
from .inner_products.kfac import KFAC, KFACState
from .inner_products.instruments import check_metric, condition_number, kfac_error, metric_matrix, natural_angle
from .optimisers import (Optimiser, adagrad, adam, chain, from_optax, gd, momentum, nesterov,
                         scale_by_adagrad, scale_by_adam, scale_by_learning_rate,
                         scale_by_momentum, sharp)
from .optimisers.riemannian import riemannian_adam, scale_by_riemannian_adam
from .batched import Batched, batched
from .layer import Layer, derived
from .para_lens import Chain, Parallel, ParaLens, Reparam
from .sites import Affine, Site
from .slots import n_params, tie, uses
from .recompute import Checkpointed, checkpoint
from .layers.recurrent import Tied, gru_cell, lstm_cell, rnn_cell, shift_step, unroll
from .repetition import Repeat, Stacked, repeat, stacked
from .layers.sequence import (attention_core, layer_norm, multi_head_attention, position_embedding,
                       SequenceCrossEntropy, positionwise_dense, sequence_cross_entropy,
                       transformer_block)
from .structure import add, copy, discard
from .training import (Checkpoints, Fault, FitProgress, Layout, Report, Saved, TrainState,
                       TrainStep, accuracy, epoch_order, fit, load, per_device_bytes, predict, save,
                       train_step)

# Grouped as the sections of the API reference (docs/reference/); the errors are listed in
# `categories.__all__` (see above).
__all__ = [
    # spaces and maps: the spaces of discrete inputs (the ambient category is `categories`)
    "Tokens", "Keys", "KEY_SHAPE",
    # lenses and combinators
    "ParaLens", "Layer", "Chain", "Parallel", "Reparam", "Checkpointed", "Repeat", "Batched",
    "LensFamily", "family", "Affine", "Site",
    "batched", "checkpoint", "repeat", "stacked", "Stacked", "tie", "uses", "n_params", "derived",
    "copy", "discard", "add",
    "Lens", "lens_of", "lens_identity", "as_lens",
    # layers
    "dense", "linear", "bias", "conv2d", "max_pool", "avg_pool", "flatten", "residual",
    "activation", "identity", "tanh", "sigmoid", "softplus", "gelu", "relu", "softmax",
    "positionwise_dense", "layer_norm", "position_embedding", "attention_core",
    "multi_head_attention", "transformer_block", "embedding", "dropout", "evaluation",
    "rnn_cell", "gru_cell", "lstm_cell", "unroll", "shift_step", "Tied",
    # models written elsewhere, as lenses
    "from_function", "from_equinox", "to_equinox", "from_flax", "to_flax", "Wrapped",
    # losses
    "half_squared_error", "softmax_cross_entropy", "binary_cross_entropy", "dL", "batch_loss",
    "LossFamily", "loss_family", "HalfSquaredError", "SoftmaxCrossEntropy", "BinaryCrossEntropy",
    "CallableFamily", "sequence_cross_entropy", "SequenceCrossEntropy",
    # inner products
    "Metric", "Context", "Euclidean", "Diagonal", "Constant", "GaussNewton", "Fisher", "KFAC",
    "KFACState", "output_fisher", "SlotMetric", "LogBarrier", "Poincare", "BoxBarrier",
    "InteriorMetric",
    # instruments for inner products
    "check_metric", "metric_matrix", "natural_angle", "condition_number", "kfac_error",
    # optimisers
    "Optimiser", "gd", "momentum", "nesterov", "adagrad", "adam", "from_optax", "chain", "sharp",
    "scale_by_momentum", "scale_by_adagrad", "scale_by_adam", "scale_by_learning_rate",
    "riemannian_adam", "scale_by_riemannian_adam",
    # training
    "TrainStep", "TrainState", "Report", "Fault", "train_step", "fit", "FitProgress",
    "epoch_order", "predict", "accuracy", "largest_slope", "describe_slope",
    "Layout", "per_device_bytes",
    # saved work
    "save", "load", "Saved", "Checkpoints",
    # laws and strategies (the law modules are `lenses.laws` and `lenses.strategies`)
    "check_backward", "BackwardReport", "composition_rule", "CompositionRule",
    # diagrams
    "expression", "diagram", "draw", "to_discopy", "to_tikz",
]
