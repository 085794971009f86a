"""The update u(p) = p − η (p')♯ and stateful optimisers as lenses on S × P, chained from parts.

An optimiser is a lens (S × P, S × P) ⇄ (P, P*) in the sense of Cruttwell–Gavranović–Ghani–
Wilson–Zanasi (section 3): its forward part `lookahead(s, p)` is the point where the network is
evaluated and the covector taken (p itself, except for Nesterov), and its backward part
`step(s, p, p')` turns the covector p' delivered there into a new state and a new point.

The backward part is a chain of small parts (as optax builds `adam = chain(scale_by_adam,
scale_by_learning_rate)`): first the sharp map of the chosen inner product, p' ↦ (p')♯ (a
covector is not a vector), then a rule on vectors (momentum, Adagrad, Adam, or any optax
transformation), then the learning rate, v ↦ −η v; the point moves to p + (the output):

    adam(lr, metric=m)  ≡  chain(sharp(m), scale_by_adam(), scale_by_learning_rate(lr))
    nesterov(lr, beta)  ≡  chain(sharp(), scale_by_momentum(beta), scale_by_learning_rate(lr),
                                 lookahead=True)
    from_optax(tx, m)   ≡  chain(sharp(m), tx)

Modules: `parts` (the part protocol, the library's parts, their states), `lens` (the optimiser
lens `Optimiser`, `chain`, and `Update`, the class of the update map that `gd` returns),
`shorthands` (gd, momentum, nesterov, adagrad, adam, from_optax), `faults` (refused steps and
backtracking; their errors are the catalogue's, `lenses.errors`).

Optimisers, their parts and inner products are values (`lenses.values.Value`): immutable
pytrees whose leaves are their numbers. An optimiser's state is the tuple of its parts'
states (NamedTuples with parameter-shaped leaves and None at R^0 slots), as `optax.chain`
keeps it.
"""

from .faults import (check_floating, check_params, finite_flags, raise_non_finite, raise_outside,
                     slot_names)
from .lens import Optimiser, chain
from .parts import (AdagradState, AdamState, EmptyState, Foreign, MomentumState, Part, Sharp,
                    is_part, scale_by_adagrad, scale_by_adam, scale_by_learning_rate,
                    scale_by_momentum, sharp)
from .shorthands import adagrad, adam, from_optax, gd, momentum, nesterov
from .riemannian import RiemannianAdamState, riemannian_adam, scale_by_riemannian_adam

__all__ = ["Optimiser", "chain", "gd", "momentum", "nesterov", "adagrad",
           "adam", "from_optax", "Part", "Foreign", "Sharp", "sharp",
           "scale_by_momentum", "scale_by_adagrad", "scale_by_adam", "scale_by_learning_rate",
           "EmptyState", "MomentumState", "AdagradState", "AdamState",
           "riemannian_adam", "scale_by_riemannian_adam", "RiemannianAdamState"]
