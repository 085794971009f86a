"""The error catalogue: every class documented, a subclass of the builtin users catch, and
raised by a public entry point with a message that names the user's own objects."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import categories
import lenses
from categories import Covector, OpenBall, R, Vector
from lenses import (CATALOGUE, CheckpointError, CheckpointMismatch, CovectorError, DimensionError,
                    DomainError, Euclidean, HyperparameterError, KindError, NonFiniteError,
                    ParalensError, ShapeError, SlotError, SpaceMismatch, TargetError,
                    TargetTypeError, accuracy, adam, batched, dense, fit, gd, half_squared_error,
                    load, save, softmax_cross_entropy, tanh, tie, train_step)

MODEL = dense(2, 3) >> tanh >> dense(3, 2)
P = MODEL.init(jax.random.PRNGKey(0))
X, Y = np.ones((4, 2)), np.zeros((4, 2))

BUILTIN = {DomainError: ValueError, DimensionError: ValueError, SlotError: ValueError,
           SpaceMismatch: TypeError, ShapeError: ValueError, TargetError: ValueError,
           TargetTypeError: TypeError, CovectorError: TypeError, HyperparameterError: ValueError,
           KindError: TypeError, NonFiniteError: FloatingPointError,
           CheckpointError: ValueError, CheckpointMismatch: ValueError,
           lenses.MetricError: ValueError, lenses.LayoutError: ValueError, lenses.UnsupportedError: NotImplementedError,
           lenses.MissingExtraError: ImportError}


def test_every_class_is_documented_in_the_table_and_catchable_as_a_builtin():
    assert set(CATALOGUE) == set(BUILTIN)
    table = categories.errors.__doc__
    for cls in CATALOGUE:
        assert issubclass(cls, BUILTIN[cls]) and issubclass(cls, ParalensError)
        assert cls.__doc__ and cls.__name__ in table
        # listed once, in categories; lenses re-exports the same class without listing it
        assert getattr(lenses, cls.__name__) is cls and cls.__name__ not in lenses.__all__
        assert getattr(categories, cls.__name__) is cls and cls.__name__ in categories.__all__
    # the historical homes still work
    assert categories.DomainError is DomainError
    assert lenses.optimisers.NonFiniteError is NonFiniteError


CASES = [
    (DomainError, lambda: R(2).check(jnp.array([0.0, jnp.nan])),
     r"point is not a point of R\^2: coordinate \(1,\) is nan, not a real number"),
    (DomainError, lambda: OpenBall([0.0], 1.0).check(np.array([1j])),
     r"not a point of OpenBall\(\[0.0\], 1.0\) ⊆ R\^1: expected real numbers, got an array of dtype complex128"),
    (DimensionError, lambda: R(2.5), r"dimension 0 of R\(2.5,\) must be an integer ≥ 0, got 2.5"),
    (DimensionError, lambda: dense(2, -1), r"dense: n_out must be an integer ≥ 1, got -1"),
    (SlotError, lambda: tie(MODEL, [0.5, 2]), r"slot index 0.5 is not an integer .*slots 0 to 2"),
    (SlotError, lambda: tie(MODEL, [-1, 0]), r"slot index -1 is not a slot of .*: it has slots 0 to 2"),
    (SpaceMismatch, lambda: dense(2, 3) >> dense(4, 1),
     r"cannot compose dense\(2→3\) : R\^2 → R\^3 with dense\(4→1\) : R\^4 → R\^1"),
    (ShapeError, lambda: batched(dense(2, 3)).forward(np.ones((8, 2, 1)), dense(2, 3).init(
        jax.random.PRNGKey(0))),
     r"batched\(dense\(2→3\)\): the batch must have shape \(n, \*\(2,\)\) for the domain R\^2 "
     r"\(one row per example\), got shape \(8, 2, 1\)"),
    (ShapeError, lambda: fit(MODEL, half_squared_error, gd(0.1), P, (X[:3], Y)),
     r"fit needs as many targets as inputs: 3 inputs, 4 targets"),
    (TargetError, lambda: fit(MODEL, half_squared_error, gd(0.1), P, (X, np.ones((4, 5)))),
     r"half_squared_error: targets of shape \(5,\) \(per example\) belong to outputs in R\^5, "
     r"but the model's outputs lie in R\^2"),
    (TargetError, lambda: accuracy(dense(2, 1), dense(2, 1).init(jax.random.PRNGKey(0)), X,
                                   np.ones((4, 5))),
     r"accuracy needs a classifier with outputs R\^k, k ≥ 2 .* dense\(2→1\) has outputs R\^1"),
    (TargetError, lambda: accuracy(MODEL, P, X, np.array([0, 1, 2, 1])),
     r"labels must be integers in \[0, 2\), got 2 \(example 2\)"),
    (TargetTypeError, lambda: softmax_cross_entropy(classes=3)(np.array(["a"])),
     r"targets must be real numbers, got dtype <U1"),
    (CovectorError, lambda: gd(0.1, metric=Euclidean())(P, Vector(P)), r"got a Vector"),
    (CovectorError, lambda: gd(0.1, metric=Euclidean())(P, P), r"steps on a Covector .* got tuple"),
    (CovectorError, lambda: gd(0.1, metric=Euclidean())(
        P, Covector(((jnp.ones((3, 2)), jnp.ones((3,))), None, (jnp.ones((2, 2)), jnp.ones((2,)))))),
     r"the covector on slot 2 has a leaf of shape \(2, 2\) where the point has \(2, 3\)"),
    (CovectorError, lambda: Euclidean().sharp(P, Vector(P)), r"Euclidean\(\).sharp takes a covector, got a Vector"),
    (CovectorError, lambda: MODEL.backward(jnp.ones(2), P, Covector(jnp.ones(3))),
     r"the covector given to the backward part of .* is not a covector on R\^2: its value should "
     r"have shape \(2,\), got an array of shape \(3,\)"),
    (HyperparameterError, lambda: fit(MODEL, half_squared_error, gd(0.1), P, (X, Y), batch_size=0),
     r"batch_size must be an integer ≥ 1, got 0"),
    (HyperparameterError, lambda: fit(MODEL, half_squared_error, gd(0.1), P, (X, Y), epochs=-3),
     r"epochs must be an integer ≥ 0, got -3"),
    (HyperparameterError, lambda: adam(-1.0), r"the learning rate lr must be finite and > 0, got -1.0"),
    (KindError, lambda: train_step(MODEL, half_squared_error(jnp.ones(2)), gd(0.1)),
     r"a loss family is needed, got the loss .* pass the family"),
    (KindError, lambda: train_step(MODEL, half_squared_error, gd(0.1))(P, X, Y),
     r"a training step takes a TrainState .* got tuple"),
    (KindError, lambda: train_step("model", half_squared_error, gd(0.1)),
     r"train_step needs a lens \(e.g. dense\(2, 3\)\) or a family of lenses .* got str 'model'"),
    (NonFiniteError, lambda: gd(0.1).step(gd(0.1).init(jnp.ones((1,))), jnp.ones((1,)), Covector(jnp.asarray([np.inf]), R(1))),
     r"the covector of slot 0 contains NaN or infinity"),
]


@pytest.mark.parametrize("cls, attempt, message", CASES,
                         ids=[f"{c.__name__}-{i}" for i, (c, _, _) in enumerate(CASES)])
def test_each_error_is_raised_with_a_message_naming_the_users_objects(cls, attempt, message):
    with pytest.raises(cls, match=message):
        attempt()


def test_checkpoint_errors_name_the_file_and_the_slot(tmp_path):
    state = train_step(MODEL, half_squared_error, adam(0.1)).init(P)
    path = save(tmp_path / "m.st", state, MODEL, adam(0.1))
    (tmp_path / "cut.st").write_bytes(open(path, "rb").read()[:100])
    with pytest.raises(CheckpointError, match=r"'.*cut.st' is not a readable safetensors file "
                                              r"\(truncated or damaged\)"):
        load(tmp_path / "cut.st", MODEL, adam(0.1))
    with pytest.raises(CheckpointMismatch, match=r"'.*m.st' was saved for 'dense\(2→3\) ≫ tanh ≫ "
                                                 r"dense\(3→2\)', not .*slot 0 \(dense\(2→4\)\)"):
        load(path, dense(2, 4) >> tanh >> dense(4, 2), adam(0.1))
