"""The backward pass of a composite is the gradient: random architectures against jax.grad,
per example and batched; and the store rule evaluates each forward part once.

The oracles are jax.grad of the whole composite p ↦ L(model.forward(x, p)) (reverse mode over
the composite, not the lens composition rule) and a second implementation of each drawn
network written directly in jnp (`Architecture.reference`), whose values must agree with the
lens's forward part.
"""

import jax
import jax.numpy as jnp
from hypothesis import given, settings, strategies as st

from categories import R
from categories import strategies as cs
from lenses import (Layer, batch_loss, batched, binary_cross_entropy, checkpoint, dL,
                    half_squared_error)
from lenses import laws
from lenses import strategies as ls
from lenses.laws import assert_close

def examples(n):
    """At most n examples (fewer under a quicker Hypothesis profile): un-jitted JAX costs
    milliseconds per operation, so the heavier properties run fewer examples."""
    return settings(max_examples=min(n, settings.default.max_examples))


# Widths are drawn from 1–8 by the strategy; the tests use a few of them (1, 3, 8), since each
# new shape costs un-jitted JAX a compilation of every primitive it meets.
WIDTHS = (1, 3, 8)
ACTS = tuple(ls.SMOOTH_ACTIVATIONS) + ("relu",)  # relu: both sides take relu'(0) = 0
BATCH = 3


@examples(100)
@given(ls.architectures(depth=(1, 6), widths=WIDTHS, activations=ACTS), st.data())
def test_backward_is_jax_grad_of_the_composite(arch, data):
    model = arch.lens
    x = data.draw(ls.points(model.dom))
    p = data.draw(ls.parameter_points(model.param))
    loss = data.draw(ls.losses(model.cod))
    # the forward part is the network: compare with the second implementation
    assert_close(model.forward(x, p), arch.reference(x, p), 1e-12, 1e-12, "forward vs reference")
    laws.check_backward_is_gradient(model, x, p, loss)


FAMILIES = {
    "half_squared_error": (half_squared_error, lambda n: cs.arrays((BATCH, n))),
    "binary_cross_entropy": (binary_cross_entropy, lambda n: cs.arrays((BATCH, n), 0.0, 1.0)),
}


@examples(30)
@given(ls.architectures(depth=(1, 4), widths=WIDTHS, activations=ACTS), st.data())
def test_batched_backward_is_jax_grad_of_the_summed_loss(arch, data):
    model = arch.lens
    X = jnp.asarray(data.draw(cs.arrays((BATCH,) + model.dom.shape)))
    p = data.draw(ls.parameter_points(model.param))
    family, targets = FAMILIES[data.draw(st.sampled_from(sorted(FAMILIES)))]
    Y = jnp.asarray(data.draw(targets(model.cod.shape[0])))
    total = batch_loss(family, Y, reduction="sum")
    out = batched(model).forward(X, p)
    dX, dp = batched(model).backward(X, p, dL(total, out))

    # oracle: the summed loss of the reference network over the examples, differentiated whole
    def summed(X, p):
        out = jax.vmap(arch.reference, (0, None))(X, p)
        return sum(family(Y[i]).fn(out[i]) for i in range(BATCH))

    gX, gp = jax.grad(summed, argnums=(0, 1))(X, p)
    assert_close(dp, gp, 1e-9, 1e-9, "batched parameter covector vs jax.grad of the summed loss")
    assert_close(dX, gX, 1e-9, 1e-9, "batched input covectors vs jax.grad of the summed loss")


@examples(20)
@given(ls.architectures(depth=(1, 3), widths=(1, 3)), st.data())
def test_batched_is_the_per_example_traversal_with_covectors_added(arch, data):
    model = arch.lens
    X = jnp.asarray(data.draw(cs.arrays((BATCH,) + model.dom.shape)))
    B = jnp.asarray(data.draw(cs.arrays((BATCH,) + model.cod.shape)))
    laws.check_batched_is_sum(model, X, data.draw(ls.parameter_points(model.param)), B)


# -- each forward part runs once ----------------------------------------------------------------

def counting_chain(n=16, hand_written=()):
    """n lenses R^2 → R^2 (x ↦ tanh(W x) or sin(x)), each counting the calls of its forward
    function; those at the indices in `hand_written` carry a hand-written backward part."""
    calls = [0] * n

    def make(i):
        def fwd(x, W):
            calls[i] += 1
            return jnp.tanh(W @ x) if i % 2 == 0 else jnp.sin(x)

        def back(x, W, c):  # the transposed Jacobians of x ↦ tanh(W x) (only used at even i)
            d = c * (1 - jnp.tanh(W @ x) ** 2)
            return W.T @ d, jnp.outer(d, x)

        param = R(2, 2) if i % 2 == 0 else R(0)
        return Layer(R(2), R(2), param, fwd, name=f"f{i}",
                        backward=back if i in hand_written else None)

    parts = [make(i) for i in range(n)]
    chain = parts[0]
    for part in parts[1:]:
        chain = chain >> part
    p = tuple(jnp.eye(2) * 0.9 + 0.1 * i if i % 2 == 0 else None for i in range(n))
    calls[:] = [0] * n  # construction checked each forward part's shape once: not counted
    return chain, p, calls


def test_each_forward_part_runs_once_per_forward_and_backward():
    x = jnp.array([0.3, -0.7])
    for hand_written in ((), (0, 4, 6, 14)):
        chain, p, calls = counting_chain(16, hand_written)
        y, pullback = chain.vjp(x, p)
        assert calls == [1] * 16
        da, dp = pullback(jnp.ones(2))
        assert calls == [1] * 16, f"the backward pass re-ran forward parts: {calls}"
        # and the covectors are right: jax.grad of the composite written without lenses
        def composite(x, p):
            for i, W in enumerate(p):
                x = jnp.tanh(W @ x) if i % 2 == 0 else jnp.sin(x)
            return jnp.sum(x)

        gx, gp = jax.grad(composite, argnums=(0, 1))(x, p)
        assert_close(da, gx, 1e-12, 1e-12, "input covector")
        assert_close(dp, gp, 1e-12, 1e-12, "parameter covector")


def test_each_forward_part_runs_once_in_the_batched_traversal():
    chain, p, calls = counting_chain(16, (2, 8))
    X = jnp.array([[0.3, -0.7], [1.0, 0.5], [-0.2, 0.1]])
    y, pullback = batched(chain).vjp(X, p)
    pullback(jnp.ones((3, 2)))
    assert calls == [1] * 16  # vmap traces each forward part once for the whole batch


def test_checkpoint_recomputes_the_forward_parts():
    chain, p, calls = counting_chain(16)
    x = jnp.array([0.3, -0.7])
    y, pullback = checkpoint(chain).vjp(x, p)
    forward_calls = list(calls)
    da, dp = pullback(jnp.ones(2))
    assert all(c > 1 for c in calls), f"checkpoint did not recompute: {calls}"
    assert all(c >= 1 for c in forward_calls)
    # the recomputation changes nothing in the result (the store rule, counted afresh)
    store, p2, _ = counting_chain(16)
    sa, sp = store.backward(x, p2, jnp.ones(2))
    assert_close(da, sa, 1e-12, 1e-12, "input covector: recompute vs store")
    assert_close(dp, sp, 1e-12, 1e-12, "parameter covector: recompute vs store")
