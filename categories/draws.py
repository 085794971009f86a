"""The random draws of initial points: `jax.random.normal` and `jax.random.split`, the same
numbers, compiled for at most four counts rather than once per shape.

Un-jitted, JAX compiles its generator once per count drawn (and dtype): about half a second
each on a CPU, where LLVM optimises the unrolled threefry hash. A model's layers draw as many
counts as they have shapes, so `model.init` spent seconds compiling. With JAX's default
generator (threefry2x32 with `jax_threefry_partitionable`, the default) entry i of a draw
depends only on the key and i: a draw of n numbers is the first n of a draw of any larger
count. So a draw here asks for the next power of 16 and keeps the first n, on the host: every
shape of every model of a process shares one of four compilations (16, 256, 4096 and 65536
numbers, each drawn in well under a millisecond). Where that does not hold (another generator,
a typed key, a key under a trace, a draw of more than 65536 numbers), the draw is JAX's own
call. `tests/test_draws.py` checks the numbers against JAX's, bit for bit.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from .errors import KindError

#: Counts up to this are rounded up to a power of 16 (beyond, the padding's arithmetic and
#: memory would outweigh a compilation).
LARGEST_PADDED = 1 << 16


def _prefix_stable(key) -> bool:
    """Whether entry i of a draw from `key` depends only on the key and i (and `key` is a
    concrete raw key, which the host can read)."""
    return (isinstance(key, jax.Array) and not isinstance(key, jax.core.Tracer)
            and key.dtype == np.uint32 and key.shape == (2,)
            and jax.config.jax_threefry_partitionable  # type: ignore[attr-defined]  # a run-time flag
            and jax.config.jax_default_prng_impl == "threefry2x32")  # type: ignore[attr-defined]  # a flag


def padded(n: int) -> int | None:
    """The count drawn for n: the next power of 16 (at most four counts, each a cheap draw);
    None past `LARGEST_PADDED`, where the draw is JAX's own call.

    Examples:
        >>> from categories import draws
        >>> draws.padded(1), draws.padded(17), draws.padded(draws.LARGEST_PADDED + 1)
        (16, 256, None)
    """
    if not 0 < n <= LARGEST_PADDED:
        return None
    m = 16
    while m < n:
        m *= 16
    return m


#: the shape of the raw data of one PRNG key of JAX's default kind ((2,) for threefry)
KEY_DATA_SHAPE = tuple(jax.eval_shape(jax.random.PRNGKey, 0).shape)


def need_key(key, who: str = "init") -> None:
    """Refuse (`KindError`) what is not one PRNG key: a typed key of shape (), or raw uint32
    key data of shape `KEY_DATA_SHAPE` (several keys, as `jax.random.split` gives, are refused
    by name: a draw takes one). Shapes are static, so a traced key is checked too."""
    if isinstance(key, (jax.Array, np.ndarray)):
        typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
        if typed or key.dtype == np.uint32:
            want = () if typed else KEY_DATA_SHAPE
            if tuple(key.shape) == want:
                return
            what = "typed keys" if typed else "uint32 key data"
            raise KindError(f"{who} needs one PRNG key ({'a typed key of shape ()' if typed else f'uint32 key data of shape {want}'}), "
                            f"got {what} of shape {tuple(key.shape)}: pass one key, e.g. "
                            f"jax.random.split(k)[0]")
    raise KindError(f"{who} needs a PRNG key, got {type(key).__name__} {key!r:.60}: pass "
                    f"jax.random.PRNGKey(0) or jax.random.key(0), not a seed")


def normal(key, shape: tuple):
    """`jax.random.normal(key, shape)`, bit for bit.

    Only the draw itself is padded: arithmetic on it belongs to the caller, on the drawn
    shape (XLA's float32 division, for one, rounds differently in vector lanes than in the
    rest, so the same quotient computed over a padded array may differ in its last bit)."""
    need_key(key)
    n = math.prod(shape)
    m = padded(n)
    if m is None or not _prefix_stable(key):
        return jax.random.normal(key, shape)
    return jnp.asarray(np.asarray(jax.random.normal(key, (m,)))[:n].reshape(shape))


def split(key, n: int) -> list:
    """The keys of `jax.random.split(key, n)`, bit for bit, as a list of n keys."""
    need_key(key)
    m = padded(n)
    if m is None or not _prefix_stable(key):
        return list(jax.random.split(key, n))
    return [jnp.asarray(k) for k in np.asarray(jax.random.split(key, m))[:n]]


__all__ = ["normal", "split"]
