"""Records Keras' optimizers in TensorFlow, for tests/training/test_optimizer_rules.py.

Run it with a TensorFlow venv (never a labdist dependency), from the repository root:
    /path/to/tf-venv/bin/python tests/training/tf_recorded/record_optimizers.py
It writes optimizers.json beside itself: for each optimizer configuration, a variable's
initial value, five fixed gradients, and the variable after each `apply_gradients`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import tensorflow as tf

CASES = {
    "rmsprop": ("RMSprop", {"learning_rate": 0.01}),
    "rmsprop_momentum": ("RMSprop", {"learning_rate": 0.01, "momentum": 0.9}),
    "rmsprop_centered": ("RMSprop", {"learning_rate": 0.01, "centered": True}),
    "rmsprop_centered_momentum": ("RMSprop", {"learning_rate": 0.02, "rho": 0.8,
                                              "momentum": 0.5, "centered": True,
                                              "epsilon": 1e-6}),
    "sgd_weight_decay": ("SGD", {"learning_rate": 0.1, "momentum": 0.9, "weight_decay": 0.05}),
    "adam_weight_decay": ("Adam", {"learning_rate": 0.01, "weight_decay": 0.004}),
    "adagrad_weight_decay": ("Adagrad", {"learning_rate": 0.1, "weight_decay": 0.01}),
    "rmsprop_weight_decay": ("RMSprop", {"learning_rate": 0.01, "weight_decay": 0.1}),
}


def main() -> None:
    rng = np.random.default_rng(0)
    initial = rng.standard_normal(6).astype(np.float32)
    grads = rng.standard_normal((5, 6)).astype(np.float32)
    out: dict = {"tensorflow_version": tf.__version__, "initial": initial.tolist(),
                 "gradients": grads.tolist(), "cases": {}}
    for name, (cls, config) in CASES.items():
        v = tf.Variable(initial)
        opt = getattr(tf.keras.optimizers, cls)(**config)
        steps = []
        for g in grads:
            opt.apply_gradients([(tf.constant(g), v)])
            steps.append(v.numpy().tolist())
        out["cases"][name] = {"class_name": cls, "config": config, "after_each_step": steps}
    path = Path(__file__).with_name("optimizers.json")
    path.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"{len(CASES)} optimizers from TensorFlow {tf.__version__} written to {path}")


if __name__ == "__main__":
    main()
