"""`fit(..., steps_per_epoch=)`, replayed against TensorFlow 2.21 / Keras 3.15
(tf_recorded/record_steps_per_epoch.py): an epoch takes that many batches and the next carries
on where it stopped; an epoch that reaches the pass's end stops there and the next starts a new
pass; a dataset that repeats forever is read in order, epoch after epoch. The weights after
`fit` (which batches, in which order) and the logged losses, on 1 and 2 replicas, through the
driver's loop and the replicas' own (a batch hook keeps the driver in the loop)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from clusters import local_client

import labdist as ld

RECORDED = json.loads(Path(__file__).with_name("tf_recorded").joinpath(
    "steps_per_epoch.json").read_text())
X = np.asarray(RECORDED["x"], np.float32)
Y = np.asarray(RECORDED["y"], np.float32)
CASES = {"arrays-3": ("arrays", 4, 3, 3), "arrays-8": ("arrays", 4, 2, 8),
         "repeat-2": ("repeat", 4, 3, 2), "finite-2": ("finite", 4, 3, 2)}


class BatchHook(ld.callbacks.Callback):
    """A callback with a batch hook: `fit` hands back to the driver after every group, and
    the hook sees each batch's number within its epoch."""

    def __init__(self):
        super().__init__()
        self.numbers: list[list[int]] = []

    def on_epoch_begin(self, epoch, logs=None):
        self.numbers.append([])

    def on_train_batch_end(self, batch, logs=None):
        self.numbers[-1].append(batch)


def _model(strategy):
    with strategy.scope():
        model = ld.Sequential([ld.Input((3,)), ld.layers.Dense(2)])
        model.set_weights([np.asarray(w, np.float32) for w in RECORDED["initial"]])
        model.compile(optimizer=ld.optimizers.SGD(0.01), loss="mse")
    return model


def _fit(model, case: str, **kwargs):
    data, batch, epochs, steps = CASES[case]
    if data == "arrays":
        return model.fit(X, Y, batch_size=batch, shuffle=False, epochs=epochs,
                         steps_per_epoch=steps, verbose=0, **kwargs)
    ds = ld.data.Dataset.from_tensor_slices((X, Y))
    ds = ds.repeat().batch(batch) if data == "repeat" else ds.batch(batch)
    return model.fit(ds, epochs=epochs, steps_per_epoch=steps, verbose=0, **kwargs)


@pytest.mark.parametrize("hook", [False, True], ids=["free", "batch-hook"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("replicas", [1, 2])
def test_steps_per_epoch_matches_tensorflow(case, replicas, hook, mirrored2):
    strategy = ld.OneDeviceStrategy("cpu") if replicas == 1 else mirrored2
    recorded = RECORDED["cases"][f"{case}-{replicas}"]
    model = _model(strategy)
    callback = BatchHook()
    history = _fit(model, case, callbacks=[callback] if hook else [])
    for got, want in zip(model.get_weights(), recorded["after"], strict=True):
        np.testing.assert_allclose(got, np.asarray(want, np.float32), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(history.history["loss"], recorded["loss"], rtol=1e-5)
    steps = [len(epoch) for epoch in recorded["batches"]]
    if hook:
        assert callback.numbers == [list(range(k)) for k in steps]
    assert model.optimizer.iterations.numpy() == sum(steps)


def test_steps_per_epoch_refusals():
    strategy = ld.OneDeviceStrategy("cpu")
    model = _model(strategy)
    forever = ld.data.Dataset.from_tensor_slices((X, Y)).repeat().batch(4)
    with pytest.raises(ValueError, match="steps_per_epoch"):
        model.fit(forever, epochs=1, verbose=0)
    with pytest.raises(ValueError, match="steps_per_epoch=-1"):
        model.fit(X, Y, steps_per_epoch=-1, verbose=0)
    with pytest.raises(ValueError, match="steps_per_epoch='2'"):
        model.fit(X, Y, steps_per_epoch="2", verbose=0)
    before = [w.copy() for w in model.get_weights()]
    model.fit(X, Y, batch_size=4, steps_per_epoch=0, shuffle=False, verbose=0)  # Keras: a pass
    assert model.optimizer.iterations.numpy() == 5
    assert not np.array_equal(before[0], model.get_weights()[0])


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_parameter_servers_take_steps_per_epoch(mode):
    """The driver hands out each epoch's steps_per_epoch batches (the pass's end stops one
    short), on parameter servers too: the steps taken and the loss logged per epoch."""
    with local_client(3) as client, \
            ld.ParameterServerStrategy(client, num_workers=2, mode=mode) as strategy:
        model = _model(strategy)
        history = _fit(model, "arrays-3")
        assert len(history.history["loss"]) == 3
        assert model.optimizer.iterations.numpy() == 3 + 2 + 3


def test_reshape_and_input_layer():
    """`Reshape` (one -1 filled in, TF's refusals) and `InputLayer(input_shape=)` as a model's
    first entry; the gradient flows back through the reshape."""
    strategy = ld.OneDeviceStrategy("cpu")
    with strategy.scope():
        model = ld.Sequential([ld.layers.InputLayer(input_shape=(4, 3)),
                               ld.layers.Reshape((2, -1, 1)), ld.layers.Flatten(),
                               ld.layers.Dense(1)])
        model.compile(optimizer=ld.optimizers.SGD(0.1), loss="mse")
    assert model.layers[0].output_shape((4, 3)) == (2, 6, 1)
    x = np.arange(24, dtype=np.float32).reshape(2, 4, 3) / 24
    before = model.get_weights()[0].copy()
    model.fit(x, np.ones((2, 1), np.float32), verbose=0)
    assert not np.array_equal(before, model.get_weights()[0])
    with pytest.raises(ValueError, match="total size must be unchanged"):
        ld.layers.Reshape((5,)).output_shape((4, 3))
    with pytest.raises(ValueError, match="cannot divide"):
        ld.layers.Reshape((5, -1)).output_shape((4, 3))
    with pytest.raises(ValueError, match="at most one unknown dimension"):
        ld.layers.Reshape((-1, -1))
    with pytest.raises(ValueError, match="target_shape=0"):
        ld.layers.Reshape(0)
    with pytest.raises(ValueError, match="give the sample's shape once"):
        ld.layers.InputLayer()
