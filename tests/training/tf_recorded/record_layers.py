"""Records TensorFlow's layers on small fixed inputs, for tests/training/test_layers.py.

Run it with a TensorFlow venv (never a labdist dependency), from the repository root:
    /path/to/tf-venv/bin/python tests/training/tf_recorded/record_layers.py
It writes layers.npz beside itself: per case, the layer's Keras config (JSON), the input, the
weights Keras initialised, an upstream gradient, and TensorFlow's output and gradients of
sum(output * upstream) with respect to the input and each weight.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import tensorflow as tf

# name: (Keras class, config, input shape or ("ids", shape, vocabulary))
CASES = {
    "conv_valid_strided": ("Conv2D", {"filters": 4, "kernel_size": [3, 2], "strides": [2, 1],
                                      "padding": "valid", "activation": "relu"}, (2, 7, 6, 3)),
    "conv_same_strided": ("Conv2D", {"filters": 3, "kernel_size": [3, 3], "strides": [2, 2],
                                     "padding": "same", "activation": "linear"}, (2, 7, 6, 2)),
    "conv_same_even_kernel": ("Conv2D", {"filters": 2, "kernel_size": [2, 4],
                                         "strides": [1, 1], "padding": "same",
                                         "activation": "tanh"}, (1, 5, 6, 2)),
    "maxpool_valid": ("MaxPooling2D", {"pool_size": [2, 2], "strides": [2, 2],
                                       "padding": "valid"}, (2, 6, 6, 2)),
    "maxpool_same_overlapping": ("MaxPooling2D", {"pool_size": [3, 2], "strides": [2, 1],
                                                  "padding": "same"}, (2, 7, 5, 3)),
    "avgpool_valid": ("AveragePooling2D", {"pool_size": [2, 3], "strides": [2, 3],
                                           "padding": "valid"}, (2, 6, 7, 2)),
    "avgpool_same": ("AveragePooling2D", {"pool_size": [3, 3], "strides": [2, 2],
                                          "padding": "same"}, (2, 7, 5, 3)),
    "flatten": ("Flatten", {}, (3, 2, 4, 2)),
    "global_average_1d": ("GlobalAveragePooling1D", {}, (3, 5, 4)),
    "dense_on_sequences": ("Dense", {"units": 5, "activation": "sigmoid"}, (2, 3, 4)),
    "embedding": ("Embedding", {"input_dim": 7, "output_dim": 3}, ("ids", (3, 4), 7)),
}


def main() -> None:
    rng = np.random.default_rng(0)
    out: dict[str, np.ndarray] = {"tensorflow_version": np.array(tf.__version__)}
    for name, (cls, config, shape) in CASES.items():
        tf.keras.utils.set_random_seed(1)
        layer = getattr(tf.keras.layers, cls)(**config)
        if shape[0] == "ids":
            x = rng.integers(0, shape[2], shape[1]).astype(np.float32)
            x[0, :2] = x[1, 0]  # an id looked up more than once
        else:
            x = rng.standard_normal(shape).astype(np.float32)
            if cls == "MaxPooling2D":
                x[0, 0, 0, 0] = x[0, 0, 1, 0]  # a tie inside a window
        xt = tf.constant(x)
        y0 = layer(xt)  # builds the weights
        dy = rng.standard_normal(y0.shape).astype(np.float32)
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(xt)
            y = layer(xt)
            loss = tf.reduce_sum(y * dy)
        out[f"{name}/config"] = np.array(json.dumps({"class_name": cls, "config": config}))
        out[f"{name}/x"] = x
        out[f"{name}/dy"] = dy
        out[f"{name}/y"] = y.numpy()
        if shape[0] != "ids":
            out[f"{name}/dx"] = tape.gradient(loss, xt).numpy()
        for w in layer.weights:
            key = w.path.rsplit("/", 1)[-1]
            out[f"{name}/param/{key}"] = w.numpy()
            g = tape.gradient(loss, w)
            out[f"{name}/grad/{key}"] = tf.convert_to_tensor(g).numpy()
    path = Path(__file__).with_name("layers.npz")
    np.savez_compressed(path, **out)
    print(f"{len(CASES)} cases from TensorFlow {tf.__version__} written to {path}")


if __name__ == "__main__":
    main()
