"""Records Keras' BatchNormalization under MirroredStrategy in TensorFlow, for
tests/training/test_batch_norm.py.

Run it with a TensorFlow venv (never a labdist dependency), from the repository root:
    /path/to/tf-venv/bin/python tests/training/tf_recorded/record_batch_norm.py
It writes batch_norm.json beside itself: a small model (Dense -> BatchNormalization ->
Dense softmax, SGD) fitted for 4 steps without shuffling on 1, 2 and 3 logical CPUs, with
synchronized False and True: the initial weights, the variables' modes, every replica's copy
of the moving statistics afterwards, get_weights, predict and evaluate. Each run is a process
of its own (TensorFlow's collectives keep their groups for the life of a process).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 3)


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((24, 5)) * [1, 2, 0.5, 3, 1] + [0, 1, -2, 0.5, 3]).astype(np.float32)
    y = rng.integers(0, 3, 24).astype(np.int64)
    x[12:] += 1.5  # the two batches differ: replicas' slices see different statistics
    return x, y


def one_run(synchronized: bool, n: int) -> dict:
    x, y = data()
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
    with strategy.scope():
        tf.keras.utils.set_random_seed(3)
        model = tf.keras.Sequential([
            tf.keras.Input((5,)),
            tf.keras.layers.Dense(6),
            tf.keras.layers.BatchNormalization(momentum=0.9, synchronized=synchronized),
            tf.keras.layers.Dense(3, activation="softmax")])
        model.compile(loss="sparse_categorical_crossentropy",
                      optimizer=tf.keras.optimizers.SGD(0.1))
    initial = [w.tolist() for w in model.get_weights()]
    model.fit(x, y, batch_size=12, epochs=2, shuffle=False, verbose=0)
    bn = model.layers[1]
    return {
        "initial": initial,
        "modes": {w.path.rsplit("/", 1)[-1]: [
            str(w.value.synchronization).split(".")[-1].upper(),
            str(w.value.aggregation).split(".")[-1].upper(), bool(w.trainable)]
            for w in bn.weights},
        "copies": {w.path.rsplit("/", 1)[-1]: [
            np.asarray(c).tolist() for c in strategy.experimental_local_results(w.value)]
            for w in (bn.moving_mean, bn.moving_variance)},
        "weights": [w.tolist() for w in model.get_weights()],
        "predict": model.predict(x[:12], batch_size=12, verbose=0).tolist(),
        "evaluate": float(model.evaluate(x, y, batch_size=12, verbose=0)),
    }


def main() -> None:
    if len(sys.argv) == 3:  # one run, in this process: its JSON on stdout
        print(json.dumps(one_run(sys.argv[1] == "True", int(sys.argv[2]))))
        return
    x, y = data()
    out: dict = {"tensorflow_version": tf.__version__, "x": x.tolist(), "y": y.tolist(),
                 "runs": {}}
    for synchronized in (False, True):
        for n in (1, 2, 3):
            done = subprocess.run([sys.executable, __file__, str(synchronized), str(n)],
                                  capture_output=True, text=True, check=True)
            out["runs"][f"synchronized={synchronized},replicas={n}"] = json.loads(
                done.stdout.strip().splitlines()[-1])
    path = Path(__file__).with_name("batch_norm.json")
    path.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"{len(out['runs'])} runs from TensorFlow {tf.__version__} written to {path}")


if __name__ == "__main__":
    main()
