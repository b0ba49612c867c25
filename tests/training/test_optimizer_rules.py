"""RMSprop and Keras' `weight_decay` against TensorFlow 2.21, recorded by
tf_recorded/record_optimizers.py: the variable after each of five steps, in one process and
in a custom loop on two replicas (each giving half of the gradient: the sum is the recorded
one, and the decay is applied once per step, to the summed step); then `fit`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import labdist as ld

RECORDED = json.loads((Path(__file__).with_name("tf_recorded") / "optimizers.json").read_text())
CASES = RECORDED["cases"]
INITIAL = np.asarray(RECORDED["initial"], np.float32)
GRADIENTS = np.asarray(RECORDED["gradients"], np.float32)


def make(name: str) -> ld.optimizers.Optimizer:
    case = CASES[name]
    return getattr(ld.optimizers, case["class_name"])(**case["config"])


def test_the_recording_is_tensorflows():
    assert RECORDED["tensorflow_version"].startswith("2.21")


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_step_matches_keras(name):
    opt = make(name)
    param = INITIAL.copy()
    slots = opt.slots(param)
    for step, (g, expected) in enumerate(zip(GRADIENTS, CASES[name]["after_each_step"],
                                             strict=True), start=1):
        opt.apply(np, param, g.copy(), slots, step)
        np.testing.assert_allclose(param, expected, rtol=2e-6, atol=1e-6,
                                   err_msg=f"{name}, step {step}")


def half_step(opt, w, g):
    opt.apply_gradients([(ld.get_replica_context().xp.asarray(g / 2), w)])


@pytest.mark.parametrize("name", ["rmsprop_centered_momentum", "sgd_weight_decay",
                                  "adam_weight_decay", "rmsprop_weight_decay"])
def test_two_replicas_sum_the_gradients_and_decay_once(mirrored2, name):
    opt = make(name)
    with mirrored2.scope():
        w = ld.Variable(INITIAL, aggregation="MEAN")
        opt.build([w])
    for g, expected in zip(GRADIENTS, CASES[name]["after_each_step"], strict=True):
        mirrored2.run(half_step, args=(opt, w, g))
        for copy in mirrored2.experimental_local_results(w):
            np.testing.assert_allclose(copy, expected, rtol=2e-6, atol=1e-6)


def test_fit_with_rmsprop_and_weight_decay_matches_one_replica(mirrored2):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(240, 16)).astype(np.float32)
    y = rng.integers(0, 3, len(x))
    weights = []
    for strategy in (ld.OneDeviceStrategy(device="cpu"), mirrored2):
        with strategy.scope():
            model = ld.models.Sequential([ld.layers.Dense(8, activation="tanh",
                                                          input_shape=(16,)),
                                          ld.layers.Dense(3, activation="softmax")])
            model.compile(loss="sparse_categorical_crossentropy",
                          optimizer=ld.optimizers.RMSprop(0.01, momentum=0.5, centered=True,
                                                          weight_decay=0.01))
        model.fit(x, y, batch_size=24, epochs=2, shuffle=False, verbose=0)
        weights.append(model.get_weights())
    for a, b in zip(*weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("make_bad", "match"), [
    (lambda: ld.optimizers.RMSprop(rho=1.5), r"rho=1.5 is not allowed"),
    (lambda: ld.optimizers.RMSprop(centered="yes"), r"centered='yes' is not allowed"),
    (lambda: ld.optimizers.SGD(weight_decay=-0.1), r"weight_decay=-0.1 is not allowed"),
])
def test_bad_settings_name_the_setting(make_bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make_bad()


def test_rmsprop_by_name_saves_and_loads(tmp_path):
    with ld.OneDeviceStrategy(device="cpu").scope():
        model = ld.models.Sequential([ld.layers.Dense(2, input_shape=(3,))])
        model.compile(loss="mse", optimizer=ld.optimizers.RMSprop(0.02, centered=True,
                                                                  weight_decay=0.1))
        model.save(tmp_path / "m")
        again = ld.models.load_model(tmp_path / "m")
    assert again.optimizer.hyperparameters() == model.optimizer.hyperparameters()
    assert isinstance(ld.optimizers.get("rmsprop"), ld.optimizers.RMSprop)
