"""Records Keras 3's weight penalties under fit in TensorFlow, for
tests/training/test_regularizers.py.

Run it with a TensorFlow venv (never a labdist dependency), from the repository root:
    /path/to/tf-venv/bin/python tests/training/tf_recorded/record_regularizers.py
It writes regularizers.json beside itself: a Dense model with L2 / L1L2 penalties, its
initial weights and data, and, for 1 and 2 replicas, the weights after 3 SGD steps of `fit`
and the logged loss (which includes the penalties).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import tensorflow as tf


def model(weights):
    m = tf.keras.Sequential([
        tf.keras.Input((5,)),
        tf.keras.layers.Dense(4, activation="tanh",
                              kernel_regularizer=tf.keras.regularizers.L2(0.05),
                              bias_regularizer=tf.keras.regularizers.L1L2(l1=0.02, l2=0.01)),
        tf.keras.layers.Dense(3, kernel_regularizer=tf.keras.regularizers.L1(0.03)),
    ])
    m.set_weights(weights)
    return m


def main() -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((48, 5)).astype(np.float32)
    y = rng.integers(0, 3, 48).astype(np.int64)
    weights = [rng.standard_normal((5, 4)).astype(np.float32) * 0.5,
               rng.standard_normal(4).astype(np.float32) * 0.5,
               rng.standard_normal((4, 3)).astype(np.float32) * 0.5,
               rng.standard_normal(3).astype(np.float32) * 0.5]
    out: dict = {"tensorflow_version": tf.__version__, "x": x.tolist(), "y": y.tolist(),
                 "initial": [w.tolist() for w in weights], "replicas": {}}
    for n in (1, 2):
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
        with strategy.scope():
            m = model(weights)
            m.compile(optimizer=tf.keras.optimizers.SGD(0.5),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = m.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
        out["replicas"][str(n)] = {"after": [w.tolist() for w in m.get_weights()],
                                   "loss": float(history.history["loss"][0])}
    path = Path(__file__).with_name("regularizers.json")
    path.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"regularizers from TensorFlow {tf.__version__} written to {path}")


if __name__ == "__main__":
    main()
