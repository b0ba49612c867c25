"""Training building blocks: every hand-written gradient against central finite differences,
optimizers against their update rules, and a tiny MLP that learns (numpy and strict device)."""

from __future__ import annotations

import numpy as np
import pytest

from labdist.devices import get_backend, to_host
from labdist.training import activations, layers, losses, optimizers

RNG = np.random.default_rng(0)


def numeric_grad(f, x, eps=1e-6):
    """d f / d x by central differences (f returns a scalar; x is changed and restored)."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + eps
        hi = f()
        x[i] = old - eps
        lo = f()
        x[i] = old
        g[i] = (hi - lo) / (2 * eps)
    return g


@pytest.mark.parametrize("activation", [None, "relu", "sigmoid", "tanh", "softmax"])
def test_dense_gradients(activation):
    layer = layers.Dense(4, activation=activation)
    params = {k: v.astype(np.float64) for k, v in layer.build((3,), RNG).items()}
    params["bias"] = RNG.standard_normal(4)
    x = RNG.standard_normal((5, 3))
    proj = RNG.standard_normal((5, 4))  # loss = sum(proj * y): a generic upstream gradient

    def loss():
        return float((proj * layer.forward(np, params, x)[0]).sum())
    _, cache = layer.forward(np, params, x)
    dx, grads = layer.backward(np, params, cache, proj)
    np.testing.assert_allclose(dx, numeric_grad(loss, x), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grads["kernel"], numeric_grad(loss, params["kernel"]),
                               rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grads["bias"], numeric_grad(loss, params["bias"]),
                               rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(("name", "from_logits"), [
    ("mse", False), ("sparse_categorical_crossentropy", False),
    ("sparse_categorical_crossentropy", True)])
def test_loss_gradients(name, from_logits):
    loss = losses.get(name, from_logits=from_logits)
    if name == "mse":
        y_true, y_pred = RNG.standard_normal((6, 2)), RNG.standard_normal((6, 2))
    else:
        y_true = RNG.integers(0, 3, 6)
        logits = RNG.standard_normal((6, 3))
        y_pred = logits if from_logits else activations.get("softmax").forward(np, logits)
    value, grad = loss.value_and_grad(np, y_true, y_pred)
    def mean_loss():
        return float(loss.value_and_grad(np, y_true, y_pred)[0])
    np.testing.assert_allclose(grad, numeric_grad(mean_loss, y_pred), rtol=1e-5, atol=1e-7)
    # Keras' call gives the same mean, from the per-sample losses
    assert float(loss(y_true, y_pred)) == pytest.approx(value, rel=1e-12)
    if name != "mse" and not from_logits:  # softmax + CE fused: p - onehot
        softmax = activations.get("softmax")
        chained = softmax.backward(np, logits, y_pred, grad)
        np.testing.assert_allclose(losses.fused_softmax_grad(np, y_true, y_pred), chained,
                                   rtol=1e-6, atol=1e-9)
        assert value == pytest.approx(-np.log(y_pred[np.arange(6), y_true]).mean())


def test_dropout_scales_and_routes_gradients():
    layer = layers.Dropout(0.25)
    x = np.ones((2000, 10))
    y, mask = layer.forward(np, {}, x, training=True, rng=np.random.default_rng(1))
    assert set(np.unique(y)) == {0.0, 1 / 0.75}
    assert abs((y == 0).mean() - 0.25) < 0.02
    dx, grads = layer.backward(np, {}, mask, np.full_like(x, 2.0))
    np.testing.assert_array_equal(dx, 2.0 * mask)
    assert grads == {}
    same, _ = layer.forward(np, {}, x, training=False)
    assert same is x


def _reference_run(kind, w, grads, **hp):
    """The update rules written out step by step, independently of optimizers.py."""
    w = w.copy()
    v = np.zeros_like(w)
    m = np.zeros_like(w)
    acc = np.full_like(w, hp.get("initial_accumulator_value", 0.1))
    for t, g in enumerate(grads, start=1):
        if kind == "sgd":
            v = hp["momentum"] * v - hp["learning_rate"] * g
            w = w + (hp["momentum"] * v - hp["learning_rate"] * g if hp.get("nesterov")
                     else v)
        elif kind == "adagrad":
            acc = acc + g * g
            w = w - hp["learning_rate"] * g / (np.sqrt(acc) + 1e-7)
        else:
            m = 0.9 * m + 0.1 * g
            v = 0.999 * v + 0.001 * g * g
            lr_t = hp["learning_rate"] * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
            w = w - lr_t * m / (np.sqrt(v) + 1e-7)
    return w


@pytest.mark.parametrize(("kind", "hp"), [
    ("sgd", {"learning_rate": 0.1, "momentum": 0.0}),
    ("sgd", {"learning_rate": 0.1, "momentum": 0.9}),
    ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "nesterov": True}),
    ("adagrad", {"learning_rate": 0.05}),
    ("adam", {"learning_rate": 0.01}),
])
def test_optimizer_update_rules(kind, hp):
    opt = {"sgd": optimizers.SGD, "adagrad": optimizers.Adagrad, "adam": optimizers.Adam}[kind](
        **hp)
    w0 = RNG.standard_normal(5)
    grads = [RNG.standard_normal(5) for _ in range(4)]
    w = w0.copy()
    slots = opt.slots(w)
    for step, g in enumerate(grads, start=1):
        opt.apply(np, w, g, slots, step)
    np.testing.assert_allclose(w, _reference_run(kind, w0, grads, **hp), rtol=1e-12)


@pytest.mark.parametrize(("call", "match"), [
    (lambda: optimizers.SGD(learning_rate=0), "learning_rate=0"),
    (lambda: optimizers.SGD(momentum=1.5), "momentum=1.5"),
    (lambda: optimizers.Adam(beta_1=1), "beta_1=1"),
    (lambda: optimizers.get("adamw"), "optimizer='adamw'"),
    (lambda: layers.Dense(0), "units=0"),
    (lambda: layers.Dense(3, activation="gelu"), "activation='gelu'"),
    (lambda: layers.Dense(3, input_shape=64), "input_shape=64"),
    (lambda: layers.Dropout(1.0), "rate=1.0"),
    (lambda: losses.get("hinge"), "loss='hinge'"),
])
def test_bad_hyperparameters(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("device", ["cpu", "strict"])
def test_a_tiny_mlp_learns(device):
    """Two blobs, Dense(16, relu) -> Dense(2, softmax), Adam: the blocks fit together, on
    host arrays and on the strict device double alike."""
    backend = get_backend(device)
    xp = backend.xp
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(-1, 0.7, (100, 2)), rng.normal(1, 0.7, (100, 2))])
    y = np.repeat([0, 1], 100)
    net = [layers.Dense(16, activation="relu"), layers.Dense(2, activation="softmax")]
    params = [net[0].build((2,), rng), net[1].build((16,), rng)]
    params = [{k: backend.to_device(v) for k, v in p.items()} for p in params]
    opt = optimizers.Adam(learning_rate=0.05)
    slots = [{k: {s: backend.to_device(a) for s, a in opt.slots(to_host(v)).items()}
              for k, v in p.items()} for p in params]
    xd, yd = backend.to_device(x.astype(np.float32)), backend.to_device(y)
    loss_fn = losses.get("sparse_categorical_crossentropy")
    first = None
    for step in range(1, 61):
        h, c0 = net[0].forward(xp, params[0], xd)
        p, c1 = net[1].forward(xp, params[1], h)
        value, _ = loss_fn.value_and_grad(xp, yd, p)
        first = float(value) if first is None else first
        dz = losses.fused_softmax_grad(xp, yd, p)  # through softmax and the loss at once
        dh, g1 = net[1].backward_linear(xp, params[1], c1[0], dz)
        _, g0 = net[0].backward(xp, params[0], c0, dh)
        for layer_params, layer_grads, layer_slots in zip(params, [g0, g1], slots, strict=True):
            for k in layer_params:
                opt.apply(xp, layer_params[k], layer_grads[k], layer_slots[k], step)
    accuracy = float((to_host(p).argmax(axis=1) == y).mean())
    assert float(value) < first / 4 and accuracy > 0.95


def test_first_layer_skips_the_input_gradient_but_not_its_own():
    rng = np.random.default_rng(3)
    layer = layers.Dense(4, activation="relu")
    params = layer.build((3,), rng)
    x = rng.normal(size=(5, 3)).astype(np.float32)
    _, cache = layer.forward(np, params, x, training=True)
    da = rng.normal(size=(5, 4)).astype(np.float32)
    dx, full = layer.backward(np, params, cache, da)
    none, grads = layer.backward(np, params, cache, da, input_grad=False)
    assert dx.shape == x.shape and none is None
    for k in full:
        np.testing.assert_array_equal(full[k], grads[k])
    assert layers.Dropout(0.5).backward(np, {}, None, da, input_grad=False) == (None, {})
