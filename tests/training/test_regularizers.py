"""Keras' weight penalties under `fit`, replayed against TensorFlow 2.21 / Keras 3.15
(tf_recorded/record_regularizers.py): the same weights after 3 SGD steps on 1 and 2 replicas
(the penalty's gradient counted once per step, not once per replica) and the logged loss,
which includes the penalties; and their configs through save / load."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import labdist as ld

RECORDED = json.loads(Path(__file__).with_name("tf_recorded").joinpath(
    "regularizers.json").read_text())


def _model():
    return ld.Sequential([
        ld.Input((5,)),
        ld.layers.Dense(4, activation="tanh", kernel_regularizer=ld.regularizers.L2(0.05),
                        bias_regularizer=ld.regularizers.L1L2(l1=0.02, l2=0.01)),
        ld.layers.Dense(3, kernel_regularizer=ld.regularizers.L1(0.03)),
    ])


@pytest.mark.parametrize("replicas", [1, 2])
def test_fit_with_penalties_matches_tensorflow(replicas, mirrored2):
    strategy = ld.OneDeviceStrategy("cpu") if replicas == 1 else mirrored2
    x = np.asarray(RECORDED["x"], np.float32)
    y = np.asarray(RECORDED["y"], np.int64)
    recorded = RECORDED["replicas"][str(replicas)]
    try:
        with strategy.scope():
            model = _model()
            model.set_weights([np.asarray(w, np.float32) for w in RECORDED["initial"]])
            model.compile(optimizer=ld.optimizers.SGD(0.5),
                          loss=ld.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
        for got, want in zip(model.get_weights(), recorded["after"], strict=True):
            np.testing.assert_allclose(got, np.asarray(want), rtol=1e-5, atol=1e-6)
        assert history.history["loss"][0] == pytest.approx(recorded["loss"], rel=1e-5)
    finally:
        if replicas == 1:
            strategy.close()


def test_penalties_survive_save_and_load_and_bad_ones_are_refused(tmp_path):
    model = _model()
    before = [layer.get_config() for layer in model.layers]
    loaded = ld.models.load_model(model.save(tmp_path / "m"), compile=False)
    assert [layer.get_config() for layer in loaded.layers] == before
    assert repr(loaded.layers[0].regularizers()["kernel"]) == "Regularizer(l1=0, l2=0.05)"
    with pytest.raises(ValueError, match="kernel_regularizer='l3'"):
        ld.layers.Dense(2, kernel_regularizer="l3")
    with pytest.raises(ValueError, match="l2=-1"):
        ld.regularizers.L2(-1)
    assert ld.layers.Dense(2, kernel_regularizer="l2").kernel_regularizer.l2 == 0.01
