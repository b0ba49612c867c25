"""Baseline: TensorFlow's MirroredStrategy on 2 logical CPUs, a custom training loop (TF's
idiom: `strategy.run` inside a `tf.function`; with `--steps-per-call k` > 1 the function loops
k steps). Runs under a TensorFlow interpreter (never a labdist dependency):
LABDIST_BENCH_TF_PY.

Run: `/path/to/tf/python bench/baselines/tf_custom.py --batch 64 --steps 300 --steps-per-call 10`.
"""

from __future__ import annotations

import os

from _common import (
    CLASSES,
    FEATURES,
    HIDDEN,
    LEARNING_RATE,
    REPLICAS,
    data,
    emit,
    fail,
    parse,
    timed_passes,
)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    args = parse(__doc__.splitlines()[0], lambda p: p.add_argument(
        "--steps-per-call", type=int, default=1))
    k = args.steps_per_call
    if args.steps % k or args.warmup % k:
        fail(f"--steps and --warmup must be multiples of --steps-per-call {k}")
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * REPLICAS)
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])
    x, y = data(args.batch * args.steps)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch).repeat()
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((FEATURES,)),
                                     tf.keras.layers.Dense(HIDDEN, activation="relu"),
                                     tf.keras.layers.Dense(CLASSES, activation="softmax")])
        optimizer = tf.keras.optimizers.SGD(LEARNING_RATE)
        loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(reduction="none")

    def step_fn(inputs):
        bx, by = inputs
        with tf.GradientTape() as tape:
            per_example = loss_fn(by, model(bx, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=args.batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def train(it):
        total = tf.constant(0.0)
        for _ in tf.range(k):
            per_replica = strategy.run(step_fn, args=(next(it),))
            total += strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        return total

    def run_synced(steps: int) -> None:
        """`steps` steps; the last call's result read on the host, so all of them ran."""
        last = None
        for _ in range(steps // k):
            last = train(iterator)
        if last is not None:
            last.numpy()

    run_synced(args.warmup)
    rates = timed_passes(lambda: run_synced(args.steps), args.steps, args.passes)
    emit(rates, tensorflow=tf.__version__, keras=getattr(tf.keras, "__version__", "?"),
         steps_per_call=k, optimizer_steps=int(optimizer.iterations.numpy()))


if __name__ == "__main__":
    main()
