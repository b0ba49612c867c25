"""Records Keras 3's `fit(..., sample_weight=)` and `class_weight=` in TensorFlow, for
tests/training/test_sample_weights.py.

Run it with a TensorFlow venv (never a labdist dependency), from the repository root:
    /path/to/tf-venv/bin/python tests/training/tf_recorded/record_sample_weights.py
It writes sample_weights.json beside itself: a small Dense model, its initial weights and
data, and for 1 and 2 replicas the weights after 3 SGD steps of `fit` and the logged loss and
accuracy, with per-sample weights and with class weights (one class left out of the dict).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import tensorflow as tf


def main() -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((48, 5)).astype(np.float32)
    y = rng.integers(0, 3, 48).astype(np.int64)
    sample_weight = rng.uniform(0.0, 3.0, 48).astype(np.float32)
    class_weight = {0: 0.5, 1: 2.0, 2: 1.5}
    weights = [rng.standard_normal((5, 4)).astype(np.float32) * 0.5,
               rng.standard_normal(4).astype(np.float32) * 0.5,
               rng.standard_normal((4, 3)).astype(np.float32) * 0.5,
               rng.standard_normal(3).astype(np.float32) * 0.5]
    out: dict = {"tensorflow_version": tf.__version__, "x": x.tolist(), "y": y.tolist(),
                 "sample_weight": sample_weight.tolist(),
                 "class_weight": {str(k): v for k, v in class_weight.items()},
                 "initial": [w.tolist() for w in weights], "cases": {}}
    for n in (1, 2):
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
        for case, kwargs in (("sample_weight", {"sample_weight": sample_weight}),
                             ("class_weight", {"class_weight": class_weight})):
            with strategy.scope():
                m = tf.keras.Sequential([tf.keras.Input((5,)),
                                         tf.keras.layers.Dense(4, activation="tanh"),
                                         tf.keras.layers.Dense(3)])
                m.set_weights(weights)
                m.compile(optimizer=tf.keras.optimizers.SGD(0.5), metrics=["accuracy"],
                          loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            history = m.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, **kwargs)
            out["cases"][f"{case}-{n}"] = {
                "after": [w.tolist() for w in m.get_weights()],
                "loss": float(history.history["loss"][0]),
                "accuracy": float(history.history["accuracy"][0])}
    path = Path(__file__).with_name("sample_weights.json")
    path.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"sample weights from TensorFlow {tf.__version__} written to {path}")


if __name__ == "__main__":
    main()
