"""A long lab run that switches modes every 100 steps while a "notebook" thread calls
`strategy.run` on the same strategy: nothing the run holds may grow (memory, threads, file
descriptors), on the driver or on the workers, and every call gets its own values."""

from __future__ import annotations

import gc
import os
import threading
from collections import Counter

import numpy as np
import pytest

import labdist as ld

STEPS = 10_000
EVERY = 100
MODES = [
    {"kind": "mirrored", "synchronization": "ON_WRITE", "aggregation": "MEAN"},
    {"kind": "mirrored", "synchronization": "ON_READ", "sync_period": 5},
    {"kind": "ps_async", "use_locking": False},
    {"kind": "mirrored", "synchronization": "NONE"},
    {"kind": "ps_sync", "aggregation": "SUM", "learning_rate": 0.01},
    {"kind": "ps_async", "use_locking": True, "learning_rate": 0.05},
    {"kind": "mirrored", "synchronization": "ON_WRITE", "aggregation": "ONLY_FIRST_REPLICA"},
]
MB = 1 << 20
SAMPLE_EVERY = 10  # switches between usage samples: 11 samples over the run
WANDER = 3  # threads or fds that on-demand pools may add at a busy moment


def usage() -> dict[str, int]:
    """This process's resident memory, threads and open file descriptors."""
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    return {"rss": rss, "threads": len(os.listdir("/proc/self/task")),
            "fds": len(os.listdir("/proc/self/fd")),
            "names": sorted(t.name for t in threading.enumerate())}


def settled_usage(client) -> dict[str, dict[str, int]]:
    gc.collect()
    client.run(gc.collect)
    return {"driver": usage(), **client.run(usage)}


def rank() -> int:
    return ld.get_replica_context().replica_id_in_sync_group


class Notebook(threading.Thread):
    """Calls `strategy.run` over and over while the lab trains on the same strategy."""

    def __init__(self, strategy):
        super().__init__(daemon=True)
        self.strategy, self.calls, self.wrong = strategy, 0, []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            token = self.calls
            try:
                got = self.strategy.run(lambda t: (rank(), t), args=(token,))
                values = [tuple(int(p.values[r]) for p in got) for r in range(2)]
            except Exception as e:  # a mixed-up result may not even unpack
                values = repr(e)
            if values != [(0, token), (1, token)]:
                self.wrong.append((token, values))
            self.calls += 1
            self.stop.wait(0.01)


@pytest.mark.timeout(600)
def test_ten_thousand_steps_switching_modes_hold_steady():
    x, y = ld.datasets.synthetic.regression(n_samples=512, n_features=1, noise=0.1, seed=3)
    with ld.MirroredStrategy(num_replicas=2) as strategy, \
            ld.Lab(strategy, data=(x, y), learning_rate=0.05, global_batch_size=32) as lab:
        for mode in MODES:  # warm up: every strategy and buffer the run will use exists
            lab.set(**mode)
            lab.step(EVERY)
        notebook = Notebook(strategy)
        notebook.start()
        samples = [settled_usage(strategy.client)]
        for i in range(STEPS // EVERY):
            lab.set(**MODES[i % len(MODES)])
            lab.step(EVERY)
            if (i + 1) % SAMPLE_EVERY == 0:
                samples.append(settled_usage(strategy.client))
        notebook.stop.set()
        notebook.join(60)
        assert lab.error is None and lab.step_count == (len(MODES) + STEPS // EVERY) * EVERY
        assert all(np.all(np.isfinite(v)) for c in lab.values() for v in c.values())
    assert notebook.calls > 10 and notebook.wrong == []
    # Dask's connection pools and thread pools open on demand (a busier moment opens one
    # more), so samples wander by a few; a leak keeps climbing: the second half may not top
    # the first by more than that wander.
    half = len(samples) // 2
    for where in samples[0]:
        first, second = [s[where] for s in samples[:half]], [s[where] for s in samples[half:]]
        grew = second[-1]["rss"] - samples[0][where]["rss"]
        assert grew < 50 * MB, (where, grew // MB, "MB")
        for what in ("threads", "fds"):
            assert max(u[what] for u in second) <= max(u[what] for u in first) + WANDER, (
                where, what, [u[where][what] for u in samples], "new threads:",
                sorted((Counter(second[-1]["names"]) - Counter(first[0]["names"])).elements()))
