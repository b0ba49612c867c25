"""The port rule: `import tensorflow as tf` -> `import labdist as ld`, then `tf.keras.`,
`tf.distribute.` and `tf.` -> `ld.`. The top-level names a TensorFlow / Keras 3 program
reaches exist and do what the program expects: dtypes, `ld.constant`, `@ld.function` (a
pass-through: no graph mode), `ld.Sequential` with `ld.Input`, loss classes with
`from_logits`, `MirroredStrategy(devices=[...])`; and what labdist does not take is refused
with the way to say it."""

from __future__ import annotations

import numpy as np
import pytest

import labdist as ld


def test_dtypes_and_constants():
    assert ld.float32 is np.float32 and ld.int64 is np.int64 and ld.bool is np.bool_
    c = ld.constant([[1, 2], [3, 4]], dtype=ld.float32)
    assert c.dtype == np.float32 and c.shape == (2, 2)
    assert ld.constant(3).dtype.kind == "i"


def test_function_is_a_pass_through_however_it_is_written():
    def step(x):
        return x + 1

    assert ld.function(step) is step
    assert ld.function(jit_compile=True, reduce_retracing=True)(step) is step

    @ld.function
    def decorated(x):
        return x * 2

    assert decorated(3) == 6
    with pytest.raises(TypeError, match="ld.function takes a function"):
        ld.function(3)


def seed_program(strategy, x, y):
    """A Keras 3 program under tf.distribute, with only `tf.` -> `ld.` changed."""
    with strategy.scope():
        model = ld.Sequential([
            ld.Input((64,)),
            ld.layers.Dense(64, activation="relu"),
            ld.layers.Dense(10)])
        model.compile(loss=ld.losses.SparseCategoricalCrossentropy(from_logits=True),
                      optimizer=ld.optimizers.Adam(learning_rate=0.01), metrics=["accuracy"])
    return model, model.fit(x, y, batch_size=64, epochs=3, verbose=0)


def test_a_keras_3_program_runs_with_the_import_changed():
    (x, y), _ = ld.datasets.digits.load_data()
    strategy = ld.MirroredStrategy(devices=["/cpu:0", "/cpu:1"])
    try:
        assert strategy.num_replicas_in_sync == 2

        @ld.function
        def replica_sum(v):
            return ld.get_replica_context().all_reduce("SUM", v)

        out = strategy.run(replica_sum, args=(ld.constant(2.0, dtype=ld.float32),))
        assert [float(o) for o in strategy.experimental_local_results(out)] == [4.0, 4.0]
        model, history = seed_program(strategy, x, y)
        assert history.history["accuracy"][-1] > 0.9
        steps = 3 * -(-len(x) // 64)  # Keras' optimizer.iterations: the steps fit took
        assert int(model.optimizer.iterations.numpy()) == steps
    finally:
        strategy.close()


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"devices": []}, r"devices=\[\] is not allowed; use a non-empty list of device names"),
    ({"devices": ["/tpu:0"]}, r"devices=\['/tpu:0'\] is not allowed"),
    ({"devices": ["/cpu:0", "/gpu:0"]}, r"use devices of one kind"),
    ({"devices": ["/cpu:0"], "num_replicas": 2}, r"give one of them"),
    ({"devices": ["/cpu:0"], "device": "gpu"}, r"disagree"),
])
def test_bad_devices_are_refused_before_a_cluster_starts(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ld.MirroredStrategy(**kwargs)


def test_an_input_first_sets_the_shape_and_a_bad_one_is_named():
    model = ld.Sequential([ld.Input((8, 8, 1)), ld.layers.Conv2D(2, 3), ld.layers.Flatten()])
    assert model.input_shape == (None, 8, 8, 1) and model.output_shape == (None, 72)
    with pytest.raises(ValueError, match=r"^shape=\(0,\) is not allowed"):  # the name given
        ld.Input((0,))


def test_use_locking_on_an_optimizer_points_to_the_parameter_servers():
    with pytest.raises(TypeError, match=r"SGD\(use_locking=True\): optimizers take no "
                                        r"use_locking .*ParameterServerStrategy\(\.\.\., "
                                        r"use_locking=True\)"):
        ld.optimizers.SGD(0.1, use_locking=True)
