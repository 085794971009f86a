"""One check, once: "is x shaped as a point of this space" is asked of `Space.mismatch` by every
entry point, so one bad value gets one diagnosis wherever it is given.

The same bad value, (a point of R^2, an array of shape (4,)) where R^2 × R^3 is expected, is
given to composition, a layer's forward part, a pullback, the parameter check, the optimiser's
covector check, saved work and `Space.check`; each must refuse it with the same words, written
out here by hand (not computed by the code under test), naming where in the value it differs.
"""

import jax.numpy as jnp
import pytest

from categories import Covector, Product, R, Smooth
from categories.errors import CovectorError, DomainError, SpaceMismatch
from lenses import Layer, TrainState, gd, half_squared_error, save, train_step

P = Product(R(2), R(3))
GOOD = (jnp.zeros(2), jnp.zeros(3))
BAD = (jnp.zeros(2), jnp.zeros(4))
#: the diagnosis, by hand: the second factor has 4 coordinates where R^3 has 3
SAYS = "is not a point of R^3: expected an array of shape (3,), got an array of shape (4,)"


def _composition():
    lands_badly = Smooth(R(1), P, lambda x: BAD, "f")
    return (lands_badly >> Smooth(P, P, lambda y: y, "g"))(jnp.zeros(1))


def _layer_forward():
    return Layer(R(1), P, R(0), lambda a, p: BAD, name="bad")


def _pullback():
    layer = Layer(R(1), P, R(0), lambda a, p: GOOD, name="good")
    return layer.backward(jnp.zeros(1), None, BAD)


def _parameters():
    model = Layer(R(1), R(1), P, lambda a, p: a * (jnp.sum(p[0]) + jnp.sum(p[1])), name="m")
    return train_step(model, half_squared_error, gd(0.1)).init(BAD)


def _optimiser_covector():
    return gd(0.1)(GOOD, Covector(BAD, P))


def _saved_work(tmp_path):
    model = Layer(R(1), R(1), P, lambda a, p: a * (jnp.sum(p[0]) + jnp.sum(p[1])), name="m")
    state = train_step(model, half_squared_error, gd(0.1)).init(GOOD)
    return save(tmp_path / "s", TrainState.of(BAD, state.opt_state), model)


def _space_check():
    return P.check(BAD, "the point")


ENTRIES = [
    ("composition", _composition, SpaceMismatch, "its value[1] "),
    ("a layer's forward part", _layer_forward, SpaceMismatch, "its value[1] "),
    ("a pullback's covector", _pullback, CovectorError, "its value[1] "),
    ("a parameter point", _parameters, SpaceMismatch, "the point of slot 1 "),
    # a Covector is checked where it is built, before the optimiser sees it
    ("the optimiser's covector", _optimiser_covector, CovectorError, "the value of the Covector[1] "),
    ("saved work", _saved_work, SpaceMismatch, "the point of slot 1 "),
    ("Space.check", _space_check, DomainError, "the point[1] "),
]


@pytest.mark.parametrize("what, attempt, error, where", ENTRIES, ids=[e[0] for e in ENTRIES])
def test_one_bad_value_gets_one_diagnosis_at_every_entry_point(what, attempt, error, where,
                                                                tmp_path):
    with pytest.raises(error) as caught:
        attempt(tmp_path) if attempt is _saved_work else attempt()
    assert where + SAYS in str(caught.value), f"{what}: {caught.value}"
