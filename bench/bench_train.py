"""Training throughput: steps/s of the 784-512-10 MLP (SGD, sparse categorical cross-entropy)
under MirroredStrategy on 2 worker processes, against the same model in single-process numpy
measured in the same run. TensorFlow's MirroredStrategy is measured too when `tensorflow` is
importable (an optional bench dependency, never a project one); `TF_USE_LEGACY_KERAS=1` with
`tf-keras` installed measures Keras 2 instead of Keras 3.

Run: `python bench/bench_train.py [--quick]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import labdist as ld
from labdist.training import layers, losses, optimizers

SAMPLES = 6400


def numpy_steps_per_s(x: np.ndarray, y: np.ndarray, batch: int, steps: int) -> float:
    """The same layers, loss and optimizer in this process: the no-distribution baseline."""
    rng = np.random.default_rng(0)
    net = [layers.Dense(512, activation="relu"), layers.Dense(10, activation="softmax")]
    params = [net[0].build(784, rng), net[1].build(512, rng)]
    opt = optimizers.SGD(0.01)
    start = time.perf_counter()
    for i in range(steps):
        lo = (i * batch) % (len(x) - batch)
        bx, by = x[lo:lo + batch], y[lo:lo + batch]
        h, c0 = net[0].forward(np, params[0], bx)
        p, c1 = net[1].forward(np, params[1], h)
        dz = losses.fused_softmax_grad(np, by, p)
        dh, g1 = net[1].backward_linear(np, params[1], c1[0], dz)
        _, g0 = net[0].backward(np, params[0], c0, dh, input_grad=False)
        for p_, g_ in zip(params, (g0, g1), strict=True):
            for k in p_:
                opt.apply(np, p_[k], g_[k], {}, i + 1)
    return steps / (time.perf_counter() - start)


def labdist_steps_per_s(strategy, x, y, batch: int, spe: int, reps: int) -> float:
    with strategy.scope():
        model = ld.models.Sequential([
            ld.layers.Dense(512, activation="relu", input_shape=(784,)),
            ld.layers.Dense(10, activation="softmax")])
        model.compile(loss="sparse_categorical_crossentropy",
                      optimizer=ld.optimizers.SGD(0.01), steps_per_execution=spe)
    model.fit(x[:10 * batch], y[:10 * batch], batch_size=batch, verbose=0)  # warm-up
    rates = []
    for _ in range(reps):
        start = time.perf_counter()
        model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
        rates.append(-(-len(x) // batch) / (time.perf_counter() - start))
    return statistics.median(rates)


def _tensorflow():
    """TensorFlow with 2 logical CPU devices (configured once, before its runtime starts)."""
    try:
        import tensorflow as tf
    except ImportError:
        return None
    if not getattr(_tensorflow, "configured", False):
        cpus = tf.config.list_physical_devices("CPU")
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
        _tensorflow.configured = True
    return tf


def tensorflow_steps_per_s(x, y, batch: int, spe: int) -> float | str | None:
    """TF's MirroredStrategy on 2 logical CPUs, the same model and data; None without TF, or
    the error's name when this TF/Keras cannot run the configuration."""
    tf = _tensorflow()
    if tf is None:
        return None
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((784,)),
                                     tf.keras.layers.Dense(512, activation="relu"),
                                     tf.keras.layers.Dense(10, activation="softmax")])
        model.compile(loss="sparse_categorical_crossentropy", optimizer="sgd",
                      steps_per_execution=spe)
    try:
        model.fit(x, y, batch_size=batch, shuffle=False, verbose=0)  # traces on this data
        start = time.perf_counter()
        model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    except Exception as e:  # e.g. Keras 3 + MirroredStrategy + steps_per_execution > 1
        return f"failed ({type(e).__name__})"
    return -(-len(x) // batch) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition each")
    args = parser.parse_args()
    reps = 1 if args.quick else 3
    rng = np.random.default_rng(0)
    x = rng.random((SAMPLES, 784), dtype=np.float32)
    y = rng.integers(0, 10, SAMPLES)
    print("load average at start: {:.2f} {:.2f} {:.2f} (2 cores: above ~0.5 the machine is "
          "shared and every figure is low)".format(*os.getloadavg()))
    print(f"{'configuration':<44}{'steps/s':>10}{'vs numpy':>10}")
    with ld.MirroredStrategy(num_replicas=2) as strategy:
        for batch in (64, 256):
            base = statistics.median(numpy_steps_per_s(x, y, batch, 100) for _ in range(reps))
            print(f"{f'numpy, one process, batch {batch}':<44}{base:>10.1f}{1:>9.2f}x")
            for spe in (1, 10):
                rate = labdist_steps_per_s(strategy, x, y, batch, spe, reps)
                label = f"labdist Mirrored(2), batch {batch}, spe {spe}"
                print(f"{label:<44}{rate:>10.1f}{rate / base:>9.2f}x")
                tf_rate = tensorflow_steps_per_s(x, y, batch, spe)
                label = f"TF MirroredStrategy(2 CPUs), batch {batch}, spe {spe}"
                if isinstance(tf_rate, str):
                    print(f"{label:<44}  {tf_rate}")
                elif tf_rate is not None:
                    print(f"{label:<44}{tf_rate:>10.1f}{tf_rate / base:>9.2f}x")


    print("load average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
