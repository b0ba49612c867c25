"""`distribute_datasets_from_function` as TF 2.21's strategies run it, on 1, 2 and 3 replicas
(real worker processes): MirroredStrategy calls `dataset_fn` once (`num_input_pipelines=1`,
`input_pipeline_id=0`) and hands the pipeline's consecutive batches to the replicas in turn;
`InputReplicationMode.PER_REPLICA` calls it once per replica, MultiWorkerMirroredStrategy once
per worker. A replica whose input ran out gets an empty batch until every replica's has; a
pipeline with `drop_remainder` stops at the first step it cannot fill. Each case is read three
ways: iterating on the driver, and feeding `strategy.run` an iterator (the pipelines then live
on the replicas), one step per call and two."""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
import pytest
from conftest import make_strategy

import labdist as ld

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Unsized travels to the workers
PER_REPLICA = ld.InputOptions(experimental_replication_mode=ld.InputReplicationMode.PER_REPLICA)


class Unsized:
    """A re-iterable pipeline with no len() (a tf.data pipeline of unknown cardinality)."""

    def __init__(self, batches):
        self._batches = batches

    def __iter__(self):
        return iter(self._batches)


def range_batches(stop, size, shard=None, drop_remainder=False):
    """`tf.data.Dataset.range(stop)[.shard(n, i)].batch(size, drop_remainder)`, as ld.batches."""
    xs = np.arange(stop, dtype=np.int64)
    if shard is not None:
        xs = xs[shard[1]::shard[0]]
    return ld.batches(xs, size, drop_remainder=drop_remainder)


@pytest.fixture(params=[1, 2, 3])
def mirrored(request) -> ld.Strategy:
    return make_strategy(f"mirrored-{request.param}")


def identity(batch):
    return batch


def read(strategy, dataset, how):
    """Every step's batches, [[replica 0's], [replica 1's], ...] per step."""
    def lists(value):
        return [np.asarray(c).tolist() for c in strategy.experimental_local_results(value)]

    if how == "driver":
        return [lists(batch) for batch in dataset]
    steps = 1 if how == "run" else 2
    it = iter(dataset)
    out = []
    while True:
        try:
            out.append(lists(strategy.run(identity, args=(it,), steps=steps)))
        except ld.OutOfRangeError as e:
            if "step 2" in str(e):  # a steps=2 call whose second step had no input
                out.append(None)
            break
    assert it.remote_key is not None  # the pipelines moved to the replicas
    return out


def expect(steps, how):
    """What `read` gives for these steps: a steps=2 call returns its last step only."""
    if how != "run-2":
        return steps
    return [steps[i + 1] if i + 1 < len(steps) else None for i in range(0, len(steps), 2)]


HOW = ["driver", "run", "run-2"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", HOW)
def test_one_pipeline_hands_consecutive_batches_to_the_replicas_in_turn(mirrored, how):
    n = mirrored.num_replicas_in_sync
    contexts = []

    def dataset_fn(ctx):
        contexts.append((ctx.num_input_pipelines, ctx.input_pipeline_id,
                         ctx.num_replicas_in_sync))
        return range_batches(4 * n, ctx.get_per_replica_batch_size(2 * n))

    dataset = mirrored.distribute_datasets_from_function(dataset_fn)
    assert contexts == [(1, 0, n)]  # called once, as TF's MirroredStrategy does
    # TF, 2 replicas, range(8).batch(2): [[0, 1], [2, 3]], then [[4, 5], [6, 7]]
    steps = [[[2 * (k * n + r), 2 * (k * n + r) + 1] for r in range(n)] for k in range(2)]
    assert read(mirrored, dataset, how) == expect(steps, how)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("kind", ["ld.batches", "unsized"])
def test_the_shared_pipeline_ends_with_empty_batches_or_drops_them(mirrored, how, kind):
    """(ld.batches' replicas skip the others' batches without making them; any other
    pipeline is iterated in full on each replica: the same steps.)"""
    n = mirrored.num_replicas_in_sync

    def dataset_fn(ctx):
        batches = range_batches(2 * n + 1, 1)
        return batches if kind == "ld.batches" else Unsized(list(batches))

    uneven = mirrored.distribute_datasets_from_function(dataset_fn)
    steps = [[[k * n + r] if k * n + r < 2 * n + 1 else [] for r in range(n)] for k in range(3)]
    assert read(mirrored, uneven, how) == expect(steps, how)
    if kind == "unsized":
        return
    dropped = mirrored.distribute_datasets_from_function(
        lambda ctx: range_batches(2 * n + 1, 1, drop_remainder=True))
    full = steps[:2] if n > 1 else steps  # one replica: every step is full
    assert read(mirrored, dropped, how) == expect(full, how)


def sharded_steps(n, stop=7):
    """range(stop).shard(n, r).batch(1) per replica, zipped as TF does: empty batches for the
    replicas whose shard ran out, until all have (TF, 2 replicas: last step [[6], []])."""
    shards = [list(range(r, stop, n)) for r in range(n)]
    return [[[s[k]] if k < len(s) else [] for s in shards] for k in range(len(shards[0]))]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("sized", [True, False], ids=["len", "no-len"])
def test_per_replica_pipelines_end_with_empty_batches(mirrored, how, sized):
    n = mirrored.num_replicas_in_sync
    contexts = []

    def dataset_fn(ctx):
        contexts.append((ctx.num_input_pipelines, ctx.input_pipeline_id))
        batches = range_batches(7, 1, shard=(ctx.num_input_pipelines, ctx.input_pipeline_id))
        return batches if sized else Unsized(batches)

    dataset = mirrored.distribute_datasets_from_function(dataset_fn, options=PER_REPLICA)
    assert contexts == [(n, r) for r in range(n)]
    assert read(mirrored, dataset, how) == expect(sharded_steps(n), how)

    dropped = mirrored.distribute_datasets_from_function(
        lambda ctx: range_batches(7, 1, shard=(n, ctx.input_pipeline_id), drop_remainder=True),
        options=PER_REPLICA)
    shortest = len(range(n - 1, 7, n))
    assert read(mirrored, dropped, how) == expect(sharded_steps(n)[:shortest], how)


@pytest.mark.timeout(180)
def test_an_empty_batch_keeps_the_structure_and_joins_the_collectives(mirrored):
    n = mirrored.num_replicas_in_sync
    x = np.arange(3 * (n + 1), dtype=np.float32).reshape(n + 1, 3)
    dataset = mirrored.distribute_datasets_from_function(
        lambda ctx: ld.batches((x, np.arange(n + 1)), 1))

    def step(batch):
        features, labels = batch
        total = ld.get_replica_context().all_reduce("SUM", features.sum())
        return features.shape, str(features.dtype), labels.shape, total

    it = iter(dataset)
    mirrored.run(step, args=(it,))
    shapes, dtypes, label_shapes, totals = (mirrored.experimental_local_results(v)
                                            for v in mirrored.run(step, args=(it,)))
    # the last step: replica 0 has the last row, the others an empty batch of its kind
    assert [tuple(s) for s in shapes] == [(1, 3)] + [(0, 3)] * (n - 1)
    assert set(dtypes) == {"float32"} and [tuple(s) for s in label_shapes][1:] == [(0,)] * (n - 1)
    assert {float(t) for t in totals} == {float(x[n].sum())}
    with pytest.raises(ld.OutOfRangeError):
        mirrored.run(step, args=(it,))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["ld.batches", "unsized"])
def test_a_shared_pipeline_shorter_than_one_step(mirrored, kind):
    n = mirrored.num_replicas_in_sync
    x = np.ones((1, 3), np.float32)

    def dataset_fn(ctx):
        batches = ld.batches(x, 1)
        return batches if kind == "ld.batches" else Unsized(list(batches))

    dataset = mirrored.distribute_datasets_from_function(dataset_fn)
    it = iter(dataset)
    shapes = mirrored.run(lambda b: b.shape, args=(it,))
    assert [tuple(s) for s in mirrored.experimental_local_results(shapes)] == \
        [(1, 3)] + [(0, 3)] * (n - 1)
    with pytest.raises(ld.OutOfRangeError):
        mirrored.run(lambda b: b.shape, args=(it,))
    assert read(mirrored, dataset, "driver") == [[[[1.0] * 3]] + [[]] * (n - 1)]


@pytest.mark.timeout(120)
def test_multi_worker_strategy_makes_one_pipeline_per_worker():
    mirrored2 = make_strategy("mirrored-2")
    strategy = ld.MultiWorkerMirroredStrategy(cluster=mirrored2.client, device="cpu")
    try:
        contexts = []

        def dataset_fn(ctx):
            contexts.append((ctx.num_input_pipelines, ctx.input_pipeline_id))
            return range_batches(7, 1, shard=(ctx.num_input_pipelines, ctx.input_pipeline_id))

        dataset = strategy.distribute_datasets_from_function(dataset_fn)
        assert contexts == [(2, 0), (2, 1)]
        assert read(strategy, dataset, "run") == [[[0], [1]], [[2], [3]], [[4], [5]], [[6], []]]
    finally:
        strategy.close()


def test_input_options_are_checked():
    with pytest.raises(ValueError, match="experimental_replication_mode='PER_HOST' is not a "
                                         "valid InputReplicationMode; allowed: PER_WORKER"):
        ld.InputOptions(experimental_replication_mode="PER_HOST")
    with pytest.raises(ValueError, match="experimental_per_replica_buffer_size=0"):
        ld.InputOptions(experimental_per_replica_buffer_size=0)
    with pytest.raises(TypeError, match="options=.*must be None or an ld.InputOptions"):
        ld.get_strategy().distribute_datasets_from_function(lambda ctx: [], options={"x": 1})
    one = ld.get_strategy().distribute_datasets_from_function(
        lambda ctx: [np.ones(2)] * 2, options=ld.InputOptions())
    assert [b.tolist() for b in one] == [[1, 1]] * 2


def test_an_unseeded_shuffle_is_the_same_in_every_copy():
    """The replicas' copies of a shared pipeline must agree: ld.batches draws its seed once."""
    batches = ld.batches(np.arange(20), 5, shuffle=True)
    copy = cloudpickle.loads(cloudpickle.dumps(batches))
    first = [b.tolist() for b in batches]
    assert first == [b.tolist() for b in copy]
    assert [b.tolist() for b in batches] != first  # each pass still differs


@pytest.mark.timeout(180)
def test_inputs_end_alike_on_every_device_and_transport(strategy):
    """The strict GPU double and Dask comms: the per-step all-reduce of pipelines without
    len(), and empty batches moved to the device."""
    n = strategy.num_replicas_in_sync
    unsized = strategy.distribute_datasets_from_function(
        lambda ctx: Unsized(list(range_batches(7, 1, shard=(n, ctx.input_pipeline_id)))),
        options=PER_REPLICA)
    assert read(strategy, unsized, "run") == sharded_steps(n)
    shared = strategy.distribute_datasets_from_function(lambda ctx: range_batches(n + 1, 1))
    assert read(strategy, shared, "run-2") == [[[n]] + [[]] * (n - 1)]
