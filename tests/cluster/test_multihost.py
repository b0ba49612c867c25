"""Replicas on different hosts, without leaving this machine: a real `dask scheduler` and two
`dask worker` processes, each in a network namespace (and a /dev/shm) of its own (tests/netns.py),
driven by MultiWorkerMirroredStrategy from this process over a bridge. The semantics and
training tests run there over Dask comms ("tcp") and the lane on non-loopback addresses; then
one worker's link is cut in the middle of a step.

Skipped, with the reason, where namespaces cannot be made (not root, no iproute2).
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from pathlib import Path

import netns
import numpy as np
import pytest

# the semantics tests, pointed at the namespaced cluster by this module's `strategy` fixture
from strategies.test_semantics import (  # noqa: F401
    test_cross_replica_context_matches_reference,
    test_replica_context_update_matches_reference,
    test_semantics_examples_on_two_replicas,
)

import labdist as ld
from labdist.collectives.algorithms import DIRECT_MAX_BYTES
from labdist.shm import placed

pytestmark = pytest.mark.multihost

CUT_TIMEOUT_S = 4.0  # collective_timeout of the strategy whose worker loses its link
MARGIN_S = 10.0  # what a loaded 2-core machine may add to the bounds


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    netns.remove_orphans()
    cluster = netns.NetnsCluster(2, Path(sys.executable).parent,
                                 tmp_path_factory.mktemp("netns"))
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def multi(hosts):
    s = ld.MultiWorkerMirroredStrategy(cluster=hosts.address, collective_timeout=20,
                                       connect_timeout=20)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def strategy(multi):
    return multi


@pytest.fixture
def mirrored2(multi):
    return multi


def _where():
    """Which network and mount namespace, and what is in /dev/shm, where this runs."""
    return (os.readlink("/proc/self/ns/net"), os.readlink("/proc/self/ns/mnt"),
            sorted(os.listdir("/dev/shm")))


@pytest.mark.timeout(60)
def test_replicas_are_on_hosts_of_their_own(multi, hosts):
    assert multi.num_replicas_in_sync == 2
    assert sorted(multi.workers) == hosts.workers
    assert [w.split("//")[1].split(":")[0] for w in sorted(multi.workers)] == hosts.worker_ips
    assert multi.transport == "tcp"  # no /dev/shm in common: collectives over Dask comms

    def mark():
        rank = ld.get_replica_context().replica_id_in_sync_group
        with open(f"/dev/shm/labdist-multihost-{rank}", "w"):
            pass
        return _where()

    places = multi.experimental_local_results(multi.run(mark))
    driver_net, driver_mnt, _ = _where()
    assert len({p[0] for p in places} | {driver_net}) == 3  # three network namespaces
    assert len({p[1] for p in places} | {driver_mnt}) == 3
    for rank, (_, _, shm) in enumerate(places):  # each sees its own /dev/shm only
        assert f"labdist-multihost-{rank}" in shm
        assert f"labdist-multihost-{1 - rank}" not in shm
    # steps go over the lane (a socket to each worker's own address), not loopback
    channel = multi.group.steps
    assert channel.kind == "lane"
    assert not any(lane.local for lane in channel._lanes)  # their Unix sockets: out of reach
    peers = sorted(lane.sock.getpeername()[0] for lane in channel._lanes)
    assert peers == hosts.worker_ips


@pytest.mark.timeout(60)
@pytest.mark.parametrize("op", ["SUM", "MEAN"])
def test_all_reduce_small_and_large(multi, op):
    """Direct all-reduce and (above DIRECT_MAX_BYTES) reduce-scatter + all-gather between
    hosts: the reference result, bit-identical on both replicas."""
    n_big = DIRECT_MAX_BYTES // 4 + 777
    xs = multi.experimental_distribute_values_from_function(lambda c: (
        np.random.default_rng(c.replica_id_in_sync_group).standard_normal(n_big)
        .astype(np.float32),
        {"i": np.arange(5, dtype=np.int32) * (c.replica_id_in_sync_group + 1),
         "f": float(c.replica_id_in_sync_group + 1)}))
    out = multi.run(lambda x: ld.get_replica_context().all_reduce(op, x), args=(xs,))
    results = multi.experimental_local_results(out)
    big0, small0 = results[0]
    big1, small1 = results[1]
    np.testing.assert_array_equal(big0, big1)
    np.testing.assert_array_equal(small0["i"], small1["i"])
    stacked = np.stack(multi.experimental_local_results(xs[0]))  # a nest of per-replica
    want_big = stacked.sum(axis=0) if op == "SUM" else stacked.sum(axis=0) / 2
    np.testing.assert_allclose(big0, want_big, rtol=1e-5)
    assert big0.dtype == np.float32
    want_i = np.arange(5) * 3 if op == "SUM" else np.arange(5) * 1.5
    np.testing.assert_array_equal(small0["i"], want_i)
    assert small0["i"].dtype == (np.int32 if op == "SUM" else np.float64)
    assert float(small0["f"]) == (3.0 if op == "SUM" else 1.5)


@pytest.mark.timeout(60)
def test_merge_call_reduces_and_updates_across_hosts(multi):
    with multi.scope():
        v = ld.Variable(1.0, dtype="float32", synchronization="ON_WRITE", aggregation="SUM")
    grads = multi.experimental_distribute_values_from_function(
        lambda c: np.float32(c.replica_id_in_sync_group + 1))

    def step(g):
        def apply(strategy, g):
            total = strategy.reduce("SUM", g, axis=None)
            strategy.extended.update(v, lambda var, t: var.assign_sub(t), args=(total,))
            return total
        return ld.get_replica_context().merge_call(apply, args=(g,))

    totals = multi.experimental_local_results(multi.run(step, args=(grads,)))
    assert [float(t) for t in totals] == [3.0, 3.0]
    assert [float(c) for c in multi.experimental_local_results(v)] == [-2.0, -2.0]


@pytest.mark.timeout(90)
def test_fit_matches_one_process(multi):
    """The same global batches and SGD on one process and on two hosts: the same weights."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20 * 32, 64)).astype(np.float32)
    y = rng.integers(0, 10, len(x))
    weights = []
    for s in (ld.OneDeviceStrategy(device="cpu"), multi):
        with s.scope():
            model = ld.models.Sequential([
                ld.layers.Dense(32, activation="relu", input_shape=(64,)),
                ld.layers.Dense(10, activation="softmax")], seed=2)
            model.compile(loss="sparse_categorical_crossentropy",
                          optimizer=ld.optimizers.SGD(0.05, momentum=0.9), metrics=["accuracy"])
        history = model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
        weights.append((model.get_weights(), history.history["loss"]))
    (w1, loss1), (w2, loss2) = weights
    np.testing.assert_allclose(loss1, loss2, rtol=1e-5)
    for a, b in zip(w1, w2, strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


class _Pause(ld.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        time.sleep(2.5)


def test_a_distributed_dataset_is_not_placed_for_other_hosts(multi):
    """Replicas that cannot read the driver's /dev/shm get a dataset's rows by value, as
    before: the probe finds the file unreadable there and the copy is removed at once."""
    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    before = set(os.listdir(placed.SHM_DIR))
    dist = multi.experimental_distribute_dataset(ld.batches(x, 4))
    sums = [multi.experimental_local_results(multi.run(lambda b: float(b.sum()), args=(b,)))
            for b in dist]
    assert sums == [(x[i:i + 2].sum(), x[i + 2:i + 4].sum()) for i in (0, 4)] + [
        (x[8:9].sum(), x[9:10].sum())]
    assert type(multi.experimental_local_results(next(iter(dist)))[0]) is np.ndarray
    assert set(os.listdir(placed.SHM_DIR)) == before


@pytest.mark.timeout(120)
def test_fit_scatters_its_data_to_other_hosts_once(multi, monkeypatch):
    """Replicas that do not share the driver's /dev/shm get x and y once, by Dask's scatter,
    and take every batch's rows from their worker's copy: the same weights, bit for bit, as
    batches sent from the driver; the copies are gone when `fit` ends."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(12 * 32 + 5, 16)).astype(np.float32)
    y = rng.integers(0, 4, len(x))
    client = multi.group.client
    results = {}
    for flag in ("0", "1"):
        monkeypatch.setenv(placed.ENV, flag)
        reads = multi.experimental_local_results(multi.run(lambda: placed.reads))
        with multi.scope():
            model = ld.models.Sequential([
                ld.layers.Dense(8, activation="relu", input_shape=(16,)),
                ld.layers.Dense(4, activation="softmax")], seed=3)
            model.compile(loss="sparse_categorical_crossentropy",
                          optimizer=ld.optimizers.SGD(0.05), steps_per_execution=3)
        # a pause longer than the scheduler's memory manager's interval (2 s), which drops
        # extra replicas of a key nothing waits on
        history = model.fit(x, y, batch_size=32, epochs=2, shuffle=True, verbose=0,
                            callbacks=[_Pause()])
        results[flag] = (model.get_weights(), history.history["loss"])
        read = [after - before for before, after in zip(
            reads, multi.experimental_local_results(multi.run(lambda: placed.reads)),
            strict=True)]
        # each replica's x and y rows of every step of both epochs, or none at all
        assert read == ([2 * 2 * 13] * 2 if flag == "1" else [0, 0])
    deadline = time.monotonic() + 20  # released at fit's end; the workers drop them soon
    while (held := client.run(lambda dask_worker: len(dask_worker.data))) != {
            w: 0 for w in multi.workers} and time.monotonic() < deadline:
        time.sleep(0.1)
    assert held == {w: 0 for w in multi.workers}  # the scattered copies went with the fit
    (w0, loss0), (w1, loss1) = results["0"], results["1"]
    assert loss0 == loss1
    assert all(a.tobytes() == b.tobytes() for a, b in zip(w0, w1, strict=True))


def call_each(fn, timeout: float) -> dict:
    """Call `fn` in a daemon thread; {'value'|'error', 'seconds'}, or {} if still running."""
    out: dict = {}

    def go():
        t0 = time.monotonic()
        try:
            out["value"] = fn()
        except BaseException as e:  # any: reported to the test
            out["error"] = e
        out["seconds"] = time.monotonic() - t0
    thread = threading.Thread(target=go, daemon=True, name="multihost-bounded")
    thread.start()
    thread.join(timeout)
    return dict(out)


def _text(error: BaseException) -> str:
    return " ".join([str(error), *getattr(error, "__notes__", ())])


@pytest.mark.timeout(120)
def test_a_cut_link_mid_step_gives_a_bounded_error_naming_the_worker(hosts):
    """Worker 1's cable is pulled while replica 0 waits for it in a collective: no reset, no
    worker leaving the cluster, just silence. strategy.run must raise, within
    collective_timeout (replica 0's wait) plus collective_timeout (the driver's wait for the
    silent replica) plus a margin, an error naming replica 1 or its worker, never hang; and
    after the link comes back a step gives the right result or a clear error, never another
    step's values.

    Runs last in this module (the cut leaves worker 1 unusable for a while)."""
    s = ld.MultiWorkerMirroredStrategy(cluster=hosts.address, collective_timeout=CUT_TIMEOUT_S,
                                       connect_timeout=20)
    try:
        assert s.run(lambda: ld.get_replica_context().all_reduce("SUM", 1.0)) is not None

        def step():
            ctx = ld.get_replica_context()
            ctx.all_reduce("SUM", 1.0)
            if ctx.replica_id_in_sync_group == 1:
                time.sleep(2.0)  # the link is cut during this
            return ctx.all_reduce("SUM", 2.0)

        cut_at: list[float] = []

        def run_and_cut():
            timer = threading.Timer(1.0, lambda: (hosts.cut(1), cut_at.append(time.monotonic())))
            timer.start()
            try:
                return s.run(step)
            finally:
                timer.cancel()

        bound = 2 * CUT_TIMEOUT_S + MARGIN_S
        got = call_each(run_and_cut, 1.0 + bound + 30)
        assert cut_at, "the link was not cut"
        assert got, (f"strategy.run still blocked {bound + 30:.0f} s after worker 1's link was "
                     "cut (the driver's wait is not bounded)")
        assert "error" in got, f"strategy.run returned {got.get('value')!r} with a cut link"
        error = got["error"]
        assert isinstance(error, ld.CollectiveTimeoutError | ld.ReplicaLostError
                          | ld.ReplicaUnresponsiveError), repr(error)
        text = _text(error)
        worker1 = hosts.worker_ips[1]
        assert worker1 in text or re.search(r"replica(\(s\))? \[?1\b", text), text
        assert got["seconds"] <= 1.0 + bound, (
            f"the error came {got['seconds']:.1f} s after the step started; collective_timeout "
            f"is {CUT_TIMEOUT_S:g} s: {text}")

        # the link comes back: the next step is right or refused clearly, never mixed up
        hosts.mend(1)
        token = 1234567

        def fresh():
            ctx = ld.get_replica_context()
            return ctx.replica_id_in_sync_group, token
        after = call_each(lambda: s.run(fresh), 60)
        assert after, "strategy.run hung after the link came back"
        if "value" in after:
            ranks, tokens = after["value"]
            assert s.experimental_local_results(ranks) == (0, 1)
            assert s.experimental_local_results(tokens) == (token, token)
        else:
            assert isinstance(after["error"], ld.LabdistError | RuntimeError), \
                repr(after["error"])
    finally:
        hosts.mend(1)
        call_each(s.close, 30)
