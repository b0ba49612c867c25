"""Records Keras 3's one step counter in TensorFlow, for tests/training/test_one_counter.py:
a custom loop's `apply_gradients` steps, then `fit` on the same compiled model and optimizer
(Adam, whose bias correction reads the counter), then the custom loop again.

Run it with a TensorFlow venv (never a labdist dependency), from the repository root:
    /path/to/tf-venv/bin/python tests/training/tf_recorded/record_one_counter.py
It writes one_counter.json beside itself: the model's initial weights and data, and the
weights and `optimizer.iterations` after each phase.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import tensorflow as tf


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 3)).astype(np.float32)
    y = rng.standard_normal((16, 2)).astype(np.float32)
    weights = [rng.standard_normal((3, 2)).astype(np.float32) * 0.3,
               rng.standard_normal(2).astype(np.float32) * 0.3]
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
    model.set_weights(weights)
    optimizer = tf.keras.optimizers.Adam(0.1)
    model.compile(optimizer=optimizer, loss="mse")
    loss_fn = tf.keras.losses.MeanSquaredError()
    out: dict = {"tensorflow_version": tf.__version__, "x": x.tolist(), "y": y.tolist(),
                 "initial": [w.tolist() for w in weights], "phases": []}

    def loop(steps: int) -> None:
        for i in range(steps):
            with tf.GradientTape() as tape:
                loss = loss_fn(y[4 * i:4 * i + 4], model(x[4 * i:4 * i + 4], training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    def record(phase: str) -> None:
        out["phases"].append({"phase": phase, "iterations": int(optimizer.iterations.numpy()),
                              "after": [w.tolist() for w in model.get_weights()]})

    loop(3)
    record("loop")
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    record("fit")
    loop(2)
    record("loop again")
    Path(__file__).with_name("one_counter.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main()
