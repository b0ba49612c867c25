"""Device replicas on real GPUs (cupy). Skipped, with the reason, on machines without a GPU;
the same code paths run on every machine through the strict device double (device="strict")."""

from __future__ import annotations

import numpy as np
import pytest

import labdist as ld
from labdist.devices import gpu_count

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


@pytest.fixture(scope="module")
def two_gpus():
    if gpu_count() < 2:
        pytest.skip("NCCL between replicas needs 2 GPUs")
    with ld.MultiWorkerMirroredStrategy(transport="nccl", num_replicas=2,
                                        device="gpu") as s:
        yield s


@pytest.mark.parametrize("op", ["SUM", "MEAN"])
def test_nccl_all_reduce_of_mixed_dtypes(two_gpus, op):
    assert two_gpus.uses_nccl

    def step():
        ctx = ld.get_replica_context()
        r = ctx.replica_id_in_sync_group + 1.0
        xp = ctx.xp
        return ctx.all_reduce(op, [xp.full((3, 5), r, xp.float32), xp.full(7, r, xp.float64),
                                   xp.full(2, int(r), xp.int32)] if op == "SUM" else
                              [xp.full((3, 5), r, xp.float32), xp.full(7, r, xp.float64)])
    want = 3.0 if op == "SUM" else 1.5
    for local in two_gpus.experimental_local_results(two_gpus.run(step)):
        assert local[0].dtype == np.float32 and local[0].shape == (3, 5)
        np.testing.assert_array_equal(local[0], want)
        np.testing.assert_array_equal(local[1], want)
        if op == "SUM":
            assert local[2].dtype == np.int32 and list(local[2]) == [3, 3]


def test_nccl_mismatch_is_reported_not_reduced(two_gpus):
    def step():
        ctx = ld.get_replica_context()
        n = 4 + ctx.replica_id_in_sync_group
        return ctx.all_reduce("SUM", ctx.xp.ones(n, ctx.xp.float32))
    with pytest.raises(ValueError, match="shapes differ across replicas"):
        two_gpus.run(step)
    ok = two_gpus.run(lambda: ld.get_replica_context().all_reduce("SUM", 1.0))
    assert [float(v) for v in two_gpus.experimental_local_results(ok)] == [2.0, 2.0]


def test_training_on_gpus_matches_the_host(two_gpus):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 20)).astype(np.float32)
    y = rng.integers(0, 4, size=256)
    weights = []
    with ld.MirroredStrategy(num_replicas=2, device="cpu") as host:
        for strategy in (host, two_gpus):
            with strategy.scope():
                model = ld.models.Sequential([
                    ld.layers.Dense(32, activation="relu", input_shape=(20,)),
                    ld.layers.Dense(4, activation="softmax")], seed=1)
                model.compile(loss="sparse_categorical_crossentropy",
                              optimizer=ld.optimizers.SGD(0.1))
            model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
            weights.append(model.get_weights())
    for a, b in zip(*weights, strict=True):
        assert type(b) is np.ndarray
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
