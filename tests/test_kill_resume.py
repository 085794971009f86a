"""A training process killed with SIGKILL mid-epoch and started again ends as the run that
was never interrupted: parameters and optimiser state bit for bit, and the same history.

The training script runs in a subprocess: `fit(..., checkpoints=Checkpoints(path, every=5,
resume=True))`.
Its first start pauses after each checkpoint (so that the kill lands while the run is in
progress, before the end of epoch 1); the parent kills it with SIGKILL as soon as the first
checkpoint file appears, then starts the same command again, which resumes. The oracle is
the same fit run here, in this process, without interruption.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

from categories import draws
from lenses import Checkpoints, adam, dense, fit, half_squared_error, load, tanh

SCRIPT = textwrap.dedent("""
    import json, sys, time
    import jax
    jax.config.update("jax_enable_x64", True)
    import numpy as np
    from categories import draws
    from lenses import Checkpoints, adam, dense, fit, half_squared_error, save, tanh

    ckpt, out, slow = sys.argv[1], sys.argv[2], sys.argv[3] == "slow"
    model = dense(3, 5) >> tanh >> dense(5, 2)
    p0 = model.init(jax.random.PRNGKey(0))
    X = np.asarray(draws.normal(jax.random.PRNGKey(1), (40, 3)))
    Y = np.asarray(draws.normal(jax.random.PRNGKey(2), (40, 2)))

    def pause(state):  # the first start holds still after each checkpoint: it is killed here
        if slow:
            time.sleep(60)

    state, history = fit(model, half_squared_error, adam(0.02), p0, (X, Y), epochs=3,
                         batch_size=4, key=5,
                         checkpoints=Checkpoints(ckpt, every=5, resume=True, on_save=pause))
    save(out, state, model, adam(0.02))
    with open(out + ".json", "w") as f:
        json.dump([(h["epoch"], h["loss"]) for h in history], f)
""")

MODEL = dense(3, 5) >> tanh >> dense(5, 2)
TIMEOUT = 180  # seconds for each start of the script (an import of JAX and two compilations)


def _leaves(t):
    return [np.asarray(a) for a in jax.tree_util.tree_leaves(t)]


@pytest.mark.slow  # a subprocess: run first, so no worker waits on it at the end
def test_a_run_killed_mid_epoch_and_resumed_ends_bit_for_bit_as_the_uninterrupted_run(tmp_path):
    script, ckpt, out = tmp_path / "train.py", tmp_path / "run.ckpt", tmp_path / "final"
    script.write_text(SCRIPT)
    cmd = [sys.executable, str(script), str(ckpt), str(out)]
    first = subprocess.Popen(cmd + ["slow"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not ckpt.exists():
            assert first.poll() is None, first.stdout.read().decode()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint appeared in time"
            time.sleep(0.02)
        first.send_signal(signal.SIGKILL)
        assert first.wait(timeout=30) == -signal.SIGKILL
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        first.stdout.close()
    assert not out.exists()  # killed before the end
    saved = load(ckpt, MODEL, adam(0.02))
    assert int(saved.state.count) == 5  # killed in epoch 1 (10 steps), after its first checkpoint
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]

    again = subprocess.run(cmd + ["fast"], capture_output=True, timeout=TIMEOUT)
    assert again.returncode == 0, again.stdout.decode()[-3000:] + again.stderr.decode()[-3000:]

    # the oracle: the same run, uninterrupted, here (same data, same configuration: float64)
    p0 = MODEL.init(jax.random.PRNGKey(0))
    X = np.asarray(draws.normal(jax.random.PRNGKey(1), (40, 3)))
    Y = np.asarray(draws.normal(jax.random.PRNGKey(2), (40, 2)))
    ref, history = fit(MODEL, half_squared_error, adam(0.02), p0, (X, Y), epochs=3, batch_size=4,
                       key=5, checkpoints=Checkpoints(str(tmp_path / "ref"), every=5))
    final = load(out, MODEL, adam(0.02)).state
    assert int(final.count) == int(ref.count) == 30
    for a, b in zip(_leaves((final.params, final.opt_state)), _leaves((ref.params, ref.opt_state))):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    got = json.loads((tmp_path / "final.json").read_text())
    assert [tuple(h) for h in got] == [(h["epoch"], h["loss"]) for h in history]
