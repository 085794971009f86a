"""The bytes of a saved file: the dtypes it holds, their checksum, reading them, writing them.

A saved file (`lenses.training.saved`) is a safetensors file. safetensors names numpy's dtypes
and JAX's own (ml_dtypes) bfloat16 and float8 formats, but its numpy reader knows only
numpy's, so a file is read here (`decode`), every dtype it can hold by its safetensors name
(`DTYPES`), and `save` refuses, before writing, an array of another dtype (`holdable`). The
checksum (`digest`) covers the metadata and every array's name, dtype, shape and bytes; the
file is written atomically (`atomic_write`).
"""

from __future__ import annotations

import hashlib
import os
import tempfile

import jax.numpy as jnp
import numpy as np

from categories.errors import CheckpointError, KindError


# The dtypes a saved file holds, by their safetensors names: numpy's, and JAX's own (ml_dtypes)
# bfloat16 and float8 formats, which safetensors writes but its numpy reader does not know.
DTYPES = {name: np.dtype(t) for name, t in {
    "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "U16": np.uint16, "I16": np.int16,
    "U32": np.uint32, "I32": np.int32, "U64": np.uint64, "I64": np.int64, "F16": np.float16,
    "F32": np.float32, "F64": np.float64, "C64": np.complex64, "BF16": jnp.bfloat16,
    "F8_E4M3": jnp.float8_e4m3fn, "F8_E5M2": jnp.float8_e5m2,
    "F8_E4M3FNUZ": jnp.float8_e4m3fnuz, "F8_E5M2FNUZ": jnp.float8_e5m2fnuz}.items()}
JAX_DTYPES = {DTYPES[n] for n in ("BF16", "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ")}


def holdable(name: str, a) -> np.ndarray:
    """`a` as a host array, if a saved file holds its dtype (and `load` reads it back), else
    `KindError` naming the entry."""
    try:
        a = np.asarray(a)
    except (TypeError, ValueError) as e:  # a ragged list, say
        raise KindError(f"save: {name} is not an array ({e}), got {a!r}") from None
    if a.dtype not in DTYPES.values():
        raise KindError(f"save: {name} has dtype {a.dtype}, which a saved file does not hold "
                        f"(it holds {', '.join(sorted(str(d) for d in DTYPES.values()))}): "
                        "convert it to one of these")
    return a


def decode(data: bytes) -> dict:
    """The arrays of a safetensors file's bytes, bfloat16 and float8 included."""
    from safetensors import deserialize

    tensors = {}
    for name, view in deserialize(data):
        dtype = DTYPES.get(view["dtype"])
        if dtype is None:
            raise CheckpointError(f"its array {name!r} has the dtype {view['dtype']}, which "
                                  "paralens does not save")
        tensors[name] = np.frombuffer(view["data"], dtype).reshape(view["shape"])
    return tensors


def digest(meta_json: str, tensors: dict) -> str:
    """The SHA-256 of the metadata and of each array's name, dtype, shape and bytes."""
    h = hashlib.sha256(meta_json.encode())
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        # numpy's type string ('<f4') as ever (older files keep their sums); JAX's own dtypes
        # by name, since their type strings ('<V2') do not tell bfloat16 from another
        tag = a.dtype.name if a.dtype in JAX_DTYPES else a.dtype.str
        h.update(f"\0{name}\0{tag}\0{a.shape}\0".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def atomic_write(path: str, data: bytes) -> None:
    """Write `data` to `path` atomically: a temporary file in the same directory, flushed and
    fsync'ed, renamed over `path`; the directory is fsync'ed so the rename survives a crash."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".paralens-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - a platform without directory handles
        return
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


__all__ = ["DTYPES", "holdable", "decode", "digest", "atomic_write"]
