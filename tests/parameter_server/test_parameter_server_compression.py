"""Compressed parameter-server pushes on real worker processes: each worker encodes its own
updates and keeps its own error-feedback residuals, the servers decode; the bytes that travel
shrink (counted) over Dask comms and over shared memory, and nothing a worker owes is lost."""

from __future__ import annotations

import os
import re
import signal
import time

import numpy as np
import pytest
from clusters import local_client

import labdist as ld
from labdist.collectives.compression import initial_q

SIZE = 1000


@pytest.fixture(scope="module")
def client():
    with local_client(3) as client:
        yield client


def paths(strategy) -> list[dict[int, str]]:
    group = strategy.ps_group
    return group.call_workers(list(range(group.num_workers)), "paths")


def updates(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.standard_normal(SIZE).astype(np.float32) for _ in range(n)]


def push_all(strategy, v, us) -> None:
    coordinator = ld.ClusterCoordinator(strategy)
    for u in us:
        coordinator.schedule(lambda u=u: v.assign_sub(u, read_value=False))
    coordinator.join()


def flush(strategy, v) -> None:
    """Compression off, then zero pushes until every worker has sent what it owed."""
    strategy.compression = "none"
    for _ in range(20):
        if all(s["residual_norm"] == 0.0 for s in strategy.push_stats()):
            return
        push_all(strategy, v, [np.zeros(SIZE, np.float32)] * 4)
    raise AssertionError(f"residuals still owed: {strategy.push_stats()}")


@pytest.mark.parametrize("transport", ["tcp", "auto"])
@pytest.mark.parametrize(("compression", "per_value"), [
    ("fp16", 2), (ld.compression.TopK(0.01), 0.01 * 8), ("bf16", 2)])
def test_pushes_shrink_and_error_feedback_loses_nothing(client, transport, compression,
                                                        per_value):
    us = updates(12)
    # use_locking: two workers' unlocked pushes may race and lose an update (the race the lab
    # shows); this test is about what compression sends and owes, so updates are serialised
    with ld.ParameterServerStrategy(client, num_workers=2, transport=transport,
                                    compression=compression, use_locking=True) as s:
        with s.scope():
            v = ld.Variable(np.zeros(SIZE, np.float32), name="v")
        push_all(s, v, us)
        stats = s.push_stats()
        assert all(p == {0: "shm" if transport == "auto" else "tcp"} for p in paths(s))
        assert sum(st["raw_bytes"] for st in stats) == 12 * SIZE * 4
        assert sum(st["sent_bytes"] for st in stats) == pytest.approx(12 * SIZE * per_value)
        assert all(st["residual_norm"] > 0 for st in stats if st["raw_bytes"])
        lossy = v.numpy()
        assert not np.allclose(lossy, -np.sum(us, axis=0), atol=1e-5)  # something owed
        flush(s, v)
        np.testing.assert_allclose(v.numpy(), -np.sum(us, axis=0), atol=1e-5)


def test_powersgd_pushes_send_two_factors_and_vectors_whole(client):
    rng = np.random.default_rng(3)
    g = [rng.standard_normal((40, 25)).astype(np.float32) for _ in range(6)]
    with ld.ParameterServerStrategy(client, num_workers=1,
                                    compression=ld.compression.PowerSGD(2)) as s:
        with s.scope():
            w = ld.Variable(np.zeros((40, 25), np.float32), name="w")
            b = ld.Variable(np.zeros(25, np.float32), name="b")
        coordinator = ld.ClusterCoordinator(s)
        for gi in g:
            coordinator.schedule(lambda gi=gi: (w.assign_sub(gi, read_value=False),
                                                b.assign_sub(gi[0], read_value=False)))
        coordinator.join()
        (st,) = s.push_stats()
        assert st["sent_bytes"] == 6 * ((40 + 25) * 2 * 4 + 25 * 4)  # P, Q; the bias whole
        np.testing.assert_allclose(b.numpy(), -np.sum([gi[0] for gi in g], axis=0), rtol=1e-5)
        s.compression = "none"
        coordinator.schedule(lambda: w.assign_sub(np.zeros((40, 25), np.float32),
                                                  read_value=False))
        coordinator.join()
        np.testing.assert_allclose(w.numpy(), -np.sum(g, axis=0), atol=1e-4)


def test_sync_mode_steps_average_the_decoded_pushes(client):
    us = updates(4)
    with ld.ParameterServerStrategy(client, num_workers=2, mode="sync",
                                    compression="fp16") as s:
        with s.scope():
            v = ld.Variable(np.zeros(SIZE, np.float32), name="v",
                            aggregation=ld.VariableAggregation.MEAN)
        push_all(s, v, us)
        assert s.global_step() == 2
        exact = -np.sum(us, axis=0) / 2  # two steps, each the MEAN of two pushes
        assert not np.allclose(v.numpy(), exact, atol=1e-5)  # fp16: rounding owed
        np.testing.assert_allclose(v.numpy(), exact, atol=2e-3)
        flush(s, v)  # each worker's residual goes out with its next push
        np.testing.assert_allclose(v.numpy(), exact, atol=1e-5)


def test_bad_compression_is_refused(client):
    with pytest.raises(ValueError, match=r"compression='zip' is not allowed; use 'none', 'fp16'"):
        ld.ParameterServerStrategy(client, num_workers=1, compression="zip")
    with ld.ParameterServerStrategy(client, num_workers=1) as s:
        with pytest.raises(ValueError, match=r"ratio=0"):
            s.compression = ld.compression.TopK(0)
        assert s.compression is None
        s.compression = "fp16"
        with s.scope():
            counts = ld.Variable(np.zeros(3, np.int64), name="counts")
        with pytest.raises(ValueError, match=r"cannot compress a parameter-server push "
                                             r"\(assign_add\) of dtype int64"):
            ld.ClusterCoordinator(s).schedule(
                lambda: counts.assign_add(np.ones(3, np.int64), read_value=False)).fetch()
        np.testing.assert_array_equal(counts.numpy(), 0)  # nothing half done


def test_fit_on_parameter_servers_pushes_compressed_gradients(client):
    """`model.fit`'s gradient pushes go through the compressor too (over shared memory),
    and the model still learns."""
    (x, y), _ = ld.datasets.digits.load_data()
    with ld.ParameterServerStrategy(client, num_workers=2,
                                    compression=ld.compression.TopK(0.1)) as s:
        with s.scope():
            model = ld.models.Sequential([
                ld.layers.Dense(32, activation="relu", input_shape=(64,)),
                ld.layers.Dense(10, activation="softmax")])
            model.compile(loss="sparse_categorical_crossentropy",
                          optimizer=ld.optimizers.SGD(0.1), metrics=["accuracy"])
        history = model.fit(x[:512], y[:512], batch_size=32, epochs=3, verbose=0)
        stats = s.push_stats()
        assert all(p == {0: "shm"} for p in paths(s))
    raw = sum(st["raw_bytes"] for st in stats)
    sent = sum(st["sent_bytes"] for st in stats)
    assert raw > 0 and sent < 0.25 * raw  # 10 % of the values, each with an int32 index
    assert history.history["accuracy"][-1] > history.history["accuracy"][0]


def topk_residual(m: np.ndarray, ratio: float) -> np.ndarray:
    """What top-k keeps back of `m` (numpy, written here): all but the k largest magnitudes."""
    k = int(np.ceil(ratio * m.size))
    kept = m.copy()
    kept[np.argsort(np.abs(m))[m.size - k:]] = 0
    return kept


@pytest.mark.timeout(180)
def test_a_push_that_does_not_land_leaves_its_residual_owed_as_it_was():
    """Sync mode, two parameter servers, one push carrying an update for each. When one of
    them is lost before the push reaches it, error feedback counts the half that landed (its
    residual moves on) and gives the other half's residual back as it was before the push:
    what a retry would start from; neither dropped nor counted twice."""
    ratio = 0.1
    rng = np.random.default_rng(11)
    u1, v1, u2, v2 = (rng.standard_normal(SIZE).astype(np.float32) for _ in range(4))
    with local_client(3) as client, ld.ParameterServerStrategy(
            client, num_workers=1, num_ps=2, mode="sync", transport="tcp",
            compression=ld.compression.TopK(ratio)) as s:
        with s.scope():
            a = ld.Variable(np.zeros(SIZE, np.float32), name="a")
            b = ld.Variable(np.zeros(SIZE, np.float32), name="b")
        assert [s.parameter_server_of(v) for v in (a, b)] == [0, 1]
        doomed = s.parameter_servers[1]
        pid = client.run(os.getpid, workers=[doomed])[doomed]
        coordinator = ld.ClusterCoordinator(s)

        def first():
            a.assign_sub(u1, read_value=False)
            b.assign_sub(v1, read_value=False)

        def second():  # both writes go out in one push when the function returns
            a.assign_sub(u2, read_value=False)
            b.assign_sub(v2, read_value=False)
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return
                time.sleep(0.05)

        coordinator.schedule(first)
        coordinator.join()
        r_a, r_b = topk_residual(u1, ratio), topk_residual(v1, ratio)
        (st,) = s.push_stats()
        assert st["residual_norm"] == pytest.approx(np.sqrt((r_a ** 2).sum()
                                                            + (r_b ** 2).sum()), rel=1e-5)
        coordinator.schedule(second)
        with pytest.raises(ld.ParameterServerLostError, match=re.escape(doomed)):
            coordinator.join()
        r_a = topk_residual(u2 + r_a, ratio)  # a's half landed; b's residual is as it was
        deadline = time.monotonic() + 60
        while True:  # the driver knew of the loss first: the worker's push may be under way
            (st,) = s.push_stats()
            if st["residual_norm"] > 0 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert st["residual_norm"] == pytest.approx(np.sqrt((r_a ** 2).sum()
                                                            + (r_b ** 2).sum()), rel=1e-5)
        assert st["raw_bytes"] == 3 * SIZE * 4  # the updates that landed, each once


@pytest.mark.timeout(180)
def test_the_compressor_switched_after_a_worker_was_lost_is_what_the_others_use():
    """Parameter-server training goes on without a lost worker, so its compressor must still
    switch: the workers left take the new one (their pushes shrink to top-k's size), and the
    lost worker's counters read None."""
    with local_client(3) as client, ld.ParameterServerStrategy(
            client, num_workers=2, transport="tcp", compression="fp16") as s:
        with s.scope():
            v = ld.Variable(np.zeros(SIZE, np.float32), name="v")
        doomed = s.workers[1]
        os.kill(client.run(os.getpid, workers=[doomed])[doomed], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while doomed in client.scheduler_info()["workers"] and time.monotonic() < deadline:
            time.sleep(0.1)
        s.compression = ld.compression.TopK(0.01)
        assert s.compression == ld.compression.TopK(0.01)
        before = s.push_stats()
        assert before[1] is None
        push_all(s, v, updates(4))  # the coordinator finds worker 1 gone: all on worker 0
        after = s.push_stats()[0]
        assert after["raw_bytes"] - before[0]["raw_bytes"] == 4 * SIZE * 4
        assert after["sent_bytes"] - before[0]["sent_bytes"] == 4 * SIZE * 0.01 * 8


def warm_start_factors(client, worker: str) -> dict[int, np.ndarray]:
    """PowerSGD's warm-start factors, per variable, of the parameter-server worker actor on
    `worker` (read in its process: a worker does not report them)."""
    def read(dask_worker):
        from labdist.parameter_server.worker import ParameterServerWorker

        (actor,) = [a for a in dask_worker.state.actors.values()
                    if isinstance(a, ParameterServerWorker)]
        return {v: q.copy() for v, q in actor.compression.factors.items()}

    return client.run(read, workers=[worker])[worker]


def power_step(m: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One power-iteration step (numpy, written here): P = orthonormal(M Q), Q' = M^T P."""
    p = m @ q
    for j in range(p.shape[1]):
        for i in range(j):
            p[:, j] -= (p[:, i] @ p[:, j]) * p[:, i]
        p[:, j] /= np.sqrt(p[:, j] @ p[:, j]) + 1e-30
    return p, m.T @ p


@pytest.mark.timeout(180)
def test_powersgd_warm_start_factors_advance_only_with_a_push_that_landed():
    """Two parameter servers, one push carrying an update for each, one server lost before
    the push reaches it: the variable whose update landed warm-starts its next push from
    the new factor; the other's factor stays as it was before the push (what a retry starts
    from), as its residual does."""
    rng = np.random.default_rng(5)
    u1, v1, u2, v2 = (rng.standard_normal((40, 25)).astype(np.float32) for _ in range(4))
    with local_client(3) as client, ld.ParameterServerStrategy(
            client, num_workers=1, num_ps=2, mode="sync", transport="tcp",
            compression=ld.compression.PowerSGD(2)) as s:
        with s.scope():
            a = ld.Variable(np.zeros((40, 25), np.float32), name="a")
            b = ld.Variable(np.zeros((40, 25), np.float32), name="b")
        assert [s.parameter_server_of(v) for v in (a, b)] == [0, 1]
        doomed = s.parameter_servers[1]
        pid = client.run(os.getpid, workers=[doomed])[doomed]
        coordinator = ld.ClusterCoordinator(s)

        def first():
            a.assign_sub(u1, read_value=False)
            b.assign_sub(v1, read_value=False)

        def second():
            a.assign_sub(u2, read_value=False)
            b.assign_sub(v2, read_value=False)
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return
                time.sleep(0.05)

        coordinator.schedule(first)
        coordinator.join()
        before = warm_start_factors(client, s.workers[0])
        assert sorted(before) == sorted([a.id, b.id])
        coordinator.schedule(second)
        with pytest.raises(ld.ParameterServerLostError, match=re.escape(doomed)):
            coordinator.join()
        q_a = before[a.id]
        p1, q1 = power_step(u1, initial_q(25, 2, a.id).astype(np.float32))
        np.testing.assert_allclose(q_a, q1, rtol=1e-4, atol=1e-4)
        _, q2 = power_step(u2 + (u1 - p1 @ q1.T), q1)  # a's second push: warm-started
        deadline = time.monotonic() + 60
        while True:  # the driver knew of the loss first: the worker's push may be under way
            after = warm_start_factors(client, s.workers[0])
            if not np.array_equal(after[a.id], q_a) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        np.testing.assert_array_equal(after[b.id], before[b.id])  # not landed: as it was
        np.testing.assert_allclose(after[a.id], q2, rtol=1e-4, atol=1e-4)  # landed: moved on
        (st,) = s.push_stats()
        assert st["raw_bytes"] == 3 * 40 * 25 * 4  # the updates that landed, each once
