"""Saved work: a state written to a safetensors file and read back bit for bit; damaged,
truncated and foreign files refused; a checkpointed fit resumed ends as the uninterrupted run.

Oracles: the state before saving (bytes compared); the file's header parsed here with `json`
and its array bytes read with `numpy.frombuffer` (not with the library); an uninterrupted fit.
"""

import json
import os

import jax
import numpy as np
import pytest

from categories import draws
from lenses import (CheckpointError, Checkpoints, CheckpointMismatch, KindError, Saved, SpaceMismatch, adam,
                    dense, fit, gd, half_squared_error, load, momentum, save, tanh, train_step)

MODEL = dense(3, 5) >> tanh >> dense(5, 2)
P0 = MODEL.init(jax.random.PRNGKey(0))
X = np.asarray(draws.normal(jax.random.PRNGKey(1), (44, 3)))
Y = np.asarray(draws.normal(jax.random.PRNGKey(2), (44, 2)))
KEY = jax.random.PRNGKey(5)


def leaves(t):
    return [np.asarray(a) for a in jax.tree_util.tree_leaves(t)]


def same_bits(a, b):
    la, lb = leaves(a), leaves(b)
    return jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
        for x, y in zip(la, lb))


@pytest.fixture(scope="module")
def trained():
    state, _ = fit(MODEL, half_squared_error, adam(0.02), P0, (X, Y), epochs=1, batch_size=4,
                   key=KEY, max_steps=5)
    return state


def test_a_saved_state_loads_bit_for_bit(tmp_path, trained):
    path = save(tmp_path / "s.safetensors", trained, MODEL, adam(0.02), KEY)
    got = load(path, MODEL, adam(0.02))
    assert isinstance(got, Saved)
    assert same_bits(got.state, trained) and int(got.state.count) == 5
    assert np.array_equal(np.asarray(got.key), np.asarray(KEY))
    assert got.info["model"] == MODEL.term()
    # the directory holds the file and nothing else: the temporary file was renamed
    assert os.listdir(tmp_path) == ["s.safetensors"]


def test_the_file_is_plain_json_and_raw_bytes(tmp_path, trained):
    """Read without the library (and without unpickling): an 8-byte length, a JSON header,
    little-endian arrays at the offsets it gives."""
    path = save(tmp_path / "s.safetensors", trained, MODEL, adam(0.02), KEY)
    data = open(path, "rb").read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    entry = header["params[0][0]"]
    lo, hi = entry["data_offsets"]
    W = np.frombuffer(data[8 + n + lo:8 + n + hi], dtype="<f8").reshape(entry["shape"])
    assert W.tobytes() == np.asarray(trained.params[0][0]).tobytes()
    assert "paralens.sha256" in header["__metadata__"]


def test_a_typed_key_and_a_stateless_optimiser(tmp_path):
    step = train_step(MODEL, half_squared_error, gd(0.1))
    state = step.init(P0)
    key = jax.random.key(3)
    got = load(save(tmp_path / "g", state, MODEL, gd(0.1), key), MODEL)
    assert same_bits(got.state, state)
    assert np.array_equal(jax.random.key_data(got.key), jax.random.key_data(key))


def test_a_file_truncated_at_every_tenth_byte_is_refused(tmp_path, trained):
    path = save(tmp_path / "s", trained, MODEL, adam(0.02), KEY)
    data = open(path, "rb").read()
    cut = tmp_path / "cut"
    for offset in range(0, len(data), 10):
        cut.write_bytes(data[:offset])
        with pytest.raises(CheckpointError, match="cut"):
            load(cut, MODEL, adam(0.02))


def test_a_file_with_one_byte_flipped_in_the_array_data_is_refused(tmp_path, trained):
    path = save(tmp_path / "s", trained, MODEL, adam(0.02), KEY)
    data = bytearray(open(path, "rb").read())
    start = 8 + int.from_bytes(data[:8], "little")
    bad = tmp_path / "bad"
    assert len(data) - start > 500  # the arrays are all there
    for i in range(start, len(data), 3):
        flipped = bytearray(data)
        flipped[i] ^= 0x10
        bad.write_bytes(bytes(flipped))
        with pytest.raises(CheckpointError, match="damaged: the checksum"):
            load(bad, MODEL, adam(0.02))
    # a flipped byte in the header: unreadable or damaged, refused either way
    for i in range(8, start, 37):
        flipped = bytearray(data)
        flipped[i] ^= 0x01
        bad.write_bytes(bytes(flipped))
        with pytest.raises(CheckpointError):
            load(bad, MODEL, adam(0.02))


def test_a_file_for_another_model_names_the_first_mismatched_slot(tmp_path, trained):
    path = save(tmp_path / "s", trained, MODEL, adam(0.02), KEY)
    other = dense(3, 5) >> tanh >> dense(5, 3)
    with pytest.raises(CheckpointMismatch, match=r"slot 2 \(dense\(5→3\)\) has parameter object "
                                                 r"R\^\{3×5\} × R\^3, the file's slot 2 is "
                                                 r"'R\^\{2×5\} × R\^2'"):
        load(path, other, adam(0.02))
    with pytest.raises(CheckpointMismatch, match=r"slot 3 \(tanh\) has parameter object R\^0, the file.s slot 3 is no such slot"):
        load(path, MODEL >> tanh, adam(0.02))
    with pytest.raises(CheckpointMismatch, match="structure"):
        load(path, MODEL, momentum(0.1))  # another optimiser's state
    with pytest.raises(CheckpointMismatch, match="pass that optimiser"):
        load(path, MODEL)


def test_save_refuses_what_is_not_a_state_of_the_model(tmp_path, trained):
    with pytest.raises(KindError, match="TrainState"):
        save(tmp_path / "s", P0, MODEL)
    with pytest.raises(SpaceMismatch, match=r"slot 0 \(dense\(3→2\)\) is not a point of .*expected a tuple of 2"):
        save(tmp_path / "s", trained, dense(3, 2))
    with pytest.raises(KindError, match="file path"):
        save(3, trained, MODEL)
    with pytest.raises(CheckpointError, match="cannot read"):
        load(tmp_path / "missing", MODEL)
    (tmp_path / "plain").write_bytes(b"hello world, not a checkpoint at all")
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load(tmp_path / "plain", MODEL)
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


# -- fit checkpoints and resumes -----------------------------------------------------------------

X40, Y40 = X[:40], Y[:40]  # 10 steps per epoch: chunks of 5 steps, one compilation


def run(tmp_path, name, resume=False, on_save=None):
    return fit(MODEL, half_squared_error, adam(0.02), P0, (X40, Y40), epochs=3, batch_size=4,
               key=KEY, checkpoints=Checkpoints(str(tmp_path / name), every=5, resume=resume,
                                                on_save=on_save))


def test_a_run_resumed_from_its_checkpoints_ends_as_the_uninterrupted_run(tmp_path):
    whole, history = run(tmp_path, "whole")
    seen = []

    def copy_each(state):  # keep every checkpoint the run writes
        k = int(state.count)
        seen.append(k)
        (tmp_path / f"at{k}").write_bytes((tmp_path / "copy").read_bytes())

    run(tmp_path, "copy", on_save=copy_each)
    assert seen == [5, 10, 15, 20, 25, 30]
    for k in (5, 20):  # mid-epoch 1; the end of epoch 2: the run goes on in a copy of it
        (tmp_path / f"again{k}").write_bytes((tmp_path / f"at{k}").read_bytes())
        state, resumed = run(tmp_path, f"again{k}", resume=True)
        assert int(state.count) == 30
        assert same_bits((state.params, state.opt_state), (whole.params, whole.opt_state))
        assert [(h["epoch"], h["loss"]) for h in resumed] == [(h["epoch"], h["loss"])
                                                              for h in history]


def test_resume_from_a_missing_file_starts_the_run_and_a_foreign_run_is_refused(tmp_path):
    state, history = run(tmp_path, "c", resume=True)  # no file c yet: the run starts
    assert int(state.count) == 30 and [h["epoch"] for h in history] == [1, 2, 3]
    c = Checkpoints(str(tmp_path / "c"), resume=True)
    with pytest.raises(CheckpointMismatch, match="another key"):
        fit(MODEL, half_squared_error, adam(0.02), P0, (X40, Y40), epochs=3, batch_size=4, key=9,
            checkpoints=c)
    with pytest.raises(CheckpointMismatch, match="batches of 4, not 40 in batches of 2"):
        fit(MODEL, half_squared_error, adam(0.02), P0, (X40, Y40), epochs=3, batch_size=2,
            checkpoints=c)


def test_save_refuses_a_point_outside_the_parameter_object_which_load_would_refuse(tmp_path):
    """Decided: a state with NaN parameters is refused at `save` (the file `load` would refuse
    is never written), naming the slot; the state before it saves as usual."""
    from categories import DomainError
    from lenses import dense, gd, half_squared_error, save, tanh, train_step

    model = dense(2, 2) >> tanh >> dense(2, 1)
    step = train_step(model, half_squared_error, gd(0.1))
    state = step.init(model.init(jax.random.PRNGKey(0)))
    W, b = state.params[2]
    broken = state._replace(params=(state.params[0], None, (W.at[0, 1].set(np.nan), b)))
    with pytest.raises(DomainError, match="the parameters to save"):
        save(str(tmp_path / "nan.st"), broken, model, gd(0.1))
    assert not os.listdir(tmp_path)
    save(str(tmp_path / "ok.st"), state, model, gd(0.1))
    assert os.listdir(tmp_path) == ["ok.st"]
