"""Recurrence: a cell (x, h) ↦ h' unrolled over a sequence, one set of parameters for every step.

A cell is a lens R^{n_in} × H → H for a state space H (`rnn_cell`, `gru_cell`: H = R^{n_h};
`lstm_cell`: H = R^{2×n_h}, the hidden and the cell state as rows). `unroll(cell)` at R^{T×n_in}
is the lens R^{T×n_in} → R^{T} × H, (x_1..x_T) ↦ (h_1..h_T), h_t = cell(x_t, h_{t−1}), h_0 = 0,
built as

    start ≫ repeat(step, T) ≫ outputs,  tied along Δ_T : P → P^T.

`step` is an endomorphism of the state S = (R^{T×n_in} × R^{n_h}) × R^{T×n_h} (inputs, hidden
state, outputs), a shift register written as a lens expression with its copies explicit: the
input buffer is copied, one copy's head x_t goes with h into the cell, the other is rotated
by one position; the new h is copied, one copy kept as the state and one shifted into the
output buffer. After T steps the input buffer is as it was and the output buffer holds
h_1..h_T in order. Every map here is smooth (rotations and shifts are linear), so no step
index travels on a wire.

Tying over time: `repeat` gives each of its T copies its own slot (parameters stacked, P^T);
the recurrent cell uses *one* point of P at every step, which is the reparameterisation of
the repeat along the diagonal Δ_T : P → P^T, q ↦ (q, ..., q) (a broadcast over the stacked
axis). Its pullback adds the T slots' covectors: the tied slot receives the sum over time
steps, the rule of weight tying (`categories.para.tie`). This is the option that compiles
to one `lax.scan` (repeat's), whose program has the size of one step whatever T is.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from categories import Product, R, Smooth, Space, draws

from ..families import LensFamily, family
from ..inputs import need_fixed, need_lens
from .basic import identity, layer_sizes, lecun_normal
from ..layer import Layer
from ..para_lens import Reparam
from ..sites import at_path
from ..repetition import repeat, stacked
from ..structure import copy
from categories.errors import SpaceMismatch

tree_map = jax.tree_util.tree_map


# -- cells ---------------------------------------------------------------------------------------

def rnn_cell(n_in: int, n_hidden: int) -> Layer:
    """(x, h) ↦ tanh(W x + U h + b) : R^{n_in} × R^{n_h} → R^{n_h}, parameters
    R^{n_h×n_in} × R^{n_h×n_h} × R^{n_h} (Elman).

    Examples:
        >>> cell = rnn_cell(3, 4)
        >>> cell
        rnn_cell(3→4) : R^3 × R^4 → R^4, params R^{4×3}×R^{4×4}×R^4
        >>> cell((jnp.ones(3), jnp.zeros(4)), cell.init(jax.random.PRNGKey(0))).shape
        (4,)
    """
    n_in, n_hidden = layer_sizes("rnn_cell", n_in=n_in, n_hidden=n_hidden)
    def fwd(xh, p):
        (x, h), (W, U, b) = xh, p
        return jnp.tanh(W @ x + U @ h + b)

    def init(k):
        k1, k2 = draws.split(k, 2)
        return (lecun_normal(k1, (n_hidden, n_in), n_in), lecun_normal(k2, (n_hidden, n_hidden), n_hidden),
                jnp.zeros((n_hidden,)))

    return Layer(R(n_in) * R(n_hidden), R(n_hidden),
                 Product(R(n_hidden, n_in), R(n_hidden, n_hidden), R(n_hidden)), fwd,
                 name=f"rnn_cell({n_in}→{n_hidden})", init=init)


def gru_cell(n_in: int, n_hidden: int) -> Layer:
    """(x, h) ↦ (1 − z) ⊙ n + z ⊙ h : R^{n_in} × R^{n_h} → R^{n_h} with r, z = σ(W_{r,z} x + b +
    U_{r,z} h + c), n = tanh(W_n x + b_n + r ⊙ (U_n h + c_n)); parameters (W, U, b, c) ∈
    R^{3n_h×n_in} × R^{3n_h×n_h} × R^{3n_h} × R^{3n_h}, gates stacked in the order r, z, n.

    Examples:
        >>> cell = gru_cell(3, 4)
        >>> [leaf.shape for leaf in cell.init(jax.random.PRNGKey(0))]
        [(12, 3), (12, 4), (12,), (12,)]
    """
    n_in, n_hidden = layer_sizes("gru_cell", n_in=n_in, n_hidden=n_hidden)
    m = n_hidden

    def fwd(xh, p):
        (x, h), (W, U, b, c) = xh, p
        gx, gh = W @ x + b, U @ h + c
        r = jax.nn.sigmoid(gx[:m] + gh[:m])
        z = jax.nn.sigmoid(gx[m:2 * m] + gh[m:2 * m])
        n = jnp.tanh(gx[2 * m:] + r * gh[2 * m:])
        return (1.0 - z) * n + z * h

    def init(k):
        k1, k2 = draws.split(k, 2)
        return (lecun_normal(k1, (3 * m, n_in), n_in), lecun_normal(k2, (3 * m, m), m),
                jnp.zeros((3 * m,)), jnp.zeros((3 * m,)))

    return Layer(R(n_in) * R(m), R(m), Product(R(3 * m, n_in), R(3 * m, m), R(3 * m), R(3 * m)),
                 fwd, name=f"gru_cell({n_in}→{n_hidden})", init=init)


def lstm_cell(n_in: int, n_hidden: int) -> Layer:
    """(x, (h, c)) ↦ (o ⊙ tanh(c'), c') : R^{n_in} × R^{2×n_h} → R^{2×n_h} with c' = f ⊙ c + i ⊙ g,
    i, f, o = σ(·), g = tanh(·) of the rows of W x + U h + b; parameters (W, U, b) ∈
    R^{4n_h×n_in} × R^{4n_h×n_h} × R^{4n_h}, gates stacked in the order i, f, g, o. The state's
    rows are the hidden state h and the cell state c (one space, so that `unroll` carries both).

    Examples:
        >>> cell = lstm_cell(3, 4)
        >>> cell.dom, cell.cod, cell.param
        (R^3 × R^{2×4}, R^{2×4}, R^{16×3} × R^{16×4} × R^16)
    """
    n_in, n_hidden = layer_sizes("lstm_cell", n_in=n_in, n_hidden=n_hidden)
    m = n_hidden

    def fwd(xs, p):
        (x, s), (W, U, b) = xs, p
        h, c = s[0], s[1]
        z = W @ x + U @ h + b
        i, f = jax.nn.sigmoid(z[:m]), jax.nn.sigmoid(z[m:2 * m])
        g, o = jnp.tanh(z[2 * m:3 * m]), jax.nn.sigmoid(z[3 * m:])
        c2 = f * c + i * g
        return jnp.stack([o * jnp.tanh(c2), c2])

    def init(k):
        k1, k2 = draws.split(k, 2)
        # the forget gate's bias starts at 1: the cell state is kept, not forgotten, at first
        b = jnp.zeros((4 * m,)).at[m:2 * m].set(1.0)
        return lecun_normal(k1, (4 * m, n_in), n_in), lecun_normal(k2, (4 * m, m), m), b

    return Layer(R(n_in) * R(2, m), R(2, m), Product(R(4 * m, n_in), R(4 * m, m), R(4 * m)),
                 fwd, name=f"lstm_cell({n_in}→{n_hidden})", init=init)


# -- the shift register ----------------------------------------------------------------------------

CELL_PATH = (2, 0)  # where the cell's slot sits in the step's parameter point


def shift_step(cell, T: int):
    """One step of the unrolled recurrence, an endomorphism of (R^{T×n_in} × R^{n_h}) × R^{T×n_h}:
    copy the inputs ≫ (x_t, h) to the cell, inputs rotated ≫ cell ⊗ id ≫ copy h' ⊗ id ≫ shift
    h' into the outputs. Parameters those of the cell (at `CELL_PATH`).

    Examples:
        >>> step = shift_step(rnn_cell(3, 4), T=5)
        >>> step.dom == step.cod, step.dom
        (True, (R^{5×3} × R^4) × R^{5×4})
    """
    X1, H = _cell_spaces(cell, "shift_step")
    (T,) = layer_sizes("shift_step", T=T)
    n_in = X1.shape[0]
    X, Hs = R(T, n_in), R(T, *H.shape)

    def read(s, p):  # (((xs, xs'), h), hs) ↦ ((x_t, h), (xs rotated, hs)); x_t = xs'[0]
        ((xs, xs2), h), hs = s
        return (xs2[0], h), (jnp.roll(xs, -1, axis=0), hs)

    def write(s, p):  # ((h', h''), (xs, hs)) ↦ ((xs, h'), hs shifted by one with h'' last)
        (h1, h2), (xs, hs) = s
        return (xs, h1), jnp.concatenate([hs[1:], h2[None, :]], axis=0)

    take = (copy(X) @ identity.at(H)) @ identity.at(Hs)
    rest = X * Hs
    return (take
            >> Layer(((X * X) * H) * Hs, (X1 * H) * rest, R(0), read, name="read x_t, rotate", node=True)
            >> (cell @ identity.at(rest))
            >> (copy(H) @ identity.at(rest))
            >> Layer((H * H) * rest, (X * H) * Hs, R(0), write, name="write h_t", node=True))


class Tied(Reparam):
    """(start ≫ repeat(step, T) ≫ outputs) reparameterised along Δ_T : P → P^T: every step uses
    the one point of P, and the slot receives the sum of the T steps' covectors.

    Examples:
        >>> rnn = unroll(rnn_cell(3, 4)).at(R(5, 3))
        >>> type(rnn).__name__, rnn.param == rnn_cell(3, 4).param
        ('Tied', True)
    """

    def __init__(self, lens, r, T: int, cell, name=None):
        need_fixed(lens, "Tied (its lens, the unrolled chain)")
        cell = need_fixed(cell, "Tied (its cell)")
        (T,) = layer_sizes("Tied", T=T)
        super().__init__(lens, r, init=cell.init, name=name)
        if cell.param != self.param:  # the cell's point is the one every step uses
            raise SpaceMismatch(f"Tied: the parameters {cell.param!r} of the cell {cell.name} are "
                                f"not the domain {self.param!r} of {r.name}, the map tying them")
        self.T, self.cell = T, cell

    def rebuild(self, children):
        return Tied(children[0], self.r, self.T, self.cell, self.name)

    def uses(self):
        return tree_map(lambda u: self.T * u, self.cell.uses())


def _cell_spaces(cell, who: str) -> tuple:
    """(R^{n_in}, H), the spaces of a recurrent cell R^{n_in} × H → H, else a catalogued error
    naming `who` (`KindError` for what is not a lens, `SpaceMismatch` for another shape)."""
    need_lens(cell, who)
    cell = cell.fixed(who)
    dom = cell.dom
    if not isinstance(dom, Product) or len(dom.factors) != 2 or dom.factors[1] != cell.cod \
            or len(dom.factors[0].shape) != 1:
        raise SpaceMismatch(f"{who} needs a cell R^n × H → H, got {cell.name} : {dom!r} → "
                            f"{cell.cod!r}")
    return dom.factors


def _unroll_at(cell, A: Space):
    (X1, H) = cell.dom.factors
    n_in = X1.shape[0]
    if len(A.shape) != 2 or A.shape[1] != n_in:
        raise SpaceMismatch(f"unroll({cell.name}) needs sequences R^{{T×{n_in}}}, got {A!r}")
    T = A.shape[0]
    X, Hs = R(T, n_in), R(T, *H.shape)

    def start(xs, p):
        return (xs, jnp.zeros(H.shape, xs.dtype)), jnp.zeros((T, *H.shape), xs.dtype)

    step = shift_step(cell, T)
    # the member at A has domain A itself (an open subset of R^{T×n_in} included in X)
    chain = (Layer(A, (X * H) * Hs, R(0), start, name="h₀ = 0", node=True)
             >> repeat(step, T)
             >> Layer((X * H) * Hs, Hs, R(0), lambda s, p: s[1], name="outputs", node=True))
    # the stacked point with the cell's slot left empty: Δ_T fills it with the broadcast q
    template = at_path(stacked(step.param, T).zeros(), CELL_PATH, None)

    def diagonal(q):
        spread = tree_map(lambda leaf: jnp.broadcast_to(leaf[None], (T,) + leaf.shape), q)
        return None, at_path(template, CELL_PATH, spread), None

    r = Smooth(cell.param, chain.param, diagonal, f"Δ_{T}", check=False)
    return Tied(chain, r, T, cell, name=f"unroll({cell.name}, T={T})")


def unroll(cell) -> LensFamily:
    """The family R^{T×n_in} ↦ (R^{T×n_in} → R^T × H, (x_t) ↦ (h_t), h_t = cell(x_t, h_{t−1}),
    h_0 = 0), parameters those of the cell, tied over the T steps (one `lax.scan`).

    Examples:
        >>> rnn = unroll(rnn_cell(3, 4)).at(R(5, 3))
        >>> rnn
        unroll(rnn_cell(3→4), T=5) : R^{5×3} → R^{5×4}, params R^{4×3}×R^{4×4}×R^4
    """
    _cell_spaces(cell, "unroll")
    return family(lambda A: _unroll_at(cell, A), f"unroll({cell.name})")


__all__ = ["rnn_cell", "gru_cell", "lstm_cell", "unroll", "shift_step", "Tied"]
