"""One parameter server's counters, kept where updates happen (the store's thread pool) and
merged on the driver into `strategy.stats()`."""

from __future__ import annotations

import threading
import time
from collections import Counter


class StoreCounters:
    """One parameter server's counters (thread-safe: updates are applied on a thread pool)."""

    def __init__(self):
        self._lock = threading.Lock()
        # never reset (Prometheus counters only grow): reads, torn_reads, updates, lost_updates
        self.lifetime: Counter[str] = Counter()
        self.lifetime_staleness: Counter[int] = Counter()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.reads = 0
            self.torn_reads = 0
            self.updates = 0
            self.interleaved = 0
            self.lost_updates = 0
            self.lost_per_worker: Counter[int] = Counter()
            self.dropped = 0
            self.staleness: Counter[int] = Counter()
            self.per_worker: Counter[int] = Counter()
            self.dropped_per_worker: Counter[int] = Counter()
            self.first: float | None = None
            self.last: float | None = None

    def read(self, variables: int, torn: int) -> None:
        with self._lock:
            self.reads += variables
            self.torn_reads += torn
            self.lifetime["reads"] += variables
            self.lifetime["torn_reads"] += torn

    def applied(self, worker: int | None, staleness: int | None, interleaved: int) -> None:
        """One push applied (async), or one worker's gradients accepted (sync)."""
        now = time.time()
        with self._lock:
            self.updates += 1
            self.interleaved += interleaved
            self.lifetime["updates"] += 1
            if staleness is not None:
                self.staleness[staleness] += 1
                self.lifetime_staleness[staleness] += 1
            if worker is not None:
                self.per_worker[worker] += 1
            self.first = now if self.first is None else self.first
            self.last = now

    def lost(self, owners: list) -> None:
        """Updates found lost (chunked.py), by owner: (worker, function key), or None for the
        driver's writes and for updates too old to name."""
        if not owners:
            return
        with self._lock:
            self.lost_updates += len(owners)
            self.lifetime["lost_updates"] += len(owners)
            for owner in owners:
                if owner is not None:
                    self.lost_per_worker[owner[0]] += 1

    def dropped_stale(self, worker: int | None) -> None:
        with self._lock:
            self.dropped += 1
            if worker is not None:
                self.dropped_per_worker[worker] += 1

    def snapshot(self) -> dict:
        with self._lock:
            return {"reads": self.reads, "torn_reads": self.torn_reads,
                    "updates": self.updates, "interleaved": self.interleaved,
                    "lost_updates": self.lost_updates,
                    "lost_per_worker": dict(self.lost_per_worker),
                    "dropped": self.dropped, "staleness": dict(self.staleness),
                    "per_worker": dict(self.per_worker),
                    "dropped_per_worker": dict(self.dropped_per_worker),
                    "first": self.first, "last": self.last}
