"""Records Keras 3's adaptive optimizers on an `Embedding` table under fit in TensorFlow, for
tests/training/test_embedding_optimizers.py.

Run it with a TensorFlow venv (never a labdist dependency), from the repository root:
    /path/to/tf-venv/bin/python tests/training/tf_recorded/record_embedding_optimizers.py
It writes embedding_optimizers.json beside itself: an Embedding -> GlobalAveragePooling1D ->
Dense model, its initial weights and data (ids repeated within a sample and within a batch),
and, for each optimizer and for 1, 2 and 3 replicas, the weights and the optimizer's slots
after 3 steps of `fit`. The table's gradient is one slice per lookup (IndexedSlices), so the
second moments take the sum of the squared slices; the "custom_loop" entries record the same
steps through GradientTape and apply_gradients inside strategy.run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

VOCAB, WIDTH, LENGTH, CLASSES, BATCH, STEPS = 7, 3, 4, 2, 12, 3

OPTIMIZERS = {
    "sgd": lambda: tf.keras.optimizers.SGD(0.5),
    "adam": lambda: tf.keras.optimizers.Adam(0.05),
    "adagrad": lambda: tf.keras.optimizers.Adagrad(0.2),
    "rmsprop": lambda: tf.keras.optimizers.RMSprop(0.01),
    "rmsprop_centered_momentum": lambda: tf.keras.optimizers.RMSprop(
        0.01, momentum=0.5, centered=True),
}


def model(weights):
    m = tf.keras.Sequential([
        tf.keras.Input((LENGTH,), dtype="int32"),
        tf.keras.layers.Embedding(VOCAB, WIDTH),
        tf.keras.layers.GlobalAveragePooling1D(),
        tf.keras.layers.Dense(CLASSES),
    ])
    m.set_weights(weights)
    return m


def slots(m, optimizer) -> list[dict]:
    """Per model weight: {Keras slot name: values} (the optimizer names its slots after the
    weight's path)."""
    out = []
    for w in m.trainable_weights:
        prefix = w.path.replace("/", "_") + "_"
        out.append({v.name[len(prefix):]: v.numpy().tolist() for v in optimizer.variables
                    if v.name.startswith(prefix)})
    return out


def with_fit(strategy, weights, make, x, y) -> dict:
    with strategy.scope():
        m = model(weights)
        m.compile(optimizer=make(),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    m.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return {"after": [w.tolist() for w in m.get_weights()], "slots": slots(m, m.optimizer)}


def with_custom_loop(strategy, weights, make, x, y) -> dict:
    with strategy.scope():
        m = model(weights)
        optimizer = make()
        optimizer.build(m.trainable_variables)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="none")
    data = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH))

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_fn(yb, m(xb, training=True)),
                                              global_batch_size=BATCH)
        grads = tape.gradient(loss, m.trainable_variables)
        optimizer.apply_gradients(zip(grads, m.trainable_variables, strict=True))

    for xb, yb in data:
        strategy.run(step, args=(xb, yb))
    return {"after": [w.tolist() for w in m.get_weights()], "slots": slots(m, optimizer)}


def record(replicas: int) -> dict:
    """Every optimizer on `replicas` replicas; one process per replica count (a process's
    collectives keep the group size they first met)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    x, y, weights = data()
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
    return {name: {"fit": with_fit(strategy, weights, make, x, y),
                   "custom_loop": with_custom_loop(strategy, weights, make, x, y)}
            for name, make in OPTIMIZERS.items()}


def data() -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    rng = np.random.default_rng(3)
    n = BATCH * STEPS
    # ids 0..4 only (rows 5, 6 never looked up), with repeats inside each sample
    x = rng.integers(0, 5, (n, LENGTH)).astype(np.int32)
    x[:, 1] = x[:, 0]
    y = rng.integers(0, CLASSES, n).astype(np.int64)
    weights = [rng.standard_normal((VOCAB, WIDTH)).astype(np.float32),
               rng.standard_normal((WIDTH, CLASSES)).astype(np.float32),
               rng.standard_normal(CLASSES).astype(np.float32) * 0.1]
    return x, y, weights


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--replicas":
        print(json.dumps(record(int(sys.argv[2]))))
        return
    x, y, weights = data()
    out: dict = {"tensorflow_version": tf.__version__, "keras_version": tf.keras.__version__,
                 "x": x.tolist(), "y": y.tolist(), "batch_size": BATCH,
                 "initial": [w.tolist() for w in weights], "fit": {}, "custom_loop": {}}
    for replicas in (1, 2, 3):
        found = json.loads(subprocess.run(
            [sys.executable, __file__, "--replicas", str(replicas)], check=True,
            capture_output=True, text=True).stdout.splitlines()[-1])
        for name, paths in found.items():
            for path, recorded in paths.items():
                out[path].setdefault(name, {})[str(replicas)] = recorded
    path = Path(__file__).with_name("embedding_optimizers.json")
    path.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"embedding optimizers from TensorFlow {tf.__version__} written to {path}")


if __name__ == "__main__":
    main()
