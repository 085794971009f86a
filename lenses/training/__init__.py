"""Training: the engine that takes steps of learning, in the order a step is built.

- `faults`: where faults are decided (one verdict per step, on the device; the error);
- `state`: `TrainState` (a plain pytree) and `Report`;
- `step`: what one step computes, once (`StepCore`: covectors, sharp, move, verdict; the one
  loop every step runs in);
- `shared`: how long compiled code lives (one record per model structure, freed with the
  last model of it);
- `schedule`: how chunks of steps are scheduled, once (dispatched, then settled by one read);
- `trainer`: `train_step`, the user's handle (a call per step, or `run` for many);
- `sources`, `fit`: the training loop over data in memory or a stream of batches;
- `layout`: how parameter slots are partitioned over a mesh (`Layout`);
- `saved`: saved work (`files`: the bytes of its files); `evaluate`: `predict`, `accuracy`.
"""

from .evaluate import accuracy, check_labels, predict
from .faults import Fault
from .fit import Checkpoints, FitProgress, fit
from .layout import Layout, per_device_bytes
from .saved import Saved, load, save
from .sources import DEVICE_DATA_LIMIT, epoch_order
from .state import Report, TrainState
from .trainer import TrainStep, train_step

__all__ = ["TrainStep", "TrainState", "Report", "Fault", "train_step", "fit", "FitProgress",
           "Checkpoints", "epoch_order", "predict", "accuracy", "check_labels", "save", "load",
           "Saved",
           "DEVICE_DATA_LIMIT", "Layout", "per_device_bytes"]
