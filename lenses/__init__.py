"""Parameterised lenses (P, f, f'): layers with a derived backward part, and learning built on them."""

from .checks import (BackwardReport, CompositionRule, check_backward, composition_rule,
                     describe_slope, largest_slope)
from .layers import (activation, avg_pool, bias, conv2d, dense, flatten, gelu, identity, linear,
                     max_pool, relu, residual, sigmoid, softmax, softplus, tanh)
from .lens import Lens, as_lens, lens_identity, lens_of
from .losses import batch_loss, binary_cross_entropy, dL, half_squared_error, softmax_cross_entropy
from .para_lens import (Batched, Checkpointed, Parallel, ParaChain, ParaLens, Polymorphic, Reparam,
                        batched, checkpoint, derived, n_params, tie, uses)
from .structure import add, copy, discard
from .metrics import Constant, Context, Diagonal, Euclidean, Metric, ravel, unflatten_like
from .optimisers import (NonFiniteError, Optimiser, Update, adagrad, adam, from_optax, gd, momentum, nesterov, sharp_transform, update)
from .learner import Report, TrainState, TrainStep, accuracy, fit, predict, train_step
from .natural import KFAC, Fisher, GaussNewton, output_fisher
from .draw import diagram, draw, expression
from .repeat import Repeat, Stacked, repeat, stacked
