"""Strategies on real Dask clusters, no mocks: the `dask scheduler` / `dask worker` command
line, a `distributed.Client`, a `LocalCluster` object, and the embedded cluster that
`MirroredStrategy(num_replicas=N)` starts and owns (docs/semantics.md §1, docs/design.md
"Replicas on workers").

Cluster start-ups are expensive on a 2-core machine, so the command-line cluster is started
once for the module and every test that can share it does.
"""

from __future__ import annotations

import os
import subprocess
import time

import numpy as np
import psutil
import pytest
from clusters import DASK, free_port, stop, workers_of
from distributed import Client, LocalCluster

import labdist as ld
from labdist.devices import gpu_count


# -- helpers ---------------------------------------------------------------------------------
def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_until(predicate, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def _replicas(strategy: ld.Strategy) -> ld.PerReplica:
    """1.0, 2.0, ... as a per-replica value."""
    return strategy.experimental_distribute_values_from_function(
        lambda vctx: vctx.replica_id_in_sync_group + 1.0)


def _check_semantics_example(strategy: ld.Strategy) -> None:
    """docs/semantics.md §2's example (initial 10, per-replica 1 and 2) and §3's all_reduce, run
    through whatever workers `strategy` has (two replicas)."""
    assert strategy.num_replicas_in_sync == 2
    with strategy.scope():
        on_write = ld.Variable(10.0, dtype="float32", synchronization="ON_WRITE",
                               aggregation="SUM")
        on_read = ld.Variable(10.0, dtype="float32", synchronization="ON_READ",
                              aggregation="SUM")
    xs = _replicas(strategy)

    def step(x):
        ctx = ld.get_replica_context()
        on_write.assign_add(x)
        on_read.assign_add(x)
        return ctx.all_reduce("SUM", x), ctx.replica_id_in_sync_group

    total, ranks = strategy.run(step, args=(xs,))
    assert [float(r) for r in strategy.experimental_local_results(on_write)] == [13.0, 13.0]
    assert [float(r) for r in strategy.experimental_local_results(on_read)] == [11.0, 12.0]
    with strategy.scope():
        assert float(on_read.read_value()) == 23.0
        assert float(on_write.read_value()) == 13.0
    assert [float(t) for t in strategy.experimental_local_results(total)] == [3.0, 3.0]
    assert strategy.experimental_local_results(ranks) == (0, 1)
    for result in strategy.experimental_local_results(on_write):
        assert isinstance(result, np.ndarray)


@pytest.mark.cluster
def test_address_uses_every_worker_of_the_cli_cluster(external):
    strategy = ld.MirroredStrategy(cluster=external.address, connect_timeout=20)
    try:
        assert strategy.num_replicas_in_sync == 2
        assert sorted(strategy.workers) == external.workers
        assert len(set(strategy.workers)) == 2
        assert strategy.dashboard_link is None  # only an embedded cluster's dashboard is shown
        # the replicas run in the `dask worker` processes (each nanny's child), not here
        pids = strategy.experimental_local_results(strategy.run(os.getpid))
        parents = strategy.experimental_local_results(strategy.run(os.getppid))
        assert os.getpid() not in pids and len(set(pids)) == 2
        assert set(parents) == {p.pid for p in external.worker_procs}
        _check_semantics_example(strategy)
    finally:
        strategy.close()
    # close() releases this strategy's replicas, and nothing else of a cluster it did not start
    assert external.alive()
    assert workers_of(external.address) == external.workers
    with Client(external.address, timeout=10, set_as_default=False) as c:
        def leftover():  # the replica actors, on the scheduler and on the workers
            tasks = c.run_on_scheduler(
                lambda dask_scheduler: [str(k) for k in dask_scheduler.tasks])
            actors = c.run(lambda dask_worker: [str(k) for k in dask_worker.state.actors])
            keys = tasks + [k for keys in actors.values() for k in keys]
            return [k for k in keys if "labdist-replica" in k]
        assert _wait_until(lambda: not leftover(), timeout=10), leftover()


@pytest.mark.cluster
def test_one_replica_on_the_cli_cluster_next_to_a_two_replica_strategy(external):
    two = ld.MirroredStrategy(cluster=external.address, connect_timeout=20)
    try:
        one = ld.MirroredStrategy(num_replicas=1, cluster=external.address, connect_timeout=20)
        try:
            assert one.num_replicas_in_sync == 1
            assert len(one.workers) == 1 and one.workers[0] in external.workers
            out = one.run(os.getpid)  # one replica: the plain value, as TF 2.21's
            (pid,) = one.experimental_local_results(out)
            assert out == pid and isinstance(pid, int)
            assert pid != os.getpid()
            with one.scope():
                v = ld.Variable(10.0, dtype="float32", aggregation="SUM")
            one.run(lambda: v.assign_add(2.0))  # N = 1: a non-distributed value is applied
            assert [float(x) for x in one.experimental_local_results(v)] == [12.0]
            # both strategies share the workers (and the collectives plugin) without trouble
            _check_semantics_example(two)
        finally:
            one.close()
        _check_semantics_example(two)  # closing the other strategy left this one working
    finally:
        two.close()
    assert external.alive()
    assert workers_of(external.address) == external.workers


@pytest.mark.cluster
def test_a_client_is_used_and_left_open(external):
    with Client(external.address, timeout=20, set_as_default=False) as client:
        strategy = ld.MirroredStrategy(cluster=client)
        try:
            assert strategy.client is client
            assert sorted(strategy.workers) == external.workers
            _check_semantics_example(strategy)
        finally:
            strategy.close()
        assert client.status == "running"
        assert client.submit(lambda a: a + 1, 1, pure=False).result(timeout=20) == 2
        # too many replicas: a clear ValueError, and the given client is still left open
        with pytest.raises(ValueError, match=r"num_replicas=3"):
            ld.MirroredStrategy(num_replicas=3, cluster=client, connect_timeout=1)
        assert client.status == "running"
        assert sorted(client.scheduler_info(n_workers=-1)["workers"]) == external.workers


@pytest.mark.cluster
def test_a_closed_client_is_refused_clearly(external):
    client = Client(external.address, timeout=20, set_as_default=False)
    client.close()
    # today the error comes from deep inside _pick_workers: "RuntimeError: IOLoop is closed"
    # for this client, "KeyError: 'workers'" for a closed client of a LocalCluster object
    with pytest.raises((ValueError, ConnectionError), match="closed"):
        ld.MirroredStrategy(cluster=client, connect_timeout=2)
    assert external.alive()


@pytest.mark.cluster
def test_too_many_replicas_for_the_cluster(external):
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"num_replicas=3") as info:
        ld.MirroredStrategy(num_replicas=3, cluster=external.address, connect_timeout=1)
    assert time.monotonic() - t0 < 10
    assert "2 worker" in str(info.value)
    assert external.alive()
    assert workers_of(external.address) == external.workers


@pytest.mark.cluster
def test_a_cluster_object_is_used_and_left_running():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster:
        strategy = ld.MirroredStrategy(cluster=cluster)
        try:
            assert sorted(strategy.workers) == sorted(cluster.scheduler_info["workers"])
            pids = strategy.experimental_local_results(strategy.run(os.getpid))
            assert os.getpid() not in pids and len(set(pids)) == 2
            _check_semantics_example(strategy)
        finally:
            strategy.close()
        assert cluster.status.name == "running"
        with Client(cluster, set_as_default=False) as c:
            assert len(c.scheduler_info(n_workers=-1)["workers"]) == 2
            assert c.submit(lambda a: a * 2, 21, pure=False).result(timeout=20) == 42


# -- the embedded cluster -----------------------------------------------------------------------
def _check_embedded_is_gone(address: str, pids: tuple[int, ...]) -> None:
    assert _wait_until(lambda: all(_gone(p) for p in pids), timeout=15), \
        f"worker processes {pids} still running after close()"
    t0 = time.monotonic()
    with pytest.raises((OSError, TimeoutError)):
        Client(address, timeout=1, set_as_default=False).close()
    assert time.monotonic() - t0 < 10


@pytest.mark.cluster
def test_embedded_cluster_is_started_and_shut_down_by_close():
    strategy = ld.MirroredStrategy(num_replicas=2)
    try:
        address = strategy.client.scheduler.address
        pids = strategy.experimental_local_results(strategy.run(os.getpid))
        assert len(set(pids)) == 2 and os.getpid() not in pids
        assert all(not _gone(p) for p in pids)
        _check_semantics_example(strategy)
    finally:
        strategy.close()
    _check_embedded_is_gone(address, pids)
    strategy.close()  # closing again is harmless
    with pytest.raises(RuntimeError, match="closed"):
        strategy.run(os.getpid)


@pytest.mark.cluster
def test_embedded_cluster_context_manager():
    with ld.MirroredStrategy(2) as strategy:
        assert strategy.num_replicas_in_sync == 2
        address = strategy.client.scheduler.address
        pids = strategy.experimental_local_results(strategy.run(os.getpid))
        assert len(set(pids)) == 2 and os.getpid() not in pids
    _check_embedded_is_gone(address, pids)


@pytest.mark.cluster
@pytest.mark.skipif(gpu_count() > 0, reason="needs a machine without a GPU")
def test_gpu_device_without_a_gpu_fails_cleanly_on_the_cli_cluster(external):
    with pytest.raises(ValueError, match="device='gpu'"):
        ld.MirroredStrategy(cluster=external.address, device="gpu", connect_timeout=20)
    assert external.alive()
    with ld.MirroredStrategy(cluster=external.address, connect_timeout=20) as strategy:
        assert strategy.experimental_local_results(strategy.run(lambda: 7)) == (7, 7)


# -- bad input --------------------------------------------------------------------------------
def test_unreachable_scheduler_raises_within_connect_timeout():
    address = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(ld.ClusterConnectionError) as info:
        ld.MirroredStrategy(cluster=address, connect_timeout=2)
    elapsed = time.monotonic() - t0
    assert elapsed < 8, f"took {elapsed:.1f} s with connect_timeout=2"
    assert address in str(info.value)
    assert isinstance(info.value, ConnectionError)


@pytest.mark.parametrize(
    ("kwargs", "error", "names"),
    [
        ({"num_replicas": 0}, ValueError, "num_replicas=0"),
        ({"num_replicas": -1}, ValueError, "num_replicas=-1"),
        ({"num_replicas": "2"}, ValueError, "num_replicas='2'"),
        ({"num_replicas": 2.0}, ValueError, "num_replicas=2.0"),
        ({"num_replicas": True}, ValueError, "num_replicas=True"),
        ({"device": "tpu"}, ValueError, "device='tpu'"),
        ({"collective_timeout": -1}, ValueError, "collective_timeout=-1"),
        ({"collective_timeout": 0}, ValueError, "collective_timeout=0"),
        ({"connect_timeout": "5"}, ValueError, "connect_timeout='5'"),
        ({"cluster": 42}, TypeError, "cluster=42"),
    ],
)
def test_bad_arguments_name_the_parameter_and_value(kwargs, error, names):
    t0 = time.monotonic()
    with pytest.raises(error) as info:
        ld.MirroredStrategy(**kwargs)
    assert names in str(info.value)
    assert time.monotonic() - t0 < 5  # rejected before any cluster is started


@pytest.mark.cluster
@pytest.mark.parametrize("communication", ["auto", "ring"])
def test_multi_worker_training_on_the_cli_cluster(external, communication):
    """The seed program, unchanged but for the strategy, against a `dask scheduler` address."""
    (x, y), (x_val, y_val) = ld.datasets.digits.load_data()
    strategy = ld.MultiWorkerMirroredStrategy(cluster=external.address,
                                              communication=communication, connect_timeout=20)
    try:
        assert strategy.num_replicas_in_sync == 2
        assert strategy.transport == ("tcp" if communication == "ring" else "shm")
        with strategy.scope():
            model = ld.models.Sequential([
                ld.layers.Dense(512, activation="relu", input_shape=(64,)),
                ld.layers.Dropout(0.2),
                ld.layers.Dense(10, activation="softmax")])
            model.compile(loss="sparse_categorical_crossentropy",
                          optimizer=ld.optimizers.Adam(), metrics=["accuracy"])
        history = model.fit(x, y, epochs=8, batch_size=64, validation_data=(x_val, y_val),
                            verbose=0)
        assert history.history["val_accuracy"][-1] >= 0.95
    finally:
        strategy.close()
    assert external.alive()


def test_multi_worker_bad_communication():
    """transport= is the knob; communication= (TF's older spelling) maps onto it. Errors name
    the parameter actually passed, the value and what is allowed."""
    with pytest.raises(ValueError, match="communication='mpi'.*auto, ring, nccl"):
        ld.MultiWorkerMirroredStrategy(communication="mpi")
    with pytest.raises(ValueError, match="transport='ring'.*auto, shm, tcp, nccl"):
        ld.MultiWorkerMirroredStrategy(transport="ring")
    with pytest.raises(ValueError, match="communication='ring' and transport='tcp'.*only"):
        ld.MultiWorkerMirroredStrategy(communication="ring", transport="tcp")


@pytest.mark.cluster
def test_nccl_on_host_replicas_is_refused_naming_them(external):
    """communication='nccl' needs GPU replicas: host ones are named, and nothing is left
    behind (the next strategy on the same workers runs, with host all-reduces)."""
    with pytest.raises(ValueError, match=r"communication='nccl' needs every replica on a GPU"
                                         r".*tcp://127\.0\.0\.1:\d+"):
        ld.MultiWorkerMirroredStrategy(cluster=external.address, communication="nccl",
                                       device="cpu", connect_timeout=20)
    with pytest.raises(ValueError, match=r"transport='nccl' needs every replica on a GPU"):
        ld.MultiWorkerMirroredStrategy(cluster=external.address, transport="nccl",
                                       device="cpu", connect_timeout=20)
    with ld.MultiWorkerMirroredStrategy(cluster=external.address, device="cpu",
                                        connect_timeout=20) as strategy:
        assert not strategy.uses_nccl
        out = strategy.run(lambda: ld.get_replica_context().all_reduce("SUM", 1.0))
        n = strategy.num_replicas_in_sync
        assert [float(v) for v in strategy.experimental_local_results(out)] == [n] * n
    assert external.alive()


@pytest.mark.cluster
def test_multi_worker_uses_the_workers_present_at_each_fit(external):
    (x, y), _ = ld.datasets.digits.load_data()
    x, y = x[:600], y[:600]
    strategy = ld.MultiWorkerMirroredStrategy(cluster=external.address, connect_timeout=20)
    third = subprocess.Popen([DASK, "worker", external.address, "--host", "127.0.0.1",
                              "--nthreads", "1", "--no-dashboard", "--death-timeout", "60s"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        with strategy.scope():
            model = ld.models.Sequential([ld.layers.Dense(32, activation="relu",
                                                          input_shape=(64,)),
                                          ld.layers.Dense(10, activation="softmax")])
            model.compile(loss="sparse_categorical_crossentropy", optimizer="adam")
        assert _wait_until(lambda: len(workers_of(external.address)) == 3, timeout=60)
        model.fit(x, y, batch_size=60, epochs=1, verbose=0)  # a worker joined: 3 replicas
        assert strategy.num_replicas_in_sync == 3
        before = model.get_weights()
        stop([third])
        assert _wait_until(lambda: len(workers_of(external.address)) == 2, timeout=60)
        assert strategy.refresh() and strategy.num_replicas_in_sync == 2  # one left
        assert sorted(strategy.workers) == external.workers
        assert all(np.array_equal(a, b)
                   for a, b in zip(before, model.get_weights(), strict=True))  # values kept
        history = model.fit(x, y, batch_size=60, epochs=1, verbose=0)
        assert history.history["loss"][0] > 0 and not strategy.refresh()
    finally:
        strategy.close()
        stop([third])
    assert external.alive()
