"""Records Keras 3's `fit(..., steps_per_epoch=)` in TensorFlow, for
tests/training/test_steps_per_epoch.py.

Run it with a TensorFlow venv (never a labdist dependency), from the repository root:
    /path/to/tf-venv/bin/python tests/training/tf_recorded/record_steps_per_epoch.py
It writes steps_per_epoch.json beside itself: a small Dense model, its initial weights and
data, and for 1 and 2 replicas the batches each epoch took, the weights after `fit` and the
logged losses: arrays whose pass ends inside an epoch, a dataset that repeats forever, and a
finite dataset.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import tensorflow as tf

CASES = {  # name: (data, batch size, epochs, steps_per_epoch)
    "arrays-3": ("arrays", 4, 3, 3),  # 5 batches a pass: 3, 2 (the pass ends), 3
    "arrays-8": ("arrays", 4, 2, 8),  # more than a pass: each epoch is one pass
    "repeat-2": ("repeat", 4, 3, 2),  # a stream: 2 batches an epoch, on and on
    "finite-2": ("finite", 4, 3, 2),  # 5 batches a pass: 2, 2, 1 (the pass ends)
}


def main() -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    rng = np.random.default_rng(0)
    x = np.c_[np.arange(18, dtype=np.float32), rng.standard_normal((18, 2)).astype(np.float32)]
    y = rng.standard_normal((18, 2)).astype(np.float32)
    weights = [rng.standard_normal((3, 2)).astype(np.float32) * 0.3,
               rng.standard_normal(2).astype(np.float32) * 0.3]
    out: dict = {"tensorflow_version": tf.__version__, "x": x.tolist(), "y": y.tolist(),
                 "initial": [w.tolist() for w in weights], "cases": {}}
    for n in (1, 2):
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
        for name, (data, batch, epochs, steps) in CASES.items():
            with strategy.scope():
                m = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
                m.set_weights(weights)
                m.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse")
            if data == "arrays":
                args, kwargs = (x, y), {"batch_size": batch, "shuffle": False}
            else:
                ds = tf.data.Dataset.from_tensor_slices((x, y))
                ds = ds.repeat().batch(batch) if data == "repeat" else ds.batch(batch)
                args, kwargs = (ds,), {}
            ids_seen = _batches(x, y, data, batch, epochs, steps)
            history = m.fit(*args, epochs=epochs, steps_per_epoch=steps, verbose=0,
                            **kwargs)
            out["cases"][f"{name}-{n}"] = {
                "batches": ids_seen, "after": [w.tolist() for w in m.get_weights()],
                "loss": [float(v) for v in history.history["loss"]]}
    Path(__file__).with_name("steps_per_epoch.json").write_text(json.dumps(out))


def _batches(x, y, data, batch, epochs, steps) -> list[list[list[int]]]:
    """The sample numbers each epoch's steps take, read from a model that records them (the
    same fit, eagerly)."""
    seen: list[list[int]] = []

    class Probe(tf.keras.Sequential):
        def train_step(self, d):
            seen.append(d[0].numpy()[:, 0].astype(int).tolist())
            return super().train_step(d)

    per_epoch: list[list[list[int]]] = []

    class Epochs(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            per_epoch.append(list(seen))
            seen.clear()

    m = Probe([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
    m.compile(optimizer="sgd", loss="mse", run_eagerly=True)
    if data == "arrays":
        m.fit(x, y, batch_size=batch, shuffle=False, epochs=epochs, steps_per_epoch=steps,
              verbose=0, callbacks=[Epochs()])
    else:
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        ds = ds.repeat().batch(batch) if data == "repeat" else ds.batch(batch)
        m.fit(ds, epochs=epochs, steps_per_epoch=steps, verbose=0, callbacks=[Epochs()])
    return per_epoch


if __name__ == "__main__":
    main()
