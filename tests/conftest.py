"""Strict JAX settings and the Hypothesis profile shared by the whole suite.

float64 everywhere (the laws are compared at ~1e-9), and implicit rank promotion raises,
so that no code relies on broadcasting arrays of different ranks by accident.

A failing law reports quickly. Every example of a law runs un-jitted JAX (milliseconds per
operation, a compilation per new shape), so Hypothesis's shrinking, which re-runs the test
hundreds of times and by default stops only after 5 minutes, took 4–5 minutes on 2 cores to
report a broken recompute rule or parallel product. The default profile therefore bounds
shrinking to SHRINK_SECONDS (or skips it, should Hypothesis no longer offer the bound), skips
the "explain" phase (more re-runs), and stops at the first bug. The number of examples run
when the laws hold is unchanged. For a fully shrunk report: HYPOTHESIS_PROFILE=shrink pytest ...

One compilation cache for the whole run. Un-jitted JAX compiles every operation once per
shape (about 50 ms each on the CPU), and the run's processes (the xdist workers, the
examples, the notebooks' kernels, the multi-process tests) meet many of the same operations
at the same shapes. `pytest_configure` points JAX's persistent compilation cache, for every
process the run starts, at a directory made fresh for the run and removed at its end, so each
operation is compiled once per run rather than once per process. (The cache returns the very
executable XLA compiled for the same program, so no result depends on it.)
"""

import os
import shutil
import tempfile

import jax
from hypothesis import HealthCheck, Phase, settings

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")

#: Wall-clock budget of Hypothesis's shrinking of a failing example, in seconds.
SHRINK_SECONDS = 20

_QUICK_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target)
try:  # Hypothesis keeps its shrinking deadline in a module constant; no setting reaches it
    from hypothesis.internal.conjecture import engine as _engine

    _can_bound = isinstance(getattr(_engine, "MAX_SHRINKING_SECONDS", None), (int, float))
except ImportError:  # pragma: no cover - a future Hypothesis
    _engine, _can_bound = None, False
_FULL_SHRINK_SECONDS = _engine.MAX_SHRINKING_SECONDS if _can_bound else None

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
_fast_failure = dict(report_multiple_bugs=False,
                     phases=_QUICK_PHASES + ((Phase.shrink,) if _can_bound else ()))

# In CI (CI=true) the examples are derandomized: the run is the one a developer can repeat
# locally with CI=true, so that a submission cannot pass or fail by the draw.
settings.register_profile("paralens", max_examples=100, derandomize=bool(os.environ.get("CI")),
                          **_fast_failure, **_common)
# A quicker run while editing: HYPOTHESIS_PROFILE=quick pytest ...
settings.register_profile("quick", max_examples=20, **_fast_failure, **_common)
# Hypothesis's own shrinking, unbounded (minutes when a law fails), for a minimal example.
settings.register_profile("shrink", max_examples=100, **_common)

_profile = os.environ.get("HYPOTHESIS_PROFILE", "paralens")
settings.load_profile(_profile)
if _can_bound:
    _engine.MAX_SHRINKING_SECONDS = _FULL_SHRINK_SECONDS if _profile == "shrink" else SHRINK_SECONDS


_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"


def pytest_configure(config):
    """The run's compilation cache: made by the process that starts the run (the workers and
    every subprocess inherit the variables), used by this process too."""
    if _CACHE_ENV not in os.environ and not os.environ.get("PYTEST_XDIST_WORKER"):
        config._paralens_cache = tempfile.mkdtemp(prefix="paralens-jax-cache-")
        os.environ[_CACHE_ENV] = config._paralens_cache
        os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    if _CACHE_ENV in os.environ:
        jax.config.update("jax_compilation_cache_dir", os.environ[_CACHE_ENV])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)


def pytest_unconfigure(config):
    made = getattr(config, "_paralens_cache", None)
    if made:
        shutil.rmtree(made, ignore_errors=True)
        for name in (_CACHE_ENV, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):
            os.environ.pop(name, None)


def pytest_collection_modifyitems(config, items):
    """The slow tests (a subprocess each, up to a minute) first: the workers then end on short
    tests, and none waits at the end for the other to finish a notebook."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
