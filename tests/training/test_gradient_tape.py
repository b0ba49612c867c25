"""`ld.GradientTape`: the recorded arithmetic against finite differences, a model's call on a
tape against `fit` (the same step, the same weights after it), Keras 3's lazy builds from
inside `strategy.run` (the model at its first call, the optimizer at its first
`apply_gradients`), and TensorFlow's errors."""

from __future__ import annotations

import numpy as np
import pytest
from gradients import numeric_grad

import labdist as ld

EXPRESSIONS = {
    "affine-mse": lambda w, b, x: (((x @ w + b) - 1.0) ** 2).mean(),
    "exp-log-tanh": lambda w, b, x: np.exp(w * 0.5).sum() + np.log(w * w + 1).sum()
    + np.tanh(b).sum(),
    "divide-sqrt": lambda w, b, x: (np.sqrt(w * w + 2) / (ld.reduce_sum(b) + 3)).sum(),
    "relu-max-min": lambda w, b, x: np.maximum(x @ w, b).sum() - np.minimum(w, 0.1).sum(),
    "broadcast-index": lambda w, b, x: ((x * w[:, 0]) + b[None, :1]).sum(axis=0)[1]
    + w[1:, :].mean(),
    "transpose-reshape-abs": lambda w, b, x: (abs((w * 1.0).T.reshape(-1)) * 2.0).sum()
    - ld.reduce_mean(b),
    "nn-softmax-sigmoid": lambda w, b, x: (ld.nn.softmax(x @ w) * ld.nn.sigmoid(b)).sum(),
}


@pytest.mark.parametrize("name", list(EXPRESSIONS))
def test_recorded_arithmetic_matches_finite_differences(name):
    """Every recorded rule (broadcasting summed back, indexing scattered back) against
    central differences in float64, on ordinary (default-strategy) variables."""
    f = EXPRESSIONS[name]
    rng = np.random.default_rng(0)
    w0 = rng.uniform(0.2, 1.0, (3, 2))
    b0 = rng.uniform(0.2, 1.0, 2)
    x = rng.normal(size=(4, 3))
    w, b = ld.Variable(w0), ld.Variable(b0)
    with ld.GradientTape() as tape:
        value = f(w, b, x)
    gw, gb = tape.gradient(value, [w, b])
    np.testing.assert_allclose(gw, numeric_grad(lambda a: float(f(a, b0, x)), w0),
                               rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(gb, numeric_grad(lambda a: float(f(w0, a, x)), b0),
                               rtol=1e-5, atol=1e-7)


def test_tensorflow_tape_rules():
    """TF's rules: one gradient call unless persistent; an unconnected source gives None (or
    zeros); non-trainable variables are not watched unless asked; nothing is recorded in
    stop_recording; a tape watches variables, not plain arrays."""
    w = ld.Variable(np.ones(2, np.float32))
    frozen = ld.Variable(np.full(2, 3.0, np.float32), trainable=False)
    other = ld.Variable(np.zeros(2, np.float32))
    with ld.GradientTape() as tape:
        y = (w * frozen).sum()
    assert tape.gradient(y, [w, frozen, other]) == [pytest.approx([3, 3]), None, None]
    with pytest.raises(RuntimeError, match="non-persistent GradientTape"):
        tape.gradient(y, w)

    with ld.GradientTape(persistent=True) as tape:
        tape.watch(frozen)
        y = (w * frozen).sum()
        with tape.stop_recording():
            z = (w * w).sum()
    np.testing.assert_allclose(tape.gradient(y, frozen), [1, 1])
    np.testing.assert_allclose(tape.gradient(y, {"w": w})["w"], [3, 3])
    np.testing.assert_allclose(tape.gradient(y, other, unconnected_gradients="zero"), [0, 0])
    assert tape.gradient(z, w) is None  # computed while not recording

    with ld.GradientTape(watch_accessed_variables=False) as tape:
        y = (w * 2).sum()
    assert tape.gradient(y, w) is None
    with ld.GradientTape() as tape, pytest.raises(TypeError, match="watches ld.Variables"):
        tape.watch(np.ones(2))
    with ld.GradientTape() as tape, pytest.raises(TypeError, match="cannot differentiate"):
        np.arctan(w.read_value())


def test_losses_and_nn_on_a_tape_without_a_strategy():
    """Keras' loss call (reduction none, sample weights) and ld.nn's averaging record on the
    tape: the gradient of compute_average_loss is the mean loss's, as finite differences say."""
    rng = np.random.default_rng(3)
    logits0 = rng.normal(size=(5, 4))
    labels = rng.integers(0, 4, 5)
    weights = rng.uniform(0.5, 2, 5)
    loss = ld.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def f(a):
        return float(ld.nn.compute_average_loss(loss(labels, a), sample_weight=weights))

    z = ld.Variable(logits0)
    with ld.GradientTape() as tape:
        value = ld.nn.compute_average_loss(loss(labels, z.read_value()), sample_weight=weights)
    assert float(value) == pytest.approx(f(logits0))
    np.testing.assert_allclose(tape.gradient(value, z), numeric_grad(f, logits0),
                               rtol=1e-5, atol=1e-8)


def _model(seed: int = 7):
    return ld.Sequential([
        ld.layers.Conv2D(3, 3, activation="relu", input_shape=(6, 6, 1),
                         kernel_regularizer=ld.regularizers.L2(1e-2)),
        ld.layers.Flatten(),
        ld.layers.Dense(8, activation="relu", kernel_regularizer=ld.regularizers.L2(1e-2)),
        ld.layers.Dense(3),
    ], seed=seed)


def _data(n: int = 64):
    rng = np.random.default_rng(5)
    return (rng.normal(size=(n, 6, 6, 1)).astype(np.float32),
            rng.integers(0, 3, n).astype(np.int64))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_tape_step_equals_fit_on_two_replicas(mirrored2, optimizer):
    """Three steps of TensorFlow's custom-training step (model call on the tape, per-example
    loss, compute_average_loss, scaled penalties, apply_gradients) give the weights `fit`
    gives on the same batches, penalties included: the tape runs fit's backward pass, and
    Adam's slots are built lazily inside the step (Keras 3) by the driver."""
    x, y = _data(96)
    make = {"sgd": lambda: ld.optimizers.SGD(0.1), "adam": lambda: ld.optimizers.Adam(0.01)}
    with mirrored2.scope():
        fitted = _model()
        fitted.compile(loss=ld.losses.SparseCategoricalCrossentropy(from_logits=True),
                       optimizer=make[optimizer]())
        taped = _model()
        loss_object = ld.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
        opt = make[optimizer]()
    fitted.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)

    def step(inputs):
        images, labels = inputs
        with ld.GradientTape() as tape:
            logits = taped(images, training=True)
            loss = ld.nn.compute_average_loss(loss_object(labels, logits))
            loss += ld.nn.scale_regularization_loss(ld.add_n(taped.losses))
        grads = tape.gradient(loss, taped.trainable_variables)
        opt.apply_gradients(zip(grads, taped.trainable_variables, strict=True))
        return loss

    dataset = ld.data.Dataset.from_tensor_slices((x, y)).batch(32)
    for batch in mirrored2.experimental_distribute_dataset(dataset):
        mirrored2.run(step, args=(batch,))
    for a, b in zip(fitted.get_weights(), taped.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    assert int(opt.iterations.numpy()) == 3  # built on the driver from inside the step
    if optimizer == "adam":
        assert len(opt.slot_variables) == len(taped.trainable_variables)


def test_a_model_first_called_inside_run_is_built_by_the_driver(mirrored2):
    """Keras 3 builds a model without input_shape at its first call, inside the step: the
    driver makes the weights (one merge_call), and the user's model holds them after."""
    with mirrored2.scope():
        model = ld.Sequential([ld.layers.Dense(4, activation="relu"), ld.layers.Dense(2)])
    assert not model.built

    def forward(x):
        return model(x)

    x = np.ones((4, 5), np.float32)
    out = mirrored2.experimental_local_results(mirrored2.run(forward, args=(x,)))
    assert model.built and model.input_shape == (None, 5)
    assert [v.shape for v in model.trainable_variables] == [(5, 4), (4,), (4, 2), (2,)]
    np.testing.assert_allclose(out[0], model(x), rtol=1e-6)  # the driver's call agrees
    np.testing.assert_allclose(out[0], out[1])


def test_model_call_refusals(mirrored2):
    with mirrored2.scope():
        model = ld.Sequential([ld.layers.Dense(3, input_shape=(4,)),
                               ld.layers.BatchNormalization()])
    with pytest.raises(ValueError, match=r"samples of shape \(4,\)"):
        model(np.ones((2, 5), np.float32))
    with pytest.raises(ValueError, match="inside strategy.run"):
        model(np.ones((2, 4), np.float32), training=True)  # batch norm, on the driver
    with pytest.raises(TypeError, match="training="):
        model(np.ones((2, 4), np.float32), training="yes")
    with mirrored2.scope(), pytest.raises(RuntimeError, match="cross replica context"):
        ld.nn.compute_average_loss(np.ones(4, np.float32))
