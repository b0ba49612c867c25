"""Device replicas on real GPUs (cupy). Skipped, with the reason, on machines without a GPU;
the same code paths run on every machine through the strict device double (device="strict")."""

from __future__ import annotations

import numpy as np
import pytest

import labdist as ld
from labdist.backend import gpu_count

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(gpu_count() == 0, reason="needs a CUDA GPU with cupy installed"),
]


@pytest.fixture(scope="module")
def gpu_strategy():
    n = max(1, min(gpu_count(), 2))
    with ld.MirroredStrategy(num_replicas=n, device="gpu") as s:
        yield s


def test_variables_are_cupy_arrays_on_the_workers(gpu_strategy):
    with gpu_strategy.scope():
        v = ld.Variable(np.ones(4, np.float32), aggregation="MEAN")
    kinds = gpu_strategy.run(lambda: type(v.read_value()).__module__.split(".")[0])
    assert set(gpu_strategy.experimental_local_results(kinds)) == {"cupy"}


def test_results_come_back_as_numpy(gpu_strategy):
    n = gpu_strategy.num_replicas_in_sync
    with gpu_strategy.scope():
        v = ld.Variable(10.0, aggregation="SUM")
    xs = gpu_strategy.experimental_distribute_values_from_function(
        lambda c: float(c.replica_id_in_sync_group + 1))
    out = gpu_strategy.run(lambda x: v.assign_add(x), args=(xs,))
    expected = 10.0 + n * (n + 1) / 2
    for local in gpu_strategy.experimental_local_results(out):
        assert type(local) is np.ndarray and float(local) == expected
    assert all(float(c) == expected for c in gpu_strategy.experimental_local_results(v))


def test_all_reduce_on_device(gpu_strategy):
    def step():
        ctx = ld.get_replica_context()
        x = ctx.xp.full(1000, ctx.replica_id_in_sync_group + 1.0, dtype=ctx.xp.float32)
        return ctx.all_reduce("SUM", x)
    n = gpu_strategy.num_replicas_in_sync
    for local in gpu_strategy.experimental_local_results(gpu_strategy.run(step)):
        np.testing.assert_array_equal(local, np.full(1000, n * (n + 1) / 2, np.float32))
