"""The training loop: epochs of shuffled minibatches, many steps per dispatch.

`fit` puts the data on the device when it fits (`on_device`) and runs `steps_per_dispatch`
steps in one compiled call (a `lax.scan` of the training step, the batches gathered on the
device by the epoch's indices): no Python, no copy of the data and no host synchronisation
between the steps of a chunk. At the end of each chunk the losses and whether the chunk was
sound are read back (one synchronisation); a fault raises there, naming the step, with the
state as it was before the faulting step (see `_Loop`). Data too large for the device is cut into
chunks on the host instead, the next chunk sent to the device while the current one runs.

The order of epoch e is `epoch_order(key, e, n, batch_size)`, a function of the key and the
epoch alone, and a state's position in the run is its step count: a run continued from a
state (or a state saved and loaded) goes on exactly where it stopped.

Checkpoints (`checkpoint_every=N`, `checkpoint_path=...`): chunks also end where the step
count reaches a multiple of N, and there the state, the key and the run's progress (its
history, the losses of the epoch in progress, its planned end) are saved (`lenses.saved`,
atomically). `resume_from=path` continues the run a checkpoint belongs to, ending where it
was to end, with the history it would have had: a run killed and resumed ends bit for bit
as the uninterrupted run (on one machine and configuration).
"""

from __future__ import annotations

import os
import sys
import time
import weakref

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from categories.errors import CheckpointMismatch, HyperparameterError, ShapeError

from categories.spaces import euclidean

from .learner import TrainState, accuracy, check_labels, fault_error, train_step
from .losses import loss_family as loss_family_of
from .para_lens import check_batch

#: data up to this many bytes is put on the device whole (`on_device=None`)
DEVICE_DATA_LIMIT = 1 << 30


class _Progress:
    """A one-line `\\r` progress writer on stderr (silent unless enabled)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def show(self, text: str):
        if self.enabled:
            sys.stderr.write("\r" + text.ljust(78))
            sys.stderr.flush()

    def close(self):
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def as_key(key):
    """A JAX PRNG key from a key, an integer seed or None (seed 0)."""
    if key is None or isinstance(key, (int, np.integer)):
        return jax.random.PRNGKey(int(key or 0))
    return key


def epoch_order(key, epoch: int, n: int, batch_size: int) -> np.ndarray:
    """The example indices of epoch `epoch` (from 1), shape (n // batch_size, batch_size):
    a permutation drawn from the key and the epoch, the remainder dropped.

    It is drawn on the host (numpy's generator seeded by the key's data and the epoch): XLA's
    sort on the CPU, which an on-device shuffle needs, costs about 0.7 ms for 2048 examples,
    more than an epoch of small steps; the indices travel to the device with the chunk."""
    k = as_key(key)
    data = jax.random.key_data(k) if jnp.issubdtype(k.dtype, jax.dtypes.prng_key) else k
    seed = np.random.SeedSequence([int(v) for v in np.asarray(data).ravel()] + [int(epoch)])
    steps = n // batch_size
    perm = np.random.default_rng(seed).permutation(n)
    return perm[: steps * batch_size].reshape(steps, batch_size)


def _take(data, idx):
    return jax.tree_util.tree_map(lambda a: jnp.take(a, idx, axis=0), data)


def _length(data) -> int:
    return int(jax.tree_util.tree_leaves(data)[0].shape[0])


class _Loop:
    """The compiled chunks of a `fit`: k steps per call, as one `lax.scan`.

    A chunk runs the plain step (`TrainStep.fast_fn`: the covectors, the move, the new point)
    and says at its end whether every loss and the final point are finite: a non-finite
    covector or point leaves a NaN or an infinity there (it propagates: nothing in a step
    makes it finite again, unless a rule repairs non-finite values itself, as
    `optax.zero_nans` does). Only when a chunk is not sound is it run again from its first
    state with the checked step (`TrainStep.step_fn`), which refuses the faulting step and
    records it; the two agree bit for bit on every step before the fault. A parameter object
    with an open set to leave is always run checked."""

    def __init__(self, step, n, batch_size):
        self.step, self.n, self.bs = step, n, batch_size
        self.fast = euclidean(step.model.param)
        self._compiled = {}

    def _chunk(self, k, checked, gather):
        key = (k, checked, gather)
        if key not in self._compiled:
            fn = self.step.step_fn if checked else self.step.fast_fn

            def body(state, XY):
                state, out = fn(state, *XY)
                return state, (out[0] if checked else out)

            def sound(state, losses):
                if checked:  # the checked step records what it refused
                    return state.fault[0] == 0
                leaves = [jnp.sum(jnp.abs(a) * 0) for a in jax.tree_util.tree_leaves(state.params)]
                return jnp.isfinite(jnp.sum(losses) + sum(leaves, jnp.asarray(0.0)))

            def chunk(state, data, *where):
                if gather:  # the batches taken from the data on the device, by their indices
                    (idx,) = where
                    state, losses = lax.scan(lambda s, i: body(s, _take(data, i)), state, idx)
                else:  # batches already cut on the host: a leading axis of steps
                    state, losses = lax.scan(body, state, data)
                return state, losses, sound(state, losses)

            self._compiled[key] = jax.jit(chunk)
        return self._compiled[key]

    def run(self, state, data, *where, k):
        """(state, losses, sound) after k steps, dispatched (nothing waits)."""
        return self._chunk(k, not self.fast, bool(where))(state, data, *where)

    def replay(self, state, data, *where, k):
        """The same chunk from the same state, checked: (state, losses), a fault recorded."""
        return self._chunk(k, True, bool(where))(state, data, *where)[:2]


def steps_for(model, loss_family, opt, reduction="mean", mesh=None):
    """The `TrainStep` for these arguments, built once: a run continued with the same model,
    loss family and optimiser object reuses its compiled chunks."""
    cache = _STEPS.setdefault(model, {}) if _weakable(model) else {}
    family = loss_family_of(loss_family)
    try:
        key = (family, id(opt), reduction, id(mesh))
        hash(key)
    except TypeError:
        return train_step(model, loss_family, opt, reduction, mesh)
    hit = cache.get(key)
    if hit is None or hit[0] is not opt:
        cache[key] = (opt, train_step(model, loss_family, opt, reduction, mesh))
    return cache[key][1]


def _weakable(x) -> bool:
    try:
        weakref.ref(x)
        return True
    except TypeError:
        return False


_STEPS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def fit(model, loss_family, opt, params, data, epochs: int = 10, batch_size: int = 32,
        key=None, eval_data=None, progress: bool | None = None, reduction: str = "mean",
        mesh=None, steps_per_dispatch: int | None = None, on_device: bool | None = None,
        max_steps: int | None = None, checkpoint_every: int | None = None,
        checkpoint_path=None, resume_from=None, on_checkpoint=None):
    """Train for `epochs` more passes over shuffled minibatches of `data = (X, Y)`.

    Every batch has exactly `batch_size` examples (one compilation): the remainder of each
    shuffled epoch is dropped; a fresh order each epoch uses every example over time.
    `params` may also be a `TrainState` (from this function, or loaded) to continue the run
    where it stopped: epoch and position follow from its step count, the order of each epoch
    from `key`. Returns (state, history), the history a list of per-epoch dicts: epoch (counted
    over the whole run), loss (mean over the epoch's steps taken here), steps_per_s, and
    accuracy on `eval_data` when given. `steps_per_dispatch` steps run in one compiled call
    (default: an epoch, at most 256); `on_device` puts the data on the device (default: when
    it is under `DEVICE_DATA_LIMIT` bytes). `max_steps` stops the run once the state has
    taken that many steps in all (mid-epoch if need be). `progress=None` shows a progress line,
    updated per dispatch, only when stderr is a terminal.

    `checkpoint_every=N` with `checkpoint_path` saves the run every N steps (and calls
    `on_checkpoint(state)` after each save). `resume_from=path`: if the file exists, the run
    it belongs to continues from it (its state and key; `params` and `epochs` are then
    those of the run that wrote it, which ends where it was to end) and the history returned
    is the whole run's; if it does not exist, the run starts from `params`. Everything is
    checked before anything is compiled: the data against the model's domain and the loss
    family (`ShapeError`, `TargetError`), the numbers (`HyperparameterError`).
    """
    step = steps_for(model, loss_family, opt, reduction, mesh)
    X, Y, n = _check_data(step, data, "data")
    batch_size = _count(batch_size, "batch_size", 1)
    epochs = _count(epochs, "epochs", 0)
    steps_per_dispatch = None if steps_per_dispatch is None else \
        _count(steps_per_dispatch, "steps_per_dispatch", 1)
    max_steps = None if max_steps is None else _count(max_steps, "max_steps", 0)
    every = None if checkpoint_every is None else _count(checkpoint_every, "checkpoint_every", 1)
    if every is not None and checkpoint_path is None:
        raise HyperparameterError("checkpoint_every needs checkpoint_path, the file to save to")
    if eval_data is not None:
        if not isinstance(eval_data, (tuple, list)) or len(eval_data) != 2:
            raise ShapeError(f"eval_data must be a pair (X, Y), got {type(eval_data).__name__}")
        check_labels(step.model, *eval_data)  # a classifier, and labels for it, before training
    processes = jax.process_count() if mesh is not None else 1
    if batch_size % processes:
        raise HyperparameterError(f"a batch of {batch_size} cannot be fed evenly by {processes} "
                                  "processes")
    # Across processes each feeds its own data: its rows of every batch come from its `data`.
    batch_size = min(batch_size // processes, n)
    steps = n // batch_size
    resumed = _resume(resume_from, step, key, n, batch_size)
    key = resumed["key"] if resumed else as_key(key)
    if resumed:
        state = resumed["state"]
    else:
        state = params if isinstance(params, TrainState) else step.init(params)
    step.check(state)
    k_max = int(steps_per_dispatch) if steps_per_dispatch is not None else min(steps, 256)
    nbytes = sum(np.asarray(a).nbytes for a in jax.tree_util.tree_leaves(data))
    device = (nbytes <= DEVICE_DATA_LIMIT if on_device is None else bool(on_device)) and mesh is None
    data = jax.device_put((X, Y)) if device else (X, Y)
    loop = step.__dict__.setdefault("_loops", {}).setdefault((n, batch_size),
                                                            _Loop(step, n, batch_size))
    show = _Progress(sys.stderr.isatty() if progress is None else bool(progress))
    done = int(state.count)
    first, position = done // steps + 1, done % steps
    last = first + epochs - 1
    history = []
    carried = []  # the losses of the epoch in progress that a resumed checkpoint holds
    if resumed:
        last, max_steps, history = resumed["last"], resumed["max_steps"], resumed["history"]
        carried = [resumed["epoch_losses"]] if len(resumed["epoch_losses"]) else []
    if checkpoint_path is not None:
        def checkpoint(state, losses, history):
            _checkpoint(checkpoint_path, state, step, key, history, losses,
                        dict(last=last, max_steps=max_steps, n=n, batch_size=batch_size))
            if on_checkpoint is not None:
                on_checkpoint(state)
    def bounds(epoch):  # the steps [start, end) of an epoch that this run takes
        start = position if epoch == first else 0
        end = steps if max_steps is None else min(steps, int(max_steps) - (epoch - 1) * steps)
        return start, end

    ahead = None  # the next epoch's first chunk, dispatched before this epoch's last is read
    try:
        for epoch in range(first, last + 1):
            start, end = bounds(epoch)
            if end <= start:
                break
            chunks = _chunks(start, end, k_max, (epoch - 1) * steps, every)
            losses, t0 = (carried if epoch == first else []), time.perf_counter()
            host = ahead[0] if ahead else epoch_order(key, epoch, n, batch_size)
            pending = _send(data, host, chunks[0]) if not device and mesh is None else None
            for c, (lo, hi) in enumerate(chunks):
                where = (host[lo:hi],) if device else ()
                if c == 0 and ahead:
                    _, before, (state, chunk_losses, sound) = ahead
                    current, ahead = None, None
                elif mesh is not None:
                    before, current = state, None
                    state, chunk_losses = _per_step(step, state, data, host[lo:hi])
                    sound = True
                else:
                    before, current = state, pending
                    state, chunk_losses, sound = loop.run(state, data if device else current,
                                                          *where, k=hi - lo)
                if pending is not None and c + 1 < len(chunks):  # the next chunk travels meanwhile
                    pending = _send(data, host, chunks[c + 1])
                nxt = bounds(epoch + 1) if epoch < last else (0, 0)
                if device and c + 1 == len(chunks) and nxt[1] > nxt[0]:
                    # Dispatched now, from this chunk's (future) state, so that the device has
                    # work while this chunk is read back and the epoch is recorded; dropped if
                    # this chunk turns out not to be sound.
                    order = epoch_order(key, epoch + 1, n, batch_size)
                    lo2, hi2 = _chunks(*nxt, k_max, epoch * steps, every)[0]
                    ahead = (order, state, loop.run(state, data, order[lo2:hi2], k=hi2 - lo2))
                chunk_losses, sound = jax.device_get((chunk_losses, sound))
                if not sound:  # run the chunk again, checked: the fault is found and recorded
                    ahead = None
                    state, chunk_losses = loop.replay(before, data if device else current, *where,
                                                      k=hi - lo)
                    chunk_losses, fault = jax.device_get((chunk_losses, state.fault))
                    if fault[0]:
                        error = fault_error(state, *(int(v) for v in fault), step.names,
                                            step.opt._note(), step.spaces)
                        error.history = history
                        raise error
                losses.append(chunk_losses)
                if every and ((epoch - 1) * steps + hi) % every == 0 and hi < end:
                    checkpoint(state, losses, history)  # mid-epoch: the epoch's losses so far
                if show.enabled:
                    now = time.perf_counter()
                    show.show(f"epoch {epoch}/{last}  step {hi}/{steps}  loss {float(chunk_losses[-1]):.4g}  "
                              f"{(hi - start) / max(now - t0, 1e-9):.0f} steps/s")
            elapsed = max(time.perf_counter() - t0, 1e-9)
            record = {"epoch": epoch, "loss": float(np.mean(np.concatenate(losses))),
                      "steps_per_s": (end - start) / elapsed}
            if eval_data is not None:
                record["accuracy"] = accuracy(step.model, state.params, *eval_data)
            history.append(record)
            if every and ((epoch - 1) * steps + end) % every == 0:
                checkpoint(state, [], history)  # at the epoch's end: its record is in the history
            show.show(f"epoch {epoch}/{last}  loss {record['loss']:.4g}  {record['steps_per_s']:.0f} steps/s"
                      + (f"  accuracy {record['accuracy']:.3f}" if "accuracy" in record else ""))
    finally:
        show.close()
    return state, history


# -- the edge: what fit is given, checked once before anything is compiled ---------------------

def _count(x, name: str, least: int) -> int:
    """x as an int if it is an integer ≥ least (numpy's welcome), else `HyperparameterError`."""
    if isinstance(x, (bool, np.bool_)):
        raise HyperparameterError(f"{name} must be an integer ≥ {least}, got {x!r}")
    try:
        k = int(np.asarray(x).item()) if np.ndim(x) == 0 and \
            np.issubdtype(np.asarray(x).dtype, np.integer) else None
    except (TypeError, ValueError, OverflowError):
        k = None
    if k is None or k < least:
        raise HyperparameterError(f"{name} must be an integer ≥ {least}, got {x!r}")
    return k


def _check_data(step, data, what: str):
    """(X, Y, n) if `data` is a pair of a batch of the model's inputs and as many targets
    the loss family accepts (every value checked, once, here), else the catalogued error."""
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise ShapeError(f"fit needs {what} = (X, Y), a pair of inputs and targets, got "
                         f"{type(data).__name__}")
    X, Y = data
    n = check_batch(step.model.dom, X, f"fit({step.model.name}): the inputs")
    Y = step.loss_family.check_targets(Y, step.model.cod)
    if np.shape(Y)[0] != n:
        raise ShapeError(f"fit needs as many targets as inputs: {n} inputs, "
                         f"{np.shape(Y)[0]} targets")
    return X, Y, n


def _chunks(start: int, end: int, k_max: int, base: int, every: int | None) -> list:
    """[lo, hi) pieces of the epoch's steps [start, end), at most k_max long, also cut where
    the run's step count base + hi is a multiple of `every` (where a checkpoint is due)."""
    cuts = set(range(start + k_max, end, k_max)) if k_max else set()
    if every:
        first = (-(base + start)) % every or every
        cuts |= set(range(start + first, end, every))
    bounds = [start] + sorted(c for c in cuts if start < c < end) + [end]
    return list(zip(bounds[:-1], bounds[1:]))


def _checkpoint(path, state, step, key, history, losses, plan):
    """Save the run at a chunk's end: the state and key, and its progress."""
    from .saved import save

    epoch_losses = np.concatenate(losses) if losses else np.zeros((0,))
    save(path, state, step.model, step.opt, key, fit=dict(plan, history=history),
         extra_arrays={"epoch_losses": epoch_losses})


def _resume(path, step, key, n: int, batch_size: int):
    """The run saved at `path` (None when there is no such file): its state, key, history,
    losses of the epoch in progress and planned end, checked against this call."""
    if path is None or not os.path.exists(path):
        return None
    from .saved import load

    saved = load(path, step.model, step.opt)
    progress = saved.info.get("fit")
    if not progress:
        raise CheckpointMismatch(f"{os.fspath(path)!r} holds a state but no run's progress: "
                                 "pass the loaded state as params to continue it instead")
    if (progress["n"], progress["batch_size"]) != (n, batch_size):
        raise CheckpointMismatch(f"{os.fspath(path)!r} belongs to a run over {progress['n']} "
                                 f"examples in batches of {progress['batch_size']}, not {n} in "
                                 f"batches of {batch_size}")
    if saved.key is None:
        raise CheckpointMismatch(f"{os.fspath(path)!r} holds no RNG key")
    if key is not None and not np.array_equal(np.asarray(jax.random.key_data(as_key(key))
                                                         if _typed(as_key(key)) else as_key(key)),
                                              np.asarray(jax.random.key_data(saved.key)
                                                         if _typed(saved.key) else saved.key)):
        raise CheckpointMismatch(f"{os.fspath(path)!r} belongs to a run with another key: "
                                 "pass key=None (or the run's key) to resume it")
    return dict(state=saved.state, key=saved.key, history=list(progress["history"]),
                last=progress["last"], max_steps=progress["max_steps"],
                epoch_losses=np.asarray(saved.info["extra"]["epoch_losses"]))


def _typed(key) -> bool:
    return jnp.issubdtype(key.dtype, jax.dtypes.prng_key)


def _send(data, order, chunk):
    """The batches of one chunk, cut on the host and sent to the device (asynchronously)."""
    lo, hi = chunk
    return jax.device_put(jax.tree_util.tree_map(lambda a: np.asarray(a)[order[lo:hi]], data))


def _per_step(step, state, data, rows):
    """One dispatch per step over the mesh, each batch assembled from every process's rows."""
    losses, value = [], state._get()
    for idx in rows:
        local = jax.tree_util.tree_map(lambda a: np.asarray(a)[idx], data)
        value, (loss, _) = step._compiled(value, *step.global_batch(local))
        losses.append(loss)
    return TrainState._of(value), jnp.stack(losses)


__all__ = ["fit", "epoch_order", "as_key", "DEVICE_DATA_LIMIT"]
