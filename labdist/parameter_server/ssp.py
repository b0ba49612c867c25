"""Stale synchronous parallel (a labdist extension beyond TF): with `staleness_bound=s`, a
worker waits before starting a scheduled function while it is more than `s` functions ahead of
the slowest worker still taking part. The table lives with parameter server 0, on its event
loop. A worker with no work (or a lost one) leaves the table, so it never holds others back;
when it comes back it starts level with the slowest one present."""

from __future__ import annotations

import asyncio
import time


class StalenessBound:
    def __init__(self, bound: int):
        self.bound = bound
        self.started: dict[int, int] = {}
        self.active: set[int] = set()
        self.waits = 0
        self.wait_seconds = 0.0
        self.max_gap = 0
        self._cond: asyncio.Condition | None = None

    @property
    def cond(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    def gap(self, worker: int) -> int:
        """How many functions `worker` has started beyond the slowest other active worker."""
        others = [self.started[v] for v in self.active if v != worker]
        return self.started[worker] - min(others) if others else 0

    async def begin(self, worker: int) -> float:
        """`worker` is about to start a function: count it, wait while it is too far ahead.
        Returns the seconds it waited."""
        if worker not in self.active:  # (re)joining: level with the slowest present
            others = [self.started[v] for v in self.active]
            self.started[worker] = max(self.started.get(worker, 0) + 1, min(others, default=0))
            self.active.add(worker)
        else:
            self.started[worker] += 1
        waited = 0.0
        async with self.cond:
            self.cond.notify_all()  # a worker waiting for this one may go now
            if self.gap(worker) > self.bound:
                self.waits += 1
                start = time.perf_counter()
                await self.cond.wait_for(
                    lambda: worker not in self.active or self.gap(worker) <= self.bound)
                waited = time.perf_counter() - start
                self.wait_seconds += waited
            if worker in self.active:
                self.max_gap = max(self.max_gap, self.gap(worker))
        return waited

    async def leave(self, worker: int) -> None:
        """`worker` has no work now (or was lost): stop counting it."""
        self.active.discard(worker)
        async with self.cond:
            self.cond.notify_all()

    def reset(self) -> None:
        self.waits, self.wait_seconds, self.max_gap = 0, 0.0, 0

    def snapshot(self) -> dict:
        return {"waits": self.waits, "wait_seconds": self.wait_seconds, "max_gap": self.max_gap}
