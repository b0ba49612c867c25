"""`fit(..., sample_weight=)` and `class_weight=`, replayed against TensorFlow 2.21 / Keras 3.15
(tf_recorded/record_sample_weights.py): the weights after 3 SGD steps on 1 and 2 replicas,
the logged loss (sum of weighted losses over the samples) and the unweighted accuracy; and
Keras' refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import labdist as ld

RECORDED = json.loads(Path(__file__).with_name("tf_recorded").joinpath(
    "sample_weights.json").read_text())
X = np.asarray(RECORDED["x"], np.float32)
Y = np.asarray(RECORDED["y"], np.int64)


def _model(strategy):
    with strategy.scope():
        model = ld.Sequential([ld.Input((5,)), ld.layers.Dense(4, activation="tanh"),
                               ld.layers.Dense(3)])
        model.set_weights([np.asarray(w, np.float32) for w in RECORDED["initial"]])
        model.compile(optimizer=ld.optimizers.SGD(0.5), metrics=["accuracy"],
                      loss=ld.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@pytest.mark.parametrize("case", ["sample_weight", "class_weight"])
@pytest.mark.parametrize("replicas", [1, 2])
def test_weighted_fit_matches_tensorflow(case, replicas, mirrored2):
    strategy = ld.OneDeviceStrategy("cpu") if replicas == 1 else mirrored2
    kwargs = ({"sample_weight": np.asarray(RECORDED["sample_weight"], np.float32)}
              if case == "sample_weight" else
              {"class_weight": {int(k): v for k, v in RECORDED["class_weight"].items()}})
    recorded = RECORDED["cases"][f"{case}-{replicas}"]
    try:
        model = _model(strategy)
        history = model.fit(X, Y, batch_size=16, epochs=1, shuffle=False, verbose=0, **kwargs)
        for got, want in zip(model.get_weights(), recorded["after"], strict=True):
            np.testing.assert_allclose(got, np.asarray(want), rtol=1e-5, atol=1e-6)
        assert history.history["loss"][0] == pytest.approx(recorded["loss"], rel=1e-5)
        assert history.history["accuracy"][0] == pytest.approx(recorded["accuracy"], abs=1e-6)
    finally:
        if replicas == 1:
            strategy.close()


def test_weights_change_the_step_and_bad_weights_change_nothing(mirrored2):
    model = _model(mirrored2)
    before = model.get_weights()
    for kwargs, error, match in [
        ({"sample_weight": np.ones(47)}, ValueError, r"shape \(47,\).*\(48,\)"),
        ({"sample_weight": np.full(48, np.nan)}, ValueError, "nan or inf"),
        ({"class_weight": {"a": 1.0}}, TypeError, "class_weight="),
        ({"class_weight": {0: 1.0}, "sample_weight": np.ones(48)}, ValueError,
         "at the same time"),
    ]:
        with pytest.raises(error, match=match):
            model.fit(X, Y, batch_size=16, verbose=0, **kwargs)
    for a, b in zip(before, model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    ones = _model(mirrored2)
    ones.fit(X, Y, batch_size=16, shuffle=False, verbose=0, sample_weight=np.ones(48))
    plain = _model(mirrored2)
    plain.fit(X, Y, batch_size=16, shuffle=False, verbose=0)
    for a, b in zip(ones.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)  # weights of 1: the unweighted step
