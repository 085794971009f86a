"""Where `fit`'s chunks come from: data held in memory, or an iterable of batches.

A source checks its data once, at the edge, and yields `Chunk`s: the arguments of
`TrainStep.dispatch` for a chunk of steps, and where the chunk stands in its epoch. Chunks are
made lazily, so that the next chunk's batches travel to the device while the current chunk
runs. They also end where the step count reaches a multiple of `every` (a checkpoint is due).

Data in memory is shuffled each epoch by `epoch_order(key, epoch, n, batch_size)`, a
function of the key and the epoch alone: a state's position in the run is its step count,
so a run continued from a state goes on exactly where it stopped. It is put on the device
whole when it fits (`DEVICE_DATA_LIMIT`), each step's batch gathered there by its indices;
else each chunk's batches are cut on the host. With a mesh, each process feeds its own rows
of every batch.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from categories.errors import HyperparameterError, KindError, ShapeError
from categories.numbers import integer

from ..inputs import check_batch, optional_flag

#: data up to this many bytes is put on the device whole (`on_device=None`)
DEVICE_DATA_LIMIT = 1 << 30


class Chunk(NamedTuple):
    """A chunk of steps: `args` for `TrainStep.dispatch` ((Xs, Ys) stacked, or (data, idx)),
    its epoch, and whether it begins or ends the epoch."""

    args: tuple
    epoch: int
    first_in_epoch: bool
    last_in_epoch: bool


def as_key(key):
    """A JAX PRNG key from a key, an integer seed or None (seed 0); else `KindError`."""
    if key is None or (isinstance(key, (int, np.integer)) and not isinstance(key, bool)):
        if not 0 <= int(key or 0) < 1 << 32:  # wrapped, -1 would silently be seed 2^32 − 1
            raise HyperparameterError(f"key as a seed must be an integer in [0, 2^32), got "
                                      f"{key!r}: pass a non-negative seed or a PRNG key")
        return jax.random.PRNGKey(int(key or 0))
    if isinstance(key, (jax.Array, np.ndarray)):
        if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) and key.shape == ():
            return key
        if key.dtype == np.uint32 and key.shape == (2,):
            return key
    raise KindError(f"key must be None, an integer seed or a PRNG key (jax.random.PRNGKey or "
                    f"jax.random.key), got {key!r}")


def key_data(key) -> np.ndarray:
    """The key's raw uint32 data (typed or raw keys alike)."""
    return np.asarray(jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
                      else key)


def epoch_order(key, epoch: int, n: int, batch_size: int) -> np.ndarray:
    """The example indices of epoch `epoch` (from 1), shape (n // batch_size, batch_size):
    a permutation drawn from the key and the epoch, the remainder dropped (`n` ≥ 0,
    `batch_size` ≥ 1; else `HyperparameterError`).

    It is drawn on the host (numpy's generator seeded by the key's data and the epoch): XLA's
    sort on the CPU, which an on-device shuffle needs, costs more than an epoch of small
    steps; the indices travel to the device with the chunk.

    Examples:
        >>> order = epoch_order(0, 1, 7, 2)
        >>> order.shape, len(set(order.ravel().tolist())), bool(np.all(order < 7))
        ((3, 2), 6, True)
        >>> bool(np.array_equal(order, epoch_order(0, 1, 7, 2)))
        True
    """
    epoch = integer(epoch, "epoch_order: epoch (counted from 1)", 1)
    n = integer(n, "epoch_order: n, the number of examples,", 0)
    batch_size = integer(batch_size, "epoch_order: batch_size", 1)
    seed = np.random.SeedSequence([int(v) for v in key_data(as_key(key)).ravel()] + [epoch])
    batches = n // batch_size
    perm = np.random.default_rng(seed).permutation(n)
    return perm[: batches * batch_size].reshape(batches, batch_size)


def cuts(start: int, end: int, k_max: int, base: int, every: int | None) -> list:
    """[lo, hi) pieces of the steps [start, end), at most k_max long, also cut where the run's
    step count base + hi is a multiple of `every` (where a checkpoint is due)."""
    at = set(range(start + k_max, end, k_max))
    if every:
        first = (-(base + start)) % every or every
        at |= set(range(start + first, end, every))
    bounds = [start] + sorted(c for c in at if start < c < end) + [end]
    return list(zip(bounds[:-1], bounds[1:]))


def _processes(step) -> int:
    return jax.process_count() if step.mesh is not None else 1


def _split(step, batch_size: int) -> int:
    """This process's rows of a batch of `batch_size`, checked against the mesh."""
    processes = _processes(step)
    if batch_size % processes:
        raise HyperparameterError(f"a batch of {batch_size} cannot be fed evenly by {processes} "
                                  "processes")
    step.check_split(batch_size)
    return batch_size // processes


def _check_pair(step, X, Y, what: str) -> int:
    """n, if X is a batch of the model's inputs and Y as many targets of the loss family's
    shape and type, else the catalogued error. The targets' values are judged by the step,
    on the device, as for every call of `train_step`: a refused target is a fault of the step
    that meets it (its number, the example, the state before it)."""
    n = check_batch(step.model.dom, X, f"fit({step.model.name}): {what}")
    step.loss_family.check_targets(np.asarray(Y)[:0], step.model.cod)
    if np.shape(Y)[0] != n:
        raise ShapeError(f"fit needs as many targets as inputs: {n} inputs, "
                         f"{np.shape(Y)[0]} targets ({what})")
    return n


def _to_device(step, batches):
    """Stacked batches sent to the device (asynchronously), split over the mesh if any."""
    if step.mesh is not None:
        return step.global_batch(batches, stacked=True)
    return jax.device_put(batches)


class InMemory:
    """(X, Y) held in memory: epochs of shuffled batches of exactly `batch_size`."""

    resumable = True

    def __init__(self, step, data, batch_size, key, on_device, steps_per_dispatch, every):
        if len(data) != 2:
            raise ShapeError(f"fit needs data = (X, Y), a pair of inputs and targets, or an "
                             f"iterable of such batches, got a tuple of {len(data)}")
        X, Y = data
        self.n = _check_pair(step, X, Y, "the inputs")
        batch_size = integer(batch_size, "batch_size", 1)
        self.bs = _split(step, batch_size)
        if self.bs > self.n:
            raise HyperparameterError(f"batch_size {batch_size} is larger than the {self.n} "
                                      "examples: every batch has exactly batch_size examples; "
                                      f"pass batch_size ≤ {self.n}")
        self.step, self.key, self.every = step, key, every
        self.per_epoch = self.n // self.bs
        self.k_max = self.per_epoch if steps_per_dispatch is None else \
            integer(steps_per_dispatch, "steps_per_dispatch", 1)
        self.k_max = min(self.k_max, 256) if steps_per_dispatch is None else self.k_max
        nbytes = sum(np.asarray(a).nbytes for a in jax.tree_util.tree_leaves((X, Y)))
        on_device = optional_flag(on_device, "fit: on_device")
        self.device = step.mesh is None and (nbytes <= DEVICE_DATA_LIMIT if on_device is None
                                             else on_device)
        self.data = jax.device_put((X, Y)) if self.device else (np.asarray(X), np.asarray(Y))

    def identity(self) -> dict:
        return {"n": self.n, "batch_size": self.bs}

    def first_epoch(self, count: int) -> int:
        return count // self.per_epoch + 1

    def total(self, count, last, max_steps):
        end = last * self.per_epoch if max_steps is None else min(last * self.per_epoch, max_steps)
        return max(end - count, 0)

    def chunks(self, count, first, last, max_steps):
        for epoch in range(first, last + 1):
            base = (epoch - 1) * self.per_epoch
            start = count - base if epoch == first else 0
            end = self.per_epoch if max_steps is None else min(self.per_epoch, max_steps - base)
            if end <= start:
                return
            order = epoch_order(self.key, epoch, self.n, self.bs)
            pieces = cuts(start, end, self.k_max, base, self.every)
            for i, (lo, hi) in enumerate(pieces):
                if self.device:
                    args = (self.data, order[lo:hi])
                else:
                    args = (_to_device(self.step, tuple(a[order[lo:hi]] for a in self.data)),)
                yield Chunk(args, epoch, i == 0, i == len(pieces) - 1)


class Stream:
    """An iterable of batches (X, Y), taken as they come, grouped into chunks of batches of
    one shape; each batch is checked as it arrives. A batch refused (or an error of the
    iterable itself) ends the chunk before it, which is still yielded, then is raised."""

    resumable = False

    def __init__(self, step, data, batch_size, key, on_device, steps_per_dispatch, every):
        if not hasattr(data, "__iter__"):
            raise KindError(f"fit needs data = (X, Y) or an iterable of batches (X, Y), got "
                            f"{type(data).__name__}")
        self.step, self.data, self.key, self.every = step, data, key, every
        self.k_max = 32 if steps_per_dispatch is None else \
            integer(steps_per_dispatch, "steps_per_dispatch", 1)

    def identity(self) -> dict:
        return {"n": None, "batch_size": None}

    def first_epoch(self, count: int) -> int:
        return 1

    def total(self, count, last, max_steps):
        return None if max_steps is None else max(max_steps - count, 0)

    def _batches(self, i0: int):
        for i, batch in enumerate(self.data, i0):
            if not isinstance(batch, (tuple, list)) or len(batch) != 2:
                raise ShapeError(f"fit: batch {i} of the iterable is not a pair (X, Y), got "
                                 f"{type(batch).__name__}")
            X, Y = (np.asarray(a) for a in batch)
            try:
                n = _check_pair(self.step, X, Y, f"batch {i} of the iterable")
            except ShapeError as e:  # [X, Y] as plain lists reads as two batches
                if i or not (isinstance(self.data, list) and len(self.data) == 2):
                    raise
                raise ShapeError(f"{e} (data is a list of two, read as two batches (X, Y): if "
                                 "it is the inputs and the targets, pass a tuple (X, Y) of "
                                 "arrays)") from None
            _split(self.step, n)
            yield X, Y

    def chunks(self, count, first, last, max_steps):
        seen = 0
        for epoch in range(first, last + 1):
            if max_steps is not None and count >= max_steps:
                return
            group, started, took = [], True, 0
            for (X, Y), after in _with_next(self._batches(seen)):
                seen, took, count = seen + 1, took + 1, count + 1
                group.append((X, Y))
                stop = max_steps is not None and count >= max_steps
                if after is REFUSED and not stop:  # the batches before a refused one run
                    yield self._chunk(group, epoch, started, False)
                    group, started = [], False
                    continue  # drawing the next item raises the refusal
                final = after is None or after is REFUSED or stop
                if final or len(group) == self.k_max or (self.every and count % self.every == 0) \
                        or after[0].shape != X.shape or after[1].shape != Y.shape:
                    yield self._chunk(group, epoch, started, final)
                    group, started = [], False
                if final:
                    break
            if not took:
                return

    def _chunk(self, group, epoch, first, last) -> Chunk:
        stacked = tuple(np.stack(a) for a in zip(*group))
        return Chunk((_to_device(self.step, stacked),), epoch, first, last)


#: what `_with_next` gives as the item after one whose successor could not be drawn
REFUSED = object()


def _with_next(iterable):
    """(item, the item after it or None): where an iterable ends is known at its last item.
    Where drawing the next item raises, `REFUSED` takes its place, and the error is raised
    when the caller asks for the item after it: the items before it are still taken."""
    it = iter(iterable)
    try:
        item = next(it)
    except StopIteration:
        return
    while True:
        try:
            after = next(it)
        except StopIteration:
            yield item, None
            return
        except Exception:  # noqa: BLE001 - raised once `item` is taken
            yield item, REFUSED
            raise
        yield item, after
        item = after


__all__ = ["DEVICE_DATA_LIMIT", "Chunk", "InMemory", "Stream", "epoch_order", "as_key",
           "key_data", "cuts"]
