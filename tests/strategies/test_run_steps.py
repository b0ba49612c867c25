"""strategy.run(steps=k) and distributed iterators as arguments: each step takes the next
element; a distribute_datasets_from_function iterator's pipelines move to the replicas and
give the same batches as iterating on the driver."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import labdist as ld

# these pipelines are each replica's own (dataset_fn reads ctx.input_pipeline_id)
PER_REPLICA = ld.InputOptions(experimental_replication_mode="PER_REPLICA")


def local(strategy, out):
    return [np.asarray(v).tolist() for v in strategy.experimental_local_results(out)]


def per_replica_data(n_batches=6, per=2):
    rng = np.random.default_rng(0)
    data = rng.normal(size=(2, n_batches, per, 3)).astype(np.float32)

    def dataset_fn(ctx):
        return [(data[ctx.input_pipeline_id, i], np.full(per, i, np.int64))
                for i in range(n_batches)]

    return data, dataset_fn


def test_steps_runs_k_times_and_returns_the_last(mirrored2):
    with mirrored2.scope():
        v = ld.Variable(0.0, aggregation="MEAN")

    def step():
        v.assign_add(1.0)
        return v.read_value()

    assert local(mirrored2, mirrored2.run(step, steps=3)) == [3.0, 3.0]
    assert float(v.numpy()) == 3.0


@pytest.mark.parametrize("steps", [0, -1, True, 1.5, "2", None])
def test_steps_must_be_a_positive_integer(mirrored2, steps):
    with pytest.raises(ValueError, match="steps="):
        mirrored2.run(lambda: 1, steps=steps)


def test_dataset_iterator_feeds_each_step(mirrored2):
    x = np.arange(24, dtype=np.float32).reshape(12, 2)
    dataset = mirrored2.experimental_distribute_dataset(ld.batches(x, 4))
    expected = [local(mirrored2, mirrored2.run(lambda b: b.sum(), args=(b,))) for b in dataset]
    it = iter(dataset)
    got = [local(mirrored2, mirrored2.run(lambda b: b.sum(), args=(it,))) for _ in range(3)]
    assert got == expected
    it = iter(dataset)
    assert local(mirrored2, mirrored2.run(lambda b: b.sum(), args=(it,), steps=3)) == expected[-1]
    with pytest.raises(ld.OutOfRangeError, match="step 1 .*nothing ran"):
        mirrored2.run(lambda b: b.sum(), args=(it,))


def test_pipelines_on_the_replicas_give_the_driver_batches(mirrored2):
    _, dataset_fn = per_replica_data()
    dataset = mirrored2.distribute_datasets_from_function(dataset_fn, options=PER_REPLICA)

    def step(batch):
        x, y = batch
        return x.sum() + 1000 * y[0]

    expected = [local(mirrored2, mirrored2.run(step, args=(b,))) for b in dataset]
    it = iter(dataset)
    got = [local(mirrored2, mirrored2.run(step, args=(it,), steps=2)) for _ in range(3)]
    assert got == expected[1::2]
    assert it.remote_key is not None  # the batches were made on the replicas
    with pytest.raises(TypeError, match="moved its input pipelines"):
        next(it)
    with pytest.raises(ld.OutOfRangeError, match="step 1 of this strategy.run"):
        mirrored2.run(step, args=(it,))


def test_an_iterator_drawn_on_the_driver_stays_there(mirrored2):
    _, dataset_fn = per_replica_data()
    dataset = mirrored2.distribute_datasets_from_function(dataset_fn, options=PER_REPLICA)
    expected = [local(mirrored2, mirrored2.run(lambda b: b[1][0], args=(b,))) for b in dataset]
    it = iter(dataset)
    next(it)
    got = [local(mirrored2, mirrored2.run(lambda b: b[1][0], args=(it,))) for _ in range(5)]
    assert got == expected[1:] and it.remote_key is None


def test_generator_pipelines_are_drawn_on_the_driver(mirrored2):
    def dataset_fn(ctx):
        return (np.full(2, 10 * ctx.input_pipeline_id + i, np.float32) for i in range(4))

    it = iter(mirrored2.distribute_datasets_from_function(dataset_fn, options=PER_REPLICA))
    assert local(mirrored2, mirrored2.run(lambda b: b[0], args=(it,), steps=3)) == [2.0, 12.0]
    assert it.remote_key is None


def test_the_input_ending_mid_call_keeps_the_steps_that_ran(mirrored2):
    _, dataset_fn = per_replica_data(n_batches=3)
    with mirrored2.scope():
        count = ld.Variable(0.0, aggregation="MEAN")

    def step(batch):
        count.assign_add(1.0)
        return batch[1][0]

    for dataset in (mirrored2.distribute_datasets_from_function(dataset_fn, options=PER_REPLICA),
                    mirrored2.experimental_distribute_dataset(
                        ld.batches((np.zeros((6, 2), np.float32), np.zeros(6)), 2))):
        count.assign(0.0)
        it = iter(dataset)
        mirrored2.run(step, args=(it,), steps=2)
        with pytest.raises(ld.OutOfRangeError, match=r"step 2 of this strategy.run\(steps=2\)"):
            mirrored2.run(step, args=(it,), steps=2)
        assert float(count.numpy()) == 3.0


def test_pipelines_of_different_lengths_end_with_empty_batches(mirrored2):
    def dataset_fn(ctx):
        return [np.ones(2, np.float32)] * (2 + ctx.input_pipeline_id)

    it = iter(mirrored2.distribute_datasets_from_function(dataset_fn, options=PER_REPLICA))
    assert local(mirrored2, mirrored2.run(lambda b: b.sum(), args=(it,), steps=2)) == [2.0, 2.0]
    # replica 0's pipeline ran out: an empty batch, while replica 1 has its last (as TF)
    assert local(mirrored2, mirrored2.run(lambda b: b.shape[0], args=(it,))) == [0, 2]
    with pytest.raises(ld.OutOfRangeError, match="step 1 of this strategy.run"):
        mirrored2.run(lambda b: b.sum(), args=(it,))
    assert local(mirrored2, mirrored2.run(lambda: 1)) == [1, 1]  # the group is usable


def test_an_error_names_its_step(mirrored2):
    with mirrored2.scope():
        v = ld.Variable(0.0, aggregation="MEAN")

    def step():
        v.assign_add(1.0)
        if v.read_value() >= 2:
            raise ArithmeticError("boom")

    with pytest.raises(ArithmeticError, match="boom") as info:
        mirrored2.run(step, steps=3)
    assert any("step 2 of this strategy.run(steps=3)" in n for n in info.value.__notes__)


def test_merge_call_in_every_step(mirrored2):
    seen = []

    def merge(strategy, value):
        seen.append(strategy.reduce("SUM", value, axis=None))
        return len(seen)

    def step():
        ctx = ld.get_replica_context()
        return ctx.merge_call(merge, args=(np.float32(ctx.replica_id_in_sync_group + 1),))

    assert local(mirrored2, mirrored2.run(step, steps=3)) == [3, 3]
    assert seen == [3.0, 3.0, 3.0]


def test_dropped_iterators_are_forgotten_and_new_ones_start_over(mirrored2):
    _, dataset_fn = per_replica_data(n_batches=2)
    dataset = mirrored2.distribute_datasets_from_function(dataset_fn, options=PER_REPLICA)
    for _ in range(3):
        it = iter(dataset)
        assert local(mirrored2, mirrored2.run(lambda b: b[1][0], args=(it,), steps=2)) == [1, 1]
        del it
        gc.collect()
    assert local(mirrored2, mirrored2.run(lambda: 1)) == [1, 1]


def test_one_device_strategy_takes_steps_and_iterators():
    strategy = ld.OneDeviceStrategy(device="cpu")
    it = iter(strategy.experimental_distribute_dataset(ld.batches(np.arange(6.0), 2)))
    assert float(strategy.run(lambda b: b.sum(), args=(it,), steps=2)) == 5.0
