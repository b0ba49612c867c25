"""TensorFlow / Keras 3: the tutorial CNN trained by `model.fit`, in one process with no
strategy (`--replicas 1`) or under MirroredStrategy on that many logical CPUs. Runs under a
TensorFlow interpreter (never a labdist dependency): LABDIST_BENCH_TF_PY.

Run: `/path/to/tf/python bench/baselines/cnn_tf.py --batch 64 --steps 60 --replicas 2`.
"""

from __future__ import annotations

import contextlib
import os

from _common import emit, parse, timed_passes
from cnn_common import CLASSES, LEARNING_RATE, SIDE, data

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    args = parse(__doc__.splitlines()[0],
                 lambda p: p.add_argument("--replicas", type=int, default=2))
    import tensorflow as tf

    scope = contextlib.nullcontext()
    if args.replicas > 1:
        cpus = tf.config.list_physical_devices("CPU")
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * args.replicas)
        scope = tf.distribute.MirroredStrategy(
            [f"/cpu:{i}" for i in range(args.replicas)]).scope()
    layers = tf.keras.layers
    with scope:
        m = tf.keras.Sequential([
            tf.keras.Input((SIDE, SIDE, 1)),
            layers.Conv2D(32, 3, activation="relu"), layers.MaxPooling2D(),
            layers.Conv2D(64, 3, activation="relu"), layers.MaxPooling2D(),
            layers.Flatten(), layers.Dense(64, activation="relu"), layers.Dense(CLASSES)])
        m.compile(optimizer=tf.keras.optimizers.SGD(LEARNING_RATE),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = data(args.batch * args.steps)
    m.fit(x[:args.batch * args.warmup], y[:args.batch * args.warmup], batch_size=args.batch,
          shuffle=False, verbose=0)
    rates = timed_passes(lambda: m.fit(x, y, batch_size=args.batch, shuffle=False, verbose=0),
                         args.steps, args.passes)
    emit(rates, replicas=args.replicas, tensorflow=tf.__version__)


if __name__ == "__main__":
    main()
