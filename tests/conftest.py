"""Strict JAX settings and the Hypothesis profile shared by the whole suite.

float64 everywhere (the laws are compared at ~1e-9), and implicit rank promotion raises,
so that no code relies on broadcasting arrays of different ranks by accident.
"""

import os

import jax
from hypothesis import HealthCheck, settings

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")

settings.register_profile(
    "paralens", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# A quicker run while editing: HYPOTHESIS_PROFILE=quick pytest ...
settings.register_profile(
    "quick", max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "paralens"))
