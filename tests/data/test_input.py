"""docs/semantics.md §4: splitting global batches across replicas, and the batching helper."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from numpy.testing import assert_array_equal

import labdist as ld
from labdist.data.distributed import shard_bounds, split_batch, split_sizes


@pytest.mark.parametrize(("b", "n", "sizes"), [
    (8, 3, [3, 3, 2]), (7, 3, [3, 3, 1]), (5, 3, [2, 2, 1]), (2, 3, [1, 1, 0]), (1, 2, [1, 0]),
    (6, 3, [2, 2, 2]), (0, 2, [0, 0]), (64, 2, [32, 32]),
])
def test_ceil_split_rule(b, n, sizes):
    assert split_sizes(b, n) == sizes
    parts = split_batch(np.arange(b), n)
    assert [len(p) for p in parts] == sizes
    assert_array_equal(np.concatenate(list(parts)), np.arange(b))  # in order, nothing lost
    bounds = shard_bounds(b, n)  # what every caller slices shards with
    assert bounds[0] == 0 and bounds[-1] == b and len(bounds) == n + 1
    assert [hi - lo for lo, hi in itertools.pairwise(bounds)] == sizes
    assert all(type(i) is int for i in bounds)  # plain ints: fit for slices and lists alike


def test_tuples_and_dicts_split_together():
    x, y = np.arange(10).reshape(5, 2), np.arange(5)
    xs, ys = split_batch((x, y), 3)  # the batch's structure, a PerReplica at each leaf
    assert isinstance(xs, ld.PerReplica)
    assert [len(p) for p in xs] == [2, 2, 1]
    assert_array_equal(ys[2], [4])
    d = split_batch({"x": x, "y": y}, 2)
    assert_array_equal(d["y"][1], [3, 4])
    assert split_batch((x, y), 1) == (x, y)


def test_mismatched_leading_sizes_and_unbatched_elements():
    with pytest.raises(ValueError, match=r"leading sizes \[3, 4\]"):
        split_batch((np.zeros(3), np.zeros(4)), 2)
    with pytest.raises(ValueError, match="no batch dimension.*2 replicas"):
        split_batch(np.float32(1.0), 2)
    assert split_batch(5.0, 1) == 5.0  # one replica: passes through


def test_distribute_dataset_short_last_batch(mirrored3):
    global_batches = [np.arange(8.0), np.arange(6.0)]
    dist = mirrored3.experimental_distribute_dataset(global_batches)
    first, last = list(dist)
    assert [len(p) for p in first] == [3, 3, 2]
    assert [len(p) for p in last] == [2, 2, 2]
    assert len(list(dist)) == 2  # re-iterable when the source is


def test_replica_with_an_empty_batch_still_joins_collectives(mirrored3):
    dist = mirrored3.experimental_distribute_dataset([np.arange(1.0, 3.0)])  # 2 on 3 -> [1,1,0]

    def step(x):
        ctx = ld.get_replica_context()
        return ctx.all_reduce("SUM", x.sum()), len(x)
    total, sizes = mirrored3.run(step, args=(next(iter(dist)),))
    assert mirrored3.experimental_local_results(sizes) == (1, 1, 0)
    assert {float(t) for t in mirrored3.experimental_local_results(total)} == {3.0}


def test_distribute_dataset_rejects_non_iterables(mirrored2):
    with pytest.raises(TypeError, match="dataset=5"):
        mirrored2.experimental_distribute_dataset(5)


class TestBatches:
    def test_batches_in_order_with_remainder(self):
        x, y = np.arange(10), np.arange(10) * 10
        got = list(ld.batches((x, y), global_batch_size=4))
        assert [len(b[0]) for b in got] == [4, 4, 2]
        assert_array_equal(got[2][1], [80, 90])
        assert len(ld.batches(x, 4, drop_remainder=True)) == 2
        assert [len(b) for b in ld.batches(x, 4, drop_remainder=True)] == [4, 4]

    def test_shuffle_is_seeded_and_changes_every_pass(self):
        x = np.arange(20)
        a = ld.batches(x, 5, shuffle=True, seed=1)
        b = ld.batches(x, 5, shuffle=True, seed=1)
        first_a, first_b = np.concatenate(list(a)), np.concatenate(list(b))
        assert_array_equal(first_a, first_b)
        assert sorted(first_a) == list(range(20)) and not np.array_equal(first_a, x)
        assert not np.array_equal(np.concatenate(list(a)), first_a)  # a new order next epoch

    @pytest.mark.parametrize(("args", "match"), [
        ((np.arange(3), 0), "global_batch_size=0"),
        ((np.arange(3), 2.5), "global_batch_size=2.5"),
        (((np.arange(3), np.arange(4)), 2), "leading dimension"),
    ])
    def test_bad_input(self, args, match):
        with pytest.raises(ValueError, match=match):
            ld.batches(*args)

    def test_end_to_end_with_a_strategy(self, mirrored2):
        x = np.arange(12.0).reshape(6, 2)
        with mirrored2.scope():
            total = ld.Variable(np.zeros(2), aggregation="SUM")
        for batch in mirrored2.experimental_distribute_dataset(ld.batches(x, 4)):
            mirrored2.run(lambda b: total.assign_add(b.sum(axis=0)), args=(batch,))
        for c in mirrored2.experimental_local_results(total):
            assert_array_equal(c, x.sum(axis=0))
