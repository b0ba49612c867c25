"""The driver's own part of each step (issue 27, the `driver` phase): recorded on the driver
between the moment a request leaves for the replicas and the moment their answers are all in,
so its spans lie between the replicas' steps, never over their waiting; `fit`'s bookkeeping and
callbacks count as the driver's time. Real worker processes."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

import labdist as ld
from labdist.timing import timeline

STRAGGLE_S = 0.05
TOLERANCE_S = 0.01  # the clock offsets' error: ~1 ms on a quiet machine, several on a busy one


def straggling_step():
    ctx = ld.get_replica_context()
    if ctx.replica_id_in_sync_group == 1:
        time.sleep(STRAGGLE_S)
    return ctx.all_reduce("SUM", np.ones(8))


def driver_spans(processes: list[dict]) -> list[tuple]:
    (driver,) = [p for p in processes if p["name"] == "driver"]
    return sorted((s for s in driver["spans"] if s[0] == "driver"), key=lambda s: s[1])


def steps_by_run(processes: list[dict]) -> dict[int, list[tuple]]:
    runs: dict[int, list[tuple]] = {}
    for p in processes:
        for s in p["spans"]:
            if s[0] == "step" and s[4] and "run" in s[4]:
                runs.setdefault(s[4]["run"], []).append(s)
    return runs


def assert_apart(spans: list[tuple]) -> None:
    for before, after in itertools.pairwise(spans):
        assert before[2] <= after[1] + 1e-6, (before, after)  # one thread: never overlapping


@pytest.mark.timeout(120)
def test_driver_spans_lie_between_the_replicas_steps(mirrored2):
    mirrored2.run(straggling_step)  # warm
    since = time.time()
    time.sleep(0.05)
    for _ in range(6):
        mirrored2.run(straggling_step)
    processes = timeline.collect(mirrored2.client, since)
    spans = driver_spans(processes)
    assert_apart(spans)
    runs = steps_by_run(processes)
    sent = {s[4]["run"]: s for s in spans if "run" in s[4]}
    after = {s[4]["after"]: s for s in spans if "after" in s[4]}
    assert len(sent) == len(after) == 6, spans  # each run: its dispatch, then its results
    for run, steps in runs.items():
        assert len(steps) == 2, steps
        # the request leaves before either replica starts; the results are handled after both
        assert sent[run][2] <= min(s[1] for s in steps) + TOLERANCE_S, (sent[run], steps)
        assert after[run][1] >= max(s[2] for s in steps) - TOLERANCE_S, (after[run], steps)
        # while the straggler sleeps the driver only waits: no driver span covers it
        assert after[run][1] - sent[run][2] >= STRAGGLE_S - TOLERANCE_S  # two clocks
    # a plain run's last stretch ends when it returns: none runs on into the next call
    assert all(s[2] - s[1] < STRAGGLE_S for s in spans), spans


class SlowEpochEnd(ld.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        time.sleep(0.08)  # fit's bookkeeping, as far as the replicas can tell


@pytest.mark.timeout(120)
def test_fit_bookkeeping_and_callbacks_are_driver_time(mirrored2):
    with mirrored2.scope():
        model = ld.models.Sequential([ld.layers.Dense(4, input_shape=(3,))], seed=0)
        model.compile(loss="mse", optimizer="sgd")
    x = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    y = np.zeros((64, 4), np.float32)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)  # warm
    since = time.time()
    time.sleep(0.05)
    start = time.time()
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[SlowEpochEnd()])
    end = time.time()
    processes = timeline.collect(mirrored2.client, since)
    spans = driver_spans(processes)
    assert_apart(spans)
    assert spans[0][1] >= start and spans[-1][2] <= end
    long = [s for s in spans if s[2] - s[1] >= 0.08]
    assert len(long) == 2, spans  # each epoch's end: from its last answers to what comes next
    assert "after" in long[-1][4] and "run" not in long[-1][4]  # the last: until fit returned
    runs = steps_by_run(processes)
    assert len(runs) >= 3  # the placed input's probe, and one run an epoch (replicas loop)
    # the driver's time and the replicas' steps tile fit: every run's steps lie in a gap
    for steps in runs.values():
        first, last = min(s[1] for s in steps), max(s[2] for s in steps)
        assert not any(s[1] + TOLERANCE_S < last and s[2] - TOLERANCE_S > first
                       for s in spans), (steps, spans)
