"""What the CNN runners share (bench_cnn.py): the model, the data and the step count. Only the
standard library and numpy, so it runs under labdist's, torch's and TensorFlow's interpreters.

The model is the one TensorFlow's tutorials train (their "Custom training" CNN) on 16x16 gray
images: Conv2D(32, 3, relu) -> MaxPool(2) -> Conv2D(64, 3, relu) -> MaxPool(2) -> Flatten ->
Dense(64, relu) -> Dense(10), SGD(0.01), sparse categorical cross-entropy on logits, float32.
"""

from __future__ import annotations

import numpy as np

SIDE, CLASSES, LEARNING_RATE = 16, 10, 0.01


def data(samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`samples` random images (float32, channels last) and labels: the same in every runner."""
    rng = np.random.default_rng(seed)
    return (rng.random((samples, SIDE, SIDE, 1), dtype=np.float32),
            rng.integers(0, CLASSES, samples))
