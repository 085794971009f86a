"""Loss families as objects: a user's own family and inner product, written here alone, train
with `train_step` and serve `GaussNewton` (and, with an output Fisher, `Fisher` and `KFAC`);
families are equal by value, so equal ones share compiled functions; targets are checked.

Oracles: plain-jnp networks and losses differentiated by JAX as a whole (`jax.grad`,
`jax.jacobian`, `jax.hessian`), and the Poisson output Fisher diag exp(z) by hand."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from categories import Covector, R, Vector
from categories.linear import unwrap
from lenses import (KFAC, Context, Fisher, GaussNewton, Metric, Layer, batch_loss,
                    binary_cross_entropy, dense, gd, half_squared_error, output_fisher,
                    softmax_cross_entropy, tanh, train_step)
from lenses.losses import LossFamily, SoftmaxCrossEntropy, loss_family

jax.config.update("jax_enable_x64", True)


# -- a user's loss families and inner product, defined here alone ---------------------------------

@dataclasses.dataclass(frozen=True)
class PseudoHuber(LossFamily):
    """L_y(z) = Σ δ² (√(1 + ((z − y)/δ)²) − 1): smooth, quadratic near y, linear far away.
    No predictive distribution is declared (no output_fisher)."""

    delta: float = 1.0

    def value(self, c, y):
        r = (c - y) / self.delta
        return self.delta ** 2 * jnp.sum(jnp.sqrt(1.0 + r ** 2) - 1.0)


class PoissonNLL(LossFamily):
    """L_y(z) = Σ exp(z) − y z on log-rates z: the negative log-likelihood of y ~ Poisson(e^z)
    up to log y!, with output Fisher F(z) = diag exp(z). A plain (non-dataclass) subclass."""

    predictive = "Poisson(exp z)"

    def value(self, c, y):
        return jnp.sum(jnp.exp(c) - y * c)

    def output_fisher(self, z, v):
        return jnp.exp(z) * v

    def check_values(self, Y, batched=True):
        if np.any(Y < 0):
            raise ValueError(f"{self!r}: counts must be ≥ 0, got {Y[Y < 0][0]}")


class ScaledEuclidean(Metric):
    """g(u, v) = c Σ u_i v_i: sharp divides the components by c, flat multiplies."""

    def __init__(self, c):
        self.c = c

    def sharp(self, p, cov, ctx=None):
        return Vector(jax.tree_util.tree_map(lambda a: a / self.c, unwrap(cov)),
                      getattr(cov, "space", None))

    def flat(self, p, vec, ctx=None):
        return Covector(jax.tree_util.tree_map(lambda a: a * self.c, unwrap(vec)),
                        getattr(vec, "space", None))


# -- plain oracles ---------------------------------------------------------------------------------

MODEL = dense(3, 4) >> tanh >> dense(4, 2)
SIZES = (3, 4, 2)
D = 3 * 4 + 4 + 4 * 2 + 2


def plain_net(p, x):
    (W1, b1), _, (W2, b2) = p
    return W2 @ jnp.tanh(W1 @ x + b1) + b2


def flat_net(theta, x):
    W1, b1 = theta[:12].reshape(4, 3), theta[12:16]
    W2, b2 = theta[16:24].reshape(2, 4), theta[24:26]
    return W2 @ jnp.tanh(W1 @ x + b1) + b2


def pseudo_huber(z, y, delta):
    return jnp.sum(delta ** 2 * (jnp.sqrt(1.0 + ((z - y) / delta) ** 2) - 1.0))


def point(rng, scale=0.7):
    return jax.tree_util.tree_map(lambda a: jnp.asarray(scale * rng.normal(size=a.shape)),
                                  MODEL.param.zeros())


def flat(tree):
    return np.concatenate([np.ravel(a) for a in jax.tree_util.tree_leaves(tree)])


def data(seed, n=12):
    rng = np.random.default_rng(seed)
    return rng, rng.normal(size=(n, 3)), rng.normal(size=(n, 2))


# -- training with the user's family and inner product ----------------------------------------------

def test_a_user_family_and_inner_product_train_and_the_first_step_is_the_hand_step():
    rng, X, Y = data(0, 16)
    Y = 3.0 * Y  # far from the start: the linear tails of the loss matter
    p0 = point(rng)
    family, metric, lr, c = PseudoHuber(delta=0.5), ScaledEuclidean(2.0), 1.0, 2.0
    step = train_step(MODEL, family, gd(lr, metric=metric))
    state = step.init(p0)
    new, report = step(state, X, Y)

    def hand(p):
        Z = jax.vmap(lambda x: plain_net(p, x))(X)
        return jnp.mean(jax.vmap(lambda z, y: pseudo_huber(z, y, 0.5))(Z, Y))

    loss0, g = jax.value_and_grad(hand)(p0)
    assert float(report.loss) == pytest.approx(float(loss0), rel=1e-12)
    expected = jax.tree_util.tree_map(lambda p, gi: p - lr * gi / c, p0, g)
    np.testing.assert_allclose(flat(new.params), flat(expected), rtol=1e-12, atol=1e-12)

    losses = [float(report.loss)]
    for _ in range(100):
        new, report = step(new, X, Y)
        losses.append(float(report.loss))
    assert losses[-1] < 0.7 * losses[0]
    assert all(b <= a + 1e-12 for a, b in zip(losses, losses[1:]))


def test_a_user_family_is_the_start_of_the_backward_pass_in_batch_loss():
    rng, X, Y = data(1)
    Z = jnp.asarray(rng.normal(size=Y.shape))
    L = batch_loss(PseudoHuber(0.5), Y, "mean")
    assert L.dom == R(12, 2)
    by_hand = jax.grad(lambda Z: jnp.mean(jax.vmap(lambda z, y: pseudo_huber(z, y, 0.5))(Z, Y)))(Z)
    np.testing.assert_allclose(jax.grad(L.fn)(Z), by_hand, rtol=1e-12)
    # Calling the family at one target gives the plain map L_y : C → R.
    Ly = PseudoHuber(0.5)(Y[0])
    assert Ly.dom == R(2) and Ly.cod == R()
    assert float(Ly.fn(Z[0])) == pytest.approx(float(pseudo_huber(Z[0], Y[0], 0.5)), rel=1e-12)


# -- natural-gradient metrics with the user's families ----------------------------------------------

def jacobians(p, X):
    return np.asarray(jax.vmap(jax.jacobian(flat_net), (None, 0))(jnp.asarray(flat(p)), X))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_gauss_newton_with_a_user_family_is_jt_h_j(reduction):
    rng, X, Y = data(2)
    p = point(rng)
    G = GaussNewton(damping=0.0).matrix(p, Context(MODEL, PseudoHuber(0.5), X, Y, reduction))
    J = jacobians(p, X)  # (n, 2, D)
    Z = jax.vmap(lambda x: plain_net(p, x))(X)
    H = np.asarray(jax.vmap(jax.hessian(lambda z, y: pseudo_huber(z, y, 0.5)))(Z, Y))  # (n, 2, 2)
    s = 1.0 / len(X) if reduction == "mean" else 1.0
    expected = s * np.einsum("imd,imk,ike->de", J, H, J)
    assert G.shape == (D, D)
    np.testing.assert_allclose(G, expected, rtol=1e-10, atol=1e-12)
    # The loss is not quadratic: its Hessian is not the identity, and the oracle sees it.
    assert not np.allclose(H, np.eye(2))


def test_gauss_newton_takes_a_plain_function_from_targets_to_losses():
    rng, X, Y = data(8)
    p = point(rng)

    def family(y):  # y ↦ L_y, a plain function, wrapped as a family
        return PseudoHuber(0.5)(y)

    by_function = GaussNewton(damping=0.0).matrix(p, Context(MODEL, family, X, Y))
    by_family = GaussNewton(damping=0.0).matrix(p, Context(MODEL, PseudoHuber(0.5), X, Y))
    np.testing.assert_allclose(by_function, by_family, rtol=1e-12, atol=1e-14)


def test_fisher_with_a_user_output_fisher_is_the_closed_form():
    rng, X, _ = data(3)
    Y = rng.poisson(1.5, size=(12, 2)).astype(float)
    p = point(rng)
    ctx = Context(MODEL, PoissonNLL(), X, Y)
    F = Fisher(damping=0.0).matrix(p, ctx)
    J = jacobians(p, X)
    rate = np.exp(np.asarray(jax.vmap(lambda x: plain_net(p, x))(X)))  # (n, 2)
    expected = np.einsum("imd,im,ime->de", J, rate, J) / len(X)
    np.testing.assert_allclose(F, expected, rtol=1e-10, atol=1e-12)
    # For the canonical (log) link the Fisher is the Gauss–Newton matrix.
    np.testing.assert_allclose(GaussNewton(damping=0.0).matrix(p, ctx), expected,
                               rtol=1e-10, atol=1e-12)
    # output_fisher(family) is the family's F(z) v.
    z, v = jnp.asarray([0.1, -0.3]), jnp.asarray([1.0, 2.0])
    np.testing.assert_allclose(output_fisher(PoissonNLL())(z, v), np.exp(z) * v)


def test_kfac_with_a_user_output_fisher_has_the_exact_output_factor_of_one_layer():
    # One dense layer: its output is the network's output, B_i = I, so G = (1/n) Σ_i F(z_i).
    model = dense(3, 2)
    rng, X, _ = data(4)
    Y = rng.poisson(1.0, size=(12, 2)).astype(float)
    p = (jnp.asarray(rng.normal(size=(2, 3))), jnp.asarray(rng.normal(size=2)))
    (A, G), = KFAC(damping=0.0).factors(p, Context(model, PoissonNLL(), X, Y))
    Z = X @ np.asarray(p[0]).T + np.asarray(p[1])
    np.testing.assert_allclose(G, np.diag(np.exp(Z).mean(axis=0)), rtol=1e-10, atol=1e-12)
    Xbar = np.concatenate([X, np.ones((12, 1))], axis=1)
    np.testing.assert_allclose(A, Xbar.T @ Xbar / 12, rtol=1e-12)


def test_fisher_refuses_a_user_family_without_an_output_fisher_and_says_what_to_do():
    rng, X, Y = data(5)
    p = point(rng)
    ctx = Context(MODEL, PseudoHuber(0.5), X, Y)
    with pytest.raises(TypeError, match="predictive distribution") as e:
        Fisher().matrix(p, ctx)
    assert "output_fisher" in str(e.value) and "PseudoHuber" in str(e.value)
    # ... while an explicit output_fisher= serves it.
    F = Fisher(damping=0.0, output_fisher=lambda z, v: v).matrix(p, ctx)
    G = GaussNewton(damping=0.0).matrix(p, Context(MODEL, half_squared_error, X, Y))
    np.testing.assert_allclose(F, G, rtol=1e-10, atol=1e-12)


# -- equality by value and compiling once ------------------------------------------------------------

def test_families_are_equal_and_hashed_by_value():
    ce3 = softmax_cross_entropy(classes=3)
    assert isinstance(ce3, LossFamily)
    assert ce3 == softmax_cross_entropy(classes=3) == loss_family(
        functools.partial(softmax_cross_entropy, classes=3))
    assert hash(ce3) == hash(loss_family(functools.partial(softmax_cross_entropy, classes=3)))
    assert ce3 != softmax_cross_entropy(classes=4) and ce3 != softmax_cross_entropy
    assert half_squared_error != binary_cross_entropy
    assert PseudoHuber(0.5) == PseudoHuber(0.5) and hash(PseudoHuber(0.5)) == hash(PseudoHuber(0.5))
    assert PseudoHuber(0.5) != PseudoHuber(1.0)
    assert PoissonNLL() == PoissonNLL() and hash(PoissonNLL()) == hash(PoissonNLL())
    assert len({ce3, softmax_cross_entropy(classes=3), PoissonNLL(), PoissonNLL()}) == 2
    # Called at a target with configuration, a family is still the plain map L_y.
    L = softmax_cross_entropy(2, classes=3)
    assert L.dom == R(3) and L.cod == R()
    # Plain callables are wrapped, equal when they are the same function.
    def family(y):
        return half_squared_error(y)
    assert loss_family(family) == loss_family(family)
    assert loss_family(family) != loss_family(lambda y: half_squared_error(y))


def test_a_fresh_but_equal_family_does_not_recompile():
    traces = []

    class Counting(SoftmaxCrossEntropy):
        def value(self, c, y):
            traces.append(1)  # runs only while a function is being traced
            return super().value(c, y)

    rng, X, _ = data(6)
    Y = rng.integers(0, 2, 12)
    model = dense(3, 4) >> tanh >> dense(4, 2)
    p = jax.tree_util.tree_map(lambda a: jnp.asarray(rng.normal(size=a.shape)), model.param.zeros())
    metric = GaussNewton()
    metric.matrix(p, Context(model, functools.partial(Counting(), classes=2), X, Y))
    first = len(traces)
    assert first > 0
    for family in (functools.partial(Counting(), classes=2), Counting(classes=2),
                   Counting()(classes=2)):
        metric.matrix(p, Context(model, family, X + 1.0, Y))
        metric.sharp(p, Covector(p), Context(model, family, X, Y))
    # matrix traced once; sharp traced once on its first use, and never again.
    second = len(traces) - first
    metric.sharp(p, Covector(p), Context(model, functools.partial(Counting(), classes=2), X, Y))
    assert len(traces) == first + second

    class Other(Counting):  # another type: not equal, so compiled afresh
        pass

    assert Other(classes=2) != Counting(classes=2)
    metric.matrix(p, Context(model, Other(classes=2), X, Y))
    assert len(traces) > first + second


def test_a_fresh_partial_of_a_built_in_family_does_not_recompile():
    traces = []

    def forward(x, p):
        traces.append(1)  # the model runs in python only while being traced
        return p[0] @ x + p[1]

    model = Layer(R(3), R(2), R(2, 3) * R(2), forward, name="affine")
    rng, X, _ = data(7)
    Y = rng.integers(0, 2, 12)
    p = (jnp.asarray(rng.normal(size=(2, 3))), jnp.asarray(rng.normal(size=2)))
    metric = Fisher()
    metric.matrix(p, Context(model, functools.partial(softmax_cross_entropy, classes=2), X, Y))
    first = len(traces)
    for _ in range(3):
        metric.matrix(p, Context(model, functools.partial(softmax_cross_entropy, classes=2), X, Y))
    assert len(traces) == first


# -- targets are checked, with messages that name the loss ---------------------------------------------

def test_class_labels_out_of_range_are_refused_not_clamped():
    for label in (5, -1, 3):
        with pytest.raises(ValueError, match=r"softmax_cross_entropy\(classes=3\): class labels "
                                             rf"must be integers in \[0, 3\), got {label}"):
            softmax_cross_entropy(label, classes=3)
    model = dense(4, 6) >> tanh >> dense(6, 3)
    step = train_step(model, functools.partial(softmax_cross_entropy, classes=3), gd(0.1))
    state = step.init(model.init(jax.random.PRNGKey(0)))
    X = np.zeros((4, 4))
    # the compiled step refuses it on the device, raised at the next synchronisation point
    new, report = step(state, X, np.asarray([0, 1, 5, 2]))
    with pytest.raises(ValueError, match=r"step 1: the target of example 2 of the batch"):
        report.check()
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(new.params),
                                                    jax.tree_util.tree_leaves(state.params)))
    with pytest.raises(ValueError, match=r"got -1 \(example 0\)"):
        GaussNewton().matrix(state.params, Context(model, step.loss_family, X,
                                                   np.asarray([-1, 1, 0, 2])))
    with pytest.raises(ValueError, match=r"got 3"):
        batch_loss(functools.partial(softmax_cross_entropy, classes=3), np.asarray([3, 0]))
    step(state, X, np.asarray([0, 1, 2, 2]))  # in range: accepted


def test_targets_that_do_not_fit_the_model_output_are_refused():
    model = dense(4, 3)
    step = train_step(model, half_squared_error, gd(0.1))
    state = step.init(model.init(jax.random.PRNGKey(0)))
    X = np.zeros((5, 4))
    with pytest.raises(ValueError, match=r"half_squared_error: targets of shape \(1,\) \(per "
                                         r"example\) belong to outputs in R\^1, but the model's "
                                         r"outputs lie in R\^3"):
        step(state, X, np.zeros((5, 1)))  # would broadcast silently
    step_ce = train_step(model, softmax_cross_entropy(classes=4), gd(0.1))
    with pytest.raises(ValueError, match=r"outputs in R\^4, but the model's outputs lie in R\^3"):
        step_ce(state, X, np.zeros(5, int))
    with pytest.raises(ValueError, match=r"needs outputs of shape \(5, 3\), got \(5, 2\)"):
        batch_loss(half_squared_error, np.zeros((5, 3))).fn(jnp.zeros((5, 2)))


def test_target_values_outside_the_family_are_refused():
    with pytest.raises(ValueError, match=r"binary_cross_entropy: targets must lie in \[0, 1\], "
                                         r"got 1.5"):
        binary_cross_entropy(jnp.asarray([0.2, 1.5]))
    with pytest.raises(ValueError, match=r"softmax_cross_entropy: probability-vector targets "
                                         r"need entries in \[0, 1\], got -0.5"):
        softmax_cross_entropy(jnp.asarray([-0.5, 1.5]))
    with pytest.raises(ValueError, match=r"must sum to 1 over the last axis, got 0.6"):
        softmax_cross_entropy(jnp.asarray([0.3, 0.3]))
    with pytest.raises(TypeError, match=r"class label and must be an integer, got dtype float"):
        batch_loss(softmax_cross_entropy(classes=3), np.asarray([0.0, 2.0]))
    with pytest.raises(TypeError, match=r"needs the number of classes: use "
                                        r"softmax_cross_entropy\(classes=k\)"):
        batch_loss(softmax_cross_entropy, np.asarray([0, 2]))
    with pytest.raises(ValueError, match=r"half_squared_error: targets must be finite, got nan"):
        batch_loss(half_squared_error, np.asarray([[0.0], [np.nan]]))
    with pytest.raises(ValueError, match=r"PoissonNLL: counts must be ≥ 0, got -1"):
        batch_loss(PoissonNLL(), np.asarray([[1.0], [-1.0]]))
    # probability vectors and one-hot rows are accepted
    batch_loss(softmax_cross_entropy(classes=3), np.eye(3))
    softmax_cross_entropy(jnp.asarray([0.2, 0.8]))


def test_a_loss_for_one_target_is_refused_where_a_family_belongs():
    y = jnp.zeros(3)
    for where in (lambda f: train_step(dense(4, 3), f, gd(0.1)),
                  lambda f: Context(dense(4, 3), f, jnp.zeros((2, 4)), jnp.zeros((2, 3))),
                  lambda f: batch_loss(f, jnp.zeros((2, 3)))):
        with pytest.raises(TypeError, match=r"pass the family, e.g. half_squared_error, "
                                            r"not half_squared_error\(y\)"):
            where(half_squared_error(y))
    with pytest.raises(TypeError, match="pass an instance"):
        loss_family(PoissonNLL)
    with pytest.raises(TypeError, match=r"has no configuration clases"):
        softmax_cross_entropy(clases=3)
