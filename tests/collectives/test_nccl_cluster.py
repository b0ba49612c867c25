"""The GPU path on CPU workers: strict replicas (the cupy double) pinned to pretend GPUs, one per
worker process, all-reducing through the NCCL transport over the NCCL double
(devices/strict/nccl.py).
The code is the one a GPU runs (collectives/transports/nccl.py, the training step's device
branch, the embedded cluster's pinning); only cupy and NCCL are doubles. Real GPUs:
tests/devices/test_gpu.py."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from distributed import Client

import labdist as ld
from labdist.cli.info import workers as info_workers
from labdist.cluster.local import start_local_cluster
from labdist.devices.strict import array as strict_device
from labdist.devices.strict import cuda as strict_cuda
from labdist.devices.strict import nccl as strict_nccl
from labdist.enums import VariableAggregation

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def pinned():
    """A cluster of two workers on pretend GPUs 0 and 1 (CUDA_VISIBLE_DEVICES per worker)."""
    old = os.environ.get(strict_cuda.ENV_GPUS)
    os.environ[strict_cuda.ENV_GPUS] = "2"
    try:
        cluster = start_local_cluster(2, "strict")
    finally:
        if old is None:
            del os.environ[strict_cuda.ENV_GPUS]
        else:
            os.environ[strict_cuda.ENV_GPUS] = old
    client = Client(cluster, direct_to_workers=True, set_as_default=False)
    client.wait_for_workers(2, timeout=60)
    yield client
    client.close()
    cluster.close()


@pytest.fixture(scope="module")
def nccl2(pinned):
    with ld.MirroredStrategy(cluster=pinned, device="strict", collective_timeout=20) as s:
        yield s


def _labdist_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("labdist-"))


def test_pinned_replicas_report_their_own_gpu_and_use_nccl(nccl2, pinned):
    assert nccl2.uses_nccl
    devices = [r["device"] for r in nccl2.replicas]
    assert len(set(devices)) == 2 and all("strict double GPU 0" in d for d in devices)
    assert sorted(d.split("CUDA_VISIBLE_DEVICES=")[1] for d in devices) == ["0)", "1)"]
    seen = sorted(w["cuda_visible_devices"] for w in info_workers(pinned.scheduler.address, 20))
    assert seen == ["0", "1"]  # what `labdist info` prints per worker


def test_nccl_all_reduce_of_every_aggregation_and_dtype(nccl2):
    def step():
        ctx = ld.get_replica_context()
        xp, r = ctx.xp, ctx.replica_id_in_sync_group + 1
        mixed = [xp.full((3, 2), r, xp.float32), xp.full(5, r, xp.float64),
                 xp.full(2, r, xp.int32), xp.full(2, r, xp.uint8), xp.full(3, r, xp.float16)]
        return (ctx.all_reduce("SUM", mixed),
                ctx.all_reduce("MEAN", [xp.full(4, r, xp.float32), xp.full(2, r, xp.float64)]),
                ctx.reduce_arrays("first", [xp.full(3, r, xp.int64)],
                                  VariableAggregation.ONLY_FIRST_REPLICA),
                ctx.all_reduce("MEAN", xp.full(2, r, xp.int32)))  # float64 result: host path
    before = nccl2.client.run(strict_nccl.calls)
    out = nccl2.experimental_local_results(nccl2.run(step))
    after = nccl2.client.run(strict_nccl.calls)
    assert [after[w] - before[w] for w in nccl2.workers] == [5 + 2 + 1] * 2  # one per dtype
    for summed, mean, first, int_mean in out:
        assert [a.dtype for a in summed] == [np.float32, np.float64, np.int32, np.uint8,
                                             np.float16]
        assert all((a == 3).all() for a in summed) and summed[0].shape == (3, 2)
        assert [a.dtype for a in mean] == [np.float32, np.float64]
        assert all((a == 1.5).all() for a in mean)
        assert first[0].dtype == np.int64 and list(first[0]) == [1, 1, 1]
        assert int_mean.dtype == np.float64 and list(int_mean) == [1.5, 1.5]


def test_replicas_that_disagree_are_reported_not_reduced(nccl2):
    def step():
        ctx = ld.get_replica_context()
        return ctx.all_reduce("SUM", ctx.xp.ones(4 + ctx.replica_id_in_sync_group))
    with pytest.raises(ValueError, match="shapes differ across replicas"):
        nccl2.run(step)
    ok = nccl2.run(lambda: ld.get_replica_context().all_reduce("SUM", 1.0))
    assert [float(v) for v in nccl2.experimental_local_results(ok)] == [2.0, 2.0]


def _fit(strategy, steps_per_execution):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 12)).astype(np.float32)
    y = rng.integers(0, 4, size=256)
    with strategy.scope():
        model = ld.models.Sequential([ld.layers.Dense(16, activation="relu", input_shape=(12,)),
                                      ld.layers.Dense(4, activation="softmax")], seed=1)
        model.compile(loss="sparse_categorical_crossentropy", optimizer=ld.optimizers.Adam(0.01),
                      metrics=["accuracy"], steps_per_execution=steps_per_execution)
    history = model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    return model.get_weights(), history.history


def test_training_over_nccl_matches_the_host_and_syncs_once_per_group(nccl2):
    """The device branch of training: gradients all-reduced by NCCL, loss and metrics kept
    on the device until the group of steps ends (one device -> host move per group)."""
    with ld.MirroredStrategy(cluster=nccl2.client, device="cpu") as host:
        want, want_history = _fit(host, 4)
    moves = nccl2.client.run(strict_device.host_transfers)
    got, history = _fit(nccl2, 4)  # 8 batches: 2 groups of 4 steps
    moves = {w: n - moves[w] for w, n in nccl2.client.run(strict_device.host_transfers).items()}
    for a, b in zip(want, got, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(history["loss"], want_history["loss"], rtol=1e-6)
    # one move per group (the step's figures) on every replica; replica 0 also answers the
    # driver's reads of the 4 weights (get_weights; the optimizer's slots are made from the
    # weights' shapes, without reading them). Before: 4 more per step (float() of the loss,
    # the metric and each step's figures), and 4 more for the slots.
    assert [moves[w] for w in nccl2.workers] == [2 + 4, 2], moves


def test_shared_gpus_fall_back_to_the_host_and_nccl_is_refused():
    """Without pinning every worker is on (pretend) GPU 0: "auto" does not use NCCL, and
    transport='nccl' says why, naming the replicas."""
    strategy = ld.MirroredStrategy(2, device="strict")  # unpinned: no pretend GPUs asked for
    try:
        assert not strategy.uses_nccl
        assert {r["device"] for r in strategy.replicas} == {"strict double GPU 0 (PCI "
                                                            f"{strict_cuda._pci_bus_id('0')})"}
        with pytest.raises(ValueError, match=r"transport='nccl' needs every replica on a GPU "
                                             r"of its own.*tcp://.*, tcp://"):
            ld.MirroredStrategy(cluster=strategy.client, device="strict", transport="nccl")
        out = strategy.run(lambda: ld.get_replica_context().all_reduce("SUM", 2.0))
        assert [float(v) for v in strategy.experimental_local_results(out)] == [4.0, 4.0]
    finally:
        strategy.close()


def test_rank_0_alone_makes_the_id_and_no_thread_is_left(pinned):
    before = pinned.run(_labdist_threads)
    with ld.MirroredStrategy(cluster=pinned, device="strict") as strategy:
        assert strategy.uses_nccl
        during = pinned.run(_labdist_threads)
    after = pinned.run(_labdist_threads)
    assert all(strict_nccl.BOOTSTRAP_THREAD not in names for names in during.values())
    assert after == before


def _slow_all_reduce(seconds):  # runs on a worker: its NCCL calls start `seconds` late
    original = strict_nccl.NcclCommunicator.allReduce

    def late(self, *args):
        time.sleep(seconds)
        return original(self, *args)
    strict_nccl.NcclCommunicator._original_all_reduce = original
    strict_nccl.NcclCommunicator.allReduce = late


def _restore_all_reduce():
    cls = strict_nccl.NcclCommunicator
    cls.allReduce = cls.__dict__.get("_original_all_reduce", cls.allReduce)


def test_a_peer_that_stalls_in_nccl_times_out_and_the_group_is_cleanly_broken(pinned):
    strategy = ld.MirroredStrategy(cluster=pinned, device="strict", collective_timeout=2)
    late = strategy.workers[1]
    pinned.run(_slow_all_reduce, 6, workers=[late])
    try:
        assert strategy.uses_nccl
        start = time.monotonic()
        with pytest.raises(ld.CollectiveTimeoutError,
                           match=r"waited 2 s in NCCL on replica 0 for replica\(s\) \[1\]"):
            strategy.run(lambda: ld.get_replica_context().all_reduce("SUM", 1.0))
        assert time.monotonic() - start < 15
        time.sleep(5)  # replica 1 is done being late (it fails too: its peer aborted)
        with pytest.raises(RuntimeError, match="cannot use NCCL.*aborted.*close this strategy"):
            strategy.run(lambda: ld.get_replica_context().all_reduce("SUM", 1.0))
    finally:
        pinned.run(_restore_all_reduce, workers=[late])
        start = time.monotonic()
        strategy.close()
        assert time.monotonic() - start < 15


def _die_in_all_reduce():  # runs on a worker: its next NCCL collective kills the process
    strict_nccl.NcclCommunicator.allReduce = lambda *a: os.kill(os.getpid(), signal.SIGKILL)


def test_a_peer_killed_mid_collective_is_a_lost_replica_not_a_hang():
    """Replica 1's process is SIGKILLed inside its NCCL call, after the signatures agreed:
    replica 0 waits in NCCL, sees the loss, aborts; the step raises ReplicaLostError naming
    replica 1, well before the collective timeout, and the strategy closes cleanly."""
    os.environ[strict_cuda.ENV_GPUS] = "2"
    try:
        strategy = ld.MirroredStrategy(2, device="strict", collective_timeout=60)
    finally:
        del os.environ[strict_cuda.ENV_GPUS]
    try:
        assert strategy.uses_nccl
        strategy.client.run(_die_in_all_reduce, workers=[strategy.workers[1]])
        start = time.monotonic()
        with pytest.raises(ld.ReplicaLostError, match="replica 1"):
            strategy.run(lambda: ld.get_replica_context().all_reduce("SUM", 1.0))
        assert time.monotonic() - start < 30
    finally:
        start = time.monotonic()
        strategy.close()
        assert time.monotonic() - start < 30
