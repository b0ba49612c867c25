"""Keras has one step counter, `optimizer.iterations`: a custom loop's `apply_gradients`
steps and `fit`'s steps add to it, and Adam's bias correction reads it. Replayed against
TensorFlow 2.21 / Keras 3.15 (tf_recorded/record_one_counter.py): a custom loop, then `fit`,
then the loop again, on the same compiled model and optimizer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import labdist as ld

RECORDED = json.loads(Path(__file__).with_name("tf_recorded").joinpath(
    "one_counter.json").read_text())
X = np.asarray(RECORDED["x"], np.float32)
Y = np.asarray(RECORDED["y"], np.float32)


@pytest.mark.parametrize("replicas", [1, 2])
def test_loop_fit_loop_share_one_counter(replicas, mirrored2):
    strategy = ld.OneDeviceStrategy("cpu") if replicas == 1 else mirrored2
    with strategy.scope():
        model = ld.Sequential([ld.Input((3,)), ld.layers.Dense(2)])
        model.set_weights([np.asarray(w, np.float32) for w in RECORDED["initial"]])
        optimizer = ld.optimizers.Adam(0.1)
        model.compile(optimizer=optimizer, loss="mse")
    loss_fn = ld.losses.MeanSquaredError(reduction="sum")

    def step(x, y):
        with ld.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True)) / 4  # the global batch's mean
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    def loop(steps: int) -> None:
        for i in range(steps):
            dist = strategy.experimental_distribute_values_from_function(
                lambda ctx, i=i: tuple(a[4 * i:4 * i + 4][ctx.replica_id_in_sync_group::
                                                          ctx.num_replicas_in_sync]
                                       for a in (X, Y)))
            strategy.run(step, args=dist) if replicas > 1 else \
                strategy.run(step, args=(X[4 * i:4 * i + 4], Y[4 * i:4 * i + 4]))

    phases = {p["phase"]: p for p in RECORDED["phases"]}
    loop(3)
    _check(model, optimizer, phases["loop"])
    model.fit(X, Y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    _check(model, optimizer, phases["fit"])
    loop(2)
    _check(model, optimizer, phases["loop again"])


def _check(model, optimizer, recorded: dict) -> None:
    assert int(optimizer.iterations.numpy()) == recorded["iterations"]
    for got, want in zip(model.get_weights(), recorded["after"], strict=True):
        np.testing.assert_allclose(got, np.asarray(want, np.float32), rtol=1e-4, atol=1e-5)
