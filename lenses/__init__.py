"""Parameterised lenses (P, f, f'): layers with a derived backward part, and learning built on them.

The layers of the package, in the theory's order: lenses (`para_lens`, `families`,
`structure`, `recompute`, `repetition`, `layers`), then losses and inner products (`losses`,
`metrics`, `natural`, `geometry`), then optimisers (`optimisers`), then the learner (`learner`); beside
them checks, laws, strategies and pictures (`checks`, `laws`, `strategies`, `diagrams`).
"""

from .checks import (BackwardReport, CompositionRule, check_backward, composition_rule,
                     describe_slope, largest_slope)
from .diagrams import diagram, draw, expression
from .discrete import KEY_SHAPE, Keys, Tokens, dropout, embedding, evaluation
from .errors import (CATALOGUE, CheckpointError, CheckpointMismatch, CovectorError, DimensionError,
                     DomainError, HyperparameterError, KindError, ParalensError, ShapeError,
                     SlotError, SpaceMismatch, TargetError, TargetTypeError, MetricError,
                     UnsupportedError)
from .families import LensFamily, family
from .geometry import BoxBarrier, InteriorMetric, LogBarrier, Poincare, SlotMetric
from .layers import (activation, avg_pool, bias, conv2d, dense, flatten, gelu, identity, linear,
                     max_pool, relu, residual, sigmoid, softmax, softplus, tanh)
from .fitting import epoch_order, fit
from .learner import Report, TrainState, TrainStep, accuracy, predict, train_step
from .lens import Lens, as_lens, lens_identity, lens_of
from .losses import (BinaryCrossEntropy, CallableFamily, HalfSquaredError, LossFamily,
                     SoftmaxCrossEntropy, batch_loss, binary_cross_entropy, dL, half_squared_error,
                     loss_family, softmax_cross_entropy)
from .metrics import Constant, Context, Diagonal, Euclidean, Metric, ravel, unflatten_like
from .natural import KFAC, Fisher, GaussNewton, output_fisher
from .optimisers import (NonFiniteError, Optimiser, Update, adagrad, adam, chain, from_optax, gd,
                         momentum, nesterov, scale_by_adagrad, scale_by_adam,
                         scale_by_learning_rate, scale_by_momentum, sharp, sharp_transform, update)
from .para_lens import (Affine, Batched, Chain, Layer, Parallel, ParaLens, Reparam, Site, batched,
                        derived, n_params, tie, uses)
from .recompute import Checkpointed, checkpoint
from .recurrent import Tied, gru_cell, rnn_cell, shift_step, unroll
from .repetition import Repeat, Stacked, repeat, stacked
from .saved import Saved, load, save
from .sequence import (attention_core, layer_norm, multi_head_attention, position_embedding,
                       SequenceCrossEntropy, positionwise_dense, sequence_cross_entropy,
                       transformer_block)
from .structure import add, copy, discard

__all__ = [
    # lenses and their combinators
    "ParaLens", "Layer", "Chain", "Parallel", "Reparam", "Checkpointed", "Repeat", "Batched",
    "LensFamily", "family", "Affine", "Site",
    "batched", "checkpoint", "repeat", "stacked", "Stacked", "tie", "uses", "n_params", "derived",
    "copy", "discard", "add",
    # layers
    "dense", "linear", "bias", "conv2d", "max_pool", "avg_pool", "flatten", "residual",
    "activation", "identity", "tanh", "sigmoid", "softplus", "gelu", "relu", "softmax",
    # sequences, tokens, randomness and recurrence
    "positionwise_dense", "layer_norm", "position_embedding", "attention_core",
    "multi_head_attention", "transformer_block", "Tokens", "Keys", "KEY_SHAPE", "embedding",
    "dropout", "evaluation", "rnn_cell", "gru_cell", "unroll", "shift_step", "Tied",
    # plain lenses
    "Lens", "lens_of", "lens_identity", "as_lens",
    # losses and inner products
    "half_squared_error", "softmax_cross_entropy", "binary_cross_entropy", "dL", "batch_loss",
    "LossFamily", "loss_family", "HalfSquaredError", "SoftmaxCrossEntropy", "BinaryCrossEntropy",
    "CallableFamily", "sequence_cross_entropy", "SequenceCrossEntropy",
    "Metric", "Context", "Euclidean", "Diagonal", "Constant", "GaussNewton", "Fisher", "KFAC",
    "output_fisher", "ravel", "unflatten_like",
    "SlotMetric", "LogBarrier", "Poincare", "BoxBarrier", "InteriorMetric",
    # optimisers
    "Optimiser", "Update", "update", "gd", "momentum", "nesterov", "adagrad", "adam",
    "from_optax", "sharp_transform", "NonFiniteError", "chain", "sharp", "scale_by_momentum",
    "scale_by_adagrad", "scale_by_adam", "scale_by_learning_rate",
    # learning
    "TrainStep", "TrainState", "Report", "train_step", "fit", "epoch_order", "predict", "accuracy",
    # saved work
    "save", "load", "Saved",
    # the error catalogue (lenses.errors)
    "ParalensError", "DomainError", "DimensionError", "SlotError", "SpaceMismatch", "ShapeError",
    "TargetError", "TargetTypeError", "CovectorError", "HyperparameterError", "KindError",
    "CheckpointError", "CheckpointMismatch", "MetricError", "UnsupportedError", "CATALOGUE",
    # checks and pictures
    "check_backward", "BackwardReport", "composition_rule", "CompositionRule", "largest_slope",
    "describe_slope", "expression", "diagram", "draw",
]
