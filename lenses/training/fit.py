"""`fit`: epochs of shuffled minibatches, or any stream of batches, many steps per dispatch.

`fit` is a composition of the engine's parts: a `TrainStep` (the checked step and its
compiled loop, shared by equal optimisers), a source of chunks (`sources`: data held in
memory, gathered on the device by each epoch's indices or cut on the host, or an iterable
of batches grouped into chunks), and the scheduler, through the step's doors
(`TrainStep.dispatch` / `settle`). Each chunk is dispatched before the one before it is settled, so the device has work while the
host reads back, records, checkpoints and calls the callbacks; a fault raises when its chunk
is settled, naming the step, with the state before it, and the chunk dispatched after it (no-
ops from the fault on) is dropped.

Checkpoints (`checkpoints=Checkpoints(path, every=N)`): chunks also end where the step
count reaches a multiple of N, and there the state, the key and the run's progress are saved
atomically (`saved`). With `resume=True`, a run whose file exists continues from it, ending
where it was to end, with the history it would have had: a run killed and resumed ends bit
for bit as the uninterrupted run.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import numpy as np

from categories.errors import CheckpointMismatch, HyperparameterError, KindError, ShapeError
from categories.numbers import integer

from ..inputs import flag, optional_flag
from .evaluate import accuracy, check_labels
from .saved import load, need_path, save
from .sources import InMemory, Stream, as_key, key_data
from .state import TrainState
from .trainer import train_step


class FitProgress(NamedTuple):
    """What a callback of `fit` is given after each chunk: the epoch, the step count, the
    state, the chunk's losses, and the history of the epochs finished so far.

    Examples:
        >>> FitProgress._fields
        ('epoch', 'step', 'state', 'losses', 'history')
    """

    epoch: int
    step: int
    state: TrainState
    losses: np.ndarray
    history: list


@dataclass(frozen=True)
class Checkpoints:
    """Where and how often `fit` saves its run, and whether it continues a saved one: the
    file `path`, saved every `every` steps (None: never) with `on_save(state)` called after
    each save, and, with `resume`, the run saved in `path` continued if the file exists (else
    the run starts from `params`).

    Examples:
        >>> Checkpoints("run.st", every=100, resume=True)
        Checkpoints(path='run.st', every=100, resume=True, on_save=None)
        >>> Checkpoints("run.st")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        categories.errors.HyperparameterError: Checkpoints('run.st') neither saves nor resumes...
    """

    path: Any
    every: int | None = None
    resume: bool = False
    on_save: Callable | None = None

    def __post_init__(self):
        need_path(self.path, "Checkpoints")
        if self.every is not None:
            object.__setattr__(self, "every", integer(self.every, "Checkpoints: every", 1))
        object.__setattr__(self, "resume", flag(self.resume, "Checkpoints: resume"))
        if self.on_save is not None and not callable(self.on_save):
            raise KindError(f"Checkpoints: on_save must be a function state -> None, got "
                            f"{self.on_save!r}")
        if self.on_save is not None and self.every is None:
            raise HyperparameterError("Checkpoints: on_save is called after each save; pass "
                                      "every=N, how many steps apart to save the run")
        if self.every is None and not self.resume:
            raise HyperparameterError(f"Checkpoints({self.path!r}) neither saves nor resumes: "
                                      "pass every=N (save every N steps), resume=True (continue "
                                      "the run saved there), or both")


def fit(model, loss_family, opt, params, data, epochs: int = 10, batch_size: int = 32,
        key=None, eval_data=None, progress: bool | None = None, reduction: str = "mean",
        mesh=None, steps_per_dispatch: int | None = None, on_device: bool | None = None,
        max_steps: int | None = None, checkpoints: Checkpoints | None = None, callbacks=(),
        layout=None, axis: str | None = None):
    """Train for `epochs` more passes over `data`: (state, history).

    `data` is a tuple (X, Y) held in memory, shuffled each epoch into batches of exactly
    `batch_size` (the remainder dropped; `epoch_order`, drawn from the PRNG `key`), or any
    iterable of batches (X, Y) (a generator, a data loader), taken as they come, `epochs`
    passes (an iterator ends the run when it is exhausted). `params` may be a `TrainState` to
    continue a run where it stopped. `steps_per_dispatch` steps run in one compiled call
    (default: an epoch, at most 256, for data in memory; 32 for a stream); `on_device` puts
    in-memory data on the device (default: under `DEVICE_DATA_LIMIT` bytes). `max_steps`
    stops once the state has taken that many steps. `callbacks`: functions called after each
    chunk with a `FitProgress`; True stops the run there (False, None: on). `progress` shows
    a tqdm bar (default: when stderr is a terminal). The history is a list of per-epoch
    dicts: epoch, loss (mean over the epoch's steps taken here), steps_per_s, and accuracy
    on `eval_data` when given.

    `checkpoints` (a `Checkpoints`) saves the run every N steps to its file, or continues the
    run saved there, or both. Everything is checked before anything is compiled
    (`ShapeError`, `TargetError`, `HyperparameterError`, `KindError`) but an iterable's
    batches, each checked as it comes. An error during the run carries `.history`; a fault,
    and a batch of an iterable refused (or the iterable's own error), carry `.state` too: the
    state before the faulting step or batch, every step before it kept. `mesh` splits each
    batch over the mesh axis `axis` (default as `train_step`'s); `layout` (a `Layout`) splits
    the parameters and optimiser state over the mesh for the whole run (`train_step`).

    Examples:
        Every example alike (x = (1, 1), target 0): each step of gd(0.1) takes the residual r
        to 0.7 r, so the epochs' mean losses ½ r² are (0.5 + 0.245)/2 and (0.12005 + 0.0588245)/2.

        >>> X, Y = np.ones((8, 2)), np.zeros((8, 1))
        >>> p = (jnp.zeros((1, 2)), jnp.ones(1))
        >>> state, history = fit(dense(2, 1), half_squared_error, gd(0.1), p, (X, Y), epochs=2,
        ...                      batch_size=4)
        >>> int(state.count), [round(h["loss"], 6) for h in history]
        (4, [0.3725, 0.089437])
        >>> batches = [(X[:4], Y[:4])] * 3  # any iterable of batches; a callback may stop
        >>> state, _ = fit(dense(2, 1), half_squared_error, gd(0.1), p, batches, epochs=5,
        ...                steps_per_dispatch=1, callbacks=[lambda progress: progress.step == 4])
        >>> int(state.count)
        4
    """
    step = train_step(model, loss_family, opt, reduction, mesh, axis, layout)
    plan = dict(epochs=integer(epochs, "epochs", 0),
                max_steps=None if max_steps is None else integer(max_steps, "max_steps", 0))
    every = _checkpoints(checkpoints).every if checkpoints is not None else None
    callbacks = _callables(callbacks)
    progress = optional_flag(progress, "fit: progress")
    source = (InMemory if _in_memory(data) else Stream)(
        step, data, batch_size, as_key(key), on_device, steps_per_dispatch, every)
    _check_eval(step, eval_data)
    resumed = _resume(checkpoints, step, source, key)
    state = step.place(resumed["state"]) if resumed else \
        step.place(params) if isinstance(params, TrainState) else step.init(params)
    step.check(state)
    return _Fitting(step, source, state, plan, resumed, eval_data, checkpoints, callbacks,
                    progress).go()


class _Fitting:
    """One call of `fit`: the chunks in flight, the history, the checkpoints."""

    def __init__(self, step, source, state, plan, resumed, eval_data, checkpoints, callbacks,
                 progress):
        self.step, self.source, self.state = step, source, state
        self.eval_data, self.checkpoints, self.callbacks = eval_data, checkpoints, callbacks
        self.every = checkpoints.every if checkpoints is not None else None
        self.first = source.first_epoch(state.steps_taken())
        self.last = self.first + plan["epochs"] - 1
        self.max_steps, self.history, self.losses = plan["max_steps"], [], []
        if resumed:
            self.last, self.max_steps = resumed["last"], resumed["max_steps"]
            self.history = resumed["history"]
            self.losses = [resumed["epoch_losses"]] if len(resumed["epoch_losses"]) else []
        self.bar = _bar(progress, source.total(state.steps_taken(), self.last, self.max_steps))
        self.started, self.taken = time.perf_counter(), 0

    def go(self):
        """Dispatch each chunk, then settle the one before it: (state, history). An error
        of the source (a batch of an iterable refused as it arrives) is raised once the
        chunks before it are settled, with `.state`, the state they reached, and `.history`."""
        pending = None
        chunks = self.source.chunks(self.state.steps_taken(), self.first, self.last,
                                    self.max_steps)
        try:
            while True:
                try:
                    chunk = next(chunks, None)
                except Exception as error:  # noqa: BLE001 - the steps before it are kept
                    if pending is not None:
                        self._settle(*pending)  # a fault there is the earlier error
                    error.state, error.history = self.state, self.history  # type: ignore[attr-defined]  # any error, as documented
                    raise
                if chunk is None:
                    break
                if chunk.first_in_epoch:
                    self.started, self.taken = time.perf_counter(), 0
                start = pending[1].end if pending is not None else self.state
                nxt = (chunk, self.step.dispatch(start, *chunk.args))
                if pending is not None and self._settle(*pending):
                    return self.state, self.history
                pending = nxt
            if pending is not None:
                self._settle(*pending)
        finally:
            self.bar.close()
        return self.state, self.history

    def _settle(self, chunk, pending) -> bool:
        """Judge a chunk, record it; True when a callback asks to stop."""
        try:
            self.state, rows = self.step.settle(pending)
        except Exception as error:  # noqa: BLE001 - a fault: the history so far travels with it
            error.history = self.history  # type: ignore[attr-defined]  # on any error, as documented
            raise
        self.losses.append(rows[:, 0])
        self.taken += len(rows)
        count = self.state.steps_taken()
        if self.every and count % self.every == 0 and not chunk.last_in_epoch:
            self._checkpoint()  # mid-epoch: the epoch's losses so far
        self.bar.set_description(f"epoch {chunk.epoch}/{self.last}", refresh=False)
        self.bar.set_postfix(loss=f"{float(rows[-1, 0]):.4g}", refresh=False)
        self.bar.update(len(rows))
        if chunk.last_in_epoch:
            self._end_epoch(chunk)
        event = FitProgress(chunk.epoch, count, self.state, rows[:, 0], self.history)
        try:
            return any(_stops(f, f(event)) for f in self.callbacks)
        except KindError as error:  # an answer refused: the run so far travels with it
            error.state, error.history = self.state, self.history  # type: ignore[attr-defined]  # as every error of the run
            raise

    def _end_epoch(self, chunk):
        losses = np.concatenate(self.losses)
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        record = {"epoch": chunk.epoch, "loss": float(np.mean(losses)),
                  "steps_per_s": self.taken / elapsed}
        if self.eval_data is not None:
            record["accuracy"] = accuracy(self.step.model, self.state.params, *self.eval_data)
        self.history.append(record)
        self.losses = []
        if self.every and self.state.steps_taken() % self.every == 0:
            self._checkpoint()  # at the epoch's end: its record is in the history

    def _checkpoint(self):
        losses = np.concatenate(self.losses) if self.losses else np.zeros((0,))
        plan = dict(last=self.last, max_steps=self.max_steps, **self.source.identity())
        save(self.checkpoints.path, self.state, self.step.model, self.step.opt, self.source.key,
             fit=dict(plan, history=self.history), extra_arrays={"epoch_losses": losses},
             layout=self.step.layout)
        if self.checkpoints.on_save is not None:
            self.checkpoints.on_save(self.state)


def _bar(progress, total):
    from tqdm.auto import tqdm

    show = sys.stderr.isatty() if progress is None else progress
    return tqdm(total=total, disable=not show, unit="step", leave=True)


# -- the edge: what fit is given, checked once before anything is compiled ---------------------

def _in_memory(data) -> bool:
    """(X, Y) as a tuple, or a list [X, Y] of two arrays; anything else is an iterable of
    batches."""
    if isinstance(data, tuple):
        return True
    return isinstance(data, list) and len(data) == 2 and hasattr(data[0], "shape")


def _checkpoints(checkpoints) -> Checkpoints:
    if not isinstance(checkpoints, Checkpoints):
        raise KindError(f"checkpoints must be a Checkpoints(path, every=N, resume=...), got "
                        f"{checkpoints!r}")
    return checkpoints


def _check_eval(step, eval_data) -> None:
    """eval_data, if given, is a pair (X, Y) of inputs and labels for a classifier."""
    if eval_data is None:
        return
    if not isinstance(eval_data, (tuple, list)) or len(eval_data) != 2:
        raise ShapeError(f"eval_data must be a pair (X, Y), got {type(eval_data).__name__}")
    check_labels(step.model, *eval_data)  # a classifier, and labels for it, before training


def _callables(callbacks):
    if callbacks is None:
        return []
    if not (callable(callbacks) or isinstance(callbacks, (list, tuple))):
        raise KindError(f"callbacks must be a function FitProgress -> bool | None or a list of "
                        f"them, got {callbacks!r}")
    callbacks = [callbacks] if callable(callbacks) else list(callbacks)
    for f in callbacks:
        if not callable(f) or isinstance(f, type):  # a class is called, but answers no progress
            raise KindError(f"callbacks must be functions FitProgress -> bool | None, got {f!r}"
                            + (": pass a function (or an instance with __call__), not a class"
                               if isinstance(f, type) else ""))
    return callbacks


def _stops(f, answer) -> bool:
    """Whether a callback's answer asks the run to stop: True stops, None and False go on (a
    0-d bool array too, as `progress.state.count >= 100` gives); anything else is refused
    (`KindError`): a dict or a count is no answer, and its truthiness would stop the run."""
    if answer is None:
        return False
    if isinstance(answer, (bool, np.bool_)) or (
            hasattr(answer, "dtype") and np.ndim(answer) == 0 and answer.dtype == np.bool_):
        return bool(answer)
    raise KindError(f"a callback of fit returns True (stop the run), False or None (go on), "
                    f"but {f!r} returned {type(answer).__name__} {answer!r:.60}")


def _resume(checkpoints, step, source, key):
    """The run saved in the checkpoints' file, if they resume and it exists (else None): its
    state, key, history, losses of the epoch in progress and planned end, checked against
    this call."""
    if checkpoints is None or not checkpoints.resume:
        return None
    if not source.resumable:
        raise HyperparameterError("Checkpoints(resume=True) needs the data in memory, (X, Y): "
                                  "the position of an iterable of batches cannot be restored")
    path = checkpoints.path
    if not os.path.exists(path):
        return None
    saved = load(path, step.model, step.opt, step.mesh, step.layout)
    progress = saved.info.get("fit")
    if not progress:
        raise CheckpointMismatch(f"{os.fspath(path)!r} holds a state but no run's progress: "
                                 "pass the loaded state as params to continue it instead")
    mine = source.identity()
    if {k: progress.get(k) for k in mine} != mine:
        raise CheckpointMismatch(f"{os.fspath(path)!r} belongs to a run over {progress.get('n')} "
                                 f"examples in batches of {progress.get('batch_size')}, not "
                                 f"{mine.get('n')} in batches of {mine.get('batch_size')}")
    if saved.key is None:
        raise CheckpointMismatch(f"{os.fspath(path)!r} holds no RNG key")
    if key is not None and not np.array_equal(key_data(as_key(key)), key_data(saved.key)):
        raise CheckpointMismatch(f"{os.fspath(path)!r} belongs to a run with another key: "
                                 "pass key=None (or the run's key) to resume it")
    source.key = saved.key
    return dict(state=saved.state, history=list(progress["history"]), last=progress["last"],
                max_steps=progress["max_steps"],
                epoch_losses=np.asarray(saved.info["extra"]["epoch_losses"]))


__all__ = ["fit", "FitProgress", "Checkpoints"]
