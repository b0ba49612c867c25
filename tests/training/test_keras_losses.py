"""Keras' losses and metrics, for any output shape: each loss's value against a numpy reference
written from Keras' documented formulas (clip to [1e-7, 1 - 1e-7], per-sample mean over the last
axis or sum over classes, mean over the batch), its gradient against finite differences, for
1-D and 2-D targets; the metrics likewise, and "accuracy" resolved from the shapes as Keras
does. Then `fit` / `evaluate` on 1, 2 and 3 replicas (real worker processes): a Dense(3)
regression with mse trains, only the compiled metrics appear, and evaluate's figures equal the
references computed from `predict`."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_strategy
from gradients import numeric_grad

import labdist as ld
from labdist.training import losses, metrics

EPS = 1e-7
rng = np.random.default_rng(0)


# -- numpy references (Keras' formulas) --------------------------------------------------------
def ref_loss(name, y, p, from_logits=False):
    y = y.reshape(p.shape) if name != "sparse_categorical_crossentropy" else y
    if name == "mse":
        return np.mean(np.mean((y - p) ** 2, axis=-1))
    if name == "mae":
        return np.mean(np.mean(np.abs(y - p), axis=-1))
    if name == "binary_crossentropy":
        if from_logits:
            p = 1 / (1 + np.exp(-p))
        q = np.clip(p, EPS, 1 - EPS)
        return np.mean(np.mean(-(y * np.log(q) + (1 - y) * np.log(1 - q)), axis=-1))
    if from_logits:
        e = np.exp(p - p.max(-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)
    if name == "categorical_crossentropy":
        q = np.clip(p / p.sum(-1, keepdims=True), EPS, 1 - EPS)
        return np.mean(-np.sum(y * np.log(q), axis=-1))
    q = np.clip(p, EPS, 1 - EPS)  # sparse
    return np.mean(-np.log(q[np.arange(len(q)), y.reshape(-1).astype(int)]))


def ref_metric(kind, y, p):
    if kind == "sparse_categorical_accuracy":
        return np.mean(p.argmax(-1) == y.reshape(-1))
    y = y.reshape(p.shape)
    if kind == "categorical_accuracy":
        return np.mean(p.argmax(-1) == y.argmax(-1))
    if kind == "binary_accuracy":
        return np.mean(np.mean(y == (p > 0.5), axis=-1))
    if kind == "mse":
        return np.mean(np.mean((y - p) ** 2, axis=-1))
    return np.mean(np.mean(np.abs(y - p), axis=-1))


def probabilities(n, k):
    e = np.exp(rng.normal(size=(n, k)))
    return e / e.sum(-1, keepdims=True)


# (loss, y, y_pred): 1-D and 2-D targets for each
CASES = {
    "mse 1-D": ("mse", rng.normal(size=8), rng.normal(size=(8, 1))),
    "mse 2-D": ("mse", rng.normal(size=(8, 3)), rng.normal(size=(8, 3))),
    "mae 1-D": ("mae", rng.normal(size=8), rng.normal(size=(8, 1))),
    "mae 2-D": ("mae", rng.normal(size=(8, 3)), rng.normal(size=(8, 3))),
    "bce 1-D": ("binary_crossentropy", rng.integers(0, 2, 8).astype(float),
                rng.uniform(0.05, 0.95, (8, 1))),
    "bce 2-D multi-label": ("binary_crossentropy", rng.integers(0, 2, (8, 4)).astype(float),
                            rng.uniform(0.05, 0.95, (8, 4))),
    "cce one-hot": ("categorical_crossentropy", np.eye(3)[rng.integers(0, 3, 8)],
                    probabilities(8, 3)),
    "cce soft labels": ("categorical_crossentropy", probabilities(8, 4),
                        rng.uniform(0.1, 1.0, (8, 4))),  # not normalised: Keras scales it
    "scce 1-D": ("sparse_categorical_crossentropy", rng.integers(0, 3, 8), probabilities(8, 3)),
    "scce 2-D (n, 1)": ("sparse_categorical_crossentropy", rng.integers(0, 3, (8, 1)),
                        probabilities(8, 3)),
}


@pytest.mark.parametrize("case, from_logits", [
    (case, logits) for case in CASES for logits in (False, True)
    if not (logits and CASES[case][0] in ("mse", "mae"))])  # no from_logits form (Keras neither)
def test_loss_value_and_gradient_match_keras(case, from_logits):
    name, y, p = CASES[case]
    if from_logits:
        p = rng.normal(size=p.shape)
    loss = losses.get(name, from_logits)
    value, grad = loss.value_and_grad(np, y, p)
    assert grad.shape == p.shape
    np.testing.assert_allclose(value, ref_loss(name, y, p, from_logits), rtol=1e-10)
    np.testing.assert_allclose(grad, numeric_grad(lambda q: ref_loss(name, y, q, from_logits), p),
                               rtol=1e-4, atol=1e-8)
    # Keras' call on the same loss: its reductions of the per-sample losses
    per = loss._replace(reduction="none")(y, p)
    assert per.shape == (len(p),)
    np.testing.assert_allclose(float(loss(y, p)), value, rtol=1e-10)
    np.testing.assert_allclose(float(loss._replace(reduction="sum")(y, p)), value * len(p),
                               rtol=1e-10)
    weights = rng.uniform(size=len(p))
    np.testing.assert_allclose(float(loss(y, p, sample_weight=weights)),
                               float((per * weights).sum()) / len(p), rtol=1e-10)


KERAS_CLASSES = {"SparseCategoricalCrossentropy": "sparse_categorical_crossentropy",
                 "CategoricalCrossentropy": "categorical_crossentropy",
                 "BinaryCrossentropy": "binary_crossentropy",
                 "MeanSquaredError": "mse", "MeanAbsoluteError": "mae"}


@pytest.mark.parametrize("cls", sorted(KERAS_CLASSES))
def test_keras_loss_classes_make_the_named_loss(cls):
    kwargs = {} if KERAS_CLASSES[cls] in ("mse", "mae") else {"from_logits": True}
    loss = getattr(ld.losses, cls)(**kwargs, reduction=None)
    assert loss.name == KERAS_CLASSES[cls] and loss.reduction == "none"
    assert loss.from_logits == bool(kwargs)
    with pytest.raises(ValueError, match=r"reduction='mean' is not allowed; use "
                                         r"'sum_over_batch_size', 'sum', 'none' or None"):
        getattr(ld.losses, cls)(reduction="mean")


def test_a_loss_object_compiles_and_trains_as_its_name(mirrored2):
    """`compile(loss=ld.losses.SparseCategoricalCrossentropy(from_logits=True))` on a linear
    output trains as the string with from_logits does (the seed's Keras program)."""
    (x, y), _ = ld.datasets.digits.load_data()
    weights = []
    for loss in (ld.losses.SparseCategoricalCrossentropy(from_logits=True),
                 losses.get("sparse_categorical_crossentropy", from_logits=True)):
        with mirrored2.scope():
            model = ld.models.Sequential([ld.layers.Dense(10, input_shape=(64,))])
            model.compile(loss=loss, optimizer=ld.optimizers.SGD(0.1))
        model.fit(x[:256], y[:256], batch_size=64, shuffle=False, verbose=0)
        weights.append(model.get_weights())
    for a, b in zip(*weights, strict=True):
        np.testing.assert_array_equal(a, b)


def test_losses_refuse_what_they_cannot_take():
    with pytest.raises(ValueError, match="loss='hinge' is not supported; allowed: mse"):
        losses.get("hinge")
    with pytest.raises(ValueError, match=r"targets of shape \(8, 2\) do not match the model's "
                                         r"output of shape \(8, 3\)"):
        losses.get("mse").value_and_grad(np, np.zeros((8, 2)), np.zeros((8, 3)))
    with pytest.raises(ValueError, match="one integer label per sample"):
        losses.get("sparse_categorical_crossentropy").value_and_grad(np, np.zeros((8, 3)),
                                                                     np.zeros((8, 3)))


METRIC_CASES = [  # (kind, y, y_pred)
    ("binary_accuracy", rng.integers(0, 2, 10).astype(float), rng.uniform(size=(10, 1))),
    ("binary_accuracy", rng.integers(0, 2, (10, 3)).astype(float), rng.uniform(size=(10, 3))),
    ("categorical_accuracy", np.eye(4)[rng.integers(0, 4, 10)], probabilities(10, 4)),
    ("sparse_categorical_accuracy", rng.integers(0, 4, 10), probabilities(10, 4)),
    ("sparse_categorical_accuracy", rng.integers(0, 4, (10, 1)), probabilities(10, 4)),
    ("mse", rng.normal(size=(10, 3)), rng.normal(size=(10, 3))),
    ("mae", rng.normal(size=10), rng.normal(size=(10, 1))),
]


@pytest.mark.parametrize("kind, y, p", METRIC_CASES)
def test_metrics_match_keras(kind, y, p):
    total = metrics.Formula(kind, kind)(np, y, p)  # a sum over the samples
    np.testing.assert_allclose(float(total) / len(p), ref_metric(kind, y, p), rtol=1e-12)


def test_accuracy_resolves_from_the_shapes_as_keras():
    def kind(y_shape, width):
        return metrics.resolve(["accuracy"], y_shape, width)[0].kind

    assert kind((10,), 1) == "binary_accuracy"
    assert kind((10, 1), 1) == "binary_accuracy"
    assert kind((10,), 3) == "sparse_categorical_accuracy"
    assert kind((10, 1), 3) == "sparse_categorical_accuracy"
    assert kind((10, 3), 3) == "categorical_accuracy"
    assert metrics.resolve(["acc"], (10,), 3)[0] == ("acc", "sparse_categorical_accuracy")
    with pytest.raises(ValueError, match=r"\['auc'\] not supported"):
        metrics.check(["auc"])


# -- fit and evaluate on replicas ----------------------------------------------------------------
@pytest.fixture(params=[1, 2, 3])
def mirrored(request) -> ld.Strategy:
    return make_strategy(f"mirrored-{request.param}")


def build(strategy, units, activation, loss, metric_names, inputs=4):
    with strategy.scope():
        model = ld.models.Sequential([
            ld.layers.Dense(8, activation="relu", input_shape=(inputs,)),
            ld.layers.Dense(units, activation=activation)], seed=1)
        model.compile(loss=loss, optimizer=ld.optimizers.SGD(0.05), metrics=metric_names)
    return model


@pytest.mark.timeout(180)
def test_a_regression_with_three_outputs_trains_with_mse(mirrored):
    x = rng.normal(size=(256, 4)).astype(np.float32)
    y = (x @ rng.normal(size=(4, 3))).astype(np.float32)  # shape (256, 3)
    model = build(mirrored, 3, None, "mse", [])
    history = model.fit(x, y, batch_size=32, epochs=4, verbose=0)
    assert list(history.history) == ["loss"]  # nothing compiled, nothing computed
    assert history.history["loss"][-1] < 0.7 * history.history["loss"][0]
    with_metrics = build(mirrored, 3, None, "mse", ["mae", "mse"])
    logs = with_metrics.fit(x, y, batch_size=32, epochs=1, verbose=0).history
    assert list(logs) == ["loss", "mae", "mse"]
    result = with_metrics.evaluate(x, y, batch_size=64, verbose=0, return_dict=True)
    predicted = with_metrics.predict(x, verbose=0)
    np.testing.assert_allclose(result["loss"], ref_loss("mse", y, predicted), rtol=1e-5)
    np.testing.assert_allclose(result["mae"], ref_metric("mae", y, predicted), rtol=1e-5)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("task", ["binary", "categorical", "sparse"])
def test_classifiers_report_kerass_loss_and_accuracy(mirrored, task):
    x = rng.normal(size=(120, 4)).astype(np.float32)
    label = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1)
    if task == "binary":
        y, units, act, loss, kind = (label > 0).astype(np.float32), 1, "sigmoid", \
            "binary_crossentropy", "binary_accuracy"
    elif task == "categorical":
        y, units, act, loss, kind = np.eye(3, dtype=np.float32)[label], 3, "softmax", \
            "categorical_crossentropy", "categorical_accuracy"
    else:
        y, units, act, loss, kind = label, 3, "softmax", "sparse_categorical_crossentropy", \
            "sparse_categorical_accuracy"
    model = build(mirrored, units, act, loss, ["accuracy", kind])
    history = model.fit(x, y, batch_size=24, epochs=3, verbose=0).history
    assert list(history) == ["loss", "accuracy", kind]
    assert history["accuracy"] == history[kind]  # "accuracy" resolved to this one
    assert history["loss"][-1] < history["loss"][0]
    result = model.evaluate(x, y, batch_size=50, verbose=0, return_dict=True)
    predicted = model.predict(x, verbose=0)
    np.testing.assert_allclose(result["loss"], ref_loss(loss, y, predicted), rtol=1e-5)
    np.testing.assert_allclose(result["accuracy"], ref_metric(kind, y, predicted), rtol=1e-6)


@pytest.mark.timeout(180)
def test_fit_is_the_same_on_any_replica_count():
    """The global-batch mean: one, two and three replicas train to the same weights."""
    x = rng.normal(size=(96, 4)).astype(np.float32)
    y = rng.normal(size=(96, 2)).astype(np.float32)
    runs = []
    for n in (1, 2, 3):
        model = build(make_strategy(f"mirrored-{n}"), 2, None, "mae", ["mse"])
        history = model.fit(x, y, batch_size=24, epochs=2, verbose=0, shuffle=False).history
        runs.append((history, model.predict(x, verbose=0)))
    for history, predicted in runs[1:]:
        np.testing.assert_allclose(history["loss"], runs[0][0]["loss"], rtol=1e-5)
        np.testing.assert_allclose(history["mse"], runs[0][0]["mse"], rtol=1e-5)
        np.testing.assert_allclose(predicted, runs[0][1], rtol=1e-4, atol=1e-6)
