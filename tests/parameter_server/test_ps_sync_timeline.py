"""Sync parameter servers read from the recorded phases: a straggler makes the other worker
wait at the barrier (a `wait` span, and the timeline's line in words names the last worker),
and in `fit` (whose next pull waits for the step instead) a backup worker cuts the others'
held pulls and brings the steps per second back."""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest

import labdist as ld
from labdist.timing import timeline

STRAGGLE_S = 0.05


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=4, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as c:
        yield c


def per_worker(procs, phase: str) -> dict[int, float]:
    """PS worker -> median seconds of `phase` per step."""
    out: dict[int, list[float]] = {}
    for p in procs:
        steps = [s for s in p["spans"] if s[0] == "step"]
        for span, seconds in zip(steps, timeline.phase_totals(p, phase), strict=True):
            if span[4] and "worker" in span[4]:
                out.setdefault(span[4]["worker"], []).append(seconds)
    return {w: statistics.median(v) for w, v in out.items()}


@pytest.mark.timeout(180)
def test_a_straggler_makes_the_other_worker_wait_at_the_barrier(client):
    s = ld.ParameterServerStrategy(client, num_workers=2, mode="sync")
    try:
        coordinator = ld.ClusterCoordinator(s)
        with s.scope():
            v = ld.Variable(np.zeros(4))
        s.set_worker_delay(1, STRAGGLE_S)
        since = time.time()
        time.sleep(0.1)
        for _ in range(12):
            coordinator.schedule(lambda: v.assign_add(np.ones(4)) and None)
        coordinator.join()
        procs = timeline.collect(client, since)
    finally:
        s.close()
    waits = per_worker(procs, "wait")
    assert waits[0] >= 0.6 * STRAGGLE_S and waits[1] < 0.3 * STRAGGLE_S, waits
    line = timeline.summary(procs)
    assert line.startswith("sync PS: worker 1 was last to the barrier; the others waited"), line


def fit(client, strategy, x, y) -> tuple[float, list]:
    with strategy:
        with strategy.scope():
            model = ld.models.Sequential([ld.layers.Dense(10, activation="softmax",
                                                          input_shape=(8,))], seed=0)
            model.compile(loss="sparse_categorical_crossentropy",
                          optimizer=ld.optimizers.SGD(0.1))
        strategy.set_worker_delay(1, STRAGGLE_S)
        model.fit(x[:32], y[:32], batch_size=32, verbose=0)  # warm: functions shipped
        since = time.time()
        start = time.perf_counter()
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)
        rate = len(x) / 32 / (time.perf_counter() - start)
        return rate, timeline.collect(client, since)


@pytest.mark.timeout(240)
def test_in_fit_a_backup_worker_cuts_the_held_pulls(client):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(384, 8)), rng.integers(0, 10, 384)
    rate, procs = fit(client, ld.ParameterServerStrategy(client, num_workers=2, mode="sync"),
                      x, y)
    pulls = per_worker(procs, "pull")
    assert pulls[0] >= 0.6 * STRAGGLE_S, pulls  # held until the straggler's gradients came
    line = timeline.summary(procs)
    assert line.startswith("sync PS: each pull waits at the parameter servers"), line
    backup_rate, backup = fit(client, ld.ParameterServerStrategy(
        client, num_workers=3, mode="sync", replicas_to_aggregate=2), x, y)
    held = per_worker(backup, "pull")
    print(f"sync {rate:.1f} steps/s, pulls {pulls}; with a backup {backup_rate:.1f}, {held}")
    assert max(held[0], held[2]) < 0.5 * pulls[0], (pulls, held)
    assert backup_rate > 1.5 * rate, (rate, backup_rate)
