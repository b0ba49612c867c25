"""The parameter servers' same-host path (parameter_server/shm_client.py, shm_server.py) on
real worker processes: it is taken when a worker shares its parameter server's host, gives the very
values Dask comms give in every mode, keeps reads untorn under use_locking while pushes race, falls
back to Dask comms where /dev/shm cannot serve, and leaves no files behind.
"""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import time

import numpy as np
import pytest
from clusters import local_client
from test_parameter_server import race

import labdist as ld
from labdist.enums import VariableAggregation
from labdist.parameter_server.push import Push
from labdist.shm import area as shm_area


@pytest.fixture(scope="module")
def client():
    with local_client(4) as client:
        yield client


def paths(strategy) -> list[dict[int, str]]:
    group = strategy.ps_group
    return group.call_workers(list(range(group.num_workers)), "paths")


def pids(client, addresses) -> list[int]:
    found = client.run(os.getpid, workers=list(addresses))
    return [found[a] for a in addresses]


def files_of(pid_list) -> list[str]:
    """labdist's parameter-server files under /dev/shm made by these processes."""
    return [p for p in glob.glob(os.path.join(shm_area.SHM_DIR, "labdist-ps*"))
            if os.path.basename(p).split("-")[3] in {str(p_) for p_ in pid_list}]


def train(client, transport: str, workers: int, path: str | None = None, **kwargs
          ) -> list[np.ndarray]:
    """The weights of a small MLP after 2 epochs of fit on 256 digits (Adam: slots too);
    checks that every worker reached the PS by `path` (default: what `transport` asks)."""
    (x, y), _ = ld.datasets.digits.load_data()
    with ld.ParameterServerStrategy(client, num_workers=workers, transport=transport,
                                    chunk_size=1000, **kwargs) as s:
        with s.scope():
            model = ld.models.Sequential([
                ld.layers.Dense(32, activation="relu", input_shape=(64,)),
                ld.layers.Dense(10, activation="softmax")])
            model.compile(loss="sparse_categorical_crossentropy",
                          optimizer=ld.optimizers.Adam(0.01))
        model.fit(x[:256], y[:256], batch_size=32, epochs=2, shuffle=False, verbose=0)
        path = path or ("shm" if transport == "auto" else "tcp")
        assert all(p == {0: path} for p in paths(s))
        return [w.numpy() for w in model.weights]


@pytest.mark.parametrize(("workers", "kwargs"), [
    (1, {"mode": "async"}),
    (1, {"mode": "async", "use_locking": True}),
    (2, {"mode": "sync"}),
    (3, {"mode": "sync", "total_num_replicas": 3, "replicas_to_aggregate": 3}),
])
def test_shared_memory_gives_the_values_dask_comms_give(client, workers, kwargs):
    over_tcp = train(client, "tcp", workers, **kwargs)
    over_shm = train(client, "auto", workers, **kwargs)
    for a, b in zip(over_tcp, over_shm, strict=True):
        np.testing.assert_array_equal(a, b)


def test_writes_reads_and_errors_travel_as_over_dask_comms(client):
    with ld.ParameterServerStrategy(client, num_workers=1) as s:
        with s.scope():
            ints = ld.Variable(np.arange(6, dtype=np.int64).reshape(2, 3), name="ints")
            scalar = ld.Variable(1.5, name="scalar")

        def fn():
            after = ints.assign_add(np.ones((2, 3), np.int64))  # read_value: values come back
            scalar.assign(2.5)
            with pytest.raises(ValueError, match="pushed shape"):
                ld.get_replica_context().push(
                    [Push(ints._id, "assign", np.zeros(5), VariableAggregation.NONE)])
            return np.asarray(after), ints.numpy(), float(scalar.read_value())

        after, read, value = ld.ClusterCoordinator(s).schedule(fn).fetch()
        assert paths(s) == [{0: "shm"}]
    np.testing.assert_array_equal(after, np.arange(1, 7).reshape(2, 3))
    np.testing.assert_array_equal(read, after)
    assert read.dtype == np.int64 and value == 2.5


def test_with_locking_reads_over_shared_memory_are_never_torn(client):
    with ld.ParameterServerStrategy(client, num_workers=3, chunk_size=512,
                                    use_locking=True) as s:
        seen, final = race(s)
        stats = s.stats()
        assert all(p == {0: "shm"} for p in paths(s))
    assert sum(n for (lo, hi), n in seen.items() if lo != hi) == 0
    assert stats.torn_reads == 0 and stats.lost_updates == 0
    assert {(0.0, 0.0), (1.0, 1.0)} <= set(seen)  # reads overlapped the updates
    np.testing.assert_array_equal(final, 2.0)


def test_without_locking_torn_reads_over_shared_memory_are_counted(client):
    with ld.ParameterServerStrategy(client, num_workers=3, chunk_size=512) as s:
        seen, final = race(s)
        stats = s.stats()
        assert all(p == {0: "shm"} for p in paths(s))
    settled = (float(final.min()), float(final.max()))
    surely_torn = sum(n for pair, n in seen.items() if pair[0] != pair[1] and pair != settled)
    assert sum(n for (lo, hi), n in seen.items() if lo != hi) > 0
    assert stats.torn_reads >= surely_torn
    assert stats.interleaved_updates >= 1


@contextlib.contextmanager
def patched(client, make):
    """Replace shm_area's attributes in every worker process with `make()`'s (restored
    after). `make` is a closure, so it travels by value."""
    def swap(values=None):
        from labdist.shm import area as a
        values = values or make()
        old = {k: getattr(a, k) for k in values}
        for k, v in values.items():
            setattr(a, k, v)
        return old

    olds = client.run(swap)
    try:
        yield
    finally:
        for address, old in olds.items():
            client.run(swap, old, workers=[address])


def test_no_shared_memory_falls_back_to_dask_comms(client):
    expected = train(client, "tcp", 1, mode="async")

    def unavailable():
        return {"available": lambda: False}

    with patched(client, unavailable):  # no /dev/shm where the PS is: tcp for good
        got = train(client, "auto", 1, path="tcp", mode="async")
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_array_equal(a, b)

    def no_room():
        from labdist.shm import area as a
        create = a.create

        def refuse_data(prefix, suffix, size):
            if suffix == "-data":
                raise a.NoSpace(28, "no room (test)")
            return create(prefix, suffix, size)
        return {"create": refuse_data}

    with patched(client, no_room):  # no room for a worker's area: each call over Dask
        got = train(client, "auto", 1, path="shm", mode="async")
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_array_equal(a, b)


def test_files_are_removed_on_close_and_after_a_killed_store():
    with local_client(2) as client:
        s = ld.ParameterServerStrategy(client, num_workers=1)
        every = pids(client, s.parameter_servers + s.workers)
        with s.scope():
            v = ld.Variable(np.zeros(100_000, np.float32))
        ld.ClusterCoordinator(s).schedule(lambda: v.assign_add(np.ones(100_000))).fetch()
        store_files = files_of(every[:1])
        assert len(store_files) == 2  # its socket and token; the worker's area is unlinked
        assert files_of(every[1:]) == []
        s.close()
        assert files_of(every) == []

        s = ld.ParameterServerStrategy(client, num_workers=1)
        with s.scope():
            v = ld.Variable(np.zeros(10, np.float32))
        ld.ClusterCoordinator(s).schedule(lambda: v.assign_add(np.ones(10))).fetch()
        (store,) = pids(client, s.parameter_servers)
        assert len(files_of([store])) == 2
        os.kill(store, signal.SIGKILL)
        with contextlib.suppress(Exception):
            s.close()
        deadline = time.monotonic() + 30
        while len(client.scheduler_info()["workers"]) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)  # the nanny restarts the killed worker
        with ld.ParameterServerStrategy(client, num_workers=1) as s2:  # sweeps dead ones' files
            with s2.scope():
                w = ld.Variable(np.zeros(10, np.float32))
            ld.ClusterCoordinator(s2).schedule(lambda: w.assign_add(np.ones(10))).fetch()
        assert files_of([store]) == []
