"""Blind spots of the suite, found by planting slips in the library one at a time, each closed
here by a test that fails with its slip planted and passes without it.

Each section names the slips it closes (the table is in the commit history of this file):

- saved files: the checksum covers every array's dtype tag (a file whose leaf was relabelled
  with another dtype of the same width is refused), and a state of mixed dtypes is read back
  bit for bit;
- class labels at the boundary: classes − 1 accepted, classes refused, by the family's check,
  by `accuracy` and by the compiled step (a `Fault.TARGET`, the parameters kept);
- probability targets at the boundary of [0, 1] and of Σ = 1;
- conv2d and the pools with stride 2 and both paddings, against a convolution written here;
- the dual of a composite of non-square linear maps against the matrix transpose;
- and the further slips listed at the end of the file.

Oracles: the file's header rewritten here with `json`; hand-computed boundaries; numpy
convolutions and pools written here (padding by hand, strides by slicing); numpy matrices.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lenses import (CheckpointError, CheckpointMismatch, dense, gd, load, save, train_step,
                    half_squared_error)
from lenses.training.state import TrainState

# -- saved files: the checksum covers the dtype tag of every array --------------------------------

MODEL = dense(2, 3)
P32 = (jnp.asarray([[0.5, -1.25], [2.0, 0.75], [-3.5, 1.0]], jnp.float32),
       jnp.asarray([0.25, -0.5, 1.5], jnp.bfloat16))
EXTRA = {"ids": np.array([3, -7, 2 ** 30], np.int32),
         "half": np.array([1.5, -2.25], jnp.bfloat16),
         "f8": np.array([0.5, -1.0, 2.0], jnp.float8_e4m3fn),
         "wide": np.array([1e300, -2.5], np.float64)}


def _bits(a):
    a = np.asarray(a)
    return a.dtype, a.shape, a.tobytes()


def _saved(tmp_path):
    state = TrainState.of(P32, gd(0.1).init(P32), 4)
    return save(tmp_path / "mixed.st", state, MODEL, gd(0.1), extra_arrays=EXTRA), state


def _relabel(path, entry, dtype, out):
    """The file at `path` with the header's dtype of `entry` replaced by `dtype` (same width:
    the bytes are untouched), written to `out`: only the checksum can tell."""
    data = open(path, "rb").read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    assert header[entry]["dtype"] != dtype
    header[entry]["dtype"] = dtype
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    out.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + n:])
    return out


def test_a_state_of_mixed_dtypes_is_read_back_bit_for_bit(tmp_path):
    path, state = _saved(tmp_path)
    got = load(path, MODEL, gd(0.1))
    assert [_bits(a) for a in jax.tree_util.tree_leaves(got.state.params)] == \
        [_bits(a) for a in jax.tree_util.tree_leaves(state.params)]
    assert got.state.params[0].dtype == jnp.float32 and got.state.params[1].dtype == jnp.bfloat16
    assert {k: _bits(v) for k, v in got.info["extra"].items()} == \
        {k: _bits(v) for k, v in EXTRA.items()}


@pytest.mark.parametrize("entry, dtype", [
    ("extra.half", "F16"),            # bfloat16 read as float16
    ("extra.f8", "F8_E4M3FNUZ"),      # one float8 read as another (numpy's type strings agree)
    ("extra.f8", "F8_E5M2"),          # ... and another
    ("extra.ids", "U32"),             # int32 read as uint32
    ("extra.ids", "F32"),             # int32 read as float32
    ("params[1]", "F16"),             # a parameter slot: bfloat16 read as float16
])
def test_a_leaf_relabelled_with_another_dtype_is_refused_by_the_checksum(tmp_path, entry, dtype):
    path, _ = _saved(tmp_path)
    bad = _relabel(path, entry, dtype, tmp_path / "relabelled.st")
    with pytest.raises(CheckpointError) as e:
        load(bad, MODEL, gd(0.1))
    # damaged, not a file for another model: the relabelled dtype is caught by the checksum
    assert not isinstance(e.value, CheckpointMismatch)
