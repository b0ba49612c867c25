"""`fit` checks its arguments and targets before it touches the model, as Keras does: each
refusal names the argument, the value and what is allowed, and the weights, the step count
and the callbacks are as they were. Most run under the default (in-process) strategy; one runs
on real replicas to show every copy is untouched."""

from __future__ import annotations

import numpy as np
import pytest

import labdist as ld

X = np.random.default_rng(0).normal(size=(24, 4)).astype(np.float32)
Y = np.arange(24) % 2


class Recorder(ld.callbacks.Callback):
    def __init__(self):
        self.calls: list[str] = []

    def on_train_begin(self, logs=None):
        self.calls.append("train_begin")

    def on_epoch_begin(self, epoch, logs=None):
        self.calls.append(f"epoch_begin {epoch}")


def classifier(strategy=None):
    scope = strategy.scope() if strategy is not None else ld.get_strategy().scope()
    with scope:
        model = ld.models.Sequential([ld.layers.Dense(8, activation="relu", input_shape=(4,)),
                                      ld.layers.Dense(2, activation="softmax")], seed=1)
        model.compile(loss="sparse_categorical_crossentropy", optimizer="adam",
                      metrics=["accuracy"])
    return model


def snapshot(model, strategy=None):
    if strategy is None:
        return [w.copy() for w in model.get_weights()]
    return [np.stack(strategy.experimental_local_results(v)) for v in model.weights]


BAD_FIT = [
    ({"y": np.full(24, 7)}, ValueError, ["y holds the class id 7", "2 output(s)",
                                         "allowed: class ids 0..1"]),
    ({"y": np.full(24, -1)}, ValueError, ["y holds the class id -1", "allowed: class ids 0..1"]),
    ({"y": Y + 0.5}, ValueError, ["y holds 0.5, not a class id", "whole numbers in 0..1"]),
    ({"y": Y.astype(str)}, TypeError, ["y has dtype <U21", "allowed: numbers"]),
    ({"validation_data": (X,)}, TypeError, ["validation_data=a tuple of 1 item(s)",
                                            "use (x_val, y_val) or None"]),
    ({"validation_data": "garbage"}, TypeError, ["validation_data='garbage' is not allowed",
                                                 "use (x_val, y_val)"]),
    ({"validation_data": (X, Y[:3])}, ValueError, ["validation_data:", "same length",
                                                   "x (24, 4) and y (3,)"]),
    ({"validation_data": (X, np.full(24, 9))}, ValueError, ["validation_data: y holds the "
                                                            "class id 9"]),
    ({"validation_data": (X[:, :3], Y)}, ValueError, ["validation_data: x has 3 features"]),
    ({"initial_epoch": -3}, ValueError, ["initial_epoch=-3 is not allowed; use an integer >= 0"]),
    ({"epochs": 2.5}, ValueError, ["epochs=2.5 is not allowed; use an integer >= 1"]),
    ({"callbacks": [object()]}, TypeError, ["callbacks[0]=<object object", "is not allowed",
                                            "ld.callbacks.Callback"]),
    ({"callbacks": "ModelCheckpoint"}, TypeError, ["callbacks='ModelCheckpoint' is not allowed",
                                                   "a list of ld.callbacks.Callback"]),
    ({"shuffle": "sometimes"}, TypeError, ["shuffle='sometimes' is not allowed; use True or "
                                           "False"]),
    ({"shuffle": "batch"}, TypeError, ["shuffle='batch' is not allowed"]),
    ({"x": X[:, :3]}, ValueError, ["x has 3 features per sample, but the model's first layer "
                                   "takes 4", "allowed: x of shape (samples, 4)"]),
    ({"x": np.zeros((0, 4)), "y": np.zeros(0, int)}, ValueError, ["0 samples",
                                                                  "allowed: at least 1"]),
]


@pytest.mark.parametrize(("change", "error", "needles"), BAD_FIT)
def test_fit_refuses_before_it_changes_anything(change, error, needles):
    model = classifier()
    model.fit(X, Y, epochs=1, verbose=0)  # built, with optimizer state: a model in use
    before, steps = snapshot(model), model._iterations
    recorder = Recorder()
    args = {"x": X, "y": Y, "epochs": 2, "verbose": 0,
            "callbacks": [recorder] if "callbacks" not in change else None, **change}
    with pytest.raises(error) as info:
        model.fit(args.pop("x"), args.pop("y"), **args)
    text = str(info.value)
    for needle in needles:
        assert needle in text, (needle, text)
    for a, b in zip(before, snapshot(model), strict=True):
        np.testing.assert_array_equal(a, b)
    assert model._iterations == steps
    assert recorder.calls == []  # not even on_train_begin: nothing started
    model.fit(X, Y, epochs=1, verbose=0)  # still usable


def test_a_bad_label_leaves_every_replica_untouched(mirrored2):
    """Before: label 7 for 2 classes raised IndexError after batches had been applied."""
    model = classifier(mirrored2)
    before = snapshot(model, mirrored2)
    y = Y.copy()
    y[-1] = 7  # found only in the last batch, were it not checked first
    with pytest.raises(ValueError, match=r"y holds the class id 7"):
        model.fit(X, y, batch_size=4, epochs=1, verbose=0)
    for a, b in zip(before, snapshot(model, mirrored2), strict=True):
        np.testing.assert_array_equal(a, b)
    assert model._iterations == 0


def test_evaluate_and_predict_name_a_feature_mismatch():
    model = classifier()
    with pytest.raises(ValueError, match=r"evaluate: x has 5 features per sample, but the "
                                         r"model's first layer takes 4"):
        model.evaluate(np.zeros((3, 5)), np.zeros(3, int), verbose=0)
    with pytest.raises(ValueError, match=r"predict: x has 5 features per sample, but the "
                                         r"model's first layer takes 4; allowed: x of shape "
                                         r"\(samples, 4\)"):
        model.predict(np.zeros((3, 5)), verbose=0)


def test_mse_targets_must_match_the_outputs():
    with ld.get_strategy().scope():
        model = ld.models.Sequential([ld.layers.Dense(3, input_shape=(4,))])
        model.compile(loss="mse", optimizer="sgd")
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"y has shape \(24, 2\), but the model has 3 "
                                         r"output\(s\); allowed for loss='mse': y of shape "
                                         r"\(samples, 3\)"):
        model.fit(X, np.zeros((24, 2)), verbose=0)
    for a, b in zip(before, snapshot(model), strict=True):
        np.testing.assert_array_equal(a, b)


class FailAtEpoch(ld.callbacks.Callback):
    def __init__(self, epoch: int):
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise RuntimeError(f"stop at epoch {epoch}")


def test_a_fault_mid_fit_says_how_far_it_got():
    """What cannot be checked first (here a callback failing in epoch 2) ends with a note
    saying how many optimizer steps of this call the weights hold."""
    model = classifier()
    with pytest.raises(RuntimeError, match="stop at epoch 2") as info:
        model.fit(X, Y, batch_size=8, epochs=4, verbose=0, callbacks=[FailAtEpoch(2)])
    notes = getattr(info.value, "__notes__", [])
    assert notes == ["model.fit: 6 optimizer step(s) of this call (epochs 0..3) completed "
                     "before this error; the weights hold their updates"], notes
    assert model._iterations == 6


def test_compile_takes_one_metric_name_as_tf_keras_does():
    model = classifier()
    model.compile(loss="sparse_categorical_crossentropy", optimizer="sgd", metrics="accuracy")
    history = model.fit(X, Y, epochs=1, verbose=0)
    assert set(history.history) == {"loss", "accuracy"}


def test_a_refused_compile_leaves_the_previous_settings():
    model = classifier()
    loss, optimizer = model._loss, model.optimizer
    with pytest.raises(ValueError, match=r"metrics=\['auc'\]: \['auc'\] not supported; "
                                         r"allowed: accuracy, acc, binary_accuracy"):
        model.compile(loss="mse", optimizer="sgd", metrics=["auc"])
    with pytest.raises(ValueError, match=r"steps_per_execution=0 is not allowed; use an "
                                         r"integer >= 1"):
        model.compile(loss="mse", optimizer="sgd", steps_per_execution=0)
    assert model._loss is loss and model.optimizer is optimizer
